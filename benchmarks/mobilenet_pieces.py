#!/usr/bin/env python
"""Where mobilenet_v3_small's time goes: its layers and blocks compiled alone, pbsdk vs torch eager.

    PYTHONPATH=. .venv/bin/python benchmarks/mobilenet_pieces.py --batch 1 [--pieces dw SE ...] [--variant K=V,..]

The pieces are the real model's own submodules (`pbsdk.testing.real_models`, random weights, batch norms
with random statistics) on the shapes they see in the model: the stem, every inverted-residual block
whole, and, inside the blocks, each depthwise convolution alone and with its BatchNorm and activation
(``Conv2dNormActivation``), each squeeze-excite, the 1x1 expand and project convolutions, a hardswish and
a BatchNorm alone, the last conv and the classifier head. ``--pieces`` keeps the pieces whose name
contains any of the given words. ``--variant`` adds a second pbsdk contender with changed compile options.

Every contender runs in interleaved blocks of at least ``--block-s`` seconds, the order rotating each
round, on 1 thread unless ``--threads``; a figure is the median over ``--rounds`` of each block's mean per
call, the ratio's spread the min-max of the per-round ratios (> 1: pbsdk faster). Each pbsdk output is
checked against eager first.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def pieces(model: Any, x: Any) -> list[tuple[str, Any, Any]]:
    """(name, module, input) for every piece, inputs recorded by running the model once."""
    import torch
    from torch import nn

    seen: dict[int, Any] = {}
    def record(mod: Any, args: Any) -> None:
        seen.setdefault(id(mod), args[0].detach().clone())

    hooks = [m.register_forward_pre_hook(record) for m in model.modules()]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()

    def shape(t: Any) -> str:
        return "x".join(str(d) for d in t.shape[1:])

    out: list[tuple[str, Any, Any]] = []
    feats = model.features
    out.append((f"stem conv3x3s2+BN+hswish {shape(seen[id(feats[0])])}", feats[0], seen[id(feats[0])]))
    for i in range(1, len(feats) - 1):
        blk = feats[i]
        out.append((f"block{i} whole {shape(seen[id(blk)])}", blk, seen[id(blk)]))
        for part in blk.block:
            xin = seen[id(part)]
            if isinstance(part, nn.Sequential) and isinstance(part[0], nn.Conv2d):
                conv = part[0]
                k, s, g = conv.kernel_size[0], conv.stride[0], conv.groups
                if g > 1:
                    tag = f"dw{k}x{k}s{s} c{conv.in_channels}"
                    out.append((f"block{i} {tag} conv {shape(xin)}", conv, xin))
                    act = type(part[-1]).__name__ if len(part) > 2 else "none"
                    out.append((f"block{i} {tag} +BN+{act} {shape(xin)}", part, xin))
                    bn_in = conv(xin)
                    out.append((f"block{i} BN alone {shape(bn_in)}", part[1], bn_in.detach()))
                    if len(part) > 2 and isinstance(part[2], nn.Hardswish):
                        out.append((f"block{i} hardswish alone {shape(bn_in)}", part[2], bn_in.detach()))
                else:
                    kind = "expand" if conv.out_channels > conv.in_channels else "project"
                    name = f"block{i} pw1x1 {kind} {conv.in_channels}->{conv.out_channels}+BN {shape(xin)}"
                    out.append((name, part, xin))
            else:  # SqueezeExcitation
                out.append((f"block{i} SE {shape(xin)}", part, xin))
    last = feats[-1]
    out.append((f"last conv1x1+BN+hswish {shape(seen[id(last)])}", last, seen[id(last)]))
    head = nn.Sequential(model.avgpool, nn.Flatten(1), model.classifier)
    out.append((f"head avgpool+linear {shape(seen[id(model.avgpool)])}", head, seen[id(model.avgpool)]))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--pieces", nargs="*", default=[], help="keep pieces whose name contains one of these")
    p.add_argument("--variant", default="", help="comma-separated OPTION=VALUE for a second pbsdk contender")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block-s", type=float, default=0.2)
    args = p.parse_args(argv)

    import torch

    import pbsdk.frontends.torch  # noqa: F401  (registers the backend)
    from pbsdk.bench import variant_options
    from pbsdk.testing.real_models import MODELS

    torch.set_num_threads(args.threads)
    base = {"threads": args.threads}
    variant = dict(base, **variant_options(args.variant))
    model, (x,) = MODELS["mobilenet_v3_small"].build(args.batch)
    chosen = [pc for pc in pieces(model, x) if not args.pieces or any(w in pc[0] for w in args.pieces)]
    print(f"mobilenet_v3_small pieces, batch {args.batch}, {args.threads} thread(s)"
          + (f"; variant {variant}" if args.variant else ""))
    head = f"{'piece':58s} {'eager ms':>9s} {'pbsdk ms':>9s}" + (f" {'variant':>9s}" if args.variant else "") + \
        "  pbsdk vs eager (spread)"
    print(head)
    totals: dict[str, float] = {}
    for name, mod, xin in chosen:
        fns: dict[str, Any] = {"eager": mod}
        with torch.no_grad():
            ref = mod(xin)
            contenders = [("pbsdk", base)] + ([("variant", variant)] if args.variant else [])
            for cname, opts in contenders:
                torch._dynamo.reset()
                f = torch.compile(mod, backend="pbsdk", options={"compile_options": opts})
                y = f(xin)
                err = float((y - ref).abs().max() / ref.abs().max().clamp_min(1e-30))
                if err > 1e-4:
                    raise SystemExit(f"{name} ({cname}): relative error {err:.2e} against eager")
                fns[cname] = f
            for fn in fns.values():  # warm: a contender compiled before the last dynamo reset recompiles here
                fn(xin)
            times: dict[str, list[float]] = {k: [] for k in fns}
            names = list(fns)
            for r in range(args.rounds):
                for cname in names[r % len(names):] + names[:r % len(names)]:
                    calls, t = 0, time.perf_counter()
                    while calls < 3 or time.perf_counter() - t < args.block_s:
                        fns[cname](xin)
                        calls += 1
                    times[cname].append((time.perf_counter() - t) / calls * 1e3)
        med = {k: statistics.median(v) for k, v in times.items()}
        rs = [times["eager"][i] / times["pbsdk"][i] for i in range(args.rounds)]
        for k, v in med.items():
            if "whole" in name or name.startswith(("stem", "last", "head")):
                totals[k] = totals.get(k, 0.0) + v
        print(f"{name:58s} {med['eager']:9.3f} {med['pbsdk']:9.3f}"
              + (f" {med['variant']:9.3f}" if args.variant else "")
              + f"  {statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})", flush=True)
    if totals:
        print("sum of stem, whole blocks, last conv and head: "
              + ", ".join(f"{k} {v:.2f} ms" for k, v in totals.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
