"""Pass ``vectorize-rows``: an op's loop over its rows' last dimension as vector loops, reductions carried in
registers.

`fuse-rows` leaves each row of a softmax or a layernorm as ``linalg.generic`` ops over one row: a max or a sum
into a one-value buffer, then maps that read that value. Lowered to scalar loops, the reduction loads and
stores its buffer every element and the maps reload the row's scalar every element (the host compiler cannot
prove the buffers apart), so neither is vectorised: on an AVX2 host a 4096x4096 softmax ran a scalar
``vmaxss`` chain with a branch per element and a ``vdivss`` per element. Rows fuse-rows does not split (their
sizes known only at run time, or one op on one core) are the same ops over all rows. Here each such op
becomes, at the spec's vector width ``L`` for its element type, a loop nest over its leading loops (those of
extent 1 dropped) around one row's vector loops:

- a **map** (the last loop parallel; its outputs rows): the row's scalars loaded once and broadcast;
  ``scf.for`` over the row in steps of ``L`` (`UNROLL` vectors a step while they last), the body's arith and
  math ops rebuilt on vectors, the results stored; the last ``N mod L`` values through a mask;
- a **reduction** (the last loop a reduction into one value a row): the body's value before its combining op
  (``addf``/``mulf`` marked ``reassoc``, or a ``max``/``min``), computed on vectors and combined into `UNROLL`
  vector accumulators carried in registers (latency x pipes independent chains), the tail's lanes past the row
  set to the combiner's identity, then one ``vector.reduction`` and the output's old value combined once.

An op qualifies when its loops are parallel but the last, every operand is either a row (its last dimension
walked by the last loop with unit stride) or a scalar (the last loop not read), the rows' length is static or
read from a row at run time (every bound then computed, the masked tail always kept), its element type is f32
or f64 in the spec's vector unit, and its body is single-result arith/math ops with no loop indices. Anything
else is left to the loop lowering as before. The analysis (`row_plan`) is pure.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from pbsdk.core.ir.builder import body_on_vectors, on_vectors, zero_vector
from pbsdk.core.passes import iterator_kinds, map_dims, ops_named

#: Vectors a step of the main loop: independent accumulator chains of a reduction (an add's latency of 3-4
#: cycles on 2 pipes needs 6-8 for full rate; 4 already quarters the latency-bound time).
UNROLL = 4
#: Combining ops of a reduction, by op name: (``vector.reduction`` kind, identity, needs ``reassoc``).
_Kind = vector.CombiningKind
COMBINERS = {"arith.addf": (_Kind.ADD, 0.0, True), "arith.mulf": (_Kind.MUL, 1.0, True),
             "arith.maxnumf": (_Kind.MAXNUMF, -math.inf, False), "arith.minnumf": (_Kind.MINNUMF, math.inf, False),
             "arith.maximumf": (_Kind.MAXIMUMF, -math.inf, False), "arith.minimumf": (_Kind.MINIMUMF, math.inf, False)}

#: One operand as the analysis sees it: per buffer dimension, the loop it is indexed by (None: a constant 0),
#: its sizes and strides.
Operand = tuple[tuple[int | None, ...], tuple[int, ...], tuple[int, ...]]


@dataclasses.dataclass(frozen=True)
class RowPlan:
    """How `vectorize-rows` runs an op: ``n`` values along its last loop (-1: known at run time), ``reduce``
    (else a map), and per operand whether it is a row (else a scalar: one value per row of the op)."""

    n: int
    reduce: bool
    rows: tuple[bool, ...]


def row_plan(iterators: Sequence[str], operands: Sequence[Operand], n_inputs: int, lanes: int) -> RowPlan | None:
    """The `RowPlan` of a structured op (``iterators`` per loop, ``operands`` inputs then outputs; a size -1
    is known at run time), or None when it is no row op (module docstring) or its row is known to be shorter
    than one vector of ``lanes``."""
    if not iterators or any(i not in ("parallel", "reduction") for i in iterators):
        return None
    last = len(iterators) - 1
    if any(i != "parallel" for i in iterators[:-1]):
        return None
    n = None
    rows: list[bool] = []
    for loops, sizes, strides in operands:
        walks = last in loops
        for p, (loop, size) in enumerate(zip(loops, sizes)):
            if loop == last and (p != len(loops) - 1 or strides[p] != 1 or (n is not None and size != n)):
                return None
            if loop == last:
                n = size
        rows.append(walks)
    if n is None or 0 <= n < lanes:
        return None
    reduce = iterators[-1] == "reduction"
    outputs = rows[n_inputs:]
    if reduce and (len(outputs) != 1 or outputs[0]):
        return None
    if not reduce and not all(outputs):
        return None
    return RowPlan(n, reduce, tuple(rows))


def _operand(value: ir.Value, amap: ir.AffineMap) -> Operand | None:
    if not isinstance(value.type, ir.MemRefType):
        return None
    t = ir.MemRefType(value.type)
    loops = map_dims(amap)
    dynamic = ir.ShapedType.get_dynamic_size()
    if loops is None or t.rank == 0:
        return None
    strides, _ = t.get_strides_and_offset()
    if strides[-1] == ir.ShapedType.get_dynamic_stride_or_offset():
        return None  # the other dimensions are indexed as they are (memref.load, vector.load take any strides)
    sizes = tuple(-1 if d == dynamic else d for d in t.shape)
    return tuple(loops), sizes, tuple(strides)


@dataclasses.dataclass(frozen=True)
class VectorizeRows:
    """Rewrite every qualifying ``linalg.generic`` (module docstring) at the spec's vector width."""

    name = "vectorize-rows"
    #: False: the pass does nothing (the cpu target sets it from its option ``vectorize_rows``).
    enabled: bool = True

    def apply(self, module: ir.Module, ctx: Any) -> None:
        vec = ctx.spec.vector
        if not self.enabled or vec is None:
            return
        with module.context, ir.Location.unknown():
            for op in ops_named(module, "linalg.generic"):
                _Rewrite.of(op, vec)


@dataclasses.dataclass
class _Rewrite:
    op: ir.Operation
    plan: RowPlan
    lanes: int
    elem: ir.Type
    combiner: ir.Operation | None  # a reduction's combining op in the body
    loops_of: list[tuple[int | None, ...]]  # per operand, per dimension: the loop indexing it (None: 0)

    @classmethod
    def of(cls, op: ir.Operation, vec: Any) -> None:
        kinds = iterator_kinds(op)
        maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        body = op.regions[0].blocks[0]
        if not all(on_vectors(o.operation) for o in body.operations):
            return
        found = [_operand(v, m) for v, m in zip(op.operands, maps)]
        if any(f is None for f in found):
            return
        elems = {str(ir.MemRefType(v.type).element_type) for v in op.operands}
        if len(elems) != 1 or (dtype := elems.pop()) not in vec.dtypes or dtype not in ("f32", "f64"):
            return  # narrow floats: their vector arithmetic is the back end's to widen (or not legal)
        n_inputs = len(op.operands) - _outputs(op, body)
        operands = list(op.operands)
        plan = row_plan(kinds, [f for f in found if f is not None], n_inputs, vec.lanes(dtype))
        if plan is None or any(not plan.rows[i] and operands[i] in operands[n_inputs:] for i in range(n_inputs)):
            return  # a scalar it also writes is read once here, not per element
        combiner = None
        if plan.reduce:
            combiner = _combiner(body)
            if combiner is None:
                return
        cls(op, plan, vec.lanes(dtype), ir.MemRefType(op.operands[0].type).element_type, combiner,
            [f[0] for f in found if f is not None]).build()

    # -------------------------------------------------------------------------------------------------
    def build(self) -> None:
        op, plan, L = self.op, self.plan, self.lanes
        self.vt = ir.VectorType.get([L], self.elem)
        self.mask_t = ir.VectorType.get([L], ir.IntegerType.get_signless(1))
        body = op.regions[0].blocks[0]
        self.args = list(body.arguments)
        self.n_in = len(op.operands) - _outputs(op, body)
        self.last = len(ir.ArrayAttr(op.attributes["iterator_types"])) - 1  # the loop along the rows
        with ir.InsertionPoint(op):
            idx = ir.IndexType.get()
            self.c = lambda v: arith.constant(idx, v)
            self.ivs: dict[int, ir.Value] = {}
            self.bounds = _Bounds.of(self, plan.n, L)
            self._rows(0)
        op.erase()

    def _rows(self, loop: int) -> None:
        """The op's leading loops from ``loop`` on (a loop of extent 1 is index 0), then one row."""
        if loop == self.last:
            # the scalars the body reads, loaded once a row and broadcast (an output is read where it is combined)
            self.scalars = {i: vector.broadcast(self.vt, memref.load(v, self._index(i, None)))
                            for i, v in enumerate(list(self.op.operands)[:self.n_in]) if not self.plan.rows[i]}
            if self.plan.reduce:
                self._reduce()
            else:
                self._map()
            return
        extent = self._extent(loop)
        if extent is None:
            self._rows(loop + 1)
            return
        nest = scf.ForOp(self.c(0), extent, self.c(1))
        with ir.InsertionPoint(nest.body):
            self.ivs[loop] = nest.induction_variable
            self._rows(loop + 1)
            scf.YieldOp([])

    def _extent(self, loop: int) -> ir.Value | None:
        """A leading loop's extent (None: 1), from an operand dimension it indexes."""
        for v, dims in zip(self.op.operands, self.loops_of):
            for p, j in enumerate(dims):
                if j == loop:
                    size = ir.MemRefType(v.type).shape[p]
                    if size == 1:
                        return None
                    return memref.dim(v, self.c(p)) if size == ir.ShapedType.get_dynamic_size() else self.c(size)
        return None

    def _index(self, i: int, at: ir.Value | None) -> list[ir.Value]:
        """Operand ``i``'s indices in the current row: its leading loops' induction variables, 0 for a
        constant index, ``at`` along the row."""
        return [at if j == self.last else self.ivs.get(j, self.c(0)) if j is not None else self.c(0)
                for j in self.loops_of[i]]  # type: ignore[misc]

    def _load_rows(self, at: ir.Value, mask: ir.Value | None) -> dict[int, ir.Value]:
        """Every row input's vector at ``at`` (masked: lanes past the row zero); the scalars broadcast."""
        out: dict[int, ir.Value] = {}
        for i in range(self.n_in):
            v = self.op.operands[i]
            if not self.plan.rows[i]:
                out[i] = self.scalars[i]
            elif mask is None:
                out[i] = vector.load(self.vt, v, self._index(i, at))
            else:
                out[i] = vector.maskedload(self.vt, v, self._index(i, at), mask, zero_vector(self.vt))
        return out

    def _body(self, inputs: dict[int, ir.Value], outs: dict[int, ir.Value], stop: ir.Operation | None
              ) -> list[ir.Value]:
        """The body rebuilt on vectors (block arguments: ``inputs``, then ``outs`` for outputs read); with
        ``stop``, the value it combines with the output (its other operand), else the yielded values."""
        n_out = len(self.args) - self.n_in
        args = [inputs[i] for i in range(self.n_in)] + [outs.get(k) for k in range(n_out)]
        return body_on_vectors(self.op.regions[0].blocks[0], args, self.lanes, stop=stop)

    # -------------------------------------------------------------------------------------------------
    def _map(self) -> None:
        L, bd = self.lanes, self.bounds
        reads = self._outputs_read()

        def at(i: ir.Value, mask: ir.Value | None) -> None:
            outs = {k: self._load_out(k, i, mask) for k in reads}
            values = self._body(self._load_rows(i, mask), outs, None)
            for k, val in enumerate(values):
                dest = self.op.operands[self.n_in + k]
                if mask is None:
                    vector.store(val, dest, self._index(self.n_in + k, i))
                else:
                    vector.maskedstore(dest, self._index(self.n_in + k, i), mask, val)

        if bd.has_main:
            loop = scf.ForOp(self.c(0), bd.main, self.c(bd.step))
            with ir.InsertionPoint(loop.body):
                for u in range(bd.step // L):
                    at(arith.addi(loop.induction_variable, self.c(u * L)) if u else loop.induction_variable, None)
                scf.YieldOp([])
        if bd.has_rest:
            loop = scf.ForOp(bd.main, bd.full, self.c(L))
            with ir.InsertionPoint(loop.body):
                at(loop.induction_variable, None)
                scf.YieldOp([])
        if bd.has_tail:
            at(bd.full, vector.create_mask(self.mask_t, [bd.tail]))

    def _outputs_read(self) -> list[int]:
        return [k for k, a in enumerate(self.args[self.n_in:]) if len(list(a.uses))]

    def _load_out(self, k: int, at: ir.Value, mask: ir.Value | None) -> ir.Value:
        dest = self.op.operands[self.n_in + k]
        idx = self._index(self.n_in + k, at)
        if mask is None:
            return vector.load(self.vt, dest, idx)
        return vector.maskedload(self.vt, dest, idx, mask, zero_vector(self.vt))

    def _reduce(self) -> None:
        assert self.combiner is not None
        L, comb, bd = self.lanes, self.combiner, self.bounds
        kind, identity, _ = COMBINERS[comb.name]
        ident = arith.constant(self.vt, ir.DenseElementsAttr.get_splat(self.vt, ir.FloatAttr.get(self.elem, identity)))
        attrs = {name: comb.attributes[name] for name in comb.attributes}

        def combine(a: ir.Value, b: ir.Value) -> ir.Value:
            return ir.Operation.create(comb.name, results=[self.vt], operands=[a, b], attributes=attrs).results[0]

        def term(i: ir.Value, mask: ir.Value | None) -> ir.Value:
            v = self._body(self._load_rows(i, mask), {}, comb)[0]
            return v if mask is None else arith.select(mask, v, ident)

        accs = [ident] * (bd.step // L)
        if bd.has_main:
            loop = scf.ForOp(self.c(0), bd.main, self.c(bd.step), accs)
            with ir.InsertionPoint(loop.body):
                k = loop.induction_variable
                news = [combine(acc, term(arith.addi(k, self.c(u * L)) if u else k, None))
                        for u, acc in enumerate(loop.inner_iter_args)]
                scf.YieldOp(news)
            accs = list(loop.results)
        acc = accs[0]
        for other in accs[1:]:
            acc = combine(acc, other)
        if bd.has_rest:
            loop = scf.ForOp(bd.main, bd.full, self.c(L), [acc])
            with ir.InsertionPoint(loop.body):
                scf.YieldOp([combine(loop.inner_iter_args[0], term(loop.induction_variable, None))])
            acc = loop.results[0]
        if bd.has_tail:
            acc = combine(acc, term(bd.full, vector.create_mask(self.mask_t, [bd.tail])))
        total = vector.reduction(self.elem, kind, acc)
        out = self.op.operands[self.n_in]
        where = self._index(self.n_in, None)
        old = memref.load(out, where)
        scalar_attrs = {name: comb.attributes[name] for name in comb.attributes}
        result = ir.Operation.create(comb.name, results=[self.elem], operands=[total, old],
                                     attributes=scalar_attrs).results[0]
        memref.store(result, out, where)


@dataclasses.dataclass(frozen=True)
class _Bounds:
    """The loops over a row of ``n`` values (index values; ``n`` known at compile time or read from a row
    operand): ``[0, main)`` in steps of ``step`` (`UNROLL` vectors where the row has that many), ``[main,
    full)`` a vector at a time, then ``tail`` values (fewer than a vector) through a mask. The ``has_*``
    flags drop the loops a static row does not need."""

    main: ir.Value
    full: ir.Value
    tail: ir.Value
    step: int
    has_main: bool
    has_rest: bool
    has_tail: bool

    @classmethod
    def of(cls, rw: _Rewrite, n: int, lanes: int) -> _Bounds:
        if n >= 0:
            full = n // lanes * lanes
            step = lanes * UNROLL if full >= lanes * UNROLL else lanes
            main = full // step * step
            return cls(rw.c(main), rw.c(full), rw.c(n - full), step, main > 0, full > main, n > full)
        first = next(i for i, row in enumerate(rw.plan.rows) if row)
        value = rw.op.operands[first]
        n_v = memref.dim(value, rw.c(ir.MemRefType(value.type).rank - 1))
        step = lanes * UNROLL
        main = arith.muli(arith.divui(n_v, rw.c(step)), rw.c(step))
        full = arith.muli(arith.divui(n_v, rw.c(lanes)), rw.c(lanes))
        return cls(main, full, arith.subi(n_v, full), step, True, True, True)


def _outputs(op: ir.Operation, body: ir.Block) -> int:
    """The number of outputs (init operands) of a ``linalg.generic`` on buffers: the yield's operand count."""
    return len(list(body.operations)[-1].operands)


def _combiner(body: ir.Block) -> ir.Operation | None:
    """A reduction body's combining op: it yields ``comb(x, out)`` (either order) of a `COMBINERS` op (marked
    ``reassoc`` where reordering changes the result), the output read nowhere else and ``x`` not from it."""
    ops = [o.operation for o in body.operations]
    yield_op = ops[-1]
    out_arg = body.arguments[len(body.arguments) - 1]
    if len(yield_op.operands) != 1 or len(list(out_arg.uses)) != 1:
        return None
    owner = yield_op.operands[0].owner
    comb = owner if isinstance(owner, ir.Operation) else getattr(owner, "operation", None)
    if comb is None or comb.name not in COMBINERS or out_arg not in list(comb.operands):
        return None
    if COMBINERS[comb.name][2] and "reassoc" not in fastmath_flags(comb):
        return None
    other = next((v for v in comb.operands if v != out_arg), None)
    if other is None:  # comb(out, out)
        return None
    return comb


def fastmath_flags(op: ir.Operation) -> set[str]:
    """The fast-math flags of an arith op (``#arith.fastmath<reassoc,arcp>``; ``fast`` is all of them)."""
    if "fastmath" not in op.attributes:
        return set()
    text = str(op.attributes["fastmath"])
    flags = {f.strip() for f in text[text.find("<") + 1:text.rfind(">")].split(",")} - {"none", ""}
    return {"reassoc", "nnan", "ninf", "nsz", "arcp", "contract", "afn"} if "fast" in flags else flags
