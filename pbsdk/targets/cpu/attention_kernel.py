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

bf16 operands with a ``unit`` in the descriptor (the host's ``vdpbf16ps``: pairs of bf16 into f32 lanes) take
the unit through the target's ``unit_step`` hook (`_Part`): Q packed as pairs of d per query lane, Q·Kᵀ over
pairs of d with K's pair broadcast, the scores scaled in f32; with ``p_dtype`` bf16 also P rounded and
interleaved as pairs of keys and P·V over pairs of keys on V's key block packed likewise. The operand dtypes
(``dtype``, ``mask_dtype``, ``out_dtype``) are converted as they are read and written.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith, func, memref, scf, vector

from pbsdk.core.dims import Dim, static
from pbsdk.core.errors import CompileError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.ir.attention_tiles import (
    DESCRIPTOR_VERSION,
    OperandLayout,
    batch_start,
    rounded,
    size_from_descriptor,
    unit_from_descriptor,
)
from pbsdk.core.ir.builder import (
    Indices,
    call_parts,
    element_type,
    float_constant,
    loop,
    reassociation,
    transpose_vectors,
)
from pbsdk.core.ir.builder import memref_type as memref_t
from pbsdk.core.pipeline import StageContext
from pbsdk.core.plan.attention import IO_DTYPES, UnitChoice
from pbsdk.core.spec import dtype_bits
from pbsdk.targets.cpu.unit_kernel import StepFn, broadcast_word, group_word, interleave

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
    sk: int | Dim  # a `Dim`: known at run time, read from a buffer's dimension (`_Part.bind_symbols`)
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
    out_shape: tuple[int | Dim, ...]
    safe_softmax: bool = False  # a row with every key masked gives 0 (torch's safe softmax), not NaN
    out_dtype: str = ""  # the output's dtype ("": dtype)
    mask_dtype: str = ""  # the mask's dtype ("": dtype)
    unit: UnitChoice | None = None  # the unit Q·Kᵀ issues (a pair of the dtype per lane), else FMAs
    p_dtype: str = "f32"  # P's dtype for P·V: the unit's operand dtype (P·V on the unit), or f32 (FMAs)
    along: str = "queries"  # what runs along the lanes: a block of queries, or ("keys") the keys of one query

    def __post_init__(self) -> None:
        for name in ("out_dtype", "mask_dtype"):
            if not getattr(self, name):
                object.__setattr__(self, name, self.dtype)

    @property
    def block_q(self) -> int:
        return self.q_vectors * self.lanes

    @property
    def q_blocks(self) -> int:
        return -(-self.sq // self.block_q)

    @property
    def work_items(self) -> int:
        return self.batch * (self.sq if self.along == "keys" else self.q_blocks)

    @property
    def shapes(self) -> list[tuple[int | Dim, ...]]:
        """The kernel's argument shapes: Q, K, V[, M], O."""
        return [self.q.shape, self.k.shape, self.v.shape] + ([self.mask.shape] if self.mask else []) + [self.out_shape]

    @property
    def arg_dtypes(self) -> list[str]:
        """The kernel's argument dtypes: Q, K, V[, M], O."""
        return [self.dtype] * 3 + ([self.mask_dtype] if self.mask else []) + [self.out_dtype]


def is_lanes(raw: Mapping[str, Any]) -> bool:
    """Whether a parsed descriptor is of the ``"lanes"`` form (a scratchpad one has no ``form``)."""
    return raw.get("form") == "lanes"


def parse_descriptor(raw: Mapping[str, Any], name: str = "__pbsdk_attn") -> LanesKernel:
    """The kernel of a ``"lanes"`` descriptor (plain data) of function ``@name``; a `CompileError` naming
    what is wrong."""
    if raw.get("version") not in READS:
        raise CompileError(f"@{name}: pbsdk.attention descriptor version {raw.get('version')} (the cpu target reads "
                           f"{', '.join(map(str, READS))})", op="func.func")
    try:
        ops = raw["operands"]
        layout = OperandLayout.from_descriptor
        kern = LanesKernel(
            int(raw["batch"]), int(raw["sq"]), size_from_descriptor(raw["sk"]), int(raw["d"]), int(raw["dv"]), str(raw["dtype"]),
            None if raw["causal_offset"] is None else int(raw["causal_offset"]), float(raw["scale"]),
            float(raw["mask_scale"]), int(raw["lanes"]), int(raw["q_vectors"]), int(raw["block_k"]),
            int(raw["qk_keys"]), int(raw["pv_cols"]), int(raw["threads"]), layout(ops["q"]), layout(ops["k"]),
            layout(ops["v"]), layout(ops["mask"]) if raw["mask"] else None,
            tuple(size_from_descriptor(x) for x in ops["o"]["shape"]), bool(raw.get("safe_softmax", False)),
            str(raw.get("out_dtype", raw["dtype"])), str(raw.get("mask_dtype", raw["dtype"])),
            unit_from_descriptor(raw.get("unit")), str(raw.get("p_dtype", "f32")), str(raw.get("along", "queries")))
    except (KeyError, TypeError, ValueError) as exc:
        raise CompileError(f"@{name}: malformed pbsdk.attention descriptor: {exc!r}", op="func.func") from exc
    if kern.along not in ("queries", "keys") or (kern.along == "keys" and (
            kern.unit is not None or kern.lanes & (kern.lanes - 1) or kern.block_k != kern.lanes)):
        raise CompileError(f"@{name}: pbsdk.attention descriptor: along {kern.along!r} (\"queries\", or \"keys\" with "
                           f"no unit, a power-of-two lane count and key blocks of one vector)", op="func.func")
    u = kern.unit
    if u is not None and (u.m != 1 or u.n != kern.lanes or u.k != 2 or u.operand_dtype != kern.dtype
                          or u.accumulator_dtype != "f32" or u.k * dtype_bits(kern.dtype) != 32):
        raise CompileError(f"@{name}: pbsdk.attention descriptor: unit {u.describe()} is not one of pairs of "
                           f"{kern.dtype} into {kern.lanes} f32 lanes (the cpu kernel's)", op="func.func")
    if kern.p_dtype not in ("f32", *((kern.dtype,) if u is not None else ())):
        raise CompileError(f"@{name}: pbsdk.attention descriptor: p_dtype {kern.p_dtype} (f32, or the unit's "
                           f"{kern.dtype})", op="func.func")
    for what, dt in (("dtype", kern.dtype), ("out_dtype", kern.out_dtype), ("mask_dtype", kern.mask_dtype)):
        if dt not in IO_DTYPES:
            raise CompileError(f"@{name}: pbsdk.attention descriptor: {what} {dt} (the cpu kernel converts "
                               f"{', '.join(IO_DTYPES)})", op="func.func")
    if int(raw.get("block_q", kern.block_q)) != kern.block_q:
        raise CompileError(f"@{name}: pbsdk.attention descriptor: block_q {raw['block_q']} is not q_vectors x lanes "
                           f"({kern.block_q})", op="func.func")
    if min(kern.batch, kern.sq, kern.d, kern.dv, kern.lanes, kern.q_vectors, kern.block_k, kern.qk_keys,
           kern.pv_cols, kern.threads, *((kern.sk,) if isinstance(kern.sk, int) else ())) < 1:
        raise CompileError(f"@{name}: pbsdk.attention descriptor with an empty dimension or tile: {kern}",
                           op="func.func")
    _check_dynamic(kern, name)
    return kern


#: The descriptor versions this kernel reads (version 1: static sizes only; 2 adds a key length known at run time).
READS = (1, DESCRIPTOR_VERSION)


def _sizes(a: LanesKernel) -> list[int | Dim]:
    """Every size and stride of ``a`` that may be known only at run time."""
    out: list[int | Dim] = [a.sk, *a.out_shape]
    for lay in (a.q, a.k, a.v, *((a.mask,) if a.mask is not None else ())):
        out += [*lay.shape, lay.row_stride, lay.col_stride, *(st for _, st, _ in lay.batch)]
    return out


def _binders(a: LanesKernel) -> dict[str, tuple[int, int, int]]:
    """For each symbol: (argument, dimension, constant) of the first argument dimension that is the symbol plus a
    constant, where the kernel reads it (`memref.dim` minus the constant)."""
    found: dict[str, tuple[int, int, int]] = {}
    for i, shape in enumerate(a.shapes):
        for j, d in enumerate(shape):
            if isinstance(d, Dim) and len(d.coeffs) == 1 and d.coeffs[0][1] == 1 and d.linear:
                found.setdefault(d.coeffs[0][0], (i, j, d.const))
    return found


def _check_dynamic(a: LanesKernel, name: str) -> None:
    """A kernel with sizes known at run time: only the key length (and what depends on it) may be; every symbol is
    a buffer dimension the kernel can read; no causal pattern (its diagonal is planned from static sizes)."""
    dims = [x for x in _sizes(a) if isinstance(x, Dim)]
    if not dims:
        return
    if not isinstance(a.sk, Dim) or any(x.symbols != a.sk.symbols for x in dims) or _dynamic_io(a):
        raise CompileError(f"@{name}: pbsdk.attention descriptor: only the key length may be known at run time "
                           f"(sk {a.sk}; sizes {', '.join(sorted({str(x) for x in dims}))})", op="func.func")
    if a.causal_offset is not None:
        raise CompileError(f"@{name}: pbsdk.attention descriptor: a causal pattern over a key length known at run "
                           "time", op="func.func")
    unbound = [sym for sym in a.sk.symbols if sym not in _binders(a)]
    if unbound:
        raise CompileError(f"@{name}: pbsdk.attention descriptor: no buffer dimension gives {', '.join(unbound)}",
                           op="func.func")


def _dynamic_io(a: LanesKernel) -> bool:
    """Whether Q's or O's layout depends on a size known at run time (the kernel reads them at static strides)."""
    return a.q.dynamic or any(isinstance(x, Dim) for x in a.out_shape)


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


def _memref(shape: Sequence[int | Dim], dtype: str) -> ir.MemRefType:
    """``memref<shape x dtype>``, ``?`` where a size is known only at run time."""
    return memref_t([d if isinstance(d, int) else None for d in shape], dtype)


def _flat(names: list[str], shapes: list[tuple[int | Dim, ...]], args: Sequence[ir.Value],
          dtypes: Sequence[str]) -> dict[str, ir.Value]:
    """Each operand as a 1-D buffer (``memref.collapse_shape`` unless it is one; ``?`` long where a size is
    known only at run time)."""
    flat = {}
    for nm, shape, arg, dtype in zip(names, shapes, args, dtypes):
        size = None if any(isinstance(d, Dim) for d in shape) else math.prod(d for d in shape if isinstance(d, int))
        flat[nm] = arg if len(shape) == 1 else memref.CollapseShapeOp(
            memref_t([size], dtype), arg, reassociation([list(range(len(shape)))])).result
    return flat


def _widen(x: ir.Value) -> ir.Value:
    """``x`` (a scalar or vector of f32, bf16 or f16) as f32."""
    t = x.type
    f32 = ir.F32Type.get()
    if isinstance(t, ir.VectorType):
        return x if t.element_type == f32 else arith.extf(ir.VectorType.get(t.shape, f32), x)
    return x if t == f32 else arith.extf(f32, x)


class _Part:
    """Builds ``@{name}_part(..., %t)``: the work items of thread ``%t`` (see the module docstring).

    Without a unit (``step`` None) both matmuls are vector FMAs in f32 on scalars of K and V broadcast to
    the query lanes; narrow operands are widened as they are read. With one (``step(acc, a, b)``, the
    target's ``unit_step`` hook for a unit of pairs: `LanesKernel.unit`) Q is packed as pairs of d per
    query lane (``Qp``), Q·Kᵀ steps over pairs of d with K's pair broadcast as a 32-bit word and the scores
    are scaled in f32. With ``p_dtype`` the operands' dtype P·V runs on the unit too: the softmax writes P
    rounded to it as pairs of keys per query lane (``Pp``), V's key block is packed as pairs of keys per
    column (``Vp``), and P·V steps over pairs of keys with V's pair broadcast; with f32 P stays in the
    scores' tile and P·V is vector FMAs as without a unit."""

    def __init__(self, name: str, a: LanesKernel, names: list[str], shapes: list[tuple[int | Dim, ...]],
                 step: StepFn | None) -> None:
        self.name, self.a, self.names, self.shapes, self.step = name, a, names, shapes, step
        self.f32 = ir.F32Type.get()
        self.i32 = ir.IntegerType.get_signless(32)
        L = a.lanes
        self.vt = ir.VectorType.get([L], self.f32)
        self.vit = ir.VectorType.get([L], self.i32)
        self.mt = ir.VectorType.get([L], ir.IntegerType.get_signless(1))
        self.nt = element_type(a.dtype)  # Q's, K's and V's element type
        self.wide_t = ir.VectorType.get([L * 2], self.nt)  # one unit operand: a pair per lane
        self.pair_t = ir.VectorType.get([2], self.nt)
        self.pv_unit = step is not None and a.p_dtype != "f32"  # P·V on the unit (P rounded)

    def build(self) -> func.FuncOp:
        a = self.a
        index = ir.IndexType.get()
        dtypes = a.arg_dtypes
        fn = func.FuncOp(f"{self.name}_part",
                         ir.FunctionType.get([_memref(s, dt) for s, dt in zip(self.shapes, dtypes)] + [index], []),
                         visibility="private")
        entry = fn.add_entry_block()
        self.ix = Indices(entry)
        tid = entry.arguments[len(self.names)]
        with ir.InsertionPoint(entry):
            self.flat = _flat(self.names, self.shapes, entry.arguments, dtypes)
            self.bind_symbols(entry.arguments)
            self.constants()
            self.buffers()
            with loop(tid, self.ix.c(a.work_items), self.ix.c(a.threads)) as work:
                self.work_item(work.induction_variable)
            func.ReturnOp([])
        self.ix.hoist()
        return fn

    # ------------------------------------------------------------------------------------ set-up
    def bind_symbols(self, args: Sequence[ir.Value]) -> None:
        """Each symbol of a key length known at run time, read once from the buffer dimension that is it plus
        a constant (`_binders`); `size` builds every form from them."""
        self.symbols: dict[str, ir.Value] = {}
        self.sizes: dict[Dim, ir.Value] = {}
        for sym, (arg, dim, const) in _binders(self.a).items():
            value = memref.dim(args[arg], self.ix.c(dim))
            self.symbols[sym] = arith.subi(value, self.ix.c(const)) if const else value
        for x in _sizes(self.a):  # the descriptor's forms, once, where every loop sees them
            if isinstance(x, Dim) and x not in self.sizes:
                self.sizes[x] = self.size(x)

    def size(self, x: int | Dim) -> ir.Value:
        """A size or stride as an index value: a constant, or its form computed once from the symbols."""
        if isinstance(x, int):
            return self.ix.c(x)
        found = self.sizes.get(x)
        if found is not None:
            return found
        total: ir.Value | None = None  # another form (a multiple of a stride): built where it is used
        for sym, coeff in x.coeffs:
            term = self.ix.mul(self.symbols[sym], coeff)
            total = term if total is None else arith.addi(total, term)
        assert total is not None
        return arith.addi(total, self.ix.c(x.const)) if x.const else total

    def mul(self, v: ir.Value, x: int | Dim) -> ir.Value:
        """``v * x`` for a static or run-time stride ``x``."""
        return self.ix.mul(v, x) if isinstance(x, int) else arith.muli(v, self.size(x))

    def lane_offsets(self, stride: int | Dim) -> ir.Value:
        """``[0, stride, 2 stride, ...]`` as an i32 vector (a gather's indices)."""
        if isinstance(stride, int):
            return _int_vector(self.vit, [i * stride for i in range(self.a.lanes)])
        s = vector.broadcast(self.vit, arith.index_cast(self.i32, self.size(stride)))
        return arith.muli(s, _int_vector(self.vit, list(range(self.a.lanes))))

    def constants(self) -> None:
        a, vt, L = self.a, self.vt, self.a.lanes
        vc = {"zero": _splat(vt, 0.0), "ninf": _splat(vt, -math.inf), "lo": _splat(vt, -127.0),
              "magic": _splat(vt, rounded(1.5 * 2 ** 23 + 127)), "shift": _int_vector(self.vit, [23] * L)}
        for i, cf in enumerate(_EXP2_COEFFS):
            vc[f"p{i}"] = _splat(vt, rounded(cf))
        self.vc = vc
        self.vzero, self.vninf = vc["zero"], vc["ninf"]
        self.viota = _int_vector(self.vit, list(range(L)))
        if self.step is None:  # Q is scaled as it is staged
            self.qscale = float_constant(rounded(a.scale * LOG2E), self.f32)
        else:  # the scores are scaled once computed (Q stays exact in its narrow dtype)
            self.vqscale = _splat(vt, rounded(a.scale * LOG2E))
            self.nzero = _splat(self.wide_t, 0.0)
        if a.mask is not None:
            self.vmscale = _splat(vt, rounded(a.mask_scale * LOG2E))
            self.vlowest = _splat(vt, F32_LOWEST)
            if a.mask.row_stride not in (0, 1):
                self.vmidx = self.lane_offsets(a.mask.row_stride)

    def buffers(self) -> None:
        """Scratch on the stack, sized by the plan: f32 Qt (or the packed pairs Qp), the f32 scores St, f32
        Ot; with P·V on a unit also Pp (P's pairs of keys) and Vp (V's)."""
        a, br, bc = self.a, self.a.block_q, self.a.block_k
        i64 = ir.IntegerType.get_signless(64)
        align = ir.IntegerAttr.get(i64, 64)

        def alloca(n: int, t: ir.Type) -> ir.Value:
            return memref.AllocaOp(memref_t([n], t), [], [], alignment=align).result

        if self.step is None:
            self.Qt, self.St, self.Ot = (alloca(n * br, self.f32) for n in (a.d, bc, a.dv))
            return
        self.Qp = alloca(_pairs(a.d) * 2 * br, self.nt)
        self.St = alloca(bc * br, self.f32)
        self.Ot = alloca(a.dv * br, self.f32)
        if self.pv_unit:
            self.dvp = -(-a.dv // a.lanes) * a.lanes  # V's pairs per key pair, padded to whole vectors
            self.Pp = alloca(_pairs(bc) * 2 * br, self.nt)
            self.Vp = alloca(_pairs(bc) * 2 * self.dvp, self.nt)

    # ------------------------------------------------------------------------------------ one work item
    def work_item(self, it: ir.Value) -> None:
        a, ix = self.a, self.ix
        c = ix.c
        L, nvq, br = a.lanes, a.q_vectors, a.block_q
        beta = ix.divui(it, a.q_blocks)
        qb = ix.remui(it, a.q_blocks)
        self.i0 = ix.mul(qb, br)
        self.nqv = ix.min(c(br), ix.sub(c(a.sq), self.i0))
        self.qoff, self.koff, self.voff = (batch_start(ix, beta, x, self.size) for x in (a.q, a.k, a.v))
        self.moff = batch_start(ix, beta, a.mask, self.size) if a.mask is not None else None
        self.ooff = ix.mul(beta, a.sq * a.dv)
        # Lanes past the sequence end: masks for the mask reads.
        self.lane_masks = []
        if a.mask is not None and a.mask.row_stride != 0:
            for v in range(nvq):
                cnt = ix.min(ix.max(ix.sub(self.nqv, c(v * L)), c(0)), c(L))
                self.lane_masks.append(vector.create_mask(self.mt, [cnt]))
        # Query indices (+ causal offset) per lane, for the causal compare.
        self.qlanes = []
        if a.causal_offset is not None:
            for v in range(nvq):
                base = arith.index_cast(self.i32, ix.add(self.i0, c(v * L + a.causal_offset)))
                self.qlanes.append(arith.addi(vector.broadcast(self.vit, base), self.viota))

        if self.step is None:
            self.stage_q()
        else:
            self.stage_q_pairs()

        # Keys this query block needs.
        if a.causal_offset is None:
            self.kend = self.size(a.sk)  # a key length known at run time: read once (`bind_symbols`)
        else:
            qend = ix.min(ix.add(self.i0, c(br)), c(a.sq))
            self.kend = ix.min(ix.max(ix.add(qend, c(a.causal_offset)), c(0)), c(static(a.sk)))

        with loop(c(0), self.kend, c(a.block_k), [self.vninf] * nvq + [self.vzero] * nvq) as kl:
            self.key_block(kl)
        self.store_out(list(kl.results[nvq:]))

    def stage_q(self) -> None:
        """Qt = zero, Ot = zero, then Qt[d, i] = Q[i0 + i, d] * scale * log2(e)."""
        a, ix = self.a, self.ix
        c, L, br = ix.c, a.lanes, a.block_q
        for buf, rows in ((self.Qt, a.d), (self.Ot, a.dv)):
            with loop(c(0), c(rows), c(1)) as ld:
                row = ix.mul(ld.induction_variable, br)
                for v in range(a.q_vectors):
                    vector.store(self.vzero, buf, [ix.add(row, c(v * L))])
        with loop(c(0), self.nqv, c(1)) as li:
            i = li.induction_variable
            qrow = ix.add(self.qoff, self.mul(ix.add(self.i0, i), a.q.row_stride))
            with loop(c(0), c(a.d), c(1)) as ld:
                d = ld.induction_variable
                x = _widen(memref.load(self.flat["Q"], [ix.add(qrow, self.mul(d, a.q.col_stride))]))
                y = arith.mulf(x, self.qscale)
                memref.store(y, self.Qt, [ix.add(ix.mul(d, br), i)])

    def stage_q_pairs(self) -> None:
        """Qp = zero, Ot = zero, then Qp[g, i, t] = Q[i0 + i, 2g + t]: for each pair g of d, the pairs of the
        block's queries side by side, one unit operand per query vector."""
        a, ix = self.a, self.ix
        c, L, br = ix.c, a.lanes, a.block_q
        with loop(c(0), c(_pairs(a.d)), c(1)) as lg:
            row = ix.mul(lg.induction_variable, 2 * br)
            for v in range(a.q_vectors):
                vector.store(self.nzero, self.Qp, [ix.add(row, c(v * 2 * L))])
        with loop(c(0), c(a.dv), c(1)) as ld:
            row = ix.mul(ld.induction_variable, br)
            for v in range(a.q_vectors):
                vector.store(self.vzero, self.Ot, [ix.add(row, c(v * L))])
        with loop(c(0), self.nqv, c(1)) as li:
            i = li.induction_variable
            qrow = ix.add(self.qoff, self.mul(ix.add(self.i0, i), a.q.row_stride))
            dst = ix.mul(i, 2)
            with loop(c(0), c(a.d // 2), c(1)) as lg:
                g = lg.induction_variable
                at = ix.add(ix.mul(g, 2 * br), dst)
                for t in range(2):
                    x = memref.load(self.flat["Q"], [ix.add(qrow, self.mul(ix.add(ix.mul(g, 2), c(t)), a.q.col_stride))])
                    memref.store(x, self.Qp, [ix.add(at, c(t))])
            if a.d % 2:  # the last d alone in its pair (its partner stays zero)
                x = memref.load(self.flat["Q"], [ix.add(qrow, self.size((a.d - 1) * a.q.col_stride))])
                memref.store(x, self.Qp, [ix.add(c((a.d - 1) * br), dst)])

    # ------------------------------------------------------------------------------------ one key block
    def key_block(self, kl: scf.ForOp) -> None:
        a, ix = self.a, self.ix
        c, nvq, nj = ix.c, a.q_vectors, a.qk_keys
        self.j0 = kl.induction_variable
        m_old, l_old = list(kl.inner_iter_args[:nvq]), list(kl.inner_iter_args[nvq:])
        self.jn = ix.min(c(a.block_k), ix.sub(self.kend, self.j0))
        ntile = ix.divui(self.jn, nj)
        jfull = ix.mul(ntile, nj)

        with loop(c(0), jfull, c(nj), [self.vninf] * nvq) as tl:
            scf.YieldOp(self.qk_tile(nj, tl.induction_variable, list(tl.inner_iter_args)))
        carried, start = list(tl.results), jfull
        if isinstance(a.sk, Dim):
            # A key length known at run time: the keys left after the full tiles (fewer than nj) in tiles of
            # halving size, each taken at most once, so they are not one latency-bound FMA chain per key
            # (a static key length's remainder has a count LLVM sees and unrolls).
            t = 1 << (nj - 1).bit_length() - 1 if nj > 1 else 1
            while t > 1:
                end = ix.add(start, ix.mul(ix.divui(ix.sub(self.jn, start), t), t))
                with loop(start, end, c(t), carried) as el:
                    scf.YieldOp(self.qk_tile(t, el.induction_variable, list(el.inner_iter_args)))
                carried, start, t = list(el.results), end, t // 2
        with loop(start, self.jn, c(1), carried) as rl:
            scf.YieldOp(self.qk_tile(1, rl.induction_variable, list(rl.inner_iter_args)))

        # Online softmax: new maxima, the rescale factor, probabilities in place of the scores.
        m_use, alpha, m_new = [], [], []
        for v in range(nvq):
            mn = _vmax(rl.results[v], m_old[v])
            isinf = arith.cmpf(arith.CmpFPredicate.OEQ, mn, self.vninf)
            mu = arith.select(isinf, self.vzero, mn)
            alpha.append(_exp2(arith.subf(m_old[v], mu), self.vc))
            m_use.append(mu)
            m_new.append(mn)
        sums = self.probability_pairs(m_use) if self.pv_unit else self.probabilities(m_use)
        l_new = [vector.fma(l_old[v], alpha[v], sums[v]) for v in range(nvq)]
        if self.pv_unit:
            self.pack_v()
            self.pv_pairs(alpha)
        else:
            self.pv(alpha)
        scf.YieldOp(m_new + l_new)

    def qk_tile(self, keys: int, jl: ir.Value, carried: list[ir.Value]) -> list[ir.Value]:
        """Scores of ``keys`` keys from local row ``jl`` for every query vector, stored to St; returns the
        new maxima."""
        a, ix = self.a, self.ix
        c, L, br, nvq = ix.c, a.lanes, a.block_q, a.q_vectors
        ja = ix.add(self.j0, jl)
        kbase = [ix.add(self.koff, self.mul(ix.add(ja, c(kk)), a.k.row_stride)) for kk in range(keys)]
        res = self.qk_fma(keys, kbase) if self.step is None else self.qk_pairs(keys, kbase)
        new = list(carried)
        for kk in range(keys):
            key = ix.add(ja, c(kk))
            if a.causal_offset is not None:
                kv = vector.broadcast(self.vit, arith.index_cast(self.i32, key))
            if a.mask is not None:
                assert self.moff is not None
                mcol = ix.add(self.moff, self.mul(key, a.mask.col_stride))
            for v in range(nvq):
                s = res[kk * nvq + v]
                if self.step is not None:
                    s = arith.mulf(s, self.vqscale)
                if a.mask is not None:
                    mv = self.mask_vector(mcol, v)
                    # s + mask·log2(e) overflows to -inf for a finite mask below -FLT_MAX / log2(e)
                    # (BERT's padding mask is -FLT_MAX) where torch's score stays finite: floor it at
                    # -FLT_MAX unless the mask is -inf, so a row of such keys is uniform (as in torch),
                    # and only -inf masks mask.
                    sm = _vmax(self.vlowest, vector.fma(mv, self.vmscale, s))
                    s = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, mv, self.vninf), self.vninf, sm)
                if a.causal_offset is not None:
                    cm = arith.cmpi(arith.CmpIPredicate.sgt, kv, self.qlanes[v])
                    s = arith.select(cm, self.vninf, s)
                srow = ix.mul(ix.add(jl, c(kk)), br)
                vector.store(s, self.St, [ix.add(srow, c(v * L))])
                new[v] = _vmax(s, new[v])
        return new

    def mask_vector(self, mcol: ir.Value, v: int) -> ir.Value:
        """The mask of query vector ``v`` at the key whose column starts at ``mcol``, as f32."""
        a, ix = self.a, self.ix
        assert a.mask is not None
        mrow = ix.add(mcol, self.mul(ix.add(self.i0, ix.c(v * a.lanes)), a.mask.row_stride))
        m = self.flat["M"]
        if a.mask.row_stride == 0:
            return vector.broadcast(self.vt, _widen(memref.load(m, [mcol])))
        mvt = ir.VectorType.get([a.lanes], element_type(a.mask_dtype))
        pass_thru = self.vzero if mvt == self.vt else _splat(mvt, 0.0)
        if a.mask.row_stride == 1:
            return _widen(vector.MaskedLoadOp(mvt, m, [mrow], self.lane_masks[v], pass_thru).result)
        return _widen(vector.GatherOp(mvt, m, [mrow], self.vmidx, self.lane_masks[v], pass_thru).result)

    def qk_fma(self, keys: int, kbase: list[ir.Value]) -> list[ir.Value]:
        """Q·Kᵀ by vector FMAs: a reduction over d, K's values broadcast to the query lanes."""
        a, ix = self.a, self.ix
        c, L, br, nvq = ix.c, a.lanes, a.block_q, a.q_vectors
        with loop(c(0), c(a.d), c(1), [self.vzero] * (keys * nvq)) as dl:
            dd = dl.induction_variable
            accs = list(dl.inner_iter_args)
            qrow_d = ix.mul(dd, br)
            qv = [vector.load(self.vt, self.Qt, [ix.add(qrow_d, c(v * L))]) for v in range(nvq)]
            outs = []
            kd = self.mul(dd, a.k.col_stride)
            for kk in range(keys):
                ks = _widen(memref.load(self.flat["K"], [ix.add(kbase[kk], kd)]))
                kb = vector.broadcast(self.vt, ks)
                for v in range(nvq):
                    outs.append(vector.fma(kb, qv[v], accs[kk * nvq + v]))
            scf.YieldOp(outs)
        return list(dl.results)

    def qk_pairs(self, keys: int, kbase: list[ir.Value]) -> list[ir.Value]:
        """Q·Kᵀ on the unit: a reduction over pairs of d, K's pair broadcast as a word (a last lone d paired
        with zero)."""
        a, ix = self.a, self.ix
        c, L, br, nvq = ix.c, a.lanes, a.block_q, a.q_vectors
        assert self.step is not None
        step = self.step

        def pair_step(g: ir.Value, accs: list[ir.Value], lone: bool) -> list[ir.Value]:
            qrow = ix.mul(g, 2 * br)
            qv = [vector.load(self.wide_t, self.Qp, [ix.add(qrow, c(v * 2 * L))]) for v in range(nvq)]
            kd = self.mul(g, 2 * a.k.col_stride)
            outs = []
            for kk in range(keys):
                kb = broadcast_word(group_word(self.pair(self.flat["K"], ix.add(kbase[kk], kd), a.k.col_stride, lone)),
                                    self.wide_t)
                for v in range(nvq):
                    outs.append(step(accs[kk * nvq + v], kb, qv[v]))
            return outs

        with loop(c(0), c(a.d // 2), c(1), [self.vzero] * (keys * nvq)) as dl:
            scf.YieldOp(pair_step(dl.induction_variable, list(dl.inner_iter_args), False))
        res = list(dl.results)
        if a.d % 2:
            res = pair_step(c(a.d // 2), res, True)
        return res

    def pair(self, buf: ir.Value, at: ir.Value, stride: int | Dim, lone: bool = False) -> ir.Value:
        """``buf[at]`` and ``buf[at + stride]`` as a ``vector<2 x T>`` (with ``lone``, the first and zero)."""
        ix = self.ix
        if stride == 1 and not lone:
            return vector.load(self.pair_t, buf, [at])
        first = memref.load(buf, [at])
        second = float_constant(0.0, self.nt) if lone else memref.load(buf, [ix.add(at, self.size(stride))])
        return vector.from_elements(self.pair_t, [first, second])

    # ------------------------------------------------------------------------------------ softmax
    def probabilities(self, m_use: list[ir.Value]) -> list[ir.Value]:
        """P = 2^(S - m) in place of the scores; returns the sums per query vector."""
        a, ix = self.a, self.ix
        c, L, br, nvq = ix.c, a.lanes, a.block_q, a.q_vectors
        with loop(c(0), self.jn, c(1), [self.vzero] * nvq) as sl:
            srow = ix.mul(sl.induction_variable, br)
            outs = []
            for v in range(nvq):
                idx = ix.add(srow, c(v * L))
                s = vector.load(self.vt, self.St, [idx])
                p = _exp2(arith.subf(s, m_use[v]), self.vc)
                vector.store(p, self.St, [idx])
                outs.append(arith.addf(sl.inner_iter_args[v], p))
            scf.YieldOp(outs)
        return list(sl.results)

    def probability_pairs(self, m_use: list[ir.Value]) -> list[ir.Value]:
        """P = 2^(S - m) rounded to the operand dtype into Pp, keys 2h and 2h + 1 interleaved per query lane
        (an odd last key paired with zero); returns the f32 sums per query vector."""
        a, ix = self.a, self.ix
        c, L, br, nvq = ix.c, a.lanes, a.block_q, a.q_vectors
        half_t = ir.VectorType.get([L], self.nt)
        with loop(c(0), self.key_pairs(), c(1), [self.vzero] * nvq) as sl:
            h = sl.induction_variable
            k0 = ix.mul(h, 2)
            second = arith.cmpi(arith.CmpIPredicate.slt, ix.add(k0, c(1)), self.jn)
            outs = []
            for v in range(nvq):
                ps = []
                for t in range(2):
                    s = vector.load(self.vt, self.St, [ix.add(ix.mul(ix.add(k0, c(t)), br), c(v * L))])
                    ps.append(_exp2(arith.subf(s, m_use[v]), self.vc))
                ps[1] = arith.select(second, ps[1], self.vzero)  # past the block: no key (St holds stale scores)
                outs.append(arith.addf(arith.addf(sl.inner_iter_args[v], ps[0]), ps[1]))
                packed = interleave([arith.truncf(half_t, p) for p in ps], L)
                vector.store(packed, self.Pp, [ix.add(ix.mul(h, 2 * br), c(v * 2 * L))])
            scf.YieldOp(outs)
        return list(sl.results)

    def key_pairs(self) -> ir.Value:
        """Pairs of keys in this key block (the last one may hold one key)."""
        return arith.divui(arith.addi(self.jn, self.ix.c(1)), self.ix.c(2))

    # ------------------------------------------------------------------------------------ P·V
    def pv_chunks(self, alpha: list[ir.Value], trips: ir.Value,
                  body: Callable[[ir.Value, int, int, list[ir.Value]], list[ir.Value]]) -> None:
        """Ot = Ot * alpha + (what ``body`` accumulates over ``trips`` steps), in chunks of value columns held
        in registers across the key block: ``body(step, c0, ncol, accs)`` returns the chunk's accumulators
        (``ncol`` columns from ``c0``, by query vectors) after one step."""
        a, c = self.a, self.ix.c
        L, br, nvq = a.lanes, a.block_q, a.q_vectors
        c0 = 0
        while c0 < a.dv:
            ncol = min(a.pv_cols, a.dv - c0)
            inits = [arith.mulf(vector.load(self.vt, self.Ot, [c((c0 + r) * br + v * L)]), alpha[v])
                     for r in range(ncol) for v in range(nvq)]
            with loop(c(0), trips, c(1), inits) as pl:
                scf.YieldOp(body(pl.induction_variable, c0, ncol, list(pl.inner_iter_args)))
            for r in range(ncol):
                for v in range(nvq):
                    vector.store(pl.results[r * nvq + v], self.Ot, [c((c0 + r) * br + v * L)])
            c0 += ncol

    def pv(self, alpha: list[ir.Value]) -> None:
        """Ot = Ot * alpha + Vᵀ P with f32 FMAs (`pv_chunks`), a key per step."""
        a, ix = self.a, self.ix
        c, L, br, nvq = ix.c, a.lanes, a.block_q, a.q_vectors

        def key(j: ir.Value, c0: int, ncol: int, accs: list[ir.Value]) -> list[ir.Value]:
            srow = ix.mul(j, br)
            pv = [vector.load(self.vt, self.St, [ix.add(srow, c(v * L))]) for v in range(nvq)]
            vrow = ix.add(self.voff, self.mul(ix.add(self.j0, j), a.v.row_stride))
            outs = []
            for r in range(ncol):
                vs = _widen(memref.load(self.flat["V"], [ix.add(vrow, self.size((c0 + r) * a.v.col_stride))]))
                vb = vector.broadcast(self.vt, vs)
                for v in range(nvq):
                    outs.append(vector.fma(vb, pv[v], accs[r * nvq + v]))
            return outs

        self.pv_chunks(alpha, self.jn, key)

    def pack_v(self) -> None:
        """Vp[h, col, t] = V[j0 + 2h + t, col]: the key block's values as pairs of keys per column (an odd
        last key paired with zero, never read past the keys)."""
        a, ix = self.a, self.ix
        c, L = ix.c, a.lanes
        half_t = ir.VectorType.get([L], self.nt)
        zero = _splat(half_t, 0.0)
        cols = self.lane_offsets(a.v.col_stride) if a.v.col_stride != 1 else None
        with loop(c(0), self.key_pairs(), c(1)) as hl:
            h = hl.induction_variable
            k0 = ix.add(self.j0, ix.mul(h, 2))
            second = arith.cmpi(arith.CmpIPredicate.slt, ix.add(k0, c(1)), self.kend)
            k1 = ix.min(ix.add(k0, c(1)), ix.sub(self.kend, c(1)))
            rows = [ix.add(self.voff, self.mul(k, a.v.row_stride)) for k in (k0, k1)]
            for c0 in range(0, a.dv, L):
                n = min(L, a.dv - c0)
                halves = []
                for row in rows:
                    at = ix.add(row, self.size(c0 * a.v.col_stride))
                    if cols is None and n == L:
                        halves.append(vector.load(half_t, self.flat["V"], [at]))
                        continue
                    msk = vector.create_mask(self.mt, [c(n)])
                    if cols is None:
                        halves.append(vector.MaskedLoadOp(half_t, self.flat["V"], [at], msk, zero).result)
                    else:
                        halves.append(vector.GatherOp(half_t, self.flat["V"], [at], cols, msk, zero).result)
                halves[1] = arith.select(second, halves[1], zero)
                vector.store(interleave(halves, L), self.Vp, [ix.add(ix.mul(h, 2 * self.dvp), c(2 * c0))])

    def pv_pairs(self, alpha: list[ir.Value]) -> None:
        """Ot = Ot * alpha + Vᵀ P on the unit (`pv_chunks`), a pair of keys per step (V's pair broadcast as a
        word)."""
        a, ix = self.a, self.ix
        c, L, br, nvq = ix.c, a.lanes, a.block_q, a.q_vectors
        assert self.step is not None
        step = self.step

        def pair(h: ir.Value, c0: int, ncol: int, accs: list[ir.Value]) -> list[ir.Value]:
            prow = ix.mul(h, 2 * br)
            pv = [vector.load(self.wide_t, self.Pp, [ix.add(prow, c(v * 2 * L))]) for v in range(nvq)]
            vrow = ix.mul(h, 2 * self.dvp)
            outs = []
            for r in range(ncol):
                vb = broadcast_word(group_word(vector.load(self.pair_t, self.Vp, [ix.add(vrow, c(2 * (c0 + r)))])),
                                    self.wide_t)
                for v in range(nvq):
                    outs.append(step(accs[r * nvq + v], vb, pv[v]))
            return outs

        self.pv_chunks(alpha, self.key_pairs(), pair)

    # ------------------------------------------------------------------------------------ output
    def reciprocal(self, sums: ir.Value) -> ir.Value:
        """``1 / sums`` (a vector of softmax sums); under a safe softmax 0 where a sum is 0 (every key of the row
        masked: torch's safe softmax gives 0 there)."""
        inv = arith.divf(_splat(self.vt, 1.0), sums)
        if self.a.safe_softmax:
            inv = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, sums, self.vzero), self.vzero, inv)
        return inv

    def store_out(self, sums: list[ir.Value]) -> None:
        """O[i0 + i, :] = Ot[:, i] / l[i], rounded to the output's dtype: L x L blocks of Ot (value columns by
        query lanes) scaled, transposed in registers (`transpose_vectors`) and stored a query row at a time,
        masked past the sequence end and past Dv. (A loop of scalar copies, which LLVM turns into gathers of
        Ot, took 4-9 % more of the kernel's time on Zen 4.)"""
        a, ix = self.a, self.ix
        c, L, br, nvq = ix.c, a.lanes, a.block_q, a.q_vectors
        inv = [self.reciprocal(sums[v]) for v in range(nvq)]
        out_t = element_type(a.out_dtype)
        row_t = ir.VectorType.get([L], out_t)

        def block(d0: ir.Value, n: int) -> None:
            """Value columns d0 .. d0 + n (n <= L) of every query of the block."""
            for v in range(nvq):
                rows = [arith.mulf(vector.load(self.vt, self.Ot, [ix.add(ix.mul(ix.add(d0, c(r)), br), c(v * L))]),
                                   inv[v]) if r < n else self.vzero for r in range(L)]
                left = ix.sub(self.nqv, c(v * L))  # queries of this vector inside the sequence
                for i, val in enumerate(transpose_vectors(rows)):
                    if out_t != self.f32:
                        val = arith.truncf(row_t, val)
                    at = ix.add(self.ooff, ix.mul(ix.add(self.i0, c(v * L + i)), a.dv))
                    inside = arith.cmpi(arith.CmpIPredicate.slt, c(i), left)
                    msk = vector.create_mask(self.mt, [arith.select(inside, c(n), c(0))])
                    vector.maskedstore(self.flat["O"], [ix.add(at, d0)], msk, val)

        with loop(c(0), c(a.dv // L * L), c(L)) as ld:
            block(ld.induction_variable, L)
        if a.dv % L:
            block(c(a.dv // L * L), a.dv % L)


def fold_sums(vectors: Sequence[ir.Value], lanes: int) -> ir.Value:
    """One vector whose lane ``j`` is the sum of ``vectors[j]``'s lanes (``lanes`` vectors of ``lanes``, a power
    of two): a butterfly of ``log2(lanes)`` levels, each adding the halves of every key's segment of two vectors
    (a shuffle pair and an add per pair of vectors: ``lanes - 1`` adds in all, not ``lanes`` reductions)."""
    vs, seg = list(vectors), lanes
    assert len(vs) == lanes and lanes & (lanes - 1) == 0
    while len(vs) > 1:
        half = seg // 2
        lo = [src + t * seg + u for src in (0, lanes) for t in range(lanes // seg) for u in range(half)]
        hi = [i + half for i in lo]
        vs = [arith.addf(vector.shuffle(x, y, lo), vector.shuffle(x, y, hi)) for x, y in zip(vs[::2], vs[1::2])]
        seg = half
    return vs[0]


class _KeysPart(_Part):
    """``@{name}_part`` of the ``along="keys"`` variant (few queries, e.g. a decode step): a work item is one
    query; keys run along the lanes, a vector of keys per online-softmax step, everything in registers.

    Per key vector: one dot product per key over d (Q's and the key's rows as vectors, d along the lanes; a
    key past the end re-reads the last key and gets -inf), folded into one vector of scores (`fold_sums`), the
    mask added, the running maximum and sum updated with one horizontal max and add, and O (dv along the
    lanes, in registers) rescaled and accumulated from V's rows, each probability broadcast. Operands are
    widened to f32 as they are read; no scratch buffer."""

    def buffers(self) -> None:
        pass

    def row(self, buf: ir.Value, at: ir.Value, stride: int | Dim, n: int | ir.Value, dtype: str) -> ir.Value:
        """``n`` (<= lanes; a static count or an index value) elements of ``buf`` from ``at`` at ``stride``, as an
        f32 vector (zeros past ``n``; stride 0: the one element broadcast)."""
        L = self.a.lanes
        if stride == 0:
            return vector.broadcast(self.vt, _widen(memref.load(buf, [at])))
        t = ir.VectorType.get([L], element_type(dtype))
        if stride == 1 and isinstance(n, int) and n == L:
            return _widen(vector.load(t, buf, [at]))
        zero = _splat(t, 0.0)
        msk = vector.create_mask(self.mt, [self.ix.c(n) if isinstance(n, int) else n])
        if stride == 1:
            return _widen(vector.MaskedLoadOp(t, buf, [at], msk, zero).result)
        return _widen(vector.GatherOp(t, buf, [at], self.lane_offsets(stride), msk, zero).result)

    def chunks(self, size: int) -> list[tuple[int, int]]:
        L = self.a.lanes
        return [(c0, min(L, size - c0)) for c0 in range(0, size, L)]

    def work_item(self, it: ir.Value) -> None:
        a, ix = self.a, self.ix
        c, L = ix.c, a.lanes
        beta, i = ix.divui(it, a.sq), ix.remui(it, a.sq)
        self.qoff, self.koff, self.voff = (batch_start(ix, beta, x, self.size) for x in (a.q, a.k, a.v))
        self.moff = batch_start(ix, beta, a.mask, self.size) if a.mask is not None else None
        qrow = ix.add(self.qoff, self.mul(i, a.q.row_stride))
        scale = _splat(self.vt, rounded(a.scale * LOG2E))
        self.qv = [arith.mulf(self.row(self.flat["Q"], ix.add(qrow, self.size(c0 * a.q.col_stride)), a.q.col_stride,
                                       n, a.dtype), scale) for c0, n in self.chunks(a.d)]
        if a.causal_offset is None:
            self.kend = self.size(a.sk)
        else:  # keys up to the query's position plus the offset
            self.kend = ix.min(ix.max(ix.add(i, c(a.causal_offset + 1)), c(0)), c(static(a.sk)))
        if a.mask is not None:
            assert self.moff is not None
            self.mrow = ix.add(self.moff, self.mul(i, a.mask.row_stride))
        nov = len(self.chunks(a.dv))
        full = ix.mul(ix.divui(self.kend, L), L)
        with loop(c(0), full, c(L), [self.vninf, self.vzero] + [self.vzero] * nov) as kl:
            scf.YieldOp(self.key_vector(kl.induction_variable, *kl.inner_iter_args))
        # The last keys (fewer than a vector; none, or a loop LLVM drops, where the key length is a multiple):
        # only theirs are dot products (a short dynamic length would otherwise pay a whole vector's).
        with loop(full, self.kend, c(L), list(kl.results)) as tl:
            scf.YieldOp(self.key_vector(tl.induction_variable, *tl.inner_iter_args, tail=True))
        self.store_row(ix.add(ix.mul(beta, a.sq * a.dv), ix.mul(i, a.dv)), tl.results[1], list(tl.results[2:]))

    def dot(self, k: ir.Value) -> ir.Value:
        """Q's row times key ``k``'s, lane-wise (d along the lanes; `fold_sums` adds the lanes)."""
        a, ix = self.a, self.ix
        krow = ix.add(self.koff, self.mul(k, a.k.row_stride))
        acc = None
        for qv, (c0, n) in zip(self.qv, self.chunks(a.d)):
            kv = self.row(self.flat["K"], ix.add(krow, self.size(c0 * a.k.col_stride)), a.k.col_stride, n, a.dtype)
            acc = arith.mulf(qv, kv) if acc is None else vector.fma(qv, kv, acc)
        assert acc is not None
        return acc

    def key_vector(self, j0: ir.Value, m: ir.Value, lsum: ir.Value, *outs: ir.Value,
                   tail: bool = False) -> list[ir.Value]:
        """One online-softmax step over keys ``j0 .. j0 + lanes`` (``tail``: the last, partial one, whose keys
        past the end take no dot product and re-read the last key's values with probability 0); returns the new
        max, sum and O."""
        a, ix = self.a, self.ix
        c, L = ix.c, a.lanes
        if not tail:
            keys = [ix.add(j0, c(kk)) for kk in range(L)]
            dots = [self.dot(k) for k in keys]
        else:
            last = ix.sub(self.kend, c(1))
            keys = [ix.min(ix.add(j0, c(kk)), last) for kk in range(L)]
            dots = []
            for kk, k in enumerate(keys):
                inside = arith.cmpi(arith.CmpIPredicate.slt, ix.add(j0, c(kk)), self.kend)
                branch = scf.IfOp(inside, [self.vt], has_else=True)
                with ir.InsertionPoint(branch.then_block):
                    scf.YieldOp([self.dot(k)])
                with ir.InsertionPoint(branch.else_block):
                    scf.YieldOp([self.vzero])
                dots.append(branch.result)
        s = fold_sums(dots, L)
        if a.mask is not None:
            mv = self.mask_keys(j0)
            sm = _vmax(self.vlowest, vector.fma(mv, self.vmscale, s))  # as the queries form (`qk_tile`)
            s = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, mv, self.vninf), self.vninf, sm)
        inside = vector.create_mask(self.mt, [ix.min(ix.sub(self.kend, j0), c(L))])
        s = arith.select(inside, s, self.vninf)
        mn = _vmax(m, vector.broadcast(self.vt, vector.reduction(self.f32, vector.CombiningKind.MAXNUMF, s)))
        mu = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, mn, self.vninf), self.vzero, mn)
        alpha = _exp2(arith.subf(m, mu), self.vc)
        p = _exp2(arith.subf(s, mu), self.vc)
        lsum = vector.fma(lsum, alpha, vector.broadcast(self.vt, vector.reduction(self.f32, vector.CombiningKind.ADD, p)))
        acc = [arith.mulf(o, alpha) for o in outs]
        for kk, k in enumerate(keys):
            pb = vector.broadcast(self.vt, vector.extract(p, [], [kk]))
            vrow = ix.add(self.voff, self.mul(k, a.v.row_stride))
            for v, (c0, n) in enumerate(self.chunks(a.dv)):
                vv = self.row(self.flat["V"], ix.add(vrow, self.size(c0 * a.v.col_stride)), a.v.col_stride, n, a.dtype)
                acc[v] = vector.fma(pb, vv, acc[v])
        return [mn, lsum, *acc]

    def mask_keys(self, j0: ir.Value) -> ir.Value:
        """The mask of this query at keys ``j0 .. j0 + lanes`` as f32 (the keys past the end read as 0; they
        are masked anyway)."""
        a, ix = self.a, self.ix
        assert a.mask is not None
        at = ix.add(self.mrow, self.mul(j0, a.mask.col_stride))
        return self.row(self.flat["M"], at, a.mask.col_stride, ix.min(ix.sub(self.kend, j0), ix.c(a.lanes)),
                        a.mask_dtype)

    def store_row(self, at: ir.Value, lsum: ir.Value, outs: list[ir.Value]) -> None:
        """O's row of this query: the accumulators over the sum (0 for a row with every key masked under a safe
        softmax), rounded to the output's dtype."""
        a, ix = self.a, self.ix
        inv = self.reciprocal(lsum)
        out_t = element_type(a.out_dtype)
        row_t = ir.VectorType.get([a.lanes], out_t)
        for o, (c0, n) in zip(outs, self.chunks(a.dv)):
            val = arith.mulf(o, inv)
            if out_t != self.f32:
                val = arith.truncf(row_t, val)
            where = ix.add(at, ix.c(c0))
            if n == a.lanes:
                vector.store(val, self.flat["O"], [where])
            else:
                vector.maskedstore(self.flat["O"], [where], vector.create_mask(self.mt, [ix.c(n)]), val)


def _pairs(n: int) -> int:
    return -(-n // 2)


def build_lanes_kernel(fn: func.FuncOp, a: LanesKernel, step: StepFn | None = None) -> func.FuncOp:
    """Give the declaration ``fn`` (``@{name}(Q, K, V[, M], O)``) its body and build ``@{name}_part`` in front
    of it (in the current context and location); returns ``fn``. ``step(acc, a, b)`` builds one
    instruction of ``a.unit`` (the target's ``unit_step`` hook); without one both matmuls are vector FMAs
    in f32 (narrow operands widened as they are read)."""
    name = ir.StringAttr(fn.sym_name).value
    names = ["Q", "K", "V"] + (["M"] if a.mask is not None else []) + ["O"]
    builder = _KeysPart if a.along == "keys" else _Part
    with ir.InsertionPoint(fn):
        part = builder(name, a, names, a.shapes, step).build()
    entry = fn.add_entry_block()
    with ir.InsertionPoint(entry):
        call_parts(ir.StringAttr(part.sym_name).value, list(entry.arguments), a.threads)
        func.ReturnOp([])
    return fn


def _check_signature(fn: func.FuncOp, name: str, a: LanesKernel) -> None:
    """The declaration's arguments must be the descriptor's buffers (identity layout, its dtype; ``?`` where a
    size is known at run time)."""
    want = [str(_memref(s, dt)) for s, dt in zip(a.shapes, a.arg_dtypes)]
    have = [str(t) for t in fn.type.inputs]
    if have != want or fn.type.results:
        raise CompileError(f"@{name} takes ({', '.join(have)}); its pbsdk.attention descriptor needs "
                           f"({', '.join(want)})", op="func.func")


def _part_of(module: ir.Module, name: str) -> list[func.FuncOp]:
    return [f for f in module.body.operations
            if f.operation.name == "func.func" and ir.StringAttr(f.sym_name).value == f"{name}_part"]


@dataclasses.dataclass(frozen=True)
class AttentionKernels:
    """The cpu target's ``attention`` stage: every private ``func.func`` marked ``pbsdk.attention`` with a
    ``"lanes"`` descriptor gets the kernel above as its body (the mark is then dropped: the function is
    an ordinary kernel). Scratchpad descriptors are not this target's form and are left alone.

    A descriptor naming a matrix unit gets its instructions from ``unit_step``, the target's hook
    (`pbsdk.targets.cpu.hooks.unit_step` unless a plugin replaces it), where the cpu target lowers that
    unit of the stage's spec for its machine code (`pbsdk.targets.cpu.pack_contractions.lowers_unit`);
    otherwise both matmuls are vector FMAs on the widened operands, and ``ctx.notes["attention"]`` says why.

    The kernel is normalised the way the core's stages normalise code they carry (``canonicalize``,
    ``cse`` on its two functions), so it reaches the lowering stages as it did when the core built it."""

    unit_step: Any = None  # UnitStepHook (pbsdk.targets.cpu.pack_contractions); None: the cpu target's

    def step_for(self, module: ir.Module, name: str, a: LanesKernel, ctx: StageContext) -> StepFn | None:
        """The unit step of ``a.unit`` (None: FMAs; a note says why where the descriptor asked for a unit)."""
        from pbsdk.targets.cpu.hooks import unit_step as default_unit_step
        from pbsdk.targets.cpu.pack_contractions import lowers_unit, unit_step_builder

        if a.unit is None:
            return None
        unit = next((u for u in ctx.spec.matrix_units if u.name == a.unit.name), None) if ctx.spec else None
        if unit is None or not lowers_unit(ctx.spec, unit.name):
            why = "not in the spec" if unit is None else "not lowered for this spec's machine code"
            ctx.notes.setdefault("attention", []).append(
                f"@{name}: matrix unit {a.unit.name} {why}: both matmuls on vector FMAs in f32")
            return None
        ctx.notes.setdefault("attention", []).append(f"@{name}: both matmuls on {a.unit.describe()}")
        return unit_step_builder(unit, module, ctx, self.unit_step or default_unit_step)

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
                step = self.step_for(module, name, a, ctx)
                _record_products(ctx, a, step is not None)
                built += [build_lanes_kernel(fn, a, step), *_part_of(module, name)]
                del fn.attributes[attrs.ATTENTION]
            if built:
                pm = PassManager.parse("func.func(canonicalize, cse)")
                for f in built:
                    pm.run(f.operation)
        return module


def _record_products(ctx: StageContext, a: LanesKernel, on_unit: bool) -> None:
    """Record the kernel's two products with the stage's contractions (`record_contraction`: what the
    artifact reports and the conformance suite checks a case's matrix unit against): Q·Kᵀ on the unit where
    the kernel has its step, P·V too where P is rounded to the unit's operand dtype, else vector FMAs."""
    from pbsdk.targets.cpu.pack_contractions import record_contraction

    unit = a.unit.name if on_unit and a.unit is not None else None
    sk = a.sk if isinstance(a.sk, int) else 0  # known at run time (as the generic contractions' unknown sizes)
    pv_unit = unit if a.p_dtype != "f32" else None
    record_contraction(ctx, "attention.qk", a.dtype, a.batch, a.sq, sk, a.d,
                       "matrix-unit" if unit else "vector-fma", unit)
    record_contraction(ctx, "attention.pv", a.dtype, a.batch, a.sq, a.dv, sk,
                       "matrix-unit" if pv_unit else "vector-fma", pv_unit)


__all__ = ["AttentionKernels", "LanesKernel", "build_lanes_kernel", "fold_sums", "is_lanes", "parse_descriptor"]
