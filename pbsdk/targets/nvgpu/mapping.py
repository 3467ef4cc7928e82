"""How nvgpu maps work onto the GPU's hierarchy: pure decisions from the ChipSpec and the core's plan.

Two kinds of kernel, both decided here without IR (so unit tests check them directly):

- `LoopMapping` for every linalg op that is not a named matmul (elementwise, reductions, fills, copies,
  transposes, generic contractions, convolutions): its innermost (up to three) parallel loops are split
  into thread blocks of at most `THREADS_PER_BLOCK` threads, one output point per thread; reduction loops
  and unmapped outer parallel loops run sequentially inside each thread.
- `MatmulMapping` for ``linalg.matmul`` / ``linalg.batch_matmul``: the block tile ``bm x bn x bk`` is the
  core planner's shared-memory tile (`plan_contraction` with the spec's shared-memory level), clamped to
  what one block's static shared memory holds — operand tiles *and* the f32 accumulator tile live there;
  blocks tile (batch, m, n); the k loop streams operand tiles global -> shared (zero-padded at the edges, so
  unaligned shapes need no special case); the compute step is the spec's warp-level matrix unit
  (``mma.sync.m16n8k16`` for f16/bf16) issued by a ``warps_m x warps_n`` grid of warps, or, without one, a
  ``tm x tn`` register tile per thread.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pbsdk.core.errors import CompileError, SpecError, UnsupportedError
from pbsdk.core.options import Options, as_options
from pbsdk.core.plan import Contraction, plan_contraction
from pbsdk.core.spec import ChipSpec, MatrixUnit, dtype_bits

#: Threads per block for loop kernels (a multiple of the warp width; within every NVIDIA chip's limit).
THREADS_PER_BLOCK = 256
#: Largest y/z grid extent CUDA allows (x allows 2**31 - 1).
MAX_GRID_YZ = 65535
#: The matrix-unit shapes this target can issue (others in a spec, e.g. wgmma, are not lowered yet).
MMA_SHAPES = {(16, 8, 16)}


def _pow2_floor(v: int) -> int:
    return 1 << (max(1, v).bit_length() - 1)


def _clamp(v: int, lo: int, hi: int) -> int:
    return max(lo, min(hi, v))


def block_thread_limit(spec: ChipSpec) -> int:
    """Threads one block may have, from the outermost compute level's ``max_threads_per_block``."""
    return int(spec.compute[0].limits.get("max_threads_per_block", 1024))


def warp_width(spec: ChipSpec, scope: str = "warp") -> int:
    """Threads per warp: the ``width`` limit of the compute level a warp-scope matrix unit names."""
    try:
        return int(spec.compute_level(scope).limits.get("width", 32))
    except SpecError:  # a spec without a warp level: the PTX warp is 32 lanes
        return 32


def static_shared_bytes(spec: ChipSpec) -> int:
    """Static shared memory one block may use without opting in: the first scratchpad's ``size_bytes``."""
    pads = spec.scratchpads()
    if not pads:
        raise CompileError(f"chip spec '{spec.name}' has no software-managed on-chip memory (shared memory)")
    return pads[0].size_bytes


@dataclasses.dataclass(frozen=True)
class LoopMapping:
    """One linalg op's loops on (grid, block): ``dims`` are the loops mapped to (z, y, x) — at most three,
    innermost last — with ``tile`` points per block along each; everything else runs inside a thread."""

    extents: tuple[int, ...]
    dims: tuple[int, ...]
    tile: tuple[int, ...]

    @property
    def grid(self) -> tuple[int, ...]:
        return tuple(-(-self.extents[d] // t) for d, t in zip(self.dims, self.tile))

    @property
    def threads(self) -> int:
        return math.prod(self.tile) if self.tile else 1

    def grid_xyz(self) -> tuple[int, int, int]:
        g = list(reversed(self.grid)) + [1, 1, 1]
        return g[0], g[1], g[2]

    def block_xyz(self) -> tuple[int, int, int]:
        b = list(reversed(self.tile)) + [1, 1, 1]
        return b[0], b[1], b[2]


def loop_mapping(extents: Sequence[int], iterators: Sequence[str], *, threads: int = THREADS_PER_BLOCK,
                 units: int = 1, warp: int = 32) -> LoopMapping:
    """Map the innermost parallel loops (x = innermost, then y, z) with up to ``threads`` points per block.

    Blocks shrink (down to one warp) until there are at least ``units`` of them (the spec's SM count), so
    that e.g. a row reduction over 4096 rows spreads over the whole chip rather than 16 SMs."""
    parallel = [i for i, it in enumerate(iterators) if it == "parallel"]
    dims = tuple(parallel[-3:])
    points = math.prod(extents[d] for d in dims) if dims else 1
    per_unit = max(1, points // max(1, units))
    if -(-points // threads) < units:
        threads = max(min(warp, threads), 1 << (per_unit.bit_length() - 1))
    tile: list[int] = []
    budget = threads
    for d in reversed(dims):  # x first: consecutive threads touch consecutive elements (coalescing)
        t = max(1, min(extents[d], budget))
        tile.insert(0, t)
        budget = max(1, budget // t)
    mapping = LoopMapping(tuple(extents), dims, tuple(tile))
    for i, g in enumerate(mapping.grid_xyz()[1:]):
        if g > MAX_GRID_YZ:
            raise UnsupportedError(f"grid {'yz'[i]} extent {g} exceeds CUDA's {MAX_GRID_YZ}", op="linalg.generic")
    return mapping


@dataclasses.dataclass(frozen=True)
class MatmulMapping:
    """A (batched) matmul ``C[b] += A[b] @ B[b]`` on blocks, warps/threads and shared memory."""

    batch: int
    m: int
    n: int
    k: int
    dtype: str
    acc_dtype: str
    bm: int
    bn: int
    bk: int
    compute: Literal["mma", "thread"]
    unit: str  # the matrix unit's name, or "fma"
    warps_m: int = 1
    warps_n: int = 1
    tm: int = 1  # thread path: register tile per thread
    tn: int = 1
    warp: int = 32
    reasons: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.compute == "mma":
            if self.bm % (16 * self.warps_m) or self.bn % (8 * self.warps_n) or self.bk % 16:
                raise ValueError(f"{self}: block tile must split into 16x8x16 mma tiles per warp")
        elif self.bm % self.tm or self.bn % self.tn:
            raise ValueError(f"{self}: block tile must be a multiple of the thread tile")

    @property
    def grid(self) -> tuple[int, int, int]:
        """(batch, m tiles, n tiles): block<z>, block<y>, block<x>."""
        return self.batch, -(-self.m // self.bm), -(-self.n // self.bn)

    @property
    def threads(self) -> int:
        if self.compute == "mma":
            return self.warp * self.warps_m * self.warps_n
        return (self.bm // self.tm) * (self.bn // self.tn)

    @property
    def k_tiles(self) -> int:
        return -(-self.k // self.bk)

    @property
    def shared_bytes(self) -> int:
        eb, ab = dtype_bits(self.dtype) // 8, dtype_bits(self.acc_dtype) // 8
        return (self.bm * self.bk + self.bk * self.bn) * eb + self.bm * self.bn * ab


def mma_unit(spec: ChipSpec, dtype: str, acc: str) -> MatrixUnit | None:
    """The spec's first warp-scope matrix unit for (dtype, acc) whose shape this target issues."""
    for u in spec.matrix_units_for(dtype, acc):
        if (u.m, u.n, u.k) in MMA_SHAPES and u.name.startswith("mma.sync"):
            return u
    return None


def _fits(mm: dict[str, int], eb: int, ab: int, budget: int) -> bool:
    return (mm["bm"] * mm["bk"] + mm["bk"] * mm["bn"]) * eb + mm["bm"] * mm["bn"] * ab <= budget


def matmul_mapping(spec: ChipSpec, batch: int, m: int, n: int, k: int, dtype: str, acc: str,
                   options: Options | Mapping[str, Any] | None = None) -> MatmulMapping:
    """Block tile from the planner's shared-memory tile, clamped to static shared memory."""
    opts = as_options(options)
    budget = static_shared_bytes(spec)
    unit = mma_unit(spec, dtype, acc) if opts.matrix_units else None
    # Ask the planner with the units this target lowers and the budget this target uses (static shared
    # memory, no double buffering yet), so the plan's tile is one the kernel can hold.
    units = [u for u in spec.matrix_units if u is unit]
    view = spec.model_copy(update={"matrix_units": units})
    plan = plan_contraction(view, Contraction(m, n, k, batch, dtype, acc),
                            opts.replace(optin_scratchpad=False, double_buffer=False))
    pads = {lv.name for lv in spec.scratchpads()}
    smem = next((t for t in plan.levels if t.level in pads), plan.levels[0] if plan.levels else None)
    tm, tn, tk = (smem.m, smem.n, smem.k) if smem else (64, 64, 16)
    reasons = [f"planner tile @{smem.level if smem else '?'}: {tm}x{tn}x{tk}"]
    eb, ab = dtype_bits(dtype) // 8, dtype_bits(acc) // 8
    warp = warp_width(spec, unit.scope if unit else "warp")
    if unit is not None:
        t = {"bm": _clamp(_pow2_floor(tm), 16, 128), "bn": _clamp(_pow2_floor(tn), 16, 128),
             "bk": _clamp(_pow2_floor(tk), 16, 32)}
    else:
        t = {"bm": _clamp(_pow2_floor(tm), 16, 64), "bn": _clamp(_pow2_floor(tn), 16, 64),
             "bk": _clamp(_pow2_floor(tk), 8, 16)}
    # Not larger than the problem (rounded up to the unit), so tiny matmuls do not waste blocks.
    t["bm"] = min(t["bm"], max(16, 1 << (m - 1).bit_length()))
    t["bn"] = min(t["bn"], max(16, 1 << (n - 1).bit_length()))
    lo_k = 16 if unit is not None else 8
    t["bk"] = min(t["bk"], max(lo_k, 1 << (k - 1).bit_length()))
    while not _fits(t, eb, ab, budget):
        if t["bk"] > lo_k:
            t["bk"] //= 2
        elif t["bn"] >= t["bm"] and t["bn"] > 16:
            t["bn"] //= 2
        elif t["bm"] > 16:
            t["bm"] //= 2
        else:
            raise CompileError(f"a 16x16 matmul tile does not fit in {budget} B of shared memory", op="linalg.matmul")
    if t != {"bm": tm, "bn": tn, "bk": tk}:
        reasons.append(f"block tile {t['bm']}x{t['bn']}x{t['bk']}: operand and f32 accumulator tiles in "
                       f"{budget} B of static shared memory")
    if unit is not None:
        wm = 2 if t["bm"] >= 32 else 1
        wn = 2 if t["bn"] >= 16 else 1
        reasons.append(f"{unit.name} issued by {wm}x{wn} warps of {warp}")
        return MatmulMapping(batch, m, n, k, dtype, acc, t["bm"], t["bn"], t["bk"], "mma", unit.name,
                             warps_m=wm, warps_n=wn, warp=warp, reasons=tuple(reasons))
    ty, tx = min(16, t["bm"]), min(16, t["bn"])
    reasons.append(f"no matrix unit for {dtype}->{acc}: {t['bm'] // ty}x{t['bn'] // tx} outputs per thread")
    return MatmulMapping(batch, m, n, k, dtype, acc, t["bm"], t["bn"], t["bk"], "thread", "fma",
                         tm=t["bm"] // ty, tn=t["bn"] // tx, warp=warp, reasons=tuple(reasons))
