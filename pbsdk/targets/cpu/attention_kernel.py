"""The cpu target's fused attention kernel (the planner's ``"lanes"`` form), built on buffers (vector + scf +
memref) with the MLIR bindings from the ``pbsdk.attention`` descriptor the core leaves on a declaration.

The core (`pbsdk.core.ir.emit`) emits a fused ``"lanes"`` attention as a call of a private declaration
``@__pbsdk_attnN(Q, K, V[, M], O)`` on the operands' base buffers, marked with the plan's descriptor
(`pbsdk.core.ir.attention_tiles.descriptor`: the op, the register tile, the threads and the operand
layouts). This target's ``attention`` stage (`AttentionKernels`, first of its scheduling stages) gives
every such declaration its body — two functions per attention (see `pbsdk.core.plan.attention` for the
schedule):

- ``@{name}(Q, K, V[, M], O)``: ``scf.forall (%t) in (threads) { func.call @{name}_part(..., %t) }``
  — the shape ``lower-parallel`` forks onto the cores (a plain call with one thread);
- ``@{name}_part(..., %t)``: work items ``t, t + threads, ...``; each is one (batch, query block).

Buffers are the operands' base tensors (flattened inside the kernel, read at the descriptor's strides),
so GQA, transposed K and broadcast masks cost nothing. Scratch is three stack buffers sized by the plan
(Qt, the score tile St, Ot); nothing is allocated per key block and nothing is seq x seq. Scores are
kept in base 2: Q is pre-multiplied by ``scale * log2(e)`` and the exponential is ``exp2`` built from
vector arith (round, a degree-6 polynomial, exponent bits), so no libm call is made per element.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith, func, memref, scf, vector

from pbsdk.core.errors import CompileError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.ir.attention_tiles import DESCRIPTOR_VERSION, OperandLayout, batch_start, rounded
from pbsdk.core.ir.builder import Indices, call_parts, element_type, float_constant, loop, reassociation
from pbsdk.core.ir.builder import memref_type as memref_t
from pbsdk.core.pipeline import StageContext

LOG2E = 1.0 / math.log(2.0)
#: The lowest finite f32 (-FLT_MAX): where a finite mask's scaled score is floored (see `_build_part`).
F32_LOWEST = -3.4028234663852886e38
#: exp2(f) on |f| <= 1/2: Taylor coefficients of e^(f ln 2), highest degree first.
_EXP2_COEFFS = [math.log(2.0) ** k / math.factorial(k) for k in range(6, -1, -1)]


@dataclasses.dataclass(frozen=True)
class LanesKernel:
    """One ``"lanes"`` attention as its descriptor gives it: the op, the register tile and the layouts."""

    batch: int
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str
    causal_offset: int | None
    scale: float
    mask_scale: float
    lanes: int
    q_vectors: int
    block_k: int
    qk_keys: int
    pv_cols: int
    threads: int
    q: OperandLayout
    k: OperandLayout
    v: OperandLayout
    mask: OperandLayout | None
    out_shape: tuple[int, ...]
    safe_softmax: bool = False  # a row with every key masked gives 0 (torch's safe softmax), not NaN

    @property
    def block_q(self) -> int:
        return self.q_vectors * self.lanes

    @property
    def q_blocks(self) -> int:
        return -(-self.sq // self.block_q)

    @property
    def work_items(self) -> int:
        return self.batch * self.q_blocks

    @property
    def shapes(self) -> list[tuple[int, ...]]:
        """The kernel's argument shapes: Q, K, V[, M], O."""
        return [self.q.shape, self.k.shape, self.v.shape] + ([self.mask.shape] if self.mask else []) + [self.out_shape]


def is_lanes(raw: Mapping[str, Any]) -> bool:
    """Whether a parsed descriptor is of the ``"lanes"`` form (a scratchpad one has no ``form``)."""
    return raw.get("form") == "lanes"


def parse_descriptor(raw: Mapping[str, Any], name: str = "__pbsdk_attn") -> LanesKernel:
    """The kernel of a ``"lanes"`` descriptor (plain data) of function ``@name``; a `CompileError` naming
    what is wrong."""
    if raw.get("version") != DESCRIPTOR_VERSION:
        raise CompileError(f"@{name}: pbsdk.attention descriptor version {raw.get('version')} (the cpu target reads "
                           f"{DESCRIPTOR_VERSION})", op="func.func")
    try:
        ops = raw["operands"]
        layout = OperandLayout.from_descriptor
        kern = LanesKernel(
            int(raw["batch"]), int(raw["sq"]), int(raw["sk"]), int(raw["d"]), int(raw["dv"]), str(raw["dtype"]),
            None if raw["causal_offset"] is None else int(raw["causal_offset"]), float(raw["scale"]),
            float(raw["mask_scale"]), int(raw["lanes"]), int(raw["q_vectors"]), int(raw["block_k"]),
            int(raw["qk_keys"]), int(raw["pv_cols"]), int(raw["threads"]), layout(ops["q"]), layout(ops["k"]),
            layout(ops["v"]), layout(ops["mask"]) if raw["mask"] else None,
            tuple(int(x) for x in ops["o"]["shape"]), bool(raw.get("safe_softmax", False)))
    except (KeyError, TypeError, ValueError) as exc:
        raise CompileError(f"@{name}: malformed pbsdk.attention descriptor: {exc!r}", op="func.func") from exc
    if int(raw.get("block_q", kern.block_q)) != kern.block_q:
        raise CompileError(f"@{name}: pbsdk.attention descriptor: block_q {raw['block_q']} is not q_vectors x lanes "
                           f"({kern.block_q})", op="func.func")
    if min(kern.batch, kern.sq, kern.sk, kern.d, kern.dv, kern.lanes, kern.q_vectors, kern.block_k, kern.qk_keys,
           kern.pv_cols, kern.threads) < 1:
        raise CompileError(f"@{name}: pbsdk.attention descriptor with an empty dimension or tile: {kern}",
                           op="func.func")
    return kern


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


def _build_part(name: str, a: LanesKernel, names: list[str], shapes: list[tuple[int, ...]]) -> func.FuncOp:
    """``@{name}_part(..., %t)``: the work items of thread ``%t``."""
    t = a.dtype
    L, nvq, br, bc, nj = a.lanes, a.q_vectors, a.block_q, a.block_k, a.qk_keys
    D, DV, SQ, SK = a.d, a.dv, a.sq, a.sk
    et = element_type(t)
    vt = ir.VectorType.get([L], et)
    vit = ir.VectorType.get([L], ir.IntegerType.get_signless(32))
    mt = ir.VectorType.get([L], ir.IntegerType.get_signless(1))
    i32 = ir.IntegerType.get_signless(32)
    nqb = a.q_blocks
    items = a.work_items
    T = a.threads
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
        qscale = float_constant(rounded(a.scale * LOG2E), et)
        if a.mask is not None:
            vmscale = _splat(vt, rounded(a.mask_scale * LOG2E))
            vlowest = _splat(vt, F32_LOWEST)
            if a.mask.row_stride not in (0, 1):
                vmidx = _int_vector(vit, [i * a.mask.row_stride for i in range(L)])
        i64 = ir.IntegerType.get_signless(64)
        align = ir.IntegerAttr.get(i64, 64)
        Qt, St, Ot = (memref.AllocaOp(memref_t([n * br], t), [], [], alignment=align).result for n in (D, bc, DV))

        with loop(tid, c(items), c(T)) as work:
            it = work.induction_variable
            beta = ix.divui(it, nqb)
            qb = ix.remui(it, nqb)
            i0 = ix.mul(qb, br)
            nqv = ix.min(c(br), ix.sub(c(SQ), i0))
            qoff, koff, voff = batch_start(ix, beta, a.q), batch_start(ix, beta, a.k), batch_start(ix, beta, a.v)
            moff = batch_start(ix, beta, a.mask) if a.mask is not None else None
            ooff = ix.mul(beta, SQ * DV)
            # Lanes past the sequence end: masks for the mask reads.
            lane_masks = []
            if a.mask is not None and a.mask.row_stride != 0:
                for v in range(nvq):
                    cnt = ix.min(ix.max(ix.sub(nqv, c(v * L)), c(0)), c(L))
                    lane_masks.append(vector.create_mask(mt, [cnt]))
            # Query indices (+ causal offset) per lane, for the causal compare.
            qlanes = []
            if a.causal_offset is not None:
                for v in range(nvq):
                    base = arith.index_cast(i32, ix.add(i0, c(v * L + a.causal_offset)))
                    qlanes.append(arith.addi(vector.broadcast(vit, base), viota))

            # Qt = zero, then Qt[d, i] = Q[i0 + i, d] * scale * log2(e)
            for buf, rows in ((Qt, D), (Ot, DV)):
                with loop(c(0), c(rows), c(1)) as ld:
                    row = ix.mul(ld.induction_variable, br)
                    for v in range(nvq):
                        vector.store(vzero, buf, [ix.add(row, c(v * L))])
            with loop(c(0), nqv, c(1)) as li:
                i = li.induction_variable
                qrow = ix.add(qoff, ix.mul(ix.add(i0, i), a.q.row_stride))
                with loop(c(0), c(D), c(1)) as ld:
                    d = ld.induction_variable
                    x = memref.load(flat["Q"], [ix.add(qrow, ix.mul(d, a.q.col_stride))])
                    y = arith.mulf(x, qscale)
                    memref.store(y, Qt, [ix.add(ix.mul(d, br), i)])

            # Keys this query block needs.
            if a.causal_offset is None:
                kend = c(SK)
            else:
                qend = ix.min(ix.add(i0, c(br)), c(SQ))
                kend = ix.min(ix.max(ix.add(qend, c(a.causal_offset)), c(0)), c(SK))

            with loop(c(0), kend, c(bc), [vninf] * nvq + [vzero] * nvq) as kl:
                j0 = kl.induction_variable
                m_old, l_old = list(kl.inner_iter_args[:nvq]), list(kl.inner_iter_args[nvq:])
                jn = ix.min(c(bc), ix.sub(kend, j0))
                ntile = ix.divui(jn, nj)
                jfull = ix.mul(ntile, nj)

                def qk_tile(keys: int, jl: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
                    """Scores of ``keys`` keys from local row ``jl`` for every query vector; returns new maxima."""
                    ja = ix.add(j0, jl)
                    kbase = [ix.add(koff, ix.mul(ix.add(ja, c(kk)), a.k.row_stride)) for kk in range(keys)]
                    with loop(c(0), c(D), c(1), [vzero] * (keys * nvq)) as dl:
                        dd = dl.induction_variable
                        accs = list(dl.inner_iter_args)
                        qrow_d = ix.mul(dd, br)
                        qv = [vector.load(vt, Qt, [ix.add(qrow_d, c(v * L))]) for v in range(nvq)]
                        outs = []
                        kd = ix.mul(dd, a.k.col_stride)
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
                        if a.causal_offset is not None:
                            kv = vector.broadcast(vit, arith.index_cast(i32, key))
                        if a.mask is not None:
                            assert moff is not None
                            mcol = ix.add(moff, ix.mul(key, a.mask.col_stride))
                        for v in range(nvq):
                            s = res[kk * nvq + v]
                            if a.mask is not None:
                                mrow = ix.add(mcol, ix.mul(ix.add(i0, c(v * L)), a.mask.row_stride))
                                if a.mask.row_stride == 0:
                                    mv = vector.broadcast(vt, memref.load(flat["M"], [mcol]))
                                elif a.mask.row_stride == 1:
                                    mv = vector.MaskedLoadOp(vt, flat["M"], [mrow], lane_masks[v], vzero).result
                                else:
                                    mv = vector.GatherOp(vt, flat["M"], [mrow], vmidx, lane_masks[v], vzero).result
                                # s + mask·log2(e) overflows to -inf for a finite mask below
                                # -FLT_MAX / log2(e) (BERT's padding mask is -FLT_MAX) where torch's
                                # score stays finite: floor it at -FLT_MAX unless the mask is -inf, so a
                                # row of such keys is uniform (as in torch), and only -inf masks mask.
                                sm = _vmax(vlowest, vector.fma(mv, vmscale, s))
                                s = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, mv, vninf), vninf, sm)
                            if a.causal_offset is not None:
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
                    ncol = min(a.pv_cols, DV - c0)
                    inits = []
                    for r in range(ncol):
                        for v in range(nvq):
                            old = vector.load(vt, Ot, [c((c0 + r) * br + v * L)])
                            inits.append(arith.mulf(old, alpha[v]))
                    with loop(c(0), jn, c(1), inits) as pl:
                        srow = ix.mul(pl.induction_variable, br)
                        pv = [vector.load(vt, St, [ix.add(srow, c(v * L))]) for v in range(nvq)]
                        vrow = ix.add(voff, ix.mul(ix.add(j0, pl.induction_variable), a.v.row_stride))
                        outs = []
                        for r in range(ncol):
                            vs = memref.load(flat["V"], [ix.add(vrow, c((c0 + r) * a.v.col_stride))])
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
            if a.safe_softmax:  # l = 0: every key of the row masked; torch's safe softmax gives 0 there
                inv = [arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, kl.results[nvq + v], vzero), vzero, inv[v])
                       for v in range(nvq)]
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


def build_lanes_kernel(fn: func.FuncOp, a: LanesKernel) -> func.FuncOp:
    """Give the declaration ``fn`` (``@{name}(Q, K, V[, M], O)``) its body and build ``@{name}_part`` in front
    of it (in the current context and location); returns ``fn``."""
    name = ir.StringAttr(fn.sym_name).value
    names = ["Q", "K", "V"] + (["M"] if a.mask is not None else []) + ["O"]
    with ir.InsertionPoint(fn):
        part = _build_part(name, a, names, a.shapes)
    entry = fn.add_entry_block()
    with ir.InsertionPoint(entry):
        call_parts(ir.StringAttr(part.sym_name).value, list(entry.arguments), a.threads)
        func.ReturnOp([])
    return fn


def _check_signature(fn: func.FuncOp, name: str, a: LanesKernel) -> None:
    """The declaration's arguments must be the descriptor's buffers (static, identity layout, its dtype)."""
    want = [str(memref_t(s, a.dtype)) for s in a.shapes]
    have = [str(t) for t in fn.type.inputs]
    if have != want or fn.type.results:
        raise CompileError(f"@{name} takes ({', '.join(have)}); its pbsdk.attention descriptor needs "
                           f"({', '.join(want)})", op="func.func")


def _part_of(module: ir.Module, name: str) -> list[func.FuncOp]:
    return [f for f in module.body.operations
            if f.operation.name == "func.func" and ir.StringAttr(f.sym_name).value == f"{name}_part"]


class AttentionKernels:
    """The cpu target's ``attention`` stage: every private ``func.func`` marked ``pbsdk.attention`` with a
    ``"lanes"`` descriptor gets the kernel above as its body (the mark is then dropped: the function is
    an ordinary kernel). Scratchpad descriptors are not this target's form and are left alone.

    The kernel is normalised the way the core's stages normalise code they carry (``canonicalize``,
    ``cse`` on its two functions), so it reaches the lowering stages as it did when the core built it."""

    def apply(self, module: ir.Module, ctx: StageContext) -> ir.Module:
        from mlir.passmanager import PassManager

        built: list[func.FuncOp] = []
        with module.context, ir.Location.unknown():
            for fn in list(module.body.operations):
                if fn.operation.name != "func.func" or attrs.ATTENTION not in fn.attributes:
                    continue
                name = ir.StringAttr(fn.sym_name).value
                try:
                    raw = attrs.data(fn, attrs.ATTENTION) or {}
                except TypeError as exc:
                    raise CompileError(f"@{name}: malformed pbsdk.attention descriptor: {exc}",
                                       op="func.func") from exc
                if not is_lanes(raw):
                    continue
                a = parse_descriptor(raw, name)
                if len(fn.regions[0].blocks) > 0:
                    raise CompileError(f"@{name} has a body; a \"lanes\" pbsdk.attention function is a "
                                       "declaration the target builds", op="func.func")
                _check_signature(fn, name, a)
                built += [build_lanes_kernel(fn, a), *_part_of(module, name)]
                del fn.attributes[attrs.ATTENTION]
            if built:
                pm = PassManager.parse("func.func(canonicalize, cse)")
                for f in built:
                    pm.run(f.operation)
        return module


__all__ = ["AttentionKernels", "LanesKernel", "build_lanes_kernel", "is_lanes", "parse_descriptor"]
