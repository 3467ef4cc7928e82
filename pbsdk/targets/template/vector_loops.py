"""Elementwise ops, reductions and fills of a cache-only chip as vector loops at the spec's width.

The core leaves every op of a cache-only chip that is not a contraction tile as a ``linalg.generic`` (or a
``linalg.fill``) on packed tiles, marked ``pbsdk.compute = "vector"``. `build_vector_loops` turns one into
vector code of ``lanes = spec.vector.width_bits / (its widest element type's bits)`` lanes, as the chip's
vector unit would run it:

- the op's innermost loop is the vector loop; every other loop is an ``scf.for`` around it;
- an operand indexed by the vector loop is read and written as ``vector<lanes x T>``
  (``vector.transfer_read``/``transfer_write``): contiguous where the loop indexes its last, unit-stride
  dimension, strided along another one (a transposed operand: one strided load or store, as RVV's
  ``vlse``/``vsse``); one that is not (a broadcast operand: a bias, a row statistic) is loaded once per
  point of the other loops and broadcast;
- the body is the op's own, each ``arith``/``math`` op built again on vectors (a value defined outside
  the body, a constant, is broadcast where it is used: a register the chip fills once, not counted; the
  host's compiler hoists it). On the host, LLVM runs ``math`` ops it has no vector code for (``exp``,
  ``erf``, ...) as one libm call per lane, as the scalar emulation did;
- when the vector loop is a reduction (a sum along a row) the body's combining op (``arith.addf``,
  ``maximumf``, ``addi``, ``maxsi``, ...) accumulates into a vector register that starts at the op's
  neutral element, and one ``vector.reduction`` at the end combines its lanes with the output's value;
- the last ``extent % lanes`` points are one masked step (``vector.create_mask``: masked reads and
  writes; in a reduction, lanes off the mask keep the accumulator), skipped when the extent is a
  multiple of the lanes (``scf.if`` on a dynamic extent).

Every instruction is counted by kind in the ``vector_op:<kind>`` counters: ``load``/``store`` per vector
read or written, ``broadcast`` per broadcast operand, the body's op names (``addf``, ``exp``, ...), and
``reduction`` and ``select`` in a reduction; the counts are computed from the extents before the loops,
not in them. An op this cannot take returns False and the caller emulates it: a body with an op that
is not elementwise arithmetic or with an index type, an operand that the vector loop indexes twice or
whose layout is not strided, an index that is not a loop or a constant (a convolution's window), a
reduction whose combining op is not one of `COMBINERS` or that has several outputs, a generic
without loops.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from contextlib import ExitStack

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from pbsdk.core.hooks import VectorTileOp
from pbsdk.core.spec import ChipSpec

__all__ = ["COMBINERS", "VectorLoop", "build_vector_loops", "vector_loop"]

#: Combining ops of a reduction along the vector loop: the `vector.CombiningKind` of its lanes' reduction and
#: its neutral element (the accumulator's start; ``"min"``/``"max"`` the type's least/greatest value).
COMBINERS: dict[str, tuple[str, float | str]] = {
    "arith.addf": ("ADD", 0.0), "arith.mulf": ("MUL", 1.0), "arith.maximumf": ("MAXIMUMF", "min"),
    "arith.minimumf": ("MINIMUMF", "max"), "arith.maxnumf": ("MAXNUMF", "min"), "arith.minnumf": ("MINNUMF", "max"),
    "arith.addi": ("ADD", 0), "arith.muli": ("MUL", 1), "arith.maxsi": ("MAXSI", "min"), "arith.minsi": ("MINSI", "max"),
    "arith.maxui": ("MAXUI", 0), "arith.minui": ("MINUI", -1), "arith.andi": ("AND", -1), "arith.ori": ("OR", 0),
    "arith.xori": ("XOR", 0),
}


@dataclasses.dataclass(frozen=True)
class VectorLoop:
    """How one op becomes vector loops: the loop run as vectors (``vector_dim``) and the others in order
    (``outer``), ``lanes``, the operands read or written as vectors (``vectors``) and those broadcast
    (``scalars``), and, when the vector loop is a reduction, the body's combining op (``combiner``)."""

    vector_dim: int
    outer: tuple[int, ...]
    lanes: int
    vectors: tuple[int, ...]
    scalars: tuple[int, ...]
    combiner: str | None


def _bits(t: ir.Type) -> int | None:
    """The width of a scalar float or integer type; None for any other type."""
    if isinstance(t, ir.FloatType):
        return int(t.width)
    if isinstance(t, ir.IntegerType):
        return int(t.width)
    return None


def _body(op: VectorTileOp) -> ir.Block:
    original = op.original.operation if hasattr(op.original, "operation") else op.original
    return original.regions[0].blocks[0]


def _strides(t: ir.MemRefType) -> list[int] | None:
    """``t``'s strides, None for a layout that is not strided."""
    try:
        strides, _ = t.get_strides_and_offset()
    except RuntimeError:
        return None
    return list(strides)


def _unit_stride(t: ir.MemRefType) -> bool:
    strides = _strides(t)
    return strides is not None and bool(strides) and strides[-1] == 1


def vector_loop(op: VectorTileOp, spec: ChipSpec) -> VectorLoop | None:
    """The vector loops of ``op`` on ``spec``'s vector unit, or None when the op is not one this module
    takes (the module docstring). Reads types and maps only."""
    vec = spec.vector
    types = op.operand_types
    if vec is None or op.kind == "vector-fma":
        return None
    if op.op_name == "linalg.fill":  # a fill: its output's loops, the last as vectors
        out = types[-1]
        if len(types) != 2 or not isinstance(out, ir.MemRefType):
            return None
        t = ir.MemRefType(out)
        bits = _bits(t.element_type)
        if t.rank == 0 or bits is None or not _unit_stride(t):
            return None
        return VectorLoop(t.rank - 1, tuple(range(t.rank - 1)), max(1, vec.width_bits // bits), (1,), (), None)
    if (op.op_name != "linalg.generic" or not op.iterator_types
            or not all(isinstance(t, ir.MemRefType) for t in types)):  # not a generic with loops on memrefs
        return None
    memrefs = [ir.MemRefType(t) for t in types]
    vd = len(op.iterator_types) - 1
    vectors, scalars = [], []
    for i, (t, amap) in enumerate(zip(memrefs, op.indexing_maps)):
        if not all(isinstance(e, ir.AffineDimExpr | ir.AffineConstantExpr) for e in amap.results):
            return None
        positions = [e.position for e in amap.results if isinstance(e, ir.AffineDimExpr)]
        if vd not in positions:
            scalars.append(i)
            continue
        if positions.count(vd) != 1 or _strides(t) is None:
            return None
        vectors.append(i)
    block = _body(op)
    widths = [_bits(t.element_type) for t in memrefs]
    for inner in block.operations:
        name = inner.operation.name
        if name == "linalg.yield":
            continue
        if not name.startswith(("arith.", "math.")) or inner.operation.regions:
            return None
        widths += [_bits(v.type) for v in [*inner.operation.operands, *inner.operation.results]]
    if any(w is None for w in widths):
        return None  # an index or a shaped value in the body
    combiner = None
    outputs = range(op.inputs, len(types))
    if op.iterator_types[vd] == "reduction":
        combiner = _combiner(block, op.inputs)
        if combiner is None or len(outputs) != 1:
            return None
        scalars = [i for i in scalars if i < op.inputs]  # the output is the accumulator's, not broadcast
    elif any(i in scalars for i in outputs):
        return None
    widest = max([w for w in widths if w is not None and w > 1], default=32)
    return VectorLoop(vd, tuple(range(vd)), max(1, vec.width_bits // widest), tuple(vectors), tuple(scalars), combiner)


def _combiner(block: ir.Block, inputs: int) -> str | None:
    """The name of the op of a reduction's body that combines a value with the output's (the yielded
    value, one of `COMBINERS`, whose other operand does not depend on the output), or None."""
    ops = [o.operation for o in block.operations]
    yielded = ops[-1].operands
    out = block.arguments[inputs]
    if len(yielded) != 1 or not isinstance(yielded[0].owner, ir.Operation | ir.OpView):
        return None
    combine = yielded[0].owner.operation if hasattr(yielded[0].owner, "operation") else yielded[0].owner
    if combine.name not in COMBINERS or len(combine.operands) != 2 or out not in list(combine.operands):
        return None
    uses = [o for o in ops if out in list(o.operands)]
    if len(uses) != 1 or list(combine.operands).count(out) != 1:
        return None
    return str(combine.name)


def build_vector_loops(op: VectorTileOp, operands: Sequence[ir.Value], spec: ChipSpec) -> bool:
    """Build ``op`` as vector loops at the insertion point (the module docstring) and count its
    instructions; False (nothing built) when `vector_loop` does not take it."""
    plan = vector_loop(op, spec)
    if plan is None:
        return False
    _Loops(op, plan, list(operands)).build()
    return True


class _Loops:
    """Builds one op's vector loops (`VectorLoop`) on its operands at the insertion point."""

    def __init__(self, op: VectorTileOp, plan: VectorLoop, operands: list[ir.Value]) -> None:
        self.op, self.plan, self.operands = op, plan, operands
        self.index = ir.IndexType.get()
        self.fill = op.op_name == "linalg.fill"
        self.maps = (ir.AffineMap.get_minor_identity(ir.MemRefType(operands[-1].type).rank,
                                                     ir.MemRefType(operands[-1].type).rank),) if self.fill \
            else op.indexing_maps
        self.first = 1 if self.fill else 0  # the first memref operand (a fill's value is a scalar)
        self.static: dict[int, int | None] = {}  # each loop's extent where it is static

    def c(self, v: int) -> ir.Value:
        return arith.constant(self.index, v)

    def vtype(self, elt: ir.Type) -> ir.VectorType:
        return ir.VectorType.get([self.plan.lanes], elt)

    def broadcast(self, value: ir.Value) -> ir.Value:
        """``value`` (a scalar) in every lane."""
        return vector.broadcast(self.vtype(value.type), value)

    # ------------------------------------------------------------------ extents and counting

    def extents(self) -> dict[int, ir.Value]:
        """Each loop's extent (``index``): from the first operand dimension the loop indexes."""
        out: dict[int, ir.Value] = {}
        for i in range(self.first, len(self.operands)):
            v = self.operands[i]
            t = ir.MemRefType(v.type)
            for j, e in enumerate(self.maps[i - self.first].results):
                if isinstance(e, ir.AffineDimExpr) and e.position not in out:
                    self.static[e.position] = None if t.is_dynamic_dim(j) else t.shape[j]
                    out[e.position] = (memref.dim(v, self.c(j)) if t.is_dynamic_dim(j) else self.c(t.shape[j]))
        return out

    def count(self, extents: dict[int, ir.Value]) -> None:
        """Count the instructions the loops will issue, from the extents (one value per kind)."""
        counter = self.op.count_instructions
        if counter is None:
            return
        lanes = self.c(self.plan.lanes)
        outer = self.c(1)
        for d in self.plan.outer:
            outer = arith.muli(outer, extents[d])
        extent = extents[self.plan.vector_dim]
        vectors = arith.divui(arith.addi(extent, self.c(self.plan.lanes - 1)), lanes)
        steps = arith.muli(outer, vectors)
        per_step: dict[str, int] = {}
        per_point: dict[str, int] = {}
        if self.fill:
            per_step["store"] = 1
        else:
            block = _body(self.op)
            used = {i for i, a in enumerate(block.arguments) if list(a.uses)}
            inputs = self.op.inputs
            # Every vector operand the body reads (a reduction's output is its accumulator register).
            per_step["load"] = sum(1 for i in self.plan.vectors if i in used and (i < inputs or not self.plan.combiner))
            if not self.plan.combiner:
                per_step["store"] = len(self.operands) - inputs
            for inner in block.operations:
                name = inner.operation.name
                if name not in ("linalg.yield", "arith.constant"):
                    kind = name.split(".", 1)[1]
                    per_step[kind] = per_step.get(kind, 0) + 1
            if self.plan.scalars:
                per_point["broadcast"] = sum(1 for i in self.plan.scalars if i in used)
            if self.plan.combiner:
                per_point["reduction"] = 1
                # One select a point where the extent leaves a partial vector: ceil(rem / lanes) is 0 or 1.
                rem = arith.remui(extent, lanes)
                partial = arith.divui(arith.addi(rem, self.c(self.plan.lanes - 1)), lanes)
                counter("select")(arith.muli(outer, partial))
        for kind, n in per_step.items():
            if n:
                counter(kind)(arith.muli(steps, self.c(n)))
        for kind, n in per_point.items():
            if n:
                counter(kind)(arith.muli(outer, self.c(n)))

    # ------------------------------------------------------------------ loops

    def build(self) -> None:
        extents = self.extents()
        self.count(extents)
        at: dict[int, ir.Value] = {}
        with ExitStack() as stack:
            for d in self.plan.outer:
                loop = scf.ForOp(self.c(0), extents[d], self.c(1))
                with ir.InsertionPoint(loop.body):
                    scf.YieldOp([])
                stack.enter_context(ir.InsertionPoint.at_block_terminator(loop.body))
                at[d] = loop.induction_variable
            scalars = self.scalars(at)
            extent = extents[self.plan.vector_dim]
            if self.plan.combiner:
                self.reduce(at, extent, scalars)
            else:
                self.elementwise(at, extent, scalars)

    def scalars(self, at: dict[int, ir.Value]) -> dict[int, ir.Value]:
        """The broadcast operands at this point of the outer loops (those the body reads)."""
        if self.fill:
            return {0: self.broadcast(self.operands[0])}
        block = _body(self.op)
        return {i: self.broadcast(memref.load(self.operands[i], self.indices(i, at)))
                for i in self.plan.scalars if list(block.arguments[i].uses)}

    def indices(self, i: int, at: dict[int, ir.Value]) -> list[ir.Value]:
        return [at[e.position] if isinstance(e, ir.AffineDimExpr) else self.c(ir.AffineConstantExpr(e).value)
                for e in self.maps[i - self.first].results]

    def full_and_rest(self, extent: ir.Value) -> tuple[ir.Value, ir.Value, int | None]:
        """Where the full vectors end, how many points are left, and that number when it is static."""
        lanes = self.plan.lanes
        static = self.static.get(self.plan.vector_dim)
        if static is not None:
            return self.c(static - static % lanes), self.c(static % lanes), static % lanes
        rest = arith.remui(extent, self.c(lanes))
        return arith.subi(extent, rest), rest, None

    def when_partial(self, rest: ir.Value, static: int | None, results: Sequence[ir.Type],
                     then: Callable[[], Sequence[ir.Value]], otherwise: Sequence[ir.Value]) -> list[ir.Value]:
        """``then()`` where ``rest`` points are left (statically: built or not; dynamically: an
        ``scf.if``), else ``otherwise``; the values it yields."""
        if static is not None:
            return list(then()) if static else list(otherwise)
        cond = arith.cmpi(arith.CmpIPredicate.ne, rest, self.c(0))
        branch = scf.IfOp(cond, list(results), has_else=True)
        with ir.InsertionPoint(branch.then_block):
            scf.YieldOp(list(then()))
        with ir.InsertionPoint(branch.else_block):
            scf.YieldOp(list(otherwise))
        return list(branch.results)

    def mask(self, rest: ir.Value) -> ir.Value:
        return vector.create_mask(self.vtype(ir.IntegerType.get_signless(1)), [rest])

    def along(self, i: int) -> ir.AffineMap:
        """The dimension of operand ``i`` the vector runs along (where its map has the vector loop): the
        last for a contiguous vector, another for a strided one (a transposed operand)."""
        results = self.maps[i - self.first].results
        pos = next(j for j, e in enumerate(results)
                   if isinstance(e, ir.AffineDimExpr) and e.position == self.plan.vector_dim)
        return ir.AffineMap.get(len(results), 0, [ir.AffineDimExpr.get(pos)])

    def read(self, i: int, at: dict[int, ir.Value], mask: ir.Value | None) -> ir.Value:
        src = self.operands[i]
        elt = ir.MemRefType(src.type).element_type
        pad = arith.constant(elt, 0.0 if isinstance(elt, ir.FloatType) else 0)
        return vector.transfer_read(self.vtype(elt), src, self.indices(i, at), self.along(i), pad, [True],
                                    mask=mask)

    def write(self, value: ir.Value, i: int, at: dict[int, ir.Value], mask: ir.Value | None) -> None:
        vector.transfer_write(None, value, self.operands[i], self.indices(i, at), self.along(i), [True], mask=mask)

    def step(self, at: dict[int, ir.Value], j: ir.Value, mask: ir.Value | None,
             scalars: dict[int, ir.Value], skip: ir.Operation | None = None) -> list[ir.Value]:
        """One vector of the body at vector-loop index ``j``: the yielded values (for a reduction, the
        value its combining op ``skip`` takes besides the output)."""
        if self.fill:
            return [scalars[0]]
        block = _body(self.op)
        here = {**at, self.plan.vector_dim: j}
        env: dict[ir.Value, ir.Value] = {}
        for i, arg in enumerate(block.arguments):
            if not list(arg.uses) or (skip is not None and i >= self.op.inputs):
                continue
            env[arg] = scalars[i] if i in scalars else self.read(i, here, mask)
        for inner in block.operations:
            o = inner.operation
            if o.name == "linalg.yield":
                if skip is not None:
                    return [next(self.value(v, env) for v in skip.operands if v != block.arguments[self.op.inputs])]
                return [self.value(v, env) for v in o.operands]
            if skip is not None and o == skip:
                continue
            if o.name == "arith.constant":
                env[o.results[0]] = self.broadcast(arith.ConstantOp(o.results[0].type, o.attributes["value"]).result)
                continue
            built = ir.Operation.create(o.name, results=[self.vtype(r.type) for r in o.results],
                                        operands=[self.value(v, env) for v in o.operands],
                                        attributes=_attributes(o))
            for r, new in zip(o.results, built.results):
                env[r] = new
        raise AssertionError("a linalg body ends with linalg.yield")

    def value(self, v: ir.Value, env: dict[ir.Value, ir.Value]) -> ir.Value:
        """The vector of body value ``v``; a value defined outside the body is broadcast where it is used
        (a register the chip fills once: the host's compiler hoists it)."""
        if v not in env:
            env[v] = self.broadcast(v)
        return env[v]

    def elementwise(self, at: dict[int, ir.Value], extent: ir.Value, scalars: dict[int, ir.Value]) -> None:
        """Full vectors in a loop, then the masked rest; every output written."""
        full, rest, static = self.full_and_rest(extent)
        outputs = [len(self.operands) - 1] if self.fill else list(range(self.op.inputs, len(self.operands)))

        def write_all(j: ir.Value, mask: ir.Value | None) -> list[ir.Value]:
            for o, value in zip(outputs, self.step(at, j, mask, scalars)):
                self.write(value, o, {**at, self.plan.vector_dim: j}, mask)
            return []

        loop = scf.ForOp(self.c(0), full, self.c(self.plan.lanes))
        with ir.InsertionPoint(loop.body):
            write_all(loop.induction_variable, None)
            scf.YieldOp([])
        self.when_partial(rest, static, [], lambda: write_all(full, self.mask(rest)), [])

    def reduce(self, at: dict[int, ir.Value], extent: ir.Value, scalars: dict[int, ir.Value]) -> None:
        """The reduction along the vector loop into one accumulator register, its lanes combined with
        the output's value at the end."""
        assert self.plan.combiner is not None
        block = _body(self.op)
        out = self.op.inputs
        combine = next(o.operation for o in block.operations if o.operation.name == self.plan.combiner
                       and block.arguments[out] in list(o.operation.operands))
        elt = block.arguments[out].type
        kind, neutral = COMBINERS[self.plan.combiner]
        start = self.broadcast(arith.constant(elt, _neutral(elt, neutral)))
        vtype = self.vtype(elt)
        attributes = _attributes(combine)

        def accumulate(acc: ir.Value, j: ir.Value, mask: ir.Value | None) -> ir.Value:
            (x,) = self.step(at, j, mask, scalars, skip=combine)
            operands = [acc if v == block.arguments[out] else x for v in combine.operands]
            new = ir.Operation.create(combine.name, results=[vtype], operands=operands, attributes=attributes).result
            return new if mask is None else arith.select(mask, new, acc)

        full, rest, static = self.full_and_rest(extent)
        loop = scf.ForOp(self.c(0), full, self.c(self.plan.lanes), [start])
        with ir.InsertionPoint(loop.body):
            scf.YieldOp([accumulate(loop.inner_iter_args[0], loop.induction_variable, None)])
        (acc,) = self.when_partial(rest, static, [vtype], lambda: [accumulate(loop.results[0], full, self.mask(rest))],
                                   [loop.results[0]])
        where = self.indices(out, at)
        old = memref.load(self.operands[out], where)
        if isinstance(elt, ir.BF16Type):
            # The lanes combined in f32: a host LLVM back end may have no bf16 reduction to give it (AVX512-FP16
            # hosts abort on one); the lanes' arithmetic itself is the lowering's (bf16 expanded in arith there).
            f32 = ir.F32Type.get()
            wide = vector.reduction(f32, getattr(vector.CombiningKind, kind),
                                    arith.extf(ir.VectorType.get(vtype.shape, f32), acc), acc=arith.extf(f32, old),
                                    fastmath=attributes.get("fastmath"))
            total = arith.truncf(elt, wide)
        else:
            total = vector.reduction(elt, getattr(vector.CombiningKind, kind), acc, acc=old,
                                     fastmath=attributes.get("fastmath"))
        memref.store(total, self.operands[out], where)


def _attributes(op: ir.Operation) -> dict[str, ir.Attribute]:
    """``op``'s attributes by name (what the op built again on vectors keeps: fast-math flags, a predicate)."""
    return {str(name): op.attributes[name] for name in op.attributes}


def _neutral(elt: ir.Type, neutral: float | str) -> float | int:
    """The value of ``neutral`` (a number, or ``"min"``/``"max"``: the type's least/greatest) in ``elt``."""
    if isinstance(elt, ir.FloatType):
        return -math.inf if neutral == "min" else math.inf if neutral == "max" else float(neutral)
    width = int(ir.IntegerType(elt).width)
    if neutral == "min":
        return -(1 << (width - 1))
    if neutral == "max":
        return (1 << (width - 1)) - 1
    return int(neutral)
