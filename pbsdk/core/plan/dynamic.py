"""Plans for a contraction whose row count ``m`` is known only at call time (a dynamic dimension).

The static planner (`plan_contraction`) tailors the register tile, the blocks and the thread split to ``m``:
one row gets a GEMV tile (1 x 12 vectors, B read in place), a few rows get one tile of exactly that many, a
thousand rows 14 x 2 tiles split by rows over the cores. No single blocking is close to the static one over
the whole range 1 - 4096, so a dynamic ``m`` is planned as a few size buckets: each bucket's kernel is the
static planner's blocking at the bucket's largest size (in the given orientation, ``transpose_gemm`` off:
the kernel's rows must be the dynamic dimension), and the call picks the bucket of the actual ``m``. Inside
a bucket every size runs that kernel with its remainder handled at run time (the last tile row computes
the smallest `edge_row_variants` count of rows that covers it). Pure: no IR.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from pbsdk.core.options import Options, as_options
from pbsdk.core.plan.contraction import Blocking, Contraction, plan_contraction
from pbsdk.core.spec import ChipSpec

#: Upper ends of the row-count buckets above the small ones (the last bucket is open: it takes every larger
#: m). Below them `bucket_ends` puts one row (a decoder step at batch 1 keeps the static GEMV kernel), one
#: register tile of the large plan's rows and two such tiles.
BUCKET_ENDS = (127, 511)
#: The size the open last bucket is planned at.
LARGE_M = 4096
#: The size a dynamic n or k (a column count or reduction length known at call time) is planned at; the
#: kernel clamps its blocks to the actual size.
DYNAMIC_EXTENT = 1024


#: Register tiles of at most this many rows get an edge variant for every row count below theirs.
EXACT_EDGE_ROWS = 16


def edge_row_variants(mr: int) -> tuple[int, ...]:
    """Row counts of the edge tiles of a kernel whose row count is known only at call time. The last tile
    row's ``r`` rows run the smallest variant of at least ``r`` rows (a whole tile above the largest). A tile
    of up to `EXACT_EDGE_ROWS` rows (every vector-FMA tile of a 32-register machine) has a variant for
    every count below it: the small buckets' kernels are one tile tall, so their edge tile is all the work
    (a decoder's step at batch 5 on a 14-row tile would compute 14 rows). A taller tile has the powers of two
    below ``mr``: its edge tile computes fewer than twice the rows it stores."""
    if mr <= EXACT_EDGE_ROWS:
        return tuple(range(1, mr))
    out, r = [], 1
    while r < mr:
        out.append(r)
        r *= 2
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class SizeBucket:
    """Row counts ``lo..hi`` (``hi`` None: no upper end) run the kernel of ``blocking``, planned at ``at``."""

    lo: int
    hi: int | None
    at: int
    blocking: Blocking

    def holds(self, m: int) -> bool:
        return m >= self.lo and (self.hi is None or m <= self.hi)


@dataclasses.dataclass(frozen=True)
class DynamicContractionPlan:
    """The buckets of a contraction ``C[b, m, n] += A[b, m, k] B[b, k, n]`` with a dynamic ``m``, in
    increasing order and covering ``1..`` without gaps."""

    n: int
    k: int
    batch: int
    dtype: str
    buckets: tuple[SizeBucket, ...]

    def bucket_for(self, m: int) -> SizeBucket:
        for b in self.buckets:
            if b.holds(m):
                return b
        raise ValueError(f"no bucket holds m = {m}")

    def describe(self) -> str:
        parts = []
        for b in self.buckets:
            blk = b.blocking
            span = f"{b.lo}" if b.hi == b.lo else f"{b.lo}-{b.hi}" if b.hi is not None else f"{b.lo}+"
            parts.append(f"m {span}: {blk.mr}x{blk.nr} tile, mc/nc/kc {blk.mc}/{blk.nc}/{blk.kc}, "
                         f"{blk.threads} part(s) along {blk.split}")
        return "; ".join(parts)


def bucket_ends(spec: ChipSpec, *, n: int, k: int, batch: int, dtype: str,
                options: Options | Mapping[str, Any] | None = None) -> tuple[int, ...] | None:
    """The buckets' upper ends for this contraction: 1, then ``mr`` and ``2 mr`` for the register tile's rows
    ``mr`` of the plan at `LARGE_M` rows (a bucket of at most one, or two, tile rows: the static planner fits
    its tile to so few rows, and one kernel of that tile with exact edge variants computes the same FMAs),
    then `BUCKET_ENDS`. None without a packed blocking."""
    opts = dataclasses.replace(as_options(options), transpose_gemm=False)
    blk = plan_contraction(spec, Contraction(LARGE_M, n, k, batch, dtype), opts).blocking
    if blk is None:
        return None
    return tuple(sorted({1, blk.mr, 2 * blk.mr, *BUCKET_ENDS}))


def plan_dynamic_contraction(spec: ChipSpec, *, n: int, k: int, batch: int, dtype: str,
                             options: Options | Mapping[str, Any] | None = None,
                             ends: Sequence[int] | None = None, m: int | None = None
                             ) -> DynamicContractionPlan | None:
    """The buckets of a dynamic-``m`` contraction (module docstring; ``ends``: their upper ends, by default
    `bucket_ends`), or None when the static planner gives some bucket no packed blocking (the op then takes
    the generic lowering). ``batch`` is 1 for a plain matmul. With a static ``m`` (only n or k dynamic, passed
    here at the size to plan them at), one bucket of exactly ``m`` rows."""
    opts = dataclasses.replace(as_options(options), transpose_gemm=False)
    if m is not None:
        only = plan_contraction(spec, Contraction(m, n, k, batch, dtype), opts).blocking
        if only is None or only.transposed or only.unit:
            return None
        return DynamicContractionPlan(n, k, batch, dtype, (SizeBucket(m, m, m, only),))
    if ends is None:
        ends = bucket_ends(spec, n=n, k=k, batch=batch, dtype=dtype, options=opts)
        if ends is None:
            return None
    buckets: list[SizeBucket] = []
    lo = 1
    for hi in [*ends, None]:
        at = hi if hi is not None else max(LARGE_M, lo)
        plan = plan_contraction(spec, Contraction(at, n, k, batch, dtype), opts)
        blk: Any = plan.blocking
        if blk is None or blk.transposed or blk.unit:
            return None
        if buckets and buckets[-1].blocking == blk:  # the same kernel as the bucket below: one bucket
            buckets[-1] = SizeBucket(buckets[-1].lo, hi, buckets[-1].at, blk)
        else:
            buckets.append(SizeBucket(lo, hi, at, blk))
        if hi is not None:
            lo = hi + 1
    return DynamicContractionPlan(n, k, batch, dtype, tuple(buckets))


__all__ = ["BUCKET_ENDS", "DYNAMIC_EXTENT", "EXACT_EDGE_ROWS", "DynamicContractionPlan", "SizeBucket", "bucket_ends", "edge_row_variants", "plan_dynamic_contraction"]
