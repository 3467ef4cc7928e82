"""pbsdk's tensor-program API: numpy-like ops on traced tensors, used inside ``@pbsdk.jit``.

Signatures follow numpy (``transpose(x, axes)``, ``softmax(x, axis=-1)``, ``sum(x, axis=..., keepdims=...)``);
Python and numpy scalars and constant numpy arrays broadcast like arrays. Shapes and dtypes are checked
while tracing, so a mistake is reported with the op's name and the shapes involved.
"""

from __future__ import annotations

import builtins
import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY, FLOAT_DTYPES, INLINE_LIMIT, NUMPY_TO_DTYPE, TensorType, Value
from pbsdk.frontends.tracing import Tensor, current_graph

__all__ = [
    "Tensor",
    "abs",
    "add",
    "astype",
    "attention",
    "broadcast_to",
    "concatenate",
    "conv2d",
    "div",
    "equal",
    "erf",
    "exp",
    "gelu",
    "greater",
    "greater_equal",
    "layernorm",
    "less",
    "less_equal",
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
    "not_equal",
    "pow",
    "relu",
    "reshape",
    "rsqrt",
    "sigmoid",
    "slice",
    "softmax",
    "sqrt",
    "sub",
    "sum",
    "take",
    "tanh",
    "transpose",
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
_FOLDABLE = {"transpose": lambda v, a: np.transpose(v, a["perm"]), "reshape": lambda v, a: v.reshape(a["shape"])}


def _folded(graph: Any, op: str, inputs: Sequence[Value], shape: tuple[int, ...], attrs: Mapping[str, Any]) -> Any:
    if op not in _FOLDABLE or len(inputs) != 1:
        return None
    src = next((n for n in reversed(graph.nodes) if n.out is inputs[0]), None)
    if src is None or src.op != "const" or np.asarray(src.attrs["value"]).shape != inputs[0].shape:
        return None
    value = np.ascontiguousarray(_FOLDABLE[op](np.asarray(src.attrs["value"]), {**attrs, "shape": shape}))
    return value if value.shape == tuple(shape) else None


def _add(op: str, inputs: Sequence[Value], shape: tuple[int, ...], dtype: str, **attrs: Any) -> Tensor:
    graph = current_graph()
    value = _folded(graph, op, inputs, shape, attrs)
    if value is not None:
        op, inputs, attrs = "const", [], {"value": value}
    out = graph.add(op, inputs, TensorType(tuple(shape), dtype), _group_stack[0] if _group_stack else None,
                    **attrs)
    return Tensor(out, graph)


def _wider(a: str, b: str) -> str:
    order = ["f16", "bf16", "f32", "f64"]
    if {a, b} == {"f16", "bf16"}:
        return "f32"
    return a if order.index(a) >= order.index(b) else b


def _const(value: Any, dtype: str, *, copy: bool = True) -> Tensor:
    """A constant of ``value`` in ``dtype``. ``copy=False`` (a frontend whose arrays cannot change behind
    the kernel's back, e.g. torch's frozen parameters, which it checks on every call) holds a large
    ``value`` of the right dtype without copying it."""
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
        raise UnsupportedError(f"constant of dtype {array.dtype} is not supported")
    if any(d == 0 for d in array.shape):
        raise PbsdkError(f"constant of shape {array.shape} has an empty dimension")
    # A snapshot: later changes to ``value`` do not reach the kernel. Small constants are held in float64
    # (folding reads them), large ones (frozen weights) in the graph's dtype, not widened.
    wide = array.size <= INLINE_LIMIT or dtype not in DTYPE_TO_NUMPY
    held = np.array(array, dtype=np.float64 if wide else DTYPE_TO_NUMPY[dtype], order="C", copy=copy or wide)
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


def gelu(x: Any, approximate: str = "none") -> Tensor:
    """GELU: ``x * Phi(x)`` exactly (``approximate="none"``) or with the tanh approximation."""
    if approximate not in ("none", "tanh"):
        raise PbsdkError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r}")
    return _unary("gelu" if approximate == "none" else "gelu_tanh", x)


def astype(x: Tensor, dtype: Any) -> Tensor:
    """Convert to another float dtype (``"f32"``, ``"f16"``, ``np.float32``, ...)."""
    name = dtype if isinstance(dtype, str) and dtype in FLOAT_DTYPES else NUMPY_TO_DTYPE.get(np.dtype(dtype).name)
    if name is None:
        raise UnsupportedError(f"astype: dtype {dtype} is not supported")
    if name == x.dtype:
        return x
    return _add("cast", [x.value], x.shape, name)


def _acc_dtype(dtype: str) -> str:
    """Accumulate half-precision sums in f32 (what matrix units and careful libraries do)."""
    return "f32" if dtype in ("f16", "bf16") else dtype


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
    return _add("transpose", [t.value], tuple(t.shape[p] for p in perm), t.dtype, perm=perm)


def reshape(x: Tensor, shape: Sequence[int] | int) -> Tensor:
    """Reshape in row-major order; one dimension may be -1."""
    (t,) = _operands(x)
    dims = [int(shape)] if isinstance(shape, (int, np.integer)) else [int(d) for d in shape]
    size = math.prod(t.shape)
    if dims.count(-1) > 1 or any(d < -1 or d == 0 for d in dims):
        raise PbsdkError(f"reshape: invalid target shape {tuple(dims)}")
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        if size % known:
            raise PbsdkError(f"reshape: cannot reshape {t.shape} into {tuple(dims)}")
        dims[dims.index(-1)] = size // known
    if math.prod(dims) != size:
        raise PbsdkError(f"reshape: cannot reshape {t.shape} ({size} elements) into {tuple(dims)}")
    if tuple(dims) == t.shape:
        return t
    return _add("reshape", [t.value], tuple(dims), t.dtype)


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


def mean(x: Any, axis: Any = None, keepdims: bool = False) -> Tensor:
    (t,) = _operands(x)
    axes = _norm_axes("mean", axis, t.ndim)
    count = math.prod(t.shape[a] for a in axes)
    with _group("mean"):
        return mul(sum(t, axes, keepdims), 1.0 / count)


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
    acc = _acc_dtype(x.dtype)
    out = _add("matmul", [x.value, y.value], batch + (m, n), acc, transpose_a=transpose_a,
               transpose_b=transpose_b)
    if acc != x.dtype:
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
    acc = _acc_dtype(t.dtype)
    out = _add("conv2d", [t.value, k.value], shape, acc, stride=(sh, sw), dilation=(dh, dw), padding=pads,
               groups=int(groups), layout=layout)
    return astype(out, t.dtype) if acc != t.dtype else out


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


def slice(x: Any, axis: int, start: int | None = None, stop: int | None = None, step: int = 1) -> Tensor:
    """``x`` restricted to ``start:stop:step`` along ``axis`` (Python slice rules; ``step`` > 0)."""
    (t,) = _operands(x)
    (ax,) = _norm_axes("slice", axis, t.ndim)
    if not isinstance(step, (int, np.integer)) or step < 1:
        raise PbsdkError(f"slice: step must be a positive integer, got {step!r}")
    indices = range(*builtins.slice(start, stop, int(step)).indices(t.shape[ax]))
    if len(indices) == 0:
        raise PbsdkError(f"slice: {start}:{stop}:{step} of dimension {ax} (size {t.shape[ax]}) is empty")
    if len(indices) == t.shape[ax]:
        return t
    shape = t.shape[:ax] + (len(indices),) + t.shape[ax + 1:]
    starts = tuple(indices.start if i == ax else 0 for i in range(t.ndim))
    steps = tuple(indices.step if i == ax else 1 for i in range(t.ndim))
    return _add("slice", [t.value], shape, t.dtype, starts=starts, steps=steps)


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
            rows = _const(np.arange(sq, dtype=np.float64).reshape(sq, 1), s.dtype)
            cols = _const(np.arange(sk, dtype=np.float64).reshape(1, sk), s.dtype)
            s = where(greater(cols, rows), -math.inf, s)
        if mask is not None:
            s = add(s, mask)
        return matmul(softmax(s, -1), vt)
