"""Strided copies element by element against a memcpy per contiguous row (``copies-to-linalg``'s
``row_copies``, the cpu target's ``lower-copies``): the measurements behind `MIN_ROW_BYTES`
(`pbsdk.core.passes.copies_to_linalg`).

    .venv/bin/python benchmarks/row_copies.py --rounds 7

Each case is an i8 ``ops.pad`` whose interior is a strided copy with rows of the given length (about 1.6 MB
moved): the ResNet-18 activation ``8x56x56x64`` into its ``8x58x58x64`` padded buffer (rows of 3584 B),
then ``R x C`` matrices padded by 16 columns (rows of C bytes). Each is compiled twice in this process
(``MIN_ROW_BYTES`` above every row, then 1; cache off); the two run in interleaved blocks of calls, the
minimum per block, the median over rounds. The fill and the short border copies of the pad are in both.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np

from pbsdk.bench import best_of

CASES: tuple[tuple[str, tuple[int, ...], Any], ...] = (
    ("8x56x56x64 -> 8x58x58x64", (8, 56, 56, 64), ((0, 0), (1, 1), (1, 1), (0, 0))),
    *((f"{3 * (1 << 19) // c}x{c} -> +16 cols", (3 * (1 << 19) // c, c), ((0, 0), (0, 16)))
      for c in (2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096)),
)


def _compiled(shape: tuple[int, ...], widths: Any, min_row_bytes: int, x: np.ndarray) -> Callable[[], Any]:
    import pbsdk
    from pbsdk import ops
    from pbsdk.core.passes import copies_to_linalg

    saved = copies_to_linalg.MIN_ROW_BYTES
    copies_to_linalg.MIN_ROW_BYTES = min_row_bytes
    try:
        f = pbsdk.jit(lambda a: ops.pad(a, widths), options={"cache": False, "threads": 1})
        got = f(x)  # compiles now, with this threshold
    finally:
        copies_to_linalg.MIN_ROW_BYTES = saved
    assert np.array_equal(got, np.pad(x, widths)), shape
    return lambda: f(x)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    print("| copy (i8) | row bytes | element loops ms | memcpy per row ms | ratio |")
    print("|---|--:|--:|--:|--:|")
    for name, shape, widths in CASES:
        x = rng.integers(-128, 128, shape).astype(np.int8)
        fns = [_compiled(shape, widths, m, x) for m in (1 << 40, 1)]
        times: list[list[float]] = [[], []]
        for _ in range(args.rounds):
            for i, fn in enumerate(fns):
                times[i].append(best_of(fn, (), args.calls))
        before, after = (statistics.median(t) * 1e3 for t in times)
        row = shape[-1] * (shape[-2] if len(shape) == 4 else 1)
        print(f"| {name} | {row} | {before:.3f} | {after:.3f} | {after / before:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
