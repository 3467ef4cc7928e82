"""Pass ``transpose-blocks``: a copy that moves its innermost dimension — an NCHW <-> NHWC layout change,
a ``linalg.transpose`` or a copy ``linalg.generic`` reading through a permutation — as L x L blocks through
the vector registers.

Lowered as loops, such a copy walks one of its two buffers a stride at a time: a load or a store per element
(an NCHW image of 64 x 56 x 56 to NHWC took 0.076 ms on a Zen 4 core, 1.4 cycles an element). Here the two
loops involved — ``a``, along which the input is contiguous, and ``q``, along which the output is — are cut
into L x L blocks (L: the spec's vector lanes for the element type): L vector loads along ``a`` (one per
``q`` of the block), `transpose_vectors` (``log2 L`` stages of two-source shuffles), L vector stores along
``q``. A block at the end of ``a`` or ``q`` loads and stores under lane masks (``q`` indices past the end read
the last one, their lanes never stored; rows past the end of ``a`` are not stored); the other loops run
around the blocks. Done on buffers after ``fuse-rows`` (which splits the transposes of a batch-1 entry over
the cores first) and ``collapse-loops`` (which leaves an NCHW image's h, w as one loop of h*w).

`plan_transpose` (pure) decides from the loops each buffer dimension is indexed by and the strides: both
innermost strides 1, the two innermost loops different, both at least L long. Field ``enabled`` (the cpu
target's option ``transpose_blocks``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith, scf, vector

from pbsdk.core.ir.builder import Indices, transpose_vectors
from pbsdk.core.passes import ops_named


@dataclasses.dataclass(frozen=True)
class TransposePlan:
    """A copy ``out[out_loops] = in[in_loops]`` (per buffer dimension, the loop it is indexed by) over loops
    of these ``extents``, moved in ``lanes x lanes`` blocks of loops ``a`` (the input's innermost) and ``q``
    (the output's innermost)."""

    extents: tuple[int, ...]
    in_loops: tuple[int, ...]
    out_loops: tuple[int, ...]
    a: int
    q: int
    lanes: int

    @property
    def ragged_a(self) -> bool:
        return self.extents[self.a] % self.lanes != 0

    @property
    def ragged_q(self) -> bool:
        return self.extents[self.q] % self.lanes != 0


def plan_transpose(extents: Sequence[int], in_loops: Sequence[int], out_loops: Sequence[int],
                   in_strides: Sequence[int], out_strides: Sequence[int], lanes: int
                   ) -> tuple[TransposePlan | None, str]:
    """The blocks for a permuting copy, or None and why not (see the module docstring)."""
    n = len(extents)
    if sorted(in_loops) != list(range(n)) or sorted(out_loops) != list(range(n)):
        return None, "not a permutation of the loops"
    if lanes < 2 or lanes & (lanes - 1):
        return None, f"{lanes} lanes: not a power of two"
    if in_strides[-1] != 1 or out_strides[-1] != 1:
        return None, "an innermost stride is not 1"
    a, q = in_loops[-1], out_loops[-1]
    if a == q:
        return None, "the innermost dimension stays innermost: a contiguous copy"
    if extents[a] < lanes or extents[q] < lanes:
        return None, f"{extents[a]} x {extents[q]}: narrower than a {lanes} x {lanes} block"
    return TransposePlan(tuple(extents), tuple(in_loops), tuple(out_loops), a, q, lanes), ""


def _permutation(amap: ir.AffineMap) -> tuple[int, ...] | None:
    loops = []
    for e in amap.results:
        if not isinstance(e, ir.AffineDimExpr):
            return None
        loops.append(e.position)
    return tuple(loops)


def _copy_operands(op: ir.Operation) -> tuple[ir.Value, ir.Value, tuple[int, ...], tuple[int, ...]] | None:
    """(input, output, in_loops, out_loops) of a permuting copy on buffers, or None."""
    if op.name == "linalg.transpose":
        src, dst = op.operands[0], op.operands[1]
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        # Output dimension i is loop i and reads input dimension perm[i].
        in_loops = tuple(perm.index(j) for j in range(len(perm)))
        return src, dst, in_loops, tuple(range(len(perm)))
    if op.name != "linalg.generic" or len(op.operands) != 2 or op.results:
        return None
    its = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if any("parallel" not in i for i in its):
        return None
    body = list(op.regions[0].blocks[0].operations)
    block = op.regions[0].blocks[0]
    if len(body) != 1 or body[0].operation.name != "linalg.yield" or body[0].operation.operands[0] != block.arguments[0]:
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    reads, writes = _permutation(maps[0]), _permutation(maps[1])
    if reads is None or writes is None:
        return None
    return op.operands[0], op.operands[1], reads, writes


@dataclasses.dataclass(frozen=True)
class TransposeBlocks:
    """Rewrite every permuting copy that `plan_transpose` takes into L x L register-transposed blocks."""

    name = "transpose-blocks"
    #: False: the pass does nothing but note so (the cpu target sets it from its option ``transpose_blocks``).
    enabled: bool = True

    def apply(self, module: ir.Module, ctx: Any) -> None:
        notes = ctx.notes.setdefault(self.name, []) if ctx is not None else []
        if not self.enabled:
            notes.append("disabled by option transpose_blocks=False")
            return
        vec = ctx.spec.vector if ctx is not None else None
        with module.context, ir.Location.unknown():
            for op in ops_named(module, "linalg.generic") + ops_named(module, "linalg.transpose"):
                found = _copy_operands(op)
                if found is None:
                    continue
                src, dst, in_loops, out_loops = found
                if not (isinstance(src.type, ir.MemRefType) and isinstance(dst.type, ir.MemRefType)):
                    continue
                st, dt = ir.MemRefType(src.type), ir.MemRefType(dst.type)
                dtype = str(st.element_type)
                if str(dt.element_type) != dtype or not (st.has_static_shape and dt.has_static_shape):
                    continue
                if vec is None or dtype not in vec.dtypes:
                    notes.append(f"{op.name} {st} -> {dt}: no vector unit for {dtype}; left as is")
                    continue
                extents = list(dt.shape)
                for loop, size in zip(out_loops, dt.shape):
                    extents[loop] = size
                plan, why = plan_transpose(extents, in_loops, out_loops, st.get_strides_and_offset()[0],
                                           dt.get_strides_and_offset()[0], vec.lanes(dtype))
                if plan is None:
                    notes.append(f"{op.name} {st} -> {dt}: {why}; left as is")
                    continue
                notes.append(f"{op.name} {st} -> {dt}: {plan.lanes}x{plan.lanes} register-transposed blocks of "
                             f"loops {plan.a} x {plan.q}")
                with ir.InsertionPoint(op):
                    _build(plan, src, dst, st.element_type)
                op.erase()


def _build(plan: TransposePlan, src: ir.Value, dst: ir.Value, element: ir.Type) -> None:
    """The loop nest of `TransposeBlocks` at the insertion point."""
    L = plan.lanes
    vt = ir.VectorType.get([L], element)
    mt = ir.VectorType.get([L], ir.IntegerType.get_signless(1))
    c = Indices(ir.InsertionPoint.current.block).c  # constants at the top of the copy's block

    ext_a, ext_q = plan.extents[plan.a], plan.extents[plan.q]
    zero_attr = (ir.IntegerAttr.get(element, 0) if isinstance(element, ir.IntegerType)
                 else ir.FloatAttr.get(element, 0.0))
    zero = arith.constant(vt, ir.DenseElementsAttr.get_splat(vt, zero_attr))
    others = [j for j in range(len(plan.extents)) if j not in (plan.a, plan.q)]

    def nest(depth: int, ivs: dict[int, ir.Value]) -> None:
        if depth < len(others):
            j = others[depth]
            loop = scf.ForOp(c(0), c(plan.extents[j]), c(1))
            with ir.InsertionPoint(loop.body):
                nest(depth + 1, {**ivs, j: loop.induction_variable})
                scf.YieldOp([])
            return
        outer = scf.ForOp(c(0), c(ext_a), c(L))
        with ir.InsertionPoint(outer.body):
            inner = scf.ForOp(c(0), c(ext_q), c(L))
            with ir.InsertionPoint(inner.body):
                block(ivs, outer.induction_variable, inner.induction_variable)
                scf.YieldOp([])
            scf.YieldOp([])

    def block(ivs: dict[int, ir.Value], a0: ir.Value, q0: ir.Value) -> None:
        count_a = arith.minsi(arith.subi(c(ext_a), a0), c(L)) if plan.ragged_a else None
        count_q = arith.minsi(arith.subi(c(ext_q), q0), c(L)) if plan.ragged_q else None
        mask_a = vector.create_mask(mt, [count_a]) if count_a is not None else None
        mask_q = vector.create_mask(mt, [count_q]) if count_q is not None else None
        rows = []
        for t in range(L):
            qt = arith.addi(q0, c(t)) if t else q0
            if plan.ragged_q:
                qt = arith.minsi(qt, c(ext_q - 1))  # past the end: the last column again, never stored
            at = {**ivs, plan.a: a0, plan.q: qt}
            idx = [at[j] for j in plan.in_loops]
            rows.append(vector.load(vt, src, idx) if mask_a is None else vector.maskedload(vt, src, idx, mask_a, zero))
        for s, val in enumerate(transpose_vectors(rows)):
            at = {**ivs, plan.a: arith.addi(a0, c(s)) if s else a0, plan.q: q0}
            idx = [at[j] for j in plan.out_loops]

            def store(val: ir.Value = val, idx: list[ir.Value] = idx) -> None:
                if mask_q is None:
                    vector.store(val, dst, idx)
                else:
                    vector.maskedstore(dst, idx, mask_q, val)

            if count_a is None:
                store()
            else:  # rows past the end of a are not stored
                guard = scf.IfOp(arith.cmpi(arith.CmpIPredicate.slt, c(s), count_a))
                with ir.InsertionPoint(guard.then_block):
                    store()
                    scf.YieldOp([])

    nest(0, {})
