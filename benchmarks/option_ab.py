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

``--isolate`` gives every contender its own worker process (the same model and inputs, built from the
same seed), still timed in interleaved blocks that the driver hands out one at a time, so what one
contender's calls leave behind in its process (mapped and unmapped memory, allocator state, thread pools)
cannot bill the next contender's block. Each worker checks its contender against eager in its process.
The report then also gives each contender's system CPU seconds per call (``getrusage`` of the worker).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
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
    p.add_argument("--isolate", action="store_true", help="one worker process per contender (module docstring)")
    p.add_argument("--clock", choices=("wall", "cpu"), default="wall",
                   help="cpu: this thread's CPU time (with --threads 1 every contender runs on the calling "
                        "thread, so a loaded host's other jobs are not counted)")
    args = p.parse_args(argv)
    if args.clock == "cpu" and args.threads != 1:
        p.error("--clock cpu needs --threads 1")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    if args.isolate:
        return _isolated(args)

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


CONTENDERS = ("eager", "pbsdk", "pbsdk_variant", "inductor")


def _worker(conn: Any, name: str, model_name: str, batch: int, threads: int, variant: str, clock_name: str,
            block_s: float) -> None:
    """One contender in its own process: build, compile, check against eager, then run a block of calls
    whenever the driver asks, answering (ms per call, system CPU ms per call)."""
    import torch

    import pbsdk.frontends.torch  # noqa: F401  (registers the backend)
    from pbsdk.bench import variant_options
    from pbsdk.testing.real_models import MODELS

    clock = time.thread_time if clock_name == "cpu" else time.perf_counter
    torch.set_num_threads(threads)
    base = {"threads": threads}
    opts = {"pbsdk": base, "pbsdk_variant": dict(base, **variant_options(variant))}.get(name)
    model, inputs = MODELS[model_name].build(batch)
    with torch.no_grad():
        ref = model(*inputs)
        if name == "eager":
            f = model
        elif name == "inductor":
            f = torch.compile(model)
        else:
            f = torch.compile(model, backend="pbsdk", options={"compile_options": opts})
        t = time.perf_counter()
        y = f(*inputs)
        first = time.perf_counter() - t
        err = float((y - ref).abs().max() / ref.abs().max())
        conn.send((first, err))
        while conn.recv() == "block":
            calls, sys0, t = 0, resource.getrusage(resource.RUSAGE_SELF).ru_stime, clock()
            while calls < 2 or clock() - t < block_s:
                f(*inputs)
                calls += 1
            elapsed = clock() - t
            sys_s = resource.getrusage(resource.RUSAGE_SELF).ru_stime - sys0
            conn.send((elapsed / calls * 1e3, sys_s / calls * 1e3))


def _isolated(args: argparse.Namespace) -> int:
    ctx = mp.get_context("spawn")
    workers: dict[str, Any] = {}
    first: dict[str, float] = {}
    try:
        for name in CONTENDERS:  # compiled one after another: first calls do not overlap
            here, there = ctx.Pipe()
            proc = ctx.Process(target=_worker, args=(there, name, args.model, args.batch, args.threads,
                                                     args.variant, args.clock, args.block_s), daemon=True)
            proc.start()
            first[name], err = here.recv()
            if err > 1e-4:
                raise SystemExit(f"{name}: relative error {err:.2e} against eager")
            workers[name] = (proc, here)
        times: dict[str, list[float]] = {k: [] for k in CONTENDERS}
        system: dict[str, list[float]] = {k: [] for k in CONTENDERS}
        names = list(CONTENDERS)
        for _, conn in workers.values():  # one untimed block each (warm caches, steady allocator)
            conn.send("block")
            conn.recv()
        for r in range(args.rounds):
            for name in names[r % len(names):] + names[:r % len(names)]:
                conn = workers[name][1]
                conn.send("block")
                ms, sys_ms = conn.recv()
                times[name].append(ms)
                system[name].append(sys_ms)
    finally:
        for proc, conn in workers.values():
            try:
                conn.send("stop")
            except OSError:
                pass
            proc.join(timeout=30)
    med = {k: statistics.median(v) for k, v in times.items()}

    def ratio(other: str) -> str:
        rs = [times[other][i] / times["pbsdk"][i] for i in range(args.rounds)]
        return f"{statistics.median(rs):.2f}x ({min(rs):.2f}-{max(rs):.2f})"

    print(f"{args.model} batch {args.batch}, {args.threads} thread(s), {args.clock} clock, one process per "
          f"contender; variant {args.variant or '(none)'}")
    print("latency ms: " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()))
    print("system CPU ms per call: " + ", ".join(f"{k} {statistics.median(v):.2f}" for k, v in system.items()))
    print(f"pbsdk vs Inductor {ratio('inductor')}; vs eager {ratio('eager')}; vs the variant {ratio('pbsdk_variant')}")
    print("first call s: " + ", ".join(f"{k} {v:.1f}" for k, v in first.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
