"""Small helpers for building IR with the MLIR Python bindings' builders.

Each works at the current ``ir.InsertionPoint``, ``ir.Location`` and ``ir.Context`` (the bindings' usual
``with`` blocks), takes and returns ``ir.Type``/``ir.Value``/``ir.Attribute`` objects, and stands for one
idiom that would otherwise be repeated: a pbsdk dtype as an MLIR type, an affine map from a list of
expressions, a float constant, a ``linalg.fill``, a reassociation list, a ``linalg.generic`` whose body is
built by a callback (on tensors, or on buffers: `buffer_generic`), an ``scf.for`` whose body is built in a
``with`` block (`loop`), and index arithmetic with memoised constants (`Indices`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from mlir import ir
from mlir.dialects import arith, func, linalg, scf, vector

_FLOAT_TYPES: dict[str, Callable[[], ir.Type]] = {
    "f64": ir.F64Type.get, "f32": ir.F32Type.get, "f16": ir.F16Type.get, "bf16": ir.BF16Type.get,
}


_INT_BITS = {"i8": 8, "i16": 16, "i32": 32, "i64": 64}


def element_type(dtype: str) -> ir.Type:
    """The MLIR element type of a pbsdk dtype name (``"f32"``, ``"i8"`` (signless), ...)."""
    if dtype in _INT_BITS:
        return ir.IntegerType.get_signless(_INT_BITS[dtype])
    return _FLOAT_TYPES[dtype]()


def element_of(t: ir.Type) -> ir.Type:
    """The element type of a shaped type (vector, tensor, memref); a scalar type itself."""
    return ir.ShapedType(t).element_type if isinstance(t, ir.ShapedType) else t


def element_bits(t: ir.Type) -> int:
    """The width in bits of a float or integer type (bf16: 16, i8: 8)."""
    return ir.IntegerType(t).width if isinstance(t, ir.IntegerType) else ir.FloatType(t).width


def zero_vector(t: ir.VectorType) -> ir.Value:
    """``arith.constant dense<0> : t`` for a vector of floats or integers."""
    et = t.element_type
    zero = ir.IntegerAttr.get(et, 0) if isinstance(et, ir.IntegerType) else ir.FloatAttr.get(et, 0.0)
    return arith.constant(t, ir.DenseElementsAttr.get_splat(t, zero))


def scalar_constant(value: float, t: ir.Type) -> ir.Value:
    """``arith.constant value : t`` for a float or integer type ``t``."""
    if isinstance(t, ir.IntegerType):
        return arith.ConstantOp(t, ir.IntegerAttr.get(t, int(value))).result
    return float_constant(value, t)


def static_sizes(shape: Sequence[Any]) -> list[int]:
    """``shape`` with every size that is not an int (a `pbsdk.core.dims.Dim`, known at run time) as MLIR's
    dynamic size (``?``)."""
    dynamic = ir.ShapedType.get_dynamic_size()
    return [d if isinstance(d, int) else dynamic for d in shape]


def tensor_type(shape: Sequence[Any], dtype: str) -> ir.RankedTensorType:
    """``tensor<shape x dtype>``; a size that is not an int is ``?``."""
    return ir.RankedTensorType.get(static_sizes(shape), element_type(dtype))


def dims(n: int) -> list[ir.AffineExpr]:
    """The loop dimensions ``d0 .. d(n-1)`` of an n-loop affine map."""
    return [ir.AffineDimExpr.get(i) for i in range(n)]


def affine_map(n_dims: int, results: Sequence[ir.AffineExpr | int]) -> ir.AffineMapAttr:
    """``affine_map<(d0, ..., d(n_dims-1)) -> (results)>``; an int result is that constant."""
    exprs = [ir.AffineConstantExpr.get(r) if isinstance(r, int) else r for r in results]
    return ir.AffineMapAttr.get(ir.AffineMap.get(n_dims, 0, exprs))


def float_constant(value: float, t: ir.Type) -> ir.Value:
    """``arith.constant value : t`` for a float type ``t`` (non-finite values included)."""
    return arith.ConstantOp(t, ir.FloatAttr.get(t, value)).result


def fill(value: ir.Value, init: ir.Value) -> ir.Value:
    """``linalg.fill ins(value) outs(init)`` on a tensor, built as the op itself (the opdsl wrapper
    ``linalg.fill`` builds the same op through its op-definition machinery, about ten times slower)."""
    op = linalg.FillOp([init.type], [value], [init])
    linalg.fill_builtin_region(op.operation)
    return op.results[0]


def memref_type(shape: Sequence[int | None], dtype: str | ir.Type, *, strides: Sequence[int] | None = None,
                offset: int | None = 0, space: int | None = None) -> ir.MemRefType:
    """``memref<shape x dtype>``: a None size is dynamic (``?``); with ``strides``, a strided layout (a None
    ``offset`` is dynamic); ``space``, the memory space (an integer)."""
    dyn = ir.ShapedType.get_dynamic_size()
    elt = element_type(dtype) if isinstance(dtype, str) else dtype
    layout = None
    if strides is not None:
        off = ir.ShapedType.get_dynamic_stride_or_offset() if offset is None else offset
        layout = ir.StridedLayoutAttr.get(off, list(strides))
    mspace = None if space is None else ir.IntegerAttr.get(ir.IntegerType.get_signless(64), space)
    return ir.MemRefType.get([dyn if d is None else d for d in shape], elt, layout, mspace)


def reassociation(groups: Sequence[Sequence[int]]) -> ir.ArrayAttr:
    """A reshape's reassociation attribute (``[[0, 1], [2]]``)."""
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])


def reassociation_groups(reshape: ir.Operation) -> list[list[int]]:
    """The groups of a reshape's (``collapse_shape``/``expand_shape``, tensor or memref) reassociation:
    the inverse of `reassociation`."""
    return [[ir.IntegerAttr(d).value for d in ir.ArrayAttr(g)]
            for g in ir.ArrayAttr(reshape.attributes["reassociation"])]


def collapsed_layout(shape: Sequence[int], strides: Sequence[int],
                     groups: Sequence[Sequence[int]]) -> tuple[list[int], list[int]]:
    """(sizes, strides) of a view collapsing ``groups`` of dimensions, as ``memref.collapse_shape`` infers
    them (pure): a group's stride is its innermost non-unit dimension's, or its first's when all are 1."""
    sizes, out = [], []
    for g in groups:
        n = 1
        for d in g:
            n *= shape[d]
        sizes.append(n)
        wide = [d for d in g if shape[d] != 1]
        out.append(strides[wide[-1]] if wide else strides[g[0]])
    return sizes, out


def collapsed_type(t: ir.MemRefType, groups: Sequence[Sequence[int]]) -> ir.MemRefType:
    """The result type of ``memref.collapse_shape`` of a static ``t`` by ``groups``: an identity layout
    stays one, any other becomes the strided layout `collapsed_layout` gives."""
    rank = len(t.shape)
    if isinstance(t.layout, ir.AffineMapAttr) and t.layout.value == ir.AffineMap.get_identity(rank):
        sizes, _ = collapsed_layout(t.shape, [1] * rank, groups)
        return ir.MemRefType.get(sizes, t.element_type, memory_space=t.memory_space)
    strides, offset = t.get_strides_and_offset()
    sizes, new_strides = collapsed_layout(t.shape, strides, groups)
    return ir.MemRefType.get(sizes, t.element_type, layout=ir.StridedLayoutAttr.get(offset, new_strides),
                             memory_space=t.memory_space)


def call_parts(callee: str, args: Sequence[ir.Value], parts: int) -> None:
    """``@callee(*args, part)`` for every ``part`` in ``range(parts)``, at the insertion point: in an
    ``scf.forall`` when there are several (the parts of a kernel split over the cores, which the cpu
    target's ``lower-parallel`` forks), else one call with part 0."""
    ref = ir.FlatSymbolRefAttr.get(callee)
    if parts > 1:
        forall = scf.ForallOp([0], [parts], [1])
        with ir.InsertionPoint(forall.body):
            func.CallOp([], ref, [*args, forall.induction_variables[0]])
            scf.InParallelOp()
    else:
        func.CallOp([], ref, [*args, arith.ConstantOp(ir.IndexType.get(), 0).result])


def generic(ins: Sequence[tuple[ir.Value, ir.AffineMapAttr]], init: ir.Value, out_map: ir.AffineMapAttr,
            iterators: Sequence[str], body: Callable[[Sequence[ir.Value]], ir.Value]) -> ir.Value:
    """A one-result ``linalg.generic`` on tensors: ``ins`` read through their maps, ``init`` written through
    ``out_map``; ``body`` builds the scalar code from the block arguments (one per input, then the output's
    current element) at the block's insertion point and returns the value to yield."""
    maps = ir.ArrayAttr.get([m for _, m in ins] + [out_map])
    op = linalg.GenericOp([init.type], [v for v, _ in ins], [init], maps, list(iterators))
    element_types = [ir.ShapedType(v.type).element_type for v, _ in ins] + [ir.ShapedType(init.type).element_type]
    block = op.regions[0].blocks.append(*element_types)
    with ir.InsertionPoint(block):
        linalg.YieldOp([body(list(block.arguments))])
    return op.results[0]


def buffer_generic(ins: Sequence[tuple[ir.Value, ir.AffineMapAttr]], outs: Sequence[tuple[ir.Value, ir.AffineMapAttr]],
                   iterators: Sequence[str], body: Callable[[Sequence[ir.Value]], Sequence[ir.Value]]) -> linalg.GenericOp:
    """A ``linalg.generic`` on buffers (no results): ``ins`` read and ``outs`` updated through their maps;
    ``body`` builds the scalar code from the block arguments (inputs, then outputs) and returns the values
    to yield, one per output."""
    maps = ir.ArrayAttr.get([m for _, m in ins] + [m for _, m in outs])
    op = linalg.GenericOp([], [v for v, _ in ins], [v for v, _ in outs], maps, list(iterators))
    block = op.regions[0].blocks.append(*[ir.ShapedType(v.type).element_type for v, _ in [*ins, *outs]])
    with ir.InsertionPoint(block):
        linalg.YieldOp(list(body(list(block.arguments))))
    return op


@contextmanager
def loop(lower: ir.Value, upper: ir.Value, step: ir.Value, iter_args: Sequence[ir.Value] = ()) -> Iterator[scf.ForOp]:
    """``scf.for``: the body is built inside the ``with`` block (at its insertion point); without
    ``iter_args`` the ``scf.yield`` is added at its end, with them the body yields itself."""
    op = scf.ForOp(lower, upper, step, list(iter_args))
    with ir.InsertionPoint(op.body):
        yield op
        if not iter_args:
            scf.YieldOp([])


def for_each(lb: ir.Value, ub: ir.Value, step: ir.Value, body: Callable[[ir.Value], None]) -> None:
    """``scf.for`` without loop-carried values; ``body(iv)`` builds the loop body."""
    op = scf.ForOp(lb, ub, step)
    with ir.InsertionPoint(op.body):
        body(op.induction_variable)
        scf.YieldOp([])


def for_values(lb: ir.Value, ub: ir.Value, step: ir.Value, init: Sequence[ir.Value],
               body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """``scf.for`` carrying ``init``: ``body(iv, values)`` builds the body and returns the values it yields;
    returns the loop's results."""
    op = scf.ForOp(lb, ub, step, list(init))
    with ir.InsertionPoint(op.body):
        scf.YieldOp(body(op.induction_variable, list(op.inner_iter_args)))
    return list(op.results)


def if_then(cond: ir.Value, then: Callable[[], None], otherwise: Callable[[], None] | None = None) -> None:
    """``scf.if`` without results."""
    op = scf.IfOp(cond, has_else=otherwise is not None)
    with ir.InsertionPoint(op.then_block):
        then()
        scf.YieldOp([])
    if otherwise is not None:
        with ir.InsertionPoint(op.else_block):
            otherwise()
            scf.YieldOp([])


def if_values(cond: ir.Value, types: Sequence[ir.Type], then: Callable[[], list[ir.Value]],
              otherwise: Callable[[], list[ir.Value]]) -> list[ir.Value]:
    """``scf.if`` with results of ``types``: the values ``then`` or ``otherwise`` builds in its branch."""
    op = scf.IfOp(cond, list(types), has_else=True)
    with ir.InsertionPoint(op.then_block):
        scf.YieldOp(then())
    with ir.InsertionPoint(op.else_block):
        scf.YieldOp(otherwise())
    return list(op.results)


class Indices:
    """Index arithmetic at the current insertion point, folding additions of 0 and multiplications by 0
    and 1. Constants are memoised per value and built at the top of ``block`` (`hoist` puts them there in
    increasing order once the block is complete)."""

    def __init__(self, block: ir.Block) -> None:
        self.block = block
        self.consts: dict[int, ir.Value] = {}

    def c(self, v: int) -> ir.Value:
        if v not in self.consts:
            index = ir.IndexType.get()
            with ir.InsertionPoint.at_block_begin(self.block):
                self.consts[v] = arith.ConstantOp(index, ir.IntegerAttr.get(index, v)).result
        return self.consts[v]

    def hoist(self) -> None:
        """Move the constants to the top of the block, in increasing order of value."""
        ops = [self.consts[k].owner for k in sorted(self.consts)]
        if not ops:
            return
        ops[0].move_before(self.block.operations[0])
        for prev, op in itertools.pairwise(ops):
            op.move_after(prev)

    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        if b == self.c(0):
            return a
        if a == self.c(0):
            return b
        return arith.addi(a, b)

    def mul(self, a: ir.Value, k: int) -> ir.Value:
        if k == 0:
            return self.c(0)
        if k == 1:
            return a
        return arith.muli(a, self.c(k))

    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.subi(a, b)

    def min(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.minsi(a, b)

    def max(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.maxsi(a, b)

    def divui(self, a: ir.Value, k: int) -> ir.Value:
        return arith.divui(a, self.c(k))

    def remui(self, a: ir.Value, k: int) -> ir.Value:
        return arith.remui(a, self.c(k))


def transpose_stages(n: int) -> list[list[tuple[int, int, list[int], list[int]]]]:
    """The butterfly of `transpose_vectors` for ``n`` lanes (a power of two): ``log2(n)`` stages, each a
    list of ``(i, j, low, high)``: rows ``i`` and ``j = i + d`` swap their ``d x d`` off-diagonal blocks,
    row ``i`` becoming ``shuffle(row_i, row_j, low)`` and row ``j`` ``shuffle(row_i, row_j, high)`` (masks
    index the concatenation of both rows, as `vector.shuffle`'s)."""
    stages = []
    d = n // 2
    while d:
        low = [j if not j & d else n + j - d for j in range(n)]
        high = [j + d if not j & d else n + j for j in range(n)]
        stages.append([(i, i + d, low, high) for i in range(n) if not i & d])
        d //= 2
    return stages


def transpose_vectors(rows: Sequence[ir.Value]) -> list[ir.Value]:
    """The transpose of an ``L x L`` block held as ``L`` vectors of ``L`` lanes (``L`` a power of two):
    the `transpose_stages` butterfly of two-source shuffles, which LLVM selects as one permute instruction
    apiece (``vpermt2ps``/``vunpcklps``... on AVX-512)."""
    n = len(rows)
    if n & (n - 1) or ir.VectorType(rows[0].type).shape != [n]:
        raise ValueError(f"transpose needs a square block of a power-of-two lanes, got {n} x {rows[0].type}")
    out = list(rows)
    for stage in transpose_stages(n):
        nxt = list(out)
        for i, j, low, high in stage:
            nxt[i] = vector.shuffle(out[i], out[j], low)
            nxt[j] = vector.shuffle(out[i], out[j], high)
        out = nxt
    return out


def on_vectors(op: ir.Operation) -> bool:
    """Whether ``op`` (in a ``linalg.generic``'s body) means the same on vectors, so `body_on_vectors` can
    rebuild it: a one-result arith or math op without regions, or the yield."""
    if op.name == "linalg.yield":
        return True
    return op.name.split(".")[0] in ("arith", "math") and len(op.results) == 1 and not len(op.regions)


def body_on_vectors(body: ir.Block, args: Sequence[ir.Value | None], lanes: int, *,
                    stop: ir.Operation | None = None) -> list[ir.Value]:
    """Build a ``linalg.generic`` region's ``body`` (single-result arith/math ops) again on vectors of ``lanes``
    at the insertion point. ``args`` holds a vector per block argument (None: one the rebuilt part does not
    read); scalar constants the body reads from outside (hoisted by canonicalize) become splats. Returns the
    yielded vectors, or with ``stop`` (an op of the body) the vectors of its operands other than the block
    arguments given as None, without building ``stop`` or what follows it."""
    unset = [a for a, v in zip(body.arguments, args) if v is None]
    env: list[tuple[ir.Value, ir.Value]] = [(a, v) for a, v in zip(body.arguments, args) if v is not None]

    def look(v: ir.Value) -> ir.Value:
        found = next((w for u, w in env if u == v), None)
        if found is not None:
            return found
        owner = v.owner
        owner = owner if isinstance(owner, ir.Operation) else owner.operation
        if owner.name != "arith.constant":
            raise ValueError(f"a generic's body reads {owner.name} from outside it")
        t = ir.VectorType.get([lanes], v.type)
        splat = arith.constant(t, ir.DenseElementsAttr.get_splat(t, owner.attributes["value"]))
        env.append((v, splat))
        return splat

    for inner in body.operations:
        op = inner.operation
        if stop is not None and op == stop:
            return [look(v) for v in op.operands if v not in unset]
        if op.name == "linalg.yield":
            return [look(v) for v in op.operands]
        if op.name == "arith.constant" and not isinstance(op.results[0].type, ir.ShapedType):
            look(op.results[0])
            continue
        attrs = {name: op.attributes[name] for name in op.attributes}
        made = ir.Operation.create(op.name, results=[ir.VectorType.get([lanes], op.results[0].type)],
                                   operands=[look(v) for v in op.operands], attributes=attrs).results[0]
        env.append((op.results[0], made))
    raise ValueError("a generic's body without linalg.yield")
