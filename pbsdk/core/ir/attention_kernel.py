"""The fused attention kernel of an `AttentionPlan`, as MLIR text on buffers (vector + scf + memref).

Two functions per attention (see `pbsdk.core.plan.attention` for the schedule):

- ``@{name}(Q, K, V[, M], O)``: ``scf.forall (%t) in (threads) { func.call @{name}_part(..., %t) }``
  — the shape the cpu target forks onto its cores (serial elsewhere);
- ``@{name}_part(..., %t)``: work items ``t, t + threads, ...``; each is one (batch, query block).

Buffers are the operands' base tensors (flattened inside the kernel, read at the match's strides),
so GQA, transposed K and broadcast masks cost nothing. Scratch is three stack buffers sized by the plan
(Qt, the score tile St, Ot); nothing is allocated per key block and nothing is seq x seq. Scores are
kept in base 2: Q is pre-multiplied by ``scale * log2(e)`` and the exponential is ``exp2`` built from
vector arith (round, a degree-6 polynomial, exponent bits), so no libm call is made per element.

The caller (`pbsdk.core.ir.emit`) passes tensors through ``bufferization.to_buffer`` and wraps the
output buffer with ``bufferization.to_tensor``; one-shot bufferization then hands the function
arguments and the caller-allocated output straight to the kernel.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mlir import ir

from pbsdk.core.ir.attention import Operand
from pbsdk.core.ir.builder import Indices
from pbsdk.core.ir.mlir_text import MlirText
from pbsdk.core.plan.attention import AttentionPlan

LOG2E = 1.0 / math.log(2.0)
#: exp2(f) on |f| <= 1/2: Taylor coefficients of e^(f ln 2), highest degree first.
_EXP2_COEFFS = [math.log(2.0) ** k / math.factorial(k) for k in range(6, -1, -1)]


@dataclasses.dataclass(frozen=True)
class KernelOperands:
    """What the kernel reads: each operand's base shape (for its memref type) and strides."""

    q: Operand
    k: Operand
    v: Operand
    mask: Operand | None
    q_shape: tuple[int, ...]
    k_shape: tuple[int, ...]
    v_shape: tuple[int, ...]
    mask_shape: tuple[int, ...] | None
    out_shape: tuple[int, ...]
    scale: float
    mask_scale: float
    dtype: str = "f32"


def memref_type(shape: tuple[int, ...], dtype: str) -> str:
    return f"memref<{''.join(f'{d}x' for d in shape)}{dtype}>"


def _f(value: float) -> str:
    if math.isinf(value):
        return "0xFF800000" if value < 0 else "0x7F800000"
    return f"{value:.9e}"


class IndexText(MlirText):
    """`MlirText` with memoised index constants (``consts``: value -> SSA name, emitted by the caller at
    the top of the function) and folding index arithmetic; the attention kernels' builder."""

    def __init__(self) -> None:
        super().__init__()
        self.consts: dict[int, str] = {}

    def c(self, v: int) -> str:
        if v not in self.consts:
            self.consts[v] = f"%c{v}".replace("-", "m")
        return self.consts[v]

    def op(self, hint: str, text: str) -> str:
        r = self.fresh(hint)
        self(f"{r} = {text}")
        return r

    # index arithmetic, folding constants
    def add(self, a: str, b: str) -> str:
        if b == self.c(0):
            return a
        if a == self.c(0):
            return b
        return self.op("a", f"arith.addi {a}, {b} : index")

    def mul(self, a: str, k: int) -> str:
        if k == 0:
            return self.c(0)
        if k == 1:
            return a
        return self.op("m", f"arith.muli {a}, {self.c(k)} : index")

    def sub(self, a: str, b: str) -> str:
        return self.op("s", f"arith.subi {a}, {b} : index")

    def min(self, a: str, b: str) -> str:
        return self.op("mn", f"arith.minsi {a}, {b} : index")

    def max(self, a: str, b: str) -> str:
        return self.op("mx", f"arith.maxsi {a}, {b} : index")

    def lt(self, a: str, b: str) -> str:
        return self.op("lt", f"arith.cmpi ult, {a}, {b} : index")


def batch_offset(e: IndexText, beta: str, opnd: Operand | Any) -> str:
    """Σ_f ((β / inner_f) % size_f) * stride_f: where flat batch index ``beta`` starts in an operand
    (anything with `Operand`'s ``batch`` factors)."""
    total = e.c(0)
    for size, stride, inner in opnd.batch:
        if stride == 0 or size == 1:
            continue
        idx = beta if inner == 1 else e.op("dv", f"arith.divui {beta}, {e.c(inner)} : index")
        idx = e.op("rm", f"arith.remui {idx}, {e.c(size)} : index")
        total = e.add(total, e.mul(idx, stride))
    return total


def batch_start(ix: Indices, beta: ir.Value, opnd: Operand | Any) -> ir.Value:
    """Σ_f ((β / inner_f) % size_f) * stride_f: where flat batch index ``beta`` starts in an operand
    (anything with `Operand`'s ``batch`` factors), built with ``ix`` at the current insertion point."""
    total = ix.c(0)
    for size, stride, inner in opnd.batch:
        if stride == 0 or size == 1:
            continue
        idx = beta if inner == 1 else ix.divui(beta, inner)
        idx = ix.remui(idx, size)
        total = ix.add(total, ix.mul(idx, stride))
    return total


def rounded(value: float) -> float:
    """A float constant's value as the kernels write it: 10 significant digits (infinities kept)."""
    return value if math.isinf(value) else float(f"{value:.9e}")


def _vmax(e: IndexText, a: str, b: str, vt: str) -> str:
    """max(a, b) as compare + select (one vmaxps on x86); a NaN in ``a`` is dropped, one in ``b`` kept.
    The running maxima only steer the rescaling: a NaN score still reaches the sum through exp2."""
    gt = e.op("gt", f"arith.cmpf ogt, {a}, {b} : {vt}")
    return e.op("mx", f"arith.select {gt}, {a}, {b} : {vector_mask(vt)}, {vt}")


def vector_mask(vt: str) -> str:
    return vt.split("x")[0] + "xi1>"


def _exp2(e: IndexText, x: str, vt: str, consts: dict[str, str]) -> str:
    """Vector 2^x for x <= 0 (x <= -126.5 gives 0; NaN stays NaN).

    Round to nearest with the magic-number trick: adding 1.5 * 2^23 + 127 leaves round(x) + 127 in the
    low mantissa bits, which shifted left by 23 are the exponent field of 2^round(x); 2^f on the
    remainder |f| <= 1/2 is a degree-6 polynomial."""
    lt = e.op("lt", f"arith.cmpf olt, {x}, {consts['lo']} : {vt}")
    xc = e.op("x", f"arith.select {lt}, {consts['lo']}, {x} : {vector_mask(vt)}, {vt}")
    t = e.op("t", f"arith.addf {xc}, {consts['magic']} : {vt}")
    n = e.op("n", f"arith.subf {t}, {consts['magic']} : {vt}")
    f = e.op("fr", f"arith.subf {xc}, {n} : {vt}")
    p = consts["p0"]
    for i in range(1, len(_EXP2_COEFFS)):
        p = e.op("p", f"vector.fma {p}, {f}, {consts[f'p{i}']} : {vt}")
    it = vt.replace("f32", "i32")
    ti = e.op("ti", f"arith.bitcast {t} : {vt} to {it}")
    b = e.op("eb", f"arith.shli {ti}, {consts['shift']} : {it}")
    sc = e.op("sc", f"arith.bitcast {b} : {it} to {vt}")
    return e.op("e", f"arith.mulf {p}, {sc} : {vt}")


def kernel_text(name: str, plan: AttentionPlan, ops: KernelOperands) -> str:
    """The two functions (``@{name}``, ``@{name}_part``) of one fused attention, as MLIR text."""
    op = plan.op
    t = ops.dtype
    L, nvq, br, bc, nj = plan.lanes, plan.q_vectors, plan.block_q, plan.block_k, plan.qk_keys
    D, DV, SQ, SK = op.d, op.dv, op.sq, op.sk
    vt = f"vector<{L}x{t}>"
    vit = f"vector<{L}xi32>"
    mt = f"vector<{L}xi1>"
    nqb = plan.q_blocks
    items = plan.work_items
    T = plan.threads
    e = IndexText()

    names = ["Q", "K", "V"] + (["M"] if ops.mask is not None else []) + ["O"]
    shapes = [ops.q_shape, ops.k_shape, ops.v_shape] + ([ops.mask_shape] if ops.mask_shape else []) + [ops.out_shape]
    types = [memref_type(s, t) for s in shapes]  # type: ignore[arg-type]
    flat = {}
    for nm, shape, ty in zip(names, shapes, types):
        assert shape is not None
        size = math.prod(shape)
        if len(shape) == 1:
            flat[nm] = f"%{nm}0"
        else:
            flat[nm] = e.op(nm.lower(), f"memref.collapse_shape %{nm}0 [[{', '.join(map(str, range(len(shape))))}]] : "
                                        f"{ty} into memref<{size}x{t}>")
    ft = {nm: f"memref<{math.prod(s)}x{t}>" for nm, s in zip(names, shapes)}  # type: ignore[arg-type]

    # Vector constants.
    vc = {"zero": "%vzero", "ninf": "%vninf", "lo": "%vlo", "magic": "%vmagic", "shift": "%vshift"}
    e(f"%vzero = arith.constant dense<0.0> : {vt}")
    e(f"%vninf = arith.constant dense<{_f(-math.inf)}> : {vt}")
    e(f"%vlo = arith.constant dense<-127.0> : {vt}")
    e(f"%vmagic = arith.constant dense<{_f(1.5 * 2 ** 23 + 127)}> : {vt}")
    e(f"%vshift = arith.constant dense<23> : {vit}")
    for i, cf in enumerate(_EXP2_COEFFS):
        e(f"%vp{i} = arith.constant dense<{_f(cf)}> : {vt}")
        vc[f"p{i}"] = f"%vp{i}"
    e(f"%viota = arith.constant dense<[{', '.join(map(str, range(L)))}]> : {vit}")
    qscale = e.op("qs", f"arith.constant {_f(ops.scale * LOG2E)} : {t}")
    if ops.mask is not None:
        e(f"%vmscale = arith.constant dense<{_f(ops.mask_scale * LOG2E)}> : {vt}")
        if ops.mask.row_stride not in (0, 1):
            e(f"%vmidx = arith.constant dense<[{', '.join(str(i * ops.mask.row_stride) for i in range(L))}]> : {vit}")
    qt_t, st_t, ot_t = f"memref<{D * br}x{t}>", f"memref<{bc * br}x{t}>", f"memref<{DV * br}x{t}>"
    e(f"%Qt = memref.alloca() {{alignment = 64 : i64}} : {qt_t}")
    e(f"%St = memref.alloca() {{alignment = 64 : i64}} : {st_t}")
    e(f"%Ot = memref.alloca() {{alignment = 64 : i64}} : {ot_t}")

    e.open(f"scf.for %it = %t to {e.c(items)} step {e.c(T)} {{")
    beta = e.op("beta", f"arith.divui %it, {e.c(nqb)} : index")
    qb = e.op("qb", f"arith.remui %it, {e.c(nqb)} : index")
    i0 = e.mul(qb, br)
    nqv = e.min(e.c(br), e.sub(e.c(SQ), i0))
    qoff, koff, voff = batch_offset(e, beta, ops.q), batch_offset(e, beta, ops.k), batch_offset(e, beta, ops.v)
    moff = batch_offset(e, beta, ops.mask) if ops.mask is not None else None
    ooff = e.mul(beta, SQ * DV)
    # Lanes past the sequence end: masks for the mask reads.
    lane_masks = []
    if ops.mask is not None and ops.mask.row_stride != 0:
        for v in range(nvq):
            cnt = e.min(e.max(e.sub(nqv, e.c(v * L)), e.c(0)), e.c(L))
            lane_masks.append(e.op("lm", f"vector.create_mask {cnt} : {mt}"))
    # Query indices (+ causal offset) per lane, for the causal compare.
    qlanes = []
    if op.causal_offset is not None:
        for v in range(nvq):
            base = e.op("qi", f"arith.index_cast {e.add(i0, e.c(v * L + op.causal_offset))} : index to i32")
            bv = e.op("qv", f"vector.broadcast {base} : i32 to {vit}")
            qlanes.append(e.op("ql", f"arith.addi {bv}, %viota : {vit}"))

    # Qt = zero, then Qt[d, i] = Q[i0 + i, d] * scale * log2(e)
    e.open(f"scf.for %d = {e.c(0)} to {e.c(D)} step {e.c(1)} {{")
    row = e.mul("%d", br)
    for v in range(nvq):
        e(f"vector.store %vzero, %Qt[{e.add(row, e.c(v * L))}] : {qt_t}, {vt}")
    e.close()
    e.open(f"scf.for %d = {e.c(0)} to {e.c(DV)} step {e.c(1)} {{")
    row = e.mul("%d", br)
    for v in range(nvq):
        e(f"vector.store %vzero, %Ot[{e.add(row, e.c(v * L))}] : {ot_t}, {vt}")
    e.close()
    e.open(f"scf.for %i = {e.c(0)} to {nqv} step {e.c(1)} {{")
    qrow = e.add(qoff, e.mul(e.add(i0, "%i"), ops.q.row_stride))
    e.open(f"scf.for %d = {e.c(0)} to {e.c(D)} step {e.c(1)} {{")
    x = e.op("q", f"memref.load {flat['Q']}[{e.add(qrow, e.mul('%d', ops.q.col_stride))}] : {ft['Q']}")
    y = e.op("q", f"arith.mulf {x}, {qscale} : {t}")
    e(f"memref.store {y}, %Qt[{e.add(e.mul('%d', br), '%i')}] : {qt_t}")
    e.close()
    e.close()

    # Keys this query block needs.
    if op.causal_offset is None:
        kend = e.c(SK)
    else:
        qend = e.min(e.add(i0, e.c(br)), e.c(SQ))
        kend = e.min(e.max(e.add(qend, e.c(op.causal_offset)), e.c(0)), e.c(SK))

    vts = ", ".join([vt] * nvq)
    ml_init = ", ".join([f"%m_{v} = %vninf" for v in range(nvq)] + [f"%l_{v} = %vzero" for v in range(nvq)])
    ml = e.fresh("ml")
    e.open(f"{ml}:{2 * nvq} = scf.for %j0 = {e.c(0)} to {kend} step {e.c(bc)} iter_args({ml_init}) -> "
           f"({', '.join([vt] * (2 * nvq))}) {{")
    jn = e.min(e.c(bc), e.sub(kend, "%j0"))
    ntile = e.op("nt", f"arith.divui {jn}, {e.c(nj)} : index")
    jfull = e.mul(ntile, nj)

    def qk_tile(keys: int, jl: str, carried: list[str]) -> list[str]:
        """Scores of ``keys`` keys from local row ``jl`` for every query vector; returns new maxima."""
        ja = e.add("%j0", jl)
        kbase = [e.add(koff, e.mul(e.add(ja, e.c(kk)), ops.k.row_stride)) for kk in range(keys)]
        accs = [f"%acc_{kk}_{v}" for kk in range(keys) for v in range(nvq)]
        res = e.fresh("qk")
        init = ", ".join(f"{a} = %vzero" for a in accs)
        e.open(f"{res}:{len(accs)} = scf.for %dd = {e.c(0)} to {e.c(D)} step {e.c(1)} iter_args({init}) -> "
               f"({', '.join([vt] * len(accs))}) {{")
        qrow_d = e.mul("%dd", br)
        qv = [e.op("qv", f"vector.load %Qt[{e.add(qrow_d, e.c(v * L))}] : {qt_t}, {vt}") for v in range(nvq)]
        outs = []
        kd = e.mul("%dd", ops.k.col_stride)
        for kk in range(keys):
            ks = e.op("k", f"memref.load {flat['K']}[{e.add(kbase[kk], kd)}] : {ft['K']}")
            kb = e.op("kb", f"vector.broadcast {ks} : {t} to {vt}")
            for v in range(nvq):
                outs.append(e.op("f", f"vector.fma {kb}, {qv[v]}, %acc_{kk}_{v} : {vt}"))
        e(f"scf.yield {', '.join(outs)} : {', '.join([vt] * len(outs))}")
        e.close()
        new = list(carried)
        for kk in range(keys):
            key = e.add(ja, e.c(kk))
            if op.causal_offset is not None:
                ki = e.op("ki", f"arith.index_cast {key} : index to i32")
                kv = e.op("kv", f"vector.broadcast {ki} : i32 to {vit}")
            if ops.mask is not None:
                assert moff is not None
                mcol = e.add(moff, e.mul(key, ops.mask.col_stride))
            for v in range(nvq):
                s = f"{res}#{kk * nvq + v}"
                if ops.mask is not None:
                    mrow = e.add(mcol, e.mul(e.add(i0, e.c(v * L)), ops.mask.row_stride))
                    if ops.mask.row_stride == 0:
                        ms = e.op("ms", f"memref.load {flat['M']}[{mcol}] : {ft['M']}")
                        mv = e.op("mv", f"vector.broadcast {ms} : {t} to {vt}")
                    elif ops.mask.row_stride == 1:
                        mv = e.op("mv", f"vector.maskedload {flat['M']}[{mrow}], {lane_masks[v]}, %vzero : "
                                        f"{ft['M']}, {mt}, {vt} into {vt}")
                    else:
                        mv = e.op("mv", f"vector.gather {flat['M']}[{mrow}] [%vmidx], {lane_masks[v]}, %vzero : "
                                        f"{ft['M']}, {vit}, {mt}, {vt} into {vt}")
                    s = e.op("sm", f"vector.fma {mv}, %vmscale, {s} : {vt}")
                if op.causal_offset is not None:
                    cm = e.op("cm", f"arith.cmpi sgt, {kv}, {qlanes[v]} : {vit}")
                    s = e.op("sc", f"arith.select {cm}, %vninf, {s} : {mt}, {vt}")
                srow = e.mul(e.add(jl, e.c(kk)), br)
                e(f"vector.store {s}, %St[{e.add(srow, e.c(v * L))}] : {st_t}, {vt}")
                new[v] = _vmax(e, s, new[v], vt)
        return new

    mb_init = ", ".join(f"%mb_{v} = %vninf" for v in range(nvq))
    mb1 = e.fresh("mbt")
    e.open(f"{mb1}:{nvq} = scf.for %jt = {e.c(0)} to {jfull} step {e.c(nj)} iter_args({mb_init}) -> ({vts}) {{")
    new = qk_tile(nj, "%jt", [f"%mb_{v}" for v in range(nvq)])
    e(f"scf.yield {', '.join(new)} : {vts}")
    e.close()
    mb2 = e.fresh("mbr")
    mb_init = ", ".join(f"%mr_{v} = {mb1}#{v}" for v in range(nvq))
    e.open(f"{mb2}:{nvq} = scf.for %jr = {jfull} to {jn} step {e.c(1)} iter_args({mb_init}) -> ({vts}) {{")
    new = qk_tile(1, "%jr", [f"%mr_{v}" for v in range(nvq)])
    e(f"scf.yield {', '.join(new)} : {vts}")
    e.close()

    # Online softmax: new maxima, the rescale factor, probabilities in place of the scores.
    m_use, alpha, m_new = [], [], []
    for v in range(nvq):
        mn = _vmax(e, f"{mb2}#{v}", f"%m_{v}", vt)
        isinf = e.op("ii", f"arith.cmpf oeq, {mn}, %vninf : {vt}")
        mu = e.op("mu", f"arith.select {isinf}, %vzero, {mn} : {mt}, {vt}")
        d = e.op("dm", f"arith.subf %m_{v}, {mu} : {vt}")
        alpha.append(_exp2(e, d, vt, vc))
        m_use.append(mu)
        m_new.append(mn)
    ls = e.fresh("ls")
    ls_init = ", ".join(f"%s_{v} = %vzero" for v in range(nvq))
    e.open(f"{ls}:{nvq} = scf.for %jj = {e.c(0)} to {jn} step {e.c(1)} iter_args({ls_init}) -> ({vts}) {{")
    srow = e.mul("%jj", br)
    outs = []
    for v in range(nvq):
        idx = e.add(srow, e.c(v * L))
        s = e.op("s", f"vector.load %St[{idx}] : {st_t}, {vt}")
        x = e.op("x", f"arith.subf {s}, {m_use[v]} : {vt}")
        p = _exp2(e, x, vt, vc)
        e(f"vector.store {p}, %St[{idx}] : {st_t}, {vt}")
        outs.append(e.op("sa", f"arith.addf %s_{v}, {p} : {vt}"))
    e(f"scf.yield {', '.join(outs)} : {vts}")
    e.close()
    l_new = [e.op("ln", f"vector.fma %l_{v}, {alpha[v]}, {ls}#{v} : {vt}") for v in range(nvq)]

    # Ot = Ot * alpha + Vᵀ P, in chunks of value columns held in registers across the key block.
    c0 = 0
    while c0 < DV:
        ncol = min(plan.pv_cols, DV - c0)
        accs = [f"%o_{r}_{v}" for r in range(ncol) for v in range(nvq)]
        inits = []
        for r in range(ncol):
            for v in range(nvq):
                old = e.op("o", f"vector.load %Ot[{e.c((c0 + r) * br + v * L)}] : {ot_t}, {vt}")
                inits.append(e.op("os", f"arith.mulf {old}, {alpha[v]} : {vt}"))
        res = e.fresh("pv")
        init = ", ".join(f"{a} = {i}" for a, i in zip(accs, inits))
        e.open(f"{res}:{len(accs)} = scf.for %jv = {e.c(0)} to {jn} step {e.c(1)} iter_args({init}) -> "
               f"({', '.join([vt] * len(accs))}) {{")
        srow = e.mul("%jv", br)
        pv = [e.op("pv", f"vector.load %St[{e.add(srow, e.c(v * L))}] : {st_t}, {vt}") for v in range(nvq)]
        vrow = e.add(voff, e.mul(e.add("%j0", "%jv"), ops.v.row_stride))
        outs = []
        for r in range(ncol):
            vs = e.op("vs", f"memref.load {flat['V']}[{e.add(vrow, e.c((c0 + r) * ops.v.col_stride))}] : {ft['V']}")
            vb = e.op("vb", f"vector.broadcast {vs} : {t} to {vt}")
            for v in range(nvq):
                outs.append(e.op("g", f"vector.fma {vb}, {pv[v]}, %o_{r}_{v} : {vt}"))
        e(f"scf.yield {', '.join(outs)} : {', '.join([vt] * len(outs))}")
        e.close()
        for r in range(ncol):
            for v in range(nvq):
                e(f"vector.store {res}#{r * nvq + v}, %Ot[{e.c((c0 + r) * br + v * L)}] : {ot_t}, {vt}")
        c0 += ncol
    e(f"scf.yield {', '.join(m_new + l_new)} : {', '.join([vt] * (2 * nvq))}")
    e.close()  # key blocks

    # O[i0 + i, :] = Ot[:, i] / l[i]
    one = "%vone"
    e(f"{one} = arith.constant dense<1.0> : {vt}")
    inv = [e.op("il", f"arith.divf {one}, {ml}#{nvq + v} : {vt}") for v in range(nvq)]
    e.open(f"scf.for %d = {e.c(0)} to {e.c(DV)} step {e.c(1)} {{")
    row = e.mul("%d", br)
    for v in range(nvq):
        idx = e.add(row, e.c(v * L))
        o = e.op("o", f"vector.load %Ot[{idx}] : {ot_t}, {vt}")
        e(f"vector.store {e.op('on', f'arith.mulf {o}, {inv[v]} : {vt}')}, %Ot[{idx}] : {ot_t}, {vt}")
    e.close()
    e.open(f"scf.for %i = {e.c(0)} to {nqv} step {e.c(1)} {{")
    orow = e.add(ooff, e.mul(e.add(i0, "%i"), DV))
    e.open(f"scf.for %d = {e.c(0)} to {e.c(DV)} step {e.c(1)} {{")
    val = e.op("r", f"memref.load %Ot[{e.add(e.mul('%d', br), '%i')}] : {ot_t}")
    e(f"memref.store {val}, {flat['O']}[{e.add(orow, '%d')}] : {ft['O']}")
    e.close()
    e.close()
    e.close()  # items
    e("return")

    sig = ", ".join(f"%{nm}0: {ty}" for nm, ty in zip(names, types))
    out = [f"func.func private @{name}_part({sig}, %t: index) {{"]
    out += [f"  {v} = arith.constant {k} : index" for k, v in sorted(e.consts.items())]
    out += e.lines
    out.append("}")
    args = ", ".join(f"%{nm}0" for nm in names)
    call_t = ", ".join(types)
    out.append(f"func.func private @{name}({sig}) {{")
    if T > 1:
        out.append(f"  scf.forall (%t) in ({T}) {{")
        out.append(f"    func.call @{name}_part({args}, %t) : ({call_t}, index) -> ()")
        out.append("  }")
    else:
        out.append("  %t0 = arith.constant 0 : index")
        out.append(f"  func.call @{name}_part({args}, %t0) : ({call_t}, index) -> ()")
    out.append("  return")
    out.append("}")
    return "\n".join(out) + "\n"
