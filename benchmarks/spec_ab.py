#!/usr/bin/env python
"""One matmul + bias + ReLU per shape, compiled for the host spec and for the host spec with fields set
otherwise (``--set FIELD=VALUE``, a field path as for `pbsdk dse --vary`), timed in one process: what a
planner input is worth on this CPU.

    PYTHONPATH=. .venv/bin/python benchmarks/spec_ab.py --set vector.fma_latency=1 \\
        --shapes 1x768x3072 22x768x768 22x768x3072 33x768x768 --threads 1 --rounds 9

The outputs are checked against each other, then both run in interleaved blocks (`pbsdk.bench.interleaved_blocks`:
each block's fastest call, the order rotating); the speedup is the changed spec's time over the host spec's,
median of the per-round ratios with their spread (> 1: the host spec as detected is faster). The weight is an
argument, so B is packed or streamed per call.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

DEFAULT_SHAPES = ("22x768x768",)


def _specs(sets: list[str]) -> tuple[Any, Any]:
    """The host spec, and the host spec with ``sets`` (``FIELD=VALUE`` each) applied and validated."""
    from pbsdk.core.spec import load_spec
    from pbsdk.dse import parse_vary, variants

    host = load_spec("host")
    (changed,) = variants(host, [parse_vary(text) for text in sets])
    if changed.spec is None:
        raise SystemExit(f"--set {' '.join(sets)}: {changed.error}")
    return host, changed.spec


def measure(shape: str, threads: int, rounds: int, block_s: float, sets: list[str]) -> dict[str, Any]:
    import pbsdk
    from pbsdk import ops
    from pbsdk.bench import interleaved_blocks

    m, n, k = (int(d) for d in shape.lower().split("x"))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    fns: dict[str, Callable[[], Any]] = {}
    outs = {}
    for label, spec in zip(("host", "changed"), _specs(sets)):
        f = pbsdk.jit(lambda x, w_, b_: ops.relu(x @ w_ + b_), target="cpu", spec=spec, options={"threads": threads})
        outs[label] = f(a, w, b)
        fns[label] = lambda f=f: f(a, w, b)
    np.testing.assert_allclose(outs["changed"], outs["host"], rtol=1e-4, atol=1e-4)
    times = interleaved_blocks(fns, rounds, block_s)
    ratio = [c / h for c, h in zip(times["changed"], times["host"])]
    return {"case": shape, "set": sets, "threads": threads,
            "us": {k_: statistics.median(v) * 1e6 for k_, v in times.items()},
            "speedup": statistics.median(ratio), "spread": [min(ratio), max(ratio)]}


def main(argv: list[str] | None = None) -> int:
    from pbsdk.bench import ab_parser, ratio_cell, run_ab

    parser = ab_parser(__doc__, "--shapes", DEFAULT_SHAPES, "MxNxK", block_s=0.2)
    parser.add_argument("--set", nargs="+", required=True, dest="sets", help="FIELD=VALUE: the changed spec")
    args = parser.parse_args(argv)
    changed = ", ".join(args.sets)
    run_ab(args, args.shapes, lambda case, t, r, b: measure(case, t, r, b, args.sets),
           (f"| m x n x k | host µs | {changed} µs | speedup [spread] |", "|---|--:|--:|---|"),
           lambda r: f"| {r['case']} | {r['us']['host']:.1f} | {r['us']['changed']:.1f} | {ratio_cell(r)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
