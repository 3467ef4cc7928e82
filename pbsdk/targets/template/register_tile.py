"""The vector unit of a cache-only chip, emulated on the host at the spec's vector width.

On a chip whose levels are all caches (`pbsdk.core.plan.packing`), the core stages a contraction that no
matrix unit serves into packed tiles and leaves its innermost tile as one op marked ``pbsdk.compute =
"vector-fma"``: the vector unit's register tile. `vector_tile_op` here builds that tile as the register-tile
micro-kernel of the core's planner (`pbsdk.core.plan.contraction.register_tile`: ``mr`` rows by ``nv``
vectors of accumulators, plus one B vector a column and one A broadcast, within ``spec.vector.registers``):
per block of the tile, the accumulators are read from C, the k loop broadcasts one A value a row and reads
one B vector a column, and issues ``mr x nv`` FMAs, then the accumulators are written back. The vectors
are ``vector<lanes x acc>`` of the spec's width (``spec.vector.lanes(acc)``), which LLVM legalises on the
host whatever its own width. f16/bf16 operands accumulate in f32, i8 in i32.

Every instruction is counted by kind in the ``vector_op:<kind>`` counters (``fma``, ``broadcast``, ``load``,
``store``), which the modelled time reads (`pbsdk.core.plan.chip_time`), next to the ``vector:<level>``
points. Elementwise ops, reductions and fills become vector loops at the same width
(`pbsdk.targets.template.vector_loops`), counted the same way. What neither takes (a tile of dynamic
shape or of a width not a multiple of the vector, a body that is not elementwise arithmetic) runs as the
template's emulation (the same op on the host) and is counted as the instructions the spec's width needs:
one per arithmetic op of the body per ``lanes`` points.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from contextlib import ExitStack

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from pbsdk.core.hooks import VectorTileOp
from pbsdk.core.plan.contraction import register_tile
from pbsdk.core.spec import ChipSpec
from pbsdk.targets.template.vector_loops import build_vector_loops

__all__ = ["MicroKernel", "micro_kernel", "vector_tile_op"]


@dataclasses.dataclass(frozen=True)
class MicroKernel:
    """The register tile of one ``vector-fma`` contraction tile, read off its maps and static shapes:
    the loop of each role (``m``, ``n``, ``k``, ``batch``), every loop's extent, and the register tile
    (``mr`` rows by ``nv`` vectors of ``lanes`` accumulators of type ``acc``)."""

    m: int
    n: int
    k: int
    batch: tuple[int, ...]
    extents: tuple[int, ...]
    mr: int
    nv: int
    lanes: int
    acc: str  # "f32", "f64", "i32", ...

    @property
    def registers(self) -> int:
        """Vector registers one k step holds: accumulators, one B vector a column, one A broadcast."""
        return self.mr * self.nv + self.nv + 1


def _accumulator(elt: ir.Type) -> str | None:
    if isinstance(elt, ir.FloatType):
        return "f64" if elt.width == 64 else "f32"
    if isinstance(elt, ir.IntegerType):
        return f"i{max(32, elt.width)}"
    return None


def micro_kernel(op: VectorTileOp, spec: ChipSpec) -> MicroKernel | None:
    """The micro-kernel of ``op`` on ``spec``'s vector unit, or None when the op is not a static
    contraction tile ``C[batch.., m, n] += A x B`` whose n extent is whole vectors of the spec's width."""
    vec = spec.vector
    if op.kind != "vector-fma" or vec is None or len(op.operand_types) != 3 or op.inputs != 2:
        return None
    types = [ir.MemRefType(t) for t in op.operand_types if isinstance(t, ir.MemRefType)]
    if len(types) != 3 or not all(t.has_static_shape for t in types) or len(op.indexing_maps) != 3:
        return None
    dims: list[list[int]] = []
    extents: dict[int, int] = {}
    for t, amap in zip(types, op.indexing_maps):
        loops = []
        for j, e in enumerate(amap.results):
            if isinstance(e, ir.AffineDimExpr):
                loops.append(e.position)
                extents[e.position] = t.shape[j]
            elif not isinstance(e, ir.AffineConstantExpr):
                return None
        dims.append(loops)
    a, b, c = (set(d) for d in dims)
    reductions = [i for i, it in enumerate(op.iterator_types) if it == "reduction"]
    m, n = sorted((c & a) - b), sorted((c & b) - a)
    if len(reductions) != 1 or len(m) != 1 or len(n) != 1 or not dims[2] or dims[2][-1] != n[0]:
        return None
    acc = _accumulator(types[2].element_type)
    if acc is None or acc not in vec.dtypes:
        return None
    lanes = vec.lanes(acc)
    if lanes < 1 or extents[n[0]] % lanes:
        return None
    mr, nv, _ = register_tile(vec.registers, lanes, vec.fma_per_cycle, vec.loads_per_cycle, extents[m[0]],
                              extents[n[0]], latency=vec.fma_latency)
    nv = min(nv, extents[n[0]] // lanes)
    mr = min(mr, extents[m[0]])
    return MicroKernel(m[0], n[0], reductions[0], tuple(sorted(c - {m[0], n[0]})),
                       tuple(extents.get(i, 1) for i in range(len(op.iterator_types))), mr, nv, lanes, acc)


def vector_tile_op(op: VectorTileOp, operands: Sequence[ir.Value], spec: ChipSpec) -> None:
    """The vector unit at ``spec.vector``'s width: a ``vector-fma`` tile as the register-tile micro-kernel
    (the module docstring), elementwise ops, reductions and fills as vector loops
    (`pbsdk.targets.template.vector_loops`), anything else as the template's emulation; points counted
    per level, vector instructions per kind."""
    op.count_elements(op.iterations())
    mk = micro_kernel(op, spec)
    if mk is not None:
        _Builder(op, mk, list(operands)).build()
    elif not build_vector_loops(op, operands, spec):
        _count_emulated(op, spec)
        op.emulate(operands)


def _count_emulated(op: VectorTileOp, spec: ChipSpec) -> None:
    """Count the vector instructions an op the host emulates stands for: per arithmetic op of its body
    (a fill: one store) one instruction per ``lanes`` points, at its output's element width."""
    if op.count_instructions is None or spec.vector is None:
        return
    out = op.operand_types[-1]
    elt = ir.MemRefType(out).element_type if isinstance(out, ir.MemRefType) else out
    width = elt.width if isinstance(elt, ir.FloatType | ir.IntegerType) else 32
    lanes = max(1, spec.vector.width_bits // max(8, width))
    index = ir.IndexType.get()
    vectors = arith.divui(arith.addi(op.iterations(), arith.constant(index, lanes - 1)), arith.constant(index, lanes))
    if not op.indexing_maps:
        op.count_instructions("store")(vectors)
        return
    for inner in op.original.regions[0].blocks[0].operations:
        name = inner.operation.name
        if name != "linalg.yield":
            op.count_instructions(name.split(".", 1)[-1])(vectors)


def _cast(value: ir.Value, to: ir.Type) -> ir.Value:
    """``value`` (a scalar or a vector) with element type ``to``: floats extended or rounded, integers
    sign-extended or truncated."""
    src = value.type
    shape = ir.VectorType(src).shape if isinstance(src, ir.VectorType) else None
    elt = ir.VectorType(src).element_type if shape is not None else src
    if elt == to:
        return value
    target = ir.VectorType.get(shape, to) if shape is not None else to
    if isinstance(elt, ir.FloatType):
        return arith.extf(target, value) if elt.width < to.width else arith.truncf(target, value)
    return arith.extsi(target, value) if elt.width < to.width else arith.trunci(target, value)


class _Builder:
    """Builds one micro-kernel (`MicroKernel`) over the tiles A, B, C at the insertion point."""

    def __init__(self, op: VectorTileOp, mk: MicroKernel, operands: list[ir.Value]) -> None:
        self.op, self.mk, self.operands = op, mk, operands
        self.acc = ir.F64Type.get() if mk.acc == "f64" else (
            ir.F32Type.get() if mk.acc == "f32" else ir.IntegerType.get_signless(int(mk.acc[1:])))
        self.vtype = ir.VectorType.get([mk.lanes], self.acc)
        self.index = ir.IndexType.get()

    def c(self, v: int) -> ir.Value:
        return arith.constant(self.index, v)

    def indices(self, which: int, at: dict[int, ir.Value]) -> list[ir.Value]:
        """The indices operand ``which`` (A 0, B 1, C 2) reads at loop values ``at``."""
        amap = self.op.indexing_maps[which]
        return [at[e.position] if isinstance(e, ir.AffineDimExpr) else self.c(0) for e in amap.results]

    def read(self, which: int, at: dict[int, ir.Value]) -> ir.Value:
        """One vector along n of operand ``which`` (B or C) at ``at``, as accumulator vectors."""
        src = self.operands[which]
        t = ir.MemRefType(src.type)
        pos = next(j for j, e in enumerate(self.op.indexing_maps[which].results)
                   if isinstance(e, ir.AffineDimExpr) and e.position == self.mk.n)
        perm = ir.AffineMap.get(t.rank, 0, [ir.AffineDimExpr.get(pos)])
        pad = arith.constant(t.element_type, 0.0 if isinstance(t.element_type, ir.FloatType) else 0)
        raw = vector.transfer_read(ir.VectorType.get([self.mk.lanes], t.element_type), src,
                                   self.indices(which, at), perm, pad, [True])
        return _cast(raw, self.acc)

    def build(self) -> None:
        """Loop over the batch loops and the tile's blocks (full blocks in a loop, the remainder once)."""
        mk = self.mk
        at: dict[int, ir.Value] = {}
        with ExitStack() as stack:
            for d in mk.batch:
                at[d] = self.c(0) if mk.extents[d] == 1 else self.loop(0, mk.extents[d], 1, stack)
            rows, vecs = mk.extents[mk.m], mk.extents[mk.n] // mk.lanes
            for r0, rn, rcount in _blocks(rows, mk.mr):
                for v0, vn, vcount in _blocks(vecs, mk.nv):
                    with ExitStack() as inner:
                        i = self.c(r0) if rcount == 1 else self.loop(r0, r0 + rn * rcount, rn, inner)
                        lo, size = v0 * mk.lanes, vn * mk.lanes
                        j = self.c(lo) if vcount == 1 else self.loop(lo, lo + size * vcount, size, inner)
                        self.block(at, i, j, rn, vn)

    def loop(self, lo: int, hi: int, step: int, stack: ExitStack) -> ir.Value:
        """An ``scf.for`` from ``lo`` to ``hi``; its body entered on ``stack``; its induction variable."""
        loop = scf.ForOp(self.c(lo), self.c(hi), self.c(step))
        with ir.InsertionPoint(loop.body):
            scf.YieldOp([])
        stack.enter_context(ir.InsertionPoint.at_block_terminator(loop.body))
        return loop.induction_variable

    def block(self, at: dict[int, ir.Value], i: ir.Value, j: ir.Value, rn: int, vn: int) -> None:
        """One register tile of ``rn`` rows by ``vn`` vectors at row ``i``, column ``j``: read the
        accumulators, run the k loop, write them back; count its instructions."""
        mk, lanes = self.mk, self.mk.lanes
        rows = [arith.addi(i, self.c(r)) if r else i for r in range(rn)]
        cols = [arith.addi(j, self.c(v * lanes)) if v else j for v in range(vn)]
        accs = [self.read(2, {**at, mk.m: rows[r], mk.n: cols[v]}) for r in range(rn) for v in range(vn)]
        loop = scf.ForOp(self.c(0), self.c(mk.extents[mk.k]), self.c(1), accs)
        with ir.InsertionPoint(loop.body):
            kv = loop.induction_variable
            bs = [self.read(1, {**at, mk.k: kv, mk.n: cols[v]}) for v in range(vn)]
            out = list(loop.inner_iter_args)
            for r in range(rn):
                a = memref.load(self.operands[0], self.indices(0, {**at, mk.m: rows[r], mk.k: kv}))
                ab = vector.broadcast(self.vtype, _cast(a, self.acc))
                for v in range(vn):
                    acc = out[r * vn + v]
                    out[r * vn + v] = (vector.fma(ab, bs[v], acc) if isinstance(self.acc, ir.FloatType)
                                       else arith.addi(acc, arith.muli(ab, bs[v])))
            scf.YieldOp(out)
        c = self.operands[2]
        ct = ir.MemRefType(c.type)
        for r in range(rn):
            for v in range(vn):
                value = _cast(loop.results[r * vn + v], ct.element_type)
                idx = self.indices(2, {**at, mk.m: rows[r], mk.n: cols[v]})
                vector.transfer_write(None, value, c, idx, ir.AffineMap.get_minor_identity(ct.rank, 1), [True])
        self.count(rn, vn, mk.extents[mk.k])

    def count(self, rn: int, vn: int, k: int) -> None:
        """The instructions of one block: FMAs, A broadcasts, B and C loads, C stores."""
        counter: Callable[[str], Callable[[int], None]] | None = self.op.count_instructions
        if counter is None:
            return
        for kind, n in (("fma", rn * vn * k), ("broadcast", rn * k), ("load", vn * k + rn * vn), ("store", rn * vn)):
            counter(kind)(n)


def _blocks(extent: int, step: int) -> list[tuple[int, int, int]]:
    """``extent`` in blocks of ``step``: (start, size, count) of the full blocks and of the remainder."""
    full, rest = divmod(extent, step)
    out = [(0, step, full)] if full else []
    if rest:
        out.append((full * step, rest, 1))
    return out
