#!/usr/bin/env python
"""One real model, one process: eager, Inductor, pbsdk, and pbsdk with some compile options changed.

    PYTHONPATH=. .venv/bin/python benchmarks/option_ab.py resnet18 --batch 8 --threads 1 \\
        --variant conv_nhwc=false,implicit_conv=false

Every contender runs in interleaved blocks of at least ``--block-s`` seconds, the order rotating each
round; the figure is the median over ``--rounds`` of each block's mean per call, and the ratios' spread is
the min–max of the per-round ratios (> 1: pbsdk with default options faster). Every contender is called
once more after all are compiled (``torch._dynamo.reset()`` between the compilations drops the earlier
ones' traced frames), so no timed block includes a trace. ``--clock cpu`` (with ``--threads 1``) times the
calling thread's CPU seconds instead of wall seconds: on a shared host the other jobs then do not count.
Used for the convolution rows of docs/benchmarks.md (the variant is the old conv path).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model", help="a model of pbsdk.testing.real_models")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--variant", default="", help="comma-separated OPTION=VALUE for the other pbsdk contender")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block-s", type=float, default=0.5)
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this thread's CPU time (with --threads 1 every contender runs on the calling "
                        "thread, so a loaded host's other jobs are not counted)")
    args = p.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu needs --threads 1")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter

    import torch

    import pbsdk.frontends.torch  # noqa: F401  (registers the backend)
    from pbsdk.bench import variant_options
    from pbsdk.testing.real_models import MODELS

    torch.set_num_threads(args.threads)
    base = {"threads": args.threads}
    variant = dict(base, **variant_options(args.variant))
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
        for f in fns.values():  # torch._dynamo.reset() dropped the earlier contenders' frames: trace them again
            f(*inputs)
        times: dict[str, list[float]] = {k: [] for k in fns}
        names = list(fns)
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                calls, t = 0, clock()
                while calls < 2 or clock() - t < args.block_s:
                    fns[name](*inputs)
                    calls += 1
                times[name].append((clock() - t) / calls * 1e3)
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(other: str) -> str:
        rs = [times[other][i] / times["pbsdk"][i] for i in range(args.rounds)]
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"

    print(f"{args.model} batch {args.batch}, {args.threads} thread(s), {args.clock} clock; variant {variant}")
    print("latency ms: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    print(f"pbsdk vs Inductor {ratio('inductor')}; vs eager {ratio('eager')}; vs the variant {ratio('pbsdk_variant')}")
    print("first call s: " + ", ".join(f"{k} {v:.1f}" for k, v in first.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
