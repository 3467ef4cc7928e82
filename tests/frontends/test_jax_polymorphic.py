"""``pbsdk.jax.jit(fn, polymorphic_shapes=...)``: JAX's shape polymorphism compiled once (issue #31 item 2).

A function traced once with JAX's symbolic dimensions runs one kernel set at every size, compared with
``jax.jit`` (XLA) at stated tolerances; one compile is counted by the compile reports (one per traced
signature) and the function's signatures. Also: mismatched symbol values, equations that cannot take a
symbolic size (XLA), functions that need a size's value and targets without dynamic shapes (per shape), and
the unchanged behaviour without ``polymorphic_shapes``."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp
from jax import export

import pbsdk.jax
from pbsdk.core.dims import Dim
from pbsdk.core.errors import ArgumentError, PbsdkError, UnsupportedError
from pbsdk.frontends.jax.convert import as_dim
from pbsdk.frontends.jax.polymorphic import declared_shapes
from pbsdk.testing import Tolerance, assert_close

#: f32 against XLA: contractions of length <= 96 and transcendental approximations (erf/tanh, exp, rsqrt)
#: each contribute a few ulp; these leave ~10x room.
MLP_TOL = Tolerance(atol=2e-5, rtol=2e-5)
ROW_TOL = Tolerance(atol=1e-5, rtol=1e-5)
ATTN_TOL = Tolerance(atol=5e-5, rtol=5e-5)

#: The row counts / key lengths each function is called at: 1, odd sizes, a size above one register tile
#: and one in the next size bucket.
SIZES = (1, 7, 33, 130)


@pytest.fixture(autouse=True)
def _fresh_reports() -> None:
    pbsdk.jax.clear_reports()


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check(f: Any, fn: Callable[..., Any], args: tuple[Any, ...], tol: Tolerance) -> None:
    expected = jax.jit(fn)(*args)
    assert_close(np.asarray(f(*args)), np.asarray(expected), op=getattr(fn, "__name__", "fn"), tol=tol)


def _compiled_once(f: Any, symbols: tuple[str, ...]) -> None:
    """One trace and compile (one report, one signature) with ``symbols`` symbolic, every equation in pbsdk."""
    (report,) = pbsdk.jax.reports()
    assert report.symbols == symbols and len(f.signatures) == 1
    assert report.fallback_primitives == () and report.failed_kernels == 0
    assert report.compiled_ops == report.ops and report.kernels >= 1


# ------------------------------------------------------------------------------- sizes (unit, no MLIR)

def test_jax_sizes_become_linear_forms() -> None:
    b, s = export.symbolic_shape("b, s")
    assert as_dim(7) == 7 and as_dim(np.int64(3)) == 3
    assert as_dim(b) == Dim.parse("b") and as_dim(2 * b + 1) == Dim.parse("2*b + 1")
    assert as_dim(b - s + 3) == Dim.parse("b - s + 3") and as_dim(1 - b) == Dim.parse("1 - b")
    assert as_dim(b - b + 4) == 4
    assert as_dim(b * s) == Dim.parse("b*s") and as_dim(3 * b * s + s) == Dim.parse("3*b*s + s")
    for other in (b // 2, b % 3):
        with pytest.raises(UnsupportedError, match="not a sum of products"):
            as_dim(other)


def test_declared_shapes_need_each_variable_as_a_whole_dimension() -> None:
    b, s = export.symbolic_shape("b, s")
    specs = [jax.ShapeDtypeStruct((b, 8), np.float32), jax.ShapeDtypeStruct((b + 1, s), np.float32)]
    assert declared_shapes(specs) == [("b", 8), ("b + 1", "s")]
    with pytest.raises(UnsupportedError, match="b are no argument's whole dimension"):
        declared_shapes([jax.ShapeDtypeStruct((2 * b, 8), np.float32)])


# ------------------------------------------------------------------------------------------ numerics

def test_one_dot_over_a_polymorphic_batch() -> None:
    w = _rand(64, 32, seed=1)

    def dot(x: Any, w: Any) -> Any:
        return x @ w

    f = pbsdk.jax.jit(dot, polymorphic_shapes=["(b, 64)", None])
    for n in SIZES:
        _check(f, dot, (_rand(n, 64, seed=n), w), MLP_TOL)
    _compiled_once(f, ("b",))
    (report,) = pbsdk.jax.reports()
    assert report.signature == ("float32[b,64]", "float32[64,32]")


def mlp(x: Any, w: Any, bias: Any) -> Any:
    return jax.nn.gelu(x @ w + bias)


def layernorm(x: Any, g: Any, b: Any) -> Any:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + 1e-5) * g + b


def softmax(x: Any) -> Any:
    return jax.nn.softmax(x, axis=-1)


#: (function, polymorphic_shapes, arguments at size n, tolerance): the row count is ``b`` (the softmax's
#: row length too: two variables).
ROW_CASES: dict[str, tuple[Callable[..., Any], list[Any], Callable[[int], tuple[Any, ...]], Tolerance]] = {
    "mlp": (mlp, ["(b, 64)", None, None], lambda n: (_rand(n, 64, seed=n), _rand(64, 96, seed=1) * 0.2,
                                                     _rand(96, seed=2)), MLP_TOL),
    "layernorm": (layernorm, ["(b, 96)", None, None], lambda n: (_rand(n, 96, seed=n) * 3 + 1, _rand(96, seed=1),
                                                                 _rand(96, seed=2)), ROW_TOL),
    "softmax": (softmax, ["(b, s)"], lambda n: (_rand(n, n + 2, seed=n) * 4,), ROW_TOL),
}


@pytest.mark.parametrize("name", sorted(ROW_CASES))
def test_row_functions_compile_once_and_match_xla_at_every_size(name: str) -> None:
    fn, spec, make, tol = ROW_CASES[name]
    f = pbsdk.jax.jit(fn, polymorphic_shapes=spec)
    for n in SIZES:
        _check(f, fn, make(n), tol)
    _compiled_once(f, ("b", "s") if name == "softmax" else ("b",))


def test_attention_over_a_polymorphic_key_length() -> None:
    def attention(q: Any, k: Any, v: Any) -> Any:
        return jax.nn.softmax(q @ k.T / 8.0, axis=-1) @ v

    f = pbsdk.jax.jit(attention, polymorphic_shapes=[None, "(s, 64)", "(s, 64)"])
    q = _rand(4, 64)
    for n in SIZES:
        _check(f, attention, (q, _rand(n, 64, seed=n), _rand(n, 64, seed=n + 1)), ATTN_TOL)
    _compiled_once(f, ("s",))


def test_sizes_used_as_values() -> None:
    """A mean over the polymorphic axis divides by ``b`` (``dim_as_value``); ``arange(b)`` is an iota of a
    symbolic length: both computed in the kernel from the input's size."""
    def fn(x: Any) -> Any:
        return x.mean(0) + jnp.arange(x.shape[0]).sum() + x * jnp.arange(x.shape[0])[:, None]

    f = pbsdk.jax.jit(fn, polymorphic_shapes=["(b, 8)"])
    for n in SIZES:
        _check(f, fn, (_rand(n, 8, seed=n),), ROW_TOL)
    _compiled_once(f, ("b",))


# ------------------------------------------------------------------------------------------ contract

def test_a_symbol_met_twice_must_agree() -> None:
    f = pbsdk.jax.jit(lambda x, y: x * y + 1.0, polymorphic_shapes=["(b, 4)", "(b, 4)"])
    assert_close(np.asarray(f(_rand(3, 4), _rand(3, 4, seed=1))), _rand(3, 4) * _rand(3, 4, seed=1) + 1.0, op="mul")
    with pytest.raises(ArgumentError, match=r"argument 1 has shape \(5, 4\), but b is 3 in an earlier argument"):
        f(_rand(3, 4), _rand(5, 4))
    with pytest.raises(ArgumentError, match="different size 4 for known dimension"):  # JAX's check of the spec
        f(_rand(3, 4), _rand(3, 5))
    with pytest.raises(ArgumentError, match="b = 0; dynamic sizes are at least 1"):
        f(np.zeros((0, 4), np.float32), np.zeros((0, 4), np.float32))
    assert len(pbsdk.jax.reports()) == 1


def test_malformed_specs_are_argument_errors() -> None:
    x = _rand(3, 4)
    with pytest.raises(ArgumentError, match=r"polymorphic_shapes \('\(b, 4',\): "):  # JAX's parse error follows
        pbsdk.jax.jit(jnp.tanh, polymorphic_shapes=["(b, 4"])(x)
    with pytest.raises(ArgumentError, match="2 entries for 1 positional arguments"):
        pbsdk.jax.jit(jnp.tanh, polymorphic_shapes=["(b, 4)", None])(x)
    with pytest.raises(PbsdkError, match="polymorphic_shapes must be"):
        pbsdk.jax.jit(jnp.tanh, polymorphic_shapes=3)


def test_placeholders_take_the_first_calls_sizes() -> None:
    """``_`` is the call's own size: another value there is another signature, compiled once more."""
    f = pbsdk.jax.jit(lambda x: jnp.tanh(x) * 2.0, polymorphic_shapes="(b, _)")
    for shape in ((1, 4), (6, 4), (3, 5), (9, 5)):
        x = _rand(*shape)
        assert_close(np.asarray(f(x)), np.tanh(x) * 2.0, op="tanh", tol=ROW_TOL)
    assert [r.signature for r in pbsdk.jax.reports()] == [("float32[b,4]",), ("float32[b,5]",)]


def test_without_polymorphic_shapes_each_shape_compiles() -> None:
    f = pbsdk.jax.jit(mlp)
    args = ROW_CASES["mlp"][2]
    for n in (2, 3, 2):
        _check(f, mlp, args(n), MLP_TOL)
    reports = pbsdk.jax.reports()
    assert [r.signature[0] for r in reports] == ["float32[2,64]", "float32[3,64]"]
    assert all(r.symbols == () for r in reports) and len(f.signatures) == 2
    assert "dimension variables" not in f.explain(*args(2))


def test_equations_that_need_a_value_run_in_xla(caplog: pytest.LogCaptureFixture) -> None:
    """``sort`` has no converter and an f32 ``iota`` of a symbolic length is refused (exact only below 2**24):
    their segments run in XLA, exported with symbolic sizes and compiled by XLA per concrete shape; the iota's
    segment has no input of length ``b`` and takes one. A reshape to ``b*s`` rows (a product of the variables)
    compiles with the rest."""
    def fn(x: Any) -> Any:
        y = jnp.sort(jnp.tanh(x) * 2.0, axis=0) + jnp.arange(x.shape[0], dtype=jnp.float32)[:, None]
        return y @ jnp.ones((4, 3), jnp.float32)

    def merged(x: Any) -> Any:
        return jnp.exp(x.reshape(-1, 4)) * 2.0

    f = pbsdk.jax.jit(fn, polymorphic_shapes=["(b, 4)"])
    g = pbsdk.jax.jit(merged, polymorphic_shapes=["(b, s, 4)"])
    with caplog.at_level(logging.INFO, logger="pbsdk"):
        for n in SIZES:
            _check(f, fn, (_rand(n, 4, seed=n),), ROW_TOL)
            _check(g, merged, (_rand(n, 3, 4, seed=n),), ROW_TOL)
    first, second = pbsdk.jax.reports()
    assert first.symbols == ("b",) and sorted(first.fallback_primitives) == ["iota", "sort"]
    assert first.kernels >= 1 and first.xla_stages >= 1 and first.failed_kernels == 0
    assert second.symbols == ("b", "s") and second.fallback_primitives == () and second.xla_stages == 0
    logged = [r.getMessage() for r in caplog.records if r.name == "pbsdk.jax"]
    assert "pbsdk: jax primitive sort falls back to XLA: no converter" in logged


def test_a_function_that_needs_a_sizes_value_compiles_per_shape(caplog: pytest.LogCaptureFixture) -> None:
    def branch(x: Any, y: Any) -> Any:
        return x * y if x.shape[0] > 3 else x + y  # Python control flow on the size

    f = pbsdk.jax.jit(branch, polymorphic_shapes=["(b, 4)", "(b, 4)"])
    with caplog.at_level(logging.WARNING, logger="pbsdk"):
        for n in (2, 5, 5):
            x, y = _rand(n, 4), _rand(n, 4, seed=1)
            assert_close(np.asarray(f(x, y)), x * y if n > 3 else x + y, op="mul")
    assert [r.symbols for r in pbsdk.jax.reports()] == [(), ()]
    (line,) = [r.getMessage() for r in caplog.records if r.name == "pbsdk.jax"]
    assert "tracing with symbolic sizes failed: InconclusiveDimensionOperation" in line
    assert "compiled per concrete shape" in line
    with pytest.raises(ArgumentError, match="but b is 2"):  # the binding is still checked
        f(_rand(2, 4), _rand(3, 4))


def test_a_target_without_dynamic_shapes_compiles_per_shape(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="pbsdk"):
        f = pbsdk.jax.jit(lambda x: jnp.tanh(x) * 2.0, target="template", polymorphic_shapes=["(b, 4)"])
        for n in (1, 3, 3):
            x = _rand(n, 4)
            assert_close(np.asarray(f(x)), np.tanh(x) * 2.0, op="tanh", tol=ROW_TOL)
    assert [r.signature for r in pbsdk.jax.reports()] == [("float32[1,4]",), ("float32[3,4]",)]
    assert any("target template has no dynamic shapes" in r.getMessage() for r in caplog.records)
    assert "compiled per concrete shape" in f.explain(_rand(3, 4)).splitlines()[0]


def test_explain_shows_the_symbolic_dims_and_size_buckets() -> None:
    fn, spec, make, _ = ROW_CASES["mlp"]
    f = pbsdk.jax.jit(fn, polymorphic_shapes=spec)
    text = f.explain(*make(5))
    first, rest = text.split("\n", 1)
    assert first == ("signature (float32[b,64], float32[64,96], float32[96]): dimension variables b symbolic, "
                     "one kernel set for every value (this call: b = 5)")
    assert "matmul bx96xf32: 1x ?x96x64, known at call time: rows m = b:" in rest
    assert "rows 1 (planned at 1)" in rest  # the first size bucket, a GEMV kernel
    static = pbsdk.jax.jit(fn).explain(*make(5))
    assert "1x 5x96x64 f32" in static and "known at call time" not in static
