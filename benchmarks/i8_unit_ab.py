#!/usr/bin/env python
"""i8 products on the host's i8 unit against the same products on the f32 FMAs, their operands widened as
packed (`widened_dtype`): the measurement behind the unit's use on a host whose i8 unit widens its operands
(AVX2's ``vpmaddwd``, `MatrixUnit.register_dtype`) and behind `units_for`'s rule.

    PYTHONPATH=. .venv/bin/python benchmarks/i8_unit_ab.py --threads 1 --rounds 7
    PYTHONPATH=. .venv/bin/python benchmarks/i8_unit_ab.py --shapes 1024x1024x1024 --threads 2 --json out.json

Each shape (M x N x K: A is M x K, B K x N, i8 x i8 -> i32, B given per call) is compiled twice, cache off:
as planned (on the unit) and with ``matrix_units=False`` (the f32 FMA kernel on widened operands); both are
checked exactly against numpy's int32 product. The default shapes are GEMMs and the GEMM shapes of
ResNet-18's 3x3 convolutions at batch 1 (M output pixels, N output channels, K = 9 x input channels). The
two run in interleaved blocks of calls (about ``--block-s`` each), the order rotating each round; a block's
figure is its fastest call, the result the median over rounds; the spread is the min-max of the per-round
ratios. The CPU model and the clock measured before and after are printed with the table.
"""

from __future__ import annotations

import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

DEFAULT_SHAPES = ("1024x1024x1024", "512x768x3072", "3136x64x576", "784x128x1152", "196x256x2304", "49x512x4608")


def measure(shape: str, threads: int, rounds: int, block_s: float) -> dict[str, Any]:
    import pbsdk
    from pbsdk.bench import interleaved_blocks
    from pbsdk.core.plan.contraction import Contraction, plan_contraction
    from pbsdk.core.spec import load_spec

    m, n, k = map(int, shape.split("x"))
    rng = np.random.default_rng(0)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    want = a.astype(np.int32) @ b.astype(np.int32)
    fns: dict[str, Callable[[], Any]] = {}
    for name, options in (("unit", {}), ("widened", {"matrix_units": False})):
        jf = pbsdk.jit(lambda x, y: x @ y, options={"threads": threads, "cache": False, **options})
        np.testing.assert_array_equal(jf(a, b), want)
        fns[name] = lambda jf=jf: jf(a, b)
    plan = plan_contraction(load_spec("host"), Contraction(m, n, k, dtype="i8"), {"threads": threads})
    times = interleaved_blocks(fns, rounds, block_s)
    ratio = [w / u for w, u in zip(times["widened"], times["unit"])]
    med = {name: statistics.median(ts) for name, ts in times.items()}
    gops = 2 * m * n * k / 1e9
    return {"shape": shape, "threads": threads, "unit": plan.compute.name,
            "tile": f"{plan.compute.m}x{plan.compute.n}", "ms": {kk: v * 1e3 for kk, v in med.items()},
            "gops": {kk: gops / v for kk, v in med.items()}, "speedup": statistics.median(ratio),
            "spread": [min(ratio), max(ratio)]}


def main(argv: list[str] | None = None) -> int:
    from pbsdk.bench import ab_parser

    args = ab_parser(__doc__, "--shapes", DEFAULT_SHAPES, "MxNxK").parse_args(argv)
    from pbsdk.bench import ratio_cell, run_ab
    from pbsdk.core.spec import load_spec

    if not any(u.operand_dtype == "i8" for u in load_spec("host").matrix_units):
        print("this host has no i8 unit: nothing to compare", file=sys.stderr)
        return 1
    run_ab(args, args.shapes, measure,
           ("| M x N x K | unit, register tile | unit ms | widened ms | speedup [spread] | GOP/s unit / widened |",
            "|---|---|--:|--:|---|---|"),
           lambda r: (f"| {r['shape']} | {r['unit']} {r['tile']} | {r['ms']['unit']:.2f} | {r['ms']['widened']:.2f} | "
                      f"{ratio_cell(r)} | {r['gops']['unit']:.0f} / {r['gops']['widened']:.0f} |"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
