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

With bf16 operands (``Attention.dtype``) both matmuls issue on a matrix unit kept in the vector registers
(`pick_lanes_unit`: AVX512-BF16's ``vdpbf16ps``, one f32 vector of accumulators += pairs of bf16 products):
Q·Kᵀ pairs along d (Q packed as pairs of d per query lane, K's pairs broadcast as 32-bit words), the scores
and the online softmax stay in f32, P is rounded to bf16 and P·V pairs along the keys (V packed as pairs of
keys per key block). Without such a unit a bf16 attention is not fused here; one the graph widens to f32
(``Attention.widened``) then runs the f32 kernel on its widened operands (`pbsdk.core.ir.attention`).

The estimate is a roofline: FMAs (unit steps) at the issue rate (the exponentials and rescaling counted as
extra vector ops), K/V re-read once per query block from the level that holds them, Q read and O
written once. ``score_bytes_unfused`` is what the unfused pipeline materialises (the seq x seq matrix).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Mapping
from typing import Any

from pbsdk.core.dims import Dim, static
from pbsdk.core.errors import UnsupportedError
from pbsdk.core.options import Options, as_options
from pbsdk.core.plan.contraction import CACHE_BUDGET, Estimate, operand_dtypes, scratchpad_capacity
from pbsdk.core.spec import ChipSpec, dtype_bits

#: Vector ops per lanes scores spent outside the two matmuls: exp2 (~12), max, subtract, sum, mask.
SOFTMAX_VECTOR_OPS = 16
#: Dtypes the fused kernel's emission handles with vector FMAs (its exp2 builds f32 exponents bit by bit).
FUSED_DTYPES = ("f32",)
#: Operand dtypes the fused kernel reads with a matrix unit in the vector registers (`pick_lanes_unit`).
UNIT_DTYPES = ("bf16",)
#: Dtypes the fused kernel reads a mask in and writes its output in (converted from and to f32).
IO_DTYPES = ("f32", "bf16", "f16")
#: Vector ops per lanes scores of a unit kernel beyond the f32 one's: the scale, rounding P to bf16 and
#: interleaving its pairs of keys.
UNIT_SCORE_OPS = 2
#: Vector ops per lanes values of V per key of a unit kernel's packing (two half loads, a shuffle, a store
#: per pair of keys).
PACK_V_OPS = 2
#: Vector ops per key and query of the ``along="keys"`` kernel beyond its two products: folding the keys' dot
#: products into one vector of scores (a shuffle pair and an add per pair of vectors, ~3 per key) and
#: broadcasting each probability for P·V (1).
KEYS_EXTRA_OPS = 4
#: Largest key block worth a tile (beyond it the rescaling is already amortised).
MAX_BLOCK_K = 512
#: Largest query block of the scratchpad schedule (K/V are re-read once per query block).
MAX_BLOCK_Q = 256
#: Dtypes the scratchpad schedule emits (the softmax runs in f32; P is rounded to the op's dtype).
SCRATCHPAD_DTYPES = ("f32", "f16", "bf16")
#: The kernel forms a target can lower (`pbsdk.core.target.Target.attention_forms`).
FORMS = ("lanes", "scratchpad")
#: The key length an attention over a dynamic one (``Attention.sk`` a `Dim`) is planned at where a number is
#: unavoidable: the tile counts and the estimate. The key block itself comes from the cache budget alone (the
#: kernel reads the key length at run time and loops over whole blocks and the remainder).
PLANNING_KEYS = 1024


@dataclasses.dataclass(frozen=True)
class Attention:
    """The op being planned: ``batch`` independent (sq x d) · (d x sk) → softmax → (sk x dv) problems.

    ``causal_offset``: keys ``j > i + causal_offset`` are masked for query ``i`` (None: no causal
    mask). ``mask``: an additive mask is read. ``kv_groups``: query heads sharing one K/V head.
    ``safe_softmax``: a row whose keys are all masked gives 0 (torch's ``_safe_softmax``), not NaN; set
    when the graph has that guard and its mask may mask a whole row (a runtime padding mask).

    ``dtype`` is Q's, K's and V's as the kernel reads them; ``out_dtype`` the output's and ``mask_dtype``
    the mask's (both ``dtype`` when not given). ``widened``: the graph widens the ``dtype`` operands to f32
    and computes in f32 (torch's decomposed bf16 SDPA); a kernel reading them narrow keeps the scores and
    the softmax in f32."""

    batch: int
    sq: int
    sk: int | Dim  # a `Dim` (one symbol plus a constant): a key length known only at run time
    d: int
    dv: int
    dtype: str = "f32"
    causal_offset: int | None = None
    mask: bool = False
    kv_groups: int = 1
    safe_softmax: bool = False
    out_dtype: str = ""
    mask_dtype: str = ""
    widened: bool = False

    def __post_init__(self) -> None:
        sizes = (self.batch, self.sq, self.d, self.dv, self.kv_groups) + ((self.sk,) if isinstance(self.sk, int) else ())
        if min(sizes) < 1:
            raise UnsupportedError(f"attention with an empty dimension: {self}", op="attention")
        for name in ("out_dtype", "mask_dtype"):
            if not getattr(self, name):
                object.__setattr__(self, name, self.dtype)

    @property
    def mixed(self) -> bool:
        """Whether the output or the mask is in another dtype than the operands, or the graph widens them."""
        return self.widened or self.out_dtype != self.dtype or self.mask_dtype != self.dtype

    @property
    def causal(self) -> bool:
        return self.causal_offset is not None

    @property
    def dynamic(self) -> bool:
        """Whether the key length is known only at run time."""
        return isinstance(self.sk, Dim)

    def sized(self) -> Attention:
        """The op with a static key length: itself, or at `PLANNING_KEYS` keys where ``sk`` is dynamic (what
        the planner's counts and estimates read)."""
        return dataclasses.replace(self, sk=PLANNING_KEYS) if isinstance(self.sk, Dim) else self

    def keys_for(self, q_end: int) -> int:
        """Keys a block of queries ending (exclusive) at ``q_end`` needs."""
        op = self.sized()
        assert isinstance(op.sk, int)
        if op.causal_offset is None:
            return op.sk
        return max(0, min(op.sk, q_end + op.causal_offset))

    @property
    def flops(self) -> int:
        """Useful flops (both matmuls), counting only unmasked causal positions (a dynamic key length at
        `PLANNING_KEYS`)."""
        if self.dynamic:
            return self.sized().flops
        assert isinstance(self.sk, int)
        if self.causal_offset is None:
            pairs = self.sq * self.sk
        else:
            pairs = sum(self.keys_for(i + 1) for i in range(self.sq))
        return 2 * self.batch * pairs * (self.d + self.dv)


@dataclasses.dataclass(frozen=True)
class UnitChoice:
    """The matrix unit both matmuls issue (one instruction: m x n x k), of a scratchpad schedule or of a
    ``"lanes"`` one with narrow operands."""

    name: str
    m: int
    n: int
    k: int
    operand_dtype: str
    accumulator_dtype: str

    def describe(self) -> str:
        return f"{self.name} ({self.m}x{self.n}x{self.k} {self.operand_dtype}->{self.accumulator_dtype})"


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
    innermost cache: the cpu target builds it, `pbsdk.targets.cpu.attention_kernel`; ``unit``: the matrix
    unit both matmuls issue on narrow operands) or ``"scratchpad"`` (tiles staged in the innermost
    scratchpad, matmuls on the matrix unit: ``tiles``, `pbsdk.core.ir.attention_tiles`)."""

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
    unit: UnitChoice | None = None  # "lanes" form: the unit Q·Kᵀ issues (None: vector FMAs in f32)
    p_dtype: str = "f32"  # "lanes" form: P's dtype for P·V (the unit's operand dtype: P·V on the unit too)
    along: str = "queries"  # "lanes" form: what runs along the lanes (a query block, or one query's keys)

    @property
    def block_q(self) -> int:
        if self.tiles is not None:
            return self.tiles.block_q
        return self.q_vectors * self.lanes

    @property
    def q_blocks(self) -> int:
        return self.op.sq if self.along == "keys" else -(-self.op.sq // self.block_q)

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
    total = q_blocks * -(-static(op.sk) // bc)  # the planning size where it is dynamic (`Attention.sized`)
    computed = sum(-(-op.keys_for(min(op.sq, (qb + 1) * br)) // bc) for qb in range(q_blocks))
    return q_blocks, items, threads, total, computed


def _tile_cycles(acc_rows: int, vecs: int, fma: float, loads: float) -> float:
    """Issue cycles of one reduction step of an ``acc_rows`` x ``vecs`` register tile: ``acc_rows *
    vecs`` FMAs, ``vecs`` vector loads and ``acc_rows`` broadcasts."""
    return max(acc_rows * vecs / fma, (acc_rows + vecs) / loads)


def pick_lanes_unit(spec: ChipSpec, op: Attention, options: Options) -> tuple[UnitChoice | None, str]:
    """The matrix unit both matmuls of a ``"lanes"`` kernel issue on ``op.dtype`` operands, and why: the
    spec's first unit in the vector registers whose accumulator is one f32 vector (m 1, n the f32 lanes)
    and whose k values of the operand dtype fill a 32-bit word (the kernel broadcasts K's and V's groups
    as words: a pair of bf16 for ``vdpbf16ps``). None (and why not) when no unit serves."""
    if not options.matrix_units:
        return None, "matrix units disabled by option matrix_units=False"
    vec = spec.vector
    lanes = vec.lanes("f32") if vec is not None else 0
    for u in spec.matrix_units_for(op.dtype, "f32"):
        if u.registers == "vector" and u.m == 1 and u.n == lanes and u.k * dtype_bits(op.dtype) == 32:
            return UnitChoice(u.name, u.m, u.n, u.k, u.operand_dtype, u.accumulator_dtype), (
                f"Q·Kᵀ on {u.name} ({u.m}x{u.n}x{u.k} {u.operand_dtype}->{u.accumulator_dtype}) over pairs of d "
                "(Q packed in pairs per query block, K's pairs broadcast); scores and softmax in f32")
    return None, (f"no {op.dtype} matrix unit in the vector registers of spec '{spec.name}' with {lanes} f32 "
                  f"accumulator lanes and {op.dtype} groups of 32 bits")


def _footprint(op: Attention, br: int, bc: int, unit: UnitChoice | None, streamed: bool = False,
               pv_unit: bool = False) -> int:
    """Bytes of one work item's tiles for ``bc`` keys. Vector FMAs: Qt and Ot (f32), four vectors of softmax
    state and the f32 scores per key. A unit: Q's pairs, the state, and per key the f32 scores (and P's
    pairs where P·V is on the unit, ``pv_unit``); ``streamed`` adds what a key block touches once (Ot,
    rescaled and accumulated once per key block, and V's pairs, written once and read once)."""
    if unit is None:
        eb = _bytes(op.dtype)
        return (op.d + op.dv + 4 + bc) * br * eb
    nb = _bytes(op.dtype)
    resident = _round_up(op.d, unit.k) * br * nb + 4 * br * 4 + bc * br * (4 + (nb if pv_unit else 0))
    return resident + (op.dv * br * 4 + (bc * op.dv * nb if pv_unit else 0) if streamed else 0)


def plan_attention(spec: ChipSpec, op: Attention, options: Options | Mapping[str, Any] | None = None,
                   forms: Collection[str] = FORMS) -> AttentionPlan:
    """The fused attention schedule for ``op`` on ``spec`` (pure: no IR).

    The kernel form follows the innermost memory level: a hardware cache gives the ``"lanes"``
    schedule, a software-managed scratchpad the ``"scratchpad"`` one. ``forms`` are the forms the
    target lowers; a plan in another form is not fused (and says so)."""
    opts = as_options(options)
    sized = op.sized()
    assert isinstance(sized.sk, int)
    score_bytes = op.batch * op.sq * sized.sk * _bytes("f32" if op.dtype in ("f16", "bf16") else op.dtype)
    if not opts.fuse_attention:
        return _unfused(op, "disabled by option fuse_attention=False", score_bytes)
    inner_level = spec.memory[-1] if len(spec.memory) > 1 else None
    if op.dynamic and op.causal:
        return _unfused(op, f"a causal pattern over a key length known only at run time ({op.sk}) is not "
                            "planned (decoders give a mask computed from the cache length: an additive mask)",
                        score_bytes)
    if inner_level is not None and inner_level.managed == "software":
        if op.dynamic:
            return _unfused(op, f"key length {op.sk} known only at run time: the scratchpad kernel is planned "
                                "and emitted for static sizes", score_bytes)
        if "scratchpad" not in forms:
            return _unfused(op, f"the innermost memory level of '{spec.name}' ({inner_level.name}) is a scratchpad "
                                "and this target does not lower the scratchpad attention kernel", score_bytes)
        return plan_scratchpad_attention(spec, op, opts)
    if "lanes" not in forms:
        return _unfused(op, "this target does not lower the vector-lanes attention kernel", score_bytes)
    return _plan_lanes(spec, op, opts, score_bytes)


@dataclasses.dataclass(frozen=True)
class _LanesOperands:
    """How the ``"lanes"`` kernel reads ``op``'s operands (`_lanes_operands`): the matrix unit Q·Kᵀ issues
    on (None: vector FMAs in f32), whether P is rounded and P·V issues on it too, and why."""

    unit: UnitChoice | None
    pv_unit: bool
    reasons: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class _RegisterTiles:
    """Step 1 of the ``"lanes"`` schedule (`_register_tiles`): ``nvq`` query vectors of ``lanes``, ``nj``
    keys per Q·Kᵀ tile, ``ndv`` value columns per P·V tile; ``budget``: half the innermost cache."""

    lanes: int
    nvq: int
    nj: int
    ndv: int
    budget: int
    reasons: tuple[str, ...]

    @property
    def br(self) -> int:
        return self.nvq * self.lanes


def _plan_lanes(spec: ChipSpec, op: Attention, opts: Options, score_bytes: int) -> AttentionPlan:
    """The ``"lanes"`` schedule of ``op`` (the innermost memory level is not a scratchpad): register
    tiles, the key block, the parallel mapping and the estimate (see the module docstring)."""
    dynamic, op = op, op.sized()  # a dynamic key length: the numbers below at PLANNING_KEYS (see _key_block)
    operands = _lanes_operands(spec, op, opts)
    if isinstance(operands, str):
        return _unfused(dynamic, operands, score_bytes)
    tiles = _register_tiles(spec, op, opts, operands)
    if isinstance(tiles, str):
        return _unfused(dynamic, tiles, score_bytes)
    along_keys, why_keys = keys_along_lanes(spec, op, tiles.lanes, operands.unit, operands.pv_unit)
    if along_keys:
        return _plan_keys(spec, dynamic, opts, score_bytes, tiles.lanes, why_keys)
    unit, pv_unit, br = operands.unit, operands.pv_unit, tiles.br
    bc, footprint, why_bc = _key_block(spec, op, operands, tiles, score_bytes)
    # 3. Parallel mapping over the outermost compute level; causal tiles skipped.
    q_blocks, items, threads, total, computed = _blocks(spec, op, br, bc, opts)
    reasons = [*operands.reasons, *tiles.reasons, why_bc,
               *_mapping_reasons(spec, op, q_blocks, items, threads, total, computed)]
    if dynamic.dynamic:
        reasons.insert(0, f"key length {dynamic.sk} known only at run time: the kernel reads it and loops over "
                          f"whole key blocks and the remainder; the key block comes from the cache budget "
                          f"alone (as for {PLANNING_KEYS}+ keys), tile counts and the estimate at a planning "
                          f"size of {PLANNING_KEYS} keys")
    estimate = _estimate(spec, op, tiles.nvq, tiles.nj, tiles.ndv, tiles.lanes, br, computed * bc * br * op.batch,
                         threads, unit, pv_unit)
    op = dynamic
    reasons.append(f"estimate {estimate.seconds * 1e3:.3f} ms, bound by {estimate.bound}")
    return AttentionPlan(op, True, tuple(reasons), tiles.lanes, tiles.nvq, bc, tiles.nj, tiles.ndv, threads,
                         spec.memory[-1].name, footprint, tiles.budget, total * op.batch, computed * op.batch,
                         score_bytes, estimate, unit=unit, p_dtype=op.dtype if pv_unit else "f32")


def keys_along_lanes(spec: ChipSpec, op: Attention, lanes: int, unit: UnitChoice | None = None,
                     pv_unit: bool = False) -> tuple[bool, str]:
    """Whether ``op``'s few queries run best one at a time with their keys along the lanes, and why (pure).

    Queries along the lanes issue, per key, both products' vector ops and the softmax's for each vector of
    ``lanes`` queries, however few of its lanes hold a query (a decode step's one query uses one). Keys along
    the lanes issue, per key and query, a ``lanes``-th of those (d and dv along the lanes, one vector of
    scores per ``lanes`` keys) plus `KEYS_EXTRA_OPS`, without a unit (its pairs run across the lanes)."""
    vec = spec.vector
    assert vec is not None
    if lanes & (lanes - 1) or lanes < 2:
        return False, f"{lanes} lanes: the keys' dot products fold by halves over a power of two"
    group = unit.k if unit is not None else 1
    pv_group = group if pv_unit else 1
    per_vector = -(-op.d // group) + -(-op.dv // pv_group) + SOFTMAX_VECTOR_OPS
    queries = -(-op.sq // lanes) * per_vector
    keys = op.sq * ((-(-op.d // lanes) + -(-op.dv // lanes)) + SOFTMAX_VECTOR_OPS / lanes + KEYS_EXTRA_OPS)
    if keys >= queries:
        return False, ""
    return True, (f"{op.sq} quer{'y' if op.sq == 1 else 'ies'} per head: keys along {lanes} f32 lanes, one query per "
                  f"work item (~{keys:.0f} vector ops per key for the {op.sq} against ~{queries:.0f} with queries "
                  "along the lanes); Q's row and O's in registers, d and dv along the lanes, no scratch")


def _plan_keys(spec: ChipSpec, dynamic: Attention, opts: Options, score_bytes: int, lanes: int,
               why: str) -> AttentionPlan:
    """The ``along="keys"`` plan of ``dynamic``: one query per work item, a vector of keys per online-softmax
    step (the key block), vector FMAs in f32 (narrow operands widened as read)."""
    op = dynamic.sized()
    _, items, threads, total, computed = _blocks(spec, op, 1, lanes, opts)
    reasons = [why, *_mapping_reasons(spec, op, op.sq, items, threads, total, computed)]
    if dynamic.dynamic:
        reasons.insert(0, f"key length {dynamic.sk} known only at run time: the kernel reads it and loops over "
                          f"vectors of keys, the last one masked; tile counts and the estimate at a planning size "
                          f"of {PLANNING_KEYS} keys")
    vec = spec.vector
    assert vec is not None
    rows = -(-op.d // lanes) + -(-op.dv // lanes)  # Q's and O's vectors (the registers a work item keeps)
    per_key = rows * lanes + SOFTMAX_VECTOR_OPS + KEYS_EXTRA_OPS * lanes
    cycles = computed * op.batch * per_key / vec.fma_per_cycle
    estimate = _estimate(spec, op, 1, 1, 1, lanes, 1, computed * lanes * op.batch, threads, compute_cycles=cycles)
    reasons.append(f"estimate {estimate.seconds * 1e3:.3f} ms, bound by {estimate.bound}")
    regs = 4 * lanes * (rows + 2)
    return AttentionPlan(dynamic, True, tuple(reasons), lanes, 1, lanes, lanes, -(-op.dv // lanes), threads,
                         spec.memory[-1].name, regs, 0, total * op.batch, computed * op.batch, score_bytes, estimate,
                         along="keys")


def _lanes_operands(spec: ChipSpec, op: Attention, opts: Options) -> _LanesOperands | str:
    """The unit the ``"lanes"`` kernel reads ``op``'s narrow operands with (`pick_lanes_unit`) and P's dtype,
    or why that kernel cannot compute ``op`` on ``spec`` (its dtypes, no f32 vector FMAs, no innermost
    cache)."""
    unit: UnitChoice | None = None
    pv_unit = False  # P rounded to the operands' dtype and P·V on the unit too
    reasons: list[str] = []
    if op.dtype in UNIT_DTYPES:
        unit, why = pick_lanes_unit(spec, op, opts)
        if unit is None:
            return f"dtype {op.dtype}: {why}; the fused kernel reads {op.dtype} operands only with one"
        reasons.append(why)
        # P rounded to the operands' dtype costs what rounding the result costs: done where the result is
        # narrow, or the graph's own P is (torch's eager bf16 SDPA does the same); a graph that widens the
        # operands and keeps an f32 result keeps P in f32 (P·V as f32 FMAs, V widened as it is read).
        pv_unit = not (op.widened and op.out_dtype == "f32")
        reasons.append(f"P rounded to {op.dtype}, P·V on {unit.name} over pairs of keys (V packed in key pairs "
                       "per key block)" if pv_unit else
                       "P kept in f32 (the graph keeps an f32 result), P·V as f32 FMAs on V widened as read")
    elif op.dtype not in FUSED_DTYPES:
        return (f"dtype {op.dtype}: the fused kernel is emitted for {', '.join(FUSED_DTYPES)} (and "
                f"{', '.join(UNIT_DTYPES)} on a matrix unit) only")
    for what, dt in (("output", op.out_dtype), ("mask", op.mask_dtype)):
        if dt not in IO_DTYPES:
            return f"{what} dtype {dt}: the fused kernel converts {', '.join(IO_DTYPES)} only"
    vec = spec.vector
    if vec is None or "f32" not in vec.dtypes or not vec.fma:
        return f"no vector FMA unit for f32 in spec '{spec.name}': the fused kernel is emitted for vector units"
    inner = spec.memory[-1] if len(spec.memory) > 1 else None
    if inner is None or inner.managed != "cache":
        return (f"innermost memory level of '{spec.name}' is not a cache: promoting the fused kernel's tiles to a "
                "scratchpad is not implemented")
    if op.widened:
        reasons.append(f"Q, K, V read as {op.dtype} where the graph widens them to f32 (no f32 copies); "
                       f"output written as {op.out_dtype}")
    return _LanesOperands(unit, pv_unit, tuple(reasons))


def _register_tiles(spec: ChipSpec, op: Attention, opts: Options, operands: _LanesOperands) -> _RegisterTiles | str:
    """1. Register tiles. For each number of query vectors, the widest key tile that fits the registers;
    among those whose smallest working set (Qt, Ot and one key tile of scores) fits the innermost cache,
    the fewest cycles per useful score (lanes past the sequence end are wasted work; with a unit, V's
    packing is shared by the block's queries). A string: why no tile fits the registers."""
    vec, inner = spec.vector, spec.memory[-1]
    assert vec is not None
    unit, pv_unit = operands.unit, operands.pv_unit
    lanes = vec.lanes("f32")
    regs = vec.registers
    loads = vec.loads_per_cycle
    rate = _unit_rate(spec, unit)
    reasons: list[str] = []
    budget = int(inner.size_bytes * CACHE_BUDGET)
    forced = opts.attention_q_vectors
    cands: list[tuple[float, int, int, int]] = []  # (cycles per score, nvq, nj, minimal footprint)
    # A unit's broadcast operand is not folded into its instruction as an FMA's is: it takes a register
    # (two in flight), one more than the FMA tile's.
    spare = 1 if unit is None else 2
    for nvq in ((forced,) if forced > 0 else (1, 2, 3, 4)):
        nj = (regs - nvq - spare) // nvq
        if nj < 1:
            break
        br = nvq * lanes
        padded = -(-op.sq // br) * br
        per_score = _tile_cycles(nj, nvq, rate, loads) / (nj * nvq * lanes)
        if unit is not None:  # the whole cost: both matmuls (over groups of k on the unit), V's packing
            ndv = _pv_cols(op.dv, regs, nvq)
            pv_rate, group = (rate, unit.k) if pv_unit else (vec.fma_per_cycle, 1)
            per_score = (-(-op.d // unit.k) * per_score + op.dv / group * _tile_cycles(ndv, nvq, pv_rate, loads)
                         / (ndv * nvq * lanes) + (op.dv / lanes * PACK_V_OPS / vec.fma_per_cycle / br
                                                  if pv_unit else 0.0))
        cands.append((per_score * padded / op.sq, nvq, nj, _footprint(op, br, nj, unit, pv_unit=pv_unit)))
    if not cands:
        return f"{regs} vector registers cannot hold a register tile"
    fitting = [c for c in cands if c[3] <= budget]
    if fitting:
        # Vector FMAs: the fewest query vectors within 3% of the fastest. A unit: the fastest (its cost
        # counts V's packing, which a longer query block shares; measured on Zen 4, (12, 256, 64) bf16 at
        # 1 thread, 1, 2, 3, 4 query vectors: 1.31, 1.0, 1.08, 0.97).
        fastest = min(c[0] for c in fitting) * (1.03 if unit is None else 1.0)
        _, nvq, nj, _ = min((c for c in fitting if c[0] <= fastest), key=lambda c: c[1])
    else:
        _, nvq, nj, _ = min(cands, key=lambda c: c[3])
        reasons.append(f"{inner.name} ({inner.size_bytes} B) is too small for any query block's tiles: "
                       "the smallest is used and spills to the next level")
    if fitting and len(fitting) < len(cands):
        reasons.append(f"query blocks of {', '.join(str(c[1] * lanes) for c in cands if c not in fitting)} "
                       f"would not fit half of {inner.name} ({budget} B)")
    ndv = _pv_cols(op.dv, regs, nvq)
    chunks = -(-op.dv // ndv)
    br = nvq * lanes
    reasons.append(f"query block {br} = {nvq} vector(s) of {lanes} f32 lanes; Q·Kᵀ register tile "
                   f"{nj} keys x {nvq} vectors ({nj * nvq} accumulators of {regs} registers), P·V tile "
                   f"{ndv} value columns x {nvq} vectors ({chunks} chunk(s) of Dv {op.dv})")
    return _RegisterTiles(lanes, nvq, nj, ndv, budget, tuple(reasons))


def _key_block(spec: ChipSpec, op: Attention, operands: _LanesOperands, tiles: _RegisterTiles,
               score_bytes: int) -> tuple[int, int, str]:
    """2. Key block: (``Bc``, the footprint of one work item's tiles, why). Vector FMAs: as many key tiles
    as fit next to Qt and Ot in the innermost cache. A unit: its tiles of scores and P stay in the innermost
    cache one key tile at a time (step 1); a key block's scores, P and V pairs stream through the next cache
    level, so the key block is as long as fits half of it (fewer rescalings of Ot; measured on Zen 4 at
    (12, 256, 64) bf16: 14 keys 1.0, 56 to 256 keys 0.95-0.96 of its time), in whole key pairs."""
    unit, pv_unit = operands.unit, operands.pv_unit
    nj, br, budget = tiles.nj, tiles.br, tiles.budget
    inner = spec.memory[-1]
    step = nj if unit is None else math.lcm(nj, unit.k)
    outer = next((lv for lv in reversed(spec.memory[1:-1]) if lv.managed == "cache"), None)
    level, limit = (inner, budget) if unit is None or outer is None else (outer, int(outer.size_bytes * CACHE_BUDGET))
    per_key = _footprint(op, br, 1, unit, True, pv_unit) - _footprint(op, br, 0, unit, True, pv_unit)
    room = (limit - _footprint(op, br, 0, unit, True, pv_unit)) // per_key
    bc = max(step, room // step * step)
    if unit is None:
        bc = min(bc, max(step, _round_up(min(static(op.sk), MAX_BLOCK_K), step)))
    else:  # every key in one block where they fit (whole key pairs; the tile loop takes a partial tile)
        bc = min(bc, _round_up(min(static(op.sk), MAX_BLOCK_K), unit.k))
    footprint = _footprint(op, br, bc if unit is None else nj, unit, pv_unit=pv_unit)
    if unit is None:
        return bc, footprint, (f"key block {bc}: Qt {op.d}x{br}, Ot {op.dv}x{br} and scores {bc}x{br} take "
                               f"{footprint} B of half of {inner.name} ({budget} B); the {op.sq}x{op.sk} score "
                               f"matrix ({score_bytes} B over the batch) is never stored")
    return bc, footprint, (f"key block {bc}: Q pairs {op.d}x{br} {op.dtype} and a key tile's scores"
                           f"{' and P' * pv_unit} ({nj}x{br}) take {footprint} B of half of {inner.name} "
                           f"({budget} B); a key block's scores{', P, V pairs' * pv_unit} and Ot {op.dv}x{br} f32 "
                           f"({_footprint(op, br, bc, unit, True, pv_unit)} B in all) stream through "
                           f"{level.name} (half: {limit} B); the {op.sq}x{op.sk} score matrix ({score_bytes} B over "
                           "the batch) is never stored")


def _mapping_reasons(spec: ChipSpec, op: Attention, q_blocks: int, items: int, threads: int, total: int,
                     computed: int) -> list[str]:
    """3. The parallel mapping's reasons (`_blocks`' figures): work items over the outermost compute
    level, causal tiles skipped, the mask's reads, grouped-query heads."""
    reasons = [(f"{items} work item(s) ({op.batch} batch x heads, {q_blocks} query block(s)) round-robin "
                f"over {threads} of {spec.compute[0].count} '{spec.compute[0].name}'(s)")]
    if op.causal:
        reasons.append(f"causal (offset {op.causal_offset}): {total - computed} of {total} key tiles per head "
                       "are fully masked and skipped; the diagonal tiles are masked lane-wise")
    if op.mask:
        reasons.append("additive mask read per score tile (a gather across query lanes unless the mask is "
                       "contiguous or constant along queries)")
    if op.kv_groups > 1:
        reasons.append(f"grouped-query attention: {op.kv_groups} query heads share each K/V head (strides, no copy)")
    return reasons


def _pv_cols(dv: int, regs: int, nvq: int) -> int:
    """Value columns per P·V register tile: Dv in as few chunks as the registers allow, evenly split."""
    chunks = -(-dv // max(1, (regs - nvq - 1) // nvq))
    return -(-dv // chunks)


def _unit_rate(spec: ChipSpec, unit: UnitChoice | None) -> float:
    """Instructions per cycle of the matmuls: the unit's (its spec entry's ``per_cycle``, else the FMA
    pipes'), or the vector FMAs'."""
    vec = spec.vector
    assert vec is not None
    if unit is None:
        return vec.fma_per_cycle
    found = next((u for u in spec.matrix_units if u.name == unit.name), None)
    return found.per_cycle if found is not None and found.per_cycle else vec.fma_per_cycle


def _estimate(spec: ChipSpec, op: Attention, nvq: int, nj: int, ndv: int, lanes: int, br: int,
              scores: int, threads: int, unit: UnitChoice | None = None, pv_unit: bool = False,
              compute_cycles: float | None = None) -> Estimate:
    """Roofline: issue cycles of both matmuls (vector FMAs, or the unit's steps over groups of ``unit.k``:
    Q·Kᵀ with a unit, P·V too with ``pv_unit``) and the softmax on ``threads`` cores (``compute_cycles``:
    given, for a kernel counted otherwise); K/V traffic, K and V read once per query block of ``br``."""
    vec = spec.vector
    assert vec is not None
    clock = (spec.clock_ghz or 1.0) * 1e9
    peak = spec.peak_tflops.get("f32")  # type: ignore[call-overload]
    if peak:  # derive the clock the peak implies, so specs without clock_ghz still estimate sensibly
        clock = peak * 1e12 / (2 * lanes * vec.fma_per_cycle * spec.compute[0].count)
    rate, loads = _unit_rate(spec, unit), vec.loads_per_cycle
    group = unit.k if unit is not None else 1
    pv_rate, pv_group = (rate, group) if pv_unit else (vec.fma_per_cycle, 1)
    vectors = scores / lanes  # score vectors computed (including masked lanes of diagonal tiles)
    qk = vectors * -(-op.d // group) * _tile_cycles(nj, nvq, rate, loads) / (nj * nvq)
    pv = vectors / pv_group * op.dv * _tile_cycles(ndv, nvq, pv_rate, loads) / (ndv * nvq)
    soft = vectors * (SOFTMAX_VECTOR_OPS + (UNIT_SCORE_OPS if pv_unit else 0)) / vec.fma_per_cycle
    pack = scores / br * op.dv / lanes * PACK_V_OPS / vec.fma_per_cycle if pv_unit else 0.0
    compute = (qk + pv + soft + pack if compute_cycles is None else compute_cycles) / clock / threads
    terms = [("compute", compute)]
    eb = _bytes(op.dtype)
    sk = static(op.sk)
    kv_bytes: float = op.batch * (-(-op.sq // br)) * sk * (op.d + op.dv) * eb
    if op.causal:
        kv_bytes = kv_bytes * scores / max(1, op.batch * (-(-op.sq // br)) * br * sk)
    io_bytes = op.batch * op.sq * (op.d + op.dv) * eb * 2
    caches = [lv for lv in spec.memory[1:] if lv.managed == "cache"]
    per_head_kv = sk * (op.d + op.dv) * eb
    holder = next((lv for lv in reversed(caches) if lv.size_bytes * CACHE_BUDGET >= per_head_kv), None)
    main = spec.memory[0]
    main_bw = main.shared_bandwidth(threads) * 1e9
    if holder is None:
        terms.append((main.name, (kv_bytes + io_bytes) / main_bw))
    else:
        held = (holder.shared_bandwidth(threads) if holder.scope == "device"
                else holder.bandwidth_gbps * max(1, min(spec.instances(holder.name), threads)))
        terms.append((holder.name, kv_bytes / (held * 1e9)))
        terms.append((main.name, io_bytes / main_bw))
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
    sk = static(op.sk)  # `plan_attention` refuses a key length known at run time for this form
    score_bytes = op.batch * op.sq * sk * 4
    if op.dtype not in SCRATCHPAD_DTYPES:
        return _unfused(op, f"dtype {op.dtype}: the scratchpad attention kernel is emitted for "
                            f"{', '.join(SCRATCHPAD_DTYPES)} only", score_bytes)
    if op.mixed:
        return _unfused(op, f"{op.dtype} operands with an {op.out_dtype} output and an {op.mask_dtype} mask"
                            + (", widened to f32 by the graph" if op.widened else "")
                            + ": the scratchpad kernel computes in one dtype, as the graph does", score_bytes)
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
    bc_max = min(_round_up(sk, nk), max(nk, MAX_BLOCK_K // nk * nk))
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
            f"{op.dtype}" + (" (widened to f32 by the graph)" if op.widened else "")
            + (f" -> {op.out_dtype}" if op.out_dtype != op.dtype else "")
            + (f", causal offset {op.causal_offset}" if op.causal else "")
            + ((f", additive {op.mask_dtype} mask" if op.mask_dtype != op.dtype else ", additive mask") if op.mask else "") + (", fully masked rows 0" if op.safe_softmax else "")
            + (f", GQA x{op.kv_groups}" if op.kv_groups > 1 else "")
            + f" ({op.flops / 1e9:.3f} GFLOP)")
    lines = [head]
    at = f" at {PLANNING_KEYS} keys" if op.dynamic else ""  # counts of a key length known at run time
    if not plan.fused:
        lines.append("  fused          no (the unfused pipeline materialises the "
                     f"{plan.score_bytes_unfused} B score matrix{at})")
    else:
        lines.append(f"  fused          online softmax; query block {plan.block_q}, key block {plan.block_k}"
                     + (f"; key length {op.sk} read at run time" if op.dynamic else ""))
        if plan.tiles is not None:
            u = plan.tiles.unit
            lines.append("  matmuls        " + (f"{u.describe()}, d padded to {plan.tiles.d_padded}, dv to "
                                                 f"{plan.tiles.dv_padded}"
                                                 if u else f"vector unit ({plan.lanes} f32 lanes)"))
        else:
            u = plan.unit
            if u is None:
                lines.append(f"  matmuls        vector FMAs ({plan.lanes} f32 lanes)")
            else:
                pv = f"P rounded to {plan.p_dtype}, P·V on {u.name}" if plan.p_dtype != "f32" else "P·V as f32 FMAs"
                lines.append(f"  matmuls        Q·Kᵀ on {u.describe()}; scores and softmax in f32; {pv}")
            if plan.along == "keys":
                lines.append(f"  register tiles one query a work item: Q·Kᵀ {plan.qk_keys} keys along the lanes (their dot "
                             f"products folded into one vector); P·V {plan.pv_cols} vector(s) of dv")
            else:
                lines.append(f"  register tiles Q·Kᵀ {plan.qk_keys} keys x {plan.q_vectors}x{plan.lanes} queries; "
                             f"P·V {plan.pv_cols} columns x {plan.q_vectors}x{plan.lanes} queries")
        lines.append(f"  on chip        {plan.footprint_bytes} B of {plan.budget_bytes} B in {plan.level}; "
                     f"score matrix ({plan.score_bytes_unfused} B unfused{at}) never stored")
        lines.append(f"  tiles          {plan.tiles_computed} of {plan.tiles_total} computed{at}")
        lines.append(f"  parallel       {plan.work_items} work items over {plan.threads} thread(s)")
        if plan.estimate is not None:
            terms = ", ".join(f"{name} {s * 1e3:.3f} ms" for name, s in plan.estimate.terms)
            lines.append(f"  estimate       {plan.estimate.seconds * 1e3:.3f} ms{at}, bound by {plan.estimate.bound} "
                         f"({terms})")
    lines.append("  why:")
    lines += [f"    - {r}" for r in plan.reasons]
    return "\n".join(lines)
