"""Pass ``transpose-blocks``: a copy that moves its innermost dimension — an NCHW <-> NHWC layout change,
a ``linalg.transpose`` or a copy ``linalg.generic`` reading through a permutation — as L x L blocks through
the vector registers; likewise an elementwise map that does so (an activation computed channels last and
written NCHW).

Lowered as loops, such a copy walks one of its two buffers a stride at a time: a load or a store per element
(an NCHW image of 64 x 56 x 56 to NHWC took 0.076 ms on a Zen 4 core, 1.4 cycles an element). Here the two
loops involved — ``a``, along which the input is contiguous, and ``q``, along which the output is — are cut
into L x L blocks (L: the spec's vector lanes for the element type): L vector loads along ``a`` (one per
``q`` of the block), `transpose_vectors` (``log2 L`` stages of two-source shuffles), L vector stores along
``q``. The whole blocks run in loops without masks; the blocks at a ragged end of ``a`` or ``q`` are built
once each with their lane counts: masked loads along ``a`` (only the rows inside are stored), masked stores
along ``q`` (``q`` indices past the end read the last one, their lanes never stored). The other loops run
around the blocks. Done on buffers after ``fuse-rows`` (which splits the transposes of a batch-1 entry over
the cores first) and ``collapse-loops`` (which leaves an NCHW image's h, w as one loop of h*w).

A map (an all-parallel ``linalg.generic`` with one output it does not read and a body of one-result arith
and math ops) is the same blocks around its body: its source — an input indexed by every loop whose
innermost is not the output's — is transposed as above, and per row of a block the body runs on vectors
along ``q`` (`body_on_vectors`), its other inputs read by `plan_side_inputs`: transposed as well, a vector
along ``q``, or one value broadcast (a bias per channel). A direct convolution's NHWC result with its bias
and activation, written NCHW, was a scalar loop storing one element a stride apart each (on a Zen 3 it took
more than the convolution itself).

`plan_transpose` and `plan_side_inputs` (pure) decide from the loops each buffer dimension is indexed by and
the strides: both innermost strides 1, the two innermost loops different, both at least L long. Field
``enabled`` (the cpu target's option ``transpose_blocks``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Literal

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from pbsdk.core.ir.builder import Indices, body_on_vectors, on_vectors, transpose_vectors
from pbsdk.core.passes import map_dims, ops_named


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


#: How a permuting map reads an input other than its source in an L x L block (`plan_side_inputs`):
#: ``"transposed"`` like the source (L vector loads along ``a``, one per ``q``, then transposed), ``"row"``
#: a vector load along ``q`` per row of the block, ``"scalar"`` one value per row, broadcast.
SideRead = Literal["transposed", "row", "scalar"]


def plan_side_inputs(inputs: Sequence[tuple[Sequence[int | None], Sequence[int]]], a: int, q: int
                     ) -> tuple[tuple[SideRead, ...] | None, str]:
    """How each further input of a permuting elementwise map (per input: the loop each dimension is indexed
    by, None for a constant 0, and the strides) is read in the blocks of loops ``a`` x ``q``, or None and why
    not: an input walked by ``q`` must have it innermost with unit stride (a vector along ``q``) or have
    ``a`` innermost with unit stride (transposed like the source); one not walked by ``q`` is a scalar per
    row of the block. Anything else would be a gather."""
    reads: list[SideRead] = []
    for i, (loops, strides) in enumerate(inputs):
        inner, unit = (loops[-1], strides[-1] == 1) if loops else (None, False)
        if q not in loops:
            reads.append("scalar")
        elif inner == q and unit and list(loops).count(q) == 1:
            reads.append("row")
        elif inner == a and unit and list(loops).count(a) == 1 and list(loops).count(q) == 1:
            reads.append("transposed")
        else:
            return None, f"input {i + 1} is walked by loop {q} but neither it nor loop {a} is its innermost"
    return tuple(reads), ""


@dataclasses.dataclass(frozen=True)
class _Map:
    """A permuting copy or elementwise map on buffers: ``inputs`` with the loops indexing each dimension
    (None: a constant 0), ``inputs[src]`` the source (indexed by every loop, its innermost loop not the
    output's), one output ``dst`` indexed by ``out_loops`` (a permutation of every loop), and the ``body`` to
    rebuild on vectors (None: a plain copy of the source)."""

    inputs: tuple[ir.Value, ...]
    in_loops: tuple[tuple[int | None, ...], ...]
    src: int
    dst: ir.Value
    out_loops: tuple[int, ...]
    body: ir.Block | None


def _permuting_map(op: ir.Operation) -> _Map | None:
    """The `_Map` of a ``linalg.transpose`` or of an all-parallel ``linalg.generic`` on buffers with one
    output it does not read and a body `body_on_vectors` can rebuild; its source is the first input indexed
    by every loop whose innermost loop is not the output's (else the first indexed by every loop). None
    otherwise."""
    if op.name == "linalg.transpose":
        perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
        # Output dimension i is loop i and reads input dimension perm[i].
        in_loops = tuple(perm.index(j) for j in range(len(perm)))
        return _Map((op.operands[0],), (in_loops,), 0, op.operands[1], tuple(range(len(perm))), None)
    if op.name != "linalg.generic" or len(op.operands) < 2 or op.results:
        return None
    if any("parallel" not in str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"])):
        return None
    block = op.regions[0].blocks[0]
    if len(list(block.operations)[-1].operands) != 1:  # the yield: one output
        return None
    if list(block.arguments[-1].uses) or not all(on_vectors(o.operation) for o in block.operations):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    out = map_dims(maps[-1])
    loops = [map_dims(m) for m in maps[:-1]]
    if not out or None in out or any(lp is None for lp in loops):  # a 0-d op permutes nothing
        return None
    writes = tuple(j for j in out if j is not None)
    full = [i for i, lp in enumerate(loops) if lp is not None and None not in lp
            and sorted(lp) == list(range(len(writes)))]  # type: ignore[type-var]
    full.sort(key=lambda i: loops[i][-1] == writes[-1])  # type: ignore[index]  # a transposed one first
    if not full:
        return None
    inputs = tuple(op.operands[i] for i in range(len(loops)))
    return _Map(inputs, tuple(tuple(lp) for lp in loops if lp is not None), full[0], op.operands[len(loops)],
                writes, block if len(loops) > 1 or _computes(block) else None)


def _computes(block: ir.Block) -> bool:
    """Whether a generic's body does more than yield its first argument."""
    body = list(block.operations)
    return not (len(body) == 1 and body[0].operation.operands[0] == block.arguments[0])


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
                m = _permuting_map(op)
                if m is None or not all(isinstance(v.type, ir.MemRefType) for v in (*m.inputs, m.dst)):
                    continue
                if m.body is not None and m.in_loops[m.src][-1] == m.out_loops[-1]:
                    continue  # an elementwise map that permutes nothing: not this pass's
                planned = _plan(m, vec)
                if isinstance(planned, str):
                    notes.append(f"{op.name} {m.inputs[m.src].type} -> {m.dst.type}: {planned}; left as is")
                    continue
                plan, sides = planned
                what = "copy" if m.body is None else f"map of {len(m.inputs)} input(s)"
                notes.append(f"{op.name} {m.inputs[m.src].type} -> {m.dst.type}: {plan.lanes}x{plan.lanes} "
                             f"register-transposed blocks of loops {plan.a} x {plan.q} ({what})")
                with ir.InsertionPoint(op):
                    _Blocks(plan, m, sides, ir.MemRefType(m.dst.type).element_type).build()
                op.erase()


def _plan(m: _Map, vec: Any) -> tuple[TransposePlan, tuple[SideRead, ...]] | str:
    """The blocks of ``m`` and how its other inputs are read, or why not."""
    st, dt = ir.MemRefType(m.inputs[m.src].type), ir.MemRefType(m.dst.type)
    dtype = str(dt.element_type)
    if any(str(ir.MemRefType(v.type).element_type) != dtype for v in m.inputs):
        return "element types differ"
    if not (st.has_static_shape and dt.has_static_shape):
        return "sizes known at run time"
    if vec is None or dtype not in vec.dtypes:
        return f"no vector unit for {dtype}"
    if m.body is not None and dtype not in ("f32", "f64"):
        return f"arithmetic on {dtype} (the back end's to widen)"
    extents = list(dt.shape)
    for loop, size in zip(m.out_loops, dt.shape):
        extents[loop] = size
    source = [j for j in m.in_loops[m.src] if j is not None]  # every loop (`_permuting_map`)
    plan, why = plan_transpose(extents, source, m.out_loops, st.get_strides_and_offset()[0],
                               dt.get_strides_and_offset()[0], vec.lanes(dtype))
    if plan is None:
        return why
    others = [(m.in_loops[i], ir.MemRefType(v.type).get_strides_and_offset()[0])
              for i, v in enumerate(m.inputs) if i != m.src]
    sides, why = plan_side_inputs(others, plan.a, plan.q)
    if sides is None:
        return why
    return plan, sides


@dataclasses.dataclass
class _Blocks:
    """Builds the loop nest of `TransposeBlocks` at the insertion point: the loops other than ``a`` and ``q``,
    then per L x L block the source (and any input read like it) loaded along ``a`` and transposed, and per
    row of the block the body on vectors along ``q``, stored."""

    plan: TransposePlan
    m: _Map
    sides: tuple[SideRead, ...]
    element: ir.Type

    def build(self) -> None:
        plan, L = self.plan, self.plan.lanes
        self.vt = ir.VectorType.get([L], self.element)
        self.mt = ir.VectorType.get([L], ir.IntegerType.get_signless(1))
        self.c = Indices(ir.InsertionPoint.current.block).c  # constants at the top of the copy's block
        zero_attr = (ir.IntegerAttr.get(self.element, 0) if isinstance(self.element, ir.IntegerType)
                     else ir.FloatAttr.get(self.element, 0.0))
        self.zero = arith.constant(self.vt, ir.DenseElementsAttr.get_splat(self.vt, zero_attr))
        reads = list(self.sides)
        reads.insert(self.m.src, "transposed")
        self.reads: list[SideRead] = reads
        self._nest([j for j in range(len(plan.extents)) if j not in (plan.a, plan.q)], {})

    def _nest(self, others: list[int], ivs: dict[int, ir.Value]) -> None:
        """The loops ``others`` around the blocks: whole blocks in loops over ``a`` and ``q``, then the blocks
        at a ragged end of either, each built once with its static lane count (masks, no clamps or guards
        in the whole blocks)."""
        c, plan, L = self.c, self.plan, self.plan.lanes
        if others:
            loop = scf.ForOp(c(0), c(plan.extents[others[0]]), c(1))
            with ir.InsertionPoint(loop.body):
                self._nest(others[1:], {**ivs, others[0]: loop.induction_variable})
                scf.YieldOp([])
            return
        ext_a, ext_q = plan.extents[plan.a], plan.extents[plan.q]

        def columns(a0: ir.Value, rows: int) -> None:
            if ext_q >= L:
                inner = scf.ForOp(c(0), c(ext_q - ext_q % L), c(L))
                with ir.InsertionPoint(inner.body):
                    self._block(ivs, a0, inner.induction_variable, rows, L)
                    scf.YieldOp([])
            if ext_q % L:
                self._block(ivs, a0, c(ext_q - ext_q % L), rows, ext_q % L)

        outer = scf.ForOp(c(0), c(ext_a - ext_a % L), c(L))
        with ir.InsertionPoint(outer.body):
            columns(outer.induction_variable, L)
            scf.YieldOp([])
        if ext_a % L:
            columns(c(ext_a - ext_a % L), ext_a % L)

    def _index(self, loops: Sequence[int | None], at: dict[int, ir.Value]) -> list[ir.Value]:
        return [at[j] if j is not None else self.c(0) for j in loops]

    def _block(self, ivs: dict[int, ir.Value], a0: ir.Value, q0: ir.Value, rows: int, cols: int) -> None:
        """The block at (``a0``, ``q0``) of which ``rows`` (along a) and ``cols`` (along q) are inside the
        buffers: ``cols < L`` only at the end of q, where ``q0`` is a constant."""
        c, plan, m, L = self.c, self.plan, self.m, self.plan.lanes
        mask_a = vector.constant_mask(self.mt, [rows]) if rows < L else None
        mask_q = vector.constant_mask(self.mt, [cols]) if cols < L else None
        end_q = plan.extents[plan.q] - 1
        columns: dict[int, list[ir.Value]] = {}  # per input read transposed: its L vectors along q
        for i, v in enumerate(m.inputs):
            if self.reads[i] != "transposed":
                continue
            loaded = []
            for t in range(L):
                # past the end of q: the last column again, never stored
                qt = (q0 if t == 0 else arith.addi(q0, c(t))) if t < cols else c(end_q)
                idx = self._index(m.in_loops[i], {**ivs, plan.a: a0, plan.q: qt})
                loaded.append(vector.load(self.vt, v, idx) if mask_a is None
                              else vector.maskedload(self.vt, v, idx, mask_a, self.zero))
            columns[i] = transpose_vectors(loaded)
        for s in range(rows):  # rows past the end of a are neither read nor stored
            self._row(columns, s, {**ivs, plan.a: arith.addi(a0, c(s)) if s else a0, plan.q: q0}, mask_q)

    def _row(self, columns: dict[int, list[ir.Value]], s: int, at: dict[int, ir.Value],
             mask_q: ir.Value | None) -> None:
        """Row ``s`` of a block (``at``: every loop's index, q at the block's first column): the inputs as
        vectors along q, the body on them, the store."""
        m = self.m
        args: list[ir.Value | None] = []
        for i, v in enumerate(m.inputs):
            idx = self._index(m.in_loops[i], at)
            if self.reads[i] == "transposed":
                args.append(columns[i][s])
            elif self.reads[i] == "scalar":
                args.append(vector.broadcast(self.vt, memref.load(v, idx)))
            else:
                args.append(vector.load(self.vt, v, idx) if mask_q is None
                            else vector.maskedload(self.vt, v, idx, mask_q, self.zero))
        value = args[m.src] if m.body is None else body_on_vectors(m.body, [*args, None], self.plan.lanes)[0]
        idx = self._index(m.out_loops, at)
        if mask_q is None:
            vector.store(value, m.dst, idx)
        else:
            vector.maskedstore(m.dst, idx, mask_q, value)
