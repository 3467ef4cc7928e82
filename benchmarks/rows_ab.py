#!/usr/bin/env python
"""Row ops with the cpu stage ``vectorize-rows`` against without it (cpu option ``vectorize_rows=False``: the
row ops' scalar loops left to LLVM), per op and shape, in one process.

    PYTHONPATH=. .venv/bin/python benchmarks/rows_ab.py --threads 1 --rounds 7
    PYTHONPATH=. .venv/bin/python benchmarks/rows_ab.py --cases softmax:512x4096 layernorm:64x768 --threads 2

Each case is compiled twice (cache off) and checked against numpy; torch (eager, same threads) runs beside
them. The three run in interleaved blocks of calls (about 0.2 s each), the order rotating each round; a
block's figure is its fastest call, the result the median over rounds, the spread the min-max of the
per-round ratios. The CPU, the thread count and the clock before and after are printed with the table.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_CASES = ("softmax:4096x4096", "softmax:512x4096", "softmax:128x128", "layernorm:4096x4096",
                 "layernorm:512x4096", "layernorm:128x768", "log_softmax:512x4096", "rmsnorm:512x4096")


def _case(name: str, rng: np.random.Generator) -> tuple[Callable[..., Any], Callable[..., Any], Callable[..., Any],
                                                         tuple[np.ndarray, ...]]:
    """(pbsdk function, numpy reference, torch function, inputs) of ``op:RxC``."""
    import torch

    from pbsdk import ops

    op, shape = name.split(":")
    rows, cols = map(int, shape.split("x"))
    x = rng.standard_normal((rows, cols), dtype=np.float32) * 2
    w = rng.standard_normal(cols, dtype=np.float32)
    b = rng.standard_normal(cols, dtype=np.float32)
    tf = torch.nn.functional
    if op == "softmax":
        def np_softmax(v: np.ndarray) -> np.ndarray:
            e = np.exp(v - v.max(-1, keepdims=True))
            return e / e.sum(-1, keepdims=True)
        return (lambda v: ops.softmax(v, axis=-1)), np_softmax, (lambda v: torch.softmax(v, -1)), (x,)
    if op == "log_softmax":
        def np_log_softmax(v: np.ndarray) -> np.ndarray:
            s = v - v.max(-1, keepdims=True)
            return s - np.log(np.exp(s).sum(-1, keepdims=True))
        return ((lambda v: ops.log_softmax(v, axis=-1)), np_log_softmax, (lambda v: torch.log_softmax(v, -1)), (x,))
    if op == "layernorm":
        def np_layernorm(v: np.ndarray, ww: np.ndarray, bb: np.ndarray) -> np.ndarray:
            c = v - v.mean(-1, keepdims=True)
            return c / np.sqrt((c * c).mean(-1, keepdims=True) + np.float32(1e-5)) * ww + bb
        return ((lambda v, ww, bb: ops.layernorm(v, ww, bb, eps=1e-5)), np_layernorm,
                (lambda v, ww, bb: tf.layer_norm(v, (cols,), ww, bb, 1e-5)), (x, w, b))
    if op == "rmsnorm":
        def pb_rmsnorm(v: Any, ww: Any) -> Any:
            return v * ops.rsqrt(ops.mean(v * v, axis=-1, keepdims=True) + 1e-6) * ww

        def np_rmsnorm(v: np.ndarray, ww: np.ndarray) -> np.ndarray:
            return v / np.sqrt((v * v).mean(-1, keepdims=True) + np.float32(1e-6)) * ww
        return pb_rmsnorm, np_rmsnorm, (lambda v, ww: tf.rms_norm(v, (cols,), ww, 1e-6)), (x, w)
    raise SystemExit(f"unknown op {op!r}: softmax, log_softmax, layernorm, rmsnorm")


def measure(name: str, threads: int, rounds: int, block_s: float) -> dict[str, Any]:
    import torch

    import pbsdk
    from pbsdk.bench import interleaved_blocks

    fn, ref, tfn, inputs = _case(name, np.random.default_rng(0))
    expect = ref(*inputs)
    fns: dict[str, Callable[[], Any]] = {}
    for label, on in (("vectorized", True), ("scalar loops", False)):
        jf = pbsdk.jit(fn, options={"threads": threads, "cache": False, "vectorize_rows": on})
        np.testing.assert_allclose(jf(*inputs), expect, rtol=2e-4, atol=2e-5)
        fns[label] = lambda jf=jf: jf(*inputs)
    targs = tuple(torch.from_numpy(a) for a in inputs)
    fns["torch"] = lambda: tfn(*targs)
    times = interleaved_blocks(fns, rounds, block_s)
    ratio = [s / v for s, v in zip(times["scalar loops"], times["vectorized"])]
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return {"case": name, "threads": threads, "ms": med, "speedup": statistics.median(ratio),
            "spread": [min(ratio), max(ratio)], "x_torch": med["torch"] / med["vectorized"]}


def main(argv: list[str] | None = None) -> int:
    from pbsdk.bench import ab_parser

    args = ab_parser(__doc__, "--cases", DEFAULT_CASES, "op:ROWSxCOLS", block_s=0.2).parse_args(argv)
    import torch

    from pbsdk.bench import ratio_cell, run_ab

    torch.set_num_threads(args.threads)
    run_ab(args, args.cases, measure,
           ("| case | vectorized ms | scalar loops ms | torch ms | speedup [spread] | x torch |", "|---|--:|--:|--:|---|--:|"),
           lambda r: (f"| {r['case']} | {r['ms']['vectorized']:.3f} | {r['ms']['scalar loops']:.3f} | "
                      f"{r['ms']['torch']:.3f} | {ratio_cell(r)} | {r['x_torch']:.2f} |"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
