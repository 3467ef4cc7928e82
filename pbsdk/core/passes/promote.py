"""Pass ``promote``: tile each contraction by its plan's memory-level tiles and stage the tiles in scratchpads.

For every contraction (a ``linalg.matmul``/``linalg.batch_matmul``, or a ``linalg.generic`` of the same
form: parallel batch/m/n loops, one reduction loop, a multiply-accumulate body, operands read through
projected permutations, possibly broadcast) the pass asks the core planner (`plan_contraction`) for the
tiles of each memory level, then replaces the op by a call to a private function that

1. allocates, once, one buffer per operand and level (``A_spm``, ``B_spm``, ``C_spm``) with
   ``memref.alloc`` in the memory space of that level — memory space ``i`` is ``spec.memory[i]``, so
   main memory is the default space 0 — aligned as the level asks;
2. runs the m and n tile loops of the outermost level that is per unit of ``spec.compute[0]`` (a
   core's ``spm``) as one ``scf.forall`` marked ``pbsdk.compute_level = "<level>"`` over the plan's
   parts (`pbsdk.core.plan.contraction.split_parallel`): part ``p`` of a loop of ``T`` tiles walks
   the run of ``ceil(T / parts)`` tiles starting at tile ``p * ceil(T / parts)``. The buffers of that
   level and of the levels inside it are allocated in the forall's body (one set per core); those of
   the levels outside it (a device-wide ``sram``) once, outside;
3. loops over the level's tiles in the plan's loop order and moves every tile with an explicit
   ``linalg.copy`` (marked ``pbsdk.dma``) from the level outside into the level's buffer, the
   accumulator tile back out after its k-step; a partial tile at the problem's edge is zero-padded, so
   every inner level and the compute step see full, static tiles;
4. computes each innermost tile as ``linalg.generic`` ops: with a matrix-unit plan, one per unit
   instruction, of exactly the unit's m x n x k and marked ``pbsdk.matrix_unit = "<name>"`` (a target
   replaces these with its instruction); otherwise one op over the whole innermost tile, marked
   ``pbsdk.compute = "<kind>"``.

Before rewriting, it checks that the buffers live together in each level fit the level's capacity
(``size_bytes``, or the opt-in ``max_size_bytes``; per instance: one core's buffers against one
core's ``spm``): an overflow is a `CompileError` naming the buffer
that overflows and the level. Hardware-managed cache levels are not promoted (the plan's cache tiles are
a loop-tiling matter). What was decided is recorded in ``ctx.notes["promote"]`` (one `Promotion` per
contraction), so a target can report scratchpad use without reading the IR.

The analysis is `analyse`/`promotion_for` (pure given the op's shapes); the rewrite builds the function
those decisions describe with the bindings' builders (`mlir.dialects` ``func``, ``scf``, ``memref``,
``linalg``, ``arith``, ``affine``; the staging helpers of `pbsdk.core.passes.promote_vector`), sets the
pbsdk attributes through `pbsdk.core.ir.attributes`, and calls it in the op's place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from typing import Any

from mlir import ir
from mlir.dialects import affine, arith, func, linalg, memref, scf

from pbsdk.core.errors import CompileError, UnsupportedError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.ir.builder import Indices, scalar_constant
from pbsdk.core.options import Options
from pbsdk.core.passes import ops_named
from pbsdk.core.plan import Contraction, ContractionPlan, plan_contraction
from pbsdk.core.plan.contraction import parallel_split, scratchpad_capacity
from pbsdk.core.spec import ChipSpec, MemoryLevel, dtype_bits

_MAC_OPS = {"arith.extf", "arith.mulf", "arith.addf", "linalg.yield",
            "arith.extsi", "arith.muli", "arith.addi"}  # integer: i8 operands sign-extended to i32
_MUL, _ADD, _EXT = ("arith.mulf", "arith.muli"), ("arith.addf", "arith.addi"), ("arith.extf", "arith.extsi")


@dataclasses.dataclass(frozen=True)
class ContractionOp:
    """A contraction read off a linalg op: loop extents, what each loop is, operand maps and dtypes.

    ``maps[i][j]`` is the loop index operand ``i`` reads in its dimension ``j``, or -1 for a broadcast
    (constant 0) index."""

    extents: tuple[int, ...]
    roles: tuple[str, ...]  # per loop: "batch", "m", "n" or "k"
    maps: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    dtypes: tuple[str, str, str]

    def extent(self, role: str) -> int:
        return self.extents[self.roles.index(role)]

    @property
    def batch(self) -> int:
        out = 1
        for e, r in zip(self.extents, self.roles):
            if r == "batch":
                out *= e
        return out

    def contraction(self) -> Contraction:
        return Contraction(self.extent("m"), self.extent("n"), self.extent("k"), self.batch, self.dtypes[0],
                           self.dtypes[2])


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One scratchpad buffer: ``name`` (e.g. ``A_spm``), its level and memory space, shape and bytes."""

    name: str
    level: str
    space: int
    shape: tuple[int, ...]
    dtype: str
    alignment: int

    @property
    def bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * dtype_bits(self.dtype) // 8


def parts_of(parallel: Sequence[tuple[str, int]]) -> int:
    """How many units of ``spec.compute[0]`` a plan's ``parallel`` split runs on (1: no forall)."""
    n = 1
    for _, parts in parallel:
        n *= parts
    return n


def bytes_per_level(buffers: Sequence[Buffer]) -> dict[str, int]:
    """The bytes ``buffers`` take in each memory level (by name)."""
    out: dict[str, int] = {}
    for b in buffers:
        out[b.level] = out.get(b.level, 0) + b.bytes
    return out


@dataclasses.dataclass(frozen=True)
class Promotion:
    """What the pass decided for one contraction: the plan, each promoted level's tile per loop, and the
    buffers (outermost level first)."""

    function: str
    op: ContractionOp
    plan: ContractionPlan
    levels: tuple[tuple[str, tuple[int, ...]], ...]  # (level, tile per loop), outermost promoted first
    buffers: tuple[Buffer, ...]
    notes: tuple[str, ...] = ()
    #: The m/n tile loops (``"m@spm"``) run as an ``scf.forall`` over ``spec.compute[0]``, with their
    #: parts (the plan's `ContractionPlan.parallel` for these level tiles); empty: none.
    parallel: tuple[tuple[str, int], ...] = ()

    @property
    def parts(self) -> int:
        """Units of ``spec.compute[0]`` the contraction runs on (1 without a forall)."""
        return parts_of(self.parallel)

    def bytes_per_level(self) -> dict[str, int]:
        return bytes_per_level(self.buffers)

    @property
    def uses_matrix_unit(self) -> bool:
        return self.plan.compute.kind == "matrix-unit"


def analyse(op: ir.Operation) -> ContractionOp | None:
    """The contraction ``op`` performs, or None when it is not one this pass can tile."""
    if op.name != "linalg.generic" or len(op.operands) != 3:
        return None
    iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if sum("reduction" in i for i in iterators) != 1:
        return None
    if not is_mac(op.regions[0].blocks[0]):
        return None
    maps: list[tuple[int, ...]] = []
    for attr in ir.ArrayAttr(op.attributes["indexing_maps"]):
        amap = ir.AffineMapAttr(attr).value
        idx: list[int] = []
        for e in amap.results:
            if isinstance(e, ir.AffineDimExpr):
                idx.append(e.position)
            elif isinstance(e, ir.AffineConstantExpr) and e.value == 0:
                idx.append(-1)
            else:
                return None
        maps.append(tuple(idx))
    a_map, b_map, c_map = maps
    n_loops = len(iterators)
    red = next(i for i, it in enumerate(iterators) if "reduction" in it)
    types = [ir.MemRefType(v.type) for v in op.operands]
    if not all(t.has_static_shape for t in types) or sorted(c_map) != [d for d in range(n_loops) if d != red]:
        return None
    extents = [0] * n_loops
    for t, mp in zip(types, maps):
        for j, d in enumerate(mp):
            if d >= 0:
                extents[d] = t.shape[j]
            elif t.shape[j] != 1:
                return None
    roles: list[str] = []
    for d in range(n_loops):
        in_a, in_b = d in a_map, d in b_map
        if d == red:
            roles.append("k" if in_a and in_b else "?")
        elif in_a and not in_b:
            roles.append("m")
        elif in_b and not in_a:
            roles.append("n")
        else:
            roles.append("batch")
    if roles.count("m") != 1 or roles.count("n") != 1 or "?" in roles:
        return None
    if any(_strides(t) is None for t in types):
        return None
    return ContractionOp(tuple(extents), tuple(roles), (a_map, b_map, c_map),
                         tuple(str(t.element_type) for t in types))  # type: ignore[arg-type]


def is_mac(body: ir.Block) -> bool:
    """Whether a linalg body is one multiply-accumulate: only extensions, one ``arith.mulf`` and one
    ``arith.addf`` (or, for integers, ``arith.muli``/``arith.addi`` after ``arith.extsi``), yielding
    ``out + x * y`` where x, y are the input arguments (possibly extended)."""
    names = [o.operation.name for o in body.operations]
    if (not set(names) <= _MAC_OPS or sum(names.count(m) for m in _MUL) != 1
            or sum(names.count(a) for a in _ADD) != 1):
        return False
    args = list(body.arguments)
    ops = {o.operation.name: o.operation for o in body.operations}
    add = next(ops[a] for a in _ADD if a in ops)
    mul = next(ops[m] for m in _MUL if m in ops)
    if _origin(ops["linalg.yield"].operands[0], args) != "add":
        return False
    return (sorted(_origin(v, args) for v in add.operands) == ["mul", "out"]
            and sorted(_origin(v, args) for v in mul.operands) == ["in0", "in1"])


def _origin(v: ir.Value, args: list[ir.Value]) -> str:
    """'in0', 'in1', 'out' for a block argument (seen through arith.extf), 'mul'/'add' for those ops."""
    owner = v.owner
    if not isinstance(owner, ir.Block):
        op = owner.operation
        if op.name in _EXT:
            return _origin(op.operands[0], args)
        return {"arith.mulf": "mul", "arith.addf": "add", "arith.muli": "mul", "arith.addi": "add"}.get(op.name, "?")
    for i, a in enumerate(args):
        if a == v:
            return ("in0", "in1", "out")[i]
    return "?"


def _strides(t: ir.MemRefType) -> tuple[list[int], int | None] | None:
    """(strides, offset or None when dynamic) of a memref type; None when a stride is dynamic."""
    strides, offset = t.get_strides_and_offset()
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    if any(s == dyn for s in strides):
        return None
    return list(strides), (None if offset == dyn else offset)


def capacity(level: MemoryLevel, options: Options | Mapping[str, Any] | None) -> int:
    """Bytes a level may hold (`pbsdk.core.plan.contraction.scratchpad_capacity`)."""
    return scratchpad_capacity(level, options)


def check_capacity(level: str, live: Sequence[Buffer], cap: int, op: str = "linalg.generic") -> None:
    """Raise `CompileError` naming the first of ``live`` (buffers of ``level`` live together) that does
    not fit the level's capacity ``cap``."""
    total = 0
    for b in live:
        total += b.bytes
        if total > cap:
            listing = ", ".join(f"{x.name} {'x'.join(map(str, x.shape))} {x.dtype} ({x.bytes} B)" for x in live)
            raise CompileError(
                f"scratchpad overflow: buffer {b.name} does not fit in level '{level}': the level's live "
                f"buffers need {sum(x.bytes for x in live)} B ({listing}), its capacity is {cap} B", op=op)


def with_units(spec: ChipSpec, units: Sequence[str] | None) -> ChipSpec:
    """``spec`` with only the matrix units named ``units`` (a target's: those it lowers); ``spec`` itself for
    None."""
    if units is None:
        return spec
    return spec.model_copy(update={"matrix_units": [u for u in spec.matrix_units if u.name in units]})


def promotion_for(spec: ChipSpec, cop: ContractionOp, *, function: str, options: Options | Mapping[str, Any] | None,
                  tiles: Mapping[str, tuple[int, int, int]] | None = None,
                  accumulator_in_registers: bool = True) -> Promotion:
    """Plan ``cop`` and derive its level tiles and buffers; raise `CompileError` when a level overflows.

    ``tiles`` overrides the plan's (m, n, k) tile of the named levels. A level's tile is rounded up to a
    multiple of the tile inside it (the compute tile for the innermost), so that tiles nest; each
    adjustment is recorded in `Promotion.notes`. ``accumulator_in_registers`` goes to the planner
    (`plan_contraction`). When the outermost level's tile is partial in m or n (the problem is not a
    multiple of it) and the plan keeps C out of that level, the level holds C anyway: the inner levels
    and the unit-sized compute steps work on full tiles, which only its zero-padded buffer keeps inside
    C's bounds at the edge."""
    # the scratchpad lowering computes the op's dtype itself (its vector tile ops, its units): no widening
    plan = plan_contraction(spec, cop.contraction(), options, accumulator_in_registers=accumulator_in_registers,
                            widen=False)
    unit = plan.compute
    inner: tuple[int, int, int] = (unit.m, unit.n, unit.k)
    chosen: list[tuple[str, tuple[int, int, int], bool]] = []
    notes: list[str] = []
    for t in plan.levels:  # innermost first
        if t.managed != "software":
            continue
        wanted = tuple(int(v) for v in (tiles or {}).get(t.level, (t.m, t.n, t.k)))
        if len(wanted) != 3 or min(wanted) < 1:
            raise CompileError(f"tile {wanted} for level '{t.level}' must be three positive sizes (m, n, k)",
                               op="linalg.generic")
        # Each level's tile holds whole tiles of the level inside it: round up to a multiple.
        mnk = tuple(-(-v // i) * i for v, i in zip(wanted, inner))
        if mnk != wanted:
            notes.append(f"{t.level}: tile {'x'.join(map(str, wanted))} rounded up to "
                         f"{'x'.join(map(str, mnk))} to hold whole {'x'.join(map(str, inner))} tiles")
        chosen.append((t.level, mnk, t.holds_accumulator))  # type: ignore[arg-type]
        inner = mnk  # type: ignore[assignment]
    if not chosen:
        raise UnsupportedError("no software-managed level to promote into", op="linalg.generic")
    name, outer, outer_holds = chosen[-1]
    if not outer_holds:
        edges = [r for i, r in enumerate("mn") if r in cop.roles and cop.extent(r) % outer[i]]
        if edges:
            chosen[-1] = (name, outer, True)
            notes.append(f"{name}: holds the C tile ({' and '.join(edges)} not a multiple of the tile: the "
                         "edge tiles are computed in a zero-padded buffer)")
    chosen.reverse()  # outermost first
    levels: list[tuple[str, tuple[int, ...]]] = []
    buffers: list[Buffer] = []
    for name, (tm, tn, tk), holds_acc in chosen:
        per_loop = tuple({"m": tm, "n": tn, "k": tk, "batch": 1}[r] for r in cop.roles)
        levels.append((name, per_loop))
        level = spec.memory_level(name)
        space = [m.name for m in spec.memory].index(name)
        for role, mp, dtype in zip("ABC", cop.maps, cop.dtypes):
            if role == "C" and not holds_acc:
                continue
            shape = tuple(per_loop[d] if d >= 0 else 1 for d in mp)
            buffers.append(Buffer(f"{role}_{name}", name, space, shape, dtype, level.alignment_bytes))
        # Capacity: the buffers of one level are live together for the whole contraction.
        check_capacity(name, [b for b in buffers if b.level == name], capacity(level, options))
    # The parallel split for the tiles actually used (rounded or overridden tiles may change the plan's).
    split, why = parallel_split(spec, cop.contraction(), [(name, t[0], t[1]) for name, t, _ in reversed(chosen)])
    if split != plan.parallel:
        notes.append(f"parallel split for these tiles: {why}")
    return Promotion(function, cop, plan, tuple(levels), tuple(buffers), tuple(notes), split)


# ------------------------------------------------------------------------------------------- rewrite


class _Rewriter:
    """Builds the promoted function of one contraction with the bindings' builders: allocations, per-level
    loops with their copies, the compute ops, deallocations. Index constants are made once, at the
    function's entry (in increasing order); a padding zero is made next to the fill that uses it."""

    def __init__(self, p: Promotion, level_names: Sequence[str], compute_level: str = "",
                 init: ir.Attribute | None = None) -> None:
        self.p = p
        #: The constant C starts as (a folded fill): the outermost level holding C fills its tile with it at
        #: the first k step instead of reading C from main memory.
        self.init = init
        self.c_staged = False
        self.level_names = list(level_names)
        self.compute_level = compute_level
        # The split loops (role -> parts) and the promoted level whose loops they are.
        self.split = {loop.split("@")[0]: parts for loop, parts in p.parallel}
        names = [name for name, _ in p.levels]
        self.par_level = names.index(p.parallel[0][0].split("@")[1]) if p.parallel else len(names)
        self.orders: dict[str, list[str]] = {}
        for item in p.plan.loop_order:
            if "@" in item:
                role, level = item.split("@")
                self.orders.setdefault(level, []).append(role)
        self.buffers: dict[str, ir.Value] = {}
        self.indices: Indices | None = None  # the function's index constants, made once at its entry

    def function(self, arg_types: Sequence[ir.Type]) -> func.FuncOp:
        """The private ``func.func`` of the promotion, appended at the current insertion point."""
        p = self.p
        fn = func.FuncOp(p.function, ir.FunctionType.get(list(arg_types), []), visibility="private")
        entry = fn.add_entry_block()
        self.arg_types = list(arg_types)
        self.indices = Indices(entry)
        with ir.InsertionPoint(entry):
            # Buffers of the levels outside the parallel loop: once, for the whole contraction.
            outer = self.allocate([name for name, _ in p.levels[:self.par_level]])
            self.level(0, list(entry.arguments), list(p.op.extents))
            for buf in outer:
                memref.dealloc(buf)
            func.ReturnOp([])
        self.indices.hoist()  # index constants first, in increasing order
        return fn

    def allocate(self, levels: Sequence[str]) -> list[ir.Value]:
        """Allocate the buffers of ``levels`` at the insertion point (a buffer is named
        ``<operand>_<level>``, operand A, B or C, and holds that operand's elements)."""
        i64 = ir.IntegerType.get_signless(64)
        made = []
        for b in self.p.buffers:
            if b.level not in levels:
                continue
            elt = ir.MemRefType(self.arg_types["ABC".index(b.name[0])]).element_type
            space = ir.IntegerAttr.get(i64, b.space) if b.space else None
            with ir.Location.name(b.name):
                buf = memref.alloc(ir.MemRefType.get(list(b.shape), elt, None, space), [], [],
                                   alignment=ir.IntegerAttr.get(i64, b.alignment))
            self.buffers[b.name] = buf
            made.append(buf)
        return made

    def forall(self, extent: Sequence[int], tile: Sequence[int], stack: ExitStack) -> dict[int, tuple[ir.Value, int]]:
        """Open the ``scf.forall`` over the split loops' parts, marked with the compute level; allocate
        the buffers of this level and the levels inside it in its body (deallocated at its end) and enter
        the body on ``stack``. Returns, per split loop, (its part index, the tiles of one part's run)."""
        p = self.p
        split = [(d, parts) for loop, parts in p.parallel for d, role in enumerate(p.op.roles)
                 if role == loop.split("@")[0]]
        loop = scf.ForallOp([0] * len(split), [parts for _, parts in split], [1] * len(split))
        attrs.set_string(loop, attrs.COMPUTE_LEVEL, self.compute_level)
        runs: dict[int, tuple[ir.Value, int]] = {}
        with ir.InsertionPoint(loop.body):
            for (d, parts), iv in zip(split, loop.induction_variables):
                tiles = -(-extent[d] // tile[d])
                runs[d] = (iv, -(-tiles // parts))
            bufs = self.allocate([name for name, _ in p.levels[self.par_level:]])
            first = None
            for buf in bufs:
                op = memref.dealloc(buf)
                first = first or op
            term = scf.InParallelOp()
        stack.enter_context(ir.InsertionPoint(first if first is not None else term))
        return runs

    def index(self, v: int) -> ir.Value:
        """The index constant ``v``, made once at the start of the function."""
        assert self.indices is not None
        return self.indices.c(v)

    def copy(self, src: ir.Value, dst: ir.Value) -> None:
        """A tile move, marked `attributes.DMA` with its levels (read off the memory spaces)."""
        from pbsdk.core.passes.promote_vector import _dma, _space

        names = self.level_names
        _dma(src, dst, f"{names[_space(ir.MemRefType(src.type))]}->{names[_space(ir.MemRefType(dst.type))]}")

    def compute(self, views: Sequence[ir.Value], marks: Sequence[tuple[str, str]]) -> None:
        """One multiply-accumulate ``linalg.generic`` over ``views`` (A, B, C) with the op's maps, its
        string attributes set to ``marks`` ((name, value) pairs)."""
        p = self.p
        maps = [ir.AffineMap.get(len(p.op.roles), 0, [ir.AffineConstantExpr.get(0) if d < 0 else ir.AffineDimExpr.get(d)
                                                      for d in mp]) for mp in p.op.maps]
        its = [linalg.IteratorType.reduction if r == "k" else linalg.IteratorType.parallel for r in p.op.roles]
        a, b, c = views
        op = linalg.GenericOp_([a, b], [c], maps, its)
        block = op.regions[0].blocks[0]
        x, y, acc = block.arguments
        with ir.InsertionPoint(block):
            if isinstance(acc.type, ir.IntegerType):  # i8 x i8 -> i32: sign-extend, exact integer MAC
                xs = [v if v.type == acc.type else arith.extsi(acc.type, v) for v in (x, y)]
                linalg.YieldOp([arith.addi(acc, arith.muli(xs[0], xs[1]))])
            else:
                xs = [v if v.type == acc.type else arith.extf(acc.type, v) for v in (x, y)]
                linalg.YieldOp([arith.addf(acc, arith.mulf(xs[0], xs[1]))])
        for name, value in marks:
            attrs.set_string(op, name, value)

    def loops(self, order: Sequence[str], extent: Sequence[int], tile: Sequence[int], stack: ExitStack,
              offsets: dict[int, int | ir.Value] | None = None, runs: Mapping[int, tuple[ir.Value, int]] | None = None
              ) -> dict[int, int | ir.Value]:
        """Open one ``scf.for`` per loop (in the order of ``order``'s roles) whose extent exceeds its tile,
        entering each body on ``stack``; returns the offset of each loop (0 or an induction variable).
        A loop in ``runs`` (a forall's part index ``p``, tiles per part ``r``) walks only the part's tiles:
        from ``p * r * tile`` to ``min((p + 1) * r * tile, extent)`` (just ``p * tile`` when ``r`` is 1)."""
        offsets = {d: 0 for d in range(len(tile))} if offsets is None else offsets
        for role in order:
            for d, r in enumerate(self.p.op.roles):
                if r != role or extent[d] <= tile[d]:
                    continue
                lo: ir.Value = self.index(0)
                hi: ir.Value = self.index(extent[d])
                if runs and d in runs:
                    part, run = runs[d]
                    span = run * tile[d]
                    p0 = ir.AffineDimExpr.get(0)
                    lo = affine.apply(ir.AffineMap.get(1, 0, [p0 * span]), [part])
                    if run == 1:
                        offsets[d] = lo
                        continue
                    hi = affine.AffineMinOp(ir.AffineMap.get(1, 0, [p0 * span + span, ir.AffineConstantExpr.get(extent[d])]),
                                            [part]).result
                loop = scf.ForOp(lo, hi, self.index(tile[d]))
                with ir.InsertionPoint(loop.body):
                    scf.YieldOp([])
                stack.enter_context(ir.InsertionPoint.at_block_terminator(loop.body))
                offsets[d] = loop.induction_variable
        return offsets

    def level(self, li: int, parent: list[ir.Value], extent: list[int]) -> None:
        """The loops, copies and inner work of promoted level ``li`` inside views ``parent`` of ``extent``."""
        from pbsdk.core.passes.promote_vector import _subview

        p = self.p
        if li == len(p.levels):
            self.innermost(parent, extent)
            return
        name, tile = p.levels[li]
        order = [r for r in self.orders.get(name, ["n", "k", "m"]) if r != "batch"]
        with ExitStack() as stack:
            # The level of the parallel split: its batch and m/n tile loops inside a forall over the parts
            # (the forall outermost, so that one parallel region covers the whole contraction).
            runs = self.forall(extent, tile, stack) if li == self.par_level else None
            offsets = self.loops(["batch"], extent, tile, stack, runs=runs)
            self.loops(order, extent, tile, stack, offsets, runs)
            # This level's tile size in each loop: partial only at the problem's edge (the outermost
            # promoted level); inner levels see full tiles of zero-padded buffers.
            sizes: dict[int, int | ir.Value] = {}
            partial: set[int] = set()
            for d, (e, t) in enumerate(zip(extent, tile)):
                if e % t == 0:
                    sizes[d] = min(t, e)
                elif e < t:
                    sizes[d] = e
                    partial.add(d)
                else:
                    iv = offsets[d]
                    assert isinstance(iv, ir.Value)
                    amap = ir.AffineMap.get(1, 0, [ir.AffineConstantExpr.get(t),
                                                   ir.AffineConstantExpr.get(e) - ir.AffineDimExpr.get(0)])
                    sizes[d] = affine.AffineMinOp(amap, [iv]).result
                    partial.add(d)
            inner: list[ir.Value] = []
            writeback: tuple[ir.Value, ir.Value] | None = None
            for i, (role, mp) in enumerate(zip("ABC", p.op.maps)):
                offs = [offsets[d] if d >= 0 else 0 for d in mp]
                szs = [sizes[d] if d >= 0 else 1 for d in mp]
                buf = self.buffers.get(f"{role}_{name}")
                if buf is None:  # the accumulator stays where it is (the compute level's registers hold it)
                    inner.append(_subview(parent[i], offs, szs))
                    continue
                src = _subview(parent[i], offs, szs)
                dst = buf
                if any(d in partial for d in mp if d >= 0):
                    elt = ir.MemRefType(buf.type).element_type
                    linalg.fill(scalar_constant(0, elt), outs=[buf])
                    dst = _subview(buf, [0] * len(mp), szs)
                if role == "C" and self.init is not None and not self.c_staged:
                    self.start_c(buf, src, dst, offsets, extent, tile)
                else:
                    self.copy(src, dst)
                if role == "C":
                    writeback = (dst, src)
                    self.c_staged = True
                inner.append(buf)
            self.level(li + 1, inner, list(tile))
            if writeback is not None:
                self.copy(*writeback)

    def start_c(self, buf: ir.Value, src: ir.Value, dst: ir.Value, offsets: Mapping[int, int | ir.Value],
                extent: Sequence[int], tile: Sequence[int]) -> None:
        """The outermost C tile's start: the fill's constant at the first k step (the whole buffer: its
        padding is never written back), the partial sums from main memory at the later ones."""
        k = self.p.op.roles.index("k")
        elt = ir.MemRefType(buf.type).element_type
        value = arith.ConstantOp(elt, self.init).result
        if extent[k] <= tile[k]:  # one k step at this level
            linalg.fill(value, outs=[buf])
            return
        first = arith.CmpIOp(arith.CmpIPredicate.eq, offsets[k], self.index(0)).result  # type: ignore[arg-type]
        branch = scf.IfOp(first, [], has_else=True)
        with ir.InsertionPoint(branch.then_block):
            linalg.fill(value, outs=[buf])
            scf.YieldOp([])
        with ir.InsertionPoint(branch.else_block):
            self.copy(src, dst)
            scf.YieldOp([])

    def innermost(self, parent: list[ir.Value], extent: list[int]) -> None:
        """The compute of one innermost tile: unit-sized ops for a matrix unit, else one op."""
        from pbsdk.core.passes.promote_vector import _subview

        u = self.p.plan.compute
        if u.kind != "matrix-unit":
            self.compute(parent, [(attrs.COMPUTE, u.kind)])
            return
        unit = [{"m": u.m, "n": u.n, "k": u.k, "batch": 1}[r] for r in self.p.op.roles]
        with ExitStack() as stack:
            offsets = self.loops(["batch", "m", "n", "k"], extent, unit, stack)
            views = [_subview(parent[i], [offsets[d] if d >= 0 else 0 for d in mp], [unit[d] if d >= 0 else 1 for d in mp])
                     for i, mp in enumerate(self.p.op.maps)]
            self.compute(views, [(attrs.MATRIX_UNIT, u.name), (attrs.UNIT_OPERAND, u.operand_dtype),
                                 (attrs.UNIT_ACCUMULATOR, u.accumulator_dtype)])


def init_fill(op: ir.Operation) -> tuple[ir.Operation, ir.Attribute] | None:
    """The fill that initialises contraction ``op``'s accumulator, and its constant, when the pass may fold
    it into the staged C tile: an all-parallel ``linalg.generic`` (a generalised ``linalg.fill``) of a
    constant scalar into exactly ``op``'s C buffer, in the same block, and no other op touches that
    buffer (or a view of it) between the two. Folded, the C tile starts as the constant in the
    scratchpad instead of being written to main memory by the fill and read back in."""
    c = op.operands[2]
    me = op.operation
    uses = [u.owner.operation if hasattr(u.owner, "operation") else u.owner for u in c.uses]
    if any(u.block != me.block for u in uses):
        return None
    order = list(me.block.operations)

    def position(x: ir.Operation) -> int:
        return next(i for i, o in enumerate(order) if o.operation == x)

    at = position(me)
    before = [u for u in uses if u != me and position(u) < at]
    # The fill is the only use of C before the contraction (every other use comes after it).
    if len(before) != 1 or not _is_fill_of(before[0], c):
        return None
    fill = before[0]
    scalar = fill.operands[0]
    owner = getattr(scalar.owner, "operation", scalar.owner)  # a block for a block argument
    if not isinstance(owner, ir.Operation) or owner.name != "arith.constant":
        return None
    return fill, owner.attributes["value"]


def _is_fill_of(u: ir.Operation, c: ir.Value) -> bool:
    """Whether ``u`` is a generalised ``linalg.fill`` of a scalar into all of ``c``."""
    if u.name != "linalg.generic" or len(u.operands) != 2 or u.operands[1] != c:
        return False
    if isinstance(u.operands[0].type, ir.ShapedType):
        return False
    if any("parallel" not in str(a) for a in ir.ArrayAttr(u.attributes["iterator_types"])):
        return False
    out_map = ir.AffineMapAttr(ir.ArrayAttr(u.attributes["indexing_maps"])[1]).value
    if not out_map.is_permutation:
        return False
    body = list(u.regions[0].blocks[0].operations)
    return len(body) == 1 and body[0].name == "linalg.yield" and \
        list(body[0].operands) == [u.regions[0].blocks[0].arguments[0]]


@dataclasses.dataclass(frozen=True)
class PromoteToScratchpad:
    """Pass ``promote``: plan, tile and stage every contraction (see the module docstring).

    Options: ``tiles`` overrides the planner's (m, n, k) tile per level name (for experiments and tests);
    the compile options (``ctx.options``) reach the planner (``matmul_precision``, ``matrix_units``,
    ``optin_scratchpad``, ...)."""

    name = "promote"
    tiles: tuple[tuple[str, tuple[int, int, int]], ...] = ()
    #: The matrix units (by name) the target lowers; None: every unit of the spec.
    units: tuple[str, ...] | None = None
    #: Whether the target keeps a block's C tile in registers (False: in the scratchpad, see `plan_contraction`).
    accumulator_in_registers: bool = True

    def apply(self, module: ir.Module, ctx: Any) -> None:
        from mlir import passmanager

        spec = with_units(ctx.spec, self.units)
        options = ctx.options
        # Kernels the core already staged (fused attention: ``pbsdk.attention`` functions) keep their
        # marked copies and unit ops as they are.
        with module.context:
            pm = passmanager.PassManager.parse("func.func(linalg-generalize-named-ops)")
            for f in module.body.operations:
                if f.operation.name == "func.func" and not attrs.has(f.operation, attrs.ATTENTION):
                    pm.run(f.operation)
        records: list[Promotion] = ctx.notes.setdefault("promote", [])
        level_names = [m.name for m in spec.memory]
        for op in ops_named(module, "linalg.generic"):
            if attrs.has(op, attrs.MATRIX_UNIT) or attrs.has(op, attrs.COMPUTE):
                continue
            cop = analyse(op)
            if cop is None:
                continue
            name = f"__pbsdk_promoted_{len(records)}"
            try:
                promo = promotion_for(spec, cop, function=name, options=options, tiles=dict(self.tiles),
                                      accumulator_in_registers=self.accumulator_in_registers)
            except UnsupportedError:
                continue
            fill = init_fill(op) if any(b.name.startswith("C_") for b in promo.buffers) else None
            with ir.InsertionPoint(module.body), op.location:
                fn = _Rewriter(promo, level_names, spec.compute[0].name,
                               init=None if fill is None else fill[1]).function([v.type for v in op.operands])
            try:
                fn.operation.verify()
            except ir.MLIRError as exc:  # a bug here, not the user's: say which contraction
                raise CompileError(f"promoted function for {cop} is invalid: {exc}", op="linalg.generic") from exc
            with ir.InsertionPoint(op), op.location:
                func.CallOp([], ir.FlatSymbolRefAttr.get(name), list(op.operands))
            op.erase()
            if fill is not None:
                constant = getattr(fill[0].operands[0].owner, "operation", None)
                fill[0].erase()
                if constant is not None and not list(constant.result.uses):
                    constant.erase()
                promo = dataclasses.replace(promo, notes=promo.notes + (
                    "C starts as the fill's constant in the outermost scratchpad holding it (the fill folded)",))
            records.append(promo)
