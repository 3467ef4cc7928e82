"""JAX primitives to `pbsdk.ops`: one converter per primitive.

A converter receives the `Context` (with the equation's input and output avals), the equation's operands
as traced `Tensor`s (literals and small constants become constant tensors, whose values the context
remembers) and the equation's params as keywords; it returns a `Tensor` or, for primitives with several
results, a tuple of them. `convert_step` checks the result against the shapes the jaxpr records, and
`step_supported` decides whether one equation converts by converting it on fresh inputs (nothing is
compiled, nothing is guessed from names).

pbsdk's graph is float-only, so JAX's other dtypes are carried as floats inside a kernel (as in the torch
frontend): ``bool`` as an f32 mask of 0s and 1s, integers as f64 (exact below 2**53). Only primitives that
are exact on such values may produce integer results (`INT_EXACT`); the kernel boundary converts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from jax import errors as jax_errors
from jax import export as jax_export

from pbsdk import ops
from pbsdk.core.dims import Dim
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.ir.graph import Graph, TensorType
from pbsdk.frontends.registry import registrar
from pbsdk.frontends.tracing import Tensor, tracing

_FLOATS = {"float32": "f32", "float64": "f64", "float16": "f16", "bfloat16": "bf16"}
_INTS = {"int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"}


def carrier(dtype: Any) -> str | None:
    """The pbsdk dtype that carries a numpy/JAX dtype inside a kernel, or None when none can."""
    name = np.dtype(dtype).name
    if name in _FLOATS:
        return _FLOATS[name]
    if name == "bool":
        return "f32"
    if name in _INTS:
        return "f64"
    return None


def as_dim(size: Any) -> int | Dim:
    """A JAX size as pbsdk's graph carries it: an int, or, for a symbolic dimension of shape polymorphism
    (``jax.export.symbolic_shape``), a `Dim` over its dimension variables: a linear form (``b``, ``2*b + 1``)
    or one with products of them (``b*s``: a reshape flattening two polymorphic axes). Any other size
    (``floordiv(b, 2)``, ``max(b, 1)``) is an `UnsupportedError`: its equation stays with XLA."""
    if isinstance(size, (int, np.integer)) and not isinstance(size, bool):
        return int(size)
    if not jax_export.is_symbolic_dim(size):
        raise UnsupportedError(f"size {size!r} is not an int")
    try:
        form = Dim.parse(str(size))  # jax prints a linear form as "2*b + 1"
    except ValueError:
        raise UnsupportedError(f"size {size} is not a sum of products of the dimension variables") from None
    return form.const if not form.coeffs else form


def shape_of(sizes: Sequence[Any]) -> tuple[Any, ...]:
    """A shape (an aval's, a ``shape``/``new_sizes`` param) with each size `as_dim`."""
    return tuple(as_dim(d) for d in sizes)


def value_type(aval: Any) -> TensorType:
    """The pbsdk type carrying a JAX aval (a ShapedArray); UnsupportedError if none can. A symbolic
    dimension is a `Dim` (see `as_dim`)."""
    shape = getattr(aval, "shape", None)
    dtype = getattr(aval, "dtype", None)
    if shape is None or dtype is None:
        raise UnsupportedError(f"a {type(aval).__name__} value is not an array")
    try:
        dt = carrier(dtype)
    except TypeError:  # extended dtypes (PRNG keys, ...)
        dt = None
    if dt is None:
        raise UnsupportedError(f"dtype {dtype} is not supported")
    sizes = shape_of(shape)
    if any(d == 0 for d in sizes):
        raise UnsupportedError(f"empty array of shape {tuple(shape)}")
    return TensorType(sizes, dt)


def _is_int(aval: Any) -> bool:
    return np.dtype(aval.dtype).name in _INTS


def _is_bool(aval: Any) -> bool:
    return np.dtype(aval.dtype).name == "bool"


class Context:
    """State of one lowering: constant values by value id (so a pad value or a ``max(x, -inf)`` can be
    read) and the current equation's input and output avals."""

    def __init__(self) -> None:
        self.consts: dict[int, np.ndarray] = {}
        self.splats: dict[int, Tensor] = {}  # value id -> a rank-0 constant it is a broadcast of
        self.reshaped: dict[int, Tensor] = {}  # value id -> the tensor it is a reshape of
        self.in_avals: Sequence[Any] = ()
        self.out_avals: Sequence[Any] = ()

    @property
    def out_dtype(self) -> str:
        return value_type(self.out_avals[0]).dtype

    def const(self, array: Any, dtype: str) -> Tensor:
        value = np.asarray(array)
        t = ops._const(value, dtype)
        self.consts[t.value.id] = value
        return t

    def operand(self, array: Any, dtype: str) -> Tensor:
        """A literal or folded constant operand; one that holds a single value repeated is a broadcast of
        a rank-0 constant (a splat), which elementwise converters read as a scalar."""
        value = np.asarray(array)
        if value.ndim and value.size > 1 and np.all(value == value.flat[0]):
            scalar = self.const(value.flat[0], dtype)
            out = ops.broadcast_to(scalar, value.shape)
            self.splats[out.value.id] = scalar
            return out
        return self.const(value, dtype)

    def const_of(self, x: Any) -> np.ndarray | None:
        return self.consts.get(x.value.id) if isinstance(x, Tensor) else None

    def scalar(self, x: Tensor) -> Tensor:
        """``x``, or the rank-0 constant it broadcasts: elementwise ops then read a scalar (and the
        attention recogniser sees ``where(mask, s, -inf)``)."""
        return self.splats.get(x.value.id, x)

    def reshape(self, x: Tensor, shape: tuple[int, ...]) -> Tensor:
        """``ops.reshape``, remembering the source; a reshape back to a reshape's source is that source."""
        src = self.reshaped.get(x.value.id)
        if src is not None and src.shape == tuple(shape):
            return src
        out = ops.reshape(x, shape)
        if out is not x:
            self.reshaped[out.value.id] = x
        return out

    def full(self, t: Tensor) -> Tensor:
        """An elementwise result broadcast to the equation's result shape (its operands may be scalars)."""
        shape = shape_of(self.out_avals[0].shape)
        return t if t.shape == shape else ops.broadcast_to(t, shape)


Converter = Callable[..., Any]

CONVERTERS: dict[str, Converter] = {}

#: Lower an NHWC convolution to pbsdk's NHWC conv2d as is. Off: the cpu target's NCHW conv2d is several
#: times faster than its NHWC one today (4x on `examples.small_cnn`), far more than the transposes into
#: and out of NCHW cost, so every convolution goes through NCHW.
NATIVE_NHWC = False

#: Primitives whose results are exact on integers carried as f64 (others refuse integer results).
INT_EXACT = {
    "add", "add_any", "sub", "mul", "neg", "max", "min", "abs", "select_n", "clamp", "broadcast_in_dim", "reshape",
    "transpose", "squeeze", "expand_dims", "concatenate", "slice", "split", "iota", "convert_element_type",
    "pad", "reduce_max", "reduce_min", "reduce_sum", "stop_gradient", "copy", "copy_p", "square",
    "integer_pow", "gather", "sign", "argmax", "argmin", "cumsum", "cummax", "cummin", "rem", "div", "and", "or",
    "xor", "not", "dim_as_value",
}

#: Primitives that only move or relabel data; a kernel made of nothing else is left to XLA.
LAYOUT_PRIMITIVES = {
    "broadcast_in_dim", "reshape", "transpose", "squeeze", "expand_dims", "concatenate", "slice", "split",
    "convert_element_type", "stop_gradient", "copy", "copy_p", "iota", "pad",
}


converts = registrar(CONVERTERS)


def _scalar_const(cx: Context, x: Any) -> float | None:
    """The value of a constant tensor that holds one value (a literal, a broadcast scalar)."""
    value = cx.const_of(cx.scalar(x)) if isinstance(x, Tensor) else None
    if value is None or value.size == 0 or not np.all(value == value.flat[0]):
        return None
    return float(value.flat[0])


# ------------------------------------------------------------------------------------------- elementwise

def _binary(fn: Callable[[Any, Any], Tensor]) -> Converter:
    def convert(cx: Context, a: Tensor, b: Tensor, *, out_dtype: Any = None) -> Tensor:
        # mul's out_dtype widens its result (computed in that dtype by XLA): only the plain case here.
        if out_dtype is not None and any(np.dtype(out_dtype) != np.dtype(av.dtype) for av in cx.in_avals):
            raise UnsupportedError(f"out_dtype={np.dtype(out_dtype)} differs from the operands' dtype")
        return cx.full(fn(cx.scalar(a), cx.scalar(b)))
    return convert


def _int_div(a: Any, b: Any) -> Tensor:
    """Integer division rounding toward zero, exact on whole numbers: ``(a - fmod(a, b)) / b``."""
    return ops.div(ops.sub(a, ops.fmod(a, b)), b)


for _n, _f in (("add", ops.add), ("add_any", ops.add), ("sub", ops.sub), ("mul", ops.mul), ("pow", ops.pow),
               ("rem", ops.fmod)):
    converts(_n)(_binary(_f))


@converts("div")
def _div(cx: Context, a: Tensor, b: Tensor) -> Tensor:
    return _binary(_int_div if _is_int(cx.out_avals[0]) else ops.div)(cx, a, b)


def _extremum(fn: Callable[[Any, Any], Tensor], neutral: float) -> Converter:
    def convert(cx: Context, a: Tensor, b: Tensor) -> Tensor:
        # jax.nn.softmax writes max(-inf, max(x)): drop the neutral operand so the softmax stays
        # recognisable (max(x, -inf) == x, NaN included).
        shape = shape_of(cx.out_avals[0].shape)
        if _scalar_const(cx, a) == neutral and b.shape == shape:
            return b
        if _scalar_const(cx, b) == neutral and a.shape == shape:
            return a
        return cx.full(fn(cx.scalar(a), cx.scalar(b)))
    return convert


converts("max")(_extremum(ops.maximum, -math.inf))
converts("min")(_extremum(ops.minimum, math.inf))


def _no_accuracy(fn: Callable[[Tensor], Tensor]) -> Converter:
    def convert(cx: Context, x: Tensor, *, accuracy: Any = None) -> Tensor:
        if accuracy is not None:
            raise UnsupportedError(f"accuracy={accuracy!r} is not supported")
        return fn(x)
    return convert


for _n, _u in (("exp", ops.exp), ("log", ops.log), ("tanh", ops.tanh), ("logistic", ops.sigmoid),
               ("sqrt", ops.sqrt), ("rsqrt", ops.rsqrt), ("log1p", ops.log1p), ("expm1", ops.expm1),
               ("sin", ops.sin), ("cos", ops.cos), ("tan", ops.tan)):
    converts(_n)(_no_accuracy(_u))

for _n, _u in (("floor", ops.floor), ("ceil", ops.ceil), ("sign", ops.sign)):
    converts(_n)(lambda cx, x, _u=_u: _u(x))


@converts("round")
def _round(cx: Context, x: Tensor, *, rounding_method: Any) -> Tensor:
    """``lax.round``: halves away from zero (rounding_method 0) or to even (1, ``jnp.round``)."""
    if int(rounding_method) == 1:
        return ops.round(x)
    t = ops.trunc(x)  # x - t is exact
    return ops.where(ops.greater_equal(ops.abs(ops.sub(x, t)), 0.5), ops.add(t, ops.sign(x)), t)


@converts("is_finite")
def _is_finite(cx: Context, x: Tensor) -> Tensor:
    return ops.isfinite(x)


@converts("neg")
def _neg(cx: Context, x: Tensor) -> Tensor:
    return ops.neg(x)


@converts("abs")
def _abs(cx: Context, x: Tensor) -> Tensor:
    return ops.abs(x)


@converts("erf")
def _erf(cx: Context, x: Tensor) -> Tensor:
    return ops.erf(x)


@converts("erfc")
def _erfc(cx: Context, x: Tensor) -> Tensor:
    # 1 - erf(x): loses relative precision only where erfc(x) is below f32's epsilon, i.e. where the
    # absolute error is that small too (how jax.nn.gelu(approximate=False) uses it).
    return ops.sub(1.0, ops.erf(x))


@converts("square")
def _square(cx: Context, x: Tensor) -> Tensor:
    return ops.mul(x, x)


@converts("exp2")
def _exp2(cx: Context, x: Tensor, *, accuracy: Any = None) -> Tensor:
    if accuracy is not None:
        raise UnsupportedError(f"accuracy={accuracy!r} is not supported")
    return ops.exp(ops.mul(x, math.log(2.0)))


@converts("integer_pow")
def _integer_pow(cx: Context, x: Tensor, *, y: int) -> Tensor:
    # Repeated squaring, as XLA expands it: exact signs for negative bases.
    if y == 0:
        return ops.broadcast_to(cx.const(np.asarray(1.0), x.dtype), x.shape) if x.shape else cx.const(1.0, x.dtype)
    if abs(y) > 16:
        raise UnsupportedError(f"integer_pow with exponent {y}")
    if y < 0 and _is_int(cx.out_avals[0]):
        raise UnsupportedError("negative integer power of an integer")
    acc: Tensor | None = None
    base, n = x, abs(y)
    while n:
        if n & 1:
            acc = base if acc is None else ops.mul(acc, base)
        n >>= 1
        if n:
            base = ops.mul(base, base)
    assert acc is not None
    return ops.div(1.0, acc) if y < 0 else acc


@converts("clamp")
def _clamp(cx: Context, lo: Tensor, x: Tensor, hi: Tensor) -> Tensor:
    return cx.full(ops.minimum(ops.maximum(cx.scalar(x), cx.scalar(lo)), cx.scalar(hi)))


# Comparisons give a 0/1 mask in the operands' dtype; the result check casts it to the bool carrier.
for _n, _f in (("eq", ops.equal), ("ne", ops.not_equal), ("lt", ops.less), ("le", ops.less_equal),
               ("gt", ops.greater), ("ge", ops.greater_equal)):
    converts(_n)(_binary(_f))


def _bool_only(cx: Context, what: str) -> None:
    if not all(_is_bool(a) for a in cx.in_avals):
        raise UnsupportedError(f"{what} on integers is bitwise")


def _logical(on_bools: Callable[[Tensor, Tensor], Tensor], on_ints: Callable[[Tensor, Tensor], Tensor]) -> Converter:
    """``and``/``or``/``xor``: logical on booleans (0/1 masks), bitwise on integers."""
    def convert(cx: Context, a: Tensor, b: Tensor) -> Tensor:
        return (on_bools if all(_is_bool(av) for av in cx.in_avals) else on_ints)(a, b)
    return convert


converts("and")(_logical(ops.mul, ops.bitwise_and))
converts("or")(_logical(ops.maximum, ops.bitwise_or))
converts("xor")(_logical(ops.not_equal, ops.bitwise_xor))


@converts("not")
def _not(cx: Context, x: Tensor) -> Tensor:
    return ops.equal(x, 0.0) if _is_bool(cx.in_avals[0]) else ops.bitwise_not(x)


@converts("select_n")
def _select_n(cx: Context, pred: Tensor, *cases: Tensor) -> Tensor:
    if len(cases) != 2:
        raise UnsupportedError(f"select_n with {len(cases)} cases")
    false, true = cases
    return cx.full(ops.where(cx.scalar(pred), cx.scalar(true), cx.scalar(false)))


@converts("convert_element_type")
def _convert_element_type(cx: Context, x: Tensor, *, new_dtype: Any, weak_type: bool = False,
                          sharding: Any = None) -> Tensor:
    src, dst = np.dtype(cx.in_avals[0].dtype), np.dtype(new_dtype)
    if dst.name == "bool":
        return ops.not_equal(x, 0.0)
    if dst.name in _INTS:
        if src.name == "bool":
            return x
        if src.name in _INTS and np.iinfo(src).min >= np.iinfo(dst).min and np.iinfo(src).max <= np.iinfo(dst).max:
            return x
        raise UnsupportedError(f"conversion from {src} to {dst} (truncation or wrap-around)")
    return ops.astype(x, cx.out_dtype)


@converts("stop_gradient", "copy", "copy_p", "optimization_barrier")
def _identity(cx: Context, *xs: Tensor) -> Any:
    return xs[0] if len(xs) == 1 else tuple(xs)


# ------------------------------------------------------------------------------------------ reductions

def _reduction(fn: Callable[..., Tensor]) -> Converter:
    def convert(cx: Context, x: Tensor, *, axes: Sequence[int], out_sharding: Any = None) -> Tensor:
        return fn(x, tuple(int(a) for a in axes)) if axes else x
    return convert


converts("reduce_sum")(_reduction(ops.sum))
converts("reduce_max")(_reduction(ops.max))
converts("reduce_min")(_reduction(ops.min))


def _arg_extreme(fn: Callable[..., Tensor]) -> Converter:
    """The first extreme's index along the one axis (a NaN is the extreme), as XLA computes it."""
    def convert(cx: Context, x: Tensor, *, axes: Sequence[int], index_dtype: Any) -> Tensor:
        (axis,) = axes
        return fn(x, int(axis))
    return convert


converts("argmax")(_arg_extreme(ops.argmax))
converts("argmin")(_arg_extreme(ops.argmin))


converts("reduce_prod")(_reduction(ops.prod))


def _cumulative(fn: Callable[..., Tensor]) -> Converter:
    def convert(cx: Context, x: Tensor, *, axis: int, reverse: bool) -> Tensor:
        return fn(x, int(axis), reverse=bool(reverse))
    return convert


for _n, _s in (("cumsum", ops.cumsum), ("cumprod", ops.cumprod), ("cummax", ops.cummax), ("cummin", ops.cummin)):
    converts(_n)(_cumulative(_s))


@converts("reduce_or")
def _reduce_or(cx: Context, x: Tensor, *, axes: Sequence[int]) -> Tensor:
    _bool_only(cx, "reduce_or")
    return ops.max(x, tuple(axes)) if axes else x


@converts("reduce_and")
def _reduce_and(cx: Context, x: Tensor, *, axes: Sequence[int]) -> Tensor:
    _bool_only(cx, "reduce_and")
    return ops.min(x, tuple(axes)) if axes else x


# ---------------------------------------------------------------------------------------- contractions

@converts("dot_general")
def _dot_general(cx: Context, a: Tensor, b: Tensor, *, dimension_numbers: Any, precision: Any = None,
                 preferred_element_type: Any = None, out_sharding: Any = None) -> Tensor:
    """Any dot_general as one (batched) matmul: lhs to (batch, M, K), rhs to (batch, K, N), then the
    result reshaped to (batch dims, lhs free dims, rhs free dims) — XLA's result order."""
    if any(_is_int(av) or _is_bool(av) for av in cx.in_avals):
        raise UnsupportedError("integer dot_general")
    (lc, rc), (lb, rb) = dimension_numbers
    lc, rc, lb, rb = (tuple(int(d) for d in ds) for ds in (lc, rc, lb, rb))
    want = cx.out_dtype
    a, b = (ops.astype(t, want) if t.dtype != want else t for t in (a, b))
    lf = tuple(d for d in range(a.ndim) if d not in lc and d not in lb)
    rf = tuple(d for d in range(b.ndim) if d not in rc and d not in rb)
    batch = tuple(a.shape[d] for d in lb)
    m = math.prod(a.shape[d] for d in lf)
    n = math.prod(b.shape[d] for d in rf)
    k = math.prod(a.shape[d] for d in lc)
    lhs = cx.reshape(ops.transpose(a, lb + lf + lc), batch + (m, k))
    # jnp.matmul squeezes unit batch dims first ((1, H, S, S) -> (H, S, S)); multiply the unsqueezed lhs
    # instead, so that a softmax feeding it stays visible to the attention recogniser.
    mm_batch = batch
    src = cx.reshaped.get(lhs.value.id)
    if batch and src is not None and src.ndim >= 3 and src.shape[-2:] == (m, k) and \
            math.prod(src.shape[:-2]) == math.prod(batch):
        lhs, mm_batch = src, src.shape[:-2]
    # A batched rhs stored as (batch, N, K) -- q @ kᵀ in attention -- is read transposed by the matmul
    # (what the attention recogniser expects); 2-D operands get an explicit transpose. Either way the cpu
    # target's packed matmul reads the transpose's source through its packing (no copy).
    if batch and rb + rf + rc == tuple(range(b.ndim)):
        out = ops.matmul(lhs, cx.reshape(b, mm_batch + (n, k)), transpose_b=True)
    else:
        out = ops.matmul(lhs, cx.reshape(ops.transpose(b, rb + rc + rf), mm_batch + (k, n)))
    shape = batch + tuple(a.shape[d] for d in lf) + tuple(b.shape[d] for d in rf)
    return cx.reshape(out, shape)


@converts("conv_general_dilated")
def _conv(cx: Context, x: Tensor, w: Tensor, *, window_strides: Sequence[int], padding: Sequence[Any],
          lhs_dilation: Sequence[int], rhs_dilation: Sequence[int], dimension_numbers: Any,
          feature_group_count: int, batch_group_count: int, precision: Any = None,
          preferred_element_type: Any = None, out_sharding: Any = None) -> Tensor:
    """A 1-D, 2-D or 3-D convolution as pbsdk's NC... conv1d/conv2d/conv3d (2-D: or NHWC, see `NATIVE_NHWC`):
    the operands are transposed into that layout and the result back to ``out_spec``. Input dilation (a
    transposed convolution) inserts zeros between the input's elements; negative padding crops."""
    nsp = x.ndim - 2
    if nsp not in (1, 2, 3):
        raise UnsupportedError(f"{nsp}-D convolution (only 1-D to 3-D)")
    if batch_group_count != 1:
        raise UnsupportedError("batch_group_count != 1")
    if any(_is_int(av) or _is_bool(av) for av in cx.in_avals):
        raise UnsupportedError("integer convolution")
    pads = tuple((int(lo), int(hi)) for lo, hi in padding)
    lhs_spec, rhs_spec, out_spec = (tuple(int(d) for d in s) for s in dimension_numbers)
    want = cx.out_dtype
    x, w = (ops.astype(t, want) if t.dtype != want else t for t in (x, w))
    # lhs_spec = (batch, feature, spatial...) positions; rhs_spec = (out feature, in feature, spatial...).
    direct = all(d == 1 for d in lhs_dilation) and all(p >= 0 for pair in pads for p in pair)
    nhwc = nsp == 2 and lhs_spec == (0, 3, 1, 2) and NATIVE_NHWC and direct
    positions = tuple(range(x.ndim))
    if nhwc:
        xt = ops.transpose(x, (lhs_spec[0], lhs_spec[2], lhs_spec[3], lhs_spec[1]))
        wt = ops.transpose(w, (rhs_spec[2], rhs_spec[3], rhs_spec[1], rhs_spec[0]))
        positions = (0, 3, 1, 2)  # where N, C, H, W sit in the NHWC result
    else:
        xt = ops.transpose(x, lhs_spec)
        wt = ops.transpose(w, rhs_spec)
    if not direct:
        xt = ops._pad(ops._dilate(xt, (1, 1, *lhs_dilation)), ((0, 0), (0, 0), *pads), 0.0)
        pads = ((0, 0),) * nsp
    conv = {1: ops.conv1d, 2: ops.conv2d, 3: ops.conv3d}[nsp]
    extra = {"layout": "NHWC" if nhwc else "NCHW"} if nsp == 2 else {}
    y = conv(xt, wt, stride=tuple(window_strides), padding=pads, dilation=tuple(rhs_dilation),
             groups=int(feature_group_count), **extra)
    perm = [0] * x.ndim
    for logical, axis in enumerate(out_spec):
        perm[axis] = positions[logical]
    return ops.transpose(y, perm)


# ---------------------------------------------------------------------------------------------- layout

@converts("broadcast_in_dim")
def _broadcast_in_dim(cx: Context, x: Tensor, *, shape: Sequence[int], broadcast_dimensions: Sequence[int],
                      sharding: Any = None) -> Tensor:
    dims = tuple(int(d) for d in broadcast_dimensions)
    order = sorted(range(len(dims)), key=lambda i: dims[i])
    if order != list(range(len(dims))):
        x = ops.transpose(x, order)
        dims = tuple(dims[i] for i in order)
    inter = [1] * len(shape)
    for i, d in enumerate(dims):
        inter[d] = x.shape[i]
    y = cx.reshape(x, tuple(inter))
    out = ops.broadcast_to(y, shape_of(shape))
    value = _scalar_const(cx, x)
    if value is not None and out is not x:
        cx.splats[out.value.id] = cx.const(np.asarray(value), x.dtype)
    return out


@converts("reshape")
def _reshape(cx: Context, x: Tensor, *, new_sizes: Sequence[int], dimensions: Any = None,
             sharding: Any = None) -> Tensor:
    if dimensions is not None:
        raise UnsupportedError("reshape with dimensions")
    return cx.reshape(x, shape_of(new_sizes))


@converts("transpose")
def _transpose(cx: Context, x: Tensor, *, permutation: Sequence[int]) -> Tensor:
    return ops.transpose(x, tuple(int(p) for p in permutation))


@converts("squeeze")
def _squeeze(cx: Context, x: Tensor, *, dimensions: Sequence[int]) -> Tensor:
    return cx.reshape(x, shape_of(cx.out_avals[0].shape))


@converts("expand_dims")
def _expand_dims(cx: Context, x: Tensor, **_: Any) -> Tensor:
    return cx.reshape(x, shape_of(cx.out_avals[0].shape))


@converts("concatenate")
def _concatenate(cx: Context, *xs: Tensor, dimension: int) -> Tensor:
    return ops.concatenate(list(xs), axis=int(dimension))


@converts("slice")
def _slice(cx: Context, x: Tensor, *, start_indices: Sequence[int], limit_indices: Sequence[int],
           strides: Sequence[int] | None = None) -> Tensor:
    for axis, (lo, hi) in enumerate(zip(start_indices, limit_indices)):
        step = 1 if strides is None else int(strides[axis])
        x = ops.slice(x, axis, int(lo), int(hi), step)
    return x


@converts("split")
def _split(cx: Context, x: Tensor, *, sizes: Sequence[int], axis: int) -> tuple[Tensor, ...]:
    out, start = [], 0
    for s in sizes:
        out.append(ops.slice(x, int(axis), start, start + int(s)))
        start += int(s)
    return tuple(out)


@converts("pad")
def _pad(cx: Context, x: Tensor, value: Tensor, *, padding_config: Sequence[Any]) -> Tensor:
    fill = _scalar_const(cx, value)
    if fill is None:
        raise UnsupportedError("pad with a computed padding value")
    if any(int(interior) for _, _, interior in padding_config):
        raise UnsupportedError("interior padding")
    return ops._pad(x, [(int(lo), int(hi)) for lo, hi, _ in padding_config], float(fill))


def _reduce_window(pool: Callable[..., Tensor], fill: float) -> Converter:
    """``reduce_window_max``/``_sum`` (``flax.linen.max_pool``/``avg_pool``, ``lax.reduce_window``): the
    input padded with ``fill``, then pooled over every dimension (size-1 windows are free)."""
    def convert(cx: Context, x: Tensor, *, window_dimensions: Sequence[int], window_strides: Sequence[int],
                padding: Sequence[Any], base_dilation: Sequence[int], window_dilation: Sequence[int]) -> Tensor:
        if any(int(d) != 1 for d in base_dilation):
            raise UnsupportedError("reduce_window with base dilation")
        padded = ops._pad(x, [(int(lo), int(hi)) for lo, hi in padding], fill)
        return pool(padded, tuple(int(w) for w in window_dimensions), tuple(int(s) for s in window_strides),
                    tuple(int(d) for d in window_dilation))
    return convert


converts("reduce_window_max")(_reduce_window(lambda t, k, s, d: ops.max_pool(t, k, s, 0, d), -math.inf))
converts("reduce_window_min")(_reduce_window(
    lambda t, k, s, d: ops.neg(ops.max_pool(ops.neg(t), k, s, 0, d)), math.inf))
converts("reduce_window_sum")(_reduce_window(lambda t, k, s, d: ops.sum_pool(t, k, s, d), 0.0))


@converts("iota")
def _iota(cx: Context, *, dtype: Any, shape: Sequence[int], dimension: int, sharding: Any = None) -> Tensor:
    shape = shape_of(shape)
    n = shape[dimension]
    line_shape = tuple(n if i == dimension else 1 for i in range(len(shape)))
    if isinstance(n, Dim):  # a symbolic length: the kernel counts 0 .. n-1 itself
        if cx.out_dtype == "f32":
            raise UnsupportedError("iota of a symbolic length in f32 (exact only below 2**24)")
        return ops.broadcast_to(cx.reshape(ops.iota(n, cx.out_dtype), line_shape), shape)
    if n >= 2 ** 24 and cx.out_dtype == "f32":
        raise UnsupportedError("iota beyond f32's exact integers")
    line = np.arange(n, dtype=np.float64).reshape(line_shape)
    return ops.broadcast_to(cx.const(line, cx.out_dtype), shape)


@converts("dim_as_value")
def _dim_as_value(cx: Context, *, dim: Any) -> Tensor:
    """A symbolic size as data (``x.shape[0]`` used as a number: ``jnp.mean`` over a polymorphic axis)."""
    n = as_dim(dim)
    if isinstance(n, Dim):
        return ops.size_value(n, cx.out_dtype)
    return cx.const(np.asarray(n), cx.out_dtype)


@converts("gather")
def _gather(cx: Context, x: Tensor, idx: Tensor, *, dimension_numbers: Any, slice_sizes: Sequence[int],
            mode: Any, fill_value: Any = None, unique_indices: bool = False,
            indices_are_sorted: bool = False) -> Tensor:
    """The gather of ``table[idx]`` / ``jnp.take(x, idx, axis)``: whole slices along one axis, as
    `ops.take` (which clips indices); with ``FILL_OR_DROP`` out-of-range indices give ``fill_value``."""
    dn = dimension_numbers
    axes = tuple(int(d) for d in dn.start_index_map)
    if len(axes) != 1 or tuple(dn.collapsed_slice_dims) != axes or tuple(dn.operand_batching_dims) or \
            idx.ndim < 2 or idx.shape[-1] != 1:
        raise UnsupportedError("only gathers of whole slices along one axis (take) are supported")
    (a,) = axes
    if any(int(s) != (1 if d == a else x.shape[d]) for d, s in enumerate(slice_sizes)):
        raise UnsupportedError("gather of partial slices")
    batch = idx.shape[:-1]
    flat_idx = ops.reshape(idx, batch)
    taken = ops.take(x, flat_idx, axis=a)  # x.shape[:a] + batch + x.shape[a + 1:]
    name = getattr(mode, "name", str(mode))
    if name == "FILL_OR_DROP":
        if fill_value is None and _is_int(cx.out_avals[0]):
            raise UnsupportedError("integer gather that fills out-of-range indices")
        fill = math.nan if fill_value is None else float(fill_value)
        n = x.shape[a]
        valid = ops.mul(ops.greater_equal(flat_idx, 0.0), ops.less_equal(flat_idx, float(n - 1)))
        valid = ops.reshape(valid, (1,) * a + batch + (1,) * (x.ndim - a - 1))
        taken = ops.where(valid, taken, cx.const(np.asarray(fill), taken.dtype))
    elif name not in ("CLIP", "PROMISE_IN_BOUNDS"):
        raise UnsupportedError(f"gather mode {name}")
    # Result order: offset dims (x's dims but a) at ``offset_dims``, the batch dims elsewhere in order.
    nb = len(batch)
    offsets = [d if d < a else d - 1 + nb for d in range(x.ndim) if d != a]  # their axes in ``taken``
    offset_dims = tuple(int(d) for d in dn.offset_dims)
    batch_axes = iter(range(a, a + nb))
    perm = [offsets[offset_dims.index(p)] if p in offset_dims else next(batch_axes) for p in range(taken.ndim)]
    return ops.transpose(taken, perm)


# ------------------------------------------------------------------------------------------------ driver

def _check(name: str, result: Any, out_avals: Sequence[Any]) -> list[Tensor]:
    """The converter's results checked against the jaxpr's avals, cast to the carrying dtypes."""
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    if len(results) != len(out_avals):
        raise UnsupportedError(f"{name}: converter gave {len(results)} results, the jaxpr has {len(out_avals)}")
    out = []
    for r, aval in zip(results, out_avals):
        vt = value_type(aval)
        if not isinstance(r, Tensor):
            raise UnsupportedError(f"{name}: a result is not a tensor")
        if _is_int(aval) and name not in INT_EXACT:
            raise UnsupportedError(f"{name}: integer results are only supported for exact primitives")
        if r.shape != vt.shape:
            raise UnsupportedError(f"{name}: converter gave shape {r.shape}, the jaxpr has {vt.shape}")
        out.append(ops.astype(r, vt.dtype) if r.dtype != vt.dtype else r)
    return out


def convert_step(cx: Context, name: str, params: dict[str, Any], args: Sequence[Tensor],
                 in_avals: Sequence[Any], out_avals: Sequence[Any]) -> list[Tensor]:
    """Convert one equation (primitive ``name``) whose operands are already traced."""
    fn = CONVERTERS.get(name)
    if fn is None:
        raise UnsupportedError("no converter", op=name)
    cx.in_avals, cx.out_avals = in_avals, out_avals
    try:
        result = fn(cx, *args, **params)
    except UnsupportedError:
        raise
    except (PbsdkError, TypeError, ValueError, IndexError, KeyError, AttributeError,
            jax_errors.InconclusiveDimensionOperation) as exc:
        # A `Dim` refuses what needs its value (TypeError); so does jax's symbolic size (Inconclusive...).
        raise UnsupportedError(f"{type(exc).__name__}: {exc}", op=name) from exc
    return _check(name, result, out_avals)


def step_supported(name: str, params: dict[str, Any], in_avals: Sequence[Any], out_avals: Sequence[Any],
                   literals: Sequence[Any]) -> tuple[bool, str]:
    """Whether one equation converts, tried on fresh inputs of its input avals; and why not.
    ``literals[i]`` is the constant value of operand i (a literal or small constant) or None."""
    if name not in CONVERTERS:
        return False, "no converter"
    graph = Graph()
    cx = Context()
    try:
        for aval in out_avals:
            value_type(aval)
        with tracing(graph):
            args = [cx.operand(lit, value_type(aval).dtype) if lit is not None
                    else Tensor(graph.add("input", [], value_type(aval)), graph)
                    for aval, lit in zip(in_avals, literals)]
            convert_step(cx, name, params, args, in_avals, out_avals)
    except UnsupportedError as exc:
        return False, exc.reason
    return True, ""
