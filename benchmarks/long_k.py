#!/usr/bin/env python
"""Long k blocks against k blocks that keep B's micro-panel in the innermost cache, per GEMM shape, with the
planner's choice: the measurements behind `long_k_stream_share` and `LONG_K_SHARE`
(`pbsdk.core.plan.contraction`).

    PYTHONPATH=. .venv/bin/python benchmarks/long_k.py --threads 1 --rounds 7
    PYTHONPATH=. .venv/bin/python benchmarks/long_k.py --shapes 128x4096x4096 --threads 2 --json out.json

Each shape (M x N x K: A is M x K, B K x N) is compiled twice, cache off: with long k blocks wherever the
row rule allows them (the B micro-panel streamed from the middle cache, whatever share of its bandwidth that
takes), and with kc filling the innermost cache (the stream share taken as above any bound). numpy (its BLAS
on as many threads) runs beside them. The three run in interleaved blocks of calls (about 0.3 s each), the
order rotating each round; a block's figure is its fastest call, the result the median over rounds; the
spread is the min-max of the per-round ratios. "planner" is which of the two the planner picks by itself on
the host spec. The CPU model and the clock measured before and after are printed with the table.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_SHAPES = ("1024x1024x1024", "2048x2048x2048", "512x3072x768", "128x4096x4096")


@contextmanager
def _stream_share(value: float | None):  # type: ignore[no-untyped-def]
    """Plans made inside see every B stream's share of the middle cache's bandwidth as ``value`` (None: as
    computed)."""
    from pbsdk.core.plan import contraction

    real = contraction.long_k_stream_share
    if value is not None:
        contraction.long_k_stream_share = lambda *a, **k: value  # type: ignore[assignment]
    try:
        yield
    finally:
        contraction.long_k_stream_share = real  # type: ignore[assignment]


def measure(shape: str, threads: int, rounds: int, block_s: float) -> dict[str, Any]:
    import pbsdk
    from pbsdk.bench import interleaved_blocks
    from pbsdk.core.plan.contraction import Contraction, plan_contraction
    from pbsdk.core.spec import load_spec

    m, n, k = map(int, shape.split("x"))
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    fns: dict[str, Callable[[], Any]] = {}
    kcs: dict[str, int] = {}
    for name, share in (("long k", 0.0), ("kc in l1", 1.0)):
        with _stream_share(share):
            jf = pbsdk.jit(lambda x, y: x @ y, options={"threads": threads, "cache": False})
            out = jf(a, b)
            blk = plan_contraction(load_spec("host"), Contraction(m, n, k), {"threads": threads}).blocking
        assert blk is not None
        kcs[name] = blk.kc
        np.testing.assert_allclose(out, ref, rtol=1e-3, atol=1e-2 * np.sqrt(k))
        fns[name] = lambda jf=jf: jf(a, b)
    fns["numpy"] = lambda: a @ b
    chosen = plan_contraction(load_spec("host"), Contraction(m, n, k), {"threads": threads}).blocking
    assert chosen is not None
    times = interleaved_blocks(fns, rounds, block_s)
    ratio = [lg / l1 for lg, l1 in zip(times["long k"], times["kc in l1"])]
    med = {name: statistics.median(ts) for name, ts in times.items()}
    return {"shape": shape, "threads": threads, "kc": kcs, "ms": {kk: v * 1e3 for kk, v in med.items()},
            "l1_over_long": statistics.median(ratio), "spread": [min(ratio), max(ratio)],
            "x_numpy": {kk: med["numpy"] / med[kk] for kk in ("long k", "kc in l1")},
            "planner": "kc in l1" if chosen.kc == kcs["kc in l1"] else "long k"}


def main(argv: list[str] | None = None) -> int:
    from pbsdk.bench import ab_parser

    args = ab_parser(__doc__, "--shapes", DEFAULT_SHAPES, "MxNxK").parse_args(argv)
    from threadpoolctl import threadpool_limits

    from pbsdk.bench import run_ab

    def row(r: dict[str, Any]) -> str:
        ms = r["ms"]
        return (f"| {r['shape']} | {r['kc']['long k']} / {r['kc']['kc in l1']} | {ms['long k']:.2f} | "
                f"{ms['kc in l1']:.2f} | {ms['numpy']:.2f} | {r['l1_over_long']:.3f} [{r['spread'][0]:.2f}–"
                f"{r['spread'][1]:.2f}] | {r['x_numpy']['long k']:.2f} / {r['x_numpy']['kc in l1']:.2f} | "
                f"{r['planner']} |")

    with threadpool_limits(args.threads):
        run_ab(args, args.shapes, measure,
               (("| M x N x K | kc long / in l1 | long k ms | kc in l1 ms | numpy ms | in l1 / long (speedup) [spread] "
                 "| x numpy long / in l1 | planner |"), "|---|---|--:|--:|--:|---|---|---|"), row)
    return 0


if __name__ == "__main__":
    sys.exit(main())
