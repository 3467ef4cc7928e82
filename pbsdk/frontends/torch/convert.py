"""Core-ATen FX nodes to `pbsdk.ops`: one converter per ATen overload.

A converter receives the node's arguments with every FX node replaced by what it converted to (a traced
`Tensor`, a tuple of them, or a Python value) and returns the same kind of thing. `lower_graph` runs the
converters over a (sub)graph under one trace; `node_supported` decides, for the partitioner, whether a
single node converts — by converting it on fresh inputs of its recorded shapes and checking the result
against the shape FX recorded (nothing is compiled).

pbsdk's graph is float-only, so torch's other dtypes are carried as floats inside a compiled partition:
``bool`` as an f32 mask of 0s and 1s, integers as f64 (exact below 2**53). Only ops that are exact on
such values accept integer results (`_INT_EXACT`); the partition boundary converts in and out.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from pbsdk import ops
from pbsdk.core.dims import Dim
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.ir.graph import Graph, TensorType
from pbsdk.frontends.registry import registrar
from pbsdk.frontends.torch.symbolic import as_dim, has_no_elements
from pbsdk.frontends.tracing import Tensor, tracing

aten = torch.ops.aten

_FLOATS = {torch.float32: "f32", torch.float64: "f64", torch.float16: "f16", torch.bfloat16: "bf16"}
_INTS = {torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8}


def graph_dtype(dtype: torch.dtype) -> str | None:
    """The pbsdk dtype that carries a torch dtype inside a partition, or None when none can."""
    if dtype in _FLOATS:
        return _FLOATS[dtype]
    if dtype == torch.bool:
        return "f32"
    if dtype in _INTS:
        return "f64"
    return None


def op_name(target: Any) -> str:
    """``aten.add.Tensor`` style name of an FX call target, in its operator namespace (``transformers.
    grouped_mm_fallback.default`` for a library's custom op), for logs and the converter table."""
    if isinstance(target, torch._ops.OpOverload):
        namespace, name = target._schema.name.split("::")
        return f"{namespace}.{name}.{target._overloadname}"
    if target is operator.getitem:
        return "getitem"
    return getattr(target, "__name__", str(target))


class Context:
    """State of one lowering: constants by value id (so layout ops on frozen weights fold), transposes
    by value id (so a matmul reads a transposed operand through its indexing map), and the current
    node's recorded output (a FakeTensor, or a sequence of them) and recorded inputs (their strides)."""

    def __init__(self, *, data_sizes: bool = False) -> None:
        #: The target compiles sizes known only at run time: a grouped matmul of constant weights becomes one
        #: matmul per group on its own rows (``ops.grouped_matmul``) instead of every row times every expert.
        self.data_sizes = data_sizes
        self.consts: dict[int, np.ndarray] = {}
        self.transposes: dict[int, Tensor] = {}
        self.stored: dict[int, tuple[Tensor, int]] = {}  # quantize results -> their i8 and its offset (quantized.py)
        self.row_gathers: dict[int, tuple[Tensor, Tensor]] = {}  # x[index] (rows) -> (x, index)
        self.expert_rows: dict[int, ExpertRows] = {}  # grouped_mm results (and row-wise ops of them)
        self.meta: Any = None
        self.target: Any = None  # the node's OpOverload, for converters shared by several overloads
        self.in_meta: list[Any] = []  # the recorded values of the node's FX operands, in argument order

    @property
    def out_dtype(self) -> str:
        val = self.meta[0] if isinstance(self.meta, (tuple, list)) else self.meta
        dt = graph_dtype(val.dtype)
        if dt is None:
            raise UnsupportedError(f"result dtype {val.dtype} is not supported")
        return dt

    def const(self, array: np.ndarray, dtype: str, *, copy: bool = True) -> Tensor:
        t = ops._const(array, dtype, copy=copy)
        self.consts[t.value.id] = np.asarray(array)
        return t

    def const_of(self, x: Any) -> np.ndarray | None:
        return self.consts.get(x.value.id) if isinstance(x, Tensor) else None


@dataclasses.dataclass(frozen=True)
class ExpertRows:
    """A value whose row ``s`` is row ``token[s] * experts + group(s)`` of ``dense``, ``group(s)`` being the
    expert whose group holds row ``s`` by the grouped_mm offsets ``offs`` (a value id): what a grouped_mm
    of gathered token rows computes for every (token, expert) pair (`_grouped_mm`). A second grouped_mm
    with the same offsets then multiplies each expert's own rows of ``dense`` only."""

    dense: Tensor
    token: Tensor
    offs: int
    experts: int


@dataclasses.dataclass(frozen=True)
class Empty:
    """An operand with no elements (a KV cache before the first token): not a kernel input; converters that
    can ignore it (``cat``) do, any other refuses it."""

    shape: tuple[int, ...]


def operand(graph: Graph, meta: Any) -> Tensor | Empty:
    """A partition's (or a tried node's) operand of the recorded type ``meta``: a kernel input, or `Empty`."""
    if has_no_elements(meta):
        return Empty(tuple(meta.shape))
    return Tensor(graph.add("input", [], value_type(meta)), graph)


Converter = Callable[..., Any]
CONVERTERS: dict[str, Converter] = {}

#: Ops whose results are exact on integer values carried as f64 (others refuse integer results).
_INT_EXACT = {
    "aten.add.Tensor", "aten.add.Scalar", "aten.sub.Tensor", "aten.sub.Scalar", "aten.mul.Tensor",
    "aten.mul.Scalar", "aten.neg.default", "aten.abs.default", "aten.maximum.default", "aten.minimum.default",
    "aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default", "aten.where.self",
    "aten.full.default", "aten.full_like.default", "aten.scalar_tensor.default", "aten.arange.default",
    "aten.arange.start", "aten.arange.start_step", "aten.cat.default", "aten.slice.Tensor",
    "aten.select.int", "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
    "aten.permute.default", "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dim",
    "aten.squeeze.dims", "aten.squeeze.default", "aten.clone.default", "aten.alias.default",
    "aten.lift_fresh_copy.default", "aten._to_copy.default", "aten.split_with_sizes.default",
    "aten.split.Tensor", "aten.embedding.default", "aten.index_select.default", "aten.t.default",
    "aten.transpose.int", "aten.amax.default", "aten.amin.default", "getitem", "aten.floor.default",
    "aten.ceil.default", "aten.round.default", "aten.trunc.default", "aten.sign.default", "aten.repeat.default",
    "aten.copy.default", "aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default",
    "aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default", "aten.max.dim", "aten.min.dim",
    "aten.argmax.default", "aten.argmin.default", "aten.max.default", "aten.min.default", "aten.cumsum.default",
    "aten.gather.default", "aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default", "aten.index.Tensor",
    "aten.flip.default", "aten.roll.default", "aten.clamp.Tensor", "aten.clamp_min.Tensor", "aten.clamp_max.Tensor",
    "aten.fmod.Tensor", "aten.fmod.Scalar", "aten.remainder.Tensor", "aten.remainder.Scalar", "aten.div.Tensor_mode",
    "aten.div.Scalar_mode", "aten.bitwise_and.Tensor", "aten.bitwise_and.Scalar", "aten.bitwise_or.Tensor",
    "aten.bitwise_or.Scalar", "aten.bitwise_xor.Tensor", "aten.bitwise_xor.Scalar", "aten.bitwise_not.default",
    "aten.sum.dim_IntList", "aten.sum.default", "aten.index_put.default", "aten.slice_scatter.default",
    "aten.select_scatter.default", "aten.as_strided.default", "aten.topk.default", "aten.sort.default",
    "aten.sort.stable", "aten.empty_permuted.default", "aten.empty.memory_format",
}

#: Ops that only move or relabel data; a partition made of nothing else is left to torch.
LAYOUT_OPS = {
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.permute.default",
    "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
    "aten.squeeze.default", "aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default",
    "aten.t.default", "aten.transpose.int", "aten.slice.Tensor", "aten.select.int", "getitem",
    "aten.split_with_sizes.default", "aten.split.Tensor", "aten.as_strided.default",
}


converts = registrar(CONVERTERS)


def _tensor(x: Any, what: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise UnsupportedError(f"{what} must be a tensor, got {type(x).__name__}")
    return x


def _in(cx: Context, *xs: Any) -> list[Any]:
    """Operands of an arithmetic op in its result dtype (torch computes in the promoted dtype)."""
    dt = cx.out_dtype
    return [ops.astype(x, dt) if isinstance(x, Tensor) and x.dtype != dt else x for x in xs]


#: The dtype torch's CPU kernels compute a half-precision op in (its "opmath" type): normalisations, softmax,
#: means, and a product with a Python scalar read the operands as f32, compute in f32 and round
#: the result once (eager bf16 ``layer_norm``, ``softmax``, ``mean``, ``x * 0.044715``). Rounding every step
#: to bf16 instead differs from eager in most elements (1/768 as bf16 is 0.2% off; a squared deviation, an
#: exponential, a running sum each lose bits). `_check` rounds the f32 result to the recorded dtype.
_OPMATH = {"bf16": "f32", "f16": "f32"}


def _opmath(cx: Context, *xs: Any) -> list[Any]:
    """`_in`, but a half-precision result dtype computes in f32 (`_OPMATH`); ``None`` operands pass."""
    dt = _OPMATH.get(cx.out_dtype, cx.out_dtype)
    return [ops.astype(x, dt) if isinstance(x, Tensor) and x.dtype != dt else x for x in xs]


def _operand(v: Any) -> Any:
    """An arithmetic op's second operand: a tensor as it is, a size known at run time (a `Dim`: ``x / n``
    with ``n = x.shape[1]`` symbolic) as a 0-d tensor of its value, a Python scalar as a number."""
    if isinstance(v, Tensor):
        return v
    return ops.size_value(v) if isinstance(v, Dim) else _scalar(v)


def _scalar(v: Any) -> Any:
    if isinstance(v, bool):
        return float(v)
    if isinstance(v, (int, float)):
        return v
    raise UnsupportedError(f"scalar argument of type {type(v).__name__} is not supported")


def _dims(x: Tensor, dim: Any) -> tuple[int, ...]:
    """torch's dim argument: None or [] mean every dimension."""
    if x.ndim == 0:
        return ()
    if dim is None or (isinstance(dim, (list, tuple)) and len(dim) == 0):
        return tuple(range(x.ndim))
    dims = (dim,) if isinstance(dim, int) else tuple(dim)
    return tuple(d % max(x.ndim, 1) for d in dims)


# ------------------------------------------------------------------------------------------- elementwise

def _binary(fn: Callable[[Any, Any], Tensor], *, scalar_opmath: bool = False) -> Converter:
    """A binary op's converter; ``scalar_opmath``: with a Python scalar ``b``, computed in `_opmath` (the
    scalar is not rounded to a half-precision operand's dtype first, as torch's mul does not)."""
    def convert(cx: Context, a: Any, b: Any, *, alpha: Any = 1) -> Tensor:
        b = _operand(b)
        scalar = not isinstance(b, Tensor)
        a, b = (_opmath if scalar and scalar_opmath else _in)(cx, a, b)
        if alpha != 1:
            b = ops.mul(b, _scalar(alpha)) if isinstance(b, Tensor) else b * alpha
        return fn(a, b)
    return convert


for _n, _f in (("add", ops.add), ("sub", ops.sub), ("mul", ops.mul)):
    converts(f"aten.{_n}.Tensor", f"aten.{_n}.Scalar")(_binary(_f, scalar_opmath=_n == "mul"))
converts("aten.maximum.default")(_binary(ops.maximum))
converts("aten.minimum.default")(_binary(ops.minimum))


@converts("aten.rsub.Scalar", "aten.rsub.Tensor")
def _rsub(cx: Context, a: Any, b: Any, *, alpha: Any = 1) -> Tensor:
    a, b = _in(cx, a, b)
    return ops.sub(b, ops.mul(a, _scalar(alpha)) if alpha != 1 else a)


@converts("aten.div.Tensor", "aten.div.Scalar")
def _div(cx: Context, a: Any, b: Any) -> Tensor:
    a, b = _in(cx, a, _operand(b))
    return ops.div(a, b)


@converts("aten.div.Tensor_mode", "aten.div.Scalar_mode")
def _div_mode(cx: Context, a: Any, b: Any, *, rounding_mode: str | None = None) -> Tensor:
    """Division rounded toward -inf (``//``) or toward zero; integer operands exactly."""
    if rounding_mode is None:
        return _div(cx, a, b)
    a, b = _in(cx, a, _scalar(b) if not isinstance(b, Tensor) else b)
    if rounding_mode == "floor":
        return ops.floor_divide(a, b)
    if rounding_mode != "trunc":
        raise UnsupportedError(f"div with rounding_mode={rounding_mode!r}")
    if cx.out_dtype == "f64" and _int_result(cx):
        return ops.div(ops.sub(a, ops.fmod(a, b)), b)  # exact on whole numbers
    return ops.trunc(ops.div(a, b))


def _int_result(cx: Context) -> bool:
    val = cx.meta[0] if isinstance(cx.meta, (tuple, list)) else cx.meta
    return val.dtype in _INTS


for _n, _f in (("fmod", ops.fmod), ("remainder", ops.remainder), ("bitwise_and", ops.bitwise_and),
               ("bitwise_or", ops.bitwise_or), ("bitwise_xor", ops.bitwise_xor)):
    converts(f"aten.{_n}.Tensor", f"aten.{_n}.Scalar")(_binary(_f))


@converts("aten.bitwise_not.default")
def _bitwise_not(cx: Context, x: Any) -> Tensor:
    x = _tensor(x, "bitwise_not's input")
    return ops.sub(1.0, x) if cx.meta.dtype == torch.bool else ops.bitwise_not(x)


@converts("aten.logical_xor.default")
def _logical_xor(cx: Context, a: Any, b: Any) -> Tensor:
    return ops.not_equal(ops.astype(ops.not_equal(a, 0.0), "f32"), ops.astype(ops.not_equal(b, 0.0), "f32"))


_UNARY = {"neg": ops.neg, "exp": ops.exp, "log": ops.log, "tanh": ops.tanh, "sigmoid": ops.sigmoid,
          "relu": ops.relu, "erf": ops.erf, "sqrt": ops.sqrt, "rsqrt": ops.rsqrt, "abs": ops.abs,
          "log1p": ops.log1p, "expm1": ops.expm1, "sin": ops.sin, "cos": ops.cos, "tan": ops.tan,
          "floor": ops.floor, "ceil": ops.ceil, "trunc": ops.trunc}


def _unary(f: Any) -> Any:
    def convert(cx: Context, x: Any) -> Tensor:
        (v,) = _in(cx, x)
        return f(v)
    return convert


for _n, _uf in _UNARY.items():
    converts(f"aten.{_n}.default")(_unary(_uf))


@converts("aten.round.default")
def _round(cx: Context, x: Any) -> Tensor:
    return ops.round(*_in(cx, x))


@converts("aten.sign.default")
def _sign(cx: Context, x: Any) -> Tensor:
    (x,) = _in(cx, x)
    return ops.where(ops.isnan(x), 0.0, ops.sign(x))  # torch's sign of NaN is 0 (numpy's is NaN)


@converts("aten.isnan.default")
def _isnan(cx: Context, x: Any) -> Tensor:
    return ops.isnan(_tensor(x, "isnan's input"))


@converts("aten.isinf.default")
def _isinf(cx: Context, x: Any) -> Tensor:
    return ops.isinf(_tensor(x, "isinf's input"))


@converts("aten.reciprocal.default")
def _reciprocal(cx: Context, x: Any) -> Tensor:
    return ops.div(1.0, *_in(cx, x))


@converts("aten.silu.default")
def _silu(cx: Context, x: Any) -> Tensor:
    return ops.silu(*_in(cx, x))


@converts("aten.leaky_relu.default")
def _leaky_relu(cx: Context, x: Any, negative_slope: Any = 0.01) -> Tensor:
    (x,) = _in(cx, x)
    return ops.leaky_relu(x, float(_scalar(negative_slope)))


@converts("aten.elu.default")
def _elu(cx: Context, x: Any, alpha: Any = 1.0, scale: Any = 1.0, input_scale: Any = 1.0) -> Tensor:
    """``scale * (x if x > 0 else alpha * (exp(input_scale * x) - 1))`` (ELU, SELU; CELU decomposes to it)."""
    (x,) = _in(cx, x)
    negative = ops.mul(ops.expm1(ops.mul(x, float(_scalar(input_scale)))), float(_scalar(alpha)))
    return ops.mul(ops.where(ops.greater(x, 0.0), x, negative), float(_scalar(scale)))


@converts("aten.hardtanh.default")
def _hardtanh(cx: Context, x: Any, min_val: Any = -1.0, max_val: Any = 1.0) -> Tensor:
    (x,) = _in(cx, x)
    return ops.hardtanh(x, float(_scalar(min_val)), float(_scalar(max_val)))


@converts("aten.rrelu_with_noise_functional.default")
def _rrelu(cx: Context, x: Any, noise: Any, lower: Any = 1 / 8, upper: Any = 1 / 3, training: bool = False,
           generator: Any = None) -> tuple[Tensor, Any]:
    """RReLU in inference: a leaky ReLU of slope ``(lower + upper) / 2``; the noise passes through."""
    if training:
        raise UnsupportedError("rrelu in training mode (random slopes)")
    (x,) = _in(cx, x)
    return ops.leaky_relu(x, (float(_scalar(lower)) + float(_scalar(upper))) / 2), noise


@converts("aten.gelu.default")
def _gelu(cx: Context, x: Any, *, approximate: str = "none") -> Tensor:
    (v,) = _in(cx, x)
    return ops.gelu(v, approximate=approximate)


@converts("aten.pow.Tensor_Scalar")
def _pow_scalar(cx: Context, x: Any, e: Any) -> Tensor:
    (x,) = _in(cx, x)
    # Small integral exponents as products: exact for negative bases, and what torch computes.
    special = {1: lambda: x, 2: lambda: ops.mul(x, x), 3: lambda: ops.mul(ops.mul(x, x), x),
               0.5: lambda: ops.sqrt(x), -0.5: lambda: ops.rsqrt(x), -1: lambda: ops.div(1.0, x)}
    if e in special:
        return special[e]()
    if isinstance(e, (int, float)) and float(e).is_integer():
        raise UnsupportedError(f"pow with integer exponent {e} (a negative base would need care)")
    return ops.pow(x, float(e))


@converts("aten.pow.Tensor_Tensor")
def _pow(cx: Context, x: Any, e: Any) -> Tensor:
    return ops.pow(*_in(cx, x, e))


@converts("aten.clamp.default", "aten.clamp_min.default", "aten.clamp_max.default", "aten.clamp.Tensor",
          "aten.clamp_min.Tensor", "aten.clamp_max.Tensor")
def _clamp(cx: Context, x: Any, lo: Any = None, hi: Any = None) -> Tensor:
    if "clamp_max" in op_name(cx.target):
        lo, hi = None, lo
    (x, lo, hi) = _in(cx, x, lo, hi)
    if lo is not None:
        x = ops.maximum(x, lo if isinstance(lo, Tensor) else _scalar(lo))
    if hi is not None:
        x = ops.minimum(x, hi if isinstance(hi, Tensor) else _scalar(hi))
    return x


# Comparisons compute in the operands' promoted dtype and give a 0/1 mask (torch bool).
def _compare(fn: Callable[[Any, Any], Tensor]) -> Converter:
    def convert(cx: Context, a: Any, b: Any) -> Tensor:
        if not isinstance(b, Tensor):
            b = _scalar(b)
        elif a.dtype != b.dtype:
            wide = "f64" if "f64" in (a.dtype, b.dtype) else "f32"
            a, b = ops.astype(a, wide), ops.astype(b, wide)
        return fn(a, b)
    return convert


for _n, _f in (("eq", ops.equal), ("ne", ops.not_equal), ("lt", ops.less), ("le", ops.less_equal),
               ("gt", ops.greater), ("ge", ops.greater_equal)):
    converts(f"aten.{_n}.Tensor", f"aten.{_n}.Scalar")(_compare(_f))


@converts("aten.logical_not.default")
def _logical_not(cx: Context, x: Any) -> Tensor:
    return ops.equal(x, 0.0)


@converts("aten.logical_and.default")
def _logical_and(cx: Context, a: Any, b: Any) -> Tensor:
    return ops.mul(ops.astype(ops.not_equal(a, 0.0), "f32"), ops.astype(ops.not_equal(b, 0.0), "f32"))


@converts("aten.logical_or.default")
def _logical_or(cx: Context, a: Any, b: Any) -> Tensor:
    return ops.maximum(ops.astype(ops.not_equal(a, 0.0), "f32"), ops.astype(ops.not_equal(b, 0.0), "f32"))


@converts("aten.where.self", "aten.where.ScalarSelf", "aten.where.ScalarOther", "aten.where.Scalar")
def _where(cx: Context, cond: Any, a: Any, b: Any) -> Tensor:
    a, b = _in(cx, a, b)
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        a = ops.broadcast_to(ops.astype(ops.mul(_tensor(cond, "where's condition"), 0.0), cx.out_dtype),
                             cond.shape) + _scalar(a)
    return ops.where(_tensor(cond, "where's condition"), a, b)


# -------------------------------------------------------------------------------------------- creation

def _full(cx: Context, shape: Sequence[int], value: Any) -> Tensor:
    scalar = cx.const(np.asarray(float(_scalar(value))), cx.out_dtype)
    return ops.broadcast_to(scalar, tuple(shape)) if tuple(shape) else scalar


@converts("aten.full.default")
def _full_default(cx: Context, size: Sequence[int], value: Any, **_: Any) -> Tensor:
    return _full(cx, size, value)


@converts("aten.empty.memory_format", "aten.empty_permuted.default")
def _empty(cx: Context, size: Sequence[int], *_: Any, **__: Any) -> Tensor:
    return _full(cx, size, 0.0)  # an empty tensor's contents are unspecified: zeros are as good as any


@converts("aten.full_like.default")
def _full_like(cx: Context, x: Any, value: Any, **_: Any) -> Tensor:
    return _full(cx, _tensor(x, "full_like's input").shape, value)


@converts("aten.scalar_tensor.default")
def _scalar_tensor(cx: Context, value: Any, **_: Any) -> Tensor:
    return _full(cx, (), value)


@converts("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(cx: Context, *args: Any, **_: Any) -> Tensor:
    if any(isinstance(a, Dim) for a in args):
        # arange(end) / arange(start, end[, 1]) with an int start and a size known at run time.
        start, end, step = (0, args[0], 1) if len(args) == 1 else (*args[:2], args[2] if len(args) > 2 else 1)
        if isinstance(start, Dim) or step != 1:
            raise UnsupportedError(f"arange({start}, {end}, {step}): only an int start and a unit step with a "
                                   "size known at run time")
        iota = ops.iota(end - start, cx.out_dtype)
        return ops.add(iota, float(start)) if start else iota
    values = np.arange(*[_scalar(a) for a in args], dtype=np.float64)
    if cx.out_dtype == "f64" and np.abs(values).max(initial=0) >= 2 ** 53:
        raise UnsupportedError("arange beyond 2**53")
    return cx.const(values, cx.out_dtype)


# ---------------------------------------------------------------------------------------- contractions

#: Pass a transposed 2-D operand to ``ops.matmul`` as ``transpose_a/b`` instead of as the transposed value.
#: Off: either way the core emits a ``linalg.transpose`` feeding a row-major ``linalg.matmul`` (what every
#: target's kernels take), and the cpu target's packed kernel then reads the transpose's source through
#: its packing (`pbsdk.targets.cpu.transposed_reads`); on, a batch that broadcasts would become a generic
#: contraction.
TRANSPOSED_READS = False


def _matmul(cx: Context, a: Tensor, b: Tensor) -> Tensor:
    """a @ b, reading a 2-D operand that is a transposed value through the transposed map (no copy)."""
    a, b = _in(cx, a, b)
    ta = TRANSPOSED_READS and a.ndim == 2 and a.value.id in cx.transposes and cx.const_of(a) is None
    tb = TRANSPOSED_READS and b.ndim == 2 and b.value.id in cx.transposes and cx.const_of(b) is None
    return ops.matmul(cx.transposes[a.value.id] if ta else a, cx.transposes[b.value.id] if tb else b,
                      transpose_a=ta, transpose_b=tb)


@converts("aten.mm.default", "aten.bmm.default", "aten.matmul.default")
def _mm(cx: Context, a: Any, b: Any) -> Tensor:
    return _matmul(cx, _tensor(a, "mm's lhs"), _tensor(b, "mm's rhs"))


@converts("aten.addmm.default", "aten.baddbmm.default")
def _addmm(cx: Context, bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Tensor:
    prod = _matmul(cx, _tensor(a, "addmm's lhs"), _tensor(b, "addmm's rhs"))
    if alpha != 1:
        prod = ops.mul(prod, _scalar(alpha))
    if beta == 0:
        return prod
    (bias,) = _in(cx, bias)
    return ops.add(prod, ops.mul(bias, _scalar(beta)) if beta != 1 else bias)


@converts("aten.convolution.default")
def _convolution(cx: Context, x: Any, w: Any, bias: Any, stride: Sequence[int], padding: Sequence[int],
                 dilation: Sequence[int], transposed: bool, output_padding: Sequence[int], groups: int) -> Tensor:
    """1-D, 2-D and 3-D convolutions, plain and transposed (``pbsdk.ops.conv1d/conv2d/conv3d/conv_transpose``)."""
    x, w = _in(cx, _tensor(x, "convolution's input"), _tensor(w, "convolution's weight"))
    nsp = x.ndim - 2
    if nsp not in (1, 2, 3):
        raise UnsupportedError(f"{nsp}-D convolution")

    def spatial(v: Sequence[int]) -> tuple[int, ...]:
        return tuple(v) * nsp if len(v) == 1 else tuple(v)

    if transposed:
        out = ops.conv_transpose(x, w, stride=spatial(stride), padding=spatial(padding),
                                 output_padding=spatial(output_padding), dilation=spatial(dilation), groups=groups)
    else:
        conv = {1: ops.conv1d, 2: ops.conv2d, 3: ops.conv3d}[nsp]
        out = conv(x, w, stride=spatial(stride), padding=spatial(padding), dilation=spatial(dilation), groups=groups)
    if bias is not None:
        (bias,) = _in(cx, bias)
        out = ops.add(out, ops.reshape(bias, (1, -1) + (1,) * nsp))
    return out


# ------------------------------------------------------------------------------ normalisations, softmax

@converts("aten._softmax.default")
def _softmax(cx: Context, x: Any, dim: int, half_to_float: bool) -> Tensor:
    (v,) = _opmath(cx, x)
    return ops.softmax(v, axis=dim)


@converts("aten._log_softmax.default")
def _log_softmax(cx: Context, x: Any, dim: int, half_to_float: bool) -> Tensor:
    (v,) = _opmath(cx, x)
    return ops.log_softmax(v, axis=dim)


@converts("aten.native_layer_norm.default")
def _layer_norm(cx: Context, x: Any, shape: Sequence[int], w: Any, b: Any, eps: float) -> tuple[Tensor, ...]:
    x = _tensor(x, "layer_norm's input")
    axes = tuple(range(x.ndim - len(shape), x.ndim))
    (xf, w, b) = _opmath(cx, x, w, b)
    out = ops.layernorm(xf, w, b, axis=axes, eps=eps)
    mean = ops.mean(xf, axes, keepdims=True)
    centred = ops.sub(xf, mean)
    rstd = ops.rsqrt(ops.add(ops.mean(ops.mul(centred, centred), axes, keepdims=True), eps))
    return out, mean, rstd


@converts("aten._native_batch_norm_legit_no_training.default")
def _batch_norm(cx: Context, x: Any, w: Any, b: Any, mean: Any, var: Any, momentum: float,
                eps: float) -> tuple[Any, ...]:
    (x, mean, var, w, b) = _opmath(cx, _tensor(x, "batch_norm's input"), mean, var, w, b)
    out = ops.batch_norm(x, mean, var, w, b, eps=eps)
    return out, None, None  # the saved statistics of training are empty tensors pbsdk cannot return


def _stats(x: Tensor, axes: tuple[int, ...], eps: float) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, biased variance and ``1/sqrt(var + eps)`` over ``axes``, without the kept dimensions."""
    mean = ops.mean(x, axes)
    centred = ops.sub(x, ops.mean(x, axes, keepdims=True))
    var = ops.mean(ops.mul(centred, centred), axes)
    return mean, var, ops.rsqrt(ops.add(var, eps))


@converts("aten._native_batch_norm_legit.no_stats", "aten._native_batch_norm_legit_functional.default")
def _batch_norm_training(cx: Context, x: Any, w: Any, b: Any, *args: Any) -> tuple[Any, ...]:
    """Batch norm with the batch's own statistics (training mode; instance norm is one over (1, N*C, ...)):
    the output, the saved mean and 1/std; with running statistics (the functional form), their updates
    ``(1 - momentum) * running + momentum * batch`` (the variance unbiased)."""
    running, (training, momentum, eps) = (args[:2], args[2:]) if len(args) == 5 else ((None, None), args)
    if not training:
        raise UnsupportedError("_native_batch_norm_legit without training uses the no_training overload")
    (x, w, b) = _in(cx, _tensor(x, "batch_norm's input"), w, b)
    axes = tuple(a for a in range(x.ndim) if a != 1)
    mean, var, rstd = _stats(x, axes, eps)
    out = ops.batch_norm(x, mean, var, w, b, eps=eps)  # one set of statistics, also the saved outputs
    if running[0] is None:
        return out, mean, rstd
    n = math.prod(x.shape[a] for a in axes)
    rm, rv = _in(cx, *running)
    new_mean = ops.add(ops.mul(rm, 1 - momentum), ops.mul(mean, momentum))
    new_var = ops.add(ops.mul(rv, 1 - momentum), ops.mul(var, momentum * n / max(n - 1, 1)))
    return out, mean, rstd, new_mean, new_var


@converts("aten.native_group_norm.default")
def _group_norm(cx: Context, x: Any, w: Any, b: Any, n: int, c: int, hw: int, groups: int,
                eps: float) -> tuple[Tensor, ...]:
    """Group norm (instance norm with one channel per group); the saved mean and 1/std are (N, groups)."""
    (x, w, b) = _opmath(cx, _tensor(x, "group_norm's input"), w, b)
    out = ops.group_norm(x, groups, w, b, eps=eps)
    mean, _, rstd = _stats(ops.reshape(x, (n, groups, -1)), (2,), eps)
    return out, mean, rstd


# ------------------------------------------------------------------------------------------ reductions

@converts("aten.sum.dim_IntList", "aten.sum.default")
def _sum(cx: Context, x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    (x,) = _in(cx, x)
    return ops.sum(x, _dims(x, dim), keepdims=keepdim)


@converts("aten.mean.dim", "aten.mean.default")
def _mean(cx: Context, x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    (x,) = _opmath(cx, x)
    return ops.mean(x, _dims(x, dim), keepdims=keepdim)


@converts("aten.amax.default")
def _amax(cx: Context, x: Any, dim: Any = (), keepdim: bool = False) -> Tensor:
    return ops.max(x, _dims(x, dim), keepdims=keepdim)


@converts("aten.amin.default")
def _amin(cx: Context, x: Any, dim: Any = (), keepdim: bool = False) -> Tensor:
    return ops.min(x, _dims(x, dim), keepdims=keepdim)


@converts("aten.max.dim", "aten.min.dim")
def _max_min_dim(cx: Context, x: Any, dim: int, keepdim: bool = False) -> tuple[Tensor, Tensor]:
    """Values and indices of the extremes along ``dim`` (the first one; a NaN is the extreme)."""
    largest = "max" in op_name(cx.target)
    return (ops.max_with_index if largest else ops.min_with_index)(_tensor(x, "the input"), dim, keepdim)


@converts("aten.argmax.default", "aten.argmin.default")
def _argmax(cx: Context, x: Any, dim: int | None = None, keepdim: bool = False) -> Tensor:
    x = _tensor(x, "the input")
    fn = ops.argmax if "argmax" in op_name(cx.target) else ops.argmin
    if dim is None and keepdim:
        return ops.reshape(fn(x), (1,) * x.ndim)
    return fn(x, dim, keepdims=keepdim)


@converts("aten.max.default", "aten.min.default")
def _max_min_all(cx: Context, x: Any) -> Tensor:
    return (ops.max if "max" in op_name(cx.target) else ops.min)(_tensor(x, "the input"))


@converts("aten.cumsum.default")
def _cumsum(cx: Context, x: Any, dim: int, *, dtype: Any = None) -> Tensor:
    (x,) = _in(cx, x)
    return ops.cumsum(x, dim)


@converts("aten.cumprod.default")
def _cumprod(cx: Context, x: Any, dim: int, *, dtype: Any = None) -> Tensor:
    (x,) = _in(cx, x)
    return ops.cumprod(x, dim)


@converts("aten.prod.dim_int", "aten.prod.default")
def _prod(cx: Context, x: Any, dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Tensor:
    (x,) = _in(cx, x)
    return ops.prod(x, _dims(x, dim), keepdims=keepdim)


@converts("aten.linalg_vector_norm.default")
def _vector_norm(cx: Context, x: Any, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                 dtype: Any = None) -> Tensor:
    (x,) = _in(cx, x)
    return ops.vector_norm(x, float(_scalar(ord)), _dims(x, dim), keepdims=keepdim)


@converts("aten.any.dim", "aten.any.dims", "aten.any.default")
def _any(cx: Context, x: Any, dim: Any = None, keepdim: bool = False) -> Tensor:
    mask = ops.astype(ops.not_equal(x, 0.0), "f32")
    return ops.max(mask, _dims(mask, dim), keepdims=keepdim)


@converts("aten.var.correction")
def _var(cx: Context, x: Any, dim: Any = None, *, correction: Any = None, keepdim: bool = False) -> Tensor:
    (x,) = _opmath(cx, x)
    axes = _dims(x, dim)
    n = math.prod(x.shape[a] for a in axes)
    c = 1 if correction is None else correction
    if n - c <= 0:
        raise UnsupportedError("var with no degrees of freedom")
    centred = ops.sub(x, ops.mean(x, axes, keepdims=True))
    return ops.mul(ops.sum(ops.mul(centred, centred), axes, keepdims=keepdim), 1.0 / (n - c))


def _window(v: Sequence[int], n: int) -> tuple[int, ...]:
    return tuple(v) * n if len(v) == 1 else tuple(v)


@converts("aten.max_pool2d_with_indices.default", "aten.max_pool3d_with_indices.default")
def _max_pool(cx: Context, x: Any, kernel_size: Sequence[int], stride: Sequence[int] = (),
              padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,), ceil_mode: bool = False) -> tuple[Tensor, Tensor]:
    """Max pooling and the flat indices of the maxima (dead code in the kernel when nothing uses them)."""
    n = 3 if len(kernel_size) == 3 or (x.ndim == 5 and len(kernel_size) == 1) else 2
    return ops.max_pool(_tensor(x, "max_pool's input"), _window(kernel_size, n), _window(stride, n) if stride else None,
                        _window(padding, n), _window(dilation, n), ceil_mode=ceil_mode, return_indices=True)


@converts("aten.avg_pool2d.default", "aten.avg_pool3d.default")
def _avg_pool(cx: Context, x: Any, kernel_size: Sequence[int], stride: Sequence[int] = (),
              padding: Sequence[int] = (0,), ceil_mode: bool = False, count_include_pad: bool = True,
              divisor_override: int | None = None) -> Tensor:
    n = 3 if len(kernel_size) == 3 or (x.ndim == 5 and len(kernel_size) == 1) else 2
    (x,) = _in(cx, x)
    return ops.avg_pool(x, _window(kernel_size, n), _window(stride, n) if stride else None, _window(padding, n),
                        ceil_mode=ceil_mode, count_include_pad=count_include_pad, divisor_override=divisor_override)


@converts("aten._adaptive_avg_pool2d.default", "aten._adaptive_avg_pool3d.default")
def _adaptive_avg_pool(cx: Context, x: Any, size: Sequence[int]) -> Tensor:
    (x,) = _in(cx, x)
    return ops.adaptive_avg_pool(x, tuple(size))


@converts("aten.adaptive_max_pool2d.default", "aten.adaptive_max_pool3d.default")
def _adaptive_max_pool(cx: Context, x: Any, size: Sequence[int]) -> tuple[Tensor, Tensor]:
    """Adaptive max pooling with indices: where the windows tile the input (uneven ones fall back)."""
    return ops.adaptive_max_pool(_tensor(x, "adaptive_max_pool's input"), tuple(size), return_indices=True)


# ---------------------------------------------------------------------------------------------- layout

def _layout(cx: Context, x: Any, fn: Callable[[np.ndarray], np.ndarray], traced: Callable[[Tensor], Tensor]) -> Tensor:
    """A layout op; applied to a constant it folds into a new constant (a frozen weight's transpose)."""
    x = _tensor(x, "the input")
    value = cx.const_of(x)
    if value is not None and value.size == math.prod(x.shape):
        # A fresh array or a view of a frozen parameter (which the partition checks on every call): held
        # without another copy.
        return cx.const(np.ascontiguousarray(fn(value.reshape(x.shape))), x.dtype, copy=False)
    return traced(x)


@converts("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
def _view(cx: Context, x: Any, shape: Sequence[int]) -> Tensor:
    return ops.reshape(_tensor(x, "view's input"), tuple(shape))


@converts("aten.permute.default")
def _permute(cx: Context, x: Any, dims: Sequence[int]) -> Tensor:
    x = _tensor(x, "permute's input")
    perm = tuple(d % max(x.ndim, 1) for d in dims)
    out = _layout(cx, x, lambda a: a.transpose(perm), lambda t: ops.transpose(t, perm))
    if x.ndim == 2 and perm == (1, 0):
        cx.transposes[out.value.id] = x
    return out


@converts("aten.t.default")
def _t(cx: Context, x: Any) -> Tensor:
    return _permute(cx, x, (1, 0)) if x.ndim == 2 else x


@converts("aten.transpose.int")
def _transpose(cx: Context, x: Any, a: int, b: int) -> Tensor:
    perm = list(range(x.ndim))
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(cx, x, perm)


@converts("aten.expand.default")
def _expand(cx: Context, x: Any, sizes: Sequence[int], *, implicit: bool = False) -> Tensor:
    x = _tensor(x, "expand's input")
    lead = len(sizes) - x.ndim
    shape = tuple(x.shape[i - lead] if s == -1 else s for i, s in enumerate(sizes))
    return ops.broadcast_to(x, shape)


@converts("aten.repeat.default")
def _repeat(cx: Context, x: Any, repeats: Sequence[int]) -> Tensor:
    return ops.tile(_tensor(x, "repeat's input"), tuple(repeats))


@converts("aten.copy.default")
def _copy(cx: Context, x: Any, src: Any, non_blocking: bool = False) -> Tensor:
    """The functional copy: ``src`` in ``x``'s dtype, broadcast to ``x``'s shape."""
    (src,) = _in(cx, src)
    return ops.broadcast_to(src, _tensor(x, "copy's destination").shape)


@converts("aten.unsqueeze.default")
def _unsqueeze(cx: Context, x: Any, dim: int) -> Tensor:
    dim = dim % (x.ndim + 1)
    return ops.reshape(x, x.shape[:dim] + (1,) + x.shape[dim:])


@converts("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze.default")
def _squeeze(cx: Context, x: Any, dim: Any = None) -> Tensor:
    dims = _dims(x, dim) if dim is not None else tuple(range(x.ndim))
    shape = tuple(d for i, d in enumerate(x.shape) if not (i in dims and d == 1))
    return ops.reshape(x, shape)


@converts("aten.clone.default", "aten.alias.default", "aten.lift_fresh_copy.default")
def _identity(cx: Context, x: Any, **_: Any) -> Tensor | Empty:
    """The input itself; an `Empty` one too (a cache's first keys, ``torch.tensor([])``, lifted as a
    constant), which only a consumer that ignores it (``cat``) may then take."""
    return x if isinstance(x, Empty) else _tensor(x, "the input")


#: The most elements an ``as_strided`` that re-reads storage is converted for (its gather's index table is a
#: compile-time constant of this many entries).
AS_STRIDED_MAX_ELEMENTS = 1 << 22


@converts("aten.as_strided.default")
def _as_strided(cx: Context, x: Any, size: Sequence[int], stride: Sequence[int],
                storage_offset: int | None = None) -> Tensor:
    """``as_strided`` as what it reads. A restride (the input's sizes and storage offset, its recorded stride
    on every dimension of more than one element: decompositions restride a result this way, e.g.
    adaptive_avg_pool2d's ``mean`` to channels-last) is the identity, pbsdk's values having no strides.
    Any other re-reads the input's storage — sliding windows, a transposed read, overlapping rows: a gather
    of the input's elements at the storage positions it names (`_storage_indices`), refused (the op stays
    with torch) where it names a position none of the input's elements holds."""
    x = _tensor(x, "as_strided's input")
    src = cx.in_meta[0] if cx.in_meta else None
    if not isinstance(src, torch.Tensor):
        raise UnsupportedError("as_strided: the input has no recorded strides")
    offset = src.storage_offset() if storage_offset is None else storage_offset
    if (tuple(size) == tuple(src.shape) and offset == src.storage_offset()
            and all(n <= 1 or s == t for n, s, t in zip(size, stride, src.stride()))):
        return x
    base = src.storage_offset()
    if not all(isinstance(v, int) for v in (base, offset, *src.shape, *src.stride(), *size, *stride)):
        raise UnsupportedError("as_strided: a re-read of storage needs static sizes, strides and offsets")
    index = _storage_indices(tuple(src.shape), tuple(src.stride()), int(base), tuple(size), tuple(stride),
                             int(offset))
    return ops.take(ops.reshape(x, (math.prod(x.shape),)), index, axis=0)


def _storage_indices(shape: tuple[int, ...], strides: tuple[int, ...], base: int, size: tuple[int, ...],
                     stride: tuple[int, ...], offset: int) -> np.ndarray:
    """For each element of ``as_strided(t, size, stride, offset)``, the flat (row-major) index of the element
    of ``t`` (of ``shape``, ``strides``, storage offset ``base``) that holds the storage position it reads."""
    if math.prod(size) > AS_STRIDED_MAX_ELEMENTS or math.prod(shape) > AS_STRIDED_MAX_ELEMENTS:
        raise UnsupportedError(f"as_strided: a re-read of storage converts up to {AS_STRIDED_MAX_ELEMENTS} "
                               "elements (a gather through a constant index table)")
    held = _positions(shape, strides, base)
    order = np.argsort(held, kind="stable")
    sorted_held = held[order]
    wanted = _positions(size, stride, offset)
    at = np.clip(np.searchsorted(sorted_held, wanted), 0, max(held.size - 1, 0))
    if held.size == 0 or not np.array_equal(sorted_held[at], wanted):
        raise UnsupportedError("as_strided: it reads storage none of its input's elements holds")
    return order[at].reshape(size).astype(np.int64)


def _positions(shape: tuple[int, ...], strides: tuple[int, ...], offset: int) -> np.ndarray:
    """The storage position of each element of a tensor of ``shape``, ``strides`` and storage ``offset``,
    in row-major order."""
    pos = np.full(shape, offset, np.int64)
    for d, (n, s) in enumerate(zip(shape, strides)):
        pos += (np.arange(n, dtype=np.int64) * s).reshape([-1 if i == d else 1 for i in range(len(shape))])
    return pos.reshape(-1)


@converts("aten._to_copy.default")
def _to_copy(cx: Context, x: Any, *, dtype: Any = None, **kwargs: Any) -> Tensor:
    x = _tensor(x, "_to_copy's input")
    device = kwargs.get("device")
    if device is not None and torch.device(device).type != "cpu":
        raise UnsupportedError(f"copy to device {device}")
    if dtype is None:
        return x
    if dtype == torch.bool:
        return ops.astype(ops.not_equal(x, 0.0), "f32")
    if dtype in _INTS and not _int_input(cx):
        return ops.astype(ops.trunc(x), "f64")  # toward zero, as C's conversion (a bool is already 0 or 1)
    return ops.astype(x, cx.out_dtype)


def _int_input(cx: Context) -> bool:
    """Whether the node's first operand was recorded as an integer tensor (carried as whole f64 numbers)."""
    src = cx.in_meta[0] if cx.in_meta else None
    return isinstance(src, torch.Tensor) and src.dtype in _INTS


@converts("aten.cat.default")
def _cat(cx: Context, xs: Sequence[Any], dim: int = 0) -> Tensor:
    # Operands without elements add nothing (torch.cat accepts them, a past KV cache of length 0 is one).
    return ops.concatenate(_in(cx, *(x for x in xs if not isinstance(x, Empty))), axis=dim)


@converts("aten.slice.Tensor")
def _slice(cx: Context, x: Any, dim: int = 0, start: Any = None, end: Any = None, step: int = 1) -> Tensor:
    x = _tensor(x, "slice's input")
    return ops.slice(x, dim, start, None if isinstance(end, int) and end >= 2 ** 62 else end, step)


@converts("aten.select.int")
def _select(cx: Context, x: Any, dim: int, index: int) -> Tensor:
    x = _tensor(x, "select's input")
    d = dim % x.ndim
    i = index % x.shape[d]
    return ops.reshape(ops.slice(x, d, i, i + 1), x.shape[:d] + x.shape[d + 1:])


@converts("aten.split_with_sizes.default")
def _split_with_sizes(cx: Context, x: Any, sizes: Sequence[int], dim: int = 0) -> tuple[Tensor, ...]:
    out, start = [], 0
    for s in sizes:
        out.append(ops.slice(x, dim, start, start + s))
        start += s
    return tuple(out)


@converts("aten.split.Tensor")
def _split(cx: Context, x: Any, size: int, dim: int = 0) -> tuple[Tensor, ...]:
    n = x.shape[dim % x.ndim]
    return _split_with_sizes(cx, x, [min(size, n - s) for s in range(0, n, size)], dim)


@converts("aten.constant_pad_nd.default")
def _pad(cx: Context, x: Any, pad: Sequence[int], value: Any = 0) -> Tensor:
    (x,) = _in(cx, x)
    for i in range(len(pad) // 2):
        d = x.ndim - 1 - i
        lo, hi = pad[2 * i], pad[2 * i + 1]
        if lo < 0 or hi < 0:
            x = ops.slice(x, d, max(-lo, 0), x.shape[d] - max(-hi, 0))
        parts = []
        for n in (max(lo, 0), None, max(hi, 0)):
            if n is None:
                parts.append(x)
            elif n:
                parts.append(_full(cx, x.shape[:d] + (n,) + x.shape[d + 1:], value))
        x = ops.concatenate(parts, axis=d)
    return x


@converts("aten.embedding.default")
def _embedding(cx: Context, w: Any, idx: Any, padding_idx: int = -1, scale_grad_by_freq: bool = False,
               sparse: bool = False) -> Tensor:
    return ops.take(_tensor(w, "embedding's weight"), _tensor(idx, "embedding's indices"), axis=0)


@converts("aten.index_select.default")
def _index_select(cx: Context, x: Any, dim: int, idx: Any) -> Tensor:
    x, idx = _tensor(x, "index_select's input"), _tensor(idx, "index_select's index")
    out = ops.take(x, idx, axis=dim)
    if dim % x.ndim == 0 and idx.ndim == 1:
        cx.row_gathers[out.value.id] = (x, ops._wrapped(idx, x.shape[0]))
    return out


@converts("aten.gather.default")
def _gather(cx: Context, x: Any, dim: int, index: Any, *, sparse_grad: bool = False) -> Tensor:
    return ops.take_along_axis(_tensor(x, "gather's input"), _tensor(index, "gather's index"), dim)


@converts("aten.scatter.src", "aten.scatter.value", "aten.scatter_add.default")
def _scatter(cx: Context, x: Any, dim: int, index: Any, src: Any, *, reduce: str | None = None) -> Tensor:
    if reduce is not None:
        raise UnsupportedError(f"scatter with reduce={reduce!r}")
    (x,) = _in(cx, x)
    src = _in(cx, src)[0] if isinstance(src, Tensor) else float(_scalar(src))
    add = "scatter_add" in op_name(cx.target)
    return ops.put_along_axis(x, _tensor(index, "scatter's index"), src, dim, reduce="add" if add else None)


@converts("aten.index.Tensor")
def _index(cx: Context, x: Any, indices: Sequence[Any]) -> Tensor:
    """``x[..., i, j, ...]`` with index tensors on adjacent dimensions (None elsewhere): those dimensions
    are flattened into one, indexed by the linear index (negative indices count from the end)."""
    x = _tensor(x, "index's input")
    where = [k for k, i in enumerate(indices) if i is not None]
    if not where or where != list(range(where[0], where[-1] + 1)):
        raise UnsupportedError("index with index tensors on non-adjacent dimensions")
    first, last = where[0], where[-1] + 1
    shape = ops._broadcast_shape("index", *(indices[k].shape for k in where))
    linear: Tensor | None = None
    for k in where:
        ik = ops.broadcast_to(_tensor(indices[k], "an index"), shape)
        ik = ops._wrapped(ik if ik.dtype == "f64" else ops.astype(ik, "f64"), x.shape[k])
        linear = ik if linear is None else ops.add(ops.mul(linear, ops.size_value(x.shape[k])), ik)
    assert linear is not None
    flat = ops.reshape(x, x.shape[:first] + (math.prod(x.shape[first:last]),) + x.shape[last:])
    out = ops.take(flat, linear, axis=first)
    if first == 0 and last == 1 and linear.ndim == 1:
        cx.row_gathers[out.value.id] = (x, linear)
    return out


@converts("aten.index_put.default")
def _index_put(cx: Context, x: Any, indices: Sequence[Any], values: Any, accumulate: bool = False) -> Tensor:
    """``x[..., i] = v`` (``+=`` when ``accumulate``) with one index tensor: 1-D integer indices along its
    dimension (`pbsdk.ops.put_along_axis`; past its pair limit, on a target that compiles run-time offsets,
    one slice written per index, `pbsdk.ops.put_slices`), or a boolean mask with one value (a masked fill)."""
    (x, values) = _in(cx, _tensor(x, "index_put's input"), _tensor(values, "index_put's values"))
    where = [k for k, i in enumerate(indices) if i is not None]
    if len(where) != 1:
        raise UnsupportedError("index_put with more than one index tensor")
    d = where[0]
    idx = _tensor(indices[d], "index_put's index")
    if idx.dtype == "f32":  # a boolean mask (integers are carried as f64)
        if math.prod(values.shape) != 1 or x.shape[d:d + idx.ndim] != idx.shape:
            raise UnsupportedError("index_put with a mask and more than one value")
        mask = ops.reshape(idx, idx.shape + (1,) * (x.ndim - d - idx.ndim))
        value = ops.reshape(values, ())
        return ops.add(x, ops.where(mask, value, 0.0)) if accumulate else ops.where(mask, value, x)
    if idx.ndim != 1:
        raise UnsupportedError("index_put with a multi-dimensional index")
    shape = x.shape[:d] + idx.shape + x.shape[d + 1:]
    wrapped = ops._wrapped(idx, x.shape[d])
    static = all(isinstance(n, int) for n in shape) and isinstance(x.shape[d], int)
    if (cx.data_sizes and not accumulate and isinstance(x.shape[d], int)
            and (not static or x.shape[d] * math.prod(shape) > ops.MAX_SCATTER_PAIRS)):
        # Too many (position, index) pairs to compare, or a count known only at run time (a prompt's length):
        # each slice written at its run-time position (a KV cache of 256 positions written at 128 at once).
        return ops.put_slices(x, wrapped, ops.broadcast_to(values, shape), d)
    if not static:
        raise UnsupportedError(f"index_put of {idx.shape[0]} indices into {x.shape[d]} positions: sizes known only "
                               "at run time need a target that compiles run-time offsets")
    spread = ops.broadcast_to(ops.reshape(wrapped, idx.shape + (1,) * (x.ndim - d - 1)), shape)
    return ops.put_along_axis(x, spread, ops.broadcast_to(values, shape), d, reduce="add" if accumulate else None)


@converts("aten.slice_scatter.default")
def _slice_scatter(cx: Context, x: Any, src: Any, dim: int = 0, start: Any = None, end: Any = None,
                   step: int = 1) -> Tensor:
    """``x`` with ``x[start:end:step]`` along ``dim`` replaced by ``src`` (a KV-cache write): the kept parts
    and ``src`` concatenated; with a step, written at the positions as `pbsdk.ops.put_along_axis`."""
    (x, src) = _in(cx, _tensor(x, "slice_scatter's input"), _tensor(src, "slice_scatter's source"))
    d = dim % x.ndim
    positions = range(*slice(start, end if end is None or end < 2 ** 62 else None, step).indices(x.shape[d]))
    if len(positions) != src.shape[d]:
        raise UnsupportedError(f"slice_scatter: {len(positions)} positions for a source of {src.shape[d]}")
    if step == 1:
        lo, hi = positions.start, positions.stop
        parts = ([ops.slice(x, d, 0, lo)] if lo > 0 else []) + [src] + \
            ([ops.slice(x, d, hi)] if hi < x.shape[d] else [])
        return ops.concatenate(parts, axis=d)
    idx = cx.const(np.asarray(positions, dtype=np.float64).reshape((-1,) + (1,) * (x.ndim - d - 1)), "f64")
    return ops.put_along_axis(x, ops.broadcast_to(idx, src.shape), src, d)


@converts("aten.select_scatter.default")
def _select_scatter(cx: Context, x: Any, src: Any, dim: int, index: int) -> Tensor:
    x = _tensor(x, "select_scatter's input")
    d = dim % x.ndim
    i = index % x.shape[d]
    src = ops.reshape(_tensor(src, "select_scatter's source"), x.shape[:d] + (1,) + x.shape[d + 1:])
    return _slice_scatter(cx, x, src, d, i, i + 1)


@converts("aten.flip.default")
def _flip(cx: Context, x: Any, dims: Sequence[int]) -> Tensor:
    x = _tensor(x, "flip's input")
    return _layout(cx, x, lambda a: np.flip(a, tuple(dims)), lambda t: ops.flip(t, tuple(dims)))


@converts("aten.roll.default")
def _roll(cx: Context, x: Any, shifts: Sequence[int], dims: Sequence[int] = ()) -> Tensor:
    return ops.roll(_tensor(x, "roll's input"), tuple(shifts), tuple(dims) if dims else None)


# ------------------------------------------------------------------------ routing (mixture of experts)

@converts("aten.topk.default")
def _topk(cx: Context, x: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> tuple[Tensor, Tensor]:
    """The ``k`` largest (smallest) along ``dim`` in order (also when ``sorted=False``, which leaves the order
    to the implementation), the earlier of equal elements first (`pbsdk.ops.topk`)."""
    return ops.topk(_tensor(x, "topk's input"), k, dim, largest=largest)


@converts("aten.sort.default", "aten.sort.stable")
def _sort(cx: Context, x: Any, dim: int = -1, descending: bool = False, *, stable: bool | None = None) -> tuple[Tensor, Tensor]:
    """A stable sort (which an unstable one may also return), NaN as the largest value (`pbsdk.ops.sort`)."""
    return ops.sort(_tensor(x, "sort's input"), dim, descending=descending)


@converts("aten.histc.default")
def _histc(cx: Context, x: Any, bins: int = 100, min: Any = 0, max: Any = 0) -> Tensor:
    """Counts of the elements in ``bins`` equal bins between ``min`` and ``max`` (torch's bin edges, each bin
    holding its lower edge, the last also ``max``; elements outside, and NaN, counted nowhere)."""
    (x,) = _in(cx, _tensor(x, "histc's input"))
    lo, hi = float(_scalar(min)), float(_scalar(max))
    if not lo < hi:
        raise UnsupportedError("histc without min < max (a range taken from the data)")
    with unset_fake_temporarily():  # converted under a tracer's fake mode: torch's own edges, computed now
        edges = torch.linspace(lo, hi, bins + 1, dtype=cx.meta.dtype).double().numpy()
    flat = ops.reshape(x, (math.prod(x.shape), 1))
    at_or_above = ops.sum(ops.greater_equal(flat, cx.const(edges[:bins].reshape(1, bins), x.dtype)), 0)
    above = ops.reshape(ops.sum(ops.greater(flat, hi)), (1,))  # beyond the last bin's upper edge
    return ops.sub(at_or_above, ops.concatenate([ops.slice(at_or_above, 0, 1), above], axis=0))


@converts("transformers.grouped_mm_fallback.default", "aten._grouped_mm.default")
def _grouped_mm(cx: Context, x: Any, w: Any, offs: Any = None, bias: Any = None, out_dtype: Any = None) -> Tensor:
    """Rows of ``x`` (grouped by expert: group ``e`` ends at row ``offs[e]``) times their group's matrix
    ``w[e]``; rows from ``offs[-1]`` on are zero. Where the target compiles sizes known at run time
    (``cx.data_sizes``) and the weights are constant f32, each group's rows are multiplied by their expert
    only (``ops.grouped_matmul``: one matmul per group, its row count read from ``offs``). Otherwise static
    shapes cannot size a group, so products are computed for every expert and each row's own is selected, on
    the fewest rows the operand allows:

    - ``x`` gathers rows of a smaller ``src`` (``hidden[perm // top_k]``, a mixture of experts' tokens):
      ``src @ [w_0 | w_1 | ...]``, every (token, expert) pair once; the result remembers that form
      (`ExpertRows`), and row-wise ops of it (the gate) are computed on it too (`_row_wise`);
    - ``x`` is such a form with the same offsets (the down projection): each expert's ``w[e]`` times its
      own rows of the form only, one batched matmul;
    - otherwise every row times every expert, ``x @ [w_0 | w_1 | ...]``."""
    x, w = _tensor(x, "grouped_mm's input"), _tensor(w, "grouped_mm's weight")
    if x.ndim != 2 or w.ndim != 3 or not isinstance(offs, Tensor) or bias is not None:
        raise UnsupportedError("grouped_mm other than 2-D rows x 3-D per-group weights with offsets, no bias")
    experts, k, n = w.shape
    weights = cx.const_of(w)
    if cx.data_sizes and x.dtype == w.dtype == "f32" and weights is not None:
        # Each group's rows times its expert only (a row count known at run time per group).
        matrices = [cx.const(np.ascontiguousarray(weights[e]), w.dtype, copy=False) for e in range(experts)]
        return ops.grouped_matmul(x, offs, matrices)
    rows = x.shape[0]
    row = cx.const(np.arange(rows, dtype=np.float64), "f64")
    ends = ops.reshape(ops.astype(offs, "f64"), (1, experts))
    group = ops.sum(ops.less_equal(ends, ops.reshape(row, (rows, 1))), 1)  # experts whose group ended by then
    own = ops.minimum(group, float(experts - 1))
    form = cx.expert_rows.get(x.value.id)
    gathered = cx.row_gathers.get(x.value.id)
    if form is not None and form.offs == offs.value.id and form.experts == experts:
        tokens = form.dense.shape[0] // experts
        per_expert = ops.transpose(ops.reshape(form.dense, (tokens, experts, k)), (1, 0, 2))
        products = ops.reshape(_matmul(cx, per_expert, w), (experts * tokens, n))  # [e * tokens + t]
        out = ops.take(products, ops.add(ops.mul(own, float(tokens)), form.token), axis=0)
    else:
        wide = ops.reshape(ops.transpose(w, (1, 0, 2)), (k, experts * n))  # folded for a frozen weight
        src, token = gathered if gathered is not None and gathered[0].shape[0] < rows else (x, row)
        dense = ops.reshape(_matmul(cx, src, wide), (src.shape[0] * experts, n))  # [t * experts + e]
        out = ops.take(dense, ops.add(ops.mul(token, float(experts)), own), axis=0)
        if src is not x:
            cx.expert_rows[out.value.id] = ExpertRows(dense, token, offs.value.id, experts)
    masked = ops.where(ops.less(ops.reshape(group, (rows, 1)), float(experts)), out, 0.0)
    if masked is not out and out.value.id in cx.expert_rows:
        cx.expert_rows[masked.value.id] = cx.expert_rows[out.value.id]  # rows beyond offs[-1]: masked again
    return masked


#: Ops whose every result row comes from the same row of each tensor operand (with ``dim`` off the rows for
#: split and slice): applied to `ExpertRows` operands they are computed on the dense forms too.
_ROW_WISE = {"aten.silu.default", "aten.gelu.default", "aten.sigmoid.default", "aten.relu.default",
             "aten.tanh.default", "aten.mul.Tensor", "aten.add.Tensor", "aten.sub.Tensor", "aten.mul.Scalar",
             "aten.add.Scalar", "aten.split.Tensor", "aten.split_with_sizes.default", "aten.slice.Tensor",
             "aten.clone.default", "aten._to_copy.default"}


def _row_wise(cx: Context, name: str, fn: Converter, args: Sequence[Any], kwargs: dict[str, Any],
              result: Any) -> None:
    """Record `ExpertRows` forms of ``result`` when a row-wise op reads only values of one form (same
    tokens and offsets) and scalars: the converter is applied to the dense forms as well. Unused, that
    computation is dead code; a grouped_mm reading the result uses it (`_grouped_mm`)."""
    tensors = [a for a in args if isinstance(a, Tensor)]
    forms = [cx.expert_rows.get(t.value.id) for t in tensors]
    if name not in _ROW_WISE or not forms or any(f is None for f in forms):
        return
    first = forms[0]
    assert first is not None
    if any(f is None or f.token is not first.token or f.offs != first.offs for f in forms):
        return
    if name.startswith(("aten.split", "aten.slice")):  # row-wise off the rows only; torch's default dim is 0
        at = 2 if name.startswith("aten.split") else 1
        dim = args[at] if len(args) > at else kwargs.get("dim", 0)
        if not isinstance(dim, int) or dim % tensors[0].ndim == 0:
            return
    dense_args = [cx.expert_rows[a.value.id].dense if isinstance(a, Tensor) else a for a in args]
    try:
        dense = fn(cx, *dense_args, **kwargs)
    except (PbsdkError, TypeError, ValueError, IndexError):
        return
    outs = list(result) if isinstance(result, (tuple, list)) else [result]
    denses = list(dense) if isinstance(dense, (tuple, list)) else [dense]
    for out, d in zip(outs, denses):
        if isinstance(out, Tensor) and isinstance(d, Tensor):
            d = ops.astype(d, out.dtype) if d.dtype != out.dtype else d
            cx.expert_rows[out.value.id] = ExpertRows(d, first.token, first.offs, first.experts)


@converts("getitem")
def _getitem(cx: Context, xs: Any, i: int) -> Any:
    item = xs[i]
    if item is None:
        raise UnsupportedError("this output of the op is not computed by pbsdk")
    return item


# ------------------------------------------------------------------------------------------------ driver

def _meta_items(meta: Any) -> list[Any]:
    return list(meta) if isinstance(meta, (tuple, list)) else [meta]


def _check(name: str, result: Any, meta: Any) -> Any:
    """The converter's result checked against the recorded shapes, cast to the carrying dtypes."""
    results = list(result) if isinstance(result, (tuple, list)) else [result]
    metas = _meta_items(meta)
    if len(results) != len(metas):
        raise UnsupportedError(f"{name}: converter gave {len(results)} results, torch records {len(metas)}")
    out: list[Tensor | Empty | None] = []
    for r, m in zip(results, metas):
        if r is None:
            out.append(None)
            continue
        if isinstance(r, Empty) and isinstance(m, torch.Tensor) and tuple(m.shape) == r.shape:
            out.append(r)  # an element-less value travels as itself
            continue
        if not isinstance(m, torch.Tensor) or not isinstance(r, Tensor):
            raise UnsupportedError(f"{name}: result is not a tensor")
        want = graph_dtype(m.dtype)
        if want is None:
            raise UnsupportedError(f"{name}: result dtype {m.dtype} is not supported")
        if m.dtype in _INTS and name not in _INT_EXACT:
            raise UnsupportedError(f"{name}: integer results are only supported for exact ops")
        if r.shape != tuple(as_dim(d) for d in m.shape):
            raise UnsupportedError(f"{name}: converter gave shape {r.shape}, torch records {tuple(m.shape)}")
        out.append(ops.astype(r, want) if r.dtype != want else r)
    return tuple(out) if isinstance(result, (tuple, list)) else out[0]


def convert_node(cx: Context, node: torch.fx.Node, env: dict[torch.fx.Node, Any]) -> Any:
    """Convert one call_function node whose inputs are already in ``env``."""
    name = op_name(node.target)
    fn = CONVERTERS.get(name)
    if fn is None:
        raise UnsupportedError(f"no pbsdk converter for {name}", op=name)
    args = torch.fx.node.map_arg(node.args, lambda n: env[n])
    kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: env[n])
    cx.meta = node.meta.get("val")
    cx.target = node.target
    cx.in_meta = [n.meta.get("val") for n in node.args if isinstance(n, torch.fx.Node)]
    if cx.meta is None:
        raise UnsupportedError(f"{name}: the node has no recorded shape", op=name)
    try:
        result = fn(cx, *args, **kwargs)
    except UnsupportedError:
        raise
    except (PbsdkError, TypeError, ValueError, IndexError, KeyError, AttributeError) as exc:
        raise UnsupportedError(f"{name}: {exc}", op=name) from exc
    checked = _check(name, result, cx.meta)
    if cx.expert_rows:
        _row_wise(cx, name, fn, args, kwargs, checked)
    return checked


def value_type(meta: Any) -> TensorType:
    """The pbsdk type carrying a recorded torch tensor (FakeTensor or real)."""
    if not isinstance(meta, torch.Tensor):
        raise UnsupportedError(f"a {type(meta).__name__} input is not a tensor")
    dt = graph_dtype(meta.dtype)
    if dt is None:
        raise UnsupportedError(f"dtype {meta.dtype} is not supported")
    shape: tuple[Any, ...] = tuple(as_dim(d) for d in meta.shape)  # Dims where symbolic (see TensorType)
    if any(d == 0 for d in shape):
        raise UnsupportedError(f"empty tensor of shape {shape}")
    return TensorType(shape, dt)


def node_supported(node: torch.fx.Node, *, data_sizes: bool = False) -> tuple[bool, str]:
    """Whether ``node`` converts, tried on fresh inputs of its recorded input types (``data_sizes``: for a target
    that compiles run-time sizes, `Context.data_sizes`); and why not."""
    if node.op != "call_function":
        return False, f"{node.op} nodes are not converted"
    name = op_name(node.target)
    if name not in CONVERTERS:
        return False, "no converter"
    graph = Graph()
    cx = Context(data_sizes=data_sizes)
    env: dict[torch.fx.Node, Any] = {}
    try:
        with tracing(graph):
            for n in node.all_input_nodes:
                meta = n.meta.get("val")
                if isinstance(meta, torch.SymInt):
                    env[n] = as_dim(meta)
                elif isinstance(meta, (tuple, list)):
                    env[n] = tuple(Tensor(graph.add("input", [], value_type(m)), graph) if m is not None
                                   and isinstance(m, torch.Tensor) and not has_no_elements(m) else None for m in meta)
                else:
                    env[n] = operand(graph, meta)
            convert_node(cx, node, env)
    except UnsupportedError as exc:
        return False, exc.reason
    except Exception as exc:  # noqa: BLE001 - a converter that fails leaves its op to torch, logged
        return False, f"the converter raised {type(exc).__name__}: {exc}"
    return True, ""

# quantized_decomposed (PT2E) converters register themselves with `converts`.
from pbsdk.frontends.torch import quantized as _quantized  # noqa: F401
