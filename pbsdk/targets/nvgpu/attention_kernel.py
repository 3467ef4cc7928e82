"""The fused attention kernel an `AttentionMapping` describes, in the ``schedule`` stage's form, built op by
op with the bindings' builders (``mlir.dialects.func/scf/memref/linalg/vector/arith/math``).

One function ``@name(Q, K, V[, M], O)`` on the operands' base buffers, whose body is a
``#gpu.block`` forall over (query block, flat batch) holding, in order (see `attention.py` for the
algorithm):

1. all threads (``#gpu.thread<linear_dim_0>``): the Q tile into shared memory, O := 0, m := -inf, l := 0;
2. a loop over the key tiles the block visits (causal: up to its diagonal), each step being
   a. all threads: the K and V tiles into shared memory (zero-padded; 16-byte vector loads where the
      mapping allows), S := 0;
   b. S += Q·Kᵀ — per warp (``#gpu.warp``) one call of a matrix-unit function on its 16-row strip, or per
      thread a small ``linalg.matmul``;
   c. ``row_threads`` threads per query row: scale and mask S in place and take partial maxima; then the
      new maximum m, ``P = exp(S - m)`` rounded to the dtype and partial sums;
   d. all threads: O *= exp(m_old - m_new) per row; l and m updated;
   e. O += P·V, as in b;
3. all threads: ``O / l`` stored to the output, inside ``sq`` only.

The upstream thread mapping puts a barrier after each thread/warp loop, which is what separates these
steps on the GPU; the host emulation runs them in order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from mlir import ir
from mlir.dialects import arith, func, linalg, memref, scf, vector
from mlir.dialects import math as math_d

from pbsdk.core.ir import attributes as attrs
from pbsdk.core.ir.builder import Indices, element_type, float_constant, loop, reassociation
from pbsdk.targets.nvgpu.attention import SIMT_THREADS, AttentionMapping
from pbsdk.targets.nvgpu.build import (
    LINEAR,
    forall,
    if_else,
    in_forall,
    mapping_attr,
    smem_type,
    subview,
    transposed_b_maps,
    view_type,
)


def mma_types(dtype: str, k: int, n: int, pitches: tuple[int, int, int] | None = None,
              b_transposed: bool = False) -> tuple[ir.MemRefType, ir.MemRefType, ir.MemRefType]:
    """The operand types of one warp's strip ``C (16 x n, f32) += A (16 x k) · B (k x n)``: views of shared
    tiles whose rows are ``pitches`` (A, B, C) elements apart (default: unpadded); B given as Bᵀ (n x k)
    when ``b_transposed``. Built in the current context."""
    pa, pb, pc = pitches or (k, k if b_transposed else n, n)
    rows, cols = (n, k) if b_transposed else (k, n)
    elem = element_type(dtype)
    return (view_type(16, k, pa, elem), view_type(rows, cols, pb, elem, offset=False),
            view_type(16, n, pc, ir.F32Type.get()))


def mma_name(dtype: str, k: int, n: int, pitches: tuple[int, int, int], b_transposed: bool = False) -> str:
    return (f"__pbsdk_mma_attn_m16n8k16_{dtype}_f32_strip_k{k}_n{n}{'_bt' if b_transposed else ''}"
            f"_p{'x'.join(map(str, pitches))}")


def mma_function(unit: str, dtype: str, k: int, n: int, pitches: tuple[int, int, int],
                 b_transposed: bool = False) -> func.FuncOp:
    """The warp's strip as one ``linalg.matmul``, built at the current insertion point (the host body;
    ``map-gpu`` swaps in n/8 x k/16 ``mma.sync`` steps with each accumulator fragment kept in registers
    across k)."""
    ta, tb, tc = mma_types(dtype, k, n, pitches, b_transposed)
    fn = func.FuncOp(mma_name(dtype, k, n, pitches, b_transposed), ir.FunctionType.get([ta, tb, tc], []),
                     visibility="private")
    attrs.set_string(fn.operation, attrs.MATRIX_UNIT, unit)
    if b_transposed:
        attrs.set_unit(fn.operation, attrs.B_TRANSPOSED)
    with ir.InsertionPoint(fn.add_entry_block()):
        a, b, c = fn.arguments
        linalg.matmul(a, b, outs=[c], indexing_maps=transposed_b_maps() if b_transposed else None)
        func.ReturnOp([])
    return fn


def strips(am: AttentionMapping) -> tuple[tuple[int, int, tuple[int, int, int], bool], ...]:
    """(k, n, pitches, B transposed) of the two matmuls: S += Q·Kᵀ (B is the K tile), then O += P·V."""
    return ((am.d_pad, am.block_k, (am.pitch("sq"), am.pitch("sk"), am.pitch("ss")), True),
            (am.block_k, am.dv_pad, (am.pitch("sp"), am.pitch("sv"), am.pitch("so")), False))


def mma_steps(am: AttentionMapping) -> dict[str, Callable[[], func.FuncOp]]:
    """The matrix-unit functions the kernel calls, by name, each as a builder of its ``func.func`` at the
    current insertion point (none on the SIMT path)."""
    if am.compute != "mma":
        return {}
    return {mma_name(am.dtype, k, n, p, bt): functools.partial(mma_function, am.unit, am.dtype, k, n, p, bt)
            for k, n, p, bt in strips(am)}


class _Index(Indices):
    """`Indices` plus the unsigned comparison the kernel's bounds checks use."""

    def lt(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.cmpi(arith.CmpIPredicate.ult, a, b)


def build_kernel(am: AttentionMapping, name: str, types: Sequence[ir.Type]) -> func.FuncOp:
    """The kernel as one private function of the call's operands (``types`` as on the call), built with
    the bindings' builders at the current insertion point."""
    d = am.desc
    T, BQ, BK, DP, DVP = am.dtype, am.block_q, am.block_k, am.d_pad, am.dv_pad
    NT = am.threads
    f32 = ir.F32Type.get()
    et = element_type(T)
    names = ["Q", "K", "V"] + (["M"] if d.mask else []) + ["O"]
    layouts = {"Q": d.q, "K": d.k, "V": d.v, "M": d.m}
    fn = func.FuncOp(name, ir.FunctionType.get(list(types), []), visibility="private")
    entry = fn.add_entry_block()
    e = _Index(entry)
    args = dict(zip(names, entry.arguments))
    with ir.InsertionPoint(entry):
        zf = float_constant(0.0, f32)
        ninf = float_constant(-math.inf, f32)
        zt = float_constant(0.0, et)
        scale = float_constant(d.scale, f32)
        mscale = float_constant(d.mask_scale, f32)
        gq, gb = am.grid
        outer = forall([gq, gb], mapping_attr("#gpu.block<y>", "#gpu.block<x>"))
        qb, beta = outer.body.arguments
        with ir.InsertionPoint(outer.body):
            # Flat views of the operands (identity-layout bases).
            flat: dict[str, ir.Value] = {}
            ft: dict[str, ir.MemRefType] = {}
            for n, t in zip(names, types):
                shape = ir.MemRefType(t).shape
                ft[n] = ir.MemRefType.get([math.prod(shape)], et)
                if len(shape) == 1:
                    flat[n] = args[n]
                else:
                    flat[n] = memref.collapse_shape(ft[n], args[n], reassociation([list(range(len(shape)))]))
            base = {n: batch_offset(e, beta, layouts[n]) for n in names if n != "O"}
            i0 = e.mul(qb, BQ)
            # shared tiles, rows padded to am.pitch(...) elements (bank conflicts); indices below are logical
            sq_t, sk_t = smem_type((BQ, am.pitch("sq")), et), smem_type((BK, am.pitch("sk")), et)
            sv_t = smem_type((BK, am.pitch("sv")), et)
            ss_t, sp_t = smem_type((BQ, am.pitch("ss")), f32), smem_type((BQ, am.pitch("sp")), et)
            so_t, row_t = smem_type((BQ, am.pitch("so")), f32), smem_type((BQ,), f32)
            part_t = smem_type((am.row_threads, BQ), f32)
            tiles = {"sq": sq_t, "sk": sk_t, "sv": sv_t, "ss": ss_t, "sp": sp_t, "so": so_t, "sm": row_t,
                     "sl": row_t, "sa": row_t, "smn": row_t, "spm": part_t, "spl": part_t}
            i64 = ir.IntegerType.get_signless(64)
            s = {tile: memref.alloc(ty, [], [], alignment=ir.IntegerAttr.get(i64, 16)) for tile, ty in tiles.items()}

            def load(opnd: str, r: ir.Value, c: ir.Value) -> ir.Value:
                """operand[base + r*row_stride + c*col_stride] (global memory)."""
                lay = layouts[opnd]
                assert lay is not None
                idx = e.add(e.add(base[opnd], e.mul(r, lay.row_stride)), e.mul(c, lay.col_stride))
                return memref.load(flat[opnd], [idx])

            @contextmanager
            def strided_loop(count: int, cols: int, tid: ir.Value) -> Iterator[tuple[ir.Value, ir.Value]]:
                """`scf.for` over elements tid, tid+NT, ... of a (count/cols) x cols tile; yields (row, col)."""
                with loop(tid, e.c(count), e.c(NT)) as lp:
                    ev = lp.induction_variable
                    yield arith.divui(ev, e.c(cols)), arith.remui(ev, e.c(cols))

            def guarded_load(opnd: str, cond: ir.Value, r: ir.Value, c: ir.Value) -> ir.Value:
                return if_else(cond, et, lambda: load(opnd, r, c), zt)

            zv: ir.Value | None = None

            def stage(tid: ir.Value, opnd: str, row0: ir.Value, rows: int, limit: int, cols: int, padded: int,
                      vw: int, dst: str) -> None:
                """Rows row0 .. row0+rows of an operand (cols wide) into a shared tile (padded wide), zero
                beyond ``limit`` rows and ``cols`` columns; ``vw`` elements per load."""
                if vw == 1:
                    with strided_loop(rows * padded, padded, tid) as (r, c):
                        g = e.add(row0, r)
                        inb = arith.andi(e.lt(g, e.c(limit)), e.lt(c, e.c(cols))) if padded != cols \
                            else e.lt(g, e.c(limit))
                        v = guarded_load(opnd, inb, g, c)
                        memref.store(v, s[dst], [r, c])
                    return
                vt = ir.VectorType.get([vw], et)
                with strided_loop(rows * (cols // vw), cols // vw, tid) as (r, cv):
                    c = e.mul(cv, vw)
                    g = e.add(row0, r)
                    lay = layouts[opnd]
                    assert lay is not None and zv is not None

                    def vload() -> ir.Value:
                        idx = e.add(e.add(base[opnd], e.mul(g, lay.row_stride)), c)
                        return vector.load(vt, flat[opnd], [idx], alignment=16)

                    v = if_else(e.lt(g, e.c(limit)), vt, vload, zv)
                    vector.store(v, s[dst], [r, c], alignment=16)

            if max(am.vec_q, am.vec_k, am.vec_v) > 1:
                zvt = ir.VectorType.get([max(am.vec_q, am.vec_k, am.vec_v)], et)
                zv = arith.constant(zvt, ir.DenseElementsAttr.get_splat(zvt, ir.FloatAttr.get(et, 0.0)))
            # 1. Q tile, O = 0, m = -inf, l = 0.
            with in_forall([NT], *LINEAR) as (t,):
                stage(t, "Q", i0, BQ, d.sq, d.d, DP, am.vec_q, "sq")
                with strided_loop(BQ * DVP, DVP, t) as (r, c):
                    memref.store(zf, s["so"], [r, c])
                with loop(t, e.c(BQ), e.c(NT)) as lp:
                    memref.store(ninf, s["sm"], [lp.induction_variable])
                    memref.store(zf, s["sl"], [lp.induction_variable])

            # 2. The key tiles this block visits.
            if d.causal_offset is None:
                n_tiles = e.c(am.k_tiles)
            else:
                # last row's reach: min(i0 + BQ, sq) - 1 + off + 1 keys, in whole tiles, at most k_tiles
                last = arith.minui(e.add(i0, e.c(BQ)), e.c(d.sq))
                reach = arith.addi(last, e.c(d.causal_offset)) if d.causal_offset >= 0 \
                    else arith.subi(last, e.c(-d.causal_offset))
                # (a negative reach cannot occur for offset >= 0; clamp through a signed max for the general case)
                reach = arith.maxsi(reach, e.c(0))
                tiles_needed = arith.ceildivui(reach, e.c(BK))
                n_tiles = arith.minui(tiles_needed, e.c(am.k_tiles))
            with loop(e.c(0), n_tiles, e.c(1)) as key_loop:
                j0 = e.mul(key_loop.induction_variable, BK)
                # a. K and V tiles (reads along d / dv are consecutive in memory when col_stride is 1), S = 0.
                with in_forall([NT], *LINEAR) as (t,):
                    stage(t, "K", j0, BK, d.sk, d.d, DP, am.vec_k, "sk")
                    stage(t, "V", j0, BK, d.sk, d.dv, DVP, am.vec_v, "sv")
                    with strided_loop(BQ * BK, BK, t) as (r, c):
                        memref.store(zf, s["ss"], [r, c])

                def matmul_step(a: str, b: str, acc: str, n: int, k: int, tn: int,
                                pitches: tuple[int, int, int], bt: bool) -> None:
                    """acc (BQ x n) += a (BQ x k) · b (k x n; given as bᵀ, n x k, when ``bt``) on the shared
                    tiles, whose rows are ``pitches`` apart."""
                    if am.compute == "mma":
                        ta, tb, tc = mma_types(T, k, n, pitches, bt)
                        with in_forall([am.warps], "#gpu.warp<linear_dim_0>") as (w,):
                            r0 = e.mul(w, 16)
                            av = subview(s[a], [r0, 0], [16, k], ta)
                            rows, cols = (n, k) if bt else (k, n)
                            bv = subview(s[b], [0, 0], [rows, cols], tb)
                            cv = subview(s[acc], [r0, 0], [16, n], tc)
                            func.CallOp([], mma_name(T, k, n, pitches, bt), [av, bv, cv])
                    else:
                        ty, tx = SIMT_THREADS
                        pa, pb, pc = pitches
                        va, vc = view_type(am.tm, k, pa, et), view_type(am.tm, tn, pc, f32)
                        vb = view_type(tn, k, pb, et) if bt else view_type(k, tn, pb, et)
                        with in_forall([ty, tx], "#gpu.thread<linear_dim_1>", "#gpu.thread<linear_dim_0>") \
                                as (y, x):
                            rr, qq = e.mul(y, am.tm), e.mul(x, tn)
                            av = subview(s[a], [rr, 0], [am.tm, k], va)
                            bv = subview(s[b], [qq, 0], [tn, k], vb) if bt else subview(s[b], [0, qq], [k, tn], vb)
                            cv = subview(s[acc], [rr, qq], [am.tm, tn], vc)
                            linalg.matmul(av, bv, outs=[cv], indexing_maps=transposed_b_maps() if bt else None)

                # b. S += Q·Kᵀ
                (_, _, s_pitches, _), (_, _, o_pitches, _) = strips(am)
                matmul_step("sq", "sk", "ss", BK, DP, am.tn_s, s_pitches, True)

                # c. The online-softmax update, P threads per query row (thread t: row t / P, keys
                # j = t % P + P * jj).
                P = am.row_threads

                def row_part(t: ir.Value) -> tuple[ir.Value, ir.Value]:
                    if P == 1:
                        return t, e.c(0)
                    return arith.divui(t, e.c(P)), arith.remui(t, e.c(P))

                def key(jj: ir.Value, part: ir.Value) -> ir.Value:
                    return e.add(e.mul(jj, P), part) if P > 1 else jj

                # c1. scale and mask the scores in place; each thread's maximum over its keys
                with in_forall([BQ * P], *LINEAR) as (t,):
                    row, part = row_part(t)
                    gi = e.add(i0, row)
                    row_in = e.lt(gi, e.c(d.sq))
                    with loop(e.c(0), e.c(BK // P), e.c(1), [ninf]) as lp:
                        macc = lp.inner_iter_args[0]
                        j = key(lp.induction_variable, part)
                        gj = e.add(j0, j)
                        sv = memref.load(s["ss"], [row, j])
                        x = arith.mulf(sv, scale)
                        valid = e.lt(gj, e.c(d.sk))
                        if d.mask:
                            mv = guarded_load("M", arith.andi(row_in, valid), gi, gj)
                            mf = mv if T == "f32" else arith.extf(f32, mv)
                            x = arith.addf(x, arith.mulf(mf, mscale))
                        if d.causal_offset is not None:
                            # key j is masked for query i when j > i + offset (lane by lane on the diagonal tiles)
                            lim = arith.addi(gi, e.c(d.causal_offset)) if d.causal_offset >= 0 \
                                else arith.subi(gi, e.c(-d.causal_offset))
                            seen = arith.cmpi(arith.CmpIPredicate.sle, gj, lim)
                            valid = arith.andi(valid, seen)
                        x = arith.select(valid, x, ninf)
                        memref.store(x, s["ss"], [row, j])
                        scf.YieldOp([arith.maximumf(macc, x)])
                    memref.store(lp.results[0], s["spm"], [part, row])

                # c2. the row's new maximum; P = exp(S - m) rounded to the dtype; each thread's sum of
                # what it wrote
                with in_forall([BQ * P], *LINEAR) as (t,):
                    row, part = row_part(t)
                    mold = memref.load(s["sm"], [row])
                    mnew = mold
                    for q in range(P):
                        mnew = arith.maximumf(mnew, memref.load(s["spm"], [e.c(q), row]))
                    # a row with every key so far masked keeps m = -inf; subtracting 0 then gives p = 0
                    # and alpha = 0
                    dead = arith.cmpf(arith.CmpFPredicate.OEQ, mnew, ninf)
                    muse = arith.select(dead, zf, mnew)
                    with loop(e.c(0), e.c(BK // P), e.c(1), [zf]) as lp:
                        lacc = lp.inner_iter_args[0]
                        j = key(lp.induction_variable, part)
                        sv = memref.load(s["ss"], [row, j])
                        pv = math_d.exp(arith.subf(sv, muse))
                        if T != "f32":  # P is what the second matmul reads: round it, sum what it reads
                            pt = arith.truncf(et, pv)
                            pv = arith.extf(f32, pt)
                        else:
                            pt = pv
                        memref.store(pt, s["sp"], [row, j])
                        scf.YieldOp([arith.addf(lacc, pv)])
                    memref.store(lp.results[0], s["spl"], [part, row])
                    first = arith.cmpi(arith.CmpIPredicate.eq, part, e.c(0))
                    if_first = scf.IfOp(first)
                    with ir.InsertionPoint(if_first.then_block):
                        alpha = math_d.exp(arith.subf(mold, muse))
                        memref.store(alpha, s["sa"], [row])
                        memref.store(mnew, s["smn"], [row])
                        scf.YieldOp([])

                # d. O *= alpha per row (all threads); l = l * alpha + the row's sums, m = the new maximum
                with in_forall([NT], *LINEAR) as (t,):
                    with strided_loop(BQ * DVP, DVP, t) as (r, c):
                        o = memref.load(s["so"], [r, c])
                        a = memref.load(s["sa"], [r])
                        memref.store(arith.mulf(o, a), s["so"], [r, c])
                    with loop(t, e.c(BQ), e.c(NT)) as lp:
                        ev = lp.induction_variable
                        lo = memref.load(s["sl"], [ev])
                        lv = arith.mulf(lo, memref.load(s["sa"], [ev]))
                        for q in range(P):
                            lv = arith.addf(lv, memref.load(s["spl"], [e.c(q), ev]))
                        memref.store(lv, s["sl"], [ev])
                        memref.store(memref.load(s["smn"], [ev]), s["sm"], [ev])

                # e. O += P·V
                matmul_step("sp", "sv", "so", DVP, BK, am.tn_o, o_pitches, False)

            # 3. O / l to the output (row-major (batch, sq, dv)), rows inside sq only.
            with in_forall([NT], *LINEAR) as (t,), strided_loop(BQ * DVP, DVP, t) as (r, c):
                gi = e.add(i0, r)
                inb = arith.andi(e.lt(gi, e.c(d.sq)), e.lt(c, e.c(d.dv))) if DVP != d.dv \
                        else e.lt(gi, e.c(d.sq))
                if_in = scf.IfOp(inb)
                with ir.InsertionPoint(if_in.then_block):
                    o = memref.load(s["so"], [r, c])
                    lv = memref.load(s["sl"], [r])
                    y = arith.divf(o, lv)
                    if T != "f32":
                        y = arith.truncf(et, y)
                    row = e.add(e.mul(beta, d.sq), gi)
                    idx = e.add(e.mul(row, d.dv), c)
                    memref.store(y, flat["O"], [idx])
                    scf.YieldOp([])
            for tile in tiles:
                memref.dealloc(s[tile])
            scf.InParallelOp()
        func.ReturnOp([])
    e.hoist()
    return fn


def batch_offset(e: Indices, beta: ir.Value, opnd: Any) -> ir.Value:
    """Σ_f ((β / inner_f) % size_f) * stride_f: where flat batch index ``beta`` starts in an operand
    (anything with `Operand`'s ``batch`` factors), built with ``e`` at the current insertion point."""
    total = e.c(0)
    for size, stride, inner in opnd.batch:
        if stride == 0 or size == 1:
            continue
        idx = beta if inner == 1 else arith.divui(beta, e.c(inner))
        idx = arith.remui(idx, e.c(size))
        total = e.add(total, e.mul(idx, stride))
    return total
