"""The pure analysis of pass collapse-loops (`collapsible_groups`): which adjacent loops of a structured op
run as one. No MLIR."""

from __future__ import annotations

from pbsdk.core.passes.collapse_loops import collapsible_groups

P, R = "parallel", "reduction"


def _ident(shape: tuple[int, ...]) -> tuple:
    strides, run = [], 1
    for s in reversed(shape):
        strides.append(run)
        run *= s
    return tuple(range(len(shape))), shape, tuple(reversed(strides))


def test_batchnorm_over_nchw_collapses_the_image_but_not_the_channel() -> None:
    """out = x * scale[c]: h and w become one loop; c cannot join them (scale indexes c alone) nor n
    (scale does not index n, but x does, so n and c would have to be adjacent in scale too)."""
    x = _ident((2, 240, 14, 14))
    scale = ((1,), (240,), (1,))
    assert collapsible_groups([P] * 4, [x, scale, x]) == [[0], [1], [2, 3]]


def test_a_broadcast_dimension_of_size_one_is_no_obstacle() -> None:
    """A (1, C, 1, 1) operand read at (0, c, 0, 0) indexes neither h nor w."""
    x = _ident((1, 96, 7, 7))
    bias = ((None, 1, None, None), (1, 96, 1, 1), (96, 1, 1, 1))
    assert collapsible_groups([P] * 4, [x, bias, x]) == [[0], [1], [2, 3]]


def test_whole_buffers_become_one_loop() -> None:
    x = _ident((1, 240, 14, 14))
    assert collapsible_groups([P] * 4, [x, x]) == [[0, 1, 2, 3]]


def test_a_transpose_collapses_only_what_both_sides_walk_together() -> None:
    """NCHW -> NHWC (loops n, h, w, c): h and w are adjacent in both, c is not."""
    out = _ident((1, 14, 14, 96))
    x = ((0, 3, 1, 2), (1, 96, 14, 14), (18816, 196, 14, 1))
    assert collapsible_groups([P] * 4, [x, out]) == [[0], [1, 2], [3]]


def test_reductions_merge_with_reductions_only() -> None:
    """A global average pool (n, c, 1, 1, kh, kw): the 7x7 window is one reduction of 49; the parallel
    loops merge among themselves where the input walks them too (n with c; the two unit loops, which the
    input does not index, together)."""
    x = ((0, 1, 4, 5), (1, 576, 7, 7), (28224, 49, 7, 1))
    out = ((0, 1, 2, 3), (1, 576, 1, 1), (576, 1, 1, 1))
    assert collapsible_groups([P, P, P, P, R, R], [x, out]) == [[0, 1], [2, 3], [4, 5]]


def test_a_padded_view_does_not_collapse_across_its_gap() -> None:
    """The interior of a padded buffer (rows of 16 with 14 used): w cannot join h."""
    view = ((0, 1, 2), (8, 14, 14), (256, 16, 1))
    dense = _ident((8, 14, 14))
    assert collapsible_groups([P] * 3, [view, dense]) == [[0], [1], [2]]
    assert collapsible_groups([], []) == []
