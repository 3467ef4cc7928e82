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
from collections.abc import Mapping
from typing import Any

from pbsdk.core.errors import UnsupportedError
from pbsdk.core.plan.contraction import CACHE_BUDGET, Estimate
from pbsdk.core.spec import ChipSpec, dtype_bits

#: Vector ops per lanes scores spent outside the two matmuls: exp2 (~12), max, subtract, sum, mask.
SOFTMAX_VECTOR_OPS = 16
#: Dtypes the fused kernel's emission handles (its exp2 builds f32 exponents bit by bit).
FUSED_DTYPES = ("f32",)
#: Largest key block worth a tile (beyond it the rescaling is already amortised).
MAX_BLOCK_K = 512


@dataclasses.dataclass(frozen=True)
class Attention:
    """The op being planned: ``batch`` independent (sq x d) · (d x sk) → softmax → (sk x dv) problems.

    ``causal_offset``: keys ``j > i + causal_offset`` are masked for query ``i`` (None: no causal
    mask). ``mask``: an additive mask is read. ``kv_groups``: query heads sharing one K/V head."""

    batch: int
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str = "f32"
    causal_offset: int | None = None
    mask: bool = False
    kv_groups: int = 1

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
class AttentionPlan:
    """The fused schedule (``fused=False``: the unfused pipeline runs, ``reasons`` say why)."""

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

    @property
    def block_q(self) -> int:
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


def _tile_cycles(acc_rows: int, vecs: int, fma: int, loads: int) -> float:
    """Issue cycles of one reduction step of an ``acc_rows`` x ``vecs`` register tile: ``acc_rows *
    vecs`` FMAs, ``vecs`` vector loads and ``acc_rows`` broadcasts."""
    return max(acc_rows * vecs / fma, (acc_rows + vecs) / loads)


def plan_attention(spec: ChipSpec, op: Attention, options: Mapping[str, Any] | None = None) -> AttentionPlan:
    """The fused attention schedule for ``op`` on ``spec`` (pure: no IR)."""
    opts = options or {}
    eb = _bytes(op.dtype)
    score_bytes = op.batch * op.sq * op.sk * _bytes("f32" if op.dtype in ("f16", "bf16") else op.dtype)
    if not opts.get("fuse_attention", True):
        return _unfused(op, "disabled by options['fuse_attention'] = False", score_bytes)
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
    forced = int(opts.get("attention_q_vectors", 0))
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

    # 3. Parallel mapping over the outermost compute level.
    q_blocks = -(-op.sq // br)
    items = op.batch * q_blocks
    units = spec.compute[0].count
    threads = int(opts.get("threads", 0)) or units
    threads = max(1, min(threads, items))
    reasons.append(f"{items} work item(s) ({op.batch} batch x heads, {q_blocks} query block(s)) round-robin "
                   f"over {threads} of {units} '{spec.compute[0].name}'(s)")

    # Causal tiles skipped.
    k_blocks = -(-op.sk // bc)
    total = q_blocks * k_blocks
    computed = sum(-(-op.keys_for(min(op.sq, (qb + 1) * br)) // bc) for qb in range(q_blocks))
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


def format_attention_plan(title: str, plan: AttentionPlan) -> str:
    """``pbsdk explain`` text for one attention plan."""
    op = plan.op
    head = (f"{title}: attention {op.batch}x [{op.sq}x{op.d}]·[{op.sk}x{op.d}]ᵀ→softmax→·[{op.sk}x{op.dv}] "
            f"{op.dtype}" + (f", causal offset {op.causal_offset}" if op.causal else "")
            + (", additive mask" if op.mask else "") + (f", GQA x{op.kv_groups}" if op.kv_groups > 1 else "")
            + f" ({op.flops / 1e9:.3f} GFLOP)")
    lines = [head]
    if not plan.fused:
        lines.append("  fused          no (the unfused pipeline materialises the "
                     f"{plan.score_bytes_unfused} B score matrix)")
    else:
        lines.append(f"  fused          online softmax; query block {plan.block_q}, key block {plan.block_k}")
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
