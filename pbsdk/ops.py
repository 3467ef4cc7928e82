"""pbsdk's tensor-program API: numpy-like ops on traced tensors, used inside ``@pbsdk.jit``.

Signatures follow numpy (``transpose(x, axes)``, ``softmax(x, axis=-1)``, ``sum(x, axis=..., keepdims=...)``);
Python and numpy scalars and constant numpy arrays broadcast like arrays. Shapes and dtypes are checked
while tracing, so a mistake is reported with the op's name and the shapes involved.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import itertools
import logging
import math
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pbsdk.core import quant
from pbsdk.core.dims import Dim
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.ir.graph import (
    DTYPE_TO_NUMPY,
    FLOAT_DTYPES,
    INLINE_LIMIT,
    INT_DTYPES,
    NUMPY_TO_DTYPE,
    TensorType,
    Value,
)
from pbsdk.frontends.tracing import Tensor, current_graph

#: Why a contraction of dequantized operands runs in float rather than on integers (one line each, INFO).
_log = logging.getLogger("pbsdk.quant")

__all__ = [
    "Tensor",
    "abs",
    "adaptive_avg_pool",
    "adaptive_max_pool",
    "add",
    "argmax",
    "argmin",
    "astype",
    "attention",
    "avg_pool",
    "batch_norm",
    "bitwise_and",
    "bitwise_not",
    "bitwise_or",
    "bitwise_xor",
    "broadcast_to",
    "ceil",
    "celu",
    "concatenate",
    "conv1d",
    "conv2d",
    "conv3d",
    "conv_transpose",
    "cos",
    "cummax",
    "cummin",
    "cumprod",
    "cumsum",
    "dequantize",
    "div",
    "elu",
    "equal",
    "erf",
    "exp",
    "expm1",
    "flip",
    "floor",
    "floor_divide",
    "fmod",
    "gelu",
    "glu",
    "greater",
    "greater_equal",
    "group_norm",
    "hardsigmoid",
    "hardswish",
    "hardtanh",
    "instance_norm",
    "interleave",
    "isfinite",
    "isinf",
    "isnan",
    "layernorm",
    "leaky_relu",
    "less",
    "less_equal",
    "log",
    "log1p",
    "log_softmax",
    "logsigmoid",
    "matmul",
    "max",
    "max_pool",
    "max_with_index",
    "maximum",
    "mean",
    "min",
    "min_with_index",
    "minimum",
    "mish",
    "mul",
    "neg",
    "not_equal",
    "pad",
    "pow",
    "prod",
    "put_along_axis",
    "quantize",
    "quantized_linear",
    "relu",
    "relu6",
    "remainder",
    "reshape",
    "roll",
    "round",
    "rsqrt",
    "selu",
    "sigmoid",
    "sign",
    "silu",
    "sin",
    "slice",
    "softmax",
    "softplus",
    "softsign",
    "sort",
    "sqrt",
    "stack",
    "sub",
    "sum",
    "sum_pool",
    "take",
    "take_along_axis",
    "tan",
    "tanh",
    "tile",
    "topk",
    "transpose",
    "trunc",
    "vector_norm",
    "where",
]

_group_stack: list[str] = []


@contextlib.contextmanager
def _group(name: str) -> Iterator[None]:
    """Tag the nodes a composite op creates, so later passes can recognise it."""
    _group_stack.append(name)
    try:
        yield
    finally:
        _group_stack.pop()


#: Layout ops folded into a new constant when their operand is one (a frozen weight's transpose would
#: otherwise be recomputed on every call).
_FOLDABLE = {"transpose": lambda v, a: np.transpose(v, a["perm"]), "reshape": lambda v, a: v.reshape(a["shape"]),
             "flip": lambda v, a: np.flip(v, a["axes"]),
             "slice": lambda v, a: v[tuple(builtins.slice(s, s + (n - 1) * k + 1, k)
                                           for s, k, n in zip(a["starts"], a["steps"], a["shape"]))]}


def _folded(graph: Any, op: str, inputs: Sequence[Value], shape: tuple[int, ...], attrs: Mapping[str, Any]) -> Any:
    sizes = (*shape, *attrs.get("starts", ()))  # a size or a slice's start known only at run time: no fold
    if op not in _FOLDABLE or len(inputs) != 1 or builtins.any(isinstance(d, Dim) for d in sizes):
        return None
    src = _const_value(graph, inputs[0])
    if src is None or src.shape != inputs[0].shape:
        return None
    value = np.ascontiguousarray(_FOLDABLE[op](src, {**attrs, "shape": shape}))
    return value if value.shape == tuple(shape) else None


def _const_value(graph: Any, value: Value) -> np.ndarray | None:
    """``value``'s array when a constant of ``graph`` produces it (a frozen weight), else None."""
    src = next((n for n in reversed(graph.nodes) if n.out is value), None)
    return None if src is None or src.op != "const" else np.asarray(src.attrs["value"])


def _add(op: str, inputs: Sequence[Value], shape: tuple[int, ...], dtype: str, **attrs: Any) -> Tensor:
    # Integer ops: `compute_dtype` raises for an op integers do not support ("cast" is the one op between an
    # integer and a float dtype).
    if op != "cast" and (dtype in INT_DTYPES or builtins.any(v.dtype in INT_DTYPES for v in inputs)):
        quant.compute_dtype(op, [v.dtype for v in inputs] or [dtype])
    graph = current_graph()
    value = _folded(graph, op, inputs, shape, attrs)
    if value is not None:
        op, inputs, attrs = "const", [], {"value": value}
    out = graph.add(op, inputs, TensorType(tuple(shape), dtype), _group_stack[0] if _group_stack else None,
                    **attrs)
    return Tensor(out, graph)


def _wider(a: str, b: str) -> str:
    if a in INT_DTYPES or b in INT_DTYPES:
        if a == b:
            return a
        raise UnsupportedError(f"operands of dtypes {a} and {b}: integer tensors combine only with integer "
                               "tensors of their dtype; dequantize or astype first")
    order = ["f16", "bf16", "f32", "f64"]
    if {a, b} == {"f16", "bf16"}:
        return "f32"
    return a if order.index(a) >= order.index(b) else b


def _const(value: Any, dtype: str, *, copy: bool = True) -> Tensor:
    """A constant of ``value`` in ``dtype``, held as a read-only C-order array: the kernel reads a constant
    as a dense row-major buffer, whatever the strides of ``value``.

    ``copy=True`` holds a snapshot: later changes to ``value`` do not reach the kernel. ``copy=False`` is
    for a frontend whose arrays cannot change behind the kernel's back (torch's frozen parameters, which it
    checks on every call): a large ``value`` that is already C-contiguous and of the right dtype is then
    held without a copy, so a model's weights are not duplicated in memory; one that is not (a
    channels-last or transposed weight, any strided view, another dtype) is copied once, to C order."""
    array = np.asarray(value)
    if array.dtype.kind not in "biuf" and array.dtype.name not in NUMPY_TO_DTYPE:  # bfloat16 is kind "V"
        raise UnsupportedError(f"constant of dtype {array.dtype} is not supported")
    if any(d == 0 for d in array.shape):
        raise PbsdkError(f"constant of shape {array.shape} has an empty dimension")
    # Small constants are held in float64 (folding reads them), large ones (frozen weights) in the graph's
    # dtype, not widened.
    wide = array.size <= INLINE_LIMIT or dtype not in DTYPE_TO_NUMPY
    if copy or wide:
        held = np.array(array, dtype=np.float64 if wide else DTYPE_TO_NUMPY[dtype], order="C")
    else:
        held = np.asarray(array, dtype=DTYPE_TO_NUMPY[dtype], order="C")  # copies only when it must
    if held.flags.writeable:
        held = held.view()
        held.flags.writeable = False
    return _add("const", [], array.shape, dtype, value=held)


def _operands(*xs: Any) -> list[Tensor]:
    """Turn operands into tensors of one dtype: scalars take the tensors' dtype, mixed floats promote."""
    tensors = [x for x in xs if isinstance(x, Tensor)]
    arrays = [x for x in xs if isinstance(x, np.ndarray) and x.ndim > 0]
    if not tensors:
        raise PbsdkError("pbsdk.ops need at least one traced tensor operand (inside @pbsdk.jit)")
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = _wider(dtype, t.dtype)
    for a in arrays:
        if a.dtype.name in NUMPY_TO_DTYPE:
            dtype = _wider(dtype, NUMPY_TO_DTYPE[a.dtype.name])
    if dtype in INT_DTYPES:
        for x in xs:
            if not isinstance(x, Tensor) and not np.array_equal(np.asarray(x), np.round(np.asarray(x, np.float64))):
                raise UnsupportedError(f"a non-integer operand {x!r} with an {dtype} tensor; dequantize first")
    out = []
    for x in xs:
        if isinstance(x, Tensor):
            out.append(x if x.dtype == dtype else astype(x, dtype))
        elif isinstance(x, (int, float, bool, np.generic, np.ndarray)):
            out.append(_const(x, dtype))
        else:
            raise PbsdkError(f"unsupported operand of type {type(x).__name__}")
    return out


def _broadcast_shape(op: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    rank = builtins.max(len(s) for s in shapes)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0} - {1}
        if len(dims) > 1:
            raise PbsdkError(f"{op}: shapes {' and '.join(map(str, shapes))} cannot be broadcast together")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _binary(op: str, a: Any, b: Any) -> Tensor:
    x, y = _operands(a, b)
    shape = _broadcast_shape(op, x.shape, y.shape)
    return _add(op, [x.value, y.value], shape, x.dtype)


def _unary(op: str, x: Any, **attrs: Any) -> Tensor:
    (t,) = _operands(x)
    return _add(op, [t.value], t.shape, t.dtype, **attrs)


def add(a: Any, b: Any) -> Tensor: return _binary("add", a, b)
def sub(a: Any, b: Any) -> Tensor: return _binary("sub", a, b)
def mul(a: Any, b: Any) -> Tensor: return _binary("mul", a, b)
def div(a: Any, b: Any) -> Tensor: return _binary("div", a, b)
def maximum(a: Any, b: Any) -> Tensor: return _binary("maximum", a, b)
def minimum(a: Any, b: Any) -> Tensor: return _binary("minimum", a, b)
def pow(a: Any, b: Any) -> Tensor: return _binary("pow", a, b)
def fmod(a: Any, b: Any) -> Tensor: return _binary("fmod", a, b)
def bitwise_and(a: Any, b: Any) -> Tensor: return _binary("bitwise_and", a, b)
def bitwise_or(a: Any, b: Any) -> Tensor: return _binary("bitwise_or", a, b)
def bitwise_xor(a: Any, b: Any) -> Tensor: return _binary("bitwise_xor", a, b)


def remainder(a: Any, b: Any) -> Tensor:
    """``a mod b`` with the sign of ``b`` (numpy's and Python's ``%``; ``fmod`` has ``a``'s sign)."""
    x, y = _operands(a, b)
    r = fmod(x, y)
    wrong_sign = mul(not_equal(r, 0.0), not_equal(less(r, 0.0), less(y, 0.0)))
    return where(wrong_sign, add(r, y), r)


def floor_divide(a: Any, b: Any) -> Tensor:
    """``floor(a / b)`` computed as ``(a - remainder(a, b)) / b``: exact for whole numbers (torch's
    formula for floats, with its rounding of the quotient)."""
    x, y = _operands(a, b)
    q = div(sub(x, remainder(x, y)), y)
    fq = floor(q)
    fq = where(greater(sub(q, fq), 0.5), add(fq, 1.0), fq)
    return where(equal(y, 0.0), div(x, y), fq)  # x / 0: +-inf or NaN, as the plain quotient


def bitwise_not(x: Any) -> Tensor:
    """``~x`` of whole numbers (two's complement: ``-x - 1``)."""
    return sub(neg(x), 1.0)


def neg(x: Any) -> Tensor: return _unary("neg", x)
def exp(x: Any) -> Tensor: return _unary("exp", x)
def log(x: Any) -> Tensor: return _unary("log", x)
def tanh(x: Any) -> Tensor: return _unary("tanh", x)
def sigmoid(x: Any) -> Tensor: return _unary("sigmoid", x)
def relu(x: Any) -> Tensor: return _unary("relu", x)
def erf(x: Any) -> Tensor: return _unary("erf", x)
def sqrt(x: Any) -> Tensor: return _unary("sqrt", x)
def rsqrt(x: Any) -> Tensor: return _unary("rsqrt", x)
def abs(x: Any) -> Tensor: return _unary("abs", x)
def log1p(x: Any) -> Tensor: return _unary("log1p", x)
def expm1(x: Any) -> Tensor: return _unary("expm1", x)
def sin(x: Any) -> Tensor: return _unary("sin", x)
def cos(x: Any) -> Tensor: return _unary("cos", x)
def tan(x: Any) -> Tensor: return _unary("tan", x)
def floor(x: Any) -> Tensor: return _unary("floor", x)
def ceil(x: Any) -> Tensor: return _unary("ceil", x)
def trunc(x: Any) -> Tensor: return _unary("trunc", x)
def sign(x: Any) -> Tensor: return _unary("sign", x)


def round(x: Any) -> Tensor:
    """Round to the nearest integer, halves to even (``numpy.round`` with ``decimals=0``)."""
    return _unary("round", x)


def isnan(x: Any) -> Tensor:
    """1 where ``x`` is NaN, else 0 (a mask in ``x``'s dtype)."""
    (t,) = _operands(x)
    return not_equal(t, t)


def isinf(x: Any) -> Tensor:
    """1 where ``x`` is +-inf, else 0."""
    return equal(abs(x), math.inf)


def isfinite(x: Any) -> Tensor:
    """1 where ``x`` is neither infinite nor NaN, else 0."""
    return less(abs(x), math.inf)


def gelu(x: Any, approximate: str = "none") -> Tensor:
    """GELU: ``x * Phi(x)`` exactly (``approximate="none"``) or with the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise PbsdkError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu" if approximate == "none" else "gelu_tanh", x)


def astype(x: Tensor, dtype: Any) -> Tensor:
    """Convert to another dtype (``"f32"``, ``"f16"``, ``np.float32``, ``"i8"``, ``"i32"``, ...); float to
    integer truncates toward zero (numpy's astype; out-of-range values are undefined: clamp first)."""
    name = (dtype if isinstance(dtype, str) and dtype in FLOAT_DTYPES + INT_DTYPES
            else NUMPY_TO_DTYPE.get(np.dtype(dtype).name))
    if name is None:
        raise UnsupportedError(f"astype: dtype {dtype} is not supported")
    if name == x.dtype:
        return x
    widened = _widened.get((id(x.graph), x.value.id))
    if widened is not None and widened[0]() is x.graph and widened[1].dtype == name:
        return widened[1]  # an integer carried as a float and cast back: the integer itself
    out = _add("cast", [x.value], x.shape, name)
    if x.dtype in INT_DTYPES and name in ("f32", "f64"):  # exact: remember the way back
        _widened[(id(x.graph), out.value.id)] = (weakref.ref(x.graph), x)
    return out


#: Integer tensors cast exactly to a float, by (graph id, value id) of the float (see `astype`).
_widened: dict[tuple[int, int], tuple[Any, Tensor]] = {}


#: Integers up to this magnitude are exact in each float dtype.
_EXACT_INTS = {"bf16": 2 ** 8, "f16": 2 ** 11, "f32": 2 ** 24, "f64": 2 ** 53}


def _exact_dtype(dtype: str, count: int) -> str:
    """The narrowest of ``dtype``, f32 and f64 that holds the indices ``0 .. count - 1`` exactly."""
    return next(d for d in (dtype, "f32", "f64") if count <= _EXACT_INTS[d])


def _acc_dtype(dtype: str) -> str:
    """Accumulate half-precision sums in f32 (what matrix units and careful libraries do), i8 in i32."""
    return "f32" if dtype in ("f16", "bf16") else quant.INT_ACCUMULATOR.get(dtype, dtype)


# ----------------------------------------------------------------------------------------------- layout

def _norm_axes(op: str, axis: Any, rank: int) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(rank))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, (int, np.integer)) or not -rank <= a < builtins.max(rank, 1):
            raise PbsdkError(f"{op}: axis {a} is out of range for a tensor of rank {rank}")
        out.append(int(a) % builtins.max(rank, 1))
    if len(set(out)) != len(out):
        raise PbsdkError(f"{op}: repeated axis in {axis}")
    return tuple(sorted(out))


def transpose(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """Permute dimensions (reverse them when ``axes`` is None), as ``numpy.transpose``."""
    (t,) = _operands(x)
    perm = tuple(reversed(range(t.ndim))) if axes is None else tuple(int(a) % builtins.max(t.ndim, 1) for a in axes)
    if sorted(perm) != list(range(t.ndim)):
        raise PbsdkError(f"transpose: axes {axes} is not a permutation of {t.ndim} dimensions")
    if perm == tuple(range(t.ndim)):
        return t
    out = _add("transpose", [t.value], tuple(t.shape[p] for p in perm), t.dtype, perm=perm)
    source = _dequantized_source(t)
    if source is not None:  # dequantize(q) permuted is dequantize(q permuted): the integer path sees through it
        q, qp = source
        moved = dataclasses.replace(qp, axis=perm.index(qp.axis)) if qp.axis is not None else qp
        _dequantized[(id(out.graph), out.value.id)] = (weakref.ref(out.graph), transpose(q, perm), moved)
    return out


def reshape(x: Tensor, shape: Sequence[int] | int) -> Tensor:
    """Reshape in row-major order; one dimension may be -1."""
    (t,) = _operands(x)
    dims = [int(shape)] if isinstance(shape, (int, np.integer)) else [_size(d) for d in shape]
    size = math.prod(t.shape)
    if dims.count(-1) > 1 or any(isinstance(d, int) and (d < -1 or d == 0) for d in dims):
        raise PbsdkError(f"reshape: invalid target shape {tuple(dims)}")
    if -1 in dims:
        known = math.prod(d for d in dims if not isinstance(d, int) or d != -1)
        if size % known:
            raise PbsdkError(f"reshape: cannot reshape {t.shape} into {tuple(dims)}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        raise PbsdkError(f"reshape: cannot reshape {t.shape} ({size} elements) into {tuple(dims)}")
    if tuple(dims) == t.shape:
        return t
    return _add("reshape", [t.value], tuple(dims), t.dtype)


def tile(x: Any, reps: Sequence[int] | int) -> Tensor:
    """``x`` repeated ``reps[i]`` times along axis i (``numpy.tile``)."""
    (t,) = _operands(x)
    r = (int(reps),) if isinstance(reps, (int, np.integer)) else tuple(int(v) for v in reps)
    if builtins.any(v < 1 for v in r):
        raise PbsdkError(f"tile: repetitions must be positive, got {reps!r}")
    rank = builtins.max(len(r), t.ndim)
    r = (1,) * (rank - len(r)) + r
    shape = (1,) * (rank - t.ndim) + t.shape
    # (r0, s0, r1, s1, ...) by broadcasting a (1, s0, 1, s1, ...) view, then merged pairwise
    spread = reshape(t, tuple(v for d in shape for v in (1, d)))
    spread = broadcast_to(spread, tuple(v for rd in zip(r, shape) for v in rd))
    return reshape(spread, tuple(a * b for a, b in zip(r, shape)))


def broadcast_to(x: Tensor, shape: Sequence[int]) -> Tensor:
    (t,) = _operands(x)
    out = _broadcast_shape("broadcast_to", t.shape, tuple(shape))
    if out != tuple(shape):
        raise PbsdkError(f"broadcast_to: cannot broadcast {t.shape} to {tuple(shape)}")
    if out == t.shape:
        return t
    return _add("broadcast", [t.value], out, t.dtype)


# ------------------------------------------------------------------------------------------- reductions

def _reduce(op: str, name: str, x: Any, axis: Any, keepdims: bool) -> Tensor:
    (t,) = _operands(x)
    axes = _norm_axes(name, axis, t.ndim)
    if not axes:
        return t
    kept = tuple(d for i, d in enumerate(t.shape) if i not in axes)
    acc = _acc_dtype(t.dtype) if op == "reduce_sum" else t.dtype
    out = _add(op, [t.value], kept, acc, axes=axes)
    if acc != t.dtype:
        out = astype(out, t.dtype)
    if keepdims:
        out = reshape(out, tuple(1 if i in axes else d for i, d in enumerate(t.shape))) if kept else \
            reshape(out, (1,) * t.ndim) if t.ndim else out
    return out


def sum(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return _reduce("reduce_sum", "sum", x, axis, keepdims)


def max(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return _reduce("reduce_max", "max", x, axis, keepdims)


def min(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    return _reduce("reduce_min", "min", x, axis, keepdims)


def prod(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Product over ``axis`` (``numpy.prod``)."""
    return _reduce("reduce_prod", "prod", x, axis, keepdims)


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    (t,) = _operands(x)
    axes = _norm_axes("mean", axis, t.ndim)
    count = math.prod(t.shape[a] for a in axes)
    with _group("mean"):
        return mul(sum(t, axes, keepdims), 1.0 / count)


def _arg_extreme(op: str, x: Any, axis: int | None, keepdims: bool, largest: bool) -> tuple[Tensor, Tensor]:
    """The max (or min) along ``axis`` and the index of its first occurrence — of the first NaN where there
    is one, which is then the extreme (numpy's and torch's rule) — as two reductions: the extreme, then
    the least index whose element equals it (or is NaN). Indices are floats of a dtype that holds them."""
    (t,) = _operands(x)
    if axis is None:
        t = reshape(t, (math.prod(t.shape),))
        axis = 0
    (ax,) = _norm_axes(op, axis, builtins.max(t.ndim, 1))
    if t.ndim == 0:
        return t, _const(0.0, t.dtype)
    n = t.shape[ax]
    with _group(op):
        ext = (max if largest else min)(t, ax, keepdims=True)
        hit = maximum(equal(t, ext), isnan(t))
        idx_dtype = _exact_dtype(t.dtype, n + 1)
        iota = _const(np.arange(n, dtype=np.float64).reshape((n,) + (1,) * (t.ndim - 1 - ax)), idx_dtype)
        index = min(where(hit, iota, float(n)), ax, keepdims=keepdims)
    return (ext if keepdims else reshape(ext, index.shape)), index


def argmax(x: Any, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the first maximum along ``axis`` (of the flattened tensor when None), as ``numpy.argmax``
    (a NaN counts as the maximum), as a float tensor of whole numbers."""
    return _arg_extreme("argmax", x, axis, keepdims, True)[1]


def argmin(x: Any, axis: int | None = None, keepdims: bool = False) -> Tensor:
    """Index of the first minimum along ``axis``, as ``numpy.argmin``."""
    return _arg_extreme("argmin", x, axis, keepdims, False)[1]


def max_with_index(x: Any, axis: int, keepdims: bool = False) -> tuple[Tensor, Tensor]:
    """``(max, argmax)`` along ``axis`` from one comparison pass (``torch.max(x, dim)``)."""
    return _arg_extreme("argmax", x, axis, keepdims, True)


def min_with_index(x: Any, axis: int, keepdims: bool = False) -> tuple[Tensor, Tensor]:
    """``(min, argmin)`` along ``axis`` (``torch.min(x, dim)``)."""
    return _arg_extreme("argmin", x, axis, keepdims, False)


#: `sort` and `topk` rank each element against every other one along the axis: at most this many pairs.
MAX_RANK_PAIRS = 1 << 24


def _stable_ranks(t: Tensor, descending: bool) -> Tensor:
    """Each element's position in a stable sort of ``t`` along its last axis, NaN above every number (torch's
    order): the count of elements that come before it, ``rank[i] = #{j : t[j] before t[i]}``, where ``j``
    comes before ``i`` when its value is smaller (larger when ``descending``), or equal with ``j < i``."""
    n = t.shape[-1]
    xi, xj = reshape(t, t.shape + (1,)), reshape(t, t.shape[:-1] + (1, n))
    iota = _const(np.arange(n, dtype=np.float64), t.dtype if n <= _EXACT_INTS.get(t.dtype, 0) else "f64")
    earlier = less(reshape(iota, (1, n)), reshape(iota, (n, 1)))  # [i, j] = j < i
    nan_i, nan_j = isnan(xi), isnan(xj)
    tie = maximum(equal(xj, xi), mul(nan_i, nan_j))
    if descending:  # j first: a greater value, or NaN where i is a number
        first = maximum(greater(xj, xi), mul(nan_j, sub(1.0, nan_i)))
    else:  # j first: a smaller value, or a number where i is NaN
        first = maximum(less(xj, xi), mul(nan_i, sub(1.0, nan_j)))
    before = maximum(first, mul(tie, astype(earlier, tie.dtype)))
    return sum(astype(before, _exact_dtype("f32", n + 1)), -1)


def _by_rank(t: Tensor, ranks: Tensor, count: int) -> tuple[Tensor, Tensor]:
    """The elements of ranks ``0 .. count - 1`` along the last axis and their indices: ``index[r]`` is the
    ``i`` whose rank is ``r`` (ranks are a permutation, so exactly one term of the sum is nonzero)."""
    n = t.shape[-1]
    idx_dtype = _exact_dtype("f32", n + 1)
    slots = _const(np.arange(count, dtype=np.float64).reshape(count, 1), ranks.dtype)
    hit = equal(reshape(ranks, ranks.shape[:-1] + (1, n)), slots)  # [..., r, i] = rank[i] == r
    iota = _const(np.arange(n, dtype=np.float64), idx_dtype)
    index = sum(where(hit, iota, 0.0), -1)
    return take_along_axis(t, index, -1), index


def _ranked(op: str, x: Any, axis: int, count: int | None, descending: bool) -> tuple[Tensor, Tensor]:
    (t,) = _operands(x)
    if t.ndim == 0:
        return t, _const(0.0, "f32")
    (ax,) = _norm_axes(op, axis, t.ndim)
    n = t.shape[ax]
    if n * math.prod(t.shape) > MAX_RANK_PAIRS:
        raise UnsupportedError(f"{op}: {math.prod(t.shape) // n} rows of {n} elements need more than "
                               f"{MAX_RANK_PAIRS} comparisons (every pair is ranked)")
    perm = [d for d in range(t.ndim) if d != ax] + [ax]
    back = [perm.index(d) for d in range(t.ndim)]
    with _group(op):
        last = transpose(t, perm) if ax != t.ndim - 1 else t
        values, index = _by_rank(last, _stable_ranks(last, descending), n if count is None else count)
        if ax != t.ndim - 1:
            values, index = transpose(values, back), transpose(index, back)
    return values, index


def sort(x: Any, axis: int = -1, *, descending: bool = False) -> tuple[Tensor, Tensor]:
    """``(values, indices)`` of a stable sort along ``axis`` (``torch.sort(stable=True)``; NaN sorts as the
    largest value); the indices are floats of whole numbers. Every pair along the axis is compared, so it is
    meant for modest lengths (at most `MAX_RANK_PAIRS` comparisons in all)."""
    return _ranked("sort", x, axis, None, descending)


def topk(x: Any, k: int, axis: int = -1, *, largest: bool = True) -> tuple[Tensor, Tensor]:
    """``(values, indices)`` of the ``k`` largest (smallest) elements along ``axis``, in order, the earlier
    of equal elements first (``torch.topk``; NaN is the largest). Ranks every pair, as `sort`."""
    (t,) = _operands(x)
    n = t.shape[axis] if t.ndim else 1
    if not 0 <= k <= n:
        raise PbsdkError(f"topk: k={k} is outside 0..{n}")
    return _ranked("topk", t, axis, k, largest)


def _scan(op: str, x: Any, axis: int | None, combine: Any, identity: float, reverse: bool = False) -> Tensor:
    """Inclusive scan along ``axis`` (the flattened tensor when None) in ceil(log2 n) steps
    (Hillis–Steele): step k combines every element with the one 2**k before it (``identity`` before the
    start). Each step is a shifted view and one elementwise op, which every target tiles."""
    (t,) = _operands(x)
    if axis is None:
        t = reshape(t, (math.prod(t.shape),))
        axis = 0
    if t.ndim == 0:
        return t
    (ax,) = _norm_axes(op, axis, t.ndim)
    n = t.shape[ax]
    with _group(op):
        if reverse:
            t = flip(t, ax)
        shift = 1
        while shift < n:
            widths = [(shift, 0) if i == ax else (0, 0) for i in range(t.ndim)]
            t = combine(t, _pad(slice(t, ax, 0, n - shift), widths, identity))
            shift *= 2
        return flip(t, ax) if reverse else t


def cumsum(x: Any, axis: int | None = None, *, reverse: bool = False) -> Tensor:
    """Cumulative sum along ``axis`` (``numpy.cumsum``); ``reverse`` sums from the end. Half-precision
    inputs are summed in f32."""
    (t,) = _operands(x)
    acc = _acc_dtype(t.dtype)
    out = _scan("cumsum", astype(t, acc), axis, add, 0.0, reverse)
    return astype(out, t.dtype)


def cumprod(x: Any, axis: int | None = None, *, reverse: bool = False) -> Tensor:
    """Cumulative product along ``axis`` (``numpy.cumprod``)."""
    return _scan("cumprod", x, axis, mul, 1.0, reverse)


def cummax(x: Any, axis: int | None = None, *, reverse: bool = False) -> Tensor:
    """Running maximum along ``axis`` (``numpy.maximum.accumulate``; NaN propagates)."""
    return _scan("cummax", x, axis, maximum, -math.inf, reverse)


def cummin(x: Any, axis: int | None = None, *, reverse: bool = False) -> Tensor:
    """Running minimum along ``axis``."""
    return _scan("cummin", x, axis, minimum, math.inf, reverse)


def vector_norm(x: Any, ord: float = 2, axis: Any = None, keepdims: bool = False) -> Tensor:
    """The vector ``ord``-norm over ``axis`` (every axis when None), as ``numpy.linalg.vector_norm``:
    ``sum(|x|**ord)**(1/ord)``; ``inf``/``-inf`` the largest/smallest ``|x|``, 0 the count of nonzeros."""
    (t,) = _operands(x)
    a = abs(t)
    with _group("vector_norm"):
        if ord == math.inf:
            return max(a, axis, keepdims)
        if ord == -math.inf:
            return min(a, axis, keepdims)
        if ord == 0:
            return sum(not_equal(t, 0.0), axis, keepdims)
        if ord == 1:
            return sum(a, axis, keepdims)
        if ord == 2:
            return sqrt(sum(mul(t, t), axis, keepdims))
        return pow(sum(pow(a, float(ord)), axis, keepdims), 1.0 / float(ord))


def softmax(x: Any, axis: int = -1) -> Tensor:
    """``exp(x - max) / sum(exp(x - max))`` along ``axis`` (numerically stable)."""
    (t,) = _operands(x)
    with _group("softmax"):
        shifted = sub(t, max(t, axis, keepdims=True))
        e = exp(shifted)
        return div(e, sum(e, axis, keepdims=True))


def log_softmax(x: Any, axis: int = -1) -> Tensor:
    (t,) = _operands(x)
    with _group("log_softmax"):
        shifted = sub(t, max(t, axis, keepdims=True))
        return sub(shifted, log(sum(exp(shifted), axis, keepdims=True)))


def layernorm(x: Any, weight: Any = None, bias: Any = None, *, axis: Any = -1, eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing ``axis`` (int or tuple), then scale by ``weight`` and shift by ``bias``."""
    (t,) = _operands(x)
    axes = _norm_axes("layernorm", axis, t.ndim)
    if axes != tuple(range(t.ndim - len(axes), t.ndim)):
        raise PbsdkError(f"layernorm: axis {axis} must name trailing dimensions of a rank-{t.ndim} tensor")
    norm_shape = tuple(t.shape[a] for a in axes)
    for label, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(np.shape(p) if not isinstance(p, Tensor) else p.shape) != norm_shape:
            raise PbsdkError(f"layernorm: {label} has shape {tuple(np.shape(p) if not isinstance(p, Tensor) else p.shape)}, "
                             f"expected the normalised shape {norm_shape}")
    with _group("layernorm"):
        centred = sub(t, mean(t, axes, keepdims=True))
        var = mean(mul(centred, centred), axes, keepdims=True)
        out = mul(centred, rsqrt(add(var, eps)))
        if weight is not None:
            out = mul(out, weight)
        if bias is not None:
            out = add(out, bias)
        return out


def _moments(t: Tensor, axes: tuple[int, ...]) -> tuple[Tensor, Tensor]:
    """Mean and biased variance over ``axes`` (kept as size-1 dimensions), two-pass."""
    m = mean(t, axes, keepdims=True)
    centred = sub(t, m)
    return m, mean(mul(centred, centred), axes, keepdims=True)


def _channel_affine(out: Tensor, weight: Any, bias: Any) -> Tensor:
    """``out * weight + bias`` with per-channel (axis 1) ``weight`` and ``bias`` (either may be None)."""
    shape = (1, -1) + (1,) * (out.ndim - 2)
    if weight is not None:
        out = mul(out, reshape(_operands(weight)[0], shape))
    if bias is not None:
        out = add(out, reshape(_operands(bias)[0], shape))
    return out


def group_norm(x: Any, num_groups: int, weight: Any = None, bias: Any = None, *, eps: float = 1e-5) -> Tensor:
    """Normalise each sample's channels (axis 1) in ``num_groups`` groups over the group's channels and
    all spatial positions, then scale and shift per channel (``torch.nn.functional.group_norm``)."""
    (t,) = _operands(x)
    if t.ndim < 2 or not isinstance(num_groups, (int, np.integer)) or num_groups < 1 or t.shape[1] % num_groups:
        raise PbsdkError(f"group_norm: {num_groups} groups do not divide the channels of {t.shape}")
    with _group("group_norm"):
        n = t.shape[0]
        grouped = reshape(t, (n, int(num_groups), -1))
        m, var = _moments(grouped, (2,))
        out = reshape(mul(sub(grouped, m), rsqrt(add(var, eps))), t.shape)
        return _channel_affine(out, weight, bias)


def instance_norm(x: Any, weight: Any = None, bias: Any = None, *, eps: float = 1e-5) -> Tensor:
    """Normalise each (sample, channel) over its spatial positions, then scale and shift per channel."""
    (t,) = _operands(x)
    if t.ndim < 3:
        raise PbsdkError(f"instance_norm: input must have spatial dimensions, got {t.shape}")
    return group_norm(t, t.shape[1], weight, bias, eps=eps)


def batch_norm(x: Any, mean: Any = None, var: Any = None, weight: Any = None, bias: Any = None, *,
               eps: float = 1e-5) -> Tensor:
    """Normalise each channel (axis 1) with the given statistics (inference), or with the batch's own
    (biased) statistics over every other axis when ``mean`` and ``var`` are None (training)."""
    (t,) = _operands(x)
    if (mean is None) != (var is None):
        raise PbsdkError("batch_norm: give both mean and var, or neither")
    with _group("batch_norm"):
        if mean is None:
            m, v = _moments(t, tuple(a for a in range(t.ndim) if a != 1))
        else:
            shape = (1, -1) + (1,) * (t.ndim - 2)
            m, v = reshape(_operands(mean)[0], shape), reshape(_operands(var)[0], shape)
        return _channel_affine(mul(sub(t, m), rsqrt(add(v, eps))), weight, bias)


# ---------------------------------------------------------------------------------------- contractions

def matmul(a: Any, b: Any, *, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """numpy.matmul semantics (batch dims broadcast, 1-D operands promoted); ``transpose_a/b`` swap the
    last two dims of that operand first (no copy: the contraction reads it transposed)."""
    x, y = _operands(a, b)
    if x.ndim == 0 or y.ndim == 0:
        raise PbsdkError(f"matmul: operands must have rank >= 1, got shapes {x.shape} and {y.shape}")
    squeeze_m = x.ndim == 1
    squeeze_n = y.ndim == 1
    if squeeze_m:
        x, transpose_a = reshape(x, (1, x.shape[0])), False
    if squeeze_n:
        y, transpose_b = reshape(y, (y.shape[0], 1)), False
    m, ka = (x.shape[-1], x.shape[-2]) if transpose_a else (x.shape[-2], x.shape[-1])
    kb, n = (y.shape[-1], y.shape[-2]) if transpose_b else (y.shape[-2], y.shape[-1])
    if ka != kb:
        raise PbsdkError(f"matmul: contraction dimensions differ: {x.shape}{'^T' if transpose_a else ''} @ "
                         f"{y.shape}{'^T' if transpose_b else ''} ({ka} vs {kb})")
    batch = _broadcast_shape("matmul (batch dimensions)", x.shape[:-2], y.shape[:-2])
    quantized = _quantized_matmul(x, y, transpose_a, transpose_b)
    if quantized is not None:
        out = quantized
        if squeeze_m or squeeze_n:
            shape = batch + ((m,) if not squeeze_m else ()) + ((n,) if not squeeze_n else ())
            out = reshape(out, shape) if shape else reshape(out, ())
        return out
    acc = _acc_dtype(x.dtype)
    out = _add("matmul", [x.value, y.value], batch + (m, n), acc, transpose_a=transpose_a,
               transpose_b=transpose_b)
    if acc != x.dtype and x.dtype not in INT_DTYPES:  # i8 @ i8 is the exact i32 accumulator
        out = astype(out, x.dtype)
    if squeeze_m or squeeze_n:
        shape = batch + ((m,) if not squeeze_m else ()) + ((n,) if not squeeze_n else ())
        out = reshape(out, shape) if shape else reshape(out, ())
    return out


def _pair(op: str, name: str, v: Any) -> tuple[int, int]:
    pair = (v, v) if isinstance(v, (int, np.integer)) else tuple(v)
    if len(pair) != 2 or not builtins.all(isinstance(p, (int, np.integer)) and p >= 1 for p in pair):
        raise PbsdkError(f"{op}: {name} must be a positive int or a pair of them, got {v!r}")
    return int(pair[0]), int(pair[1])


def _padding(v: Any) -> tuple[tuple[int, int], tuple[int, int]]:
    if isinstance(v, (int, np.integer)):
        pads = ((int(v), int(v)), (int(v), int(v)))
    else:
        items = tuple(v)
        if len(items) == 2 and builtins.all(isinstance(p, (int, np.integer)) for p in items):
            pads = ((int(items[0]),) * 2, (int(items[1]),) * 2)
        elif len(items) == 2 and builtins.all(len(tuple(p)) == 2 for p in items):
            pads = tuple((int(p[0]), int(p[1])) for p in items)  # type: ignore[assignment]
        else:
            raise PbsdkError(f"conv2d: padding must be an int, (ph, pw) or ((top, bottom), (left, right)), got {v!r}")
    if builtins.any(p < 0 for pair in pads for p in pair):
        raise PbsdkError(f"conv2d: padding must be non-negative, got {v!r}")
    return pads  # type: ignore[return-value]


def conv2d(x: Any, w: Any, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1,
           layout: str = "NCHW") -> Tensor:
    """2-D cross-correlation. NCHW: x (N, C, H, W), w (O, C/groups, KH, KW). NHWC: x (N, H, W, C),
    w (KH, KW, C/groups, O). ``padding`` is an int, (ph, pw) or ((top, bottom), (left, right))."""
    t, k = _operands(x, w)
    if layout not in ("NCHW", "NHWC"):
        raise PbsdkError(f"conv2d: layout must be 'NCHW' or 'NHWC', got {layout!r}")
    if t.ndim != 4 or k.ndim != 4:
        raise PbsdkError(f"conv2d: input and weight must be 4-D, got {t.shape} and {k.shape}")
    sh, sw = _pair("conv2d", "stride", stride)
    dh, dw = _pair("conv2d", "dilation", dilation)
    pads = _padding(padding)
    if layout == "NCHW":
        n, c, h, wd = t.shape
        o, cg, kh, kw = k.shape
    else:
        n, h, wd, c = t.shape
        kh, kw, cg, o = k.shape
    if not isinstance(groups, (int, np.integer)) or groups < 1 or c % groups or o % groups:
        raise PbsdkError(f"conv2d: groups={groups} must divide input channels {c} and output channels {o}")
    if cg * groups != c:
        raise PbsdkError(f"conv2d: weight {k.shape} expects {cg * groups} input channels "
                         f"({cg} per group x {groups} groups), input {t.shape} has {c}")
    oh = (h + pads[0][0] + pads[0][1] - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + pads[1][0] + pads[1][1] - dw * (kw - 1) - 1) // sw + 1
    if oh < 1 or ow < 1:
        raise PbsdkError(f"conv2d: kernel {kh}x{kw} (dilation {dh}x{dw}) does not fit the padded input "
                         f"{h}x{wd}")
    shape = (n, o, oh, ow) if layout == "NCHW" else (n, oh, ow, o)
    attrs = {"stride": (sh, sw), "dilation": (dh, dw), "padding": pads, "groups": int(groups), "layout": layout}
    quantized = _quantized_conv2d(t, k, attrs, shape)
    if quantized is not None:
        return quantized
    acc = _acc_dtype(t.dtype)
    out = _add("conv2d", [t.value, k.value], shape, acc, **attrs)
    return astype(out, t.dtype) if acc != t.dtype and t.dtype not in INT_DTYPES else out


def _quantized_conv2d(x: Tensor, w: Tensor, attrs: Mapping[str, Any], shape: tuple[int, ...]) -> Tensor | None:
    """``conv2d(dequantize(xq), dequantize(wq))`` as the i8 convolution with exact i32 accumulation, rescaled
    once per output channel (as `_quantized_matmul`). The input zero point is folded in as
    ``zx * conv2d(1, wq)`` over the same padding (padded taps hold a real 0, not ``zx``): a constant-input
    i8 convolution. None (the float convolution) unless both are i8 dequantize results, ``x`` per tensor
    and ``w`` symmetric per tensor or per output channel."""
    xs, ws = _dequantized_source(x), _dequantized_source(w)
    if xs is None or ws is None:
        return None
    (xq, xp), (wq, wp) = xs, ws
    o_axis = 0 if attrs["layout"] == "NCHW" else 3
    c_axis = 1 if attrs["layout"] == "NCHW" else 3
    plan = quant.plan_integer_contraction(xp, wp, channel_axis=o_axis)
    if not plan.integer:
        _log.info("conv2d of dequantized operands runs in float: %s", plan.reason)
        return None
    with _group("quantized_conv2d"):
        w_value = _const_value(wq.graph, wq.value)
        zx = int(xp.zero_point[0])
        if zx != 0 and w_value is not None:
            # A frozen weight: the input padded with its zero point (a real 0), so every tap of every output
            # carries (x - zx) * w and the correction is zx times each output channel's weight sum, one
            # constant per channel, made here once (a per-position map would be read in full by the kernel).
            acc = _add("conv2d", [xq.value, wq.value], shape, "i32", **attrs, pad_value=zx)
            sums = w_value.astype(np.int64).sum(axis=(1, 2, 3) if attrs["layout"] == "NCHW" else (0, 1, 2)) * zx
            cshape = [1, 1, 1, 1]
            cshape[c_axis] = sums.size
            return _requantized_conv(sub(acc, _const(sums.reshape(cshape).astype(np.int32), "i32")), xp, wp,
                                     c_axis, x.dtype)
        acc = _add("conv2d", [xq.value, wq.value], shape, "i32", **attrs)
        if xp.zero_point[0] != 0:
            one_shape = list(xq.shape)
            one_shape[0] = 1
            ones = _const(np.ones(one_shape), "i8")
            corr = _add("conv2d", [ones.value, wq.value], (1, *shape[1:]), "i32", **attrs)
            acc = sub(acc, mul(corr, xp.zero_point[0]))
        return _requantized_conv(acc, xp, wp, c_axis, x.dtype)


def _requantized_conv(acc: Tensor, xp: quant.QuantParams, wp: quant.QuantParams, c_axis: int, dtype: str) -> Tensor:
    """A quantized convolution's i32 sum times its scales (per output channel along ``c_axis``), as ``dtype``."""
    scale = np.asarray(xp.scale[0] * np.asarray(wp.scale, np.float64), np.float32)
    if scale.size > 1:
        bshape = [1, 1, 1, 1]
        bshape[c_axis] = scale.size
        factor: Any = _const(scale.reshape(bshape), "f32")
    else:
        factor = float(scale[0])
    return astype(mul(astype(acc, "f32"), factor), dtype)


def _spatial(op: str, name: str, v: Any, n: int, *, low: int = 1) -> tuple[int, ...]:
    """An int or a sequence of ``n`` ints, each at least ``low``, as an n-tuple."""
    items = (v,) * n if isinstance(v, (int, np.integer)) else tuple(v)
    if len(items) != n or not builtins.all(isinstance(p, (int, np.integer)) and p >= low for p in items):
        raise PbsdkError(f"{op}: {name} must be an int >= {low} or {n} of them, got {v!r}")
    return tuple(int(p) for p in items)


def _conv_padding(op: str, v: Any, n: int) -> tuple[tuple[int, int], ...]:
    """An int, ``n`` ints (both sides) or ``n`` (before, after) pairs, as n pairs."""
    if isinstance(v, (int, np.integer)) or builtins.all(isinstance(p, (int, np.integer)) for p in v):
        return tuple((p, p) for p in _spatial(op, "padding", v, n, low=0))
    pairs = tuple(tuple(p) for p in v)
    if len(pairs) != n or not builtins.all(len(p) == 2 and builtins.min(p) >= 0 for p in pairs):
        raise PbsdkError(f"{op}: padding must be an int, {n} ints or {n} (before, after) pairs, got {v!r}")
    return tuple((int(a), int(b)) for a, b in pairs)


def conv1d(x: Any, w: Any, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
    """1-D cross-correlation: x (N, C, L), w (O, C/groups, K); run as a conv2d of height 1."""
    t, k = _operands(x, w)
    if t.ndim != 3 or k.ndim != 3:
        raise PbsdkError(f"conv1d: input and weight must be 3-D, got {t.shape} and {k.shape}")
    (s,), (d,) = _spatial("conv1d", "stride", stride, 1), _spatial("conv1d", "dilation", dilation, 1)
    (pad,) = _conv_padding("conv1d", padding, 1)
    out = conv2d(reshape(t, (t.shape[0], t.shape[1], 1, t.shape[2])), reshape(k, (k.shape[0], k.shape[1], 1, k.shape[2])),
                 stride=(1, s), padding=((0, 0), pad), dilation=(1, d), groups=groups)
    return reshape(out, (out.shape[0], out.shape[1], out.shape[3]))


def conv3d(x: Any, w: Any, *, stride: Any = 1, padding: Any = 0, dilation: Any = 1, groups: int = 1) -> Tensor:
    """3-D cross-correlation: x (N, C, D, H, W), w (O, C/groups, KD, KH, KW).

    Run as one conv2d: the KD depth taps each output depth reads are stacked into the channels
    ((N*OD, C*KD, H, W), a channel per (group, input channel, tap)) and the weight is viewed as
    (O, C/groups*KD, KH, KW), so the contraction is one matmul on targets that lower conv2d to one."""
    t, k = _operands(x, w)
    if t.ndim != 5 or k.ndim != 5:
        raise PbsdkError(f"conv3d: input and weight must be 5-D, got {t.shape} and {k.shape}")
    sd, sh, sw = _spatial("conv3d", "stride", stride, 3)
    dd, dh, dw = _spatial("conv3d", "dilation", dilation, 3)
    pads = _conv_padding("conv3d", padding, 3)
    n, c = t.shape[:2]
    o, cg, kd = k.shape[:3]
    if not isinstance(groups, (int, np.integer)) or groups < 1 or c % groups or o % groups or cg * groups != c:
        raise PbsdkError(f"conv3d: groups={groups} does not fit input {t.shape} and weight {k.shape}")
    with _group("conv3d"):
        t = pad(t, ((0, 0), (0, 0), pads[0], (0, 0), (0, 0)))
        od = (t.shape[2] - dd * (kd - 1) - 1) // sd + 1
        if od < 1:
            raise PbsdkError(f"conv3d: kernel depth {kd} (dilation {dd}) does not fit the padded input")
        h, wd = t.shape[3:]
        taps = [reshape(slice(t, 2, i * dd, i * dd + sd * (od - 1) + 1, sd), (n, c, 1, od, h, wd))
                for i in range(kd)]
        stacked = reshape(concatenate(taps, axis=2), (n, groups, cg, kd, od, h, wd))
        cols = reshape(transpose(stacked, (0, 4, 1, 2, 3, 5, 6)), (n * od, c * kd, h, wd))
        out = conv2d(cols, reshape(k, (o, cg * kd) + k.shape[3:]), stride=(sh, sw), padding=pads[1:],
                     dilation=(dh, dw), groups=groups)
        return transpose(reshape(out, (n, od) + out.shape[1:]), (0, 2, 1, 3, 4))


def _dilate(t: Tensor, factors: Sequence[int]) -> Tensor:
    """``t`` with ``factors[i] - 1`` zeros inserted between neighbouring elements along axis i (a
    convolution's input dilation)."""
    for a, s in enumerate(factors):
        if s > 1:
            shape = t.shape
            col = reshape(t, shape[:a + 1] + (1,) + shape[a + 1:])
            zeros = broadcast_to(_const(0.0, t.dtype), shape[:a + 1] + (s - 1,) + shape[a + 1:])
            t = reshape(concatenate([col, zeros], axis=a + 1), shape[:a] + (shape[a] * s,) + shape[a + 1:])
            t = slice(t, a, 0, (shape[a] - 1) * s + 1)
    return t


def conv_transpose(x: Any, w: Any, *, stride: Any = 1, padding: Any = 0, output_padding: Any = 0,
                   dilation: Any = 1, groups: int = 1, layout: str = "NCHW") -> Tensor:
    """Transposed convolution (the gradient of a convolution with respect to its input), 1-D to 3-D:
    x (N, Cin, *S), w (Cin, Cout/groups, *K), as ``torch.nn.functional.conv_transpose{1,2,3}d``; 2-D also
    with ``layout="NHWC"``: x (N, H, W, Cin) and the result (N, OH, OW, Cout), the weight as above.

    Run as the planner says (`pbsdk.core.plan.conv_transpose.plan_conv_transpose`): with a stride, one
    stride-1 convolution per output phase — the input, cropped or padded per phase, by the sub-kernel of
    that phase's taps (flipped, channel axes swapped) — interleaved into the output; with a dilated kernel
    (or stride 1), as a plain convolution: zeros inserted between the input's elements (``stride - 1`` of
    them), the result padded by ``dilation * (K - 1) - padding`` (plus ``output_padding`` after), then
    convolved with stride 1 by the weight with its spatial axes flipped and its channel axes swapped."""
    from pbsdk.core.plan.conv_transpose import plan_conv_transpose

    t, k = _operands(x, w)
    nsp = t.ndim - 2
    if nsp not in (1, 2, 3) or k.ndim != t.ndim:
        raise PbsdkError(f"conv_transpose: input and weight must both be 3-D to 5-D, got {t.shape} and {k.shape}")
    if layout not in ("NCHW", "NHWC") or (layout == "NHWC" and nsp != 2):
        raise PbsdkError(f"conv_transpose: layout must be 'NCHW' (or 'NHWC' for 2-D), got {layout!r}")
    nhwc = layout == "NHWC"
    strides = _spatial("conv_transpose", "stride", stride, nsp)
    dil = _spatial("conv_transpose", "dilation", dilation, nsp)
    pads = _spatial("conv_transpose", "padding", padding, nsp, low=0)
    extra = _spatial("conv_transpose", "output_padding", output_padding, nsp, low=0)
    cin, cout_g = k.shape[:2]
    channels = t.shape[-1] if nhwc else t.shape[1]
    if not isinstance(groups, (int, np.integer)) or groups < 1 or cin % groups or channels != cin:
        raise PbsdkError(f"conv_transpose: groups={groups} does not fit input {t.shape} and weight {k.shape}")
    if builtins.any(e >= builtins.max(s, d) for e, s, d in zip(extra, strides, dil)):
        raise PbsdkError(f"conv_transpose: output_padding {extra} must be smaller than stride or dilation")
    ksp = k.shape[2:]
    spatial = t.shape[1:3] if nhwc else t.shape[2:]
    plan = plan_conv_transpose(spatial, ksp, strides, pads, extra, dil, groups=int(groups))
    g = int(groups)
    with _group("conv_transpose"):
        if plan.route == "matmul":
            return _conv_transpose_product(t, k, strides, pads, extra, nhwc)
        # The weight as a convolution's (O, C/groups, *K): the channel axes swapped within each group.
        kt = reshape(k, (g, cin // g, cout_g) + ksp)
        kt = reshape(transpose(kt, (0, 2, 1) + tuple(range(3, k.ndim + 1))), (g * cout_g, cin // g) + ksp)
        conv = {1: conv1d, 2: conv2d, 3: conv3d}[nsp]
        if plan.route == "zeros":
            if nhwc:
                t = transpose(t, (0, 3, 1, 2))
            t = _dilate(t, (1, 1, *strides))
            edges = [(d * (kk - 1) - p, d * (kk - 1) - p + e) for d, kk, p, e in zip(dil, ksp, pads, extra)]
            t = _pad(t, ((0, 0), (0, 0), *edges), 0.0)
            out = conv(t, flip(kt, tuple(range(2, k.ndim))), dilation=dil, groups=g)
            return transpose(out, (0, 2, 3, 1)) if nhwc else out
        return _conv_transpose_phases(t, kt, plan, g, nhwc)


def _conv_transpose_product(t: Tensor, k: Tensor, strides: Sequence[int], pads: Sequence[int],
                            extra: Sequence[int], nhwc: bool) -> Tensor:
    """An ungrouped transposed convolution none of whose outputs two taps meet (`plan_conv_transpose`'s
    ``"matmul"``): the input's pixels (N*S, Cin) times the kernel as (Cin, K*Cout) — a constant for a frozen
    weight — gives every tap's contribution once; along each axis a pixel's K taps, padded with zeros to
    the stride where it exceeds the kernel (an input of one element: the taps alone), are its run of the
    output, and the runs laid end to end, cropped by the padding (zeros past the end for output padding),
    are the output."""
    nsp = t.ndim - 2
    n, cin = t.shape[0], k.shape[0]
    cout, ksp = k.shape[1], k.shape[2:]
    xs = t if nhwc else transpose(t, (0, *range(2, 2 + nsp), 1))
    sizes = xs.shape[1:1 + nsp]
    wm = reshape(transpose(k, (0, *range(2, 2 + nsp), 1)), (cin, math.prod(ksp) * cout))
    y = reshape(matmul(reshape(xs, (n * math.prod(sizes), cin)), wm), (n, *sizes, *ksp, cout))
    runs = [kk if size == 1 else s for size, kk, s in zip(sizes, ksp, strides)]
    widths = [(0, 0)] * (1 + nsp) + [(0, r - kk) for r, kk in zip(runs, ksp)] + [(0, 0)]
    if builtins.any(w for _, w in widths):
        y = _pad(y, widths, 0.0)
    order = (0, *(a for i in range(nsp) for a in (1 + i, 1 + nsp + i)), 1 + 2 * nsp)
    y = reshape(transpose(y, order), (n, *(size * r for size, r in zip(sizes, runs)), cout))
    outs = [(size - 1) * s - 2 * p + kk + e for size, s, p, kk, e in zip(sizes, strides, pads, ksp, extra)]
    crop = [(0, 0)] + [(-p, o + p - size * r) for p, o, size, r in zip(pads, outs, sizes, runs)] + [(0, 0)]
    if builtins.any(lo or hi for lo, hi in crop):
        y = _pad(y, crop, 0.0)
    return y if nhwc else transpose(y, (0, 1 + nsp, *range(1, 1 + nsp)))


#: A phase reads the input padded once for every phase (`_SharedPadding`) rather than padded for itself (a
#: copy of the input per phase) where the outputs it then computes and drops are at most this share of those
#: it keeps: a 28x28 phase computing 29x29 (7 %) shares; a 4x4 one computing 5x5 (56 % more multiply-adds
#: for a copy of 16 pixels) does not.
SHARED_PAD_WASTE = 1 / 8


@dataclasses.dataclass(frozen=True)
class _SharedPadding:
    """The input of a transposed convolution's phases padded once, by the most any phase needs before and
    after each spatial axis: a phase that needs padding convolves the whole of it (its window starts at 0,
    so the implicit GEMM reads it in place) and keeps its outputs' window of the result."""

    padded: Tensor
    before: tuple[int, ...]
    extent: tuple[int, ...]  # the padded spatial sizes

    def starts(self, combo: Sequence[Any], counts: Sequence[int]) -> tuple[int, ...] | None:
        """Where the phase's outputs start in its convolution of the padded input, or None where it needs
        no padding (it reads the input itself) or would compute more than `SHARED_PAD_WASTE` outputs it
        does not need for each it keeps."""
        if builtins.all(ph.pad_before <= 0 and ph.pad_after <= 0 for ph in combo):
            return None
        starts = tuple(b - ph.pad_before for b, ph in zip(self.before, combo))
        computed = [e - len(ph.taps) + 1 for e, ph in zip(self.extent, combo)]
        if builtins.any(c < n for c, n in zip(computed, counts)):
            return None
        return starts if math.prod(computed) <= (1 + SHARED_PAD_WASTE) * math.prod(counts) else None


def _shared_padding(t: Tensor, plan: Any, first: int) -> _SharedPadding | None:
    before = tuple(builtins.max([0] + [ph.pad_before for ph in a.phases if ph.taps]) for a in plan.axes)
    after = tuple(builtins.max([0] + [ph.pad_after for ph in a.phases if ph.taps]) for a in plan.axes)
    if not builtins.any(before + after):
        return None
    widths = [(0, 0)] * t.ndim
    for i, (b, a) in enumerate(zip(before, after)):
        widths[first + i] = (b, a)
    padded = pad(t, widths)
    return _SharedPadding(padded, before, tuple(padded.shape[first:first + len(plan.axes)]))


def _conv_nd(x: Tensor, w: Tensor, padding: tuple[tuple[int, int], ...], groups: int, nhwc: bool) -> Tensor:
    if x.ndim == 4:
        return conv2d(x, w, padding=padding or 0, groups=groups, layout="NHWC" if nhwc else "NCHW")
    conv = conv1d if x.ndim == 3 else conv3d
    return conv(x, w, padding=padding or 0, groups=groups)


def _conv_transpose_phases(t: Tensor, kt: Tensor, plan: Any, groups: int, nhwc: bool) -> Tensor:
    """A transposed convolution by output phases (`pbsdk.core.plan.conv_transpose`): ``kt`` is its weight
    as a convolution's (O, C/groups, *K); per combination of the axes' phases a stride-1 convolution of the
    input (cropped where a phase's padding is negative, padded where positive: each phase's window is then
    read in place by an implicit GEMM) by those taps, then each phase written once into its strided
    positions of the output (`interleave`; the last phases one short where the output is cropped). With a
    frozen weight the phases' sub-kernels are constants (slices, flips and transposes of a constant fold)."""
    from pbsdk.core.plan.conv_transpose import phase_combinations

    nsp = len(plan.axes)
    first = 1 if nhwc else 2  # the first spatial axis
    n = t.shape[0]
    cout = kt.shape[0]
    if nhwc:
        kt = transpose(kt, (2, 3, 1, 0))  # (KH, KW, C/groups, O), as conv2d takes it in NHWC
    k_first = 0 if nhwc else 2
    counts = tuple(a.count for a in plan.axes)
    shared = _shared_padding(t, plan, first)
    phases: dict[tuple[int, ...], Tensor] = {}
    for combo in phase_combinations(plan):
        key = tuple(ph.phase for ph in combo)
        out_shape = (n, *counts, cout) if nhwc else (n, cout, *counts)
        if builtins.any(not ph.taps for ph in combo):
            phases[key] = broadcast_to(_const(0.0, t.dtype), out_shape)
            continue
        wk = kt
        for i, ph in enumerate(combo):
            # The phase's taps in correlation order: an arithmetic run (step -stride), so a strided slice
            # read backwards: ascending from the smallest, then flipped.
            taps = sorted(ph.taps)
            wk = slice(wk, k_first + i, taps[0], taps[-1] + 1, plan.axes[i].stride)
            if len(taps) > 1:
                wk = flip(wk, k_first + i)
        starts = shared.starts(combo, counts) if shared is not None else None
        if shared is not None and starts is not None:
            # The whole padded input, read in place; the phase's outputs are a window of the result.
            y = _conv_nd(shared.padded, wk, (), groups, nhwc)
            for i, start in enumerate(starts):
                y = slice(y, first + i, start, start + counts[i])
        else:
            xin, pad_pairs = t, []
            for i, ph in enumerate(combo):
                lo, hi = ph.pad_before, ph.pad_after
                if lo < 0 or hi < 0:
                    xin = slice(xin, first + i, builtins.max(-lo, 0), xin.shape[first + i] - builtins.max(-hi, 0))
                pad_pairs.append((builtins.max(lo, 0), builtins.max(hi, 0)))
            y = _conv_nd(xin, wk, tuple(pad_pairs), groups, nhwc)
        phases[key] = y
    # One strided write of each phase into the output (the last phases one short where it is cropped).
    order = itertools.product(*(range(a.stride) for a in plan.axes))
    shape = list(phases[(0,) * nsp].shape)
    for i, a in enumerate(plan.axes):
        shape[first + i] = a.out
    return interleave([phases[key] for key in order], tuple(range(first, first + nsp)),
                      tuple(a.stride for a in plan.axes), tuple(shape))


# ---------------------------------------------------------------------------------------------- pooling
# Windowed reductions over the trailing spatial dimensions, built from one strided slice per window tap
# (as im2col does for conv2d) combined elementwise: the taps fuse into one elementwise op that every
# target tiles like any other. Windows that tile the input exactly are reshaped and reduced instead.

#: Windows of more taps than this are refused (their graphs would grow with the window).
MAX_POOL_TAPS = 512


@dataclasses.dataclass(frozen=True)
class _Window:
    """A pooling window over the trailing ``len(kernel)`` dimensions of an input of spatial ``size``."""

    size: tuple[int, ...]
    kernel: tuple[int, ...]
    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    out: tuple[int, ...]

    @staticmethod
    def of(op: str, t: Tensor, kernel_size: Any, stride: Any, padding: Any, dilation: Any,
           ceil_mode: bool) -> _Window:
        n = len(kernel_size) if isinstance(kernel_size, (tuple, list)) else t.ndim - 2
        if not 1 <= n <= t.ndim:
            raise PbsdkError(f"{op}: a {n}-D window does not fit a tensor of shape {t.shape}")
        k = _spatial(op, "kernel_size", kernel_size, n)
        s = k if stride is None or stride == [] else _spatial(op, "stride", stride, n)
        p = _spatial(op, "padding", padding, n, low=0)
        d = _spatial(op, "dilation", dilation, n)
        size = t.shape[t.ndim - n:]
        out = []
        for length, kk, ss, pp, dd in zip(size, k, s, p, d):
            span = length + 2 * pp - dd * (kk - 1) - 1
            o = (span + (ss - 1 if ceil_mode else 0)) // ss + 1
            if ceil_mode and (o - 1) * ss >= length + pp:  # the last window must start inside the input
                o -= 1
            if span < 0 or o < 1:
                raise PbsdkError(f"{op}: window {k} (dilation {d}) does not fit the padded input {size}")
            out.append(o)
        if math.prod(k) > MAX_POOL_TAPS:
            raise UnsupportedError(f"{op}: a window of {math.prod(k)} taps (at most {MAX_POOL_TAPS})")
        return _Window(size, k, s, p, d, tuple(out))

    def starts(self, axis: int) -> np.ndarray:
        """Where each output's window starts along spatial ``axis``, in unpadded coordinates."""
        return np.arange(self.out[axis]) * self.stride[axis] - self.padding[axis]

    def taps(self, t: Tensor, value: float) -> Iterator[tuple[tuple[int, ...], Tensor]]:
        """Each tap's offsets and the input elements it reads for every output: ``t`` padded with
        ``value`` (enough for the last window), sliced with the stride."""
        lead = t.ndim - len(self.kernel)
        hi = [builtins.max(0, (o - 1) * s + d * (k - 1) + 1 - (n + p)) for o, s, d, k, n, p in
              zip(self.out, self.stride, self.dilation, self.kernel, self.size, self.padding)]
        padded = _pad(t, [(0, 0)] * lead + list(zip(self.padding, hi)), value)
        for tap in itertools.product(*(range(k) for k in self.kernel)):
            view = padded
            for i, j in enumerate(tap):
                first = j * self.dilation[i]
                view = slice(view, lead + i, first, first + (self.out[i] - 1) * self.stride[i] + 1, self.stride[i])
            yield tap, view

    def tiles_exactly(self) -> bool:
        """Whether the windows are the input cut into blocks (stride = kernel, no padding or dilation)."""
        return self.stride == self.kernel and not any(self.padding) and set(self.dilation) == {1} and \
            builtins.all(n == o * k for n, o, k in zip(self.size, self.out, self.kernel))

    def blocks(self, t: Tensor) -> tuple[Tensor, tuple[int, ...]]:
        """``t`` reshaped so that each window is its own axes, and those axes."""
        lead = t.ndim - len(self.kernel)
        shape = t.shape[:lead] + tuple(v for o, k in zip(self.out, self.kernel) for v in (o, k))
        return reshape(t, shape), tuple(lead + 2 * i + 1 for i in range(len(self.kernel)))


def _tap_sum(win: _Window, t: Tensor) -> Tensor:
    """The sum of every window (padding reads 0)."""
    taps = [view for _, view in win.taps(t, 0.0)]
    total = taps[0]
    for view in taps[1:]:
        total = add(total, view)
    return total


def max_pool(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1, *,
             ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """Max over windows of the trailing ``len(kernel_size)`` dimensions (all but the first two when
    ``kernel_size`` is an int), as ``torch.nn.functional.max_pool{1,2,3}d``: padding reads -inf, NaN
    propagates. ``return_indices`` also gives each maximum's flat index within its (unpadded) spatial
    plane, the first one on ties and the last NaN where there is one (torch's rule), as a float tensor."""
    (t,) = _operands(x)
    win = _Window.of("max_pool", t, kernel_size, stride, padding, dilation, ceil_mode)
    with _group("max_pool"):
        if win.tiles_exactly() and not return_indices:
            blocks, axes = win.blocks(t)
            return _pooled(max(blocks, axes), t, (kernel_size, stride, padding, dilation, ceil_mode))
        # Integers pad with their least value: every window holds one real element at least (torch's rule).
        taps = list(win.taps(t, quant.INT_RANGES[t.dtype][0] if quant.is_int(t.dtype) else -math.inf))
        out = taps[0][1]
        for _, view in taps[1:]:
            out = maximum(out, view)
        out = _pooled(out, t, (kernel_size, stride, padding, dilation, ceil_mode))
        if not return_indices:
            return out
        # Position of each tap in the spatial plane, per output; where a tap reads padding it never matches.
        grids = np.meshgrid(*(win.starts(i) for i in range(len(win.kernel))), indexing="ij")
        plane = np.cumprod((1,) + win.size[:0:-1])[::-1]

        def where_tap(tap: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
            pos = [g + j * d for g, j, d in zip(grids, tap, win.dilation)]
            valid = np.logical_and.reduce([(p >= 0) & (p < n) for p, n in zip(pos, win.size)])
            return builtins.sum(p * s for p, s in zip(pos, plane)), valid

        # Where nothing matches (a window of -inf), torch's index is the window's first position in the input.
        first = [np.where(g < 0, g + (-g + d - 1) // d * d, g) for g, d in zip(grids, win.dilation)]
        idx_dtype = _exact_dtype(t.dtype, math.prod(win.size))
        index = _const(builtins.sum(p * s for p, s in zip(first, plane)), idx_dtype)
        for tap, view in reversed(taps):  # the first tap equal to the maximum wins
            flat, valid = where_tap(tap)
            hit = equal(view, out)
            if not valid.all():
                hit = mul(hit, _const(valid.astype(np.float64), hit.dtype))
            index = where(hit, _const(flat, idx_dtype), index)
        for tap, view in taps:  # then the last NaN, which is the maximum where there is one
            flat, _ = where_tap(tap)
            index = where(isnan(view), _const(flat, idx_dtype), index)
        return out, index


#: `max_pool` results of live traces: (graph id, value id) -> (graph, the pooled tensor, the pooling's
#: arguments). `quantize` of one pools the quantized input instead (`_quantized_pool`).
_max_pooled: dict[tuple[int, int], tuple[Any, Tensor, tuple[Any, ...]]] = {}


def _pooled(out: Tensor, t: Tensor, args: tuple[Any, ...]) -> Tensor:
    for gone in [k for k, v in _max_pooled.items() if v[0]() is None]:
        del _max_pooled[gone]
    _max_pooled[(id(current_graph()), out.value.id)] = (weakref.ref(current_graph()), t, args)
    return out


def _quantized_pool(t: Tensor, qp: quant.QuantParams, quantize_input: Callable[[Tensor], Tensor]) -> Tensor | None:
    """``quantize(max_pool(x))`` as ``max_pool(quantize(x))``, or None. Quantizing is monotone (a positive
    scale; clamped), so it commutes with a maximum, and the pool pads its integers with their least value
    where the float pool pads with -inf (quantized: ``qmin``, never above a window's real element): the
    same integers, the pool reading a quarter of the bytes, and the quantize folding into the producer
    (a quantized convolution's requantize epilogue: PT2E's stem, whose pool its x86 quantizer leaves in
    float). Per-channel parameters qualify where the channel axis is not pooled."""
    found = _max_pooled.get((id(t.graph), t.value.id))
    if found is None or found[0]() is not t.graph:
        return None
    x, (kernel_size, stride, padding, dilation, ceil_mode) = found[1], found[2]
    pooled = len(_Window.of("max_pool", x, kernel_size, stride, padding, dilation, ceil_mode).kernel)
    if qp.axis is not None and qp.axis % x.ndim >= x.ndim - pooled:
        return None
    return max_pool(quantize_input(x), kernel_size, stride, padding, dilation, ceil_mode=ceil_mode)


def avg_pool(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, *, ceil_mode: bool = False,
             count_include_pad: bool = True, divisor_override: int | None = None) -> Tensor:
    """Mean over windows of the trailing spatial dimensions, as ``torch.nn.functional.avg_pool{1,2,3}d``:
    padding reads 0 and is counted in the divisor when ``count_include_pad`` (a window running past the
    padding in ceil mode is not)."""
    (t,) = _operands(x)
    win = _Window.of("avg_pool", t, kernel_size, stride, padding, 1, ceil_mode)
    with _group("avg_pool"):
        if win.tiles_exactly() and divisor_override is None:
            blocks, axes = win.blocks(t)
            return mean(blocks, axes)
        total = _tap_sum(win, t)
        if divisor_override is not None:
            return mul(total, 1.0 / divisor_override)
        counts = []
        for i, (n, k, p) in enumerate(zip(win.size, win.kernel, win.padding)):
            start = win.starts(i)
            if count_include_pad:
                counts.append(np.minimum(start + k, n + p) - start)
            else:
                counts.append(np.minimum(start + k, n) - np.maximum(start, 0))
        divisor = np.ones(()) if not counts else np.prod(np.meshgrid(*counts, indexing="ij"), axis=0)
        if (divisor == divisor.flat[0]).all():
            return mul(total, 1.0 / float(divisor.flat[0]))
        return mul(total, _const(1.0 / divisor, t.dtype))


def sum_pool(x: Any, kernel_size: Any, stride: Any = None, dilation: Any = 1) -> Tensor:
    """Sum over (unpadded, possibly dilated) windows of the trailing ``len(kernel_size)`` dimensions."""
    (t,) = _operands(x)
    win = _Window.of("sum_pool", t, kernel_size, stride, 0, dilation, False)
    with _group("sum_pool"):
        if win.tiles_exactly():
            blocks, axes = win.blocks(t)
            return sum(blocks, axes)
        return _tap_sum(win, t)


def _adaptive(op: str, x: Any, output_size: Any, reduce: Any) -> Tensor:
    """Adaptive pooling over the trailing ``len(output_size)`` dims: output i of an axis of length n
    reduces elements ``floor(i*n/o) .. ceil((i+1)*n/o) - 1``. Windows of one size are a regular pooling;
    otherwise, since the windows are products of per-axis ranges, each axis is reduced in turn."""
    (t,) = _operands(x)
    sizes = (output_size,) if isinstance(output_size, (int, np.integer)) else tuple(output_size)
    lead = t.ndim - len(sizes)
    if lead < 0 or builtins.any(not isinstance(o, (int, np.integer)) or o < 1 for o in sizes):
        raise PbsdkError(f"{op}: output size {output_size!r} does not fit a tensor of shape {t.shape}")
    for i, o in enumerate(sizes):
        ax = lead + i
        n = t.shape[ax]
        if o == n:
            continue
        if n % o == 0:
            t = reduce(reshape(t, t.shape[:ax] + (o, n // o) + t.shape[ax + 1:]), ax + 1)
            continue
        if o > 64:
            raise UnsupportedError(f"{op}: {o} uneven windows along one axis (at most 64)")
        parts = [reduce(slice(t, ax, j * n // o, -(-(j + 1) * n // o)), ax, True) for j in range(o)]
        t = concatenate(parts, axis=ax)
    return t


def adaptive_avg_pool(x: Any, output_size: Any) -> Tensor:
    """Mean over adaptive windows (``torch.nn.functional.adaptive_avg_pool{1,2,3}d``)."""
    with _group("avg_pool"):
        return _adaptive("adaptive_avg_pool", x, output_size, lambda t, a, k=False: mean(t, a, keepdims=k))


def adaptive_max_pool(x: Any, output_size: Any, *, return_indices: bool = False) -> Any:
    """Max over adaptive windows (``torch.nn.functional.adaptive_max_pool{1,2,3}d``); indices only where
    the windows tile the input (then it is `max_pool` with kernel = stride = size / output size)."""
    (t,) = _operands(x)
    if not return_indices:
        with _group("max_pool"):
            return _adaptive("adaptive_max_pool", t, output_size, lambda u, a, k=False: max(u, a, keepdims=k))
    sizes = (output_size,) if isinstance(output_size, (int, np.integer)) else tuple(output_size)
    spatial = t.shape[t.ndim - len(sizes):]
    if builtins.any(n % o for n, o in zip(spatial, sizes)):
        raise UnsupportedError("adaptive_max_pool: indices of uneven windows")
    kernel = tuple(n // o for n, o in zip(spatial, sizes))
    return max_pool(t, kernel, kernel, return_indices=True)


# ------------------------------------------------------------------------- selection, slicing, gathering
# Masks are float tensors of 0s and 1s (pbsdk's graph is float-only): comparisons produce them and
# `where` reads any nonzero value as true.

def _compare(op: str, a: Any, b: Any) -> Tensor:
    x, y = _operands(a, b)
    return _add(op, [x.value, y.value], _broadcast_shape(op, x.shape, y.shape), x.dtype)


def equal(a: Any, b: Any) -> Tensor: return _compare("equal", a, b)
def not_equal(a: Any, b: Any) -> Tensor: return _compare("not_equal", a, b)
def less(a: Any, b: Any) -> Tensor: return _compare("less", a, b)
def less_equal(a: Any, b: Any) -> Tensor: return _compare("less_equal", a, b)
def greater(a: Any, b: Any) -> Tensor: return _compare("greater", a, b)
def greater_equal(a: Any, b: Any) -> Tensor: return _compare("greater_equal", a, b)


def where(cond: Any, a: Any, b: Any) -> Tensor:
    """``a`` where ``cond`` is nonzero, else ``b`` (numpy.where); the result takes ``a``/``b``'s dtype."""
    x, y = _operands(a, b)
    if isinstance(cond, Tensor):
        c = cond
    else:
        c = _const(np.asarray(cond, dtype=np.float64), x.dtype)
    shape = _broadcast_shape("where", c.shape, x.shape, y.shape)
    return _add("select", [c.value, x.value, y.value], shape, x.dtype)


def slice(x: Any, axis: int, start: Any = None, stop: Any = None, step: int = 1) -> Tensor:
    """``x`` restricted to ``start:stop:step`` along ``axis`` (Python slice rules; ``step`` > 0)."""
    (t,) = _operands(x)
    (ax,) = _norm_axes("slice", axis, t.ndim)
    if not isinstance(step, (int, np.integer)) or step < 1:
        raise PbsdkError(f"slice: step must be a positive integer, got {step!r}")
    if builtins.any(isinstance(v, Dim) for v in (t.shape[ax], start, stop)):
        return _symbolic_slice(t, ax, start, stop, int(step))
    indices = range(*builtins.slice(start, stop, int(step)).indices(t.shape[ax]))
    if len(indices) == 0:
        raise PbsdkError(f"slice: {start}:{stop}:{step} of dimension {ax} (size {t.shape[ax]}) is empty")
    if len(indices) == t.shape[ax]:
        return t
    shape = t.shape[:ax] + (len(indices),) + t.shape[ax + 1:]
    starts = tuple(indices.start if i == ax else 0 for i in range(t.ndim))
    steps = tuple(indices.step if i == ax else 1 for i in range(t.ndim))
    return _add("slice", [t.value], shape, t.dtype, starts=starts, steps=steps)


def _symbolic_slice(t: Tensor, ax: int, start: Any, stop: Any, step: int) -> Tensor:
    """`slice` where the dimension's size or a bound is a `Dim` (known at run time): unit steps, bounds
    taken as in range (a negative one counts from the end); the frontends check the result's size
    against their own record of it."""
    n = t.shape[ax]
    if step != 1:
        raise PbsdkError(f"slice: a step of {step} over a size known at run time ({n})")
    lo = 0 if start is None else n + start if isinstance(start, int) and start < 0 else start
    hi = n if stop is None else n + stop if isinstance(stop, int) and stop < 0 else stop
    length = hi - lo
    if isinstance(length, int) and length < 1:
        raise PbsdkError(f"slice: {start}:{stop} of dimension {ax} (size {n}) is empty")
    if length == n:
        return t
    shape = t.shape[:ax] + (length,) + t.shape[ax + 1:]
    starts = tuple(lo if i == ax else 0 for i in range(t.ndim))
    return _add("slice", [t.value], shape, t.dtype, starts=starts, steps=(1,) * t.ndim)


def _size(d: Any) -> Any:
    """A target size: an int, or a `Dim` (a size known at run time) as it is."""
    return d if isinstance(d, Dim) else int(d)


def concatenate(xs: Sequence[Any], axis: int = 0) -> Tensor:
    """Join tensors along an existing ``axis`` (numpy.concatenate); other dimensions must agree."""
    ts = _operands(*xs)
    if not ts:
        raise PbsdkError("concatenate: needs at least one tensor")
    rank = ts[0].ndim
    (ax,) = _norm_axes("concatenate", axis, rank)
    for t in ts[1:]:
        if t.ndim != rank or builtins.any(d != e for i, (d, e) in enumerate(zip(t.shape, ts[0].shape)) if i != ax):
            raise PbsdkError(f"concatenate: shapes {' and '.join(str(u.shape) for u in ts)} differ outside "
                             f"axis {ax}")
    if len(ts) == 1:
        return ts[0]
    shape = ts[0].shape[:ax] + (builtins.sum(t.shape[ax] for t in ts),) + ts[0].shape[ax + 1:]
    return _add("concat", [t.value for t in ts], shape, ts[0].dtype, axis=ax)


def interleave(parts: Sequence[Any], axes: Sequence[int], strides: Sequence[int],
               shape: Sequence[int] | None = None) -> Tensor:
    """Parts of one shape woven along ``axes``: along axis ``axes[i]`` output position ``strides[i]*j + p`` is
    element ``j`` of a part whose phase there is ``p``; the ``prod(strides)`` parts come in row-major order of
    their phases (the last axis's phase fastest). The result has each of ``axes`` ``strides[i]`` times the
    parts' size, or ``shape`` where given: larger than that size less one stride (the output of a
    transposed convolution, whose last phases may be one short; a phase past the end is not written).
    Each part is written once into its strided positions (no stacking and reshaping: one copy)."""
    ts = _operands(*parts)
    rank = ts[0].ndim if ts else 0
    _norm_axes("interleave", axes, rank)  # in range, none repeated
    ax = tuple(int(a) % rank for a in axes)  # in the given order: the parts' phases are row-major in it
    strides = tuple(int(s) for s in strides)
    if not ts or len(ax) != len(strides) or builtins.any(s < 1 for s in strides):
        raise PbsdkError(f"interleave: {len(ts)} part(s) along axes {tuple(axes)} with strides {strides}")
    if len(ts) != math.prod(strides) or builtins.any(t.shape != ts[0].shape or t.dtype != ts[0].dtype for t in ts):
        raise PbsdkError(f"interleave: needs {math.prod(strides)} parts of one shape and dtype, got "
                         f"{', '.join(f'{t.shape} {t.dtype}' for t in ts)}")
    base = ts[0].shape
    if builtins.any(isinstance(base[a], Dim) for a in ax):
        raise PbsdkError(f"interleave: a size known at run time along an interleaved axis ({base})")
    full = tuple(d * strides[ax.index(i)] if i in ax else d for i, d in enumerate(base))
    out = full if shape is None else tuple(shape)
    if len(out) != len(full) or builtins.any(
            (o != f) if i not in ax else not (f - strides[ax.index(i)] < o <= f) for i, (o, f) in enumerate(zip(out, full))):
        raise PbsdkError(f"interleave: shape {out} does not fit parts of shape {base} with strides {strides}")
    if len(ts) == 1:
        return ts[0]  # every stride 1: the part itself
    return _add("interleave", [t.value for t in ts], out, ts[0].dtype, axes=tuple(ax), strides=strides)


def flip(x: Any, axis: Any = None) -> Tensor:
    """Reverse the order of elements along ``axis`` (an int, a tuple, or None for all), as ``numpy.flip``."""
    (t,) = _operands(x)
    axes = tuple(a for a in _norm_axes("flip", axis, t.ndim) if t.shape[a] > 1)
    if not axes:
        return t
    return _add("flip", [t.value], t.shape, t.dtype, axes=axes)


def _pad(t: Tensor, widths: Sequence[tuple[int, int]], value: float) -> Tensor:
    """``t`` with ``widths[i]`` = (before, after) elements of ``value`` added along axis i; a negative width
    removes elements instead."""
    for ax, (lo, hi) in enumerate(widths):
        if lo < 0 or hi < 0:
            t = slice(t, ax, builtins.max(-lo, 0), t.shape[ax] - builtins.max(-hi, 0))
        parts = []
        for n in (builtins.max(lo, 0), None, builtins.max(hi, 0)):
            if n is None:
                parts.append(t)
            elif n:
                parts.append(broadcast_to(_const(value, t.dtype), t.shape[:ax] + (n,) + t.shape[ax + 1:]))
        t = concatenate(parts, axis=ax)
    return t


def pad(x: Any, pad_width: Any, mode: str = "constant", constant_values: float = 0.0) -> Tensor:
    """``numpy.pad`` in constant mode: ``pad_width`` is an int, a (before, after) pair for every axis, or
    one (before, after) pair per axis."""
    (t,) = _operands(x)
    if mode != "constant":
        raise UnsupportedError(f"pad: mode {mode!r} (only 'constant' is supported)")
    widths = np.broadcast_to(np.asarray(pad_width, dtype=np.int64), (t.ndim, 2))
    if (widths < 0).any():
        raise PbsdkError(f"pad: pad_width must be non-negative, got {pad_width!r}")
    return _pad(t, [(int(a), int(b)) for a, b in widths], float(constant_values))


def take(a: Any, indices: Any, axis: int = 0) -> Tensor:
    """``numpy.take(a, indices, axis, mode="clip")``: gather along ``axis``. ``indices`` is a float tensor
    (or an integer array) of whole numbers; out-of-range indices are clipped to the valid range, so the
    kernel never reads outside ``a``."""
    (t,) = _operands(a)
    (ax,) = _norm_axes("take", axis, t.ndim)
    if isinstance(indices, Tensor):
        idx = indices
    else:
        array = np.asarray(indices)
        if array.dtype.kind not in "iu":
            raise PbsdkError(f"take: constant indices must be integers, got dtype {array.dtype}")
        idx = _const(array, "f64")
    shape = t.shape[:ax] + idx.shape + t.shape[ax + 1:]
    return _add("take", [t.value, idx.value], shape, t.dtype, axis=ax)


def take_along_axis(arr: Any, indices: Any, axis: int) -> Tensor:
    """``numpy.take_along_axis`` (``torch.gather``): ``out[..., i, ...] = arr[..., indices[..., i, ...], ...]``
    along ``axis``; ``indices`` has ``arr``'s rank and, off ``axis``, dimensions no larger than ``arr``'s.
    Out-of-range indices are clipped, so the kernel never reads outside ``arr``."""
    (t,) = _operands(arr)
    idx = indices if isinstance(indices, Tensor) else _const(np.asarray(indices), "f64")
    (ax,) = _norm_axes("take_along_axis", axis, t.ndim)
    if idx.ndim != t.ndim or builtins.any(i > d for k, (i, d) in enumerate(zip(idx.shape, t.shape)) if k != ax):
        raise PbsdkError(f"take_along_axis: indices of shape {idx.shape} do not fit an array of shape {t.shape}")
    return _add("take_along", [t.value, idx.value], idx.shape, t.dtype, axis=ax)


#: put_along_axis compares every index with every position: at most this many comparisons.
MAX_SCATTER_PAIRS = 1 << 24


def put_along_axis(arr: Any, indices: Any, values: Any, axis: int, *, reduce: str | None = None) -> Tensor:
    """``arr`` with ``values`` written at ``indices`` along ``axis`` (``numpy.put_along_axis``, returning a
    new tensor; ``torch.scatter``): ``reduce=None`` writes (where several indices name one place, the last
    one's value), ``"add"`` adds them all (``torch.scatter_add``). ``indices`` may be smaller than ``arr``
    off ``axis``; ``values`` broadcasts to it; indices outside ``arr`` write nothing.

    Computed densely: position p along ``axis`` takes the values whose index equals p (one comparison per
    (position, index) pair), so it is meant for modest sizes (at most `MAX_SCATTER_PAIRS` pairs)."""
    (t,) = _operands(arr)
    idx = indices if isinstance(indices, Tensor) else _const(np.asarray(indices), "f64")
    (ax,) = _norm_axes("put_along_axis", axis, t.ndim)
    if reduce not in (None, "add"):
        raise UnsupportedError(f"put_along_axis: reduce={reduce!r} (None or 'add')")
    if idx.ndim != t.ndim or builtins.any(i > d for k, (i, d) in enumerate(zip(idx.shape, t.shape)) if k != ax):
        raise PbsdkError(f"put_along_axis: indices of shape {idx.shape} do not fit an array of shape {t.shape}")
    n, m = t.shape[ax], idx.shape[ax]
    if n * math.prod(idx.shape) > MAX_SCATTER_PAIRS:
        raise UnsupportedError(f"put_along_axis: {n} positions x {math.prod(idx.shape)} indices is too many pairs")
    with _group("put_along_axis"):
        vals = astype(values, t.dtype) if isinstance(values, Tensor) else _operands(values, t)[0]
        for k, (v, i) in enumerate(zip(vals.shape, idx.shape)):
            if vals.ndim == idx.ndim and v > i:  # torch reads only the values the indices cover
                vals = slice(vals, k, 0, i)
        vals = broadcast_to(vals, idx.shape)
        # hit[..., p, i, ...] = indices[..., i, ...] == p, with a new axis for the positions p before `axis`
        grid = idx.shape[:ax] + (1,) + idx.shape[ax:]
        pos_dtype = _exact_dtype(t.dtype, n + m)
        positions = _const(np.arange(n, dtype=np.float64).reshape((n, 1) + (1,) * (t.ndim - 1 - ax)), pos_dtype)
        hit = equal(reshape(astype(idx, pos_dtype) if idx.dtype != pos_dtype else idx, grid), positions)
        if reduce == "add":
            written = sum(mul(astype(hit, t.dtype), reshape(vals, grid)), ax + 1)
            mask = None
        else:
            mask = max(hit, ax + 1)
            order = _const(np.arange(m, dtype=np.float64).reshape((m,) + (1,) * (t.ndim - 1 - ax)), pos_dtype)
            last = max(mul(hit, order), ax + 1)  # the last index naming each position (0 where none does)
            written = take_along_axis(vals, last, ax)
        widths = [(0, d - i) for d, i in zip(t.shape, written.shape)]
        if builtins.any(w for _, w in widths):  # indices smaller than arr: nothing written beyond them
            written = _pad(written, widths, 0.0)
            mask = None if mask is None else _pad(mask, widths, 0.0)
        return add(t, written) if mask is None else where(mask, written, t)


def put_slices(arr: Any, indices: Any, values: Any, axis: int) -> Tensor:
    """``arr`` with slice ``j`` of ``values`` along ``axis`` written at position ``indices[j]`` (a 1-D tensor of
    whole numbers), one after another (where two indices name one position, the later one's slice); an index
    outside ``arr`` writes nothing. ``values`` has ``arr``'s shape with ``len(indices)`` along ``axis``. Unlike
    `put_along_axis` its cost is one copy of ``arr`` and one slice per index, not one comparison per (position,
    index) pair: the positions are offsets read at run time (a KV cache written at its cache positions)."""
    t, vals = _operands(arr, values)
    idx = indices if isinstance(indices, Tensor) else _const(np.asarray(indices), "f64")
    (ax,) = _norm_axes("put_slices", axis, t.ndim)
    if idx.ndim != 1 or vals.shape != t.shape[:ax] + idx.shape + t.shape[ax + 1:]:
        raise PbsdkError(f"put_slices: {idx.shape} indices and values of shape {vals.shape} do not fit an array of "
                         f"shape {t.shape} along axis {ax}")
    if idx.dtype in INT_DTYPES:
        idx = astype(idx, "f64")
    return _add("put_slices", [t.value, idx.value, vals.value], t.shape, t.dtype, axis=ax)


def _wrapped(indices: Tensor, n: int) -> Tensor:
    """Negative indices counted from the end (``i + n``)."""
    return where(less(indices, 0.0), add(indices, size_value(n)), indices)


def size_value(n: Any, dtype: str = "f64") -> Any:
    """Size ``n`` as data: a float for an int, or, for a `Dim` (known at run time), a 0-d ``dtype`` tensor
    holding its value, read from the kernel's inputs' sizes."""
    if not isinstance(n, Dim):
        return float(n)
    return _add("size", [], (), dtype, dim=n)


def iota(n: Any, dtype: str = "f64") -> Tensor:
    """``0, 1, ..., n - 1`` in ``dtype``: a constant, or, when ``n`` is a `Dim`, computed by the kernel."""
    if not isinstance(n, Dim):
        return _const(np.arange(int(n), dtype=np.float64), dtype)
    shape: tuple[Any, ...] = (n,)  # a Dim size (see TensorType)
    return _add("iota", [], shape, dtype)


def grouped_matmul(x: Any, ends: Any, weights: Sequence[Any]) -> Tensor:
    """Rows of ``x`` (R x K) in consecutive groups, group ``e`` ending (exclusive) at row ``ends[e]`` (a float
    or integer tensor of E whole numbers, non-decreasing), each times its own ``weights[e]`` (K x N): a mixture
    of experts' grouped matmul (``torch._grouped_mm`` with offsets). Rows from ``ends[-1]`` on are zero. The
    groups' sizes are data, so each group is a matmul whose row count is known only at run time: only targets
    that compile such sizes (`pbsdk.core.target.Target.dynamic_shapes`) take this op. Ends outside
    ``[previous end, R]`` are clamped there, so the kernel never reads outside ``x``."""
    t, *ws = _operands(x, *weights)  # numpy weights become constants of the rows' dtype
    (offs,) = _operands(ends)
    if offs.dtype in INT_DTYPES:
        offs = astype(offs, "f64")  # whole numbers, clamped in floating point like take's indices
    if t.ndim != 2 or offs.ndim != 1 or offs.shape[0] != len(ws) or not ws:
        raise PbsdkError(f"grouped_matmul: rows of shape {t.shape}, ends of shape {offs.shape} and {len(ws)} "
                         "weights: want R x K rows, E ends and E weights")
    n = ws[0].shape[-1] if ws[0].ndim else 0
    if builtins.any(w.shape != (t.shape[1], n) or w.dtype != t.dtype for w in ws):
        raise PbsdkError(f"grouped_matmul: every weight must be {t.shape[1]} x N in {t.dtype}, got "
                         f"{[(w.shape, w.dtype) for w in ws]}")
    return _add("grouped_matmul", [t.value, offs.value, *(w.value for w in ws)], (t.shape[0], n), t.dtype)


def roll(x: Any, shift: int | Sequence[int], axis: Any = None) -> Tensor:
    """``numpy.roll``: elements shifted by ``shift`` along ``axis`` (the flattened tensor when None), wrapping."""
    (t,) = _operands(x)
    if axis is None:
        return reshape(roll(reshape(t, (math.prod(t.shape),)), shift, 0), t.shape)
    shifts = (shift,) if isinstance(shift, (int, np.integer)) else tuple(shift)
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    if len(shifts) != len(axes):
        raise PbsdkError(f"roll: {len(shifts)} shifts for {len(axes)} axes")
    for s, a in zip(shifts, axes):
        (ax,) = _norm_axes("roll", a, t.ndim)
        k = int(s) % t.shape[ax]
        if k:
            n = t.shape[ax]
            t = concatenate([slice(t, ax, n - k), slice(t, ax, 0, n - k)], axis=ax)
    return t


def stack(xs: Sequence[Any], axis: int = 0) -> Tensor:
    """Join tensors of one shape along a new ``axis`` (``numpy.stack``)."""
    ts = _operands(*xs)
    if not ts:
        raise PbsdkError("stack: needs at least one tensor")
    (ax,) = _norm_axes("stack", axis, ts[0].ndim + 1)
    return concatenate([reshape(t, t.shape[:ax] + (1,) + t.shape[ax:]) for t in ts], axis=ax)


# ------------------------------------------------------------------------------------------ activations
# The activations of ``torch.nn`` / ``jax.nn``, built from the primitives above.

def silu(x: Any) -> Tensor:
    """``x * sigmoid(x)`` (swish)."""
    (t,) = _operands(x)
    return mul(t, sigmoid(t))


def leaky_relu(x: Any, negative_slope: float = 0.01) -> Tensor:
    (t,) = _operands(x)
    return where(greater(t, 0.0), t, mul(t, float(negative_slope)))


def elu(x: Any, alpha: float = 1.0) -> Tensor:
    """``x`` where positive, else ``alpha * (exp(x) - 1)``."""
    (t,) = _operands(x)
    return where(greater(t, 0.0), t, mul(expm1(t), float(alpha)))


def celu(x: Any, alpha: float = 1.0) -> Tensor:
    """``max(x, 0) + min(0, alpha * (exp(x / alpha) - 1))``."""
    (t,) = _operands(x)
    return where(greater(t, 0.0), t, mul(expm1(mul(t, 1.0 / alpha)), float(alpha)))


def selu(x: Any) -> Tensor:
    return mul(elu(x, 1.6732632423543772848170429916717), 1.0507009873554804934193349852946)


def hardtanh(x: Any, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """``x`` clipped to [min_val, max_val]."""
    return minimum(maximum(x, float(min_val)), float(max_val))


def relu6(x: Any) -> Tensor:
    return hardtanh(x, 0.0, 6.0)


def hardsigmoid(x: Any) -> Tensor:
    """``relu6(x + 3) / 6``."""
    return hardtanh(add(mul(x, 1.0 / 6.0), 0.5), 0.0, 1.0)


def hardswish(x: Any) -> Tensor:
    (t,) = _operands(x)
    return mul(t, hardsigmoid(t))


def softplus(x: Any, beta: float = 1.0, threshold: float = 20.0) -> Tensor:
    """``log(1 + exp(beta * x)) / beta``, and ``x`` itself where ``beta * x > threshold`` (torch's form)."""
    (t,) = _operands(x)
    bx = mul(t, float(beta))
    return where(greater(bx, float(threshold)), t, mul(log1p(exp(bx)), 1.0 / beta))


def logsigmoid(x: Any) -> Tensor:
    """``log(sigmoid(x)) = min(x, 0) - log1p(exp(-|x|))`` (no overflow for any x)."""
    (t,) = _operands(x)
    return sub(minimum(t, 0.0), log1p(exp(neg(abs(t)))))


def softsign(x: Any) -> Tensor:
    (t,) = _operands(x)
    return div(t, add(abs(t), 1.0))


def mish(x: Any) -> Tensor:
    """``x * tanh(softplus(x))``."""
    (t,) = _operands(x)
    return mul(t, tanh(softplus(t)))


def glu(x: Any, axis: int = -1) -> Tensor:
    """Gated linear unit: the first half of ``axis`` times the sigmoid of the second half."""
    (t,) = _operands(x)
    (ax,) = _norm_axes("glu", axis, t.ndim)
    if t.shape[ax] % 2:
        raise PbsdkError(f"glu: dimension {ax} of {t.shape} must have an even size")
    half = t.shape[ax] // 2
    return mul(slice(t, ax, 0, half), sigmoid(slice(t, ax, half)))


# ------------------------------------------------------------------------------------------- attention

def attention(q: Any, k: Any, v: Any, *, scale: float | None = None, causal: bool = False,
              mask: Any = None) -> Tensor:
    """Scaled dot-product attention ``softmax(scale * q @ kᵀ + mask) @ v`` over the last two dims.

    q: (..., Hq, Sq, D); k: (..., Hkv, Sk, D); v: (..., Hkv, Sk, Dv). ``Hq`` may be a multiple of
    ``Hkv`` (grouped-query attention: each K/V head serves ``Hq / Hkv`` query heads). ``scale``
    defaults to ``1/sqrt(D)``; ``causal`` masks keys after each query (top-left aligned, as
    ``torch.nn.functional.scaled_dot_product_attention``); ``mask`` is added to the scores and
    broadcasts against (..., Hq, Sq, Sk). Built from primitives (tagged ``attention``); on specs whose
    planner fuses it, it runs as one kernel that never stores the Sq x Sk scores."""
    qt, kt, vt = _operands(q, k, v)
    if qt.ndim < 2 or kt.ndim < 2 or vt.ndim < 2:
        raise PbsdkError(f"attention: q, k, v need rank >= 2, got {qt.shape}, {kt.shape}, {vt.shape}")
    if qt.shape[-1] != kt.shape[-1] or kt.shape[-2] != vt.shape[-2] or kt.shape[:-1] != vt.shape[:-1]:
        raise PbsdkError(f"attention: shapes q {qt.shape}, k {kt.shape}, v {vt.shape} do not fit "
                         "(q[..., D], k[..., Sk, D], v[..., Sk, Dv])")
    d = qt.shape[-1]
    sq, sk = qt.shape[-2], kt.shape[-2]
    with _group("attention"):
        if qt.ndim >= 3 and kt.ndim >= 3 and kt.shape[-3] != qt.shape[-3]:
            hq, hkv = qt.shape[-3], kt.shape[-3]
            if hq % hkv:
                raise PbsdkError(f"attention: {hq} query heads are not a multiple of {hkv} key/value heads")
            g = hq // hkv

            def expand(x: Tensor) -> Tensor:  # (..., Hkv, S, E) -> (..., Hkv * g, S, E) without a copy
                lead = x.shape[:-3]
                y = reshape(x, lead + (hkv, 1) + x.shape[-2:])
                y = broadcast_to(y, lead + (hkv, g) + x.shape[-2:])
                return reshape(y, lead + (hq,) + x.shape[-2:])
            kt, vt = expand(kt), expand(vt)
        s = mul(matmul(qt, kt, transpose_b=True), 1.0 / math.sqrt(d) if scale is None else float(scale))
        if causal:
            # Positions in f32 (exact to 2**24), not the scores' dtype: f16 holds integers exactly only
            # to 2048 and bf16 to 256, past which neighbouring keys would compare equal.
            rows = _const(np.arange(sq, dtype=np.float64).reshape(sq, 1), "f32")
            cols = _const(np.arange(sk, dtype=np.float64).reshape(1, sk), "f32")
            s = where(greater(cols, rows), -math.inf, s)
        if mask is not None:
            s = add(s, mask)
        return matmul(softmax(s, -1), vt)


# ------------------------------------------------------------------------------------ quantized (int8)

def _per_channel(values: Sequence[float] | Sequence[int], axis: int | None, ndim: int, dtype: str) -> Any:
    """A per-tensor scalar, or a per-channel constant shaped to broadcast along ``axis``."""
    if axis is None:
        return values[0]
    shape = [1] * ndim
    shape[axis] = len(values)
    return _const(np.asarray(values, np.float64).reshape(shape), dtype)


def _round_clamp_to(y: Tensor, qp: quant.QuantParams, zero_point: Any) -> Tensor:
    """``clamp(round_half_even(y) + zero_point, qmin, qmax)`` in ``y``'s float dtype, then the integer dtype."""
    q = add(round(y), zero_point)
    return astype(minimum(maximum(q, float(qp.qmin)), float(qp.qmax)), qp.dtype)


def quantize(x: Any, scale: Any, zero_point: Any = 0, *, axis: int | None = None, dtype: str = "i8",
             qmin: int | None = None, qmax: int | None = None) -> Tensor:
    """``clamp(round_half_even(x * (1 / scale)) + zero_point, qmin, qmax)`` as i8, computed in f32 exactly as
    PyTorch's ``quantized_decomposed.quantize_per_tensor`` / ``_per_channel`` (the reciprocal of the scale
    rounded to f32, then a multiply); ``axis`` given: one scale and zero point per index of that axis.
    ``qmin``/``qmax`` default to i8's range; a narrower one (``[-127, 127]``), or a u8 convention held in
    i8 (`pbsdk.core.quant.quant_storage`: zero point and range shifted by -128), is exact too."""
    (t,) = _operands(x)
    if t.dtype not in FLOAT_DTYPES:
        raise UnsupportedError(f"quantize: input dtype {t.dtype} is not a float", op="quantize")
    qp = quant.quant_params(np.atleast_1d(scale).tolist(), np.atleast_1d(zero_point).tolist(), axis=axis,
                            dtype=dtype, shape=t.shape, qmin=qmin, qmax=qmax)
    source = _dequantized_source(t) if t.dtype == "f32" and qp.qrange is None else None
    if source is not None and source[1] == qp:
        # quantize(dequantize(q)) with q's own parameters over the whole range is q: (q - z) * s * (1/s) is
        # within 1e-4 of q - z in f32 for every i8 q (PT2E's quantize/dequantize pair around an op it
        # leaves in float, a max pool, rejoins the integers here).
        return source[0]
    pooled = _quantized_pool(t, qp, lambda x: quantize(x, scale, zero_point, axis=axis, dtype=dtype, qmin=qmin,
                                                       qmax=qmax))
    if pooled is not None:
        return pooled
    with _group("quantize"):
        f = astype(t, "f32")
        y = mul(f, _per_channel(tuple(1.0 / s for s in qp.scale), qp.axis, t.ndim, "f32"))
        return _round_clamp_to(y, qp, _per_channel(qp.zero_point, qp.axis, t.ndim, "f32"))


def dequantize(q: Any, scale: Any, zero_point: Any = 0, *, axis: int | None = None, dtype: str = "f32") -> Tensor:
    """``(q - zero_point) * scale`` in f32 (then ``dtype``), per tensor or per channel along ``axis``."""
    (t,) = _operands(q)
    if t.dtype not in INT_DTYPES:
        raise UnsupportedError(f"dequantize: input dtype {t.dtype} is not an integer", op="dequantize")
    qp = quant.quant_params(np.atleast_1d(scale).tolist(), np.atleast_1d(zero_point).tolist(), axis=axis,
                            shape=t.shape)
    with _group("dequantize"):
        f = astype(t, "f32")
        y = mul(sub(f, _per_channel(qp.zero_point, qp.axis, t.ndim, "f32")),
                _per_channel(qp.scale, qp.axis, t.ndim, "f32"))
        out = astype(y, dtype)
    _dequantized[(id(current_graph()), out.value.id)] = (weakref.ref(current_graph()), t, qp)
    return out


#: ``dequantize`` results of live traces: (graph id, value id) -> (graph, the integer tensor, its parameters).
#: `matmul` of two of them runs the contraction on the integer tensors (`_quantized_matmul`).
_dequantized: dict[tuple[int, int], tuple[Any, Tensor, quant.QuantParams]] = {}


def _dequantized_source(t: Tensor) -> tuple[Tensor, quant.QuantParams] | None:
    found = _dequantized.get((id(t.graph), t.value.id))
    if found is None or found[0]() is not t.graph:
        return None
    return found[1], found[2]


def _quantized_matmul(x: Tensor, y: Tensor, ta: bool, tb: bool) -> Tensor | None:
    """``dequantize(xq) @ dequantize(wq)`` as the i8 contraction with exact i32 accumulation (on an i8
    matrix unit where the spec has one), rescaled once: ``f32(acc) * (sx * sw[n])``, with the input's zero
    point folded in as ``zx * (1 @ wq)``. None (the float contraction) unless both are i8 dequantize
    results, ``x`` per tensor, ``w`` 2-D and symmetric per tensor or per output column. Equal to the
    float contraction up to its f32 rounding (the integer sum is exact)."""
    for table in (_dequantized, _widened):
        for gone in [k for k, v in table.items() if v[0]() is None]:
            del table[gone]
    xs, ws = _dequantized_source(x), _dequantized_source(y)
    if xs is None or ws is None:
        return None
    (xq, xp), (wq, wp) = xs, ws
    if ta or y.ndim != 2:
        _log.info("matmul of dequantized operands runs in float: %s", "the input is transposed" if ta else
                  f"the weight is {y.ndim}-D, not 2-D")
        return None
    plan = quant.plan_integer_contraction(xp, wp, channel_axis=0 if tb else 1)
    if not plan.integer:
        _log.info("matmul of dequantized operands runs in float: %s", plan.reason)
        return None
    with _group("quantized_matmul"):
        acc = matmul(xq, wq, transpose_b=tb)  # i32
        w_value = _const_value(wq.graph, wq.value)
        if xp.zero_point[0] != 0 and w_value is not None:  # a frozen weight: zx * its column sums, made here
            sums = w_value.astype(np.int64).sum(axis=1 if tb else 0) * np.int64(xp.zero_point[0])
            acc = sub(acc, _const(sums.reshape(1, -1).astype(np.int32), "i32"))
        elif xp.zero_point[0] != 0:
            k = wq.shape[1] if tb else wq.shape[0]
            ones = _const(np.ones((1, k)), "i8")
            acc = sub(acc, mul(matmul(ones, wq, transpose_b=tb), xp.zero_point[0]))
        scale = np.asarray(xp.scale[0] * np.asarray(wp.scale, np.float64), np.float32)
        out = mul(astype(acc, "f32"), _const(scale, "f32") if scale.size > 1 else float(scale[0]))
        return astype(out, x.dtype)


def quantized_linear(x: Any, x_scale: float, x_zero_point: int, w: Any, w_scale: Any, bias: Any = None, *,
                     out_scale: float, out_zero_point: int = 0, out_qmin: int | None = None,
                     out_qmax: int | None = None) -> Tensor:
    """An int8 linear layer ``y = x @ w.T + bias`` on quantized tensors: ``x`` (..., K) i8 per tensor,
    ``w`` (N, K) i8 symmetric per tensor or per output channel (``w_scale`` of length N), ``bias`` (N,)
    float or None; the result is i8 quantized with ``out_scale``/``out_zero_point``.

    The contraction is ``x @ w.T`` in i8 with exact i32 accumulation (an i8 -> i32 matrix unit where the
    spec has one); the input zero point folds into a per-column correction ``x_zero_point * sum_k w``
    and the bias into ``round(bias / (x_scale * w_scale))``, both i32; the requantize epilogue
    (`pbsdk.core.quant.plan_requantize`) is one elementwise chain after it, clamping to ``[out_qmin,
    out_qmax]`` (default i8's range)."""
    xt, wt = _operands(x)[0], _operands(w)[0]
    if xt.dtype != "i8" or wt.dtype != "i8" or wt.ndim != 2:
        raise UnsupportedError(f"quantized_linear: x and w must be i8 (w 2-D), got {xt.dtype}{list(xt.shape)} "
                               f"and {wt.dtype}{list(wt.shape)}", op="quantized_linear")
    xq = quant.quant_params(x_scale, x_zero_point)
    ws = np.atleast_1d(w_scale).tolist()
    wq = quant.quant_params(ws, 0, axis=0 if len(ws) > 1 else None, shape=wt.shape)
    oq = quant.quant_params(out_scale, out_zero_point, qmin=out_qmin, qmax=out_qmax)
    rq = quant.plan_requantize(xq, wq, oq)
    with _group("quantized_linear"):
        acc = matmul(xt, wt, transpose_b=True)  # i32
        if xq.zero_point[0] != 0:
            # (1, N) = zx * sum_k w[n, k]: the column sums as one more i8 contraction (exact in i32).
            ones = _const(np.ones((1, wt.shape[1])), "i8")
            acc = sub(acc, mul(matmul(ones, wt, transpose_b=True), xq.zero_point[0]))
        if bias is not None:
            (bt,) = _operands(bias)
            scales = np.asarray(xq.scale[0] * np.asarray(wq.scale, np.float64))
            acc = add(acc, astype(round(div(astype(bt, "f32"), _const(scales.astype(np.float32), "f32"))), "i32"))
        multiplier = (_const(np.asarray(rq.multiplier, np.float32), "f32") if len(rq.multiplier) > 1
                      else rq.multiplier[0])
        y = mul(astype(acc, "f32"), multiplier)
        return _round_clamp_to(y, oq, float(rq.zero_point))
