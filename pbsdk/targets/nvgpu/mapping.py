"""How nvgpu maps work onto the GPU's hierarchy: pure decisions from the ChipSpec, checked without IR.

The tiles, the shared-memory staging and the unit steps are the core's (``promote``, ``promote-vector``);
what is decided here is only how a kernel's loops meet blocks, warps and threads:

- `thread_split`: how the threads of a block share one staged op's loops (innermost parallel loop first,
  so that consecutive threads take consecutive elements; reductions stay sequential in each thread);
- `warp_share`: how many warps share a block's unit steps;
- `LoopMapping` for an op the core left on main memory: its innermost (up to three) parallel loops are
  split into blocks of at most `THREADS_PER_BLOCK` threads, one output point per thread.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pbsdk.core.errors import CompileError, SpecError, UnsupportedError
from pbsdk.core.spec import ChipSpec

#: Threads per block for loop kernels (a multiple of the warp width; within every NVIDIA chip's limit).
THREADS_PER_BLOCK = 256
#: Largest y/z grid extent CUDA allows (x allows 2**31 - 1).
MAX_GRID_YZ = 65535
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


def thread_split(extents: Sequence[int | None], iterators: Sequence[str], threads: int) -> tuple[int, ...]:
    """Threads per loop of one staged op (0: the loop runs sequentially in each thread). The innermost
    parallel loops take threads first, each at most its extent (``None``: unknown, may take them all),
    until ``threads`` are used; reduction loops never take threads."""
    split = [0] * len(iterators)
    budget = threads
    for d in reversed([i for i, it in enumerate(iterators) if it == "parallel"]):
        if budget <= 1:
            break
        e = extents[d]
        t = budget if e is None else max(1, min(e, budget))
        split[d] = t if t > 1 else 0
        budget //= max(t, 1)
    return tuple(split)


def warp_share(tiles: int, threads: int, warp: int) -> int:
    """Warps that share ``tiles`` disjoint accumulator tiles of unit steps: all of the block's
    (``threads / warp``), but never more than there are tiles."""
    return max(1, min(threads // warp, tiles))
