"""`row_plan` (pass vectorize-rows), without IR: which structured ops run as vector loops over their row."""

from __future__ import annotations

from pbsdk.core.passes.vectorize_rows import RowPlan, row_plan

ROW = ((0, 1), (1, 100), (100, 1))
ONE = ((0, None), (1, 1), (1, 1))  # a 1x1 value


def test_a_reduction_into_one_value() -> None:
    assert row_plan(["parallel", "reduction"], [ROW, ONE], 1, 8) == RowPlan(100, True, (True, False))


def test_a_map_reading_a_scalar() -> None:
    assert row_plan(["parallel", "parallel"], [ROW, ONE, ROW], 2, 8) == RowPlan(100, False, (True, False, True))


def test_rows_of_any_count_known_or_not() -> None:
    many = ((0, 1), (3, 100), (100, 1))  # three rows, each reduced into its own value
    assert row_plan(["parallel", "reduction"], [many, ((0, None), (3, 1), (1, 1))], 1, 8) == \
        RowPlan(100, True, (True, False))
    keys = ((0, 1), (-1, -1), (-1, 1))  # rows and their length known at run time (a decode step's keys)
    assert row_plan(["parallel", "parallel"], [keys, ((0, None), (-1, 1), (1, 1)), keys], 2, 8) == \
        RowPlan(-1, False, (True, False, True))


def test_not_a_row_op() -> None:
    strided = ((0, 1), (1, 100), (200, 2))  # every other value
    assert row_plan(["parallel", "parallel"], [strided, ROW], 1, 8) is None
    short = ((0, 1), (1, 4), (4, 1))
    assert row_plan(["parallel", "parallel"], [short, short], 1, 8) is None  # shorter than a vector
    assert row_plan(["parallel", "reduction"], [ROW, ROW], 1, 8) is None  # a reduction writing a row
    assert row_plan(["parallel", "parallel"], [ROW, ONE], 1, 8) is None  # a map writing one value
    assert row_plan(["reduction", "parallel"], [ROW, ROW], 1, 8) is None  # a reduction not last
    transposed = ((1, 0), (100, 1), (1, 100))  # the last loop walks the first dimension
    assert row_plan(["parallel", "parallel"], [transposed, transposed], 1, 8) is None
