"""pbsdk.testing: tolerances, assert_close, max_error and the numpy references (no MLIR)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from pbsdk.testing import reference as ref
from pbsdk.testing.tolerances import (
    DTYPES,
    OPS,
    SCALED_OPS,
    TABLE,
    Tolerance,
    assert_close,
    dtype_name,
    max_error,
    override,
    tolerance,
)

RNG_SEED = 1234


def rng(seed: int = RNG_SEED) -> np.random.Generator:
    return np.random.default_rng(seed)


# ---------------------------------------------------------------------------------------------- Tolerance

def test_tolerance_is_frozen_and_validated() -> None:
    t = Tolerance(1e-6, 1e-5)
    with pytest.raises(dataclasses_frozen_error()):
        t.atol = 1.0  # type: ignore[misc]
    with pytest.raises(ValueError):
        Tolerance(-1.0, 0.0)
    with pytest.raises(ValueError):
        Tolerance(0.0, float("nan"))


def dataclasses_frozen_error() -> type[Exception]:
    import dataclasses
    return dataclasses.FrozenInstanceError


def test_table_covers_every_op_and_dtype() -> None:
    for op in ("add", "sub", "mul", "div", "maximum", "minimum", "pow", "neg", "exp", "log", "tanh", "sigmoid",
               "relu", "gelu", "gelu_tanh", "erf", "sqrt", "rsqrt", "sum", "max", "min", "mean", "softmax",
               "layernorm", "matmul", "conv2d", "transpose", "reshape"):
        assert op in OPS
        for dt in DTYPES:
            assert isinstance(TABLE[(op, dt)], Tolerance)


def test_dtype_aliases() -> None:
    assert dtype_name("f32") == dtype_name("float32") == dtype_name(np.float32) == "float32"
    assert dtype_name(np.dtype("float16")) == dtype_name("f16") == "float16"
    assert dtype_name("bf16") == "bfloat16"
    assert dtype_name(np.zeros(2, np.float64)) == "float64"
    with pytest.raises(ValueError):
        dtype_name("int64")


def test_defaults_get_looser_with_narrower_dtypes() -> None:
    for op in OPS:
        f64, f32, f16, bf16 = (TABLE[(op, d)] for d in ("float64", "float32", "float16", "bfloat16"))
        assert f64.rtol <= f32.rtol <= f16.rtol <= bf16.rtol, op
        assert f64.atol <= f32.atol <= f16.atol <= bf16.atol, op
    assert 5e-4 <= tolerance("exp", "f16").rtol <= 5e-3
    assert 5e-3 <= tolerance("exp", "bf16").rtol <= 5e-2
    assert tolerance("matmul", "f16").rtol >= tolerance("add", "f16").rtol


def test_reduction_size_widens_only_scaled_ops() -> None:
    base = tolerance("matmul", "f32")
    wide = tolerance("matmul", "f32", reduction_size=400)
    assert wide.rtol == pytest.approx(base.rtol * 20) and wide.atol == pytest.approx(base.atol * 20)
    assert tolerance("sum", "f32", reduction_size=100).rtol == pytest.approx(TABLE[("sum", "float32")].rtol * 10)
    assert tolerance("exp", "f32", reduction_size=400) == tolerance("exp", "f32")
    assert "exp" not in SCALED_OPS and "conv2d" in SCALED_OPS
    with pytest.raises(ValueError):
        tolerance("sum", "f32", reduction_size=0)
    with pytest.raises(KeyError, match="no tolerance declared for op 'frobnicate'"):
        tolerance("frobnicate", "f32")


def test_override_stacks_and_restores() -> None:
    default = tolerance("matmul", "f32", reduction_size=64)
    tight = Tolerance(0.0, 0.0)
    loose = Tolerance(1.0, 1.0)
    with override("matmul", "float32", tight):
        assert tolerance("matmul", "f32", reduction_size=64) == tight   # used as given, not scaled
        assert tolerance("matmul", "f16") != tight                      # other dtypes untouched
        assert tolerance("add", "f32") != tight                         # other ops untouched
        with override("*", "f32", loose):
            assert tolerance("matmul", "f32") == loose
            assert tolerance("add", "f32") == loose
        assert tolerance("matmul", "f32") == tight
    assert tolerance("matmul", "f32", reduction_size=64) == default


def test_override_restores_after_an_exception() -> None:
    before = tolerance("add", "f32")
    with pytest.raises(RuntimeError), override("add", "f32", Tolerance(1.0, 1.0)):
        raise RuntimeError
    assert tolerance("add", "f32") == before


def test_override_applies_to_assert_close() -> None:
    e = np.ones(4, np.float32)
    a = e + np.float32(0.5)
    with pytest.raises(AssertionError):
        assert_close(a, e, op="add")
    with override("add", "f32", Tolerance(0.6, 0.0)):
        assert_close(a, e, op="add")


def test_override_rejects_non_tolerance() -> None:
    with pytest.raises(TypeError), override("add", "f32", (1.0, 1.0)):  # type: ignore[arg-type]
        pass


# ------------------------------------------------------------------------------------------ assert_close

def test_assert_close_passes_within_tolerance() -> None:
    e = rng().standard_normal((3, 5)).astype(np.float32)
    a = (e.astype(np.float64) * (1 + 1e-6)).astype(np.float32)
    assert_close(a, e, op="exp")
    assert_close(e, e, op="max")   # exact op, identical arrays


def test_assert_close_checks_shape_first() -> None:
    with pytest.raises(AssertionError, match=r"shape mismatch: actual \(3, 4\), expected \(4, 3\)"):
        assert_close(np.zeros((3, 4), np.float32), np.zeros((4, 3), np.float32), op="add")


def test_assert_close_checks_dtype() -> None:
    with pytest.raises(AssertionError, match="dtype mismatch: actual float64, expected float32"):
        assert_close(np.zeros(3), np.zeros(3, np.float32), op="add")
    with pytest.raises(AssertionError, match="dtype mismatch: actual float32, expected float16"):
        assert_close(np.zeros(3, np.float32), np.zeros(3, np.float32), op="add", dtype="f16")
    # dtype= names the dtype of actual; expected may be more precise.
    assert_close(np.zeros(3, np.float16), np.zeros(3, np.float64), op="add", dtype="f16")


def test_assert_close_rejects_non_arrays() -> None:
    with pytest.raises(AssertionError, match="not a numpy array"):
        assert_close([1.0, 2.0], np.zeros(2, np.float32), op="add")


def test_assert_close_nan_positions() -> None:
    e = np.array([1.0, np.nan, 3.0], np.float32)
    assert_close(e.copy(), e, op="log")
    with pytest.raises(AssertionError, match=r"NaN positions differ at 2 of 3 elements; first at index \(0,\)"):
        assert_close(np.array([np.nan, 2.0, 3.0], np.float32), e, op="log")


def test_assert_close_infinities() -> None:
    e = np.array([np.inf, -np.inf, 1.0], np.float32)
    assert_close(e.copy(), e, op="exp")
    with pytest.raises(AssertionError, match=r"worst index \(1,\)"):
        assert_close(np.array([np.inf, np.inf, 1.0], np.float32), e, op="exp")
    with pytest.raises(AssertionError):
        assert_close(np.array([3e38, -np.inf, 1.0], np.float32), e, op="exp")


def test_assert_close_failure_message() -> None:
    e = np.zeros((4, 6), np.float32)
    a = e.copy()
    a[2, 3] = 0.5
    a[1, 1] = 0.01
    with pytest.raises(AssertionError) as info:
        assert_close(a, e, op="matmul", reduction_size=16)
    msg = str(info.value)
    assert msg.startswith("matmul: 2 of 24 elements")
    assert "worst index (2, 3)" in msg
    assert "max abs error 0.5" in msg
    assert "max rel error inf" in msg
    tol = tolerance("matmul", "f32", reduction_size=16)
    assert f"atol={tol.atol:.3g}" in msg and f"rtol={tol.rtol:.3g}" in msg
    assert "reduction_size 16" in msg


def test_assert_close_worst_index_is_worst_relative_to_bound() -> None:
    # Index 0 has the larger absolute error but a large expected value; index 1 exceeds its bound more.
    e = np.array([1000.0, 0.0], np.float32)
    a = np.array([1000.5, 0.1], np.float32)
    with pytest.raises(AssertionError, match=r"worst index \(1,\)"):
        assert_close(a, e, op="add", tol=Tolerance(1e-3, 1e-3))


def test_assert_close_explicit_tol_wins() -> None:
    e = np.ones(3, np.float32)
    assert_close(e + np.float32(0.25), e, op="add", tol=Tolerance(0.3, 0.0))
    with pytest.raises(AssertionError, match="atol=0.2, rtol=0"):
        assert_close(e + np.float32(0.25), e, op="add", tol=Tolerance(0.2, 0.0))


def test_assert_close_rule_is_atol_plus_rtol_times_expected() -> None:
    tol = Tolerance(0.1, 0.01)
    e = np.array([0.0, 10.0, -10.0], np.float64)
    assert_close(np.array([0.1, 10.2, -10.2]), e, op="add", tol=tol)
    with pytest.raises(AssertionError, match="1 of 3"):
        assert_close(np.array([0.1, 10.25, -10.2]), e, op="add", tol=tol)


def test_assert_close_zero_d_and_empty() -> None:
    assert_close(np.float32(2.0), np.float32(2.0), op="sum")
    assert_close(np.array(2.0, np.float32), np.array(2.0, np.float32), op="sum")
    with pytest.raises(AssertionError, match=r"worst index \(\)"):
        assert_close(np.array(2.0, np.float32), np.array(3.0, np.float32), op="sum")
    assert_close(np.zeros((0, 3), np.float32), np.zeros((0, 3), np.float32), op="add")


def test_max_error() -> None:
    a = np.array([1.0, 2.5, 0.0, np.nan, np.inf])
    e = np.array([1.0, 2.0, 0.0, np.nan, np.inf])
    assert max_error(a, e) == (0.5, 0.25)
    assert max_error(np.array([1e-3]), np.array([0.0])) == (1e-3, math.inf)
    assert max_error(np.zeros(0), np.zeros(0)) == (0.0, 0.0)
    with pytest.raises(ValueError):
        max_error(np.zeros(2), np.zeros(3))


# -------------------------------------------------------------------------------------------- references

def test_reference_dtypes_follow_inputs() -> None:
    x16 = np.linspace(-2, 2, 7).astype(np.float16)
    assert ref.gelu(x16).dtype == np.float16
    assert ref.add(x16, 1.0).dtype == np.float16
    assert ref.add(x16, np.float64(2.0)).dtype == np.float16           # scalars take the array's dtype
    assert ref.add(x16, x16.astype(np.float32)).dtype == np.float32     # mixed arrays promote
    assert ref.softmax(x16, dtype=np.float64).dtype == np.float64


def test_reference_result_is_f64_rounded_once() -> None:
    x = np.float16(np.linspace(-3, 3, 101))
    exact = 0.5 * x.astype(np.float64) * (1 + np.vectorize(math.erf)(x.astype(np.float64) / math.sqrt(2)))
    np.testing.assert_array_equal(ref.gelu(x), exact.astype(np.float16))


def test_erf_gelu_sigmoid_rsqrt_values() -> None:
    x = np.array([-30.0, -3.0, -1.0, 0.0, 0.5, 1.0, 4.0, 30.0])
    np.testing.assert_allclose(ref.erf(x), [math.erf(v) for v in x], rtol=0, atol=0)
    np.testing.assert_allclose(ref.gelu(x), [v * 0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x], rtol=1e-15)
    c = math.sqrt(2 / math.pi)
    np.testing.assert_allclose(ref.gelu(x, approximate="tanh"),
                               [0.5 * v * (1 + math.tanh(c * (v + 0.044715 * v ** 3))) for v in x], rtol=1e-15)
    np.testing.assert_allclose(ref.gelu_tanh(x), ref.gelu(x, "tanh"))
    np.testing.assert_allclose(ref.sigmoid(x), [1 / (1 + math.exp(-v)) for v in x], rtol=1e-15, atol=1e-300)
    big = np.array([-1000.0, 1000.0], np.float32)
    with np.errstate(all="raise"):
        np.testing.assert_array_equal(ref.sigmoid(big), [0.0, 1.0])
    np.testing.assert_allclose(ref.rsqrt(np.array([4.0, 0.25])), [0.5, 2.0])
    with pytest.raises(ValueError):
        ref.gelu(x, approximate="fast")


def test_gelu_tanh_close_to_exact() -> None:
    x = np.linspace(-5, 5, 201)
    assert np.max(np.abs(ref.gelu(x) - ref.gelu_tanh(x))) < 1e-3


def test_softmax_rows_sum_to_one_and_is_stable() -> None:
    x = rng().standard_normal((3, 4, 5)).astype(np.float32) * 50 + 1000  # exp would overflow unshifted
    for axis in (0, 1, -1):
        s = ref.softmax(x, axis=axis)
        assert s.dtype == np.float32
        assert np.all(np.isfinite(s)) and np.all(s >= 0)
        np.testing.assert_allclose(s.astype(np.float64).sum(axis=axis), 1.0, rtol=1e-6)
    np.testing.assert_allclose(ref.softmax(np.array([0.0, math.log(3.0)])), [0.25, 0.75], rtol=1e-7)
    ls = ref.log_softmax(x.astype(np.float64), axis=1)
    np.testing.assert_allclose(np.exp(ls), ref.softmax(x.astype(np.float64), axis=1), rtol=1e-12)


def test_layernorm() -> None:
    x = rng().standard_normal((2, 3, 8)) * 3 + 5
    y = ref.layernorm(x)
    np.testing.assert_allclose(y.mean(axis=-1), 0, atol=1e-12)
    np.testing.assert_allclose(y.var(axis=-1), 1 / (1 + 1e-5 / x.var(axis=-1)), rtol=1e-10)
    w, b = np.arange(8.0), np.full(8, 0.5)
    np.testing.assert_allclose(ref.layernorm(x, w, b), y * w + b, rtol=1e-14)
    y2 = ref.layernorm(x, axis=(-2, -1), eps=0.0)
    flat = x.reshape(2, 24)
    expect = ((flat - flat.mean(1, keepdims=True)) / flat.std(1, keepdims=True)).reshape(x.shape)
    np.testing.assert_allclose(y2, expect, rtol=1e-12)
    np.testing.assert_allclose(ref.layernorm(x, axis=(1, 2), eps=0.0), y2)
    with pytest.raises(ValueError, match="trailing"):
        ref.layernorm(x, axis=0)


def test_matmul_reference() -> None:
    r = rng()
    a = r.standard_normal((2, 1, 4, 3)).astype(np.float32)
    b = r.standard_normal((5, 3, 6)).astype(np.float32)
    np.testing.assert_allclose(ref.matmul(a, b), np.matmul(a.astype(np.float64), b).astype(np.float32),
                               rtol=1e-6)
    at = np.swapaxes(a, -1, -2).copy()
    bt = np.swapaxes(b, -1, -2).copy()
    np.testing.assert_array_equal(ref.matmul(at, bt, transpose_a=True, transpose_b=True), ref.matmul(a, b))
    v = r.standard_normal(3)
    assert ref.matmul(v, b).shape == (5, 6)
    assert ref.matmul(a, v).shape == (2, 1, 4)
    assert ref.matmul(v, v).shape == ()


def conv2d_loops(x: np.ndarray, w: np.ndarray, stride: tuple[int, int], pads: tuple[tuple[int, int], ...],
                 dilation: tuple[int, int], groups: int) -> np.ndarray:
    """The definition, one output element at a time (NCHW, float64)."""
    n, _, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (pt, pb), (pl, pr) = pads
    oh = (h + pt + pb - dilation[0] * (kh - 1) - 1) // stride[0] + 1
    ow = (wd + pl + pr - dilation[1] * (kw - 1) - 1) // stride[1] + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for b, oc, y, xx in itertools.product(range(n), range(o), range(oh), range(ow)):
        g = oc // og
        acc = 0.0
        for ci, i, j in itertools.product(range(cg), range(kh), range(kw)):
            r = y * stride[0] + i * dilation[0] - pt
            s = xx * stride[1] + j * dilation[1] - pl
            if 0 <= r < h and 0 <= s < wd:
                acc += x[b, g * cg + ci, r, s] * w[oc, ci, i, j]
        out[b, oc, y, xx] = acc
    return out


CONV_CASES = [
    # (N, C, H, W, O, KH, KW, stride, padding, dilation, groups)
    (1, 1, 5, 5, 1, 3, 3, 1, 0, 1, 1),
    (2, 3, 7, 6, 4, 3, 2, 1, 1, 1, 1),
    (1, 2, 8, 9, 3, 3, 3, 2, 0, 1, 1),
    (1, 2, 9, 7, 2, 3, 3, (2, 1), ((1, 0), (0, 2)), 1, 1),
    (1, 3, 9, 9, 2, 3, 2, 1, 2, (2, 3), 1),
    (2, 4, 6, 5, 6, 3, 3, 1, (1, 0), 1, 2),
    (1, 4, 6, 6, 4, 3, 3, 2, 1, 1, 4),        # depthwise
    (1, 3, 5, 4, 6, 1, 1, 1, 0, 1, 3),        # grouped 1x1, 2 outputs per group
    (1, 5, 4, 4, 3, 1, 1, 3, 0, 1, 1),        # 1x1 with stride
]


@pytest.mark.parametrize("case", CONV_CASES)
def test_conv2d_reference_matches_loops(case: tuple) -> None:
    n, c, h, wd, o, kh, kw, stride, padding, dilation, groups = case
    r = rng(hash(case) % 2**32)
    x = r.standard_normal((n, c, h, wd))
    w = r.standard_normal((o, c // groups, kh, kw))
    expect = conv2d_loops(x, w, ref._pair(stride), ref._pads(padding), ref._pair(dilation), groups)
    got = ref.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    assert got.shape == expect.shape
    assert got.shape[2:] == ref.conv2d_output_shape(h, wd, kh, kw, stride=stride, padding=padding,
                                                    dilation=dilation)
    np.testing.assert_allclose(got, expect, rtol=1e-12, atol=1e-12)
    # NHWC: the same convolution with both tensors laid out channels-last.
    got_nhwc = ref.conv2d(x.transpose(0, 2, 3, 1), w.transpose(2, 3, 1, 0), stride=stride, padding=padding,
                          dilation=dilation, groups=groups, layout="NHWC")
    np.testing.assert_allclose(got_nhwc, expect.transpose(0, 2, 3, 1), rtol=1e-12, atol=1e-12)


def test_conv2d_reference_f32_and_errors() -> None:
    x = rng().standard_normal((1, 4, 5, 5)).astype(np.float32)
    w = rng(2).standard_normal((2, 2, 3, 3)).astype(np.float32)
    assert ref.conv2d(x, w, groups=2).dtype == np.float32
    with pytest.raises(ValueError):
        ref.conv2d(x, w, groups=1)
    with pytest.raises(ValueError):
        ref.conv2d(x, w, groups=2, layout="CHWN")
    with pytest.raises(ValueError):
        ref.conv2d(x, np.zeros((2, 2, 7, 7), np.float32), groups=2)


def test_elementwise_and_reduction_references() -> None:
    r = rng()
    a = r.standard_normal((3, 1, 5)).astype(np.float32)
    b = r.standard_normal((4, 1)).astype(np.float32)
    assert ref.add(a, b).shape == (3, 4, 5)
    np.testing.assert_array_equal(ref.maximum(a, b), np.maximum(a, b))
    np.testing.assert_allclose(ref.pow(np.abs(a), 1.5), np.abs(a) ** 1.5, rtol=1e-6)
    np.testing.assert_array_equal(ref.relu(a), np.maximum(a, 0))
    np.testing.assert_array_equal(ref.neg(a), -a)
    x = r.standard_normal((3, 4, 5)).astype(np.float32)
    assert ref.sum(x, axis=(0, 2), keepdims=True).shape == (1, 4, 1)
    assert ref.mean(x, axis=[0, 1]).shape == (5,)
    assert ref.max(x).shape == ()
    np.testing.assert_array_equal(ref.min(x, axis=1), x.min(axis=1))
    np.testing.assert_array_equal(ref.transpose(x, (2, 0, 1)), x.transpose(2, 0, 1))
    assert ref.reshape(x, (-1, 5)).shape == (12, 5)
