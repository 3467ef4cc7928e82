"""The fused attention kernel of a ``"scratchpad"`` `AttentionPlan`, built on buffers with the MLIR bindings.

For chips whose innermost memory is software-managed (`pbsdk.core.plan.attention.ScratchpadTiles`),
the kernel is written in the same target-neutral form the ``promote`` pass gives contractions, so a
target lowers it with the hooks it already has:

- scratchpad buffers are ``memref.alloc`` in memory space ``tiles.space`` (one set per core: they
  are allocated inside the ``scf.forall`` over the outermost compute level);
- every move between main memory and the scratchpad is a ``linalg.copy`` marked ``pbsdk.dma`` (Q's
  tile once per work item, K's and V's (and the mask's) once per key block, O's once at the end —
  the score matrix never moves);
- the two matmuls are ``linalg.generic`` ops of exactly the matrix unit's m x n x k marked
  ``pbsdk.matrix_unit`` (or, without a unit, one ``pbsdk.compute = "vector"`` op per tile);
- the online softmax (scale, masks, running maximum and sum, rescaling) is ``linalg.generic`` ops
  on scratchpad buffers marked ``pbsdk.compute = "vector"``, in f32; P is rounded to the op's dtype
  before P·V, as the unit reads it.

One function, ``@{name}(Q, K, V[, M], O)``, on the operands' base buffers (read at the match's
strides through ``memref.reinterpret_cast``: GQA and transposed operands are strides). It carries the
plan and operand layouts as its ``pbsdk.attention`` dictionary attribute (`descriptor`, as plain data:
`pbsdk.core.ir.attributes.data`).

`build_tiles_kernel` builds it op by op with the bindings' builders (``mlir.dialects.func/scf/memref/
linalg/arith/math``) at a given insertion point — `pbsdk.core.ir.emit` passes one in front of the entry
function — and sets the ``pbsdk.*`` attributes through `pbsdk.core.ir.attributes`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeAlias

from mlir import ir
from mlir.dialects import arith, func, linalg, memref, scf
from mlir.dialects import math as math_d

from pbsdk.core.dims import Dim, static
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.ir.attention import Operand
from pbsdk.core.ir.builder import (
    Indices,
    affine_map,
    buffer_generic,
    dims,
    element_type,
    float_constant,
    loop,
    reassociation,
)
from pbsdk.core.ir.builder import memref_type as memref_t
from pbsdk.core.plan.attention import AttentionPlan, ScratchpadTiles, UnitChoice


@dataclasses.dataclass(frozen=True)
class KernelOperands:
    """What a fused attention kernel reads: each operand's base shape (for its memref type) and strides."""

    q: Operand
    k: Operand
    v: Operand
    mask: Operand | None
    q_shape: tuple[int | Dim, ...]  # a base size may be known only at run time (a key length: ``?``)
    k_shape: tuple[int | Dim, ...]
    v_shape: tuple[int | Dim, ...]
    mask_shape: tuple[int | Dim, ...] | None
    out_shape: tuple[int | Dim, ...]
    scale: float
    mask_scale: float
    dtype: str = "f32"


def batch_start(ix: Indices, beta: ir.Value, opnd: Operand | Any,
                size_of: Callable[[Dim], ir.Value] | None = None) -> ir.Value:
    """Σ_f ((β / inner_f) % size_f) * stride_f: where flat batch index ``beta`` starts in an operand
    (anything with `Operand`'s ``batch`` factors), built with ``ix`` at the current insertion point. A
    stride that is a `Dim` (known at run time) is multiplied by ``size_of(stride)``, its index value."""
    total = ix.c(0)
    for size, stride, inner in opnd.batch:
        if stride == 0 or size == 1:
            continue
        idx = beta if inner == 1 else ix.divui(beta, inner)
        idx = ix.remui(idx, size)
        if isinstance(stride, Dim):
            assert size_of is not None, f"a stride known at run time ({stride}) needs its value"
            total = ix.add(total, arith.muli(idx, size_of(stride)))
        else:
            total = ix.add(total, ix.mul(idx, stride))
    return total


def rounded(value: float) -> float:
    """A float constant's value as the kernels write it: 10 significant digits (infinities kept)."""
    return value if math.isinf(value) else float(f"{value:.9e}")


@dataclasses.dataclass(frozen=True)
class OperandLayout:
    """An operand as a descriptor gives it (``operands.q`` ...): its base buffer's ``shape``; element
    (r, c) for flat batch index β is at ``Σ_f ((β // inner_f) % size_f) * stride_f + r * row_stride +
    c * col_stride`` of the flattened base. Written by `descriptor`, read by the targets that build
    attention kernels from it (`from_descriptor`)."""

    shape: tuple[int | Dim, ...]
    batch: tuple[tuple[int, int | Dim, int], ...]  # (size, stride, inner) per factor
    row_stride: int | Dim
    col_stride: int | Dim

    @classmethod
    def from_descriptor(cls, raw: Mapping[str, Any]) -> OperandLayout:
        """The layout from its descriptor entry; ``KeyError``/``TypeError``/``ValueError`` when malformed."""
        return cls(tuple(size_from_descriptor(x) for x in raw["shape"]),
                   tuple((int(a), size_from_descriptor(b), int(c)) for a, b, c in raw["batch"]),
                   size_from_descriptor(raw["row_stride"]), size_from_descriptor(raw["col_stride"]))

    @property
    def dynamic(self) -> bool:
        """Whether a size or stride is known only at run time."""
        return any(isinstance(x, Dim) for x in (*self.shape, self.row_stride, self.col_stride,
                                                   *(st for _, st, _ in self.batch)))

    def offset(self, beta: int, r: int, c: int, env: Mapping[str, int] | None = None) -> int:
        """Where element (r, c) of batch index ``beta`` is; ``env`` gives the symbols' values."""
        def n(x: int | Dim) -> int:
            return x if isinstance(x, int) else x.evaluate(env or {})

        return (sum(((beta // inner) % size) * n(stride) for size, stride, inner in self.batch)
                + r * n(self.row_stride) + c * n(self.col_stride))


def size_json(x: int | Dim) -> int | str:
    """A size or stride as a descriptor holds it: an int, or a `Dim`'s printed form (known at run time)."""
    return str(x) if isinstance(x, Dim) else int(x)


def size_from_descriptor(x: Any) -> int | Dim:
    """A descriptor's size or stride (`size_json`); ``ValueError``/``TypeError`` when malformed."""
    if isinstance(x, str):
        form = Dim.parse(x)
        return form if form.coeffs else form.const
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"a size is an int or a dimension expression, not {x!r}")
    return x


def _operand_json(opnd: Operand | None, shape: tuple[int | Dim, ...] | None) -> dict[str, Any] | None:
    if opnd is None or shape is None:
        return None
    return {"shape": [size_json(x) for x in shape],
            "batch": [[size, size_json(stride), inner] for size, stride, inner in opnd.batch],
            "row_stride": size_json(opnd.row_stride), "col_stride": size_json(opnd.col_stride)}


#: The ``pbsdk.attention`` descriptor version `descriptor` writes (both forms). Version 2 allows a key length
#: known at run time: ``sk``, base shapes and strides may then be `Dim` strings in the ``symbols`` listed.
DESCRIPTOR_VERSION = 2


def descriptor(plan: AttentionPlan, ops: KernelOperands) -> dict[str, Any]:
    """The plan and operand layouts as plain data (the ``pbsdk.attention`` attribute, version 2).

    A key length known only at run time (``op.sk`` a `Dim`; the ``"lanes"`` form only) is written as its
    string form (``"s0 + 1"``), and so is every base shape's size and stride that depends on it; ``symbols``
    lists the symbols those forms name (each is a base buffer's dimension, or one plus a constant, so a
    kernel reads it with ``memref.dim``). Static attentions have no ``symbols`` and only ints, as in version 1.

    Both forms share the op's fields (``batch``, ``sq``, ``sk``, ``d``, ``dv``, ``dtype``,
    ``causal_offset``, ``mask``, ``kv_groups``, ``scale``, ``mask_scale``, ``safe_softmax``; ``out_dtype``,
    ``mask_dtype`` and ``widened`` only where they differ from ``dtype``, ``dtype`` and false), ``block_q``,
    ``block_k``, ``level`` and ``operands`` (q, k, v, mask: base shape, batch factors (size, stride,
    inner), row and column strides). A ``"lanes"`` plan adds ``"form": "lanes"``, its register tile
    (``lanes``, ``q_vectors``, ``qk_keys``, ``pv_cols``), ``threads``, ``operands.o`` (the output's shape,
    written row-major), where Q·Kᵀ issues on a matrix unit, ``unit`` and ``p_dtype`` (P's dtype for
    P·V: the unit's operand dtype where P·V issues on it too, else f32), and ``"along": "keys"`` where one
    query's keys run along the lanes (absent: a block of queries does); a ``"scratchpad"`` plan (no
    ``form`` key) adds ``unit`` and ``space``."""
    op = plan.op
    common = {"version": DESCRIPTOR_VERSION, "batch": op.batch, "sq": op.sq, "sk": size_json(op.sk), "d": op.d,
              "dv": op.dv, **({"symbols": list(op.sk.symbols)} if isinstance(op.sk, Dim) else {}),
              "dtype": op.dtype, "causal_offset": op.causal_offset, "mask": op.mask, "kv_groups": op.kv_groups,
              "scale": ops.scale, "mask_scale": ops.mask_scale, "safe_softmax": op.safe_softmax}
    common.update({key: value for key, value, usual in (("out_dtype", op.out_dtype, op.dtype),
                                                         ("mask_dtype", op.mask_dtype, op.dtype),
                                                         ("widened", op.widened, False)) if value != usual})
    operands = {"q": _operand_json(ops.q, ops.q_shape), "k": _operand_json(ops.k, ops.k_shape),
                "v": _operand_json(ops.v, ops.v_shape), "mask": _operand_json(ops.mask, ops.mask_shape)}
    if plan.schedule == "lanes":
        return {**common, "form": "lanes", "lanes": plan.lanes, "q_vectors": plan.q_vectors,
                "block_q": plan.block_q, "block_k": plan.block_k, "qk_keys": plan.qk_keys, "pv_cols": plan.pv_cols,
                "threads": plan.threads, "level": plan.level,
                **({"unit": unit_json(plan.unit), "p_dtype": plan.p_dtype} if plan.unit is not None else {}),
                **({"along": "keys"} if plan.along == "keys" else {}),
                "operands": {**operands, "o": {"shape": [size_json(x) for x in ops.out_shape]}}}
    t = plan.tiles
    assert t is not None
    return {**common, "block_q": t.block_q, "block_k": t.block_k, "unit": unit_json(t.unit),
            "level": t.level, "space": t.space, "operands": operands}


def unit_json(u: UnitChoice | None) -> dict[str, Any] | None:
    """A descriptor's ``unit`` entry: the matrix unit's name, shape and dtypes (None: no unit)."""
    if u is None:
        return None
    return {"name": u.name, "m": u.m, "n": u.n, "k": u.k, "operand_dtype": u.operand_dtype,
            "accumulator_dtype": u.accumulator_dtype}


def unit_from_descriptor(raw: Mapping[str, Any] | None) -> UnitChoice | None:
    """The `UnitChoice` of a descriptor's ``unit`` entry (`unit_json`); ``KeyError``/``TypeError``/
    ``ValueError`` when malformed."""
    if raw is None:
        return None
    return UnitChoice(str(raw["name"]), int(raw["m"]), int(raw["n"]), int(raw["k"]), str(raw["operand_dtype"]),
                      str(raw["accumulator_dtype"]))


def _round_up(ix: Indices, v: ir.Value, multiple: int) -> ir.Value:
    if multiple == 1:
        return v
    q = arith.addi(v, ix.c(multiple - 1))
    q = arith.divui(q, ix.c(multiple))
    return ix.mul(q, multiple)


#: A size of a view: static (an int) or an index value.
_Size: TypeAlias = ir.Value | int
#: Builds a generic's scalar code from its block arguments; returns the values it yields.
_Body: TypeAlias = Callable[[Sequence[ir.Value]], Sequence[ir.Value]]


@dataclasses.dataclass(frozen=True)
class _Scalars:
    """The f32 scalars a work item's online softmax reads (`_Tiles.build` makes them once per kernel):
    0, -inf, the scale of Q·Kᵀ and the mask's (None without a mask)."""

    zero: ir.Value
    ninf: ir.Value
    scale: ir.Value
    mscale: ir.Value | None


@dataclasses.dataclass(frozen=True)
class _Item:
    """One work item's indices (`_Tiles.item`): its flat batch index ``beta``, its first query ``q0`` and
    its ``rows`` (``rows_u``: rounded up to the unit's m), where batch ``beta`` starts in Q, K and V."""

    beta: ir.Value
    q0: ir.Value
    rows: ir.Value
    rows_u: ir.Value
    qoff: ir.Value
    koff: ir.Value
    voff: ir.Value


@dataclasses.dataclass(frozen=True)
class _Keys:
    """One key block (`_Tiles.load_keys`): its first key ``j0`` and its ``cols`` keys (``cols_n`` and
    ``cols_k``: rounded up to the unit's n and k)."""

    j0: ir.Value
    cols: ir.Value
    cols_n: ir.Value
    cols_k: ir.Value


class _Tiles:
    """Builds one scratchpad attention kernel (see the module docstring)."""

    def __init__(self, plan: AttentionPlan, ops: KernelOperands) -> None:
        assert plan.tiles is not None
        self.plan, self.ops, self.t = plan, ops, plan.tiles
        self.op = plan.op
        self.dt = ops.dtype
        self.bufs: dict[str, ir.Value] = {}

    # -- types ----------------------------------------------------------------------------------------
    def buffer(self, name: str) -> tuple[str, tuple[int, ...], str]:
        for b in self.t.buffers:
            if b[0] == name:
                return b
        raise KeyError(name)

    def buf_type(self, name: str) -> ir.MemRefType:
        _, shape, dtype = self.buffer(name)
        return memref_t(shape, dtype, space=self.t.space)

    def view(self, name: str, offsets: list[ir.Value], sizes: list[_Size]) -> ir.Value:
        """``memref.subview`` of scratchpad buffer ``name`` (unit strides)."""
        ix = self.ix
        _, shape, dtype = self.buffer(name)
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        static_off = all(o == ix.c(0) for o in offsets)
        ty = memref_t([s if isinstance(s, int) else None for s in sizes], dtype, strides=strides,
                      offset=0 if static_off else None, space=self.t.space)
        dyn_off = ir.ShapedType.get_dynamic_stride_or_offset()
        dyn_size = ir.ShapedType.get_dynamic_size()
        offs = [o for o in offsets if o != ix.c(0)]
        return memref.SubViewOp(ty, self.bufs[name], offs, [s for s in sizes if not isinstance(s, int)], [],
                                [0 if o == ix.c(0) else dyn_off for o in offsets],
                                [s if isinstance(s, int) else dyn_size for s in sizes], [1] * len(sizes)).result

    def main_view(self, flat: ir.Value, offset: ir.Value, sizes: list[_Size], strides: tuple[int, int]) -> ir.Value:
        """A 2-D strided view of a flattened main-memory buffer."""
        ty = memref_t([s if isinstance(s, int) else None for s in sizes], self.dt, strides=strides, offset=None)
        dyn_size = ir.ShapedType.get_dynamic_size()
        return memref.ReinterpretCastOp(ty, flat, [offset], [s for s in sizes if not isinstance(s, int)], [],
                                        [ir.ShapedType.get_dynamic_stride_or_offset()],
                                        [s if isinstance(s, int) else dyn_size for s in sizes], list(strides)).result

    def dma(self, src: ir.Value, dst: ir.Value, direction: str) -> None:
        op = linalg.CopyOp([], [src], [dst])
        linalg.fill_builtin_region(op.operation)
        attrs.set_string(op, attrs.DMA, direction)

    def fill(self, value: ir.Value, name: str) -> None:
        op = linalg.FillOp([], [value], [self.bufs[name]])
        linalg.fill_builtin_region(op.operation)
        self.vector(op)

    def vector(self, op: ir.OpView) -> None:
        attrs.set_string(op, attrs.COMPUTE, "vector")

    def generic(self, ins: list[tuple[ir.Value, list[int]]], outs: list[tuple[ir.Value, list[int]]], loops: int,
                reductions: tuple[int, ...], body: _Body, unit: bool = False) -> None:
        """``linalg.generic`` over ``loops`` dims; ``ins``/``outs`` are (buffer, map results as loop
        numbers); ``body`` gets the block arguments (``x``: inputs, then ``y``: outputs)."""
        d = dims(loops)
        op = buffer_generic([(v, affine_map(loops, [d[i] for i in r])) for v, r in ins],
                            [(v, affine_map(loops, [d[i] for i in r])) for v, r in outs],
                            ["reduction" if i in reductions else "parallel" for i in range(loops)], body)
        u = self.t.unit
        if unit and u is not None:
            attrs.set_string(op, attrs.MATRIX_UNIT, u.name)
            attrs.set_string(op, attrs.UNIT_OPERAND, u.operand_dtype)
            attrs.set_string(op, attrs.UNIT_ACCUMULATOR, u.accumulator_dtype)
        else:
            self.vector(op)

    def mac(self, a: ir.Value, b: ir.Value, c: ir.Value, b_transposed: bool, unit: bool) -> None:
        """C += A · B (B read as (n, k) when ``b_transposed``), accumulating in C's dtype."""
        adt, cdt = ir.MemRefType(a.type).element_type, ir.MemRefType(c.type).element_type

        def body(x: Sequence[ir.Value]) -> list[ir.Value]:
            xa, xb = x[0], x[1]
            if adt != cdt:
                xa, xb = arith.extf(cdt, x[0]), arith.extf(cdt, x[1])
            return [arith.addf(x[2], arith.mulf(xa, xb))]

        self.generic([(a, [0, 2]), (b, [1, 2] if b_transposed else [2, 1])], [(c, [0, 1])], 3, (2,), body, unit)

    # -- the kernel -----------------------------------------------------------------------------------
    def build(self, name: str) -> func.FuncOp:
        t, ops, dt = self.t, self.ops, self.dt
        items, T = self.plan.work_items, self.plan.threads
        f32, et = ir.F32Type.get(), element_type(dt)

        names = ["Q", "K", "V"] + (["M"] if ops.mask is not None else []) + ["O"]
        shapes = [ops.q_shape, ops.k_shape, ops.v_shape] + ([ops.mask_shape] if ops.mask_shape else []) + [ops.out_shape]
        fn = func.FuncOp(name, ir.FunctionType.get([memref_t(s, dt) for s in shapes], []),  # type: ignore[arg-type]
                         visibility="private")
        attrs.set_data(fn, attrs.ATTENTION, descriptor(self.plan, ops))
        entry = fn.add_entry_block()
        ix = self.ix = Indices(entry)
        with ir.InsertionPoint(entry):
            flat = {}
            for nm, shape, arg in zip(names, shapes, entry.arguments):
                assert shape is not None
                flat[nm] = arg if len(shape) == 1 else memref.CollapseShapeOp(
                    memref_t([math.prod(static(x) for x in shape)], dt), arg,
                    reassociation([list(range(len(shape)))])).result
            zero_t = float_constant(0.0, et)
            zero = float_constant(0.0, f32)
            ninf = float_constant(-math.inf, f32)
            scale = float_constant(rounded(ops.scale), f32)
            mscale = float_constant(rounded(ops.mask_scale), f32) if ops.mask is not None else None

            par = T > 1
            forall = scf.ForallOp([0], [T], [1]) if par else None
            if forall is not None and self.plan.compute_level:
                attrs.set_string(forall, attrs.COMPUTE_LEVEL, self.plan.compute_level)
            with ir.InsertionPoint(forall.body) if forall is not None else ir.InsertionPoint(entry):
                tid = forall.body.arguments[0] if forall is not None else ix.c(0)
                i64 = ir.IntegerType.get_signless(64)
                for bname, _shape, _dtype in t.buffers:  # this core's scratchpad tiles
                    self.bufs[bname] = memref.AllocOp(self.buf_type(bname), [], [],
                                                      alignment=ir.IntegerAttr.get(i64, t.alignment)).result
                for bname in ("Qs", "Ks", "Vs"):  # zero padding (copies never write past d, dv, rows, cols)
                    self.fill(zero_t, bname)
                with loop(tid, ix.c(items), ix.c(T)) as work:
                    self.work_item(work.induction_variable, flat, zero, ninf, scale, mscale)
                # (the core's buffer-deallocation pipeline frees this core's tiles at the end of its body)
                if forall is not None:
                    scf.InParallelOp()
            func.ReturnOp([])
        ix.hoist()
        return fn

    def work_item(self, it: ir.Value, flat: dict[str, ir.Value], zero: ir.Value, ninf: ir.Value, scale: ir.Value,
                  mscale: ir.Value | None) -> None:
        """One (batch, query block) work item ``it``: Q's tile in, the key blocks, O's tile out."""
        ix, op, t = self.ix, self.op, self.t
        c0 = ix.c
        sc = _Scalars(zero, ninf, scale, mscale)
        w = self.item(it)

        # Q's tile, once per work item.
        q = self.ops.q
        qsrc = self.main_view(flat["Q"], ix.add(w.qoff, ix.mul(w.q0, static(q.row_stride))), [w.rows, op.d],
                              (static(q.row_stride), static(q.col_stride)))
        self.dma(qsrc, self.view("Qs", [c0(0), c0(0)], [w.rows, op.d]), f"{t.main_level}->{t.level}")
        self.fill(zero, "O")
        self.fill(ninf, "m")
        self.fill(zero, "l")

        if op.causal_offset is None:
            kend = c0(static(op.sk))  # the planner refuses a key length known at run time for this form
        else:
            qend = ix.min(ix.add(w.q0, c0(t.block_q)), c0(op.sq))
            kend = ix.min(ix.max(ix.add(qend, c0(op.causal_offset)), c0(0)), c0(static(op.sk)))
        with loop(c0(0), kend, c0(t.block_k)) as kloop:
            kb = self.load_keys(w, flat, kloop.induction_variable, kend)
            self.scores_product(w, kb, sc)
            sv = self.masked_scores(w, kb, sc)
            self.online_softmax(w, kb, sc, sv)
            self.values_product(w, kb)
        self.store_out(w, flat)

    def item(self, it: ir.Value) -> _Item:
        """Work item ``it``'s batch index, query block and operand offsets."""
        ix, t, ops = self.ix, self.t, self.ops
        u = t.unit
        nqb = self.plan.q_blocks
        c0 = ix.c
        beta = ix.divui(it, nqb)
        qb = ix.remui(it, nqb)
        q0 = ix.mul(qb, t.block_q)
        rows = ix.min(c0(t.block_q), ix.sub(c0(self.op.sq), q0))
        rows_u = _round_up(ix, rows, u.m if u else 1)
        qoff, koff, voff = batch_start(ix, beta, ops.q), batch_start(ix, beta, ops.k), batch_start(ix, beta, ops.v)
        return _Item(beta, q0, rows, rows_u, qoff, koff, voff)

    def load_keys(self, w: _Item, flat: dict[str, ir.Value], j0: ir.Value, kend: ir.Value) -> _Keys:
        """The key block at ``j0`` (ending at most at ``kend``): K's and V's tiles in (and the mask's)."""
        ix, t, ops, D, DV = self.ix, self.t, self.ops, self.op.d, self.op.dv
        u = t.unit
        into = f"{t.main_level}->{t.level}"
        c0 = ix.c
        cols = ix.min(c0(t.block_k), ix.sub(kend, j0))
        cols_n = _round_up(ix, cols, u.n if u else 1)
        cols_k = _round_up(ix, cols, u.k if u else 1)
        ksrc = self.main_view(flat["K"], ix.add(w.koff, ix.mul(j0, static(ops.k.row_stride))), [cols, D],
                              (static(ops.k.row_stride), static(ops.k.col_stride)))
        self.dma(ksrc, self.view("Ks", [c0(0), c0(0)], [cols, D]), into)
        vsrc = self.main_view(flat["V"], ix.add(w.voff, ix.mul(j0, static(ops.v.row_stride))), [cols, DV],
                              (static(ops.v.row_stride), static(ops.v.col_stride)))
        self.dma(vsrc, self.view("Vs", [c0(0), c0(0)], [cols, DV]), into)
        if ops.mask is not None:
            mrow, mcol = static(ops.mask.row_stride), static(ops.mask.col_stride)
            moff = ix.add(ix.add(batch_start(ix, w.beta, ops.mask), ix.mul(w.q0, mrow)), ix.mul(j0, mcol))
            msrc = self.main_view(flat["M"], moff, [w.rows, cols], (mrow, mcol))
            self.dma(msrc, self.view("Ms", [c0(0), c0(0)], [w.rows, cols]), into)
        return _Keys(j0, cols, cols_n, cols_k)

    def scores_product(self, w: _Item, kb: _Keys, sc: _Scalars) -> None:
        """S = Q · Kᵀ: on the unit, tile by tile, or one vector op."""
        c0, u, D, DP = self.ix.c, self.t.unit, self.op.d, self.t.d_padded
        self.fill(sc.zero, "S")
        if u is not None:
            with loop(c0(0), w.rows_u, c0(u.m)) as lm, loop(c0(0), kb.cols_n, c0(u.n)) as ln, \
                    loop(c0(0), c0(DP), c0(u.k)) as lk:
                mi, ni, ki = lm.induction_variable, ln.induction_variable, lk.induction_variable
                self.mac(self.view("Qs", [mi, ki], [u.m, u.k]), self.view("Ks", [ni, ki], [u.n, u.k]),
                         self.view("S", [mi, ni], [u.m, u.n]), True, True)
        else:
            self.mac(self.view("Qs", [c0(0), c0(0)], [w.rows, D]), self.view("Ks", [c0(0), c0(0)], [kb.cols, D]),
                     self.view("S", [c0(0), c0(0)], [w.rows, kb.cols]), True, False)

    def masked_scores(self, w: _Item, kb: _Keys, sc: _Scalars) -> ir.Value:
        """The scores scaled, plus the scaled mask, -inf where masked (keys past the block, padding rows of
        the mask, causal): in place on the ``rows_u x cols_k`` view of S the P·V step reads, returned."""
        c0, op, ops, dt = self.ix.c, self.op, self.ops, self.dt
        f32 = ir.F32Type.get()
        scale, mscale, zero, ninf = sc.scale, sc.mscale, sc.zero, sc.ninf
        rows, cols, q0, j0 = w.rows, kb.cols, w.q0, kb.j0
        # Online softmax over the rows_u x cols_k scores the P·V step reads.
        sv = self.view("S", [c0(0), c0(0)], [w.rows_u, kb.cols_k])
        ins: list[tuple[ir.Value, list[int]]] = []
        if ops.mask is not None:
            ins.append((self.view("Ms", [c0(0), c0(0)], [w.rows_u, kb.cols_k]), [0, 1]))
        causal = None if op.causal_offset is None else c0(op.causal_offset)

        def scores(x: Sequence[ir.Value]) -> list[ir.Value]:
            r, c = linalg.IndexOp(0).result, linalg.IndexOp(1).result
            y0 = x[-1]
            s = arith.mulf(y0, scale)
            if ops.mask is not None:
                assert mscale is not None
                mx = arith.extf(f32, x[0]) if dt != "f32" else x[0]
                s1 = arith.addf(s, arith.mulf(mx, mscale))
            else:
                s1 = arith.addf(s, zero)
            # Masked: keys past this block's end (padding), and causal j > i + offset.
            pad = arith.cmpi(arith.CmpIPredicate.uge, c, cols)
            if ops.mask is not None:  # padding rows of the mask tile were not copied
                pad1 = arith.ori(pad, arith.cmpi(arith.CmpIPredicate.uge, r, rows))
            else:
                pad1 = arith.ori(pad, pad)
            if causal is not None:
                j = arith.addi(j0, c)
                io = arith.addi(arith.addi(q0, r), causal)
                msk = arith.ori(pad1, arith.cmpi(arith.CmpIPredicate.sgt, j, io))
            else:
                msk = arith.ori(pad1, pad1)
            return [arith.select(msk, ninf, s1)]

        self.generic(ins, [(sv, [0, 1])], 2, (), scores)
        return sv

    def online_softmax(self, w: _Item, kb: _Keys, sc: _Scalars, sv: ir.Value) -> None:
        """The running maximum and sum updated with the scores ``sv``, P = exp(S - max) (rounded to the op's
        dtype as P), and O rescaled."""
        c0, dt, rows_u = self.ix.c, self.dt, w.rows_u
        et = element_type(dt)
        zero, ninf = sc.zero, sc.ninf
        mv = self.view("m", [c0(0)], [rows_u])
        mnv = self.view("mn", [c0(0)], [rows_u])
        alv = self.view("al", [c0(0)], [rows_u])
        lv = self.view("l", [c0(0)], [rows_u])
        self.generic([(mv, [0])], [(mnv, [0])], 1, (), lambda x: [x[0]])
        self.generic([(sv, [0, 1])], [(mnv, [0])], 2, (1,), lambda x: [arith.maximumf(x[0], x[1])])

        # al = 2^... = exp(m - mn) (0 while m is still -inf); l *= al; m = mn
        def rescale(x: Sequence[ir.Value]) -> list[ir.Value]:
            ex = math_d.exp(arith.subf(x[1], x[0]))
            first = arith.cmpf(arith.CmpFPredicate.OEQ, x[1], ninf)
            a = arith.select(first, zero, ex)
            return [x[0], a, arith.mulf(x[3], a)]

        self.generic([(mnv, [0])], [(mv, [0]), (alv, [0]), (lv, [0])], 1, (), rescale)

        # P = exp(S - mn) (0 where masked), l += Σ P
        outs = [(sv, [0, 1])]
        if dt != "f32":
            outs.append((self.view("P", [c0(0), c0(0)], [rows_u, kb.cols_k]), [0, 1]))

        def probabilities(x: Sequence[ir.Value]) -> list[ir.Value]:
            ex = math_d.exp(arith.subf(x[1], x[0]))
            dead = arith.cmpf(arith.CmpFPredicate.OEQ, x[1], ninf)
            p = arith.select(dead, zero, ex)
            return [p, arith.truncf(et, p)] if dt != "f32" else [p]

        self.generic([(mnv, [0])], outs, 2, (), probabilities)
        self.generic([(sv, [0, 1])], [(lv, [0])], 2, (1,), lambda x: [arith.addf(x[1], x[0])])
        # O *= al
        self.generic([(alv, [0])], [(self.view("O", [c0(0), c0(0)], [rows_u, self.t.dv_padded]), [0, 1])], 2, (),
                     lambda x: [arith.mulf(x[1], x[0])])

    def values_product(self, w: _Item, kb: _Keys) -> None:
        """O += P · V: on the unit, tile by tile, or one vector op."""
        c0, u, DV, DVP = self.ix.c, self.t.unit, self.op.dv, self.t.dv_padded
        pname = "P" if self.dt != "f32" else "S"
        if u is not None:
            with loop(c0(0), w.rows_u, c0(u.m)) as lm, loop(c0(0), c0(DVP), c0(u.n)) as ln, \
                    loop(c0(0), kb.cols_k, c0(u.k)) as lk:
                mi, ni, ki = lm.induction_variable, ln.induction_variable, lk.induction_variable
                self.mac(self.view(pname, [mi, ki], [u.m, u.k]), self.view("Vs", [ki, ni], [u.k, u.n]),
                         self.view("O", [mi, ni], [u.m, u.n]), False, True)
        else:
            self.mac(self.view(pname, [c0(0), c0(0)], [w.rows, kb.cols]),
                     self.view("Vs", [c0(0), c0(0)], [kb.cols, DV]),
                     self.view("O", [c0(0), c0(0)], [w.rows, DV]), False, False)

    def store_out(self, w: _Item, flat: dict[str, ir.Value]) -> None:
        """O / l, rounded to the output dtype, copied out."""
        ix, t, dt, SQ, DV, rows = self.ix, self.t, self.dt, self.op.sq, self.op.dv, w.rows
        c0, et = ix.c, element_type(dt)
        oname = "Oo" if dt != "f32" else "O"
        lfin = self.view("l", [c0(0)], [rows])
        ofin = self.view(oname, [c0(0), c0(0)], [rows, DV])
        if dt != "f32":
            ov = self.view("O", [c0(0), c0(0)], [rows, DV])
            self.generic([(ov, [0, 1]), (lfin, [0])], [(ofin, [0, 1])], 2, (),
                         lambda x: [arith.truncf(et, arith.divf(x[0], x[1]))])
        else:
            self.generic([(lfin, [0])], [(ofin, [0, 1])], 2, (), lambda x: [arith.divf(x[1], x[0])])
        ooff = ix.add(ix.mul(w.beta, SQ * DV), ix.mul(w.q0, DV))
        self.dma(ofin, self.main_view(flat["O"], ooff, [rows, DV], (DV, 1)), f"{t.level}->{t.main_level}")


def build_tiles_kernel(ip: ir.InsertionPoint, name: str, plan: AttentionPlan, ops: KernelOperands) -> func.FuncOp:
    """``@{name}(Q, K, V[, M], O)``: the scratchpad attention kernel of ``plan`` (see the module docstring),
    built at ``ip`` (in the current context and location)."""
    if plan.tiles is None:
        raise ValueError("build_tiles_kernel needs a plan with the scratchpad schedule")
    with ip:
        return _Tiles(plan, ops).build(name)


__all__ = ["DESCRIPTOR_VERSION", "KernelOperands", "ScratchpadTiles", "batch_start", "build_tiles_kernel",
           "descriptor", "rounded"]
