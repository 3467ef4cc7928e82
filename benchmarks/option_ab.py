#!/usr/bin/env python
"""One real model, one process: eager, Inductor, pbsdk, and pbsdk with some compile options changed.

    PYTHONPATH=. .venv/bin/python benchmarks/option_ab.py resnet18 --batch 8 --threads 1 \\
        --variant conv_nhwc=false,implicit_conv=false

Every contender runs in interleaved blocks of at least ``--block-s`` seconds, the order rotating each
round; the figure is the median over ``--rounds`` of each block's mean per call, and the ratios' spread is
the min–max of the per-round ratios (> 1: pbsdk with default options faster). Used for the convolution
rows of docs/benchmarks.md (the variant is the old conv path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text)
    except ValueError:
        return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a model of pbsdk.testing.real_models")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variant", default="", help="comma-separated OPTION=VALUE for the other pbsdk contender")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block-s", type=float, default=0.5)
    args = p.parse_args(argv)

    import torch

    import pbsdk.frontends.torch  # noqa: F401  (registers the backend)
    from pbsdk.testing.real_models import MODELS

    torch.set_num_threads(args.threads)
    base = {"threads": args.threads}
    variant = dict(base, **{k: _value(v) for k, v in (kv.split("=", 1) for kv in args.variant.split(",") if kv)})
    model, inputs = MODELS[args.model].build(args.batch)
    fns: dict[str, Any] = {"eager": model}
    first: dict[str, float] = {}
    with torch.no_grad():
        ref = model(*inputs)
        for name, opts in (("pbsdk", base), ("pbsdk_variant", variant), ("inductor", None)):
            torch._dynamo.reset()
            f = torch.compile(model) if opts is None else \
                torch.compile(model, backend="pbsdk", options={"compile_options": opts})
            t = time.perf_counter()
            y = f(*inputs)
            first[name] = time.perf_counter() - t
            err = float((y - ref).abs().max() / ref.abs().max())
            if err > 1e-4:
                raise SystemExit(f"{name}: relative error {err:.2e} against eager")
            fns[name] = f
        for fn in fns.values():  # warm: a contender compiled before the last dynamo reset recompiles here
            fn(*inputs)
        times: dict[str, list[float]] = {k: [] for k in fns}
        names = list(fns)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                calls, t = 0, time.perf_counter()
                while calls < 2 or time.perf_counter() - t < args.block_s:
                    fns[name](*inputs)
                    calls += 1
                times[name].append((time.perf_counter() - t) / calls * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(other: str) -> str:
        rs = [times[other][i] / times["pbsdk"][i] for i in range(args.rounds)]
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"

    print(f"{args.model} batch {args.batch}, {args.threads} thread(s); variant {variant}")
    print("latency ms: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    print(f"pbsdk vs Inductor {ratio('inductor')}; vs eager {ratio('eager')}; vs the variant {ratio('pbsdk_variant')}")
    print("first call s: " + ", ".join(f"{k} {v:.1f}" for k, v in first.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
