#!/usr/bin/env python
"""One matmul + bias + ReLU per shape, compiled for the host spec and for the host spec with some fields
changed (`pbsdk dse`'s ``--vary`` syntax), timed in one process: what a planner input is worth on this CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/spec_ab.py --vary vector.fma_latency=1 \\
        --shapes 1x768x768 22x768x768 22x768x3072 33x768x768 --threads 1 --rounds 7

The first variant is the host spec as detected (the baseline); each ``--vary`` value is another. Per round
every contender runs a block of calls (at least ``--block-s`` seconds; the order rotating), timed with
``time.thread_time`` at 1 thread (other processes' load does not count) or wall time at more; the figure is
the median over rounds of each block's mean per call, the ratio variant / baseline with the per-round
ratios' min-max (> 1: the baseline is faster). Outputs are checked against each other before timing.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from pbsdk.bench import cpu_model


def _timed(fns: dict[str, Callable[[], Any]], rounds: int, block_s: float,
           clock: Callable[[], float]) -> dict[str, list[float]]:
    calls = {}
    for name, fn in fns.items():  # calls per block from a first timing
        fn()
        start = clock()
        fn()
        calls[name] = max(3, int(block_s / max(clock() - start, 1e-7)))
    per: dict[str, list[float]] = {k: [] for k in fns}
    names = list(fns)
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            start = clock()
            for _ in range(calls[name]):
                fns[name]()
            per[name].append((clock() - start) / calls[name])
    return per


def measure(shapes: list[tuple[int, int, int]], vary: list[str], threads: int, rounds: int,
            block_s: float) -> dict[str, Any]:
    import pbsdk
    from pbsdk import ops
    from pbsdk.core.spec import load_spec
    from pbsdk.dse import parse_vary, variants

    host = load_spec("host")
    specs = {"host": host}
    for v in variants(host, [parse_vary(text) for text in vary]) if vary else []:
        if v.spec is None:
            raise SystemExit(f"--vary {v.values}: {v.error}")
        specs[", ".join(f"{f}={x}" for f, x in v.values)] = v.spec
    clock = time.thread_time if threads == 1 else time.perf_counter
    rng = np.random.default_rng(0)
    rows = []
    for m, n, k in shapes:
        a = rng.standard_normal((m, k)).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float32) / np.sqrt(k)
        b = rng.standard_normal(n).astype(np.float32)
        fns = {}
        outs = {}
        for label, spec in specs.items():
            f = pbsdk.jit(lambda x, w_, b_: ops.relu(x @ w_ + b_), target="cpu", spec=spec,
                          options={"threads": threads})
            outs[label] = f(a, w, b)
            fns[label] = lambda f=f, a=a, w=w, b=b: f(a, w, b)
        for label, out in outs.items():
            np.testing.assert_allclose(out, outs["host"], rtol=1e-4, atol=1e-4, err_msg=label)
        per = _timed(fns, rounds, block_s, clock)
        row: dict[str, Any] = {"shape": [m, n, k], "us": {k_: 1e6 * statistics.median(v) for k_, v in per.items()}}
        for label in specs:
            if label != "host":
                ratios = [x / y for x, y in zip(per[label], per["host"])]
                row.setdefault("ratio", {})[label] = [statistics.median(ratios), min(ratios), max(ratios)]
        rows.append(row)
        print(json.dumps(row), flush=True)
    return {"cpu": cpu_model(cpuid=True), "threads": threads, "rounds": rounds, "vary": vary,
            "clock": "thread_time" if threads == 1 else "wall", "rows": rows}


def markdown(result: dict[str, Any]) -> str:
    labels = [k for k in result["rows"][0]["us"] if k != "host"] if result["rows"] else []
    head = ("| m x n x k | host us | " + " | ".join(f"{lab} us | {lab} / host (min-max)" for lab in labels)
            + " |\n|---|---|" + "---|---|" * len(labels) + "\n")
    lines = []
    for r in result["rows"]:
        cells = [f"{r['us']['host']:.1f}"]
        for lab in labels:
            med, lo, hi = r["ratio"][lab]
            cells += [f"{r['us'][lab]:.1f}", f"{med:.3f} ({lo:.3f}-{hi:.3f})"]
        lines.append(f"| {'x'.join(map(str, r['shape']))} | " + " | ".join(cells) + " |")
    return (f"CPU: {result['cpu']}; {result['threads']} thread(s), {result['clock']} per call, median of "
            f"{result['rounds']} interleaved rounds.\n\n" + head + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--vary", nargs="*", default=[], help="FIELD=V1,V2,... as for pbsdk dse")
    parser.add_argument("--shapes", nargs="+", default=["22x768x768"], help="MxNxK")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-s", type=float, default=0.1)
    parser.add_argument("--json")
    parser.add_argument("--md")
    args = parser.parse_args()
    shapes = [tuple(int(d) for d in s.lower().split("x")) for s in args.shapes]
    result = measure(shapes, args.vary, args.threads, args.rounds, args.block_s)  # type: ignore[arg-type]
    text = markdown(result)
    print(text)
    if args.json:
        from pathlib import Path
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    if args.md:
        from pathlib import Path
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
