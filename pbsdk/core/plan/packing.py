"""The packing view of a cache-only chip: its caches as the levels the tiled form stages tiles in.

The core's tiled form (`pbsdk.core.passes.promote`, `pbsdk.core.passes.promote_vector`) stages every tile
in a buffer of a software-managed level, with explicit copies between levels. A chip whose levels besides
main memory are all hardware-managed caches (a RISC-V-vector or Arm SVE core) has no such level, but the
same form serves it as packing serves a CPU (Goto/BLIS): each tile is copied into a contiguous buffer
small enough for the hardware to keep it in one cache, so the copies say what each cache level serves
and the buffers what it holds.

`packing_view` is that reading of the spec: every cache level becomes a software-managed level of
`CACHE_BUDGET` of its capacity (the rest is headroom for the lines the chip's hardware keeps there besides
the packed tiles: the planner's cache budget), everything else unchanged. Targets stage with the view
and keep the spec itself for what the chip is (its modelled time, the conformance resource checks).
"""

from __future__ import annotations

from pbsdk.core.errors import TargetError
from pbsdk.core.plan.contraction import CACHE_BUDGET
from pbsdk.core.spec import ChipSpec

__all__ = ["is_cache_only", "packing_view"]


def is_cache_only(spec: ChipSpec) -> bool:
    """Whether every level besides main memory is a cache (and there is at least one)."""
    inner = spec.memory[1:]
    return bool(inner) and all(m.managed == "cache" for m in inner)


def packing_view(spec: ChipSpec) -> ChipSpec:
    """``spec`` with each cache level read as a software-managed packing level of `CACHE_BUDGET` of its
    size (rounded down to its alignment). Raises `TargetError` for a spec that is not cache-only."""
    if not is_cache_only(spec):
        raise TargetError(f"the packing view is for chips whose levels besides main memory are all caches; "
                          f"'{spec.name}' has {', '.join(f'{m.name} ({m.managed})' for m in spec.memory[1:]) or 'none'}")
    data = spec.model_dump()
    for level in data["memory"][1:]:
        budget = int(level["size_bytes"] * CACHE_BUDGET)
        level["size_bytes"] = max(level["alignment_bytes"], budget - budget % level["alignment_bytes"])
        level["max_size_bytes"] = None
        level["managed"] = "software"
    return ChipSpec.model_validate(data)
