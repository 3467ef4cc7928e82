"""Pass ``promote-vector``: stage every remaining structured op on main memory through the innermost scratchpad.

``promote`` stages contractions (and the core already staged fused attention); what is left on main
memory after it — elementwise chains with broadcasting, reductions over any axes, the passes of softmax
and layernorm, fills, convolutions — is staged here, in the same tiled form:

1. the op's loops, extents, iterator kinds and operand index expressions are read off the
   ``linalg.generic`` (`analyse`) and planned by `pbsdk.core.plan.vector_tiles.plan_vector` (pure);
2. one buffer per memref operand is allocated (``memref.alloc`` in the memory space of the innermost
   software-managed level, aligned as the level asks) and checked against the level's capacity with
   promote's rule and error (`check_capacity`);
3. ``scf.for`` loops walk the tiles of the parallel loops — where the plan splits them over
   ``spec.compute[0]`` (`VectorPlan.parallel`: the level is per core), inside one ``scf.forall`` over
   the parts marked ``pbsdk.compute_level = "<level>"``, whose body allocates the buffers (one set
   per core) and walks its part's run of tiles, as in ``promote``; inside, each input tile is copied in with a
   ``linalg.copy`` marked `attributes.DMA` (``"dram->spm"``), the op itself runs on the buffers marked
   `attributes.COMPUTE` = ``"vector"``, and each output tile is copied back (an input that no tile loop
   moves over — a broadcast bias row — is copied in once, before the loops). A reduction loop whose
   plan chunk is shorter than its extent gets its own inner ``scf.for``: the output tile (the
   accumulator) stays in the scratchpad while the reduced dimension streams through it — a multi-pass
   reduction. Partial tiles at the edges are subviews of dynamic size (``affine.min``) of both the main
   memory operand and the buffer;
4. a fill that only initialises the accumulator of the reduction right after it is folded into that
   reduction: the accumulator tile is filled in the scratchpad instead of being written to main memory
   and read back.

Ops the pass cannot stage stay as they are (bodies that read ``linalg.index`` or memory, dynamic shapes,
index expressions other than sums of loops with positive coefficients, rank-0 operands). What was staged
is recorded in ``ctx.notes["promote_vector"]`` (one `VectorStaging` per op, and one `KernelBuffers` per
fused attention kernel, whose buffers the core allocated earlier), which the template target's
``resources()`` counts in the scratchpad bytes it reports.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import ExitStack
from typing import Any, TypeAlias

from mlir import ir
from mlir.dialects import affine, linalg, memref, scf

from pbsdk.core.errors import CompileError
from pbsdk.core.ir import attributes
from pbsdk.core.passes import iterator_kinds, ops_named
from pbsdk.core.passes.promote import Buffer, bytes_per_level, check_capacity, is_mac, parts_of, with_units
from pbsdk.core.plan.vector_tiles import (
    Access,
    Term,
    UnitMapping,
    VectorOp,
    VectorPlan,
    plan_vector,
    unit_mapping,
)
from pbsdk.core.spec import ChipSpec

#: Ops that only make a view of a buffer (no memory effect of their own): a fill and the reduction it
#: initialises may have these between them.
_VIEW_OPS = {"memref.expand_shape", "memref.collapse_shape", "memref.subview", "memref.cast",
             "memref.reinterpret_cast", "arith.constant"}


@dataclasses.dataclass(frozen=True)
class VectorStaging:
    """What the pass did with one op: its ``kind`` (``elementwise``, ``reduction``, ``fill``,
    ``window``), the plan, the buffers, and whether a fill was folded into its accumulator."""

    function: str
    kind: str
    plan: VectorPlan
    buffers: tuple[Buffer, ...]
    folded_fill: bool = False
    matrix_unit: str | None = None  # the unit computing it in unit-sized pieces (implicit GEMM), if any

    @property
    def parts(self) -> int:
        """Units of ``spec.compute[0]`` the op runs on (1 without a forall)."""
        return parts_of(self.plan.parallel)

    def bytes_per_level(self) -> dict[str, int]:
        return bytes_per_level(self.buffers)


@dataclasses.dataclass(frozen=True)
class KernelBuffers:
    """The scratchpad buffers of a kernel the core staged before this pass (a fused attention kernel),
    recorded next to the `VectorStaging` records so that a target reports their bytes too."""

    function: str
    kind: str
    buffers: tuple[Buffer, ...]

    def bytes_per_level(self) -> dict[str, int]:
        return bytes_per_level(self.buffers)


def kernel_buffers(f: ir.Operation, level_names: Sequence[str]) -> tuple[Buffer, ...]:
    """Every static ``memref.alloc`` of ``f`` in a scratchpad memory space (live together: a kernel's
    buffers are allocated once per core)."""
    out = []
    for i, alloc in enumerate(ops_named(f, "memref.alloc")):  # type: ignore[arg-type]
        t = ir.MemRefType(alloc.result.type)
        space = _space(t)
        if space == 0 or not t.has_static_shape:
            continue
        align = ir.IntegerAttr(alloc.attributes["alignment"]).value if "alignment" in alloc.attributes else 1
        out.append(Buffer(f"buffer{i}", level_names[space], space, tuple(t.shape), str(t.element_type), align))
    return tuple(out)


# ------------------------------------------------------------------------------------------ analysis


def _terms(e: ir.AffineExpr) -> list[Term] | None:
    """``e`` as a sum of (loop, positive coefficient) terms; [] for the constant 0; None otherwise."""
    if isinstance(e, ir.AffineDimExpr):
        return [(e.position, 1)]
    if isinstance(e, ir.AffineConstantExpr):
        return [] if e.value == 0 else None
    if isinstance(e, ir.AffineAddExpr):
        lhs, rhs = _terms(e.lhs), _terms(e.rhs)
        if lhs is None or rhs is None or (not lhs and not rhs):
            return None
        return lhs + rhs
    if isinstance(e, ir.AffineMulExpr):
        dim, const = (e.lhs, e.rhs) if isinstance(e.rhs, ir.AffineConstantExpr) else (e.rhs, e.lhs)
        if isinstance(dim, ir.AffineDimExpr) and isinstance(const, ir.AffineConstantExpr) and const.value > 0:
            return [(dim.position, const.value)]
    return None


def _space(t: ir.MemRefType) -> int:
    ms = t.memory_space
    return 0 if ms is None else ir.IntegerAttr(ms).value


def _body_is_local(op: ir.Operation) -> bool:
    """Whether the body computes on its block arguments alone (no ``linalg.index``, no memory access)."""
    for inner in op.regions[0].blocks[0].operations:
        name = inner.operation.name
        if name == "linalg.index" or name.startswith(("memref.", "tensor.", "bufferization.")):
            return False
    return True


def analyse(op: ir.Operation) -> VectorOp | None:
    """The loop nest ``op`` (a ``linalg.generic`` on main-memory buffers) performs, or None when the pass
    cannot stage it."""
    if op.name != "linalg.generic" or any(
            attributes.has(op, a) for a in (attributes.MATRIX_UNIT, attributes.COMPUTE)):
        return None
    kinds = iterator_kinds(op)
    if "?" in kinds or not _body_is_local(op):
        return None
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    n_out = len(op.opview.outputs)
    n_ops = len(op.operands)
    extents: list[int | None] = [None] * len(kinds)
    accesses: list[Access] = []
    for i, (v, amap) in enumerate(zip(op.operands, maps)):
        if not isinstance(v.type, ir.MemRefType):
            if i >= n_ops - n_out:
                return None
            continue  # a scalar operand (a fill's value): passed through as it is
        t = ir.MemRefType(v.type)
        if not t.has_static_shape or _space(t) != 0:
            return None
        strides, _ = t.get_strides_and_offset()
        if any(s == ir.ShapedType.get_dynamic_stride_or_offset() for s in strides):
            return None
        dims: list[tuple[Term, ...]] = []
        for j, e in enumerate(amap.results):
            terms = _terms(e)
            if terms is None:
                return None
            if len(terms) == 1 and terms[0][1] == 1:
                extents[terms[0][0]] = t.shape[j]
            dims.append(tuple(terms))
        accesses.append(Access(tuple(dims), str(t.element_type), output=i >= n_ops - n_out))
    if any(e is None for e in extents) or not any(a.output for a in accesses):
        return None
    return VectorOp(tuple(extents), tuple(kinds), tuple(accesses))  # type: ignore[arg-type]


def _is_fill(op: ir.Operation) -> bool:
    """A generic that writes one scalar input to its output (a generalised ``linalg.fill``)."""
    if op.name != "linalg.generic" or len(op.opview.outputs) != 1 or len(op.operands) != 2:
        return False
    if isinstance(op.operands[0].type, ir.ShapedType):
        return False
    body = list(op.regions[0].blocks[0].operations)
    return len(body) == 1 and body[0].operation.operands[0] == op.regions[0].blocks[0].arguments[0]


def _reads_output(op: ir.Operation) -> bool:
    block = op.regions[0].blocks[0]
    n_out = len(op.opview.outputs)
    return any(len(list(a.uses)) > 0 for a in list(block.arguments)[-n_out:])


def _folded_fills(ops: Sequence[ir.Operation]) -> dict[int, int]:
    """Fills to fold: the index in ``ops`` of each reduction whose accumulator a fill initialises, to the
    fill's index. The fill writes the reduction's only output, which the reduction writes whole, and
    nothing but views lies between them."""
    out: dict[int, int] = {}
    for idx, op in enumerate(ops):
        vop = analyse(op)
        if vop is None or not vop.reductions or len(op.opview.outputs) != 1:
            continue
        acc = op.opview.outputs[0]
        amap = ir.AffineMapAttr(ir.ArrayAttr(op.attributes["indexing_maps"])[len(op.operands) - 1]).value
        t = ir.MemRefType(acc.type)
        whole = all(isinstance(e, ir.AffineDimExpr) and vop.extents[e.position] == t.shape[j]
                    for j, e in enumerate(amap.results))
        if not whole or any(v == acc for v in op.opview.inputs):
            continue
        block = list(op.block.operations)
        pos = next(i for i, o in enumerate(block) if o.operation == op)
        pos -= 1
        while pos >= 0 and block[pos].operation.name in _VIEW_OPS:
            pos -= 1
        if pos < 0:
            continue
        prev = block[pos].operation
        if _is_fill(prev) and prev.operands[1] == acc:
            fill_idx = next((i for i, o in enumerate(ops) if o == prev), None)
            if fill_idx is not None:
                out[idx] = fill_idx
    return out


# ------------------------------------------------------------------------------------------- rewrite


class _Constants:
    """Index and float constants, made once per function at its entry (where they dominate every use)."""

    def __init__(self, op: ir.Operation) -> None:
        parent = op.parent
        while parent.name != "func.func":
            parent = parent.parent
        self.block = parent.regions[0].blocks[0]
        self.made: dict[tuple[str, float], ir.Value] = {}

    def _make(self, t: ir.Type, attr: ir.Attribute, key: tuple[str, float]) -> ir.Value:
        from mlir.dialects import arith

        if key not in self.made:
            first = self.block.operations[0]
            with ir.InsertionPoint(first), ir.Location.unknown():
                self.made[key] = arith.ConstantOp(t, attr).result
        return self.made[key]

    def index(self, v: int) -> ir.Value:
        return self._make(ir.IndexType.get(), ir.IntegerAttr.get(ir.IndexType.get(), v), ("index", v))

    def zero(self, t: ir.Type) -> ir.Value:
        attr = ir.IntegerAttr.get(t, 0) if isinstance(t, ir.IntegerType) else ir.FloatAttr.get(t, 0.0)
        return self._make(t, attr, (str(t), 0.0))


#: A static size or offset, or an index value.
Mixed: TypeAlias = "int | ir.Value"


def _affine(const: int, terms: Sequence[tuple[int, Mixed]]) -> Mixed:
    """``const + sum(c * x)``: an int when every x is one, else an ``affine.apply``."""
    static = const
    values: list[tuple[int, ir.Value]] = []
    for c, x in terms:
        if isinstance(x, int):
            static += c * x
        else:
            values.append((c, x))
    if not values:
        return static
    if static == 0 and len(values) == 1 and values[0][0] == 1:
        return values[0][1]
    expr: ir.AffineExpr = ir.AffineConstantExpr.get(static)
    for i, (c, _) in enumerate(values):
        expr = expr + ir.AffineDimExpr.get(i) * c
    amap = ir.AffineMap.get(len(values), 0, [expr])
    return affine.apply(amap, [x for _, x in values])


def _subview(src: ir.Value, offsets: Sequence[Mixed], sizes: Sequence[Mixed]) -> ir.Value:
    """A unit-stride ``memref.subview`` of ``src`` (any strided layout) at ``offsets`` of ``sizes``."""
    t = ir.MemRefType(src.type)
    if all(isinstance(o, int) and o == 0 for o in offsets) and list(sizes) == list(t.shape):
        return src
    strides, offset = t.get_strides_and_offset()
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    if offset != dyn and all(isinstance(o, int) for o in offsets):
        new_offset = offset + sum(o * s for o, s in zip(offsets, strides))  # type: ignore[operator]
    else:
        new_offset = dyn
    shape = [s if isinstance(s, int) else ir.ShapedType.get_dynamic_size() for s in sizes]
    layout = ir.StridedLayoutAttr.get(new_offset, strides)
    rtype = ir.MemRefType.get(shape, t.element_type, layout, t.memory_space)
    return memref.subview(src, list(offsets), list(sizes), [1] * len(sizes), result_type=rtype)


def _rank1(src: ir.Value) -> ir.Value:
    """A rank-0 memref viewed as ``memref<1x...>`` (``memref.expand_shape`` with no groups)."""
    t = ir.MemRefType(src.type)
    _, offset = t.get_strides_and_offset()
    layout = None if offset == 0 else ir.StridedLayoutAttr.get(offset, [1])
    rtype = ir.MemRefType.get([1], t.element_type, layout, t.memory_space)
    return memref.expand_shape(rtype, src, [], [], [1])


def _made(result: Any) -> ir.Operation:
    """The op a builder made, from what it returned (a value, a result list or the op)."""
    owner = getattr(result, "owner", result)
    return owner.operation if hasattr(owner, "operation") else owner


def _dma(src: ir.Value, dst: ir.Value, direction: str) -> None:
    op = _made(linalg.copy(src, outs=[dst]))
    del op.attributes["cast"]  # the builder's default, implied
    attributes.set_string(op, attributes.DMA, direction)


class _Stager:
    """Rewrites one op into its staged loop nest (see the module docstring)."""

    def __init__(self, op: ir.Operation, plan: VectorPlan, level_names: Sequence[str], fill: ir.Operation | None,
                 unit: UnitMapping | None = None, compute_level: str = ""):
        self.op, self.plan, self.fill, self.unit = op, plan, fill, unit
        self.constants = _Constants(op)
        # Unit-sized pieces compute whole (zero-padded) tiles: where a tile of the unit's loops is
        # partial, the buffers are cleared before the data arrives, so the padding is zero.
        ext = plan.op.extents
        self.padded = unit is not None and any(ext[d] % plan.tile[d] for d in (unit.m, unit.n, unit.k))
        self.main = level_names[0]
        self.level = plan.level
        self.n_out = len(op.opview.outputs)
        self.memref_idx = [i for i, v in enumerate(op.operands) if isinstance(v.type, ir.MemRefType)]
        self.compute_level = compute_level  # the name the forall's mapping attribute gives
        self.runs: dict[int, tuple[ir.Value, int]] = {}  # split loop -> (its part index, tiles per part)
        # Inputs that no tile loop and no reduction chunk moves over (a bias row under a loop over rows):
        # loaded once, before the loops, not once per tile.
        tiled = {d for d in range(len(ext)) if ext[d] > plan.tile[d]}
        n_in = len(self.memref_idx) - self.n_out
        self.invariant = {k for k in range(n_in) if not self.padded and not (plan.op.operands[k].loops() & tiled)}
        self.loaded: dict[int, ir.Value] = {}  # invariant input -> its buffer view, once loaded

    def buffers(self) -> list[Buffer]:
        out = []
        n_in = len(self.memref_idx) - self.n_out
        for k, (i, shape) in enumerate(zip(self.memref_idx, self.plan.buffers)):
            role = f"x{k}" if k < n_in else f"y{k - n_in}"
            dtype = str(ir.MemRefType(self.op.operands[i].type).element_type)
            out.append(Buffer(f"{role}_{self.level}", self.level, self.plan.space, shape, dtype, self.plan.alignment))
        return out

    def run(self, buffers: Sequence[Buffer]) -> None:
        op, plan = self.op, self.plan
        ext, tile = plan.op.extents, plan.tile
        space = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), plan.space)
        with ir.InsertionPoint(op), op.location, ExitStack() as stack:
            if plan.parallel:
                # The split loops' parts on the compute level's units; each allocates its own buffers.
                split = sorted(plan.split.items())
                forall = scf.ForallOp([0] * len(split), [parts for _, parts in split], [1] * len(split))
                attributes.set_string(forall, attributes.COMPUTE_LEVEL, self.compute_level)
                for (d, parts), iv in zip(split, forall.induction_variables):
                    tiles = -(-ext[d] // tile[d])
                    self.runs[d] = (iv, -(-tiles // parts))
                with ir.InsertionPoint(forall.body):
                    scf.InParallelOp()
                stack.enter_context(ir.InsertionPoint.at_block_terminator(forall.body))
            bufs = []
            for b, i in zip(buffers, self.memref_idx):
                elt = ir.MemRefType(op.operands[i].type).element_type
                with ir.Location.name(b.name):
                    # A rank-0 operand's buffer holds its one element as memref<1x..> (copies want a dim).
                    bufs.append(memref.alloc(ir.MemRefType.get(list(b.shape) or [1], elt, None, space), [], [],
                                             alignment=ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                                          b.alignment)))
            offsets: list[Mixed] = [0] * len(ext)
            sizes: list[Mixed] = [min(t, e) for t, e in zip(tile, ext)]
            for k in sorted(self.invariant):
                src, dst = self._views(k, bufs[k], offsets, sizes)
                _dma(src, dst, f"{self.main}->{self.level}")
                self.loaded[k] = dst
            self._loops([d for d in range(len(ext)) if plan.op.iterators[d] == "parallel"], offsets, sizes,
                        lambda: self._tile(bufs, offsets, sizes))
            for b in bufs:
                memref.dealloc(b)
        op.erase()
        if self.fill is not None:
            self.fill.erase()

    def _loops(self, dims: Sequence[int], offsets: list[Mixed], sizes: list[Mixed], inner: Any) -> None:
        """Open an ``scf.for`` per loop of ``dims`` whose extent exceeds its tile, then call ``inner``."""
        tiled = [d for d in dims if self.plan.op.extents[d] > self.plan.tile[d]]
        if not tiled:
            inner()
            return
        d, rest = tiled[0], tiled[1:]
        e, t = self.plan.op.extents[d], self.plan.tile[d]
        c = self.constants
        lo, hi = c.index(0), c.index(e)
        p0 = ir.AffineDimExpr.get(0)

        def body(iv: ir.Value) -> None:
            offsets[d] = iv
            if e % t:
                amap = ir.AffineMap.get(1, 0, [ir.AffineConstantExpr.get(t), ir.AffineConstantExpr.get(e) - p0])
                sizes[d] = affine.AffineMinOp(amap, [iv]).result
            self._loops(rest, offsets, sizes, inner)

        if d in self.runs:  # a split loop: only the tiles of this part's run
            part, run = self.runs[d]
            lo = affine.apply(ir.AffineMap.get(1, 0, [p0 * (run * t)]), [part])
            if run == 1:
                body(lo)
                return
            hi = affine.AffineMinOp(ir.AffineMap.get(1, 0, [p0 * (run * t) + run * t, ir.AffineConstantExpr.get(e)]),
                                    [part]).result
        loop = scf.ForOp(lo, hi, c.index(t))
        with ir.InsertionPoint(loop.body):
            body(loop.induction_variable)
            scf.YieldOp([])

    def _views(self, k: int, buf: ir.Value, offsets: Sequence[Mixed], sizes: Sequence[Mixed]
               ) -> tuple[ir.Value, ir.Value]:
        """The main-memory tile of memref operand ``k`` and the matching view of its buffer."""
        access = self.plan.op.operands[k]
        offs = [_affine(0, [(c, offsets[d]) for d, c in terms]) for terms in access.dims]
        szs = [_affine(1 - sum(c for _, c in terms), [(c, sizes[d]) for d, c in terms]) for terms in access.dims]
        operand = self.op.operands[self.memref_idx[k]]
        if not access.dims:
            return _rank1(operand), buf
        return _subview(operand, offs, szs), _subview(buf, [0] * len(szs), szs)

    def _operand_view(self, k: int, view: ir.Value) -> ir.Value:
        """What the compute op reads for memref operand ``k``: the buffer view (rank 0 again for a
        rank-0 operand)."""
        if self.plan.op.operands[k].dims:
            return view
        t = ir.MemRefType(view.type)
        return memref.collapse_shape(ir.MemRefType.get([], t.element_type, None, t.memory_space), view, [])

    def _tile(self, bufs: Sequence[ir.Value], offsets: list[Mixed], sizes: list[Mixed]) -> None:
        """One tile of the parallel loops: accumulator in, reduction chunks, outputs out."""
        plan, op = self.plan, self.op
        n_in = len(self.memref_idx) - self.n_out
        reds = set(plan.op.reductions)
        views: list[ir.Value | None] = [None] * len(bufs)
        outs = []
        for k in range(n_in, len(bufs)):
            src, dst = self._views(k, bufs[k], offsets, sizes)
            views[k] = dst
            outs.append((dst, src))
            if self.fill is not None:
                self._fill(self.fill.operands[0], bufs[k] if self.padded else dst)
            elif reds or _reads_output(op):
                if self.padded:
                    self._fill(None, bufs[k])
                _dma(src, dst, f"{self.main}->{self.level}")
        for k, view in self.loaded.items():
            views[k] = view
        # Inputs that no reduction loop indexes are loaded once per tile, outside the chunk loop.
        for k in range(n_in):
            if k not in self.loaded and not (plan.op.operands[k].loops() & reds):
                src, dst = self._views(k, bufs[k], offsets, sizes)
                if self.padded:
                    self._fill(None, bufs[k])
                _dma(src, dst, f"{self.main}->{self.level}")
                views[k] = dst

        def chunk() -> None:
            for k in range(n_in):
                if k not in self.loaded and plan.op.operands[k].loops() & reds:
                    src, dst = self._views(k, bufs[k], offsets, sizes)
                    if self.padded:
                        self._fill(None, bufs[k])
                    _dma(src, dst, f"{self.main}->{self.level}")
                    views[k] = dst
            if self.unit is not None:
                self._unit_ops(bufs, sizes)
            else:
                self._compute([v for v in views if v is not None])

        self._loops(sorted(reds), offsets, sizes, chunk)
        for dst, src in outs:
            _dma(dst, src, f"{self.level}->{self.main}")

    def _fill(self, value: ir.Value | None, dst: ir.Value) -> None:
        """Fill ``dst`` in the scratchpad with ``value`` (None: zero), a vector op."""
        if value is None:
            value = self.constants.zero(ir.MemRefType(dst.type).element_type)
        attributes.set_string(_made(linalg.fill(value, outs=[dst])), attributes.COMPUTE, "vector")

    def _unit_ops(self, bufs: Sequence[ir.Value], sizes: Sequence[Mixed]) -> None:
        """The tile as unit-sized pieces: loops over every loop but the unit's (their tile sizes) and
        over the unit's m, n, k in unit steps across the padded tile; one ``linalg.generic`` of exactly
        m x n x k per step on 2-D views of the buffers, marked with the unit (like promote's)."""
        u = self.unit
        assert u is not None
        plan = self.plan
        roles = {u.m: (0, u.unit.m), u.n: (1, u.unit.n), u.k: (2, u.unit.k)}
        local: dict[int, Mixed] = {}
        # Parallel loops outside, then the reductions (taps, channel blocks) innermost.
        order = [d for d in range(len(plan.tile)) if plan.op.iterators[d] == "parallel"]
        order += [d for d in range(len(plan.tile)) if plan.op.iterators[d] == "reduction"]

        def nest(i: int) -> None:
            if i == len(order):
                self._unit_op(bufs, local, roles)
                return
            d = order[i]
            bound: Mixed = plan.tile[d] if d in roles else sizes[d]
            step = roles[d][1] if d in roles else 1
            if isinstance(bound, int) and bound <= step:
                local[d] = 0
                nest(i + 1)
                return
            c = self.constants
            loop = scf.ForOp(c.index(0), bound if isinstance(bound, ir.Value) else c.index(bound), c.index(step))
            with ir.InsertionPoint(loop.body):
                local[d] = loop.induction_variable
                nest(i + 1)
                scf.YieldOp([])

        nest(0)

    def _unit_op(self, bufs: Sequence[ir.Value], local: dict[int, Mixed], roles: dict[int, tuple[int, int]]) -> None:
        """One unit instruction at the loop positions ``local`` (block starts for the unit's loops)."""
        u = self.unit
        assert u is not None
        views: list[ir.Value] = []
        maps: list[ir.AffineMap] = []
        for k, buf in enumerate(bufs):
            access = self.plan.op.operands[k]
            bt = ir.MemRefType(buf.type)
            strides, _ = bt.get_strides_and_offset()
            offsets = [_affine(0, [(c, local[d]) for d, c in terms]) for terms in access.dims]
            sizes, steps, kept, result = [], [], [], []
            for j, terms in enumerate(access.dims):
                role = next(((d, c) for d, c in terms if d in roles), None)
                if role is None:
                    sizes.append(1)
                    steps.append(1)
                    continue
                d, c = role
                sizes.append(roles[d][1])
                steps.append(c)
                kept.append((roles[d][1], strides[j] * c))
                result.append(ir.AffineDimExpr.get(roles[d][0]))
            offset = (sum(o * st for o, st in zip(offsets, strides)) if all(isinstance(o, int) for o in offsets)
                      else ir.ShapedType.get_dynamic_stride_or_offset())
            rtype = ir.MemRefType.get([s for s, _ in kept], bt.element_type,
                                      ir.StridedLayoutAttr.get(offset, [st for _, st in kept]), bt.memory_space)
            views.append(memref.subview(buf, offsets, sizes, steps, result_type=rtype))
            maps.append(ir.AffineMap.get(3, 0, result))
        new = self.op.clone(ip=ir.InsertionPoint.current)
        for i, view in zip(self.memref_idx, views):
            new.operands[i] = view
        its = list(ir.ArrayAttr(self.op.attributes["iterator_types"]))
        par = next(a for a in its if "parallel" in str(a))
        red = next(a for a in its if "reduction" in str(a))
        new.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])
        new.attributes["iterator_types"] = ir.ArrayAttr.get([par, par, red])
        tile = u.unit
        attributes.set_string(new, attributes.MATRIX_UNIT, tile.name)
        attributes.set_string(new, attributes.UNIT_OPERAND, tile.operand_dtype)
        attributes.set_string(new, attributes.UNIT_ACCUMULATOR, tile.accumulator_dtype)

    def _compute(self, views: Sequence[ir.Value]) -> None:
        """The op itself on the scratchpad views, marked as vector work."""
        operands = [self._operand_view(k, view) for k, view in enumerate(views)]
        new = self.op.clone(ip=ir.InsertionPoint.current)
        for i, view in zip(self.memref_idx, operands):
            new.operands[i] = view
        attributes.set_string(new, attributes.COMPUTE, "vector")


def _unit(op: ir.Operation, vop: VectorOp, spec: ChipSpec, options: Any) -> UnitMapping | None:
    """The matrix-unit mapping of a convolution whose body multiplies and accumulates, or None."""
    if _kind(vop) != "window":
        return None
    if not is_mac(op.regions[0].blocks[0]):
        return None
    mapping, _ = unit_mapping(spec, vop, options)
    return mapping


def _kind(vop: VectorOp) -> str:
    if not any(not a.output for a in vop.operands):
        return "fill"
    if any(len(t) > 1 or (t and t[0][1] != 1) for a in vop.operands for t in a.dims):
        return "window"
    return "reduction" if vop.reductions else "elementwise"


@dataclasses.dataclass(frozen=True)
class PromoteVectorOps:
    """Pass ``promote-vector``: stage every remaining ``linalg.generic`` on main memory through the
    innermost software-managed level (see the module docstring). Run after ``promote``; fused attention
    kernels (functions marked `attributes.ATTENTION`) and promote's functions are left alone."""

    name = "promote-vector"
    #: The matrix units (by name) the target lowers; None: every unit of the spec.
    units: tuple[str, ...] | None = None

    def apply(self, module: ir.Module, ctx: Any) -> None:
        spec = with_units(ctx.spec, self.units)
        options = getattr(ctx, "options", None)
        records: list[VectorStaging | KernelBuffers] = ctx.notes.setdefault("promote_vector", [])
        level_names = [m.name for m in spec.memory]
        with module.context:
            self._run(module, spec, options, records, level_names)

    @staticmethod
    def _run(module: ir.Module, spec: ChipSpec, options: Any, records: list[VectorStaging | KernelBuffers],
             level_names: Sequence[str]) -> None:
        for f in ops_named(module, "func.func"):
            fname = ir.StringAttr(f.attributes["sym_name"]).value
            if attributes.ATTENTION in f.attributes:
                records.append(KernelBuffers(fname, "attention", kernel_buffers(f, level_names)))
                continue
            ops = ops_named(f, "linalg.generic")  # type: ignore[arg-type]
            fills = _folded_fills(ops)
            folded = set(fills.values())
            for idx, op in enumerate(ops):
                if idx in folded:
                    continue  # staged with the reduction after it
                vop = analyse(op)
                if vop is None:
                    continue
                fill = ops[fills[idx]] if idx in fills else None
                unit = _unit(op, vop, spec, options)
                plan = plan_vector(spec, vop, options, unit.multiples() if unit else None)
                stager = _Stager(op, plan, level_names, fill, unit, spec.compute[0].name)
                buffers = stager.buffers()
                check_capacity(plan.level, buffers, plan.capacity_bytes)
                stager.run(buffers)
                records.append(VectorStaging(fname, _kind(vop), plan, tuple(buffers), fill is not None,
                                             unit.unit.name if unit else None))
        try:
            module.operation.verify()
        except ir.MLIRError as exc:  # a bug here, not the user's
            raise CompileError(f"promote-vector produced invalid IR: {exc}", op="linalg.generic") from exc
