"""pbsdk's graph: the small, target-independent op set every frontend translates to.

A `Graph` is a list of `Node`s in topological order over SSA `Value`s with static shapes. Frontends
(``pbsdk.ops`` tracing, the torch and JAX bridges) build graphs; `pbsdk.core.ir.emit` turns a graph into
MLIR at the linalg-on-tensors level. The op set is deliberately primitive (elementwise, reduce,
contraction, conv, layout); composite ops such as softmax are built from primitives and tagged with a
``group`` so that later passes can recognise them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16" dtype: bf16 at the host boundary)

from pbsdk.core.errors import UnsupportedError

#: dtype names pbsdk uses everywhere (same spelling as ChipSpec's DType).
FLOAT_DTYPES = ("f64", "f32", "f16", "bf16")
#: Integer dtypes: i8 (quantized tensors) and i32 (their contractions' accumulators); which ops take them
#: is `pbsdk.core.quant.INT_OPS`.
INT_DTYPES = ("i8", "i32")
#: numpy dtype names at the host boundary. bf16 is ``ml_dtypes.bfloat16`` (the numpy extension JAX uses;
#: ``np.dtype("bfloat16")`` once ml_dtypes is imported, which this module does).
NUMPY_TO_DTYPE = {"float64": "f64", "float32": "f32", "float16": "f16", "bfloat16": "bf16", "int8": "i8",
                  "int32": "i32"}
DTYPE_TO_NUMPY = {v: k for k, v in NUMPY_TO_DTYPE.items()}

UNARY_OPS = frozenset({"neg", "exp", "log", "tanh", "sigmoid", "relu", "gelu", "gelu_tanh", "erf", "sqrt",
                       "rsqrt", "abs", "log1p", "expm1", "sin", "cos", "tan", "floor", "ceil", "round", "trunc",
                       "sign"})
BINARY_OPS = frozenset({"add", "sub", "mul", "div", "maximum", "minimum", "pow", "fmod", "bitwise_and",
                        "bitwise_or", "bitwise_xor"})
REDUCE_OPS = frozenset({"reduce_sum", "reduce_max", "reduce_min", "reduce_prod"})
OTHER_OPS = frozenset({"input", "const", "cast", "matmul", "conv2d", "transpose", "reshape", "broadcast"})
#: Comparisons produce 0/1 masks in their operands' dtype; "select" is where(mask, a, b).
COMPARE_OPS = frozenset({"equal", "not_equal", "less", "less_equal", "greater", "greater_equal"})
#: Data movement: strided slices, concatenation, gathers (clipped indices carried as floats), reversal, and
#: "interleave" (parts of one shape woven along ``axes`` with ``strides``: output position ``s*j + p`` of an
#: axis is element ``j`` of the part whose phase is ``p`` there; parts in row-major order of their phases).
MOVE_OPS = frozenset({"select", "slice", "concat", "take", "take_along", "flip", "interleave"})
#: Values of sizes known only at run time (`pbsdk.core.dims.Dim`): "size" (a 0-d tensor, attribute ``dim``)
#: and "iota" (0 .. n-1 along its one dimension), computed from the kernel's inputs' sizes.
SIZE_OPS = frozenset({"size", "iota"})
#: Ops whose loop bounds are data: "grouped_matmul" (rows of ``x`` in consecutive groups, group ``e`` ending
#: at row ``ends[e]``, each times its own matrix; inputs ``x, ends, w_0 .. w_{E-1}``; rows beyond the last
#: group are zero) and "put_slices" (``x`` with slice ``j`` of ``values`` along ``axis`` written at position
#: ``idx[j]``, in order; an index outside ``x`` writes nothing: a KV cache written at its positions). Emitted
#: where the frontend knows the target compiles sizes or offsets known at run time (`Target.dynamic_shapes`).
DATA_SIZED_OPS = frozenset({"grouped_matmul", "put_slices"})
ALL_OPS = UNARY_OPS | BINARY_OPS | REDUCE_OPS | OTHER_OPS | COMPARE_OPS | MOVE_OPS | SIZE_OPS | DATA_SIZED_OPS
#: A constant of more values than this is "large": the graph holds it in its own dtype (not widened to
#: float64), and emission passes it to the kernel as an operand instead of printing it
#: (`pbsdk.core.ir.emit`).
INLINE_LIMIT = 1024


@dataclasses.dataclass(frozen=True)
class TensorType:
    """A value's shape and dtype. A size known only at run time (a torch graph traced with symbolic sizes)
    is a `pbsdk.core.dims.Dim` where the annotation says int: it takes part in shape arithmetic and makes
    any code that needs its value (an ordering, ``int()``, ``range``) raise TypeError, so such code refuses
    the graph rather than guess."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    def __str__(self) -> str:
        return f"{'x'.join(map(str, self.shape))}{'x' if self.shape else ''}{self.dtype}"


_ids = itertools.count()


@dataclasses.dataclass(frozen=True, eq=False)
class Value:
    """An SSA value: the result of one node. Identity is object identity."""

    type: TensorType
    id: int = dataclasses.field(default_factory=lambda: next(_ids))

    @property
    def shape(self) -> tuple[int, ...]:
        return self.type.shape

    @property
    def dtype(self) -> str:
        return self.type.dtype


@dataclasses.dataclass(frozen=True, eq=False)
class Node:
    """``out = op(inputs; attrs)``. ``group`` tags nodes that came from one composite op (softmax, ...)."""

    op: str
    inputs: tuple[Value, ...]
    out: Value
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    group: str | None = None

    def __post_init__(self) -> None:
        if self.op not in ALL_OPS:
            raise UnsupportedError(f"unknown graph op '{self.op}'", op=self.op)


@dataclasses.dataclass
class Graph:
    """A traced program. ``inputs`` are the values of the "input" nodes in argument order."""

    nodes: list[Node] = dataclasses.field(default_factory=list)
    inputs: list[Value] = dataclasses.field(default_factory=list)
    outputs: list[Value] = dataclasses.field(default_factory=list)

    def add(self, op: str, inputs: Sequence[Value], out_type: TensorType, group: str | None = None,
            **attrs: Any) -> Value:
        out = Value(out_type)
        self.nodes.append(Node(op, tuple(inputs), out, dict(attrs), group))
        if op == "input":
            self.inputs.append(out)
        return out

    def live_nodes(self) -> list[Node]:
        """Nodes that contribute to an output (inputs always kept, to preserve the signature)."""
        needed = {v.id for v in self.outputs}
        keep: list[Node] = []
        for node in reversed(self.nodes):
            if node.out.id in needed or node.op == "input":
                keep.append(node)
                needed.update(v.id for v in node.inputs)
        return list(reversed(keep))
