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


@pytest.mark.parametrize("needs_value", [lambda d: d > 1, lambda d: int(d), lambda d: range(d), lambda d: d * d,
                                         lambda d: (2 * d + 1) // 2, lambda d: (d + 1) % 2])
def test_what_needs_a_dims_value_is_a_type_error(needs_value: Any) -> None:
    with pytest.raises(TypeError):
        needs_value(Dim.parse("s0"))
