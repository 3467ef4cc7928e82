"""The pure helpers of `fill-borders` and `expose-rows` (no MLIR): the frame around a box tiles the buffer
minus the box exactly; leading unit dimensions; the layout memref.collapse_shape infers."""

from __future__ import annotations

import numpy as np
import pytest

from pbsdk.core.ir.builder import collapsed_layout
from pbsdk.core.passes.expose_rows import leading_units
from pbsdk.core.passes.fill_borders import frame

RNG = np.random.default_rng(3)


def _cover(shape, slabs):
    count = np.zeros(shape, dtype=np.int64)
    for offsets, sizes in slabs:
        count[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))] += 1
    return count


@pytest.mark.parametrize("case", range(40))
def test_frame_tiles_the_rest_exactly(case: int) -> None:
    rank = int(RNG.integers(1, 5))
    shape = tuple(int(RNG.integers(1, 7)) for _ in range(rank))
    offsets = tuple(int(RNG.integers(0, n + 1)) for n in shape)
    sizes = tuple(int(RNG.integers(0, n - o + 1)) for n, o in zip(shape, offsets))
    slabs = frame(shape, (offsets, sizes))
    covered = _cover(shape, slabs)
    box = np.zeros(shape, dtype=np.int64)
    box[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))] = 1
    assert (covered + box == 1).all(), "every element once: in the box or in exactly one slab"
    assert len(slabs) <= 2 * rank
    assert all(all(s > 0 for s in sizes_) for _, sizes_ in slabs), "no empty slab"


def test_frame_of_a_padded_image() -> None:
    # NHWC 1x6x6x8 with a one-pixel border: rows 0 and 5 whole, then columns 0 and 5 of rows 1-4.
    assert frame((1, 6, 6, 8), ((0, 1, 1, 0), (1, 4, 4, 8))) == [
        ((0, 0, 0, 0), (1, 1, 6, 8)), ((0, 5, 0, 0), (1, 1, 6, 8)),
        ((0, 1, 0, 0), (1, 4, 1, 8)), ((0, 1, 5, 0), (1, 4, 1, 8))]
    assert frame((4, 4), ((0, 0), (4, 4))) == []


def test_frame_refuses_a_box_outside() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        frame((4, 4), ((1, 0), (4, 4)))
    with pytest.raises(ValueError, match="rank"):
        frame((4, 4), ((0,), (4,)))


def test_leading_units() -> None:
    assert leading_units([(1, 56, 56, 64), (1, 56, 56, 64)]) == 1
    assert leading_units([(1, 1, 58, 64)]) == 2
    assert leading_units([(1, 1, 1)]) == 2, "one dimension is always left"
    assert leading_units([(1, 4), (2, 4)]) == 0
    assert leading_units([]) == 0


def test_collapsed_layout_matches_collapse_shape() -> None:
    # A group's stride is its innermost non-unit dimension's, or the first's when all are 1 (as the
    # memref.collapse_shape verifier infers it).
    assert collapsed_layout((1, 56, 56, 64), (215296, 3712, 64, 1), [[0, 1], [2], [3]]) == (
        [56, 56, 64], [3712, 64, 1])
    assert collapsed_layout((4, 1, 3), (40, 5, 1), [[0, 1], [2]]) == ([4, 3], [40, 1])
    assert collapsed_layout((1, 1, 3), (40, 5, 1), [[0, 1], [2]]) == ([1, 3], [40, 1])
