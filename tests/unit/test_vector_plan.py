"""The planner of non-contraction ops staged through a scratchpad (`pbsdk.core.plan.vector_tiles`): no IR."""

from __future__ import annotations

from pathlib import Path

import pytest

from pbsdk.core.plan.vector_tiles import Access, VectorOp, footprint, plan_vector, unit_mapping
from pbsdk.core.spec import ChipSpec, load_spec

EDGE = Path(__file__).resolve().parents[1] / "bringup" / "data" / "edge_npu.yaml"


@pytest.fixture(scope="module")
def edge() -> ChipSpec:
    return load_spec(EDGE)  # one 64 KiB scratchpad "spm", alignment 32 B, a 16x16x16 f16 unit


def _plain(*loops: int, dtype: str = "f32", output: bool = False) -> Access:
    return Access(tuple(((d, 1),) if d >= 0 else () for d in loops), dtype, output)


def _rows(rows: int, cols: int, dtype: str = "f32") -> VectorOp:
    """sum over the last axis: loops (row, col), x[row, col] -> y[row]."""
    return VectorOp((rows, cols), ("parallel", "reduction"), (_plain(0, 1, dtype=dtype), _plain(0, output=True)))


def test_a_small_elementwise_op_is_one_tile(edge: ChipSpec) -> None:
    # x[i, j] + b[j] -> y[i, j]: the broadcast operand's tile is one row.
    op = VectorOp((7, 49), ("parallel", "parallel"), (_plain(0, 1), _plain(-1, 1), _plain(0, 1, output=True)))
    plan = plan_vector(edge, op)
    assert plan.tile == (7, 49) and plan.tiles == 1 and not plan.chunked
    assert plan.buffers == ((7, 49), (1, 49), (7, 49))
    assert plan.level == "spm" and plan.space == 1 and plan.double_buffered
    assert plan.footprint_bytes == footprint(op, plan.tile) <= plan.budget_bytes == 65536 // 2


def test_a_row_wider_than_the_scratchpad_is_reduced_in_chunks(edge: ChipSpec) -> None:
    cols = 65536 // 4 + 35  # one f32 row is bigger than the whole scratchpad
    plan = plan_vector(edge, _rows(3, cols))
    assert plan.chunked and plan.chunks >= 3
    row, chunk = plan.tile
    assert row == 1 and chunk < cols and chunk % (32 // 4) == 0  # whole alignment quanta
    # balanced: the last chunk is not a sliver
    assert cols - (plan.chunks - 1) * chunk > chunk // 2
    assert plan.footprint_bytes <= plan.budget_bytes and any("chunks" in r for r in plan.reasons)


def test_rows_that_fit_are_reduced_whole_and_many_rows_share_a_tile(edge: ChipSpec) -> None:
    plan = plan_vector(edge, _rows(512, 100))
    assert plan.tile[1] == 100 and not plan.chunked
    assert 1 < plan.tile[0] < 512 and plan.footprint_bytes <= plan.budget_bytes


def test_double_buffering_halves_the_budget_unless_refused(edge: ChipSpec) -> None:
    op = _rows(64, 4096)
    double = plan_vector(edge, op)
    single = plan_vector(edge, op, {"double_buffer": False})
    assert double.double_buffered and double.budget_bytes == 32768
    assert not single.double_buffered and single.budget_bytes == 65536
    assert single.footprint_bytes > double.footprint_bytes


def test_a_reduction_over_the_first_axis_keeps_columns_contiguous(edge: ChipSpec) -> None:
    # max over axis 0: loops (row, col), x[row, col] -> y[col]
    op = VectorOp((4096, 300), ("reduction", "parallel"), (_plain(0, 1), _plain(1, output=True)))
    plan = plan_vector(edge, op)
    assert plan.tile[1] == 300 and plan.tile[0] < 4096 and plan.chunked


def _conv(n: int, c: int, o: int, hw: int, k: int, stride: int = 1, groups: int = 1, dtype: str = "f16") -> VectorOp:
    """NCHW grouped conv as emit.py writes it: loops (n, g, og, oh, ow, c, kh, kw)."""
    oh = (hw - k) // stride + 1
    x = Access((((0, 1),), ((1, 1),), ((5, 1),), ((3, stride), (6, 1)), ((4, stride), (7, 1))), dtype)
    w = Access((((1, 1),), ((2, 1),), ((5, 1),), ((6, 1),), ((7, 1),)), dtype)
    y = Access((((0, 1),), ((1, 1),), ((2, 1),), ((3, 1),), ((4, 1),)), "f32", output=True)
    return VectorOp((n, groups, o // groups, oh, oh, c // groups, k, k), ("parallel",) * 5 + ("reduction",) * 3,
                    (x, w, y))


def test_a_convolution_window_is_staged_with_its_halo(edge: ChipSpec) -> None:
    op = _conv(1, 8, 16, 11, 3, stride=2)
    plan = plan_vector(edge, op)
    x_tile = plan.buffers[0]
    t = plan.tile
    assert x_tile[3] == (t[3] - 1) * 2 + (t[6] - 1) + 1 and x_tile[4] == (t[4] - 1) * 2 + (t[7] - 1) + 1


def test_a_convolution_maps_onto_the_unit_as_pixels_by_channels(edge: ChipSpec) -> None:
    op = _conv(1, 8, 16, 9, 3)
    mapping, why = unit_mapping(edge, op)
    assert mapping is not None, why
    assert (mapping.m, mapping.n, mapping.k) == (4, 2, 5)  # ow, og, c
    assert mapping.unit.name == "mac16" and (mapping.unit.m, mapping.unit.n, mapping.unit.k) == (16, 16, 16)
    plan = plan_vector(edge, op, multiples=mapping.multiples())
    for d in (4, 2, 5):  # whole unit tiles, padded past the extents (7 columns, 16 and 8 channels)
        assert plan.tile[d] % 16 == 0
    assert plan.footprint_bytes <= plan.capacity_bytes


def test_depthwise_and_f32_convolutions_stay_on_the_vector_unit(edge: ChipSpec) -> None:
    mapping, why = unit_mapping(edge, _conv(1, 6, 6, 9, 3, groups=6))
    assert mapping is None and "kernel taps" in why
    mapping, why = unit_mapping(edge, _conv(1, 8, 16, 9, 3, groups=2, dtype="f32"))
    assert mapping is None and "no matrix unit for f32" in why


def test_a_level_too_small_for_one_element_of_each_operand_says_so(edge: ChipSpec) -> None:
    data = edge.model_dump()
    data["memory"][1]["size_bytes"] = 4  # x and y need 4 B each
    tiny = type(edge).model_validate(data)
    plan = plan_vector(tiny, _rows(2, 2))
    assert plan.footprint_bytes > plan.capacity_bytes and "exceeds" in plan.reasons[0]
