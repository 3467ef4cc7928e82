"""``pbsdk.jax.jit`` on whole models and single primitives, compared with ``jax.jit`` (XLA) at stated
tolerances; plus the frontend's contract: fallback to XLA logged per primitive, caching per signature,
outputs, pytrees, kernels that fail to compile."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")

import jax.numpy as jnp
from jax import lax

import pbsdk.jax
from pbsdk.core.errors import PbsdkError
from pbsdk.frontends.jax import examples
from pbsdk.testing import Tolerance, assert_close

#: Per model (f32): the error allowed against XLA. Contractions of length <= 512 and transcendental
#: approximations (erf, tanh, exp) each contribute a few ulp; these bounds leave ~10x room.
TOLERANCES = {
    "mlp": Tolerance(atol=2e-5, rtol=2e-5),
    "gpt2_block": Tolerance(atol=5e-5, rtol=5e-5),
    "resnet_block": Tolerance(atol=5e-5, rtol=5e-5),
    "small_cnn": Tolerance(atol=2e-5, rtol=2e-5),
}
#: Single primitives in f32: a few ulp of the result.
OP_TOL = Tolerance(atol=1e-5, rtol=1e-5)

#: The benchmark's models at test sizes: (params, apply, input shape).
MODELS: dict[str, tuple[Callable[[np.random.Generator], Any], Callable[..., Any], tuple[int, ...]]] = {
    "mlp": (lambda r: examples.mlp_init(r, 64, 128, 32), examples.mlp, (2, 64)),
    "gpt2_block": (lambda r: examples.gpt2_init(r, 64, 4), examples.gpt2_block, (2, 16, 64)),
    "resnet_block": (lambda r: examples.resnet_init(r, 8), examples.resnet_block, (2, 8, 8, 8)),
    "small_cnn": (examples.cnn_init, examples.small_cnn, (2, 16, 16, 3)),
}


@pytest.fixture(autouse=True)
def _fresh_reports() -> None:
    pbsdk.jax.clear_reports()


def _rand(*shape: int, seed: int = 0, positive: bool = False) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return np.abs(x) + 0.5 if positive else x


def _compare(fn: Callable[..., Any], *args: Any, tol: Tolerance = OP_TOL, **jit: Any) -> Any:
    """Run ``fn`` through pbsdk and XLA; assert the outputs (any pytree) agree and return pbsdk's."""
    actual = pbsdk.jax.jit(fn, **jit)(*args)
    expected = jax.jit(fn)(*args)
    flat_a, tree_a = jax.tree_util.tree_flatten(actual)
    flat_e, tree_e = jax.tree_util.tree_flatten(expected)
    assert tree_a == tree_e
    for a, e in zip(flat_a, flat_e):
        a, e = np.asarray(a), np.asarray(e)
        if e.dtype.kind == "f":
            assert_close(a, e, op=getattr(fn, "__name__", "fn"), tol=tol)
        else:
            assert a.dtype == e.dtype and np.array_equal(a, e)
    return actual


# ---------------------------------------------------------------------------------------------- models

@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_xla_with_no_fallback(name: str) -> None:
    init, apply, shape = MODELS[name]
    rng = np.random.default_rng(0)
    params = init(rng)
    x = rng.standard_normal(shape).astype(np.float32)
    _compare(apply, params, x, tol=TOLERANCES[name])
    (report,) = pbsdk.jax.reports()
    assert report.fallback_primitives == () and report.failed_kernels == 0
    assert report.kernels == 1 and report.xla_stages == 0 and report.compiled_ops == report.ops


# ---------------------------------------------------------------------------------------- primitives

def _custom_vjp_square_plus_one() -> Callable[[Any], Any]:
    @jax.custom_vjp
    def f(x: Any) -> Any:
        return x * x + 1.0
    f.defvjp(lambda x: (f(x), x), lambda x, g: (2 * x * g,))
    return f


_SQUARE_PLUS_ONE = _custom_vjp_square_plus_one()
_BIG_CONST = _rand(64, 32, seed=9)  # above the constant-folding limit: becomes a kernel input
_SMALL_CONST = _rand(32, seed=10)

x34, y34, p34 = _rand(3, 4), _rand(3, 4, seed=1), _rand(3, 4, seed=2, positive=True)

#: name -> (function, arguments). Every one must convert fully (no fallback) and match XLA.
PRIMITIVES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "add_sub_mul_div": (lambda a, b: (a + b) * (a - b) / (b * b + 1.0), (x34, y34)),
    "max_min_neg": (lambda a, b: jnp.maximum(a, b) - jnp.minimum(-a, b), (x34, y34)),
    "exp_log_tanh": (lambda a, p: jnp.exp(a) + jnp.log(p) + jnp.tanh(a), (x34, p34)),
    "logistic_erf": (lambda a: jax.nn.sigmoid(a) + lax.erf(a), (x34,)),
    "log1p_expm1_sin_cos_tan": (lambda a: (jnp.log1p(a * 1e-6), jnp.expm1(a * 1e-6), jnp.expm1(a), jnp.sin(a),
                                            jnp.cos(a), jnp.tan(a)), (x34,)),
    "rounding_sign_isfinite": (lambda a: (jnp.floor(a * 3), jnp.ceil(a * 3), jnp.round(a * 2), lax.round(a * 2),
                                          jnp.sign(a), jnp.isfinite(a / a.round())), (x34,)),
    "jax_nn_activations": (lambda a: [f(a * 4) for f in (
        jax.nn.elu, jax.nn.celu, jax.nn.selu, jax.nn.leaky_relu, jax.nn.relu6, jax.nn.hard_tanh, jax.nn.hard_sigmoid,
        jax.nn.hard_swish, jax.nn.softplus, jax.nn.soft_sign, jax.nn.log_sigmoid, jax.nn.mish, jax.nn.glu)], (x34,)),
    "sqrt_rsqrt_pow": (lambda p, a: jnp.sqrt(p) + lax.rsqrt(p) + jnp.power(p, a), (p34, x34)),
    "integer_pow": (lambda a: a ** 3 - a ** 2 + lax.integer_pow(a + 3.0, -2), (x34,)),
    "square_abs_clip": (lambda a: jnp.square(a) + jnp.abs(a) + jnp.clip(a, -0.5, 0.5), (x34,)),
    "erfc_gelu_exact": (lambda a: jax.nn.gelu(a * 4, approximate=False), (x34,)),
    "gelu_tanh_relu_silu": (lambda a: jax.nn.gelu(a) + jax.nn.relu(a) + jax.nn.silu(a), (x34,)),
    "softmax_log_softmax": (lambda a: jax.nn.softmax(a, axis=-1) + jax.nn.log_softmax(a, axis=0), (x34,)),
    "reduce_sum_max_min": (lambda a: (a.sum(axis=1), a.max(axis=0), a.min(), a.mean(axis=(0, 1))), (x34,)),
    "matmul_2d": (lambda a, b: a @ b, (_rand(5, 7), _rand(7, 3, seed=1))),
    "matmul_vector": (lambda a, v: a @ v, (_rand(5, 7), _rand(7, seed=1))),
    "matmul_batched": (lambda a, b: a @ b, (_rand(2, 3, 5, 7), _rand(2, 3, 7, 4, seed=1))),
    "dot_general_transposed": (lambda a, b: jnp.einsum("kij,klj->ilk", a, b), (_rand(3, 4, 5), _rand(3, 6, 5, seed=1))),
    "dot_general_contract_first": (lambda a, b: jnp.einsum("ij,ik->jk", a, b), (_rand(6, 4), _rand(6, 5, seed=1))),
    "conv_nchw": (lambda x, w: lax.conv_general_dilated(x, w, (1, 1), ((1, 1), (1, 1)),
                                                       dimension_numbers=("NCHW", "OIHW", "NCHW")),
                  (_rand(2, 3, 8, 8), _rand(4, 3, 3, 3, seed=1))),
    "conv_nhwc_stride_dilation": (lambda x, w: lax.conv_general_dilated(
        x, w, (2, 2), ((2, 1), (1, 2)), rhs_dilation=(2, 1), dimension_numbers=("NHWC", "HWIO", "NHWC")),
        (_rand(2, 9, 9, 3), _rand(3, 2, 3, 4, seed=1))),
    "conv_grouped_mixed_layout": (lambda x, w: lax.conv_general_dilated(
        x, w, (1, 1), "SAME", feature_group_count=2, dimension_numbers=("NHWC", "OIHW", "NCHW")),
        (_rand(1, 6, 6, 4), _rand(6, 2, 3, 3, seed=1))),
    "conv1d_3d": (lambda x1, w1, x3, w3: (
        lax.conv_general_dilated(x1, w1, (2,), ((1, 0),), rhs_dilation=(2,), dimension_numbers=("NCH", "OIH", "NCH")),
        lax.conv_general_dilated(x3, w3, (1, 2, 1), "SAME", dimension_numbers=("NDHWC", "DHWIO", "NDHWC"))),
        (_rand(2, 3, 9), _rand(4, 3, 3, seed=1), _rand(1, 4, 5, 4, 2), _rand(3, 2, 3, 2, 3, seed=2))),
    "conv_transpose": (lambda x, w, x1, w1: (
        lax.conv_transpose(x, w, (2, 2), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC")),
        lax.conv_general_dilated(x1, w1, (1,), ((0, -1),), lhs_dilation=(3,), dimension_numbers=("NCH", "OIH", "NCH"))),
        (_rand(1, 4, 5, 3), _rand(3, 3, 3, 2, seed=1), _rand(1, 2, 5), _rand(3, 2, 2, seed=2))),
    "argmax_argmin": (lambda a: (jnp.argmax(a, axis=1), jnp.argmin(a, axis=0), jnp.argmax(a)),
                      (np.array([[1.0, np.nan, 3.0, 3.0], [2.0, 5.0, 5.0, -1.0], [0.5, 0.5, -2.0, 7.0]], np.float32),)),
    "cumulative": (lambda a: (jnp.cumsum(a, axis=1), lax.cumsum(a, axis=0, reverse=True), jnp.cumprod(a, axis=1),
                              lax.cummax(a, axis=1), lax.cummin(a, axis=0, reverse=True), jnp.prod(a, axis=0)),
                   (_rand(5, 13),)),
    "integer_and_bitwise": (lambda i, j, a: (i // j, i % j, lax.rem(i, j), lax.div(i, j), i & j, i | j, i ^ j, ~i,
                                             jnp.fmod(a, 0.7), a // 0.3, (i > 0) ^ (j > 0)),
                            (np.array([[7, -7, 9, 0], [-3, 12, 5, -1]], np.int32),
                             np.array([[2, 2, -4, 3], [5, -5, 3, 7]], np.int32), x34 * 3)),
    "reduce_window_pooling": (lambda x: (
        lax.reduce_window(x, -jnp.inf, lax.max, (1, 3, 3, 1), (1, 2, 2, 1), ((0, 0), (1, 1), (0, 1), (0, 0))),
        lax.reduce_window(x, 0.0, lax.add, (1, 2, 2, 1), (1, 1, 2, 1), "VALID"),
        lax.reduce_window(x, jnp.inf, lax.min, (1, 2, 1, 2), (1, 2, 1, 2), "VALID", window_dilation=(1, 1, 2, 1))),
        (_rand(2, 7, 6, 4),)),
    "broadcast_reshape_transpose": (lambda a, b: (a[:, None, :] + b.reshape(4, 3)[None].transpose(2, 0, 1)),
                                    (x34, y34)),
    "squeeze_expand_dims": (lambda a: jnp.squeeze(jnp.expand_dims(a, 1) * 2, axis=1), (x34,)),
    "concatenate_slice": (lambda a, b: jnp.concatenate([a[:, 1:], b[::2, :3]], axis=0), (x34, y34)),
    "strided_slice": (lambda a: a[1:6:2, ::3], (_rand(7, 8),)),
    "split": (lambda a: [s * (i + 1) for i, s in enumerate(jnp.split(a, [1, 3], axis=1))], (x34,)),
    "pad": (lambda a: jnp.pad(a, ((1, 2), (0, 1)), constant_values=0.5), (x34,)),
    "where_comparisons": (lambda a, b: jnp.where((a > b) & (a >= 0) | (a == b), a, -b)
                          + jnp.where(a != b, 1.0, 0.0) + (a < b) + (a <= 0), (x34, y34)),
    "causal_mask_iota": (lambda s: jnp.where(jnp.tril(jnp.ones((5, 5), bool)), s, -jnp.inf), (_rand(2, 5, 5),)),
    "convert_element_type": (lambda a: (a.astype(jnp.float16).astype(jnp.float32) + (a > 0).astype(jnp.float32),
                                        jnp.arange(4) * 2 + 1, a > 0), (x34,)),
    "integers_through_kernels": (lambda a: a * (jnp.arange(4, dtype=jnp.int32) + 1).astype(jnp.float32), (x34,)),
    "nested_jit_and_remat": (lambda a: jax.jit(lambda z: jax.checkpoint(lambda u: u * 3)(z) + 1)(a),
                             (x34,)),
    "custom_vjp": (lambda a: _SQUARE_PLUS_ONE(a) * 2, (x34,)),
    "closed_over_constants": (lambda a: a @ _BIG_CONST + _SMALL_CONST, (_rand(3, 64),)),
    "layernorm": (lambda a: examples.layernorm(a, _rand(4, seed=3), _rand(4, seed=4)), (x34,)),
    "batchnorm": (lambda p, a: examples.batchnorm(p, "bn", a, axis=1),
                  (examples.batchnorm_init(np.random.default_rng(0), 4, "bn"), _rand(2, 4, 3, 3))),
    "embedding": (lambda t, i: t[i] * 2.0, (_rand(10, 4), np.array([[1, 9, -3], [0, 0, 4]], np.int32))),
    "take_axis1_fill": (lambda t, i: jnp.take(t, i, axis=1), (_rand(3, 5), np.array([4, 0, 7, -1], np.int32))),
    "take_clip_int": (lambda i: jnp.arange(6, dtype=jnp.int32).at[i].get(mode="clip") * 2,
                      (np.array([2, 8, -4], np.int32),)),
    "scalar_argument": (lambda a, s: a * s + s, (x34, 2.5)),
    "returns_an_input": (lambda a, b: (a, a + b), (x34, y34)),
}


@pytest.mark.parametrize("name", sorted(PRIMITIVES))
def test_primitive_converts_and_matches_xla(name: str) -> None:
    fn, args = PRIMITIVES[name]
    _compare(fn, *args)
    (report,) = pbsdk.jax.reports()
    assert report.fallback_primitives == (), report
    assert report.failed_kernels == 0


def test_pytrees_in_and_out() -> None:
    def fn(params: dict[str, Any], xs: tuple[Any, Any]) -> dict[str, Any]:
        a, b = xs
        return {"sum": a @ params["w"] + b, "parts": (a * 2, params["w"].T)}

    out = _compare(fn, {"w": _rand(4, 5, seed=1)}, (x34, _rand(5, seed=2)))
    assert set(out) == {"sum", "parts"} and isinstance(out["parts"], tuple)
    f = pbsdk.jax.jit(lambda a, *, scale: a * scale)
    assert_close(np.asarray(f(x34, scale=np.float32(3))), x34 * 3, op="mul")


def test_static_arguments_are_part_of_the_signature() -> None:
    def heads_sum(a: Any, heads: int) -> Any:
        return a.reshape(heads, -1).sum(axis=1) if heads > 1 else a.sum()  # Python control flow on heads

    f = pbsdk.jax.jit(heads_sum, static_argnums=1)
    for heads in (2, 3, 2):
        assert_close(np.asarray(f(_rand(12), heads)), _rand(12).reshape(heads, -1).sum(axis=1), op="sum")
    assert len(pbsdk.jax.reports()) == 2


def test_outputs_are_jax_arrays_or_numpy() -> None:
    assert isinstance(pbsdk.jax.jit(jnp.tanh)(x34), jax.Array)
    y = pbsdk.jax.jit(jnp.tanh, output="numpy")(x34)
    assert isinstance(y, np.ndarray)
    assert_close(y, np.tanh(x34), op="tanh")
    with pytest.raises(PbsdkError, match="output"):
        pbsdk.jax.jit(jnp.tanh, output="torch")


def test_bare_decorator_and_module_reexport() -> None:
    import pbsdk.frontends.jax as frontend

    assert pbsdk.jax.jit is frontend.jit

    @pbsdk.jax.jit
    def double(a: Any) -> Any:
        return a * 2

    assert_close(np.asarray(double(x34)), x34 * 2, op="mul")
    assert double.__name__ == "double"


# --------------------------------------------------------------------------------------------- fallback

def test_unsupported_primitives_fall_back_to_xla_with_one_log_line_each(caplog: pytest.LogCaptureFixture) -> None:
    w = _rand(4, 6, seed=1)

    def fn(a: Any) -> Any:
        h = jnp.tanh(a @ w)
        h = lax.cumlogsumexp(h, axis=1)  # no converter: XLA
        s = jnp.sort(h * 2.0, axis=0)    # no converter: XLA
        return jax.nn.relu(s) + jnp.exp(-h)

    with caplog.at_level(logging.INFO, logger="pbsdk"):
        _compare(fn, _rand(5, 4))
    lines = [r.getMessage() for r in caplog.records if r.name == "pbsdk.jax" and "falls back" in r.getMessage()]
    assert "pbsdk: jax primitive cumlogsumexp falls back to XLA: no converter" in lines
    assert "pbsdk: jax primitive sort falls back to XLA: no converter" in lines
    assert len(lines) == 2, lines
    (report,) = pbsdk.jax.reports()
    assert sorted(report.fallback_primitives) == ["cumlogsumexp", "sort"]
    assert report.kernels >= 2 and report.xla_stages >= 1 and report.failed_kernels == 0
    assert 0 < report.compiled_ops < report.ops


def test_scheduling_keeps_independent_work_in_one_kernel() -> None:
    def fn(a: Any, b: Any) -> Any:
        c = jnp.sort(a, axis=0)          # XLA
        d = jnp.exp(b) * 2.0 + 1.0       # independent of the sort: joins the kernel after it
        return jnp.tanh(c) + d

    _compare(fn, x34, y34)
    (report,) = pbsdk.jax.reports()
    assert report.kernels == 1 and report.xla_stages == 1


def test_unused_equations_are_not_run() -> None:
    def fn(a: Any) -> Any:
        jnp.sort(jnp.exp(a), axis=0)  # unused: neither compiled nor run
        return jnp.tanh(a) * 2.0

    _compare(fn, x34)
    (report,) = pbsdk.jax.reports()
    assert report.kernels == 1 and report.xla_stages == 0 and report.failed_kernels == 0


def test_unsupported_dtype_falls_back() -> None:
    def fn(a: Any) -> Any:
        return (a.astype(jnp.float8_e4m3fn).astype(jnp.float32) * 3) + 1.0

    _compare(fn, x34, tol=Tolerance(atol=2e-2, rtol=1e-2))
    (report,) = pbsdk.jax.reports()
    assert "convert_element_type" in report.fallback_primitives


def test_float_to_int_conversion_falls_back() -> None:
    table = jnp.asarray(_rand(10, 3, seed=4))

    def fn(a: Any) -> Any:
        idx = jnp.clip((jnp.abs(a[:, 0]) * 3).astype(jnp.int32), 0, 9)  # truncation: XLA
        return table[idx] * 2.0

    _compare(fn, x34)
    (report,) = pbsdk.jax.reports()
    assert report.fallback_primitives == ("convert_element_type",)


def test_kernel_that_fails_to_compile_runs_in_xla(monkeypatch: pytest.MonkeyPatch,
                                                  caplog: pytest.LogCaptureFixture) -> None:
    from pbsdk.frontends.jax import function as jit_module

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise PbsdkError("simulated compiler failure")

    monkeypatch.setattr(jit_module, "compile_text", broken)
    with caplog.at_level(logging.WARNING, logger="pbsdk"):
        _compare(lambda a: jnp.exp(a) * 2.0, x34)
    (report,) = pbsdk.jax.reports()
    assert report.failed_kernels == 1 and report.kernels == 0 and report.xla_stages == 1
    assert any("did not compile" in r.getMessage() for r in caplog.records)


# ---------------------------------------------------------------------------------------------- caching

def test_compiles_once_per_signature() -> None:
    calls = []

    def fn(a: Any) -> Any:
        calls.append(1)  # runs while tracing only
        return jnp.tanh(a) * 2.0

    f = pbsdk.jax.jit(fn)
    f(x34)
    f(y34)  # same shape and dtype: cached
    assert len(pbsdk.jax.reports()) == 1 and len(calls) == 1
    assert_close(np.asarray(f(_rand(2, 4))), np.tanh(_rand(2, 4)) * 2, op="tanh")  # new shape: compiles
    f(x34.astype(np.float64))  # new dtype (x64 off: jax makes it f32, but the signature is new)
    assert len(pbsdk.jax.reports()) == 3 and len(calls) == 3
    assert len(f.signatures) == 3
    assert pbsdk.jax.reports()[1].signature == ("float32[2,4]",)


def test_signatures_beyond_the_limit_run_in_xla(caplog: pytest.LogCaptureFixture) -> None:
    f = pbsdk.jax.jit(lambda a: a + 1.0, max_signatures=1)
    with caplog.at_level(logging.WARNING, logger="pbsdk"):
        for n in (2, 3, 4):
            assert_close(np.asarray(f(_rand(n, 3))), _rand(n, 3) + 1, op="add")
    assert len(pbsdk.jax.reports()) == 1
    assert sum("max_signatures" in r.getMessage() for r in caplog.records) == 1


def test_under_jax_transformations_the_function_is_plain_jax() -> None:
    f = pbsdk.jax.jit(lambda a: jnp.sum(jnp.tanh(a) ** 2))
    grad = jax.grad(f)(x34)
    assert_close(np.asarray(grad), np.asarray(jax.grad(lambda a: jnp.sum(jnp.tanh(a) ** 2))(x34)), op="tanh")
    assert_close(np.asarray(jax.jit(f)(x34)), np.sum(np.tanh(x34) ** 2), op="sum", tol=OP_TOL)
    assert not pbsdk.jax.reports()  # nothing compiled by pbsdk


def test_gradients_compile_without_fallback() -> None:
    params = examples.mlp_init(np.random.default_rng(5), 16, 32, 8)

    def loss(p: Any, a: Any) -> Any:
        return jnp.mean(examples.mlp(p, a) ** 2)

    _compare(jax.grad(loss), params, _rand(4, 16), tol=Tolerance(atol=1e-6, rtol=1e-5))
    (report,) = pbsdk.jax.reports()
    assert report.fallback_primitives == () and report.kernels == 1


@pytest.mark.parametrize("shape", [(2, 8, 16), (1, 2, 8, 16)], ids=["batched", "unit-batch"])
def test_causal_attention_is_fused(shape: tuple[int, ...]) -> None:
    """The jaxpr's softmax (max(-inf, ...), stop_gradient), where(mask, s, -inf) with a broadcast -inf and
    jnp.matmul's squeezing of unit batch dims reach the core as the pattern its attention recogniser fuses."""
    def attention(q: Any, k: Any, v: Any) -> Any:
        s = q @ k.swapaxes(-1, -2) / math.sqrt(q.shape[-1])
        s = jnp.where(jnp.tril(jnp.ones((8, 8), bool)), s, -jnp.inf)
        return jax.nn.softmax(s, axis=-1) @ v

    q, k, v = (_rand(*shape, seed=i) for i in range(3))
    f = pbsdk.jax.jit(attention)
    assert_close(np.asarray(f(q, k, v)), np.asarray(jax.jit(attention)(q, k, v)), op="attention", tol=OP_TOL)
    assert "attention #0" in f.explain(q, k, v) and "not fused" not in f.explain(q, k, v)
