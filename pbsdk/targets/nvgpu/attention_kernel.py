"""The fused attention kernel an `AttentionMapping` describes, as MLIR text in the ``schedule`` stage's form.

One function ``@name(%Q0, %K0, %V0[, %M0], %O0)`` on the operands' base buffers, whose body is a
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

import math
import struct

from pbsdk.core.ir import attributes as attrs
from pbsdk.targets.nvgpu.attention import SIMT_THREADS, AttentionMapping
from pbsdk.targets.nvgpu.index_text import IndexText, batch_offset

WS = "#gpu.address_space<workgroup>"
LINEAR = "[#gpu.thread<linear_dim_0>]"


def _f32(v: float) -> str:
    """An exact f32 literal (hex bit pattern)."""
    return f"0x{struct.unpack('<I', struct.pack('<f', v))[0]:08X}"


def _smem(shape: tuple[int, ...], dtype: str) -> str:
    return f"memref<{'x'.join(map(str, shape))}x{dtype}, {WS}>"


def _view(rows: int, cols: int, stride: int, dtype: str) -> str:
    return f"memref<{rows}x{cols}x{dtype}, strided<[{stride}, 1], offset: ?>, {WS}>"


#: ``linalg.matmul`` maps for C[m, n] += A[m, k] · Bᵀ[n, k] (B given as its transpose, e.g. the K tile).
TRANSPOSED_B = ("indexing_maps = [affine_map<(m, n, k) -> (m, k)>, affine_map<(m, n, k) -> (n, k)>, "
                "affine_map<(m, n, k) -> (m, n)>] ")


def mma_types(dtype: str, k: int, n: int, pitches: tuple[int, int, int] | None = None,
              b_transposed: bool = False) -> tuple[str, str, str]:
    """The operand types of one warp's strip ``C (16 x n, f32) += A (16 x k) · B (k x n)``: views of shared
    tiles whose rows are ``pitches`` (A, B, C) elements apart (default: unpadded); B given as Bᵀ (n x k)
    when ``b_transposed``."""
    pa, pb, pc = pitches or (k, k if b_transposed else n, n)
    rows, cols = (n, k) if b_transposed else (k, n)
    tb = f"memref<{rows}x{cols}x{dtype}, strided<[{pb}, 1]>, {WS}>"
    return _view(16, k, pa, dtype), tb, _view(16, n, pc, "f32")


def mma_name(dtype: str, k: int, n: int, pitches: tuple[int, int, int], b_transposed: bool = False) -> str:
    return (f"__pbsdk_mma_attn_m16n8k16_{dtype}_f32_strip_k{k}_n{n}{'_bt' if b_transposed else ''}"
            f"_p{'x'.join(map(str, pitches))}")


def mma_function(unit: str, dtype: str, k: int, n: int, pitches: tuple[int, int, int],
                 b_transposed: bool = False) -> str:
    """The warp's strip as one ``linalg.matmul`` (the host body; ``map-gpu`` swaps in n/8 x k/16
    ``mma.sync`` steps with each accumulator fragment kept in registers across k)."""
    ta, tb, tc = mma_types(dtype, k, n, pitches, b_transposed)
    marks = f"{attrs.MATRIX_UNIT} = \"{unit}\"" + (f", {attrs.B_TRANSPOSED}" if b_transposed else "")
    maps = TRANSPOSED_B if b_transposed else ""
    return (f"func.func private @{mma_name(dtype, k, n, pitches, b_transposed)}(%a: {ta}, %b: {tb}, %c: {tc}) "
            f"attributes {{{marks}}} {{\n"
            f"  linalg.matmul {maps}ins(%a, %b : {ta}, {tb}) outs(%c : {tc})\n  return\n}}")


def strips(am: AttentionMapping) -> tuple[tuple[int, int, tuple[int, int, int], bool], ...]:
    """(k, n, pitches, B transposed) of the two matmuls: S += Q·Kᵀ (B is the K tile), then O += P·V."""
    return ((am.d_pad, am.block_k, (am.pitch("sq"), am.pitch("sk"), am.pitch("ss")), True),
            (am.block_k, am.dv_pad, (am.pitch("sp"), am.pitch("sv"), am.pitch("so")), False))


def mma_steps(am: AttentionMapping) -> dict[str, str]:
    """The matrix-unit functions the kernel calls, by name (none on the SIMT path)."""
    if am.compute != "mma":
        return {}
    return {mma_name(am.dtype, k, n, p, bt): mma_function(am.unit, am.dtype, k, n, p, bt) for k, n, p, bt in strips(am)}


def kernel_text(am: AttentionMapping, name: str, types: tuple[str, ...]) -> str:
    """The kernel as one function of the call's operands (types as they appear on the call)."""
    d = am.desc
    T, BQ, BK, DP, DVP = am.dtype, am.block_q, am.block_k, am.d_pad, am.dv_pad
    NT = am.threads
    e = IndexText()
    names = ["Q", "K", "V"] + (["M"] if d.mask else []) + ["O"]
    layouts = {"Q": d.q, "K": d.k, "V": d.v, "M": d.m}
    args = ", ".join(f"%{n}0: {t}" for n, t in zip(names, types))
    e.depth = 0
    e(f"func.func private @{name}({args}) {{")
    e.depth = 1
    body_start = len(e.lines)
    e(f"%zf = arith.constant {_f32(0.0)} : f32")
    e(f"%ninf = arith.constant {_f32(-math.inf)} : f32")
    e(f"%zt = arith.constant 0.0 : {T}")
    e(f"%scale = arith.constant {_f32(d.scale)} : f32")
    e(f"%mscale = arith.constant {_f32(d.mask_scale)} : f32")
    gq, gb = am.grid
    e.open(f"scf.forall (%qb, %beta) in ({gq}, {gb}) {{")
    # Flat views of the operands (identity-layout bases).
    flat: dict[str, str] = {}
    for n, t in zip(names, types):
        dims = t[len("memref<"):].split("x")[:-1]
        size = math.prod(int(s) for s in dims) if dims else 1
        if len(dims) == 1:
            flat[n] = f"%{n}0"
        else:
            flat[n] = e.op(n.lower(), f"memref.collapse_shape %{n}0 [[{', '.join(map(str, range(len(dims))))}]] : "
                                      f"{t} into memref<{size}x{T}>")
    ft = {n: f"memref<{math.prod(int(s) for s in t[len('memref<'):].split('x')[:-1])}x{T}>"
          for n, t in zip(names, types)}
    base = {n: batch_offset(e, "%beta", layouts[n]) for n in names if n != "O"}  # type: ignore[arg-type]
    i0 = e.mul("%qb", BQ)
    # shared tiles, rows padded to am.pitch(...) elements (bank conflicts); indices below are logical
    sq_t, sk_t, sv_t = _smem((BQ, am.pitch("sq")), T), _smem((BK, am.pitch("sk")), T), _smem((BK, am.pitch("sv")), T)
    ss_t, sp_t = _smem((BQ, am.pitch("ss")), "f32"), _smem((BQ, am.pitch("sp")), T)
    so_t, row_t = _smem((BQ, am.pitch("so")), "f32"), _smem((BQ,), "f32")
    part_t = _smem((am.row_threads, BQ), "f32")
    tiles = {"sq": sq_t, "sk": sk_t, "sv": sv_t, "ss": ss_t, "sp": sp_t, "so": so_t, "sm": row_t, "sl": row_t,
             "sa": row_t, "smn": row_t, "spm": part_t, "spl": part_t}
    for tile, ty in tiles.items():
        e(f"%{tile} = memref.alloc() {{alignment = 16 : i64}} : {ty}")

    def load(opnd: str, r: str, c: str) -> str:
        """operand[base + r*row_stride + c*col_stride] (global memory)."""
        lay = layouts[opnd]
        assert lay is not None
        idx = e.add(e.add(base[opnd], e.mul(r, lay.row_stride)), e.mul(c, lay.col_stride))
        return e.op("g", f"memref.load {flat[opnd]}[{idx}] : {ft[opnd]}")

    def strided_loop(count: int, cols: int, tid: str = "%t") -> tuple[str, str]:
        """`scf.for` over elements tid, tid+NT, ... of a (count/cols) x cols tile; returns (row, col)."""
        ev = e.fresh("e")
        e.open(f"scf.for {ev} = {tid} to {e.c(count)} step {e.c(NT)} {{")
        return (e.op("r", f"arith.divui {ev}, {e.c(cols)} : index"),
                e.op("q", f"arith.remui {ev}, {e.c(cols)} : index"))

    def guarded_load(opnd: str, cond: str, r: str, c: str, etype: str, zero: str) -> str:
        v = e.fresh("x")
        e.open(f"{v} = scf.if {cond} -> ({etype}) {{")
        e(f"scf.yield {load(opnd, r, c)} : {etype}")
        e.close("} else {")
        e.depth += 1
        e(f"scf.yield {zero} : {etype}")
        e.close()
        return v

    def and_(a: str, b: str) -> str:
        return e.op("and", f"arith.andi {a}, {b} : i1")

    def stage(opnd: str, row0: str, rows: int, limit: int, cols: int, padded: int, vw: int, dst: str, dst_t: str,
              transpose: bool) -> None:
        """Rows row0 .. row0+rows of an operand (cols wide) into a shared tile (padded wide; transposed:
        stored [col, row]), zero beyond ``limit`` rows and ``cols`` columns; ``vw`` elements per load."""
        if vw == 1:
            r, c = strided_loop(rows * padded, padded)
            g = e.add(row0, r)
            inb = and_(e.lt(g, e.c(limit)), e.lt(c, e.c(cols))) if padded != cols else e.lt(g, e.c(limit))
            v = guarded_load(opnd, inb, g, c, T, "%zt")
            e(f"memref.store {v}, {dst}[{c}, {r}] : {dst_t}" if transpose else f"memref.store {v}, {dst}[{r}, {c}] : {dst_t}")
            e.close()
            return
        vt = f"vector<{vw}x{T}>"
        r, cv = strided_loop(rows * (cols // vw), cols // vw)
        c = e.mul(cv, vw)
        g = e.add(row0, r)
        lay = layouts[opnd]
        assert lay is not None
        v = e.fresh("xv")
        e.open(f"{v} = scf.if {e.lt(g, e.c(limit))} -> ({vt}) {{")
        idx = e.add(e.add(base[opnd], e.mul(g, lay.row_stride)), c)
        e(f"scf.yield {e.op('gv', f'vector.load {flat[opnd]}[{idx}] {{alignment = 16 : i64}} : {ft[opnd]}, {vt}')} : {vt}")
        e.close("} else {")
        e.depth += 1
        e(f"scf.yield %zv : {vt}")
        e.close()
        if transpose:
            for i in range(vw):
                x = e.op("xe", f"vector.extract {v}[{i}] : {T} from {vt}")
                e(f"memref.store {x}, {dst}[{e.add(c, e.c(i))}, {r}] : {dst_t}")
        else:
            e(f"vector.store {v}, {dst}[{r}, {c}] {{alignment = 16 : i64}} : {dst_t}, {vt}")
        e.close()

    if max(am.vec_q, am.vec_k, am.vec_v) > 1:
        e(f"%zv = arith.constant dense<0.0> : vector<{max(am.vec_q, am.vec_k, am.vec_v)}x{T}>")
    # 1. Q tile, O = 0, m = -inf, l = 0.
    e.open(f"scf.forall (%t) in ({NT}) {{")
    stage("Q", i0, BQ, d.sq, d.d, DP, am.vec_q, "%sq", sq_t, False)
    r, c = strided_loop(BQ * DVP, DVP)
    e(f"memref.store %zf, %so[{r}, {c}] : {so_t}")
    e.close()
    ev = e.fresh("e")
    e.open(f"scf.for {ev} = %t to {e.c(BQ)} step {e.c(NT)} {{")
    e(f"memref.store %ninf, %sm[{ev}] : {row_t}")
    e(f"memref.store %zf, %sl[{ev}] : {row_t}")
    e.close()
    e.close(f"}} {{mapping = {LINEAR}}}")

    # 2. The key tiles this block visits.
    if d.causal_offset is None:
        n_tiles = e.c(am.k_tiles)
    else:
        # last row's reach: min(i0 + BQ, sq) - 1 + off + 1 keys, in whole tiles, at most k_tiles
        last = e.op("last", f"arith.minui {e.add(i0, e.c(BQ))}, {e.c(d.sq)} : index")
        reach = e.op("reach", f"arith.addi {last}, {e.c(d.causal_offset)} : index") \
            if d.causal_offset >= 0 else e.op("reach", f"arith.subi {last}, {e.c(-d.causal_offset)} : index")
        # (a negative reach cannot occur for offset >= 0; clamp through a signed max for the general case)
        reach = e.op("reach", f"arith.maxsi {reach}, {e.c(0)} : index")
        tiles_needed = e.op("kn", f"arith.ceildivui {reach}, {e.c(BK)} : index")
        n_tiles = e.op("kn", f"arith.minui {tiles_needed}, {e.c(am.k_tiles)} : index")
    e.open(f"scf.for %kt = {e.c(0)} to {n_tiles} step {e.c(1)} {{")
    j0 = e.mul("%kt", BK)
    # a. Kᵀ and V tiles (reads along d / dv are consecutive in memory when col_stride is 1), S = 0.
    e.open(f"scf.forall (%t) in ({NT}) {{")
    stage("K", j0, BK, d.sk, d.d, DP, am.vec_k, "%sk", sk_t, False)
    stage("V", j0, BK, d.sk, d.dv, DVP, am.vec_v, "%sv", sv_t, False)
    r, c = strided_loop(BQ * BK, BK)
    e(f"memref.store %zf, %ss[{r}, {c}] : {ss_t}")
    e.close()
    e.close(f"}} {{mapping = {LINEAR}}}")

    def matmul_step(a: str, a_t: str, b: str, b_t: str, acc: str, acc_t: str, n: int, k: int, tn: int,
                    pitches: tuple[int, int, int], bt: bool) -> None:
        """acc (BQ x n) += a (BQ x k) · b (k x n; given as bᵀ, n x k, when ``bt``) on the shared tiles,
        whose rows are ``pitches`` apart."""
        maps = TRANSPOSED_B if bt else ""
        if am.compute == "mma":
            ta, tb, tc = mma_types(T, k, n, pitches, bt)
            e.open(f"scf.forall (%w) in ({am.warps}) {{")
            r0 = e.mul("%w", 16)
            av = e.op("as", f"memref.subview {a}[{r0}, 0] [16, {k}] [1, 1] : {a_t} to {ta}")
            rows, cols = (n, k) if bt else (k, n)
            bv = e.op("bs", f"memref.subview {b}[0, 0] [{rows}, {cols}] [1, 1] : {b_t} to {tb}")
            cv = e.op("cs", f"memref.subview {acc}[{r0}, 0] [16, {n}] [1, 1] : {acc_t} to {tc}")
            e(f"func.call @{mma_name(T, k, n, pitches, bt)}({av}, {bv}, {cv}) : ({ta}, {tb}, {tc}) -> ()")
            e.close("} {mapping = [#gpu.warp<linear_dim_0>]}")
        else:
            ty, tx = SIMT_THREADS
            pa, pb, pc = pitches
            va, vc = _view(am.tm, k, pa, T), _view(am.tm, tn, pc, "f32")
            vb = _view(tn, k, pb, T) if bt else _view(k, tn, pb, T)
            e.open(f"scf.forall (%ty, %tx) in ({ty}, {tx}) {{")
            rr, qq = e.mul("%ty", am.tm), e.mul("%tx", tn)
            av = e.op("as", f"memref.subview {a}[{rr}, 0] [{am.tm}, {k}] [1, 1] : {a_t} to {va}")
            if bt:
                bv = e.op("bs", f"memref.subview {b}[{qq}, 0] [{tn}, {k}] [1, 1] : {b_t} to {vb}")
            else:
                bv = e.op("bs", f"memref.subview {b}[0, {qq}] [{k}, {tn}] [1, 1] : {b_t} to {vb}")
            cv = e.op("cs", f"memref.subview {acc}[{rr}, {qq}] [{am.tm}, {tn}] [1, 1] : {acc_t} to {vc}")
            e(f"linalg.matmul {maps}ins({av}, {bv} : {va}, {vb}) outs({cv} : {vc})")
            e.close("} {mapping = [#gpu.thread<linear_dim_1>, #gpu.thread<linear_dim_0>]}")

    # b. S += Q·Kᵀ
    (_, _, s_pitches, _), (_, _, o_pitches, _) = strips(am)
    matmul_step("%sq", sq_t, "%sk", sk_t, "%ss", ss_t, BK, DP, am.tn_s, s_pitches, True)

    # c. The online-softmax update, P threads per query row (thread t: row t / P, keys j = t % P + P * jj).
    P = am.row_threads

    def row_part(t: str) -> tuple[str, str]:
        if P == 1:
            return t, e.c(0)
        return e.op("rw", f"arith.divui {t}, {e.c(P)} : index"), e.op("pt", f"arith.remui {t}, {e.c(P)} : index")

    def key(jj: str, part: str) -> str:
        return e.add(e.mul(jj, P), part) if P > 1 else jj

    # c1. scale and mask the scores in place; each thread's maximum over its keys
    e.open(f"scf.forall (%t) in ({BQ * P}) {{")
    row, part = row_part("%t")
    gi = e.add(i0, row)
    row_in = e.lt(gi, e.c(d.sq))
    jj, mx, macc = e.fresh("jj"), e.fresh("mx"), e.fresh("macc")
    e.open(f"{mx} = scf.for {jj} = {e.c(0)} to {e.c(BK // P)} step {e.c(1)} iter_args({macc} = %ninf) -> (f32) {{")
    j = key(jj, part)
    gj = e.add(j0, j)
    sv = e.op("s", f"memref.load %ss[{row}, {j}] : {ss_t}")
    x = e.op("x", f"arith.mulf {sv}, %scale : f32")
    valid = e.lt(gj, e.c(d.sk))
    if d.mask:
        mv = guarded_load("M", and_(row_in, valid), gi, gj, T, "%zt")
        mf = mv if T == "f32" else e.op("mf", f"arith.extf {mv} : {T} to f32")
        x = e.op("x", f"arith.addf {x}, {e.op('ms', f'arith.mulf {mf}, %mscale : f32')} : f32")
    if d.causal_offset is not None:
        # key j is masked for query i when j > i + offset (lane by lane on the diagonal tiles)
        lim = e.op("lim", f"arith.addi {gi}, {e.c(d.causal_offset)} : index") if d.causal_offset >= 0 else \
            e.op("lim", f"arith.subi {gi}, {e.c(-d.causal_offset)} : index")
        seen = e.op("seen", f"arith.cmpi sle, {gj}, {lim} : index")
        valid = and_(valid, seen)
    x = e.op("x", f"arith.select {valid}, {x}, %ninf : f32")
    e(f"memref.store {x}, %ss[{row}, {j}] : {ss_t}")
    e(f"scf.yield {e.op('mx', f'arith.maximumf {macc}, {x} : f32')} : f32")
    e.close()
    e(f"memref.store {mx}, %spm[{part}, {row}] : {part_t}")
    e.close(f"}} {{mapping = {LINEAR}}}")

    # c2. the row's new maximum; P = exp(S - m) rounded to the dtype; each thread's sum of what it wrote
    e.open(f"scf.forall (%t) in ({BQ * P}) {{")
    row, part = row_part("%t")
    mold = e.op("mold", f"memref.load %sm[{row}] : {row_t}")
    mnew = mold
    for q in range(P):
        pm = e.op("pm", f"memref.load %spm[{e.c(q)}, {row}] : {part_t}")
        mnew = e.op("mnew", f"arith.maximumf {mnew}, {pm} : f32")
    # a row with every key so far masked keeps m = -inf; subtracting 0 then gives p = 0 and alpha = 0
    dead = e.op("dead", f"arith.cmpf oeq, {mnew}, %ninf : f32")
    muse = e.op("muse", f"arith.select {dead}, %zf, {mnew} : f32")
    jj, lsum, lacc = e.fresh("jj"), e.fresh("ls"), e.fresh("lacc")
    e.open(f"{lsum} = scf.for {jj} = {e.c(0)} to {e.c(BK // P)} step {e.c(1)} iter_args({lacc} = %zf) -> (f32) {{")
    j = key(jj, part)
    sv = e.op("s", f"memref.load %ss[{row}, {j}] : {ss_t}")
    pv = e.op("p", f"math.exp {e.op('sd', f'arith.subf {sv}, {muse} : f32')} : f32")
    if T != "f32":  # P is what the second matmul reads: round it to the operand dtype, sum what it reads
        pt = e.op("pt", f"arith.truncf {pv} : f32 to {T}")
        pv = e.op("p", f"arith.extf {pt} : {T} to f32")
    else:
        pt = pv
    e(f"memref.store {pt}, %sp[{row}, {j}] : {sp_t}")
    e(f"scf.yield {e.op('l', f'arith.addf {lacc}, {pv} : f32')} : f32")
    e.close()
    e(f"memref.store {lsum}, %spl[{part}, {row}] : {part_t}")
    first = e.op("first", f"arith.cmpi eq, {part}, {e.c(0)} : index")
    e.open(f"scf.if {first} {{")
    alpha = e.op("alpha", f"math.exp {e.op('dm', f'arith.subf {mold}, {muse} : f32')} : f32")
    e(f"memref.store {alpha}, %sa[{row}] : {row_t}")
    e(f"memref.store {mnew}, %smn[{row}] : {row_t}")
    e.close()
    e.close(f"}} {{mapping = {LINEAR}}}")

    # d. O *= alpha per row (all threads); l = l * alpha + the row's sums, m = the new maximum
    e.open(f"scf.forall (%t) in ({NT}) {{")
    r, c = strided_loop(BQ * DVP, DVP)
    o = e.op("o", f"memref.load %so[{r}, {c}] : {so_t}")
    a = e.op("al", f"memref.load %sa[{r}] : {row_t}")
    e(f"memref.store {e.op('o', f'arith.mulf {o}, {a} : f32')}, %so[{r}, {c}] : {so_t}")
    e.close()
    ev = e.fresh("e")
    e.open(f"scf.for {ev} = %t to {e.c(BQ)} step {e.c(NT)} {{")
    lv = e.op("la", f"arith.mulf {e.op('lo', f'memref.load %sl[{ev}] : {row_t}')}, "
                    f"{e.op('al', f'memref.load %sa[{ev}] : {row_t}')} : f32")
    for q in range(P):
        lv = e.op("la", f"arith.addf {lv}, {e.op('pl', f'memref.load %spl[{e.c(q)}, {ev}] : {part_t}')} : f32")
    e(f"memref.store {lv}, %sl[{ev}] : {row_t}")
    e(f"memref.store {e.op('mn', f'memref.load %smn[{ev}] : {row_t}')}, %sm[{ev}] : {row_t}")
    e.close()
    e.close(f"}} {{mapping = {LINEAR}}}")

    # e. O += P·V
    matmul_step("%sp", sp_t, "%sv", sv_t, "%so", so_t, DVP, BK, am.tn_o, o_pitches, False)
    e.close()  # key loop

    # 3. O / l to the output (row-major (batch, sq, dv)), rows inside sq only.
    e.open(f"scf.forall (%t) in ({NT}) {{")
    r, c = strided_loop(BQ * DVP, DVP)
    gi = e.add(i0, r)
    inb = and_(e.lt(gi, e.c(d.sq)), e.lt(c, e.c(d.dv))) if DVP != d.dv else e.lt(gi, e.c(d.sq))
    e.open(f"scf.if {inb} {{")
    o = e.op("o", f"memref.load %so[{r}, {c}] : {so_t}")
    lv = e.op("lv", f"memref.load %sl[{r}] : {row_t}")
    y = e.op("y", f"arith.divf {o}, {lv} : f32")
    if T != "f32":
        y = e.op("y", f"arith.truncf {y} : f32 to {T}")
    row = e.add(e.mul("%beta", d.sq), gi)
    idx = e.add(e.mul(row, d.dv), c)
    e(f"memref.store {y}, {flat['O']}[{idx}] : {ft['O']}")
    e.close()
    e.close()
    e.close(f"}} {{mapping = {LINEAR}}}")
    for tile, ty in tiles.items():
        e(f"memref.dealloc %{tile} : {ty}")
    e.close("} {mapping = [#gpu.block<y>, #gpu.block<x>]}")
    e("return")
    e.depth = 0
    e("}")
    consts = [f"  %c{v} = arith.constant {v} : index" if v >= 0 else f"  %cm{-v} = arith.constant {v} : index"
              for v in sorted(e.consts)]
    lines = e.lines[:body_start] + consts + e.lines[body_start:]
    return "\n".join(lines)
