"""Generate the packed, register-tiled kernel of a (batched) matmul from its plan — as MLIR text.

The loop nest is the BLIS one (Goto's algorithm), with every size taken from a `Blocking`:

    for (batch, rows, cols) of this thread's part           -- parallel over the spec's cores
      for jc in cols step NC                                  -- B panel, packed, lives in the outer cache
        for pc in 0..K step KC
          pack B[pc:+kc, jc:+nc] into nc/nr micro-panels (kc x nr, contiguous)
          for ic in rows step MC                              -- A block, packed, lives in the middle cache
            pack A[ic:+mc, pc:+kc] row by row (row stride KCP, padded against set conflicts)
            for jr in 0..nc step nr
              for ir in 0..mc step mr
                micro-kernel: mr x (nr/lanes) vector accumulators carried through the k loop as
                loop-carried SSA values (so they stay in registers), one broadcast of A and
                nr/lanes vector loads of B per k step, then C += acc (masked at the edges)

Packing copies are vector loads/stores (masked at the k and n tails). Rows and columns of a micro-tile
beyond the matrix are computed on whatever the packed buffer holds and never stored, so the packed
buffers need no zero padding. The kernel accumulates into C (``C += A @ B``), which is what
``linalg.matmul`` means; the preceding ``linalg.fill`` stays separate.

This module only writes text; `pbsdk.core.passes.contraction_codegen` decides where to use it.
"""

from __future__ import annotations

import dataclasses

from pbsdk.core.ir.mlir_text import MlirText
from pbsdk.core.plan.contraction import Blocking


@dataclasses.dataclass(frozen=True)
class MatmulShape:
    m: int
    n: int
    k: int
    batch: int  # 0: plain matmul (rank-2 operands); >= 1: batched (rank-3 operands)
    dtype: str
    a_type: str  # the operands' memref types, printed
    b_type: str
    c_type: str



#: A is packed k-major in mr-row micro-panels (one contiguous stream for the broadcasts); False packs it
#: row by row (vector copies, mr streams).
PANEL_A = True


def _kcp(kc: int, lanes: int, elem_bytes: int) -> int:
    """Row stride of packed A: kc, padded by one vector when rows would alias in the cache's sets."""
    return kc + lanes if (kc * elem_bytes) % 512 == 0 else kc


_CMPF = ("false", "oeq", "ogt", "oge", "olt", "ole", "one", "ord", "ueq", "ugt", "uge", "ult", "ule", "une",
         "uno", "true")


@dataclasses.dataclass(frozen=True)
class EpilogueOp:
    """One scalar op of the epilogue body: ``result = op(operands)``. Operands name earlier results,
    ``"acc"`` (the contraction's value), ``"in<i>"`` (extra input i) — or, for ``arith.constant``,
    ``value`` holds the literal. ``predicate`` is cmpf's."""

    result: str
    op: str
    operands: tuple[str, ...] = ()
    value: float = 0.0
    predicate: int = 0


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """An elementwise op applied to the contraction's result before it is stored.

    ``inputs``: (kind, memref type) of each extra operand, kind ``full`` (same indices as C), ``col``
    (indexed by the column), ``row`` (by the row) or ``scalar``."""

    inputs: tuple[tuple[str, str], ...]
    body: tuple[EpilogueOp, ...]
    result: str
    out_type: str


#: Epilogue ops with a vector form of the same name (operands and result all of the vector type).
VECTOR_SAME = {"arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.maximumf", "arith.minimumf",
               "arith.maxnumf", "arith.minnumf", "arith.negf", "math.exp", "math.tanh", "math.erf", "math.log",
               "math.sqrt", "math.rsqrt", "math.absf", "math.exp2", "math.log1p", "math.expm1"}
EPILOGUE_OPS = VECTOR_SAME | {"arith.constant", "arith.cmpf", "arith.select"}


def _literal(v: float) -> str:
    import math as _m
    import struct
    if _m.isfinite(v):
        return f"{v:.17e}"
    return "0x" + struct.pack(">f", v).hex().upper()


def _epilogue_values(e: MlirText, ep: Epilogue, acc: str, lead: str, r: str, col: str, mask: str | None,
                     vt: str, mt: str) -> str:
    """Emit the epilogue on one vector of results; returns the value to store."""
    env = {"acc": acc}
    for i, (kind, t) in enumerate(ep.inputs):
        x = e.fresh("ep")
        if kind == "full":
            if mask is None:
                e(f"{x} = vector.load %E{i}[{lead}{r}, {col}] : {t}, {vt}")
            else:
                e(f"{x} = vector.maskedload %E{i}[{lead}{r}, {col}], {mask}, %vzero : {t}, {mt}, {vt} into {vt}")
        elif kind == "col":
            if mask is None:
                e(f"{x} = vector.load %E{i}[{col}] : {t}, {vt}")
            else:
                e(f"{x} = vector.maskedload %E{i}[{col}], {mask}, %vzero : {t}, {mt}, {vt} into {vt}")
        else:
            s = e.fresh("es")
            idx = f"[{r}]" if kind == "row" else "[]"
            e(f"{s} = memref.load %E{i}{idx} : {t}")
            e(f"{x} = vector.broadcast {s} : {vt.split('x')[1][:-1]} to {vt}")
        env[f"in{i}"] = x
    for op in ep.body:
        x = e.fresh("ev")
        args = [env[o] for o in op.operands]
        if op.op == "arith.constant":
            e(f"{x} = arith.constant dense<{_literal(op.value)}> : {vt}")
        elif op.op == "arith.cmpf":
            e(f"{x} = arith.cmpf {_CMPF[op.predicate]}, {args[0]}, {args[1]} : {vt}")
        elif op.op == "arith.select":
            e(f"{x} = arith.select {args[0]}, {args[1]}, {args[2]} : {mt}, {vt}")
        else:
            e(f"{x} = {op.op} {', '.join(args)} : {vt}")
        env[op.result] = x
    return env[ep.result]


def kernel_text(name: str, shape: MatmulShape, blk: Blocking, epilogue: Epilogue | None = None, *,
                zero_init: bool = False) -> str:
    """Two functions: ``@{name}`` (the op: one call per thread part inside an ``scf.forall``) and
    ``@{name}_part`` (one thread's part, given its index). With an ``epilogue`` both take its inputs
    and its output buffer ``D`` after ``A, B, C``, and the last k block stores ``epilogue(C + acc)`` to
    ``D``; ``C`` then holds partial sums only. With ``zero_init`` C's initial contents are taken to be
    zero (the fill before it is dropped): the first k block stores instead of adding."""
    t = shape.dtype
    L, mr, nv, nr = blk.lanes, blk.mr, blk.nv, blk.nr
    eb = {"f32": 4, "f64": 8, "f16": 2, "bf16": 2}[t]
    vt = f"vector<{L}x{t}>"
    mt = f"vector<{L}xi1>"
    kcp = _kcp(blk.kc, L, eb)
    mc_alloc = blk.mc
    ap_type = f"memref<{blk.mc // mr}x{blk.kc}x{mr}x{t}>" if PANEL_A else f"memref<{mc_alloc}x{kcp}x{t}>"
    nc_alloc = blk.nc
    batched = shape.batch >= 1
    c = {}

    def const(v: int) -> str:
        if v not in c:
            c[v] = f"%c{v}"
        return c[v]

    # Thread partition: [b0, b1) x [m0, m1) x [n0, n1).
    T = blk.threads
    extra = [] if epilogue is None else [f"%E{i}: {t}" for i, (_, t) in enumerate(epilogue.inputs)] + \
        [f"%D: {epilogue.out_type}"]
    sig = ", ".join([f"%A: {shape.a_type}", f"%B: {shape.b_type}", f"%C: {shape.c_type}"] + extra)
    arg_names = ", ".join(["%A", "%B", "%C"] + [x.split(":")[0] for x in extra])
    arg_types = ", ".join([shape.a_type, shape.b_type, shape.c_type] + [x.split(": ", 1)[1] for x in extra])
    body = MlirText()
    body.depth = 1
    e = body

    def minsi(a: str, b: str) -> str:
        r = e.fresh("mn")
        e(f"{r} = arith.minsi {a}, {b} : index")
        return r

    def maxsi(a: str, b: str) -> str:
        r = e.fresh("mx")
        e(f"{r} = arith.maxsi {a}, {b} : index")
        return r

    def add(a: str, b: str) -> str:
        r = e.fresh("ad")
        e(f"{r} = arith.addi {a}, {b} : index")
        return r

    def sub(a: str, b: str) -> str:
        r = e.fresh("sb")
        e(f"{r} = arith.subi {a}, {b} : index")
        return r

    def mul(a: str, b: str) -> str:
        r = e.fresh("ml")
        e(f"{r} = arith.muli {a}, {b} : index")
        return r

    def divu(a: str, b: str) -> str:
        r = e.fresh("dv")
        e(f"{r} = arith.divui {a}, {b} : index")
        return r

    M, N, K, B = shape.m, shape.n, shape.k, max(shape.batch, 1)

    def part(extent: int, unit: int) -> int:
        """Elements per thread along a split dimension: whole units, spread evenly."""
        units = -(-extent // unit)
        return -(-units // T) * unit

    b0, b1, m0, m1, n0, n1 = const(0), const(B), const(0), const(M), const(0), const(N)
    if T > 1:
        if blk.split == "batch":
            per = part(B, 1)
            b0 = mul("%t", const(per))
            b1 = minsi(add(b0, const(per)), const(B))
        elif blk.split == "m":
            per = part(M, mr)
            m0 = mul("%t", const(per))
            m1 = minsi(add(m0, const(per)), const(M))
        else:
            per = part(N, nr)
            n0 = mul("%t", const(per))
            n1 = minsi(add(n0, const(per)), const(N))

    e(f"%Ap = memref.alloc() {{alignment = 64 : i64}} : {ap_type}")
    if blk.pack_b:
        e(f"%Bp = memref.alloc() {{alignment = 64 : i64}} : memref<{nc_alloc // nr}x{blk.kc}x{nr}x{t}>")
    e(f"%zero = arith.constant 0.0 : {t}")
    e(f"%vzero = arith.constant dense<0.0> : {vt}")
    lead = "%b, " if batched else ""

    e.open(f"scf.for %b = {b0} to {b1} step {const(1)} {{")
    e.open(f"scf.for %jc = {n0} to {n1} step {const(blk.nc)} {{")
    nc = minsi(const(blk.nc), sub(n1, "%jc"))
    e.open(f"scf.for %pc = {const(0)} to {const(K)} step {const(blk.kc)} {{")
    kc = minsi(const(blk.kc), sub(const(K), "%pc"))
    if blk.pack_b:
        # ---- pack B: Bp[jb, k, :] = B[pc + k, jc + jb*nr + :]  (masked past this thread's columns)
        npanels = divu(add(nc, const(nr - 1)), const(nr))
        e.open(f"scf.for %jb = {const(0)} to {npanels} step {const(1)} {{")
        colbase = add("%jc", mul("%jb", const(nr)))
        counts = []
        for v in range(nv):
            col = add(colbase, const(v * L))
            cnt = minsi(maxsi(sub(n1, col), const(0)), const(L))
            msk = e.fresh("msk")
            e(f"{msk} = vector.create_mask {cnt} : {mt}")
            counts.append((col, msk))
        e.open(f"scf.for %kb = {const(0)} to {kc} step {const(1)} {{")
        krow = add("%pc", "%kb")
        for v, (col, msk) in enumerate(counts):
            val = e.fresh("bv")
            e(f"{val} = vector.maskedload %B[{lead}{krow}, {col}], {msk}, %vzero : {shape.b_type}, {mt}, {vt} into {vt}")
            e(f"vector.store {val}, %Bp[%jb, %kb, {const(v * L)}] : memref<{nc_alloc // nr}x{blk.kc}x{nr}x{t}>, {vt}")
        e.close()
        e.close()
    # ---- A blocks
    e.open(f"scf.for %ic = {m0} to {m1} step {const(blk.mc)} {{")
    mc = minsi(const(blk.mc), sub(m1, "%ic"))
    if PANEL_A:
        e.open(f"scf.for %ia = {const(0)} to {mc} step {const(1)} {{")
        arow = add("%ic", "%ia")
        ib = divu("%ia", const(mr))
        ii = e.fresh("ii")
        e(f"{ii} = arith.remui %ia, {const(mr)} : index")
        e.open(f"scf.for %ka = {const(0)} to {kc} step {const(1)} {{")
        val = e.fresh("as")
        e(f"{val} = memref.load %A[{lead}{arow}, {add('%pc', '%ka')}] : {shape.a_type}")
        e(f"memref.store {val}, %Ap[{ib}, %ka, {ii}] : {ap_type}")
        e.close()
        e.close()
    else:
        e.open(f"scf.for %ia = {const(0)} to {mc} step {const(1)} {{")
        arow = add("%ic", "%ia")
        e.open(f"scf.for %ka = {const(0)} to {kc} step {const(L)} {{")
        cnt = minsi(sub(kc, "%ka"), const(L))
        msk = e.fresh("msk")
        e(f"{msk} = vector.create_mask {cnt} : {mt}")
        val = e.fresh("av")
        e(f"{val} = vector.maskedload %A[{lead}{arow}, {add('%pc', '%ka')}], {msk}, %vzero : "
          f"{shape.a_type}, {mt}, {vt} into {vt}")
        e(f"vector.maskedstore %Ap[%ia, %ka], {msk}, {val} : {ap_type}, {mt}, {vt}")
        e.close()
        e.close()
    # ---- micro-kernels
    e.open(f"scf.for %jr = {const(0)} to {nc} step {const(nr)} {{")
    panel = divu("%jr", const(nr))
    direct = []  # without packing: B's columns of this panel, and their masks past this thread's columns
    if not blk.pack_b:
        for v in range(nv):
            col = add(add("%jc", "%jr"), const(v * L))
            cnt = minsi(maxsi(sub(n1, col), const(0)), const(L))
            msk = e.fresh("bmsk")
            e(f"{msk} = vector.create_mask {cnt} : {mt}")
            direct.append((col, msk))
    e.open(f"scf.for %ir = {const(0)} to {mc} step {const(mr)} {{")
    accs = [[f"%acc_{i}_{v}" for v in range(nv)] for i in range(mr)]
    inits = ", ".join(f"{a} = %vzero" for row in accs for a in row)
    types = ", ".join([vt] * (mr * nv))
    res = e.fresh("r")
    rows = [add("%ir", const(i)) if i else "%ir" for i in range(mr)] if not PANEL_A else []
    apanel = divu("%ir", const(mr))
    e.open(f"{res}:{mr * nv} = scf.for %k = {const(0)} to {kc} step {const(1)} iter_args({inits}) -> ({types}) {{")
    bvs = []
    for v in range(nv):
        bv = e.fresh("b")
        if direct:
            col, msk = direct[v]
            e(f"{bv} = vector.maskedload %B[{lead}{add('%pc', '%k')}, {col}], {msk}, %vzero : "
              f"{shape.b_type}, {mt}, {vt} into {vt}")
        else:
            e(f"{bv} = vector.load %Bp[{panel}, %k, {const(v * L)}] : memref<{nc_alloc // nr}x{blk.kc}x{nr}x{t}>, {vt}")
        bvs.append(bv)
    outs = []
    for i in range(mr):
        a = e.fresh("a")
        if PANEL_A:
            e(f"{a} = memref.load %Ap[{apanel}, %k, {const(i)}] : {ap_type}")
        else:
            e(f"{a} = memref.load %Ap[{rows[i]}, %k] : {ap_type}")
        ab = e.fresh("ab")
        e(f"{ab} = vector.broadcast {a} : {t} to {vt}")
        for v in range(nv):
            o = e.fresh("f")
            e(f"{o} = vector.fma {ab}, {bvs[v]}, {accs[i][v]} : {vt}")
            outs.append(o)
    e(f"scf.yield {', '.join(outs)} : {types}")
    e.close()
    # ---- C += acc
    crow0 = add("%ic", "%ir")
    ccol0 = add("%jc", "%jr")
    rvalid = minsi(sub(m1, crow0), const(mr))
    cvalid = minsi(sub(n1, ccol0), const(nr))
    full_r = e.fresh("fr")
    e(f"{full_r} = arith.cmpi eq, {rvalid}, {const(mr)} : index")
    full_c = e.fresh("fc")
    e(f"{full_c} = arith.cmpi eq, {cvalid}, {const(nr)} : index")
    full = e.fresh("full")
    e(f"{full} = arith.andi {full_r}, {full_c} : i1")

    first = e.fresh("first")
    e(f"{first} = arith.cmpi eq, %pc, {const(0)} : index")

    def update(masked: bool, fused: bool) -> None:
        """C (+)= acc for this micro-tile; on the last k block with an epilogue, the epilogue's value
        goes to D instead."""
        vmasks = []
        if masked:
            for v in range(nv):
                cnt = minsi(maxsi(sub(cvalid, const(v * L)), const(0)), const(L))
                msk = e.fresh("msk")
                e(f"{msk} = vector.create_mask {cnt} : {mt}")
                vmasks.append(msk)
        for i in range(mr):
            if masked:
                ok = e.fresh("ok")
                e(f"{ok} = arith.cmpi slt, {const(i)}, {rvalid} : index")
                e.open(f"scf.if {ok} {{")
            r = add(crow0, const(i)) if i else crow0
            for v in range(nv):
                col = add(ccol0, const(v * L)) if v else ccol0
                old = e.fresh("o")
                if zero_init:
                    e.open(f"{old} = scf.if {first} -> ({vt}) {{")
                    e(f"scf.yield %vzero : {vt}")
                    e.close("} else {")
                    e.depth += 1
                    loaded = e.fresh("o")
                else:
                    loaded = old
                if masked:
                    e(f"{loaded} = vector.maskedload %C[{lead}{r}, {col}], {vmasks[v]}, %vzero : "
                      f"{shape.c_type}, {mt}, {vt} into {vt}")
                else:
                    e(f"{loaded} = vector.load %C[{lead}{r}, {col}] : {shape.c_type}, {vt}")
                if zero_init:
                    e(f"scf.yield {loaded} : {vt}")
                    e.depth -= 1
                    e("}")
                new = e.fresh("n")
                e(f"{new} = arith.addf {old}, {res}#{i * nv + v} : {vt}")
                dst, dst_t = "%C", shape.c_type
                if fused:
                    assert epilogue is not None
                    new = _epilogue_values(e, epilogue, new, lead, r, col, vmasks[v] if masked else None, vt, mt)
                    dst, dst_t = "%D", epilogue.out_type
                if masked:
                    e(f"vector.maskedstore {dst}[{lead}{r}, {col}], {vmasks[v]}, {new} : {dst_t}, {mt}, {vt}")
                else:
                    e(f"vector.store {new}, {dst}[{lead}{r}, {col}] : {dst_t}, {vt}")
            if masked:
                e.close()

    def both(fused: bool) -> None:
        e.open(f"scf.if {full} {{")
        update(False, fused)
        e.close("} else {")
        e.depth += 1
        update(True, fused)
        e.depth -= 1
        e("}")

    if epilogue is None:
        both(False)
    else:
        last = e.fresh("last")
        e(f"{last} = arith.cmpi sge, {add('%pc', kc)}, {const(K)} : index")
        e.open(f"scf.if {last} {{")
        both(True)
        e.close("} else {")
        e.depth += 1
        both(False)
        e.depth -= 1
        e("}")
    e.close()  # ir
    e.close()  # jr
    e.close()  # ic
    e.close()  # pc
    e.close()  # jc
    e.close()  # b
    e(f"memref.dealloc %Ap : {ap_type}")
    if blk.pack_b:
        e(f"memref.dealloc %Bp : memref<{nc_alloc // nr}x{blk.kc}x{nr}x{t}>")
    e("return")

    # Batched operands are indexed [b, row, col]; plain ones [row, col] (the %b loop runs once).
    out = [f"func.func @{name}_part({sig}, %t: index) {{"]  # public: the fork glue links to it
    out += [f"  {v} = arith.constant {k} : index" for k, v in sorted(c.items())]
    out += body.lines
    out.append("}")
    out.append(f"func.func private @{name}({sig}) {{")
    if T > 1:
        out.append(f"  scf.forall (%t) in ({T}) {{")
        out.append(f"    func.call @{name}_part({arg_names}, %t) : ({arg_types}, index) -> ()")
        out.append("  }")
    else:
        out.append("  %t0 = arith.constant 0 : index")
        out.append(f"  func.call @{name}_part({arg_names}, %t0) : ({arg_types}, index) -> ()")
    out.append("  return")
    out.append("}")
    return "\n".join(out) + "\n"
