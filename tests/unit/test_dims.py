"""Symbolic dimensions (`pbsdk.core.dims`): parsing, binding from argument shapes, evaluation. No MLIR."""

from __future__ import annotations

from typing import Any

import pytest

from pbsdk.core.dims import Dim, bind, canonical, concrete, evaluate, is_dynamic
from pbsdk.core.errors import ArgumentError


def test_parse_and_print_round_trip() -> None:
    assert str(Dim.parse("s0")) == "s0"
    assert str(Dim.parse("s0 + 1")) == "s0 + 1"
    assert str(Dim.parse("2*s0 - 3")) == "2*s0 - 3"
    assert str(Dim.parse("-s1 + s0")) == "s0 - s1"
    assert Dim.parse("a0d0 + a1d0 - a0d0").coeffs == (("a1d0", 1),)
    assert canonical("4 + 3") == 7
    assert canonical(" s0+1 ") == "s0 + 1"


@pytest.mark.parametrize("bad", ["", "s0 +", "2*3", "s0 s1", "(s0)"])
def test_malformed_expressions_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        Dim.parse(bad)


def test_bind_reads_lone_symbols_and_checks_the_rest() -> None:
    declared = [("b", "s", 768), ("b", "s + 1", 64)]
    env = bind(declared, [(2, 5, 768), (2, 6, 64)])
    assert env == {"b": 2, "s": 5}
    assert concrete(("s + 1", "2*s"), env) == (6, 10)
    assert evaluate(7, env) == 7
    assert is_dynamic(("s", 3)) and not is_dynamic((1, 3))


@pytest.mark.parametrize("shapes, message", [
    ([(2, 5, 768), (3, 6, 64)], "b is 2 in an earlier argument"),
    ([(2, 5, 768), (2, 7, 64)], "expected (2, 6, 64)"),
    ([(2, 5, 767), (2, 6, 64)], "expected (2, 5, 768)"),
    ([(2, 5), (2, 6, 64)], "expected rank 3"),
])
def test_bind_refuses_inconsistent_shapes(shapes: list[tuple[int, ...]], message: str) -> None:
    with pytest.raises(ArgumentError, match=message.replace("(", r"\(").replace(")", r"\)")):
        bind([("b", "s", 768), ("b", "s + 1", 64)], shapes, what="k")


def test_a_size_no_argument_binds_is_an_error() -> None:
    with pytest.raises(ArgumentError, match="names t"):
        bind([("t + 1",)], [(3,)])


def test_dim_arithmetic_stays_linear_and_folds_to_ints() -> None:
    s0, s1 = Dim.parse("s0"), Dim.parse("s1")
    assert str(s0 + 1) == "s0 + 1" and str(2 * s0 - 3) == "2*s0 - 3" and str(s0 * 2 + s1) == "2*s0 + s1"
    assert (s0 + 1) - s0 == 1 and isinstance((s0 + 1) - s0, int)
    assert 64 * s0 // 8 == 8 * s0 and (64 * s0) % 8 == 0
    assert s0 + 1 == Dim.parse("s0 + 1") and s0 != 1  # a symbolic size never equals an int


@pytest.mark.parametrize("needs_value", [lambda d: d > 1, lambda d: int(d), lambda d: range(d), lambda d: d * 0.5,
                                         lambda d: (2 * d + 1) // 2, lambda d: (d + 1) % 2, lambda d: (d * d + 1) // d,
                                         lambda d: 12 // d, lambda d: d // (d + 1)])
def test_what_needs_a_dims_value_is_a_type_error(needs_value: Any) -> None:
    with pytest.raises(TypeError):
        needs_value(Dim.parse("s0"))


def test_products_of_symbols() -> None:
    """A batch times a length (the rows of a ``(b, s, 64)`` tensor flattened): a form of products, parsed,
    printed, evaluated, divided exactly by one term (a reshape's -1) and bound from lone symbols only."""
    b, s = Dim.parse("b"), Dim.parse("s")
    rows = b * s * 64
    assert str(rows) == "64*b*s" and Dim.parse("64 * s*b") == rows and Dim.parse(str(rows)) == rows
    assert rows.symbols == ("b", "s") and not rows.linear and b.linear and rows.symbol is None and b.symbol == "b"
    assert str((b + 1) * s) == "b*s + s" and str(s * s - 1) == "s*s - 1"
    assert rows.evaluate({"b": 3, "s": 5}) == 960 and concrete(("64*b*s", "s*s - 1"), {"b": 3, "s": 5}) == (960, 24)
    assert rows // (b * s * 16) == 4 and rows // 64 == b * s and rows // b == 64 * s and rows % (8 * b) == 0
    assert (rows + 64 * s) // (64 * s) == b + 1
    assert (Dim.parse("s + 1")).symbol is None and (2 * s).symbol is None
    with pytest.raises(ArgumentError, match="expected"):
        bind([("b", "s", "b*s")], [(2, 3, 5)])
    assert bind([("b", "s", "b*s")], [(2, 3, 6)]) == {"b": 2, "s": 3}
