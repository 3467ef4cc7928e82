"""numpy references of every `pbsdk.ops` op, computed in float64 and cast to the result dtype.

The result dtype is the floating dtype of the array inputs (the widest of them; Python and numpy scalars
take the arrays' dtype, as in `pbsdk.ops`), so ``reference.gelu(x_f16)`` is float16, rounded once from
the float64 value. Pass ``dtype=`` to choose another. Written for clarity and exactness on small shapes,
not for speed.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Sequence
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "abs",
    "add",
    "attention",
    "conv2d",
    "conv2d_output_shape",
    "dequantize",
    "div",
    "erf",
    "exp",
    "gelu",
    "gelu_tanh",
    "layernorm",
    "log",
    "log_softmax",
    "matmul",
    "max",
    "maximum",
    "mean",
    "min",
    "minimum",
    "mul",
    "neg",
    "pow",
    "quantize",
    "quantized_linear",
    "quantized_matmul",
    "relu",
    "reshape",
    "rsqrt",
    "sigmoid",
    "softmax",
    "sqrt",
    "sub",
    "sum",
    "tanh",
    "transpose",
]

_ORDER = ("bfloat16", "float16", "float32", "float64")
_BF16 = np.dtype(ml_dtypes.bfloat16)


def _is_float(d: np.dtype) -> bool:
    """numpy's floats and ml_dtypes' bfloat16 (which numpy files under kind "V")."""
    return d.kind == "f" or d == _BF16


def _result_dtype(*xs: Any, dtype: Any = None) -> np.dtype:
    if dtype is not None:
        return np.dtype(dtype)
    arrays = [x for x in xs if isinstance(x, np.ndarray) and _is_float(x.dtype)]
    if not arrays:
        return np.dtype(np.float32)
    names = {a.dtype.name for a in arrays}
    if {"bfloat16", "float16"} <= names:  # as pbsdk.ops: neither holds the other, so float32
        names.add("float32")
    known = [n for n in _ORDER if n in names]
    return np.dtype(known[-1]) if known else arrays[0].dtype


def _f64(x: Any) -> np.ndarray:
    return np.asarray(x, dtype=np.float64)


def _done(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    with np.errstate(over="ignore"):
        return np.asarray(y).astype(dtype)


# ---------------------------------------------------------------------------------------------- elementwise

def _binary(f: Any, a: Any, b: Any, dtype: Any) -> np.ndarray:
    out = _result_dtype(a, b, dtype=dtype)
    with np.errstate(all="ignore"):
        return _done(f(_f64(a), _f64(b)), out)


def _unary(f: Any, x: Any, dtype: Any) -> np.ndarray:
    out = _result_dtype(x, dtype=dtype)
    with np.errstate(all="ignore"):
        return _done(f(_f64(x)), out)


def add(a: Any, b: Any, *, dtype: Any = None) -> np.ndarray: return _binary(np.add, a, b, dtype)
def sub(a: Any, b: Any, *, dtype: Any = None) -> np.ndarray: return _binary(np.subtract, a, b, dtype)
def mul(a: Any, b: Any, *, dtype: Any = None) -> np.ndarray: return _binary(np.multiply, a, b, dtype)
def div(a: Any, b: Any, *, dtype: Any = None) -> np.ndarray: return _binary(np.divide, a, b, dtype)
def maximum(a: Any, b: Any, *, dtype: Any = None) -> np.ndarray: return _binary(np.maximum, a, b, dtype)
def minimum(a: Any, b: Any, *, dtype: Any = None) -> np.ndarray: return _binary(np.minimum, a, b, dtype)
def pow(a: Any, b: Any, *, dtype: Any = None) -> np.ndarray: return _binary(np.power, a, b, dtype)
def neg(x: Any, *, dtype: Any = None) -> np.ndarray: return _unary(np.negative, x, dtype)
def exp(x: Any, *, dtype: Any = None) -> np.ndarray: return _unary(np.exp, x, dtype)
def log(x: Any, *, dtype: Any = None) -> np.ndarray: return _unary(np.log, x, dtype)
def tanh(x: Any, *, dtype: Any = None) -> np.ndarray: return _unary(np.tanh, x, dtype)
def sqrt(x: Any, *, dtype: Any = None) -> np.ndarray: return _unary(np.sqrt, x, dtype)
def abs(x: Any, *, dtype: Any = None) -> np.ndarray: return _unary(np.abs, x, dtype)
def relu(x: Any, *, dtype: Any = None) -> np.ndarray: return _unary(lambda v: np.maximum(v, 0.0), x, dtype)
def rsqrt(x: Any, *, dtype: Any = None) -> np.ndarray: return _unary(lambda v: 1.0 / np.sqrt(v), x, dtype)


_erf64 = np.vectorize(math.erf, otypes=[np.float64])


def _erf(v: np.ndarray) -> np.ndarray:
    return _erf64(v) if v.size else np.zeros_like(v)


def _sigmoid(v: np.ndarray) -> np.ndarray:
    # 1 / (1 + exp(-v)) without overflow: exp of a non-positive number only.
    e = np.exp(-np.abs(v))
    return np.where(v >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def erf(x: Any, *, dtype: Any = None) -> np.ndarray:
    """The error function, exact to float64 (``math.erf`` elementwise)."""
    return _unary(_erf, x, dtype)


def sigmoid(x: Any, *, dtype: Any = None) -> np.ndarray:
    return _unary(_sigmoid, x, dtype)


def gelu(x: Any, approximate: str = "none", *, dtype: Any = None) -> np.ndarray:
    """``x * Phi(x) = x/2 * (1 + erf(x / sqrt 2))``, or with ``approximate="tanh"``
    ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``."""
    if approximate == "tanh":
        return gelu_tanh(x, dtype=dtype)
    if approximate != "none":
        raise ValueError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary(lambda v: 0.5 * v * (1.0 + _erf(v / math.sqrt(2.0))), x, dtype)


def gelu_tanh(x: Any, *, dtype: Any = None) -> np.ndarray:
    c = math.sqrt(2.0 / math.pi)
    return _unary(lambda v: 0.5 * v * (1.0 + np.tanh(c * (v + 0.044715 * v ** 3))), x, dtype)


# ---------------------------------------------------------------------------------------------- reductions

def _axes(axis: Any) -> Any:
    return tuple(axis) if isinstance(axis, (list, tuple)) else axis


def sum(x: Any, axis: Any = None, keepdims: bool = False, *, dtype: Any = None) -> np.ndarray:
    return _unary(lambda v: np.sum(v, axis=_axes(axis), keepdims=keepdims), x, dtype)


def max(x: Any, axis: Any = None, keepdims: bool = False, *, dtype: Any = None) -> np.ndarray:
    return _unary(lambda v: np.max(v, axis=_axes(axis), keepdims=keepdims), x, dtype)


def min(x: Any, axis: Any = None, keepdims: bool = False, *, dtype: Any = None) -> np.ndarray:
    return _unary(lambda v: np.min(v, axis=_axes(axis), keepdims=keepdims), x, dtype)


def mean(x: Any, axis: Any = None, keepdims: bool = False, *, dtype: Any = None) -> np.ndarray:
    return _unary(lambda v: np.mean(v, axis=_axes(axis), keepdims=keepdims), x, dtype)


def _softmax64(v: np.ndarray, axis: int) -> np.ndarray:
    shifted = v - np.max(v, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def softmax(x: Any, axis: int = -1, *, dtype: Any = None) -> np.ndarray:
    """Numerically stable softmax along ``axis`` (max subtracted before exp)."""
    return _unary(lambda v: _softmax64(v, axis), x, dtype)


def log_softmax(x: Any, axis: int = -1, *, dtype: Any = None) -> np.ndarray:
    def f(v: np.ndarray) -> np.ndarray:
        shifted = v - np.max(v, axis=axis, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return _unary(f, x, dtype)


def layernorm(x: Any, weight: Any = None, bias: Any = None, *, axis: Any = -1, eps: float = 1e-5,
              dtype: Any = None) -> np.ndarray:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the trailing ``axis`` (int or tuple); the
    variance is the biased one (divided by the count), as in torch.nn.LayerNorm."""
    out = _result_dtype(x, dtype=dtype)
    v = _f64(x)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    axes = tuple(sorted(int(a) % v.ndim for a in axes))
    if axes != tuple(range(v.ndim - len(axes), v.ndim)):
        raise ValueError(f"layernorm: axis {axis} must name trailing dimensions of a rank-{v.ndim} array")
    mu = np.mean(v, axis=axes, keepdims=True)
    var = np.mean((v - mu) ** 2, axis=axes, keepdims=True)
    y = (v - mu) / np.sqrt(var + eps)
    if weight is not None:
        y = y * _f64(weight)
    if bias is not None:
        y = y + _f64(bias)
    return _done(y, out)


# -------------------------------------------------------------------------------------------- contractions

def matmul(a: Any, b: Any, *, transpose_a: bool = False, transpose_b: bool = False,
           dtype: Any = None) -> np.ndarray:
    """``numpy.matmul`` in float64; ``transpose_a/b`` swap the last two dims of a >= 2-D operand first."""
    out = _result_dtype(a, b, dtype=dtype)
    x, y = _f64(a), _f64(b)
    if transpose_a and x.ndim >= 2:
        x = np.swapaxes(x, -1, -2)
    if transpose_b and y.ndim >= 2:
        y = np.swapaxes(y, -1, -2)
    return _done(np.matmul(x, y), out)


def attention(q: Any, k: Any, v: Any, *, scale: float | None = None, causal: bool = False, mask: Any = None,
              dtype: Any = None) -> np.ndarray:
    """``softmax(scale * q @ kᵀ + mask) @ v`` in float64 (``pbsdk.ops.attention``): K/V heads repeat to
    Q's head count (grouped-query), ``causal`` masks keys ``j > i`` (top-left aligned)."""
    out = _result_dtype(q, k, v, dtype=dtype)
    x, kk, vv = _f64(q), _f64(k), _f64(v)
    if x.ndim >= 3 and kk.ndim >= 3 and kk.shape[-3] != x.shape[-3]:
        g = x.shape[-3] // kk.shape[-3]
        kk, vv = np.repeat(kk, g, axis=-3), np.repeat(vv, g, axis=-3)
    s = np.matmul(x, np.swapaxes(kk, -1, -2)) * (1.0 / np.sqrt(x.shape[-1]) if scale is None else scale)
    if causal:
        sq, sk = s.shape[-2:]
        s = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None], -np.inf, s)
    if mask is not None:
        s = s + _f64(mask)
    with np.errstate(invalid="ignore"):
        s = s - s.max(axis=-1, keepdims=True)
        e = np.exp(s)
        return _done(np.matmul(e / e.sum(axis=-1, keepdims=True), vv), out)


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (int, np.integer)):
        return int(v), int(v)
    p = tuple(int(i) for i in v)
    if len(p) != 2:
        raise ValueError(f"expected an int or a pair, got {v!r}")
    return p  # type: ignore[return-value]


def _pads(v: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    if isinstance(v, (int, np.integer)):
        return (int(v), int(v)), (int(v), int(v))
    items = tuple(v)
    if len(items) == 2 and builtins.all(isinstance(p, (int, np.integer)) for p in items):
        return (int(items[0]), int(items[0])), (int(items[1]), int(items[1]))
    (t, b), (lft, r) = items
    return (int(t), int(b)), (int(lft), int(r))


def conv2d_output_shape(h: int, w: int, kh: int, kw: int, *, stride: Any = 1, padding: Any = 0,
                        dilation: Any = 1) -> tuple[int, int]:
    """Spatial output size ``floor((H + pads - dilation*(K-1) - 1) / stride) + 1`` of each dim."""
    (sh, sw), (dh, dw), ((pt, pb), (pl, pr)) = _pair(stride), _pair(dilation), _pads(padding)
    return (h + pt + pb - dh * (kh - 1) - 1) // sh + 1, (w + pl + pr - dw * (kw - 1) - 1) // sw + 1


def conv2d(x: Any, w: Any, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
           layout: str = "NCHW", dtype: Any = None) -> np.ndarray:
    """2-D cross-correlation (torch's conv2d). NCHW: x (N, C, H, W), w (O, C/groups, KH, KW); NHWC:
    x (N, H, W, C), w (KH, KW, C/groups, O). Zero padding: an int, (ph, pw) or ((top, bottom), (left, right)).

    Computed as a sum over kernel positions (i, j) of a strided window of the padded input contracted with
    ``w[:, :, i, j]`` per group (einsum in float64).
    """
    out_dtype = _result_dtype(x, w, dtype=dtype)
    xv, wv = _f64(x), _f64(w)
    if layout == "NHWC":
        xv = xv.transpose(0, 3, 1, 2)          # -> N, C, H, W
        wv = wv.transpose(3, 2, 0, 1)          # KH, KW, Cg, O -> O, Cg, KH, KW
    elif layout != "NCHW":
        raise ValueError(f"conv2d: layout must be 'NCHW' or 'NHWC', got {layout!r}")
    n, c, h, wd = xv.shape
    o, cg, kh, kw = wv.shape
    if c % groups or o % groups or cg * groups != c:
        raise ValueError(f"conv2d: groups={groups} does not fit input channels {c}, weight {wv.shape}")
    (sh, sw), (dh, dw), pads = _pair(stride), _pair(dilation), _pads(padding)
    oh, ow = conv2d_output_shape(h, wd, kh, kw, stride=stride, padding=padding, dilation=dilation)
    if oh < 1 or ow < 1:
        raise ValueError("conv2d: the kernel does not fit the padded input")
    xp = np.pad(xv, ((0, 0), (0, 0), pads[0], pads[1]))
    xg = xp.reshape(n, groups, cg, xp.shape[2], xp.shape[3])
    wg = wv.reshape(groups, o // groups, cg, kh, kw)
    acc = np.zeros((n, groups, o // groups, oh, ow))
    for i in range(kh):
        for j in range(kw):
            r0, c0 = i * dh, j * dw
            window = xg[:, :, :, r0:r0 + sh * (oh - 1) + 1:sh, c0:c0 + sw * (ow - 1) + 1:sw]
            acc += np.einsum("ngchw,goc->ngohw", window, wg[:, :, :, i, j])
    y = acc.reshape(n, o, oh, ow)
    if layout == "NHWC":
        y = y.transpose(0, 2, 3, 1)
    return _done(np.ascontiguousarray(y), out_dtype)


def conv_transpose(x: Any, w: Any, *, stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
                   dilation: Any = 1, groups: int = 1, layout: str = "NCHW", dtype: Any = None) -> np.ndarray:
    """Transposed convolution, 1-D to 3-D (torch's conv_transpose{1,2,3}d): x (N, Cin, *S) — 2-D NHWC:
    (N, H, W, Cin), result likewise channels last —, w (Cin, Cout/groups, *K).

    Computed by its definition, in float64: every input element times every kernel tap, scattered to
    output ``i*stride + k*dilation - padding`` (one strided slice per tap, einsum per group), then cropped.
    """
    out_dtype = _result_dtype(x, w, dtype=dtype)
    xv, wv = _f64(x), _f64(w)
    if layout == "NHWC":
        xv = np.moveaxis(xv, -1, 1)
    elif layout != "NCHW":
        raise ValueError(f"conv_transpose: layout must be 'NCHW' or 'NHWC', got {layout!r}")
    n, cin, *size = xv.shape
    _, cout_g, *kernel = wv.shape
    dims = len(size)

    def each(v: Any) -> tuple[int, ...]:
        return (int(v),) * dims if isinstance(v, (int, np.integer)) else tuple(int(u) for u in v)

    s, p, e, d = each(stride), each(padding), each(output_padding), each(dilation)
    full = [(size[i] - 1) * s[i] + d[i] * (kernel[i] - 1) + 1 + e[i] for i in range(dims)]
    out = [full[i] - 2 * p[i] for i in range(dims)]
    cig = cin // groups
    y = np.zeros((n, groups * cout_g, *full))
    for tap in np.ndindex(*kernel):
        window = tuple(slice(tap[i] * d[i], tap[i] * d[i] + (size[i] - 1) * s[i] + 1, s[i]) for i in range(dims))
        for g in range(groups):
            wg = wv[(slice(g * cig, (g + 1) * cig), slice(None)) + tuple(tap)]
            y[(slice(None), slice(g * cout_g, (g + 1) * cout_g)) + window] += np.einsum(
                "nc...,co->no...", xv[:, g * cig:(g + 1) * cig], wg)
    y = y[(slice(None), slice(None)) + tuple(slice(p[i], p[i] + out[i]) for i in range(dims))]
    if layout == "NHWC":
        y = np.moveaxis(y, 1, -1)
    return _done(np.ascontiguousarray(y), out_dtype)


# ------------------------------------------------------------------------------------------------- layout

def transpose(x: Any, axes: Sequence[int] | None = None) -> np.ndarray:
    return np.ascontiguousarray(np.transpose(np.asarray(x), axes))


def reshape(x: Any, shape: Sequence[int] | int) -> np.ndarray:
    return np.reshape(np.asarray(x), shape).copy()


# ------------------------------------------------------------------------------------- quantized (int8)
# Bit-exact oracles of pbsdk.ops.quantize / dequantize / quantized_linear (PyTorch's quantized_decomposed
# convention): f32 where the op computes in f32, integers exactly.

def _channel(values: Any, axis: int | None, ndim: int, dtype: Any) -> np.ndarray:
    v = np.atleast_1d(np.asarray(values, dtype))
    if axis is None:
        return v.reshape(())
    shape = [1] * ndim
    shape[axis] = v.size
    return v.reshape(shape)


def quantize(x: Any, scale: Any, zero_point: Any = 0, *, axis: int | None = None, qmin: int = -128,
             qmax: int = 127, dtype: Any = np.int8) -> np.ndarray:
    """``clamp(round_half_even(x * f32(1 / scale)) + zero_point, qmin, qmax)`` as ``dtype``, in float32
    (PyTorch's convention for int8 and uint8 alike: ``qmin=0, qmax=255, dtype=np.uint8``)."""
    x32 = np.asarray(x).astype(np.float32)
    inv = _channel(1.0 / np.atleast_1d(np.asarray(scale, np.float64)), axis, x32.ndim, np.float32)
    q = np.round(x32 * inv) + _channel(zero_point, axis, x32.ndim, np.float32)
    return np.clip(q, qmin, qmax).astype(dtype)


def dequantize(q: Any, scale: Any, zero_point: Any = 0, *, axis: int | None = None) -> np.ndarray:
    """``(q - zero_point) * scale`` in float32."""
    q32 = np.asarray(q).astype(np.float32)
    return ((q32 - _channel(zero_point, axis, q32.ndim, np.float32))
            * _channel(scale, axis, q32.ndim, np.float32)).astype(np.float32)


def quantized_matmul(xq: Any, x_scale: float, x_zero_point: int, wq: Any, w_scale: Any) -> np.ndarray:
    """``dequantize(xq) @ dequantize(wq)`` as `pbsdk.ops.matmul` runs it on integers: ``wq`` (K, N)
    symmetric, per tensor or per column (``w_scale`` of length N); the accumulator ``(xq - zx) @ wq``
    exactly, then one rescale ``f32(acc) * f32(x_scale * w_scale)``. Any integer dtype (u8 too)."""
    acc = (np.asarray(xq).astype(np.int64) - int(x_zero_point)) @ np.asarray(wq).astype(np.int64)
    acc32 = acc.astype(np.int32)
    assert np.array_equal(acc32, acc), "accumulator overflows int32"
    scale = np.asarray(float(x_scale) * np.atleast_1d(np.asarray(w_scale, np.float64)), np.float32)
    return acc32.astype(np.float32) * (scale if scale.size > 1 else scale[0])


def quantized_linear(xq: Any, x_scale: float, x_zero_point: int, wq: Any, w_scale: Any, bias: Any = None, *,
                     out_scale: float, out_zero_point: int = 0, out_qmin: int = -128, out_qmax: int = 127,
                     out_dtype: Any = np.int8) -> np.ndarray:
    """int8 (or uint8) ``x @ w.T + bias`` requantized: the i32 accumulator exactly, then
    ``clamp(round_half_even(f32(acc) * f32(x_scale * w_scale / out_scale)) + out_zero_point, out_qmin,
    out_qmax)`` as ``out_dtype``."""
    xi = np.asarray(xq).astype(np.int64)
    wi = np.asarray(wq).astype(np.int64)
    ws = np.atleast_1d(np.asarray(w_scale, np.float64))
    acc = (xi - int(x_zero_point)) @ wi.T
    if bias is not None:
        b32 = np.asarray(bias).astype(np.float32)
        acc = acc + np.round(b32 / (x_scale * ws).astype(np.float32)).astype(np.int64)
    acc32 = acc.astype(np.int32)
    assert np.array_equal(acc32, acc), "accumulator overflows int32"
    m = (x_scale * ws / out_scale).astype(np.float32)
    y = np.round(acc32.astype(np.float32) * (m if m.size > 1 else m[0])) + np.float32(out_zero_point)
    return np.clip(y, out_qmin, out_qmax).astype(out_dtype)
