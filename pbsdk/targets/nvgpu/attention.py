"""How nvgpu runs one fused attention: a pure plan from the chip spec and the core's descriptor.

The core hands the target a private function ``@__pbsdk_attnN`` carrying a ``pbsdk.attention`` JSON
descriptor (shapes, strides, dtype, causal offset, mask, scales and the core planner's query/key tile).
`attention_mapping` turns it into an `AttentionMapping` without touching IR, so unit tests check every
decision directly; `attention_kernel.py` builds the kernel it describes.

The kernel (FlashAttention-style online softmax, one pass over the keys):

- one block per (query block of ``block_q`` rows, flat batch index β); the Q tile is staged in shared
  memory once, zero-padded beyond ``sq`` and to ``d_pad`` columns;
- for each key tile of ``block_k`` keys (causal: only the tiles at or below the diagonal of the block's
  last query row — the others are skipped entirely): K and V tiles are copied global -> shared
  (zero-padded), ``S = Q·Kᵀ`` is computed into a shared f32 tile, then per query row the scores are
  scaled, masked (keys beyond ``sk``, the causal diagonal lane by lane, the additive mask), the running
  max ``m`` and sum ``l`` updated, ``P = exp(S - m)`` rounded to the operand dtype, the f32 output
  accumulator rescaled by ``exp(m_old - m_new)``, and ``O += P·V``;
- finally ``O / l`` is rounded to the dtype and stored (rows inside ``sq`` only).

Both matmuls use the spec's warp-level matrix unit (``mma.sync.m16n8k16``, f32 accumulation) for f16 and
bf16 — each warp owns 16 query rows — and, without one (f32, or ``matrix_units=False``), a SIMT path in
which each thread computes a small register tile of S and of O with FMAs. All tiles live in the static
shared memory the spec grants a block without opt-in (`mapping.static_shared_bytes`); the tile shrinks
until they fit.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Literal

from pbsdk.core.errors import CompileError, UnsupportedError
from pbsdk.core.ir.attention_tiles import OperandLayout
from pbsdk.core.options import Options, as_options
from pbsdk.core.spec import ChipSpec, dtype_bits
from pbsdk.targets.nvgpu.mapping import (
    MAX_GRID_YZ,
    block_thread_limit,
    mma_unit,
    static_shared_bytes,
    warp_width,
)

#: The descriptor version this target reads.
DESCRIPTOR_VERSION = 1
#: SIMT path: threads per block as (rows, cols) of the S and O thread grids.
SIMT_THREADS = (16, 8)
#: Largest query/key tiles tried (the shared tiles shrink from there to fit).
MAX_BLOCK_Q, MAX_BLOCK_K = 128, 128


@dataclasses.dataclass(frozen=True)
class AttentionDescriptor:
    """The core's ``pbsdk.attention`` descriptor, parsed and checked."""

    batch: int
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str
    causal_offset: int | None
    mask: bool
    kv_groups: int
    scale: float
    mask_scale: float
    block_q: int
    block_k: int
    unit: str | None
    q: OperandLayout
    k: OperandLayout
    v: OperandLayout
    m: OperandLayout | None

    @property
    def out_shape(self) -> tuple[int, int, int]:
        return self.batch, self.sq, self.dv


def parse_descriptor(text: str | Mapping[str, Any]) -> AttentionDescriptor:
    """The descriptor from its JSON text (or dict); a `CompileError` naming what is wrong."""
    try:
        raw = json.loads(text) if isinstance(text, str) else dict(text)
        if raw.get("version") != DESCRIPTOR_VERSION:
            raise UnsupportedError(f"attention descriptor version {raw.get('version')} (nvgpu reads "
                                   f"{DESCRIPTOR_VERSION})", op="func.func")
        ops = raw["operands"]
        layout = OperandLayout.from_descriptor
        unit = raw.get("unit")
        desc = AttentionDescriptor(
            int(raw["batch"]), int(raw["sq"]), int(raw["sk"]), int(raw["d"]), int(raw["dv"]), str(raw["dtype"]),
            None if raw.get("causal_offset") is None else int(raw["causal_offset"]), bool(raw["mask"]),
            int(raw.get("kv_groups", 1)), float(raw["scale"]), float(raw.get("mask_scale", 1.0)),
            int(raw["block_q"]), int(raw["block_k"]), None if unit is None else str(unit["name"]),
            layout(ops["q"]), layout(ops["k"]), layout(ops["v"]),
            layout(ops["mask"]) if raw["mask"] and ops.get("mask") else None)
    except (KeyError, TypeError, ValueError) as exc:
        raise CompileError(f"malformed pbsdk.attention descriptor: {exc!r}", op="func.func") from exc
    if desc.dtype not in ("f32", "f16", "bf16"):
        raise UnsupportedError(f"fused attention in {desc.dtype}", op="func.func")
    if desc.mask and desc.m is None:
        raise CompileError("attention descriptor says mask but gives no mask operand", op="func.func")
    if min(desc.batch, desc.sq, desc.sk, desc.d, desc.dv) < 1:
        raise CompileError(f"attention descriptor with an empty dimension: {desc}", op="func.func")
    return desc


@dataclasses.dataclass(frozen=True)
class AttentionMapping:
    """One fused attention on blocks, warps/threads and shared memory (see the module docstring)."""

    desc: AttentionDescriptor
    compute: Literal["mma", "thread"]
    unit: str  # the matrix unit's name, or "fma"
    block_q: int
    block_k: int
    d_pad: int  # Q/K tile columns (d rounded up to the mma k step)
    dv_pad: int  # V/O tile columns (dv rounded up to the mma n step / the SIMT thread columns)
    warp: int = 32
    warps: int = 1  # mma: warps per block, each owning 16 query rows
    tm: int = 1  # SIMT: rows of S and O per thread
    tn_s: int = 1  # SIMT: columns of S per thread
    tn_o: int = 1  # SIMT: columns of O per thread
    budget: int = 0  # shared-memory bytes a block may use
    row_threads: int = 1  # threads sharing one query row's softmax update
    pads: tuple[tuple[str, int], ...] = ()  # shared tile -> extra elements per row (bank-conflict padding)
    vec_q: int = 1  # elements per global load when staging Q / K / V tiles (16-byte vectors where aligned)
    vec_k: int = 1
    vec_v: int = 1
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.compute == "mma":
            if self.block_q != 16 * self.warps or self.block_k % 16 or self.d_pad % 16 or self.dv_pad % 8:
                raise ValueError(f"{self}: tiles must split into 16x8x16 mma steps, 16 query rows per warp")
        else:
            ty, tx = SIMT_THREADS
            if (self.block_q != ty * self.tm or self.block_k != tx * self.tn_s or self.dv_pad != tx * self.tn_o):
                raise ValueError(f"{self}: tiles must split into the {ty}x{tx} SIMT thread grid")
        if self.shared_bytes > self.budget:
            raise ValueError(f"{self}: {self.shared_bytes} B of shared memory exceed {self.budget} B")

    @property
    def dtype(self) -> str:
        return self.desc.dtype

    @property
    def q_blocks(self) -> int:
        return -(-self.desc.sq // self.block_q)

    @property
    def k_tiles(self) -> int:
        return -(-self.desc.sk // self.block_k)

    @property
    def grid(self) -> tuple[int, int]:
        """(query blocks, flat batch): block<y>, block<x>."""
        return self.q_blocks, self.desc.batch

    @property
    def threads(self) -> int:
        if self.compute == "mma":
            return self.warp * self.warps
        return SIMT_THREADS[0] * SIMT_THREADS[1]

    def key_tiles(self, qb: int) -> int:
        """Key tiles query block ``qb`` visits: all of them, or (causal) those holding a key some row of
        the block may see (``j <= i + causal_offset``); the rest are skipped."""
        off = self.desc.causal_offset
        if off is None:
            return self.k_tiles
        last = min((qb + 1) * self.block_q, self.desc.sq) - 1
        return max(0, min(self.k_tiles, -(-(last + off + 1) // self.block_k)))

    def diagonal_tiles(self, qb: int) -> tuple[int, ...]:
        """The visited key tiles in which some (row, key) is causally masked (masked lane by lane)."""
        off = self.desc.causal_offset
        if off is None:
            return ()
        first = qb * self.block_q
        return tuple(t for t in range(self.key_tiles(qb)) if (t + 1) * self.block_k - 1 > first + off)

    @property
    def shared_bytes(self) -> int:
        return shared_bytes(self.compute, self.dtype, self.block_q, self.block_k, self.d_pad, self.dv_pad,
                            dict(self.pads))

    def pitch(self, tile: str) -> int:
        """Elements per row of a shared tile (its logical width plus its padding)."""
        width = {"sq": self.d_pad, "sk": self.d_pad, "sv": self.dv_pad, "ss": self.block_k, "sp": self.block_k,
                 "so": self.dv_pad}[tile]
        return width + dict(self.pads).get(tile, 0)

    def explain(self) -> str:
        d = self.desc
        head = (f"attention {d.batch}x{d.sq}x{d.sk}x{d.d}->{d.dv} {d.dtype}"
                f"{' causal' if d.causal_offset is not None else ''}{' masked' if d.mask else ''} on nvgpu: "
                f"grid {self.grid[0]}x{self.grid[1]}, {self.threads} threads, {self.shared_bytes} B shared")
        return "\n".join([head, *(f"  {r}" for r in self.reasons)])


def row_threads(compute: str, bq: int, bk: int) -> int:
    """Threads that share one query row's softmax update: all of the block's threads over its rows (two on
    the mma path, a warp per 16 rows), a power of two that divides the key tile."""
    threads = 32 * (bq // 16) if compute == "mma" else SIMT_THREADS[0] * SIMT_THREADS[1]
    p = 1
    while p * 2 * bq <= threads and bk % (p * 2) == 0:
        p *= 2
    return p


def padding(dtype: str, level: str) -> dict[str, int]:
    """Extra elements per row of the shared tiles, against bank conflicts (32 banks of 4 bytes).

    ``"rows"``: S by 2 floats and P by 16 bytes, so that the row threads of the softmax update (rows a
    tile's width apart) hit different banks; ``"full"`` also Q, K, V (16 bytes, keeping rows 16-byte
    aligned for vector stores) and O (4 floats), so that the lanes' matrix-fragment loads do; ``"none"``."""
    e16 = 128 // dtype_bits(dtype)
    rows = {"ss": 2, "sp": e16}
    if level == "none":
        return {}
    return rows if level == "rows" else {**rows, "sq": e16, "sk": e16, "sv": e16, "so": 4}


def shared_bytes(compute: str, dtype: str, bq: int, bk: int, dp: int, dvp: int,
                 pads: dict[str, int] | None = None) -> int:
    """Bytes of the block's shared tiles: Q (bq x dp), K (bk x dp), V (bk x dvp) and P (bq x bk) in the
    operand dtype; S (bq x bk) and the O accumulator (bq x dvp) in f32 (rows padded by ``pads``); per row
    m, l, the rescale factor and the new maximum, and per (row thread, row) the partial maxima and sums."""
    eb = dtype_bits(dtype) // 8
    pd = pads or {}
    parts = row_threads(compute, bq, bk)
    narrow = (bq * (dp + pd.get("sq", 0)) + bk * (dp + pd.get("sk", 0)) + bk * (dvp + pd.get("sv", 0))
              + bq * (bk + pd.get("sp", 0)))
    wide = bq * (bk + pd.get("ss", 0)) + bq * (dvp + pd.get("so", 0)) + 4 * bq + 2 * parts * bq
    return narrow * eb + wide * 4


def vector_width(layout: OperandLayout, cols: int, padded: int, dtype: str) -> int:
    """Elements one thread loads at once when staging an operand's rows: a 16-byte vector when every row
    starts 16-byte aligned and is contiguous (``col_stride`` 1, row and batch strides multiples of the
    width, no column padding), else 1."""
    w = 128 // dtype_bits(dtype)
    strides = [layout.row_stride] + [st for size, st, _ in layout.batch if size > 1]
    if layout.col_stride == 1 and cols == padded and cols % w == 0 and all(st % w == 0 for st in strides):
        return w
    return 1


def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _pow2_floor(v: int) -> int:
    return 1 << (max(1, v).bit_length() - 1)


def attention_mapping(spec: ChipSpec, desc: AttentionDescriptor,
                      options: Options | Mapping[str, Any] | None = None) -> AttentionMapping:
    """The block/warp/shared-memory plan for ``desc`` on ``spec`` (see the module docstring)."""
    opts = as_options(options)
    budget = static_shared_bytes(spec)
    unit = mma_unit(spec, desc.dtype, "f32") if opts.matrix_units else None
    reasons = [f"core planner tile {desc.block_q}x{desc.block_k} (unit {desc.unit or 'none'})"]
    warp = warp_width(spec, unit.scope if unit else "warp")
    if unit is not None:
        step_q, step_k = 16, 16
        dp, dvp = _round_up(desc.d, 16), _round_up(desc.dv, 8)
    else:
        step_q, step_k = SIMT_THREADS
        dp, dvp = desc.d, _round_up(desc.dv, SIMT_THREADS[1])
    # Start from the core's tile (a power of two within the unit's steps), never larger than the problem.
    bq = max(step_q, min(MAX_BLOCK_Q, _pow2_floor(desc.block_q), _round_up(desc.sq, step_q)))
    bk = max(step_k, min(MAX_BLOCK_K, _pow2_floor(desc.block_k), _round_up(desc.sk, step_k)))
    bq, bk = _round_up(bq, step_q), _round_up(bk, step_k)
    compute = "mma" if unit is not None else "thread"
    start = (bq, bk)
    def fit(pads: dict[str, int]) -> tuple[int, int] | None:
        """Shrink until every tile fits the static shared memory: keys first down to 32 (the query tile
        sets the warps and the reuse of each K/V tile), then queries, then keys to one step."""
        q, k = start
        while shared_bytes(compute, desc.dtype, q, k, dp, dvp, pads) > budget:
            if k > max(32, step_k):
                k = max(step_k, _round_up(k // 2, step_k))
            elif q > step_q:
                q = max(step_q, _round_up(q // 2, step_q))
            elif k > step_k:
                k = max(step_k, _round_up(k // 2, step_k))
            else:
                return None
        return q, k

    # Bank-conflict padding only where it costs no tile size: the largest tile any level fits, then the
    # most padding that still fits it.
    fits = {level: fit(padding(desc.dtype, level)) for level in ("full", "rows", "none")}
    if fits["none"] is None:
        raise CompileError(f"the smallest attention tiles ({step_q}x{step_k}, d={desc.d}, dv={desc.dv}) need "
                           f"{shared_bytes(compute, desc.dtype, step_q, step_k, dp, dvp)} B of shared memory; "
                           f"'{spec.name}' gives a block {budget} B without opt-in", op="func.func")
    best = max((t for t in fits.values() if t is not None), key=lambda t: t[0] * t[1])
    level = next(lv for lv, t in fits.items() if t == best)
    bq, bk = best
    pads = padding(desc.dtype, level)
    reasons.append(f"bank-conflict padding: {level}" + (f" ({', '.join(f'{t} +{n}' for t, n in pads.items())})"
                                                         if pads else ""))
    used = shared_bytes(compute, desc.dtype, bq, bk, dp, dvp, pads)
    rt = row_threads(compute, bq, bk)
    if (bq, bk) != start:
        reasons.append(f"tile {start[0]}x{start[1]} -> {bq}x{bk}: Q, K, V, P and the f32 S/O tiles in {budget} B "
                       "of static shared memory (no opt-in, no double buffering)")
    reasons.append(f"tiles {bq}x{bk} (d {desc.d}->{dp}, dv {desc.dv}->{dvp}) use {used} of {budget} B shared memory")
    reasons.append(f"online softmax: {rt} threads per query row (partial maxima and sums in shared memory)")
    if desc.causal_offset is not None:
        reasons.append(f"causal (offset {desc.causal_offset}): key tiles above a block's diagonal skipped, "
                       "the diagonal masked per (row, key)")
    if desc.kv_groups > 1:
        reasons.append(f"grouped-query: {desc.kv_groups} query heads read each K/V head in place (zero strides)")
    vec = {"vec_q": vector_width(desc.q, desc.d, dp, desc.dtype), "vec_k": vector_width(desc.k, desc.d, dp, desc.dtype),
           "vec_v": vector_width(desc.v, desc.dv, dvp, desc.dtype)}
    reasons.append("tile loads of " + ", ".join(f"{n[-1].upper()}: {w} element{'s' if w > 1 else ''}"
                                                for n, w in vec.items()) + " per thread and step")
    q_blocks = -(-desc.sq // bq)
    if q_blocks > MAX_GRID_YZ:
        raise UnsupportedError(f"{q_blocks} query blocks exceed CUDA's grid y limit {MAX_GRID_YZ}", op="func.func")
    if unit is not None:
        warps = bq // 16
        reasons.append(f"{unit.name} for S = Q·Kᵀ and O += P·V (P rounded to {desc.dtype}, f32 accumulation); "
                       f"{warps} warps of {warp}, 16 query rows each")
        mm = AttentionMapping(desc, "mma", unit.name, bq, bk, dp, dvp, warp=warp, warps=warps, budget=budget,
                              row_threads=rt, pads=tuple(pads.items()), reasons=tuple(reasons), **vec)
    else:
        ty, tx = SIMT_THREADS
        why = "matrix_units=False" if not opts.matrix_units else f"no matrix unit for {desc.dtype}->f32"
        reasons.append(f"{why}: SIMT FMAs, {ty}x{tx} threads, {bq // ty}x{bk // tx} of S and "
                       f"{bq // ty}x{dvp // tx} of O per thread")
        mm = AttentionMapping(desc, "thread", "fma", bq, bk, dp, dvp, warp=warp, tm=bq // ty, tn_s=bk // tx,
                              tn_o=dvp // tx, budget=budget, row_threads=rt, pads=tuple(pads.items()),
                              reasons=tuple(reasons), **vec)
    if mm.threads > block_thread_limit(spec):
        raise UnsupportedError(f"{mm.threads} threads per block exceed the spec's limit", op="func.func")
    return mm
