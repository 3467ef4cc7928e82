"""`plan_transpose` (the pure half of `transpose-blocks`): which permuting copies are moved as register
blocks, over which two loops, and why the others are not; and the shuffle butterfly those blocks (and the
packed matmul kernel's transposing packs) go through. Checked without IR."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pbsdk.core.ir.builder import transpose_stages
from pbsdk.core.passes.transpose_blocks import plan_transpose


def _strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(s) // 4 for s in np.empty(shape, np.float32).strides)


def test_nchw_to_nhwc_is_blocked_over_hw_and_c() -> None:
    # loops (n, hw, c) of the output [1, 3136, 64]; the input [1, 64, 3136] is indexed (n, c, hw)
    plan, why = plan_transpose((1, 3136, 64), (0, 2, 1), (0, 1, 2), _strides((1, 64, 3136)), _strides((1, 3136, 64)), 16)
    assert plan is not None and why == ""
    assert (plan.a, plan.q) == (1, 2) and not plan.ragged_a and not plan.ragged_q


def test_ragged_extents_are_marked() -> None:
    plan, _ = plan_transpose((2, 40, 20), (0, 2, 1), (0, 1, 2), _strides((2, 20, 40)), _strides((2, 40, 20)), 16)
    assert plan is not None and plan.ragged_a and plan.ragged_q


@pytest.mark.parametrize(("extents", "in_loops", "in_shape", "reason"), [
    ((8, 4, 32), (1, 0, 2), (4, 8, 32), "stays innermost"),
    ((64, 3), (1, 0), (3, 64), "narrower than a 16 x 16 block"),
    ((3, 64), (1, 0), (64, 3), "narrower than a 16 x 16 block"),
])
def test_rejects_say_why(extents: tuple[int, ...], in_loops: tuple[int, ...], in_shape: tuple[int, ...],
                         reason: str) -> None:
    out_loops = tuple(range(len(extents)))
    plan, why = plan_transpose(extents, in_loops, out_loops, _strides(in_shape), _strides(extents), 16)
    assert plan is None and reason in why


def test_strides_and_lanes_are_checked() -> None:
    plan, why = plan_transpose((48, 32), (1, 0), (0, 1), (1, 32), (32, 1), 16)
    assert plan is None and "stride" in why
    plan, why = plan_transpose((48, 32), (1, 0), (0, 1), (48, 1), (32, 1), 12)
    assert plan is None and "power of two" in why
    plan, why = plan_transpose((48, 32), (0, 0), (0, 1), (48, 1), (32, 1), 16)
    assert plan is None and "permutation" in why


def test_every_permutation_of_four_loops() -> None:
    """A plan exists exactly when the input's innermost loop is not the output's and both are >= 16 long;
    its a and q are those loops."""
    shape = (2, 16, 3, 32)
    for perm in itertools.permutations(range(4)):
        in_shape = tuple(shape[p] for p in perm)  # input dimension j is loop perm[j]
        plan, _ = plan_transpose(shape, perm, (0, 1, 2, 3), _strides(in_shape), _strides(shape), 16)
        a, q = perm[-1], 3
        expected = a != q and shape[a] >= 16
        assert (plan is not None) == expected, perm
        if plan is not None:
            assert (plan.a, plan.q) == (a, q)


@pytest.mark.parametrize("lanes", [2, 4, 8, 16])
def test_the_butterfly_transposes(lanes: int) -> None:
    """`transpose_stages` applied with numpy's reading of vector.shuffle (lanes of the concatenation of both
    operands) gives the transpose; log2(lanes) stages of lanes/2 pairs."""
    block = np.arange(lanes * lanes).reshape(lanes, lanes)
    rows = list(block)
    stages = transpose_stages(lanes)
    assert len(stages) == lanes.bit_length() - 1 and all(len(st) == lanes // 2 for st in stages)
    for stage in stages:
        before = list(rows)
        for i, j, low, high in stage:
            both = np.concatenate([before[i], before[j]])
            rows[i], rows[j] = both[low], both[high]
    assert (np.array(rows) == block.T).all()


def test_side_inputs_of_a_permuting_map_are_read_by_how_q_walks_them() -> None:
    # Blocks of loops a = 1 (channels, the source's innermost) x q = 2 (pixels, the output's innermost).
    from pbsdk.core.passes.transpose_blocks import plan_side_inputs

    bias = ((None, None, 1), (16, 16, 1))       # one value per channel: a scalar per block row
    residual = ((0, 1, 2), (900 * 16, 900, 1))  # stored like the output: a vector along q
    twin = ((0, 2, 1), (900 * 16, 16, 1))       # stored like the source: transposed as well
    constant = ((0,), (1,))                      # not walked by q
    reads, why = plan_side_inputs([bias, residual, twin, constant], 1, 2)
    assert reads == ("scalar", "row", "transposed", "scalar") and why == ""


def test_side_inputs_that_would_be_gathers_are_refused() -> None:
    from pbsdk.core.passes.transpose_blocks import plan_side_inputs

    strided_q = ((0, 1, 2), (900 * 16, 900, 2))   # q innermost but stride 2
    q_outer = ((2, 0, 1), (16, 900 * 16, 1))      # q walks an outer dimension, a the innermost
    reads, why = plan_side_inputs([strided_q], 1, 2)
    assert reads is None and "input 1" in why
    reads, why = plan_side_inputs([((2, 0), (16, 1))], 1, 2)  # q outer, loop 0 innermost: neither a nor q
    assert reads is None and "neither" in why
    reads, _ = plan_side_inputs([q_outer], 1, 2)  # q outer, a innermost: transposed like the source
    assert reads == ("transposed",)
