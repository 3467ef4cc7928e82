"""ONNX nodes to `pbsdk.ops`: one converter per ONNX op type.

A converter receives the node's inputs, each a traced `Tensor` (data computed at run time), a numpy array
(a value known at import: an initializer, a ``Constant``, or a folded shape computation) or None (an
omitted optional input), and returns one value per output the same way. A node whose inputs are all known
is folded at import through the ONNX reference evaluator (``onnx.reference``), whatever its op: that is how
``Shape -> Gather -> Concat -> Reshape`` chains become static shapes.

pbsdk's graph is float-only, so ONNX's other element types are carried as floats inside a kernel, as the
torch frontend does: ``bool`` as an f32 mask of 0s and 1s, integers as f64 (exact below 2**53); the model's
boundary (`pbsdk.onnx.model`) converts in and out. Every result is checked against the shape ONNX shape
inference recorded for it, so a converter's mistake is an error, never a silently wrong result.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from pbsdk import ops
from pbsdk.core.dims import Dim
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.frontends.registry import registrar
from pbsdk.frontends.tracing import Tensor
from pbsdk.onnx import symbolic

#: ONNX TensorProto element types pbsdk can carry: numpy dtype and the graph dtype that carries it.
ELEM_TYPES: dict[int, tuple[Any, str]] = {
    1: (np.float32, "f32"), 11: (np.float64, "f64"), 10: (np.float16, "f16"),
    2: (np.uint8, "f64"), 3: (np.int8, "f64"), 4: (np.uint16, "f64"), 5: (np.int16, "f64"),
    6: (np.int32, "f64"), 7: (np.int64, "f64"), 12: (np.uint32, "f64"), 13: (np.uint64, "f64"),
    9: (np.bool_, "f32"),
    16: (ml_dtypes.bfloat16, "bf16"),
    22: (ml_dtypes.int4, "f64"), 21: (ml_dtypes.uint4, "f64"), 26: (ml_dtypes.int2, "f64"), 25: (ml_dtypes.uint2, "f64"),
}
BOOL = 9
FLOATS = {1, 10, 11, 16}
#: The 4- and 2-bit integers (``ml_dtypes``, numpy kind "V"): integers like the others, carried as f64.
NARROW_INTS = frozenset(np.dtype(d) for d in (ml_dtypes.int4, ml_dtypes.uint4, ml_dtypes.int2, ml_dtypes.uint2))


def is_integer(dtype: Any) -> bool:
    """Whether numpy ``dtype`` is an integer one (the 4- and 2-bit ones too)."""
    return np.dtype(dtype).kind in "iu" or np.dtype(dtype) in NARROW_INTS


def carrier(elem_type: int, what: str) -> str:
    """The graph dtype carrying ONNX element type ``elem_type``."""
    found = ELEM_TYPES.get(elem_type)
    if found is None:
        import onnx

        name = onnx.TensorProto.DataType.Name(elem_type) if elem_type in onnx.TensorProto.DataType.values() \
            else str(elem_type)
        raise UnsupportedError(f"{what}: element type {name} is not supported "
                               f"(supported: float, double, float16, bfloat16, integers, bool)")
    return found[1]


@dataclasses.dataclass(frozen=True)
class NodeInfo:
    """What a converter sees of one ONNX node."""

    op_type: str
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, Any]
    opset: int
    #: inferred (elem_type, shape or None) of each input and output, None where inference gave nothing
    in_types: tuple[tuple[int, tuple[int, ...] | None] | None, ...]
    out_types: tuple[tuple[int, tuple[int, ...] | None] | None, ...]

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def in_elem(self, i: int) -> int | None:
        t = self.in_types[i] if i < len(self.in_types) else None
        return t[0] if t else None

    def out_elem(self, i: int = 0) -> int | None:
        t = self.out_types[i] if i < len(self.out_types) else None
        return t[0] if t else None


Converter = Callable[..., Any]
CONVERTERS: dict[str, Converter] = {}


converts = registrar(CONVERTERS)


Value = Any  # Tensor | np.ndarray | None


def tensor(x: Value, dtype: str | None = None) -> Tensor:
    """A traced tensor of ``x`` (a known array becomes a constant, integers and bools carried as floats)."""
    if isinstance(x, Tensor):
        return ops.astype(x, dtype) if dtype and x.dtype != dtype else x
    if x is None:
        raise UnsupportedError("an omitted input is needed here")
    array = np.asarray(x)
    if symbolic.is_symbolic(array):  # sizes read as data: each symbol's value read by the kernel
        return _sizes_as_data(array, dtype or "f64")
    if array.dtype.name in ("float16", "float32", "float64", "bfloat16"):
        carried = {"float16": "f16", "float32": "f32", "float64": "f64", "bfloat16": "bf16"}[array.dtype.name]
    elif is_integer(array.dtype):
        carried = "f64"
        array = array.astype(np.float64)
    elif array.dtype.kind == "b":
        carried = "f32"
    else:
        raise UnsupportedError(f"a constant of dtype {array.dtype} is not supported")
    if array.ndim and any(d == 0 for d in array.shape):
        raise UnsupportedError(f"an empty constant of shape {array.shape} is used as data")
    t = ops._const(array, carried)
    return ops.astype(t, dtype) if dtype and dtype != carried else t


def _sizes_as_data(array: np.ndarray, dtype: str) -> Tensor:
    """A shape value (ints and `Dim`s, `pbsdk.onnx.symbolic`) as a ``dtype`` tensor of its sizes."""
    parts = [ops.reshape(ops.size_value(v, dtype), (1,)) if isinstance(v, Dim) else
             ops._const(np.asarray([float(v)]), dtype) for v in array.reshape(-1)]
    flat = ops.concatenate(parts, axis=0) if len(parts) > 1 else parts[0]
    return ops.reshape(flat, array.shape)


def known(x: Value, what: str) -> np.ndarray:
    """The value of an input that must be known at import (a shape, axes, pads...)."""
    if isinstance(x, Tensor):
        raise UnsupportedError(f"{what} must be known at import (a constant or a static shape computation); "
                               "here it is computed from the inputs' data")
    if x is None:
        raise UnsupportedError(f"{what} is missing")
    return np.asarray(x)


def ints(x: Value, what: str) -> list[int]:
    value = known(x, what)
    if symbolic.is_symbolic(value):
        raise UnsupportedError(f"{what} depends on the model's symbolic dimensions "
                               f"({', '.join(map(str, value.reshape(-1)))}); pbsdk needs it static here")
    return [int(v) for v in value.reshape(-1)]


def sizes(x: Value, what: str) -> list[Any]:
    """Sizes an op takes (a shape, a bound): ints, or `Dim`s where they come from symbolic dimensions."""
    return symbolic.sizes(known(x, what), what)


#: The inputs whose *value* a converter needs at import (`known`, `ints`: a shape, axes, pads, bounds), by op
#: type and input position, named as in the ONNX spec. A model input that reaches one of them is specialised
#: on its value at run time (`pbsdk.onnx.specialise`). Older opsets take these as attributes and have fewer
#: inputs, so a position beyond a node's inputs is simply absent.
VALUE_OPERANDS: dict[str, dict[int, str]] = {
    "Reshape": {1: "shape"}, "Expand": {1: "shape"}, "Tile": {1: "repeats"}, "Squeeze": {1: "axes"},
    "Unsqueeze": {1: "axes"}, "Split": {1: "split"}, "CumSum": {1: "axis"}, "Trilu": {1: "k"},
    "Slice": {1: "starts", 2: "ends", 3: "axes", 4: "steps"},
    "Pad": {1: "pads", 2: "constant_value", 3: "axes"},
    "Dropout": {1: "ratio", 2: "training_mode"},
    "ConstantOfShape": {0: "input"}, "Range": {0: "start", 1: "limit", 2: "delta"},
    **{op: {1: "axes"} for op in ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd",
                                  "ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")},
}

#: Inputs of which a converter reads only the static type and shape, never the data: a known value computed
#: from them needs no known value of them (``Shape(x)`` of a run-time ``x`` is known).
TYPE_ONLY: dict[str, tuple[int, ...]] = {"Shape": (0,), "Size": (0,), "CastLike": (1,), "EyeLike": (0,)}


def _shape(x: Value) -> tuple[int, ...]:
    return tuple(x.shape) if isinstance(x, Tensor) else tuple(np.shape(x))


def _is_int(node: NodeInfo, i: int = 0) -> bool:
    e = node.in_elem(i)
    return e is not None and e not in FLOATS and e != BOOL


# ------------------------------------------------------------------------------------------- elementwise

def _unary(fn: Callable[[Tensor], Tensor]) -> Converter:
    return lambda node, x: fn(tensor(x))


for _name, _fn in {
    "Relu": ops.relu, "Sigmoid": ops.sigmoid, "Tanh": ops.tanh, "Exp": ops.exp, "Log": ops.log,
    "Sqrt": ops.sqrt, "Erf": ops.erf, "Abs": ops.abs, "Neg": ops.neg, "Sin": ops.sin, "Cos": ops.cos,
    "Tan": ops.tan, "Floor": ops.floor, "Ceil": ops.ceil, "Sign": ops.sign, "Round": ops.round,
    "Softsign": ops.softsign, "Mish": ops.mish, "HardSwish": ops.hardswish, "IsNaN": ops.isnan,
}.items():
    converts(_name)(_unary(_fn))


@converts("Identity")
def _identity(node: NodeInfo, x: Value) -> Value:
    return x


@converts("Reciprocal")
def _reciprocal(node: NodeInfo, x: Value) -> Tensor:
    return ops.div(1.0, tensor(x))


@converts("Softplus")
def _softplus(node: NodeInfo, x: Value) -> Tensor:
    return ops.softplus(tensor(x))


@converts("Gelu")
def _gelu(node: NodeInfo, x: Value) -> Tensor:
    return ops.gelu(tensor(x), approximate=node.attr("approximate", "none"))


@converts("LeakyRelu")
def _leaky_relu(node: NodeInfo, x: Value) -> Tensor:
    return ops.leaky_relu(tensor(x), float(node.attr("alpha", 0.01)))


@converts("Elu")
def _elu(node: NodeInfo, x: Value) -> Tensor:
    return ops.elu(tensor(x), float(node.attr("alpha", 1.0)))


@converts("Celu")
def _celu(node: NodeInfo, x: Value) -> Tensor:
    return ops.celu(tensor(x), float(node.attr("alpha", 1.0)))


@converts("Selu")
def _selu(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    alpha, gamma = float(node.attr("alpha", 1.67326319217681884765625)), float(node.attr("gamma", 1.05070102214813232421875))
    return ops.mul(ops.where(ops.greater(t, 0.0), t, ops.mul(ops.sub(ops.exp(t), 1.0), alpha)), gamma)


@converts("HardSigmoid")
def _hard_sigmoid(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    y = ops.add(ops.mul(t, float(node.attr("alpha", 0.2))), float(node.attr("beta", 0.5)))
    return ops.minimum(ops.maximum(y, 0.0), 1.0)


@converts("ThresholdedRelu")
def _thresholded_relu(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    return ops.where(ops.greater(t, float(node.attr("alpha", 1.0))), t, 0.0)


@converts("PRelu")
def _prelu(node: NodeInfo, x: Value, slope: Value) -> Tensor:
    t = tensor(x)
    return ops.where(ops.less(t, 0.0), ops.mul(t, tensor(slope, t.dtype)), t)


@converts("IsInf")
def _isinf(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    pos, neg = node.attr("detect_positive", 1), node.attr("detect_negative", 1)
    if pos and neg:
        return ops.isinf(t)
    if not pos and not neg:
        return ops.mul(t, 0.0)
    return ops.equal(t, math.inf if pos else -math.inf)


def _operand(node: NodeInfo, x: Value, dtype: str) -> Any:
    """A binary op's operand: a traced tensor in ``dtype``, or a known array left for ops to broadcast."""
    if isinstance(x, Tensor):
        return ops.astype(x, dtype) if x.dtype != dtype else x
    return tensor(x, dtype)


def _binary(fn: Callable[[Any, Any], Tensor]) -> Converter:
    def convert(node: NodeInfo, a: Value, b: Value) -> Tensor:
        dtype = carrier(node.in_elem(0) or 1, node.op_type) if node.in_elem(0) else \
            (a.dtype if isinstance(a, Tensor) else b.dtype)
        return fn(_operand(node, a, dtype), _operand(node, b, dtype))
    return convert


for _name, _bfn in {"Add": ops.add, "Sub": ops.sub, "Mul": ops.mul, "BitwiseAnd": ops.bitwise_and,
                    "BitwiseOr": ops.bitwise_or, "BitwiseXor": ops.bitwise_xor}.items():
    converts(_name)(_binary(_bfn))


@converts("Div")
def _div(node: NodeInfo, a: Value, b: Value) -> Tensor:
    q = _binary(ops.div)(node, a, b)
    return ops.trunc(q) if _is_int(node) else q


@converts("Pow")
def _pow(node: NodeInfo, a: Value, b: Value) -> Tensor:
    t = tensor(a)
    e = b if not isinstance(b, Tensor) else ops.astype(b, t.dtype)
    if not isinstance(e, Tensor):
        e = np.asarray(e)
        if e.ndim == 0 and float(e) == 2.0:
            return ops.mul(t, t)
        e = tensor(e, t.dtype)
    return ops.pow(t, e)


@converts("Mod")
def _mod(node: NodeInfo, a: Value, b: Value) -> Tensor:
    fn = ops.fmod if node.attr("fmod", 0) else ops.remainder
    return _binary(fn)(node, a, b)


@converts("BitwiseNot")
def _bitwise_not(node: NodeInfo, x: Value) -> Tensor:
    return ops.bitwise_not(tensor(x))


def _compare(fn: Callable[[Any, Any], Tensor]) -> Converter:
    return _binary(fn)


for _name, _cfn in {"Equal": ops.equal, "Less": ops.less, "LessOrEqual": ops.less_equal,
                    "Greater": ops.greater, "GreaterOrEqual": ops.greater_equal}.items():
    converts(_name)(_compare(_cfn))


@converts("Not")
def _not(node: NodeInfo, x: Value) -> Tensor:
    return ops.sub(1.0, tensor(x, "f32"))


@converts("And")
def _and(node: NodeInfo, a: Value, b: Value) -> Tensor:
    return ops.mul(tensor(a, "f32"), tensor(b, "f32"))


@converts("Or")
def _or(node: NodeInfo, a: Value, b: Value) -> Tensor:
    return ops.maximum(tensor(a, "f32"), tensor(b, "f32"))


@converts("Xor")
def _xor(node: NodeInfo, a: Value, b: Value) -> Tensor:
    return ops.not_equal(tensor(a, "f32"), tensor(b, "f32"))


@converts("Where")
def _where(node: NodeInfo, cond: Value, a: Value, b: Value) -> Tensor:
    dtype = carrier(node.out_elem() or 1, "Where")
    return ops.where(tensor(cond, "f32"), _operand(node, a, dtype), _operand(node, b, dtype))


def _variadic(fn: Callable[[Any, Any], Tensor], mean: bool = False) -> Converter:
    def convert(node: NodeInfo, *xs: Value) -> Tensor:
        dtype = carrier(node.out_elem() or 1, node.op_type)
        out = tensor(xs[0], dtype)
        for x in xs[1:]:
            out = fn(out, _operand(node, x, dtype))
        return ops.div(out, float(len(xs))) if mean else out
    return convert


converts("Max")(_variadic(ops.maximum))
converts("Min")(_variadic(ops.minimum))
converts("Sum")(_variadic(ops.add))
converts("Mean")(_variadic(ops.add, mean=True))


@converts("Clip")
def _clip(node: NodeInfo, x: Value, lo: Value = None, hi: Value = None) -> Tensor:
    t = tensor(x)
    if node.opset < 11:
        lo, hi = node.attrs.get("min"), node.attrs.get("max")
    if lo is not None:
        t = ops.maximum(t, _operand(node, lo, t.dtype))
    if hi is not None:
        t = ops.minimum(t, _operand(node, hi, t.dtype))
    return t


@converts("Cast", "CastLike")
def _cast(node: NodeInfo, x: Value, like: Value = None) -> Any:
    to = node.out_elem()
    if to is None:
        raise UnsupportedError("the target element type is unknown")
    dtype = carrier(to, node.op_type)
    if not isinstance(x, Tensor) and x is not None and not symbolic.is_symbolic(np.asarray(x)):
        # CastLike of a known value to a run-time tensor's type
        return np.asarray(x).astype(ELEM_TYPES[to][0])
    t = tensor(x)
    source = node.in_elem(0)
    if to == BOOL:
        return ops.not_equal(t, 0.0)
    if to not in FLOATS and source in FLOATS:
        t = ops.trunc(t)  # float to integer rounds toward zero
    return ops.astype(t, dtype)


@converts("Dropout")
def _dropout(node: NodeInfo, x: Value, ratio: Value = None, training: Value = None) -> Any:
    if training is not None and bool(known(training, "Dropout's training_mode")):
        rate = float(known(ratio, "Dropout's ratio").reshape(-1)[0]) if ratio is not None else 0.5
        if rate != 0.0:  # with a zero ratio training mode keeps every element: the identity
            raise UnsupportedError("Dropout in training mode (random) with a nonzero ratio")
    if len(node.outputs) > 1 and node.outputs[1]:
        return x, np.ones(_shape(x), dtype=np.bool_)
    return x


# ---------------------------------------------------------------------------------------- contractions

@converts("MatMul")
def _matmul(node: NodeInfo, a: Value, b: Value) -> Tensor:
    x = tensor(a)
    return ops.matmul(x, tensor(b, x.dtype))


@converts("Gemm")
def _gemm(node: NodeInfo, a: Value, b: Value, c: Value = None) -> Tensor:
    x = tensor(a)
    y = ops.matmul(x, tensor(b, x.dtype), transpose_a=bool(node.attr("transA", 0)),
                   transpose_b=bool(node.attr("transB", 0)))
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))
    if alpha != 1.0:
        y = ops.mul(y, alpha)
    if c is not None:
        bias = tensor(c, x.dtype)
        y = ops.add(y, ops.mul(bias, beta) if beta != 1.0 else bias)
    return y


def _auto_pads(node: NodeInfo, size: Sequence[int], kernel: Sequence[int], strides: Sequence[int],
               dilations: Sequence[int]) -> list[tuple[int, int]]:
    """Per spatial axis (before, after) padding from ``pads`` or ``auto_pad``."""
    n = len(size)
    auto = node.attr("auto_pad", "NOTSET")
    if auto in ("NOTSET", ""):
        pads = list(node.attr("pads", [0] * (2 * n)))
        return [(int(pads[i]), int(pads[i + n])) for i in range(n)]
    if auto == "VALID":
        return [(0, 0)] * n
    if auto not in ("SAME_UPPER", "SAME_LOWER"):
        raise UnsupportedError(f"auto_pad={auto!r}")
    out = []
    for d, k, s, dl in zip(size, kernel, strides, dilations):
        total = max((math.ceil(d / s) - 1) * s + (k - 1) * dl + 1 - d, 0)
        small, big = total // 2, total - total // 2
        out.append((small, big) if auto == "SAME_UPPER" else (big, small))
    return out


@converts("Conv")
def _conv(node: NodeInfo, x: Value, w: Value, b: Value = None) -> Tensor:
    t = tensor(x)
    k = tensor(w, t.dtype)
    n = t.ndim - 2
    kernel = tuple(node.attr("kernel_shape", k.shape[2:]))
    strides = tuple(node.attr("strides", [1] * n))
    dilations = tuple(node.attr("dilations", [1] * n))
    pads = _auto_pads(node, t.shape[2:], kernel, strides, dilations)
    groups = int(node.attr("group", 1))
    if n == 1:
        y = ops.conv1d(t, k, stride=strides, padding=pads, dilation=dilations, groups=groups)
    elif n == 2:
        y = ops.conv2d(t, k, stride=strides, padding=tuple(pads), dilation=dilations, groups=groups)
    elif n == 3:
        y = ops.conv3d(t, k, stride=strides, padding=pads, dilation=dilations, groups=groups)
    else:
        raise UnsupportedError(f"a {n}-D convolution (1-D to 3-D are supported)")
    if b is not None:
        y = ops.add(y, ops.reshape(tensor(b, t.dtype), (1, -1) + (1,) * n))
    return y


@converts("ConvTranspose")
def _conv_transpose(node: NodeInfo, x: Value, w: Value, b: Value = None) -> Tensor:
    t = tensor(x)
    k = tensor(w, t.dtype)
    n = t.ndim - 2
    if node.attr("output_shape") is not None or node.attr("auto_pad", "NOTSET") not in ("NOTSET", "", "VALID"):
        raise UnsupportedError("ConvTranspose with output_shape or SAME auto_pad")
    pads = list(node.attr("pads", [0] * (2 * n))) if node.attr("auto_pad", "NOTSET") != "VALID" else [0] * (2 * n)
    if pads[:n] != pads[n:]:
        raise UnsupportedError(f"ConvTranspose with asymmetric pads {pads}")
    y = ops.conv_transpose(t, k, stride=tuple(node.attr("strides", [1] * n)), padding=tuple(pads[:n]),
                           output_padding=tuple(node.attr("output_padding", [0] * n)),
                           dilation=tuple(node.attr("dilations", [1] * n)), groups=int(node.attr("group", 1)))
    if b is not None:
        y = ops.add(y, ops.reshape(tensor(b, t.dtype), (1, -1) + (1,) * n))
    return y


# ----------------------------------------------------------------------------------------------- pooling

def _pool_setup(node: NodeInfo, t: Tensor) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...],
                                                    list[tuple[int, int]]]:
    kernel = tuple(int(k) for k in node.attr("kernel_shape"))
    n = len(kernel)
    strides = tuple(int(s) for s in node.attr("strides", [1] * n))
    dilations = tuple(int(d) for d in node.attr("dilations", [1] * n))
    return kernel, strides, dilations, _auto_pads(node, t.shape[2:], kernel, strides, dilations)


@converts("MaxPool")
def _max_pool(node: NodeInfo, x: Value) -> Tensor:
    if len(node.outputs) > 1 and node.outputs[1]:
        raise UnsupportedError("MaxPool's Indices output")
    t = tensor(x)
    kernel, strides, dilations, pads = _pool_setup(node, t)
    ceil = bool(node.attr("ceil_mode", 0))
    if all(a == b for a, b in pads):
        return ops.max_pool(t, kernel, strides, tuple(a for a, _ in pads), dilations, ceil_mode=ceil)
    if ceil:
        raise UnsupportedError("MaxPool with asymmetric pads and ceil_mode")
    t = ops.pad(t, [(0, 0), (0, 0)] + pads, constant_values=-math.inf)
    return ops.max_pool(t, kernel, strides, 0, dilations)


@converts("AveragePool")
def _avg_pool(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    kernel, strides, dilations, pads = _pool_setup(node, t)
    ceil = bool(node.attr("ceil_mode", 0))
    include = bool(node.attr("count_include_pad", 0))
    if any(d != 1 for d in dilations):
        return _dilated_avg_pool(node, t, kernel, strides, dilations, pads, include)
    if all(a == b for a, b in pads):
        return ops.avg_pool(t, kernel, strides, tuple(a for a, _ in pads), ceil_mode=ceil,
                            count_include_pad=include)
    if ceil:
        raise UnsupportedError("AveragePool with asymmetric pads and ceil_mode")
    padded = ops.pad(t, [(0, 0), (0, 0)] + pads)
    total = ops.avg_pool(padded, kernel, strides, 0)
    if include:
        return total
    ones = np.pad(np.ones(t.shape[2:]), pads)  # how many real elements each window holds
    count = _window_mean(ones, kernel, strides)
    return ops.div(total, tensor(count.astype(np.float64), t.dtype))


def _dilated_avg_pool(node: NodeInfo, t: Tensor, kernel: Sequence[int], strides: Sequence[int],
                      dilations: Sequence[int], pads: Sequence[tuple[int, int]], include: bool) -> Tensor:
    """A dilated average pool: the window sums by a depthwise convolution with a kernel of ones over the
    padded input (padded further where ceil_mode's last windows run past it), divided by a known count of
    the elements each window holds (the padding's too when ``include``, never what lies past it)."""
    spatial = t.shape[2:]
    out_type = node.out_types[0] if node.out_types else None
    if out_type is None or out_type[1] is None:
        raise UnsupportedError("AveragePool with dilations needs the output shape from shape inference")
    out = out_type[1][2:]
    extra = [max(0, (o - 1) * s + d * (k - 1) + 1 - (n + lo + hi))
             for o, s, d, k, n, (lo, hi) in zip(out, strides, dilations, kernel, spatial, pads)]
    padded = ops.pad(t, [(0, 0), (0, 0)] + [(lo, hi + e) for (lo, hi), e in zip(pads, extra)])
    c = t.shape[1]
    ones = tensor(np.ones((c, 1) + tuple(kernel), np.float64), t.dtype)
    conv = {1: ops.conv1d, 2: ops.conv2d, 3: ops.conv3d}.get(len(kernel))
    if conv is None:
        raise UnsupportedError(f"AveragePool with dilations over {len(kernel)} dimensions")
    sums = conv(padded, ones, stride=tuple(strides), padding=0, dilation=tuple(dilations), groups=c)
    weight = np.pad(np.ones(spatial), list(pads), constant_values=1.0 if include else 0.0)
    weight = np.pad(weight, [(0, e) for e in extra])
    from numpy.lib.stride_tricks import sliding_window_view

    span = tuple(d * (k - 1) + 1 for d, k in zip(dilations, kernel))
    win = sliding_window_view(weight, span)[tuple(slice(None, None, s) for s in strides)]
    win = win[(...,) + tuple(slice(None, None, d) for d in dilations)]
    count = win.sum(axis=tuple(range(-len(kernel), 0)))[tuple(slice(0, o) for o in out)]
    return ops.div(sums, tensor(count.astype(np.float64), t.dtype))


def _window_mean(a: np.ndarray, kernel: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """numpy mean over strided windows (a known array)."""
    from numpy.lib.stride_tricks import sliding_window_view

    win = sliding_window_view(a, tuple(kernel))
    win = win[tuple(slice(None, None, s) for s in strides)]
    return win.mean(axis=tuple(range(-len(kernel), 0)))


@converts("GlobalAveragePool")
def _global_avg_pool(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    return ops.mean(t, tuple(range(2, t.ndim)), keepdims=True)


@converts("GlobalMaxPool")
def _global_max_pool(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    return ops.max(t, tuple(range(2, t.ndim)), keepdims=True)


# ------------------------------------------------------------------------------------------ normalising

@converts("BatchNormalization")
def _batch_norm(node: NodeInfo, x: Value, scale: Value, bias: Value, mean: Value, var: Value) -> Any:
    if node.attr("training_mode", 0) or (len(node.outputs) > 1 and any(node.outputs[1:])):
        raise UnsupportedError("BatchNormalization in training mode")
    t = tensor(x)
    return ops.batch_norm(t, tensor(mean, t.dtype), tensor(var, t.dtype), tensor(scale, t.dtype),
                          tensor(bias, t.dtype), eps=float(node.attr("epsilon", 1e-5)))


@converts("LayerNormalization")
def _layer_norm(node: NodeInfo, x: Value, scale: Value, bias: Value = None) -> Any:
    t = tensor(x)
    axis = int(node.attr("axis", -1)) % t.ndim
    axes = tuple(range(axis, t.ndim))
    norm = tuple(t.shape[axis:])
    w = tensor(scale, t.dtype)
    b = tensor(bias, t.dtype) if bias is not None else None
    eps = float(node.attr("epsilon", 1e-5))
    if len(node.outputs) > 1 and any(node.outputs[1:]):  # Mean and InvStdDev too: spelt out
        mean = ops.mean(t, axes, keepdims=True)
        centred = ops.sub(t, mean)
        inv = ops.rsqrt(ops.add(ops.mean(ops.mul(centred, centred), axes, keepdims=True), eps))
        y = ops.mul(ops.mul(centred, inv), w)
        return (ops.add(y, b) if b is not None else y), mean, inv
    if w.shape == norm and (b is None or b.shape == norm):
        return ops.layernorm(t, w, b, axis=axes, eps=eps)
    y = ops.mul(ops.layernorm(t, axis=axes, eps=eps), w)
    return ops.add(y, b) if b is not None else y


@converts("InstanceNormalization")
def _instance_norm(node: NodeInfo, x: Value, scale: Value, bias: Value) -> Tensor:
    t = tensor(x)
    return ops.instance_norm(t, tensor(scale, t.dtype), tensor(bias, t.dtype), eps=float(node.attr("epsilon", 1e-5)))


@converts("GroupNormalization")
def _group_norm(node: NodeInfo, x: Value, scale: Value, bias: Value) -> Tensor:
    t = tensor(x)
    g = int(node.attr("num_groups"))
    s, b = tensor(scale, t.dtype), tensor(bias, t.dtype)
    if s.shape != (t.shape[1],):
        raise UnsupportedError("GroupNormalization with per-group scale (opset < 21)")
    return ops.group_norm(t, g, s, b, eps=float(node.attr("epsilon", 1e-5)))


def _softmax_like(fn: Callable[..., Tensor]) -> Converter:
    def convert(node: NodeInfo, x: Value) -> Tensor:
        t = tensor(x)
        if node.opset >= 13:
            return fn(t, axis=int(node.attr("axis", -1)))
        axis = int(node.attr("axis", 1)) % max(t.ndim, 1)  # older opsets: over the flattened tail
        flat = ops.reshape(t, (math.prod(t.shape[:axis]), math.prod(t.shape[axis:])))
        return ops.reshape(fn(flat, axis=-1), t.shape)
    return convert


converts("Softmax")(_softmax_like(ops.softmax))
converts("LogSoftmax")(_softmax_like(ops.log_softmax))


@converts("Hardmax")
def _hardmax(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    if node.opset < 13:
        raise UnsupportedError("Hardmax before opset 13")
    axis = int(node.attr("axis", -1)) % t.ndim
    first = ops.argmax(t, axis, keepdims=True)
    pos = np.arange(t.shape[axis], dtype=np.float64).reshape((-1,) + (1,) * (t.ndim - axis - 1))
    return ops.astype(ops.equal(ops.astype(first, "f64"), pos), t.dtype)


# ---------------------------------------------------------------------------------------------- attention

def _split_heads(t: Tensor, heads: Any, what: str) -> Tensor:
    """(B, S, H * E) -> (B, H, S, E)."""
    if not heads or t.shape[2] % int(heads):
        raise UnsupportedError(f"Attention: 3-D {what} of width {t.shape[2]} needs its number of heads "
                               f"dividing it, got {heads!r}")
    b, s, width = t.shape
    return ops.transpose(ops.reshape(t, (b, s, int(heads), width // int(heads))), (0, 2, 1, 3))


def _repeat_heads(t: Tensor, heads: int) -> Tensor:
    """(B, Hkv, S, E) -> (B, heads, S, E), each key/value head serving ``heads / Hkv`` consecutive query heads."""
    b, hkv, s, e = t.shape
    if heads == hkv:
        return t
    if heads % hkv:
        raise UnsupportedError(f"Attention: {heads} query heads are not a multiple of {hkv} key/value heads")
    g = heads // hkv
    return ops.reshape(ops.broadcast_to(ops.reshape(t, (b, hkv, 1, s, e)), (b, hkv, g, s, e)), (b, heads, s, e))


def _attention_bias(node: NodeInfo, mask: Value, nonpad: Value, *, sq: int, sk: int, past: int,
                    dtype: str) -> Value:
    """The additive bias (0 where a query may attend a key, -inf where not) of ``attn_mask`` (bool: attend
    where true; float: added; narrower than the keys: padded with -inf), ``is_causal`` and the sliding
    window (bottom-right aligned: a query ``i`` sees key ``j`` iff ``j <= i + offset``, the offset being the
    past keys' count, or per batch ``nonpad_kv_seqlen - Sq``) and the padding of ``nonpad_kv_seqlen``: None
    (no bias), a known array (no run-time input in it) or a traced tensor broadcasting to (B, H, Sq, Sk)."""
    np_dtype = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "bf16": ml_dtypes.bfloat16}[dtype]
    neg_inf = np_dtype(-np.inf)

    def select(cond: Tensor) -> Tensor:  # 0 where cond, else -inf
        return ops.where(cond, tensor(np.zeros((), np_dtype)), tensor(np.full((), -np.inf, np_dtype)))

    bias: Value = None
    if mask is not None:
        boolean = node.in_elem(3) == BOOL
        width = _shape(mask)[-1]
        if width > sk:
            raise UnsupportedError(f"Attention: a mask over {width} keys for {sk} keys")
        if isinstance(mask, Tensor):
            m = select(mask) if boolean else ops.astype(mask, dtype)
            if width < sk:
                fill = np.full(_shape(mask)[:-1] + (sk - width,), neg_inf, np_dtype)
                m = ops.concatenate([m, tensor(fill)], axis=-1)
            bias = m
        else:
            known_mask = np.where(np.asarray(mask), np_dtype(0), neg_inf) if boolean else np.asarray(mask, np_dtype)
            pad = [(0, 0)] * (known_mask.ndim - 1) + [(0, sk - width)]
            bias = np.pad(known_mask, pad, constant_values=neg_inf).astype(np_dtype)
    causal = bool(node.attr("is_causal", 0))
    left, right = int(node.attr("left_window_size", -1)), int(node.attr("right_window_size", -1))
    rows = np.arange(sq, dtype=np.float32).reshape(sq, 1)
    cols = np.arange(sk, dtype=np.float32).reshape(1, sk)
    allowed: Value = None
    if causal or left >= 0 or right >= 0:
        if nonpad is not None and past == 0:  # the external cache: a frontier per batch
            n = ops.astype(tensor(nonpad), "f32")
            diff = ops.sub(ops.add(tensor(rows), ops.reshape(ops.sub(n, float(sq)), (-1, 1, 1, 1))), tensor(cols))
            conds = [ops.greater_equal(diff, 0.0)] if causal else []
            conds += [ops.less_equal(diff, float(left))] if left >= 0 else []
            conds += [ops.greater_equal(diff, float(-right))] if right >= 0 else []
            for c in conds:
                allowed = c if allowed is None else ops.mul(allowed, c)
        else:
            diff_np = rows + past - cols
            ok = np.ones((sq, sk), np.bool_)
            ok &= diff_np >= 0 if causal else True
            ok &= diff_np <= left if left >= 0 else True
            ok &= diff_np >= -right if right >= 0 else True
            allowed = ok
    if nonpad is not None:
        n = ops.reshape(ops.astype(tensor(nonpad), "f32"), (-1, 1, 1, 1))
        valid = ops.less(tensor(cols), n)
        allowed = valid if allowed is None else ops.mul(tensor(allowed, "f32"), valid)
    if allowed is not None:
        if isinstance(allowed, Tensor):
            structural: Value = select(allowed)
        else:
            structural = np.where(allowed, np_dtype(0), neg_inf).astype(np_dtype)
        if bias is None:
            bias = structural
        elif isinstance(bias, Tensor) or isinstance(structural, Tensor):
            bias = ops.add(tensor(bias, dtype), tensor(structural, dtype))
        else:
            bias = (bias + structural).astype(np_dtype)
    return bias


@converts("Attention")
def _attention(node: NodeInfo, q: Value, k: Value, v: Value, mask: Value = None, past_k: Value = None,
               past_v: Value = None, nonpad: Value = None) -> tuple[Value, ...]:
    """ONNX Attention (opsets 23-25) onto `pbsdk.ops.attention` (the fused attention) when only ``Y`` is
    asked for and no softcap or softmax precision changes the scores; otherwise the same primitives with
    the intermediate exposed. Rows whose bias masks every key give 0, as the ONNX reference does."""
    qt, kt, vt = tensor(q), tensor(k), tensor(v)
    dtype = qt.dtype
    three_d = qt.ndim == 3
    if three_d:
        qt = _split_heads(qt, node.attr("q_num_heads"), "Q")
        kt = _split_heads(kt, node.attr("kv_num_heads"), "K")
        vt = _split_heads(vt, node.attr("kv_num_heads"), "V")
    if qt.ndim != 4 or kt.ndim != 4 or vt.ndim != 4:
        raise UnsupportedError(f"Attention of rank-{qt.ndim} inputs (3 or 4 expected)")
    if (past_k is None) != (past_v is None) or (nonpad is not None and past_k is not None):
        raise UnsupportedError("Attention: past_key and past_value go together, and not with nonpad_kv_seqlen")
    past = 0
    if past_k is not None:
        past = _shape(past_k)[2]
        kt = ops.concatenate([tensor(past_k, kt.dtype), kt], axis=2)
        vt = ops.concatenate([tensor(past_v, vt.dtype), vt], axis=2)
    present_k, present_v = kt, vt
    b, hq, sq, d = qt.shape
    sk = kt.shape[2]
    scale = node.attr("scale")
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    softcap = float(node.attr("softcap", 0.0) or 0.0)
    precision = node.attr("softmax_precision")
    soft_dtype = carrier(int(precision), "Attention's softmax_precision") if precision else dtype
    want_qk = len(node.outputs) > 3 and bool(node.outputs[3])
    bias = _attention_bias(node, mask, nonpad, sq=sq, sk=sk, past=past, dtype=dtype)
    # rows whose every key is masked: 0 (a known array of them, or a traced mask; None when there are none)
    masked_rows: Value = None
    if isinstance(bias, Tensor):
        masked_rows = ops.equal(ops.max(bias, -1, keepdims=True), -math.inf)
    elif bias is not None and np.isneginf(bias.max(axis=-1, keepdims=True)).any():
        masked_rows = np.isneginf(bias.max(axis=-1, keepdims=True))

    def guard(x: Tensor) -> Tensor:
        return x if masked_rows is None else ops.where(tensor(masked_rows, "f32"), 0.0, x)

    qk: Value = None
    if not want_qk and softcap <= 0 and soft_dtype == dtype:
        plain_causal = bool(node.attr("is_causal", 0)) and mask is None and nonpad is None and past == 0 \
            and node.attr("left_window_size", -1) < 0 and node.attr("right_window_size", -1) < 0
        # the spec scales Q and K by sqrt(scale) each (in their dtype) before the product; in f16 the
        # rounding differs from scaling the scores by an ulp, more than the node tests allow
        root = math.sqrt(scale)
        y = ops.attention(ops.mul(qt, root), ops.mul(kt, root), vt, scale=1.0, causal=plain_causal,
                          mask=None if plain_causal or bias is None else tensor(bias, dtype))
        y = guard(y)
    else:
        kr, vr = _repeat_heads(kt, hq), _repeat_heads(vt, hq)
        root = math.sqrt(scale)
        s = ops.matmul(ops.mul(qt, root), ops.mul(kr, root), transpose_b=True)
        if softcap > 0:
            s = ops.mul(ops.tanh(ops.div(s, softcap)), softcap)
        qk = s
        if bias is not None:
            s = ops.add(s, tensor(bias, dtype))
        mode = int(node.attr("qk_matmul_output_mode", 0))
        if mode == 2:
            qk = s
        p = guard(ops.softmax(ops.astype(s, soft_dtype), -1))
        if mode == 3:
            qk = p
        y = ops.matmul(ops.astype(p, dtype), vr)
    if three_d:
        y = ops.reshape(ops.transpose(y, (0, 2, 1, 3)), (b, sq, hq * y.shape[-1]))
    return y, present_k, present_v, None if qk is None else ops.astype(qk, dtype)


# --------------------------------------------------------------------------------------------- reductions

def _reduce_axes(node: NodeInfo, t: Tensor, axes_in: Value, axes_input_from: int) -> tuple[int, ...] | None:
    """The axes to reduce (None: every axis), or ``()`` for an identity (``noop_with_empty_axes``)."""
    if node.opset >= axes_input_from:
        axes = ints(axes_in, f"{node.op_type}'s axes") if axes_in is not None else []
    else:
        axes = list(node.attr("axes", []))
    if not axes:
        return () if node.attr("noop_with_empty_axes", 0) else None
    return tuple(int(a) % max(t.ndim, 1) for a in axes)


def _reduction(fn: Callable[[Tensor, Any, bool], Tensor], axes_input_from: int = 18) -> Converter:
    def convert(node: NodeInfo, x: Value, axes_in: Value = None) -> Tensor:
        t = tensor(x)
        axes = _reduce_axes(node, t, axes_in, axes_input_from)
        if axes == ():
            return t
        return fn(t, axes, bool(node.attr("keepdims", 1)))
    return convert


converts("ReduceSum")(_reduction(lambda t, a, k: ops.sum(t, a, keepdims=k), axes_input_from=13))
converts("ReduceMean")(_reduction(lambda t, a, k: ops.mean(t, a, keepdims=k)))
converts("ReduceMax")(_reduction(lambda t, a, k: ops.max(t, a, keepdims=k)))
converts("ReduceMin")(_reduction(lambda t, a, k: ops.min(t, a, keepdims=k)))
converts("ReduceProd")(_reduction(lambda t, a, k: ops.prod(t, a, keepdims=k)))
converts("ReduceSumSquare")(_reduction(lambda t, a, k: ops.sum(ops.mul(t, t), a, keepdims=k)))
converts("ReduceL1")(_reduction(lambda t, a, k: ops.sum(ops.abs(t), a, keepdims=k)))
converts("ReduceL2")(_reduction(lambda t, a, k: ops.sqrt(ops.sum(ops.mul(t, t), a, keepdims=k))))
converts("ReduceLogSum")(_reduction(lambda t, a, k: ops.log(ops.sum(t, a, keepdims=k))))


@converts("ReduceLogSumExp")
def _reduce_log_sum_exp(node: NodeInfo, x: Value, axes_in: Value = None) -> Tensor:
    t = tensor(x)
    axes = _reduce_axes(node, t, axes_in, 18)
    if axes == ():
        return t
    keep = bool(node.attr("keepdims", 1))
    m = ops.max(t, axes, keepdims=True)
    out = ops.add(ops.log(ops.sum(ops.exp(ops.sub(t, m)), axes, keepdims=True)), m)
    return out if keep else ops.reshape(out, tuple(d for i, d in enumerate(t.shape)
                                                   if axes is not None and i not in axes))


def _arg(fn: Callable[..., Tensor], extreme: Callable[..., Tensor]) -> Converter:
    def convert(node: NodeInfo, x: Value) -> Tensor:
        t = tensor(x)
        axis = int(node.attr("axis", 0)) % max(t.ndim, 1)
        keep = bool(node.attr("keepdims", 1))
        if node.attr("select_last_index", 0):
            n = t.shape[axis]
            return ops.sub(float(n - 1), ops.astype(fn(ops.flip(t, axis), axis, keepdims=keep), "f64"))
        return fn(t, axis, keepdims=keep)
    return convert


converts("ArgMax")(_arg(ops.argmax, ops.max))
converts("ArgMin")(_arg(ops.argmin, ops.min))


@converts("CumSum")
def _cumsum(node: NodeInfo, x: Value, axis: Value) -> Tensor:
    t = tensor(x)
    (ax,) = ints(axis, "CumSum's axis")
    reverse = bool(node.attr("reverse", 0))
    out = ops.cumsum(t, ax, reverse=reverse)
    return ops.sub(out, t) if node.attr("exclusive", 0) else out


# ------------------------------------------------------------------------------------------------- layout

@converts("Reshape")
def _reshape(node: NodeInfo, x: Value, shape: Value = None) -> Tensor:
    target = sizes(shape, "Reshape's shape") if node.opset >= 5 else list(node.attr("shape"))
    src = _shape(x)
    if not node.attr("allowzero", 0):
        target = [src[i] if isinstance(d, int) and d == 0 else d for i, d in enumerate(target)]
    return ops.reshape(tensor(x), tuple(target))


@converts("Flatten")
def _flatten(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    axis = int(node.attr("axis", 1))
    axis = axis + t.ndim if axis < 0 else axis
    return ops.reshape(t, (math.prod(t.shape[:axis]), math.prod(t.shape[axis:])))


@converts("Transpose")
def _transpose(node: NodeInfo, x: Value) -> Tensor:
    perm = node.attr("perm")
    return ops.transpose(tensor(x), tuple(perm) if perm is not None else None)


@converts("Squeeze")
def _squeeze(node: NodeInfo, x: Value, axes: Value = None) -> Tensor:
    t = tensor(x)
    dims = (ints(axes, "Squeeze's axes") if axes is not None else None) if node.opset >= 13 else node.attr("axes")
    drop = {d % t.ndim for d in dims} if dims else {i for i, d in enumerate(t.shape) if d == 1}
    return ops.reshape(t, tuple(d for i, d in enumerate(t.shape) if i not in drop))


@converts("Unsqueeze")
def _unsqueeze(node: NodeInfo, x: Value, axes: Value = None) -> Tensor:
    t = tensor(x)
    dims = ints(axes, "Unsqueeze's axes") if node.opset >= 13 else list(node.attr("axes"))
    rank = t.ndim + len(dims)
    where = {d % rank for d in dims}
    it = iter(t.shape)
    return ops.reshape(t, tuple(1 if i in where else next(it) for i in range(rank)))


@converts("Concat")
def _concat(node: NodeInfo, *xs: Value) -> Tensor:
    dtype = carrier(node.out_elem() or 1, "Concat")
    parts = [tensor(x, dtype) for x in xs if x is not None and math.prod(_shape(x)) > 0]
    return ops.concatenate(parts, axis=int(node.attr("axis")))


@converts("Split")
def _split(node: NodeInfo, x: Value, split: Value = None) -> tuple[Tensor, ...]:
    t = tensor(x)
    axis = int(node.attr("axis", 0)) % t.ndim
    n = len(node.outputs)
    sizes = ints(split, "Split's split") if split is not None else node.attr("split")
    if sizes is None:
        each = math.ceil(t.shape[axis] / n)
        sizes = [min(each, t.shape[axis] - i * each) for i in range(n)]
    out: list[Value] = []
    start = 0
    for s in sizes:
        if int(s) == 0:  # an empty piece: known, it holds nothing
            out.append(np.zeros(t.shape[:axis] + (0,) + t.shape[axis + 1:], _numpy_of(node.out_elem(len(out)))))
        else:
            out.append(ops.slice(t, axis, start, start + int(s)))
        start += int(s)
    return tuple(out)


@converts("Slice")
def _slice(node: NodeInfo, x: Value, starts: Value = None, ends: Value = None, axes: Value = None,
           steps: Value = None) -> Tensor:
    t = tensor(x)
    if node.opset < 10:
        st, en, ax = list(node.attr("starts")), list(node.attr("ends")), node.attr("axes")
        sp = [1] * len(st)
    else:
        st, en = sizes(starts, "Slice's starts"), sizes(ends, "Slice's ends")
        ax = ints(axes, "Slice's axes") if axes is not None else None
        sp = ints(steps, "Slice's steps") if steps is not None else [1] * len(st)
    ax = list(range(len(st))) if ax is None else list(ax)
    for a, s, e, step in zip(ax, st, en, sp):
        a %= t.ndim
        n = t.shape[a]
        if any(isinstance(v, Dim) for v in (n, s, e)):
            t = _symbolic_slice(t, a, s, e, step)
            continue
        idx = range(n)[slice(max(min(s, 2 ** 62), -2 ** 62), max(min(e, 2 ** 62), -2 ** 62), step)]
        if len(idx) == 0:
            raise UnsupportedError(f"Slice gives an empty tensor along axis {a}")
        if step > 0:
            t = ops.slice(t, a, idx.start, idx.start + (len(idx) - 1) * step + 1, step)
        else:
            flipped = ops.flip(t, a)
            first = n - 1 - idx.start
            t = ops.slice(flipped, a, first, first + (len(idx) - 1) * (-step) + 1, -step)
    return t


#: A Slice end at least this large means "to the end" (exporters write INT64_MAX or INT32_MAX).
_TO_THE_END = 2 ** 31 - 1


def _symbolic_slice(t: Tensor, axis: int, start: Any, end: Any, step: int) -> Tensor:
    """Slice along ``axis`` where its size or a bound is a `Dim`: unit steps; a negative int bound counts
    from the end, a huge one is the end; a bound the symbols' values decide (an end ``s`` on 64 rows) is a
    requirement checked at each call (`pbsdk.onnx.symbolic.require`)."""
    n = t.shape[axis]
    if step != 1:
        raise UnsupportedError(f"Slice with step {step} where a size is symbolic ({n}, {start}:{end})")
    lo = n + start if isinstance(start, int) and start < 0 else start
    hi = n if isinstance(end, int) and end >= _TO_THE_END else n + end if isinstance(end, int) and end < 0 else end
    symbolic.require(0, lo, "Slice's start")
    symbolic.require(hi, n, "Slice's end")
    symbolic.require(lo + 1, hi, "Slice's non-empty result")
    return ops.slice(t, axis, lo, hi)


def _index_tensor(indices: Value, n: int) -> Any:
    """Gather indices: a known array with negatives wrapped, or a traced one wrapped in the kernel."""
    if isinstance(indices, Tensor):
        return ops._wrapped(ops.astype(indices, "f64"), n)
    idx = np.asarray(indices).astype(np.int64)
    if isinstance(n, Dim):  # known indices into a symbolic size: in range for every value, or refused
        if idx.ndim == 0 and int(idx) < 0:
            return n + int(idx)
        if (idx < 0).any():
            raise UnsupportedError(f"negative indices into a symbolic size {n}")
        symbolic.require(int(idx.max()) + 1, n, "Gather's indices")
        return idx
    return np.where(idx < 0, idx + n, idx)


@converts("Gather")
def _gather(node: NodeInfo, x: Value, indices: Value) -> Tensor:
    t = tensor(x)
    axis = int(node.attr("axis", 0)) % t.ndim
    idx = _index_tensor(indices, t.shape[axis])
    if isinstance(idx, Dim) or (not isinstance(idx, Tensor) and idx.ndim == 0):
        i = idx if isinstance(idx, Dim) else int(idx)
        return ops.reshape(ops.slice(t, axis, i, i + 1), t.shape[:axis] + t.shape[axis + 1:])
    return ops.take(t, idx, axis=axis)


@converts("GatherElements")
def _gather_elements(node: NodeInfo, x: Value, indices: Value) -> Tensor:
    t = tensor(x)
    axis = int(node.attr("axis", 0)) % t.ndim
    return ops.take_along_axis(t, _index_tensor(indices, t.shape[axis]), axis)


@converts("Expand")
def _expand(node: NodeInfo, x: Value, shape: Value) -> Tensor:
    t = tensor(x)
    target = tuple(sizes(shape, "Expand's shape"))
    return ops.broadcast_to(t, ops._broadcast_shape("Expand", t.shape, target))


@converts("Tile")
def _tile(node: NodeInfo, x: Value, repeats: Value) -> Tensor:
    return ops.tile(tensor(x), ints(repeats, "Tile's repeats"))


@converts("Pad")
def _pad(node: NodeInfo, x: Value, pads: Value = None, value: Value = None, axes: Value = None) -> Tensor:
    t = tensor(x)
    mode = node.attr("mode", "constant")
    if mode not in ("constant", "edge", "reflect", "wrap"):
        raise UnsupportedError(f"Pad mode {mode!r}")
    if node.opset < 11:
        p, fill = list(node.attr("pads")), float(node.attr("value", 0.0))
        ax = list(range(t.ndim))
    else:
        p = ints(pads, "Pad's pads")
        fill = float(known(value, "Pad's constant_value").reshape(-1)[0]) if value is not None else 0.0
        ax = [a % t.ndim for a in ints(axes, "Pad's axes")] if axes is not None else list(range(t.ndim))
    widths = [(0, 0)] * t.ndim
    for i, a in enumerate(ax):
        widths[a] = (p[i], p[i + len(ax)])
    if mode != "constant":  # numpy.pad's modes of the same names: a gather of known indices per axis
        for a, (lo, hi) in enumerate(widths):
            if lo < 0 or hi < 0:
                t = ops.slice(t, a, max(-lo, 0), t.shape[a] - max(-hi, 0))
            if lo > 0 or hi > 0:
                idx = np.pad(np.arange(t.shape[a]), (max(lo, 0), max(hi, 0)), mode=mode)
                t = ops.take(t, idx.astype(np.int64), axis=a)
        return t
    if any(lo < 0 or hi < 0 for lo, hi in widths):
        return ops._pad(t, widths, fill)
    return ops.pad(t, widths, constant_values=fill)


@converts("Shape")
def _shape_op(node: NodeInfo, x: Value) -> np.ndarray:
    shape = _shape(x)
    start, end = node.attr("start", 0), node.attr("end", None)
    return symbolic.shape_value(shape[slice(start, end)])


@converts("Size")
def _size(node: NodeInfo, x: Value) -> np.ndarray:
    n = math.prod(_shape(x))
    return symbolic.shape_value([n]).reshape(())


@converts("EyeLike")
def _eye_like(node: NodeInfo, x: Value) -> np.ndarray:
    """Known from the input's static shape alone (its data is never read)."""
    shape = _shape(x)
    if len(shape) != 2:
        raise UnsupportedError(f"EyeLike of a rank-{len(shape)} input (rank 2 expected)")
    to = node.out_elem() or node.in_elem(0) or 1
    if to not in ELEM_TYPES:
        carrier(to, "EyeLike")
    return np.eye(shape[0], shape[1], k=int(node.attr("k", 0)), dtype=ELEM_TYPES[to][0])


@converts("Trilu")
def _trilu(node: NodeInfo, x: Value, k: Value = None) -> Tensor:
    t = tensor(x)
    diag = int(known(k, "Trilu's k").reshape(-1)[0]) if k is not None else 0
    rows, cols = t.shape[-2:]
    if isinstance(rows, Dim) or isinstance(cols, Dim):  # the pattern over symbolic sizes, computed by the kernel
        offset = ops.sub(ops.reshape(ops.iota(cols, "f32"), (1, cols)), ops.reshape(ops.iota(rows, "f32"), (rows, 1)))
        keep_t = ops.greater_equal(offset, float(diag)) if node.attr("upper", 1) else \
            ops.less_equal(offset, float(diag))
        return ops.where(keep_t, t, 0.0)
    keep = np.triu(np.ones((rows, cols), np.bool_), diag) if node.attr("upper", 1) else \
        np.tril(np.ones((rows, cols), np.bool_), diag)
    return ops.where(tensor(keep), t, 0.0)


@converts("DepthToSpace")
def _depth_to_space(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    b = int(node.attr("blocksize"))
    n, c, h, w = t.shape
    if node.attr("mode", "DCR") == "DCR":
        y = ops.transpose(ops.reshape(t, (n, b, b, c // (b * b), h, w)), (0, 3, 4, 1, 5, 2))
    else:
        y = ops.transpose(ops.reshape(t, (n, c // (b * b), b, b, h, w)), (0, 1, 4, 2, 5, 3))
    return ops.reshape(y, (n, c // (b * b), h * b, w * b))


@converts("SpaceToDepth")
def _space_to_depth(node: NodeInfo, x: Value) -> Tensor:
    t = tensor(x)
    b = int(node.attr("blocksize"))
    n, c, h, w = t.shape
    perm = (0, 3, 5, 1, 2, 4) if node.attr("mode", "DCR") == "DCR" else (0, 1, 3, 5, 2, 4)
    y = ops.transpose(ops.reshape(t, (n, c, h // b, b, w // b, b)), perm)
    return ops.reshape(y, (n, c * b * b, h // b, w // b))


# ------------------------------------------------------------------------------------------------ driver

def check_result(node: NodeInfo, result: Any) -> tuple[Value, ...]:
    """A converter's results as a tuple, each traced one in the carrier of its ONNX type and checked
    against the shape inference recorded."""
    results = tuple(result) if isinstance(result, tuple) else (result,)
    if len(results) < len([o for o in node.outputs if o]):
        raise UnsupportedError(f"the converter gives {len(results)} of {len(node.outputs)} outputs")
    out: list[Value] = []
    for i, r in enumerate(results):
        t = node.out_types[i] if i < len(node.out_types) else None
        if isinstance(r, Tensor):
            if t is not None:
                want = carrier(t[0], node.op_type)
                if r.dtype != want:
                    r = ops.astype(r, want)
                if t[1] is not None and tuple(t[1]) != r.shape:
                    raise PbsdkError(f"the converter gives shape {r.shape}, ONNX shape inference {tuple(t[1])}")
        elif r is not None:
            r = np.asarray(r)
            if t is not None and t[0] in ELEM_TYPES and not symbolic.is_symbolic(r):
                r = r.astype(ELEM_TYPES[t[0]][0], copy=False)
        out.append(r)
    return tuple(out)


def _numpy_of(elem: int | None) -> Any:
    return ELEM_TYPES[elem][0] if elem in ELEM_TYPES else np.float32


def empty_outputs(node: NodeInfo) -> tuple[np.ndarray | None, ...] | None:
    """The node's outputs when shape inference says every one is empty (a zero-sized dimension): known
    arrays holding nothing, whatever the op and its inputs; None otherwise."""
    outs = [(o, t) for o, t in zip(node.outputs, node.out_types)]
    named = [t for o, t in outs if o]
    if len(node.out_types) < len(node.outputs) or not named or \
            not all(t is not None and t[1] is not None and 0 in t[1] and t[0] in ELEM_TYPES for t in named):
        return None
    return tuple(np.zeros(t[1], ELEM_TYPES[t[0]][0]) if o and t is not None and t[1] is not None else None
                 for o, t in outs)


def convert_node(node: NodeInfo, inputs: Sequence[Value]) -> tuple[Value, ...]:
    """Convert one node on already-converted inputs; an `UnsupportedError` names the op and its opset."""
    fn = CONVERTERS.get(node.op_type)
    label = f"{node.op_type} (opset {node.opset})"
    if fn is None:
        raise UnsupportedError(f"no pbsdk converter for {label}", op=node.op_type)
    empty = empty_outputs(node)
    if empty is not None:
        return empty
    try:
        return check_result(node, fn(node, *inputs))
    except UnsupportedError as exc:
        raise UnsupportedError(f"{label}: {exc.reason}", op=node.op_type) from exc
    except (PbsdkError, TypeError, ValueError, IndexError, KeyError, AttributeError, StopIteration) as exc:
        raise UnsupportedError(f"{label}: {exc}", op=node.op_type) from exc


#: Ops pbsdk only folds at import: their inputs must be known then.
FOLDED_ONLY = ("Constant",)


@converts("ConstantOfShape")
def _constant_of_shape(node: NodeInfo, shape: Value) -> Tensor:
    """A fill of a symbolic shape (a static one is folded at import): the value broadcast to it."""
    dims = sizes(shape, "ConstantOfShape's input")
    value = node.attr("value")
    fill = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)[:1]
    dtype = carrier(node.out_elem() or 1, "ConstantOfShape")
    return ops.broadcast_to(tensor(fill.reshape((1,) * len(dims)), dtype), tuple(dims))


@converts("Range")
def _range(node: NodeInfo, start: Value, limit: Value, delta: Value) -> Tensor:
    """``start, start + 1, ..., limit - 1`` where ``limit`` is a symbolic size (a static Range is folded at
    import): an iota the kernel sizes from its inputs."""
    lo, hi, step = (sizes(v, f"Range's {w}")[0] for v, w in ((start, "start"), (limit, "limit"), (delta, "delta")))
    if step != 1 or isinstance(lo, Dim) or not isinstance(hi, Dim):
        raise UnsupportedError(f"Range({lo}, {hi}, {step}): only an int start, a symbolic limit and step 1 "
                               "are compiled")
    dtype = carrier(node.out_elem() or 1, "Range")
    symbolic.require(lo + 1, hi, "Range's non-empty result")
    out = ops.iota(hi - lo, dtype)
    return ops.add(out, float(lo)) if lo else out


def _folded_only(node: NodeInfo, *inputs: Value) -> Value:
    raise UnsupportedError(f"{node.op_type}'s inputs must be known at import (pbsdk compiles static shapes); "
                           "here they are computed from the model's inputs")


for _name in FOLDED_ONLY:
    converts(_name)(_folded_only)
