"""The pure analysis of `copies-to-linalg`'s ``row_copies`` (no IR): which dimensions of a strided copy
form rows contiguous on both sides, checked against the element addresses, and when rows pay."""

from __future__ import annotations

import numpy as np
import pytest

from pbsdk.core.passes.copies_to_linalg import MIN_ROW_BYTES, row_copy_split, row_split

RNG = np.random.default_rng(11)


def _addresses(shape: tuple[int, ...], strides: tuple[int, ...]) -> np.ndarray:
    """Every element's offset, in row-major order of ``shape``."""
    grids = np.meshgrid(*[np.arange(n) for n in shape], indexing="ij")
    return sum((g * s for g, s in zip(grids, strides)), np.zeros(shape, dtype=np.int64)).reshape(-1)


def _one_run(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    a = _addresses(shape, strides)
    return bool((a - a[0] == np.arange(a.size)).all())


def _view_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Strides of ``shape`` as a view into a buffer up to 2 larger per dimension, maybe transposed."""
    outer = [n + int(RNG.integers(0, 3)) for n in shape]
    perm = RNG.permutation(len(shape)) if RNG.random() < 0.2 else np.arange(len(shape))
    strides = [0] * len(shape)
    running = 1
    for d in reversed(perm):
        strides[d] = running
        running *= outer[d]
    return tuple(strides)


@pytest.mark.parametrize("case", range(60))
def test_rows_are_the_longest_suffix_contiguous_on_both_sides(case: int) -> None:
    rank = int(RNG.integers(1, 5))
    shape = tuple(int(RNG.integers(1, 5)) for _ in range(rank))
    src, dst = _view_strides(shape), _view_strides(shape)
    k = row_split(shape, src, dst)
    assert _one_run(shape[k:], src[k:]) and _one_run(shape[k:], dst[k:])
    if k > 0:  # one dimension more breaks the run on one side
        assert not (_one_run(shape[k - 1:], src[k - 1:]) and _one_run(shape[k - 1:], dst[k - 1:]))


def test_padded_interior_is_rows_of_the_last_two_dimensions() -> None:
    shape = (8, 56, 56, 64)
    padded = (58 * 58 * 64, 58 * 64, 64, 1)
    assert row_split(shape, (56 * 56 * 64, 56 * 64, 64, 1), padded) == 2
    assert row_copy_split(shape, (56 * 56 * 64, 56 * 64, 64, 1), padded, 1) == 2  # 448 rows of 3584 B


def test_unit_dimensions_never_break_a_run() -> None:
    # The left column of a padded image (8x58x1x64 in 8x58x58x64): rows of 64, its unit dim's stride aside.
    assert row_split((8, 58, 1, 64), (3712, 64, 64, 1), (215296, 3712, 64, 1)) == 2
    assert row_split((1, 1), (5, 3), (7, 9)) == 0


def test_short_runs_and_single_runs_are_left_alone() -> None:
    # A transpose: the run is one element.
    assert row_split((16, 32), (32, 1), (1, 16)) == 2
    assert row_copy_split((16, 32), (32, 1), (1, 16), 8) is None
    # Two f32 channels of 64: 8 B rows.
    assert row_copy_split((4, 8, 2), (16, 2, 1), (512, 64, 1), 4) is None
    # The whole copy is one run: one memcpy, nothing to split.
    assert row_copy_split((4, 8), (8, 1), (8, 1), 4) is None
    # At the threshold the rows pay.
    n = MIN_ROW_BYTES // 4
    assert row_copy_split((3, n), (n, 1), (n + 1, 1), 4) == 1
    assert row_copy_split((3, n - 1), (n - 1, 1), (n, 1), 4) is None
