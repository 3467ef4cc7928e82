"""Planning fused attention ``O = softmax(scale * Q Kᵀ + mask) V`` from a chip's description.

The fused schedule (FlashAttention-2 style, "query-lane" layout for vector units):

    parallel over work items (batch*heads x query blocks), round-robin over the spec's cores
      Qt   = (scale * log2 e) * Q[block]ᵀ           -- D x Br, kept in the innermost cache
      m, l = -inf, 0 (one vector per lanes queries)  -- loop-carried, in registers
      Ot   = 0                                       -- Dv x Br, kept in the innermost cache
      for key block j0 (Bc keys; causal: only blocks left of the diagonal)
        St = Qt-tiles · K[j0:+Bc]ᵀ (+ mask)           -- Bc x Br scores, never leave the cache
        m' = max(m, rowmax St);  P = 2^(St - m');  l = l 2^(m - m') + Σ P
        Ot = Ot 2^(m - m') + Vᵀ[j0:+Bc] · P          -- online softmax: rescale, accumulate
      O[block] = (Ot / l)ᵀ

Queries run along the vector lanes, so the row maximum and sum are lane-wise (no horizontal
reductions) and K and V are read as broadcast scalars in any layout (no packing, GQA and transposed
operands are strides). The model reads only the `ChipSpec`:

1. **Register tiles** from the vector unit: the Q·Kᵀ tile is ``nvq`` query vectors by ``nj`` keys, the
   P·V tile ``nvq`` query vectors by ``ndv`` value columns; accumulators plus one vector per query
   vector plus a broadcast fit the register file, chosen for the fewest issue cycles per FMA (FMAs per
   cycle against loads per cycle, as in `pbsdk.core.plan.contraction.register_tile`), counting lanes
   wasted on short sequences.
2. **Key block** ``Bc`` from the innermost cache: Qt, Ot and St (``(D + Dv + Bc) * Br`` elements) fit
   the cache's budget (half its capacity); halving the cache shrinks the block.
3. **Parallel mapping**: work items spread over the outermost compute level; with a causal mask the
   round-robin assignment balances the triangle.

The estimate is a roofline: FMAs at the unit's issue rate (the exponentials and rescaling counted as
extra vector ops), K/V re-read once per query block from the level that holds them, Q read and O
written once. ``score_bytes_unfused`` is what the unfused pipeline materialises (the seq x seq matrix).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from typing import Any

from pbsdk.core.errors import UnsupportedError
from pbsdk.core.options import Options, as_options
from pbsdk.core.plan.contraction import CACHE_BUDGET, Estimate, operand_dtypes, scratchpad_capacity
from pbsdk.core.spec import ChipSpec, dtype_bits

#: Vector ops per lanes scores spent outside the two matmuls: exp2 (~12), max, subtract, sum, mask.
SOFTMAX_VECTOR_OPS = 16
#: Dtypes the fused kernel's emission handles (its exp2 builds f32 exponents bit by bit).
FUSED_DTYPES = ("f32",)
#: Largest key block worth a tile (beyond it the rescaling is already amortised).
MAX_BLOCK_K = 512
#: Largest query block of the scratchpad schedule (K/V are re-read once per query block).
MAX_BLOCK_Q = 256
#: Dtypes the scratchpad schedule emits (the softmax runs in f32; P is rounded to the op's dtype).
SCRATCHPAD_DTYPES = ("f32", "f16", "bf16")
#: The kernel forms a target can lower (`pbsdk.core.target.Target.attention_forms`).
FORMS = ("lanes", "scratchpad")


@dataclasses.dataclass(frozen=True)
class Attention:
    """The op being planned: ``batch`` independent (sq x d) · (d x sk) → softmax → (sk x dv) problems.

    ``causal_offset``: keys ``j > i + causal_offset`` are masked for query ``i`` (None: no causal
    mask). ``mask``: an additive mask is read. ``kv_groups``: query heads sharing one K/V head.
    ``safe_softmax``: a row whose keys are all masked gives 0 (torch's ``_safe_softmax``), not NaN; set
    when the graph has that guard and its mask may mask a whole row (a runtime padding mask)."""

    batch: int
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str = "f32"
    causal_offset: int | None = None
    mask: bool = False
    kv_groups: int = 1
    safe_softmax: bool = False

    def __post_init__(self) -> None:
        if min(self.batch, self.sq, self.sk, self.d, self.dv, self.kv_groups) < 1:
            raise UnsupportedError(f"attention with an empty dimension: {self}", op="attention")

    @property
    def causal(self) -> bool:
        return self.causal_offset is not None

    def keys_for(self, q_end: int) -> int:
        """Keys a block of queries ending (exclusive) at ``q_end`` needs."""
        if self.causal_offset is None:
            return self.sk
        return max(0, min(self.sk, q_end + self.causal_offset))

    @property
    def flops(self) -> int:
        """Useful flops (both matmuls), counting only unmasked causal positions."""
        if self.causal_offset is None:
            pairs = self.sq * self.sk
        else:
            pairs = sum(self.keys_for(i + 1) for i in range(self.sq))
        return 2 * self.batch * pairs * (self.d + self.dv)


@dataclasses.dataclass(frozen=True)
class UnitChoice:
    """The matrix unit both matmuls of a scratchpad schedule issue (one instruction: m x n x k)."""

    name: str
    m: int
    n: int
    k: int
    operand_dtype: str
    accumulator_dtype: str


@dataclasses.dataclass(frozen=True)
class ScratchpadTiles:
    """The scratchpad schedule (chips whose innermost memory is software-managed).

    Per work item (one batch x head, one block of ``block_q`` queries), in the innermost scratchpad
    ``level`` (memory space ``space``): Q's tile is copied in once; for each key block of ``block_k``
    keys K's and V's tiles are copied in, S = Q·Kᵀ and O += P·V run on ``unit`` (padded to its shape:
    ``d_padded``, ``dv_padded``) or on the vector unit (``unit`` None), and the online softmax runs on
    the vector unit between them; O (``dv`` columns) is the only tile copied out. ``buffers`` are the
    scratchpad buffers (name, shape, dtype), all live at once: their bytes are ``footprint_bytes``."""

    level: str
    space: int
    block_q: int
    block_k: int
    d_padded: int
    dv_padded: int
    unit: UnitChoice | None
    buffers: tuple[tuple[str, tuple[int, ...], str], ...]
    capacity_bytes: int
    alignment: int = 64
    main_level: str = "main"

    @property
    def footprint_bytes(self) -> int:
        return sum(math.prod(shape) * _bytes(dt) for _, shape, dt in self.buffers)


@dataclasses.dataclass(frozen=True)
class AttentionPlan:
    """The fused schedule (``fused=False``: the unfused pipeline runs, ``reasons`` say why).

    ``schedule`` is the kernel form: ``"lanes"`` (queries along the vector lanes, tiles in the
    innermost cache: the cpu target builds it, `pbsdk.targets.cpu.attention_kernel`) or ``"scratchpad"`` (tiles staged in the
    innermost scratchpad, matmuls on the matrix unit: ``tiles``, `pbsdk.core.ir.attention_tiles`)."""

    op: Attention
    fused: bool
    reasons: tuple[str, ...]
    lanes: int = 1
    q_vectors: int = 1  # nvq: query vectors per tile
    block_k: int = 1  # Bc
    qk_keys: int = 1  # nj: keys per Q·Kᵀ register tile
    pv_cols: int = 1  # ndv: value columns per P·V register tile (the last chunk may be shorter)
    threads: int = 1
    level: str = ""  # the cache level holding Qt, St, Ot
    footprint_bytes: int = 0
    budget_bytes: int = 0
    tiles_total: int = 0  # query-block x key-block tiles of the full score matrix
    tiles_computed: int = 0  # after skipping fully masked causal tiles
    score_bytes_unfused: int = 0
    estimate: Estimate | None = None
    schedule: str = "lanes"
    tiles: ScratchpadTiles | None = None
    compute_level: str = ""  # the compute level whose units the threads are (spec.compute[0]; scratchpad form)

    @property
    def block_q(self) -> int:
        if self.tiles is not None:
            return self.tiles.block_q
        return self.q_vectors * self.lanes

    @property
    def q_blocks(self) -> int:
        return -(-self.op.sq // self.block_q)

    @property
    def work_items(self) -> int:
        return self.op.batch * self.q_blocks


def _bytes(dtype: str) -> int:
    return max(1, dtype_bits(dtype) // 8)


def _unfused(op: Attention, why: str, score_bytes: int) -> AttentionPlan:
    return AttentionPlan(op, False, (why,), score_bytes_unfused=score_bytes)


def _blocks(spec: ChipSpec, op: Attention, br: int, bc: int,
            options: Options) -> tuple[int, int, int, int, int]:
    """For query blocks of ``br`` and key blocks of ``bc``: (query blocks, work items, threads over the
    outermost compute level, key tiles per head, of those computed once fully masked causal ones are
    skipped)."""
    q_blocks = -(-op.sq // br)
    items = op.batch * q_blocks
    threads = max(1, min(options.threads or spec.compute[0].count, items))
    total = q_blocks * -(-op.sk // bc)
    computed = sum(-(-op.keys_for(min(op.sq, (qb + 1) * br)) // bc) for qb in range(q_blocks))
    return q_blocks, items, threads, total, computed


def _tile_cycles(acc_rows: int, vecs: int, fma: int, loads: int) -> float:
    """Issue cycles of one reduction step of an ``acc_rows`` x ``vecs`` register tile: ``acc_rows *
    vecs`` FMAs, ``vecs`` vector loads and ``acc_rows`` broadcasts."""
    return max(acc_rows * vecs / fma, (acc_rows + vecs) / loads)


def plan_attention(spec: ChipSpec, op: Attention, options: Options | Mapping[str, Any] | None = None,
                   forms: Collection[str] = FORMS) -> AttentionPlan:
    """The fused attention schedule for ``op`` on ``spec`` (pure: no IR).

    The kernel form follows the innermost memory level: a hardware cache gives the ``"lanes"``
    schedule, a software-managed scratchpad the ``"scratchpad"`` one. ``forms`` are the forms the
    target lowers; a plan in another form is not fused (and says so)."""
    opts = as_options(options)
    eb = _bytes(op.dtype)
    score_bytes = op.batch * op.sq * op.sk * _bytes("f32" if op.dtype in ("f16", "bf16") else op.dtype)
    if not opts.fuse_attention:
        return _unfused(op, "disabled by option fuse_attention=False", score_bytes)
    inner_level = spec.memory[-1] if len(spec.memory) > 1 else None
    if inner_level is not None and inner_level.managed == "software":
        if "scratchpad" not in forms:
            return _unfused(op, f"the innermost memory level of '{spec.name}' ({inner_level.name}) is a scratchpad "
                                "and this target does not lower the scratchpad attention kernel", score_bytes)
        return plan_scratchpad_attention(spec, op, opts)
    if "lanes" not in forms:
        return _unfused(op, "this target does not lower the vector-lanes attention kernel", score_bytes)
    if op.dtype not in FUSED_DTYPES:
        return _unfused(op, f"dtype {op.dtype}: the fused kernel is emitted for {', '.join(FUSED_DTYPES)} only",
                        score_bytes)
    vec = spec.vector
    if vec is None or op.dtype not in vec.dtypes or not vec.fma:
        return _unfused(op, f"no vector FMA unit for {op.dtype} in spec '{spec.name}': the fused kernel is "
                            "emitted for vector units", score_bytes)
    inner = spec.memory[-1] if len(spec.memory) > 1 else None
    if inner is None or inner.managed != "cache":
        return _unfused(op, f"innermost memory level of '{spec.name}' is not a cache: promoting the fused "
                            "kernel's tiles to a scratchpad is not implemented", score_bytes)
    reasons: list[str] = []
    lanes = vec.lanes(op.dtype)
    regs = vec.registers
    fma, loads = vec.fma_per_cycle, vec.loads_per_cycle

    # 1. Register tiles. For each number of query vectors, the widest key tile that fits the registers;
    # among those whose smallest working set (Qt, Ot and one key tile of scores) fits the innermost
    # cache, the fewest cycles per useful score (lanes past the sequence end are wasted work).
    budget = int(inner.size_bytes * CACHE_BUDGET)
    forced = opts.attention_q_vectors
    cands: list[tuple[float, int, int, int]] = []  # (cycles per score, nvq, nj, minimal footprint)
    for nvq in ((forced,) if forced > 0 else (1, 2, 3, 4)):
        nj = (regs - nvq - 1) // nvq
        if nj < 1:
            break
        br = nvq * lanes
        padded = -(-op.sq // br) * br
        per_score = _tile_cycles(nj, nvq, fma, loads) / (nj * nvq * lanes) * padded / op.sq
        cands.append((per_score, nvq, nj, ((op.d + op.dv + 4) + nj) * br * eb))
    if not cands:
        return _unfused(op, f"{regs} vector registers cannot hold a register tile", score_bytes)
    fitting = [c for c in cands if c[3] <= budget]
    if fitting:
        fastest = min(c[0] for c in fitting)
        _, nvq, nj, _ = min((c for c in fitting if c[0] <= fastest * 1.03), key=lambda c: c[1])
    else:
        _, nvq, nj, _ = min(cands, key=lambda c: c[3])
        reasons.append(f"{inner.name} ({inner.size_bytes} B) is too small for any query block's tiles: "
                       "the smallest is used and spills to the next level")
    if fitting and len(fitting) < len(cands):
        reasons.append(f"query blocks of {', '.join(str(c[1] * lanes) for c in cands if c not in fitting)} "
                       f"would not fit half of {inner.name} ({budget} B)")
    ndv_max = max(1, (regs - nvq - 1) // nvq)
    chunks = -(-op.dv // ndv_max)
    ndv = -(-op.dv // chunks)
    br = nvq * lanes
    reasons.append(f"query block {br} = {nvq} vector(s) of {lanes} {op.dtype} lanes; Q·Kᵀ register tile "
                   f"{nj} keys x {nvq} vectors ({nj * nvq} accumulators of {regs} registers), P·V tile "
                   f"{ndv} value columns x {nvq} vectors ({chunks} chunk(s) of Dv {op.dv})")

    # 2. Key block from the innermost cache: as many key tiles as fit next to Qt and Ot.
    fixed = (op.d + op.dv) * br * eb + 4 * br * eb  # Qt, Ot, m/l/alpha/sums
    room = (budget - fixed) // (br * eb)
    bc = max(nj, room // nj * nj)
    bc = min(bc, max(nj, -(-min(op.sk, MAX_BLOCK_K) // nj) * nj))
    footprint = fixed + bc * br * eb
    reasons.append(f"key block {bc}: Qt {op.d}x{br}, Ot {op.dv}x{br} and scores {bc}x{br} take {footprint} B "
                   f"of half of {inner.name} ({budget} B); the {op.sq}x{op.sk} score matrix "
                   f"({score_bytes} B over the batch) is never stored")

    # 3. Parallel mapping over the outermost compute level; causal tiles skipped.
    q_blocks, items, threads, total, computed = _blocks(spec, op, br, bc, opts)
    reasons.append(f"{items} work item(s) ({op.batch} batch x heads, {q_blocks} query block(s)) round-robin "
                   f"over {threads} of {spec.compute[0].count} '{spec.compute[0].name}'(s)")
    if op.causal:
        reasons.append(f"causal (offset {op.causal_offset}): {total - computed} of {total} key tiles per head "
                       "are fully masked and skipped; the diagonal tiles are masked lane-wise")
    if op.mask:
        reasons.append("additive mask read per score tile (a gather across query lanes unless the mask is "
                       "contiguous or constant along queries)")
    if op.kv_groups > 1:
        reasons.append(f"grouped-query attention: {op.kv_groups} query heads share each K/V head (strides, no copy)")

    estimate = _estimate(spec, op, nvq, nj, ndv, lanes, br, computed * bc * br * op.batch, threads)
    reasons.append(f"estimate {estimate.seconds * 1e3:.3f} ms, bound by {estimate.bound}")
    return AttentionPlan(op, True, tuple(reasons), lanes, nvq, bc, nj, ndv, threads, inner.name, footprint,
                         budget, total * op.batch, computed * op.batch, score_bytes, estimate)


def _estimate(spec: ChipSpec, op: Attention, nvq: int, nj: int, ndv: int, lanes: int, br: int,
              scores: int, threads: int) -> Estimate:
    """Roofline: vector issue cycles of both matmuls and the softmax on ``threads`` cores; K/V traffic."""
    vec = spec.vector
    assert vec is not None
    clock = (spec.clock_ghz or 1.0) * 1e9
    peak = spec.peak_tflops.get(op.dtype)  # type: ignore[call-overload]
    if peak:  # derive the clock the peak implies, so specs without clock_ghz still estimate sensibly
        clock = peak * 1e12 / (2 * lanes * vec.fma_per_cycle * spec.compute[0].count)
    vectors = scores / lanes  # score vectors computed (including masked lanes of diagonal tiles)
    qk = vectors * op.d * _tile_cycles(nj, nvq, vec.fma_per_cycle, vec.loads_per_cycle) / (nj * nvq)
    pv = vectors * op.dv * _tile_cycles(ndv, nvq, vec.fma_per_cycle, vec.loads_per_cycle) / (ndv * nvq)
    soft = vectors * SOFTMAX_VECTOR_OPS / vec.fma_per_cycle
    compute = (qk + pv + soft) / clock / threads
    terms = [("compute", compute)]
    eb = _bytes(op.dtype)
    kv_bytes: float = op.batch * (-(-op.sq // br)) * op.sk * (op.d + op.dv) * eb
    if op.causal:
        kv_bytes = kv_bytes * scores / max(1, op.batch * (-(-op.sq // br)) * br * op.sk)
    io_bytes = op.batch * op.sq * (op.d + op.dv) * eb * 2
    caches = [lv for lv in spec.memory[1:] if lv.managed == "cache"]
    per_head_kv = op.sk * (op.d + op.dv) * eb
    holder = next((lv for lv in reversed(caches) if lv.size_bytes * CACHE_BUDGET >= per_head_kv), None)
    main = spec.memory[0]
    if holder is None:
        terms.append((main.name, (kv_bytes + io_bytes) / (main.bandwidth_gbps * 1e9)))
    else:
        inst = spec.instances(holder.name) if holder.scope != "device" else 1
        inst = max(1, min(inst, threads))
        terms.append((holder.name, kv_bytes / (holder.bandwidth_gbps * 1e9 * inst)))
        terms.append((main.name, io_bytes / (main.bandwidth_gbps * 1e9)))
    bound, seconds = max(terms, key=lambda t: t[1])
    return Estimate(seconds, bound, tuple(terms))


# ------------------------------------------------------------------------------- scratchpad schedule

def _round_up(v: int, multiple: int) -> int:
    return -(-v // multiple) * multiple


def _doublings(base: int, limit: int) -> list[int]:
    """base, 2 base, 4 base, ... up to the first one covering ``limit`` (tiles a power of two units
    wide, so loops and copies stay regular)."""
    out = [base]
    while out[-1] < limit:
        out.append(out[-1] * 2)
    return out


def _pick_unit(spec: ChipSpec, op: Attention, options: Options) -> tuple[UnitChoice | None, str]:
    """The matrix unit for both matmuls: the spec's first choice whose n and k do not pad d and dv past
    1.5x (a 64 x 256 unit would quadruple a head dim of 64); else the one padding least."""
    if not options.matrix_units:
        return None, "matrix units disabled by option matrix_units=False"
    units = [u for dt in operand_dtypes(op.dtype, options) for u in spec.matrix_units_for(dt, "f32")]
    if not units:
        return None, f"no matrix unit for {op.dtype} with an f32 accumulator"

    def waste(u: Any) -> float:
        return max(_round_up(op.d, u.k) / op.d, _round_up(op.dv, u.n) / op.dv)

    good = [u for u in units if waste(u) <= 1.5]
    u = good[0] if good else min(units, key=waste)
    skipped = [x.name for x in units[: units.index(u)]]
    why = (f"both matmuls on {u.name} ({u.m}x{u.n}x{u.k} {u.operand_dtype}->{u.accumulator_dtype})"
           + (f"; {', '.join(dict.fromkeys(skipped))} would pad d {op.d} / dv {op.dv} past 1.5x" if skipped else ""))
    return UnitChoice(u.name, u.m, u.n, u.k, u.operand_dtype, u.accumulator_dtype), why


def scratchpad_buffers(op: Attention, br: int, bc: int, dp: int, dvp: int) -> tuple[tuple[str, tuple[int, ...], str], ...]:
    """The scratchpad buffers of one work item (all live at once)."""
    t = op.dtype
    out: list[tuple[str, tuple[int, ...], str]] = [("Qs", (br, dp), t), ("Ks", (bc, dp), t), ("Vs", (bc, dvp), t),
                                                   ("S", (br, bc), "f32")]
    if t != "f32":
        out.append(("P", (br, bc), t))
    if op.mask:
        out.append(("Ms", (br, bc), t))
    out.append(("O", (br, dvp), "f32"))
    if t != "f32":
        out.append(("Oo", (br, dvp), t))
    out += [(name, (br,), "f32") for name in ("m", "mn", "al", "l")]
    return tuple(out)


def plan_scratchpad_attention(spec: ChipSpec, op: Attention, options: Options) -> AttentionPlan:
    """The scratchpad schedule of ``op`` (see `ScratchpadTiles`): tiles from the innermost scratchpad's
    capacity and the matrix unit's shape, work items over the outermost compute level."""
    score_bytes = op.batch * op.sq * op.sk * 4
    if op.dtype not in SCRATCHPAD_DTYPES:
        return _unfused(op, f"dtype {op.dtype}: the scratchpad attention kernel is emitted for "
                            f"{', '.join(SCRATCHPAD_DTYPES)} only", score_bytes)
    if op.safe_softmax:
        return _unfused(op, "rows whose keys may all be masked must give 0 (a safe softmax): the scratchpad "
                            "kernel does not zero them", score_bytes)
    space = len(spec.memory) - 1
    level = spec.memory[space]
    cap = scratchpad_capacity(level, options)
    unit, unit_why = _pick_unit(spec, op, options)
    vec = spec.vector
    lanes = vec.lanes("f32") if vec is not None else 1
    if unit is None and (vec is None or "f32" not in vec.dtypes):
        return _unfused(op, f"{unit_why} and no f32 vector unit in spec '{spec.name}'", score_bytes)
    reasons = [unit_why if unit is not None else f"{unit_why}: both matmuls on the {lanes}-lane vector unit"]
    mq = unit.m if unit else lanes
    nk = math.lcm(unit.n, unit.k) if unit else lanes
    dp = _round_up(op.d, unit.k) if unit else op.d
    dvp = _round_up(op.dv, unit.n) if unit else op.dv

    def fits(br: int, bc: int) -> bool:
        bufs = scratchpad_buffers(op, br, bc, dp, dvp)
        return sum(math.prod(s) * _bytes(dt) for _, s, dt in bufs) <= cap

    if not fits(mq, nk):
        need = sum(math.prod(s) * _bytes(dt) for _, s, dt in scratchpad_buffers(op, mq, nk, dp, dvp))
        return _unfused(op, f"{level.name} ({cap} B) cannot hold the smallest tiles ({mq} queries x {nk} keys, "
                            f"{need} B)", score_bytes)
    # Query block: as large as fits (K and V are re-read once per query block) while the work items
    # still cover the cores; then the key block as large as fits. Both are power-of-two multiples of
    # the unit (of the vector for the vector unit).
    cores = spec.compute[0].count
    br_max = min(_round_up(op.sq, mq), max(mq, MAX_BLOCK_Q // mq * mq))
    want_items = min(cores, op.batch * -(-op.sq // mq))
    br = mq
    for cand in _doublings(mq, br_max):
        if fits(cand, nk) and op.batch * -(-op.sq // cand) >= want_items:
            br = cand
    bc_max = min(_round_up(op.sk, nk), max(nk, MAX_BLOCK_K // nk * nk))
    bc = nk
    for cand in _doublings(nk, bc_max):
        if fits(br, cand):
            bc = cand
    bufs = scratchpad_buffers(op, br, bc, dp, dvp)
    tiles = ScratchpadTiles(level.name, space, br, bc, dp, dvp, unit, bufs, cap, level.alignment_bytes,
                            spec.memory[0].name)
    reasons.append(f"query block {br} (multiple of {mq}), key block {bc} (multiple of {nk}): Q {br}x{dp}, K {bc}x{dp}, "
                   f"V {bc}x{dvp}, S {br}x{bc} f32, O {br}x{dvp} f32 take {tiles.footprint_bytes} B of {level.name} "
                   f"({cap} B); the {op.sq}x{op.sk} score matrix ({score_bytes} B over the batch) never leaves it")
    q_blocks, items, threads, total, computed = _blocks(spec, op, br, bc, options)
    reasons.append(f"{items} work item(s) ({op.batch} batch x heads, {q_blocks} query block(s)) round-robin over "
                   f"{threads} of {cores} '{spec.compute[0].name}'(s), each with its own {level.name} tiles")
    if op.causal:
        reasons.append(f"causal (offset {op.causal_offset}): {total - computed} of {total} key tiles per head are "
                       "fully masked and skipped; diagonal tiles are masked element-wise")
    if op.mask:
        reasons.append("additive mask: one tile copied in per key block")
    if op.kv_groups > 1:
        reasons.append(f"grouped-query attention: {op.kv_groups} query heads share each K/V head (strides, no copy)")
    estimate = _scratchpad_estimate(spec, op, tiles, computed * op.batch, threads)
    reasons.append(f"estimate {estimate.seconds * 1e3:.3f} ms, bound by {estimate.bound}")
    return AttentionPlan(op, True, tuple(reasons), lanes=lanes, block_k=bc, threads=threads, level=level.name,
                         compute_level=spec.compute[0].name, footprint_bytes=tiles.footprint_bytes, budget_bytes=cap, tiles_total=total * op.batch,
                         tiles_computed=computed * op.batch, score_bytes_unfused=score_bytes, estimate=estimate,
                         schedule="scratchpad", tiles=tiles)


def _scratchpad_estimate(spec: ChipSpec, op: Attention, t: ScratchpadTiles, tiles: int, threads: int) -> Estimate:
    """Roofline: both matmuls at the unit's (or the vector unit's) peak over ``threads`` of the cores,
    the softmax on the vector unit, and the tiles copied in and out of main memory."""
    cores = spec.compute[0].count
    clock = (spec.clock_ghz or 1.0) * 1e9
    flops = 2.0 * tiles * t.block_q * t.block_k * (t.d_padded + t.dv_padded)
    dt = t.unit.operand_dtype if t.unit else "f32"
    peak = (spec.peak_tflops.get(dt) or spec.peak_tflops.get("f32") or 1e-3) * 1e12  # type: ignore[call-overload]
    matmul = flops / (peak * threads / cores)
    lanes = spec.vector.lanes("f32") if spec.vector else 1
    fma = spec.vector.fma_per_cycle if spec.vector else 1
    soft = tiles * t.block_q * (t.block_k * SOFTMAX_VECTOR_OPS + t.dv_padded) / (lanes * fma) / clock / threads
    eb = _bytes(op.dtype)
    kv = tiles * t.block_k * (op.d + op.dv) * eb + (tiles * t.block_q * t.block_k * eb if op.mask else 0)
    io = op.batch * op.sq * (op.d + op.dv) * eb + kv
    main = spec.memory[0]
    terms = [("compute", matmul + soft), (main.name, io / (main.bandwidth_gbps * 1e9))]
    bound, seconds = max(terms, key=lambda x: x[1])
    return Estimate(seconds, bound, tuple(terms))


def format_attention_plan(title: str, plan: AttentionPlan) -> str:
    """``pbsdk explain`` text for one attention plan."""
    op = plan.op
    head = (f"{title}: attention {op.batch}x [{op.sq}x{op.d}]·[{op.sk}x{op.d}]ᵀ→softmax→·[{op.sk}x{op.dv}] "
            f"{op.dtype}" + (f", causal offset {op.causal_offset}" if op.causal else "")
            + (", additive mask" if op.mask else "") + (", fully masked rows 0" if op.safe_softmax else "")
            + (f", GQA x{op.kv_groups}" if op.kv_groups > 1 else "")
            + f" ({op.flops / 1e9:.3f} GFLOP)")
    lines = [head]
    if not plan.fused:
        lines.append("  fused          no (the unfused pipeline materialises the "
                     f"{plan.score_bytes_unfused} B score matrix)")
    else:
        lines.append(f"  fused          online softmax; query block {plan.block_q}, key block {plan.block_k}")
        if plan.tiles is not None:
            u = plan.tiles.unit
            lines.append("  matmuls        " + (f"{u.name} ({u.m}x{u.n}x{u.k} {u.operand_dtype}->{u.accumulator_dtype}), "
                                                 f"d padded to {plan.tiles.d_padded}, dv to {plan.tiles.dv_padded}"
                                                 if u else f"vector unit ({plan.lanes} f32 lanes)"))
        else:
            lines.append(f"  register tiles Q·Kᵀ {plan.qk_keys} keys x {plan.q_vectors}x{plan.lanes} queries; "
                         f"P·V {plan.pv_cols} columns x {plan.q_vectors}x{plan.lanes} queries")
        lines.append(f"  on chip        {plan.footprint_bytes} B of {plan.budget_bytes} B in {plan.level}; "
                     f"score matrix ({plan.score_bytes_unfused} B unfused) never stored")
        lines.append(f"  tiles          {plan.tiles_computed} of {plan.tiles_total} computed")
        lines.append(f"  parallel       {plan.work_items} work items over {plan.threads} thread(s)")
        if plan.estimate is not None:
            terms = ", ".join(f"{name} {s * 1e3:.3f} ms" for name, s in plan.estimate.terms)
            lines.append(f"  estimate       {plan.estimate.seconds * 1e3:.3f} ms, bound by {plan.estimate.bound} "
                         f"({terms})")
    lines.append("  why:")
    lines += [f"    - {r}" for r in plan.reasons]
    return "\n".join(lines)
