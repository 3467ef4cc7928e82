"""Where a kernel's temporaries live: one workspace, planned at compile time.

A compiled entry function allocates its intermediate buffers (activations between layers, patch
matrices, packed panels) with ``memref.alloc`` and frees them before it returns. Done on every call, each
buffer above the C library's mmap threshold (32 MiB at most on glibc) is a fresh mapping whose every page
faults in again: ResNet-50 at batch 8 took 151 000 page faults a call, a quarter of its run time. Instead
the `plan-workspace` pass (`pbsdk.core.passes.plan_workspace`) gives every buffer of the entry function
an offset in one workspace that the executable allocates once and passes to every call.

`plan_workspace` is the analysis: buffers whose live ranges (first to last use, in the entry function's
op order) overlap get disjoint byte ranges; the others may share. It places the largest buffer first,
each at the lowest aligned offset that clears every already-placed buffer it is live with (greedy by
size, as TFLite's arena planner), so the workspace is close to the largest total of buffers live at one
time (`peak_bytes`), not their sum.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

#: Byte alignment of every buffer in the workspace (a cache line; AVX-512 loads of a whole vector).
ALIGNMENT = 64


@dataclasses.dataclass(frozen=True)
class Buffer:
    """A temporary of ``size`` bytes, live from op ``first`` to op ``last`` (inclusive) of its function."""

    size: int
    first: int
    last: int
    alignment: int = ALIGNMENT

    def __post_init__(self) -> None:
        if self.size < 0 or self.first > self.last or self.alignment < 1 or self.alignment & (self.alignment - 1):
            raise ValueError(f"buffer of {self.size} bytes live over ops {self.first}..{self.last}, alignment "
                             f"{self.alignment}: need size >= 0, first <= last and a power-of-two alignment")

    def overlaps(self, other: Buffer) -> bool:
        return self.first <= other.last and other.first <= self.last


@dataclasses.dataclass(frozen=True)
class WorkspacePlan:
    """Each buffer's byte offset (in the order given), the workspace's size, and for comparison the sum of
    the buffers' sizes (what allocating each one apart holds at most) and the largest total live at one
    op (no plan can do with less)."""

    offsets: tuple[int, ...]
    size: int
    total_bytes: int
    peak_bytes: int


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


def first_fit(taken: Sequence[tuple[int, int]], size: int, alignment: int) -> int:
    """The lowest ``alignment``-aligned offset where ``size`` bytes fit between the byte ranges ``taken``
    (``[start, end)`` pairs, sorted by start): the first gap that holds them, else past the last range."""
    offset = 0
    for start, end in taken:
        if _align(offset, alignment) + size <= start:
            break
        offset = max(offset, end)
    return _align(offset, alignment)


def plan_workspace(buffers: Sequence[Buffer]) -> WorkspacePlan:
    """Offsets for ``buffers`` in one workspace such that two buffers live at the same op never share a
    byte (module docstring). Every offset is a multiple of its buffer's alignment, and the size of a
    multiple of `ALIGNMENT`."""
    order = sorted(range(len(buffers)), key=lambda i: (-buffers[i].size, buffers[i].first, i))
    offsets: dict[int, int] = {}
    for i in order:
        b = buffers[i]
        # The byte ranges of placed buffers live with this one, by start: take the first gap that fits.
        taken = sorted((o, o + buffers[j].size) for j, o in offsets.items()
                       if buffers[j].overlaps(b) and buffers[j].size)
        offsets[i] = first_fit(taken, b.size, b.alignment)
    size = max((offsets[i] + b.size for i, b in enumerate(buffers)), default=0)
    events = sorted({b.first for b in buffers})
    peak = max((sum(b.size for b in buffers if b.first <= t <= b.last) for t in events), default=0)
    return WorkspacePlan(tuple(offsets[i] for i in range(len(buffers))), _align(size, ALIGNMENT),
                         sum(b.size for b in buffers), peak)
