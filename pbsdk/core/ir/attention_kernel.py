"""The fused attention kernel of an `AttentionPlan`, built on buffers (vector + scf + memref) with the MLIR
bindings.

Two functions per attention (see `pbsdk.core.plan.attention` for the schedule):

- ``@{name}(Q, K, V[, M], O)``: ``scf.forall (%t) in (threads) { func.call @{name}_part(..., %t) }``
  — the shape the cpu target forks onto its cores (serial elsewhere);
- ``@{name}_part(..., %t)``: work items ``t, t + threads, ...``; each is one (batch, query block).

Buffers are the operands' base tensors (flattened inside the kernel, read at the match's strides),
so GQA, transposed K and broadcast masks cost nothing. Scratch is three stack buffers sized by the plan
(Qt, the score tile St, Ot); nothing is allocated per key block and nothing is seq x seq. Scores are
kept in base 2: Q is pre-multiplied by ``scale * log2(e)`` and the exponential is ``exp2`` built from
vector arith (round, a degree-6 polynomial, exponent bits), so no libm call is made per element.

`build_attention_kernel` builds the kernel of a plan — these two functions (``"lanes"`` plans), or the
scratchpad kernel of `pbsdk.core.ir.attention_tiles` (``"scratchpad"`` plans) — op by op with the
bindings' builders (``mlir.dialects.func/scf/vector/memref/arith``) at an insertion point in the caller's
module. The caller (`pbsdk.core.ir.emit`) builds it in front of its entry function, passes tensors
through ``bufferization.to_buffer`` and wraps the output buffer with ``bufferization.to_tensor``;
one-shot bufferization then hands the function arguments and the caller-allocated output straight to
the kernel.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith, func, memref, scf, vector

from pbsdk.core.ir.attention import Operand
from pbsdk.core.ir.builder import Indices, element_type, float_constant, loop, reassociation
from pbsdk.core.ir.builder import memref_type as memref_t
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


def _vmax(a: ir.Value, b: ir.Value) -> ir.Value:
    """max(a, b) as compare + select (one vmaxps on x86); a NaN in ``a`` is dropped, one in ``b`` kept.
    The running maxima only steer the rescaling: a NaN score still reaches the sum through exp2."""
    return arith.select(arith.cmpf(arith.CmpFPredicate.OGT, a, b), a, b)


def _exp2(x: ir.Value, consts: dict[str, ir.Value]) -> ir.Value:
    """Vector 2^x for x <= 0 (x <= -126.5 gives 0; NaN stays NaN).

    Round to nearest with the magic-number trick: adding 1.5 * 2^23 + 127 leaves round(x) + 127 in the
    low mantissa bits, which shifted left by 23 are the exponent field of 2^round(x); 2^f on the
    remainder |f| <= 1/2 is a degree-6 polynomial."""
    vt = x.type
    xc = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, x, consts["lo"]), consts["lo"], x)
    t = arith.addf(xc, consts["magic"])
    n = arith.subf(t, consts["magic"])
    f = arith.subf(xc, n)
    p = consts["p0"]
    for i in range(1, len(_EXP2_COEFFS)):
        p = vector.fma(p, f, consts[f"p{i}"])
    it = consts["shift"].type
    b = arith.shli(arith.bitcast(it, t), consts["shift"])
    return arith.mulf(p, arith.bitcast(vt, b))


def _splat(t: ir.VectorType, value: float) -> ir.Value:
    """``arith.constant dense<value> : t`` (a float vector)."""
    return arith.ConstantOp(t, ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(t.element_type, value))).result


def _int_vector(t: ir.VectorType, values: Sequence[int]) -> ir.Value:
    """``arith.constant dense<values> : t`` (an i32 vector)."""
    if len(set(values)) == 1:
        attr = ir.DenseElementsAttr.get_splat(t, ir.IntegerAttr.get(t.element_type, values[0]))
    else:
        attr = ir.DenseElementsAttr.get([ir.IntegerAttr.get(t.element_type, v) for v in values], type=t)
    return arith.ConstantOp(t, attr).result


def _flat(names: list[str], shapes: list[tuple[int, ...]], args: Sequence[ir.Value], dtype: str) -> dict[str, ir.Value]:
    """Each operand as a 1-D buffer (``memref.collapse_shape`` unless it is one)."""
    flat = {}
    for nm, shape, arg in zip(names, shapes, args):
        flat[nm] = arg if len(shape) == 1 else memref.CollapseShapeOp(
            memref_t([math.prod(shape)], dtype), arg, reassociation([list(range(len(shape)))])).result
    return flat


def _build_part(name: str, plan: AttentionPlan, ops: KernelOperands, names: list[str],
                shapes: list[tuple[int, ...]]) -> func.FuncOp:
    """``@{name}_part(..., %t)``: the work items of thread ``%t``."""
    op = plan.op
    t = ops.dtype
    L, nvq, br, bc, nj = plan.lanes, plan.q_vectors, plan.block_q, plan.block_k, plan.qk_keys
    D, DV, SQ, SK = op.d, op.dv, op.sq, op.sk
    et = element_type(t)
    vt = ir.VectorType.get([L], et)
    vit = ir.VectorType.get([L], ir.IntegerType.get_signless(32))
    mt = ir.VectorType.get([L], ir.IntegerType.get_signless(1))
    i32 = ir.IntegerType.get_signless(32)
    nqb = plan.q_blocks
    items = plan.work_items
    T = plan.threads
    index = ir.IndexType.get()

    fn = func.FuncOp(f"{name}_part", ir.FunctionType.get([memref_t(s, t) for s in shapes] + [index], []),
                     visibility="private")
    entry = fn.add_entry_block()
    ix = Indices(entry)
    c = ix.c
    tid = entry.arguments[len(names)]
    with ir.InsertionPoint(entry):
        flat = _flat(names, shapes, entry.arguments, t)

        # Vector constants.
        vc = {"zero": _splat(vt, 0.0), "ninf": _splat(vt, -math.inf), "lo": _splat(vt, -127.0),
              "magic": _splat(vt, rounded(1.5 * 2 ** 23 + 127)), "shift": _int_vector(vit, [23] * L)}
        for i, cf in enumerate(_EXP2_COEFFS):
            vc[f"p{i}"] = _splat(vt, rounded(cf))
        vzero, vninf = vc["zero"], vc["ninf"]
        viota = _int_vector(vit, list(range(L)))
        qscale = float_constant(rounded(ops.scale * LOG2E), et)
        if ops.mask is not None:
            vmscale = _splat(vt, rounded(ops.mask_scale * LOG2E))
            if ops.mask.row_stride not in (0, 1):
                vmidx = _int_vector(vit, [i * ops.mask.row_stride for i in range(L)])
        i64 = ir.IntegerType.get_signless(64)
        align = ir.IntegerAttr.get(i64, 64)
        Qt, St, Ot = (memref.AllocaOp(memref_t([n * br], t), [], [], alignment=align).result for n in (D, bc, DV))

        with loop(tid, c(items), c(T)) as work:
            it = work.induction_variable
            beta = ix.divui(it, nqb)
            qb = ix.remui(it, nqb)
            i0 = ix.mul(qb, br)
            nqv = ix.min(c(br), ix.sub(c(SQ), i0))
            qoff, koff, voff = batch_start(ix, beta, ops.q), batch_start(ix, beta, ops.k), batch_start(ix, beta, ops.v)
            moff = batch_start(ix, beta, ops.mask) if ops.mask is not None else None
            ooff = ix.mul(beta, SQ * DV)
            # Lanes past the sequence end: masks for the mask reads.
            lane_masks = []
            if ops.mask is not None and ops.mask.row_stride != 0:
                for v in range(nvq):
                    cnt = ix.min(ix.max(ix.sub(nqv, c(v * L)), c(0)), c(L))
                    lane_masks.append(vector.create_mask(mt, [cnt]))
            # Query indices (+ causal offset) per lane, for the causal compare.
            qlanes = []
            if op.causal_offset is not None:
                for v in range(nvq):
                    base = arith.index_cast(i32, ix.add(i0, c(v * L + op.causal_offset)))
                    qlanes.append(arith.addi(vector.broadcast(vit, base), viota))

            # Qt = zero, then Qt[d, i] = Q[i0 + i, d] * scale * log2(e)
            for buf, rows in ((Qt, D), (Ot, DV)):
                with loop(c(0), c(rows), c(1)) as ld:
                    row = ix.mul(ld.induction_variable, br)
                    for v in range(nvq):
                        vector.store(vzero, buf, [ix.add(row, c(v * L))])
            with loop(c(0), nqv, c(1)) as li:
                i = li.induction_variable
                qrow = ix.add(qoff, ix.mul(ix.add(i0, i), ops.q.row_stride))
                with loop(c(0), c(D), c(1)) as ld:
                    d = ld.induction_variable
                    x = memref.load(flat["Q"], [ix.add(qrow, ix.mul(d, ops.q.col_stride))])
                    y = arith.mulf(x, qscale)
                    memref.store(y, Qt, [ix.add(ix.mul(d, br), i)])

            # Keys this query block needs.
            if op.causal_offset is None:
                kend = c(SK)
            else:
                qend = ix.min(ix.add(i0, c(br)), c(SQ))
                kend = ix.min(ix.max(ix.add(qend, c(op.causal_offset)), c(0)), c(SK))

            with loop(c(0), kend, c(bc), [vninf] * nvq + [vzero] * nvq) as kl:
                j0 = kl.induction_variable
                m_old, l_old = list(kl.inner_iter_args[:nvq]), list(kl.inner_iter_args[nvq:])
                jn = ix.min(c(bc), ix.sub(kend, j0))
                ntile = ix.divui(jn, nj)
                jfull = ix.mul(ntile, nj)

                def qk_tile(keys: int, jl: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
                    """Scores of ``keys`` keys from local row ``jl`` for every query vector; returns new maxima."""
                    ja = ix.add(j0, jl)
                    kbase = [ix.add(koff, ix.mul(ix.add(ja, c(kk)), ops.k.row_stride)) for kk in range(keys)]
                    with loop(c(0), c(D), c(1), [vzero] * (keys * nvq)) as dl:
                        dd = dl.induction_variable
                        accs = list(dl.inner_iter_args)
                        qrow_d = ix.mul(dd, br)
                        qv = [vector.load(vt, Qt, [ix.add(qrow_d, c(v * L))]) for v in range(nvq)]
                        outs = []
                        kd = ix.mul(dd, ops.k.col_stride)
                        for kk in range(keys):
                            ks = memref.load(flat["K"], [ix.add(kbase[kk], kd)])
                            kb = vector.broadcast(vt, ks)
                            for v in range(nvq):
                                outs.append(vector.fma(kb, qv[v], accs[kk * nvq + v]))
                        scf.YieldOp(outs)
                    res = dl.results
                    new = list(carried)
                    for kk in range(keys):
                        key = ix.add(ja, c(kk))
                        if op.causal_offset is not None:
                            kv = vector.broadcast(vit, arith.index_cast(i32, key))
                        if ops.mask is not None:
                            assert moff is not None
                            mcol = ix.add(moff, ix.mul(key, ops.mask.col_stride))
                        for v in range(nvq):
                            s = res[kk * nvq + v]
                            if ops.mask is not None:
                                mrow = ix.add(mcol, ix.mul(ix.add(i0, c(v * L)), ops.mask.row_stride))
                                if ops.mask.row_stride == 0:
                                    mv = vector.broadcast(vt, memref.load(flat["M"], [mcol]))
                                elif ops.mask.row_stride == 1:
                                    mv = vector.MaskedLoadOp(vt, flat["M"], [mrow], lane_masks[v], vzero).result
                                else:
                                    mv = vector.GatherOp(vt, flat["M"], [mrow], vmidx, lane_masks[v], vzero).result
                                s = vector.fma(mv, vmscale, s)
                            if op.causal_offset is not None:
                                cm = arith.cmpi(arith.CmpIPredicate.sgt, kv, qlanes[v])
                                s = arith.select(cm, vninf, s)
                            srow = ix.mul(ix.add(jl, c(kk)), br)
                            vector.store(s, St, [ix.add(srow, c(v * L))])
                            new[v] = _vmax(s, new[v])
                    return new

                with loop(c(0), jfull, c(nj), [vninf] * nvq) as tl:
                    scf.YieldOp(qk_tile(nj, tl.induction_variable, list(tl.inner_iter_args)))
                with loop(jfull, jn, c(1), list(tl.results)) as rl:
                    scf.YieldOp(qk_tile(1, rl.induction_variable, list(rl.inner_iter_args)))

                # Online softmax: new maxima, the rescale factor, probabilities in place of the scores.
                m_use, alpha, m_new = [], [], []
                for v in range(nvq):
                    mn = _vmax(rl.results[v], m_old[v])
                    isinf = arith.cmpf(arith.CmpFPredicate.OEQ, mn, vninf)
                    mu = arith.select(isinf, vzero, mn)
                    alpha.append(_exp2(arith.subf(m_old[v], mu), vc))
                    m_use.append(mu)
                    m_new.append(mn)
                with loop(c(0), jn, c(1), [vzero] * nvq) as sl:
                    srow = ix.mul(sl.induction_variable, br)
                    outs = []
                    for v in range(nvq):
                        idx = ix.add(srow, c(v * L))
                        s = vector.load(vt, St, [idx])
                        p = _exp2(arith.subf(s, m_use[v]), vc)
                        vector.store(p, St, [idx])
                        outs.append(arith.addf(sl.inner_iter_args[v], p))
                    scf.YieldOp(outs)
                l_new = [vector.fma(l_old[v], alpha[v], sl.results[v]) for v in range(nvq)]

                # Ot = Ot * alpha + Vᵀ P, in chunks of value columns held in registers across the key block.
                c0 = 0
                while c0 < DV:
                    ncol = min(plan.pv_cols, DV - c0)
                    inits = []
                    for r in range(ncol):
                        for v in range(nvq):
                            old = vector.load(vt, Ot, [c((c0 + r) * br + v * L)])
                            inits.append(arith.mulf(old, alpha[v]))
                    with loop(c(0), jn, c(1), inits) as pl:
                        srow = ix.mul(pl.induction_variable, br)
                        pv = [vector.load(vt, St, [ix.add(srow, c(v * L))]) for v in range(nvq)]
                        vrow = ix.add(voff, ix.mul(ix.add(j0, pl.induction_variable), ops.v.row_stride))
                        outs = []
                        for r in range(ncol):
                            vs = memref.load(flat["V"], [ix.add(vrow, c((c0 + r) * ops.v.col_stride))])
                            vb = vector.broadcast(vt, vs)
                            for v in range(nvq):
                                outs.append(vector.fma(vb, pv[v], pl.inner_iter_args[r * nvq + v]))
                        scf.YieldOp(outs)
                    for r in range(ncol):
                        for v in range(nvq):
                            vector.store(pl.results[r * nvq + v], Ot, [c((c0 + r) * br + v * L)])
                    c0 += ncol
                scf.YieldOp(m_new + l_new)

            # O[i0 + i, :] = Ot[:, i] / l[i]
            one = _splat(vt, 1.0)
            inv = [arith.divf(one, kl.results[nvq + v]) for v in range(nvq)]
            with loop(c(0), c(DV), c(1)) as ld:
                row = ix.mul(ld.induction_variable, br)
                for v in range(nvq):
                    idx = ix.add(row, c(v * L))
                    o = vector.load(vt, Ot, [idx])
                    vector.store(arith.mulf(o, inv[v]), Ot, [idx])
            with loop(c(0), nqv, c(1)) as li:
                i = li.induction_variable
                orow = ix.add(ooff, ix.mul(ix.add(i0, i), DV))
                with loop(c(0), c(DV), c(1)) as ld:
                    d = ld.induction_variable
                    val = memref.load(Ot, [ix.add(ix.mul(d, br), i)])
                    memref.store(val, flat["O"], [ix.add(orow, d)])
        func.ReturnOp([])
    ix.hoist()
    return fn


def _build_lanes(name: str, plan: AttentionPlan, ops: KernelOperands) -> func.FuncOp:
    """The two functions (``@{name}_part``, then ``@{name}``) of one fused attention at the current
    insertion point; returns ``@{name}``."""
    t = ops.dtype
    names = ["Q", "K", "V"] + (["M"] if ops.mask is not None else []) + ["O"]
    shapes = [ops.q_shape, ops.k_shape, ops.v_shape] + ([ops.mask_shape] if ops.mask_shape else []) + [ops.out_shape]
    part = _build_part(name, plan, ops, names, shapes)  # type: ignore[arg-type]
    fn = func.FuncOp(name, ir.FunctionType.get([memref_t(s, t) for s in shapes], []),  # type: ignore[arg-type]
                     visibility="private")
    entry = fn.add_entry_block()
    callee = ir.FlatSymbolRefAttr.get(ir.StringAttr(part.sym_name).value)
    with ir.InsertionPoint(entry):
        args = list(entry.arguments)
        if plan.threads > 1:
            forall = scf.ForallOp([0], [plan.threads], [1])
            with ir.InsertionPoint(forall.body):
                func.CallOp([], callee, [*args, forall.body.arguments[0]])
                scf.InParallelOp()
        else:
            index = ir.IndexType.get()
            t0 = arith.ConstantOp(index, ir.IntegerAttr.get(index, 0)).result
            func.CallOp([], callee, [*args, t0])
        func.ReturnOp([])
    return fn


def build_attention_kernel(ip: ir.InsertionPoint, name: str, plan: AttentionPlan, ops: KernelOperands) -> func.FuncOp:
    """The fused attention kernel ``@{name}(Q, K, V[, M], O)`` of ``plan`` built at ``ip`` (in the current
    context and location): the lanes kernel above (with its ``@{name}_part``), or for ``"scratchpad"``
    plans the kernel of `pbsdk.core.ir.attention_tiles`. Returns ``@{name}``."""
    if plan.schedule == "scratchpad":
        from pbsdk.core.ir.attention_tiles import build_tiles_kernel

        return build_tiles_kernel(ip, name, plan, ops)
    with ip:
        return _build_lanes(name, plan, ops)
