"""Pass ``copy-strided-casts``: a strided view cast to the identity layout is copied instead.

Bufferization with identity-layout function boundaries passes a strided view to a function (an isolated
contraction) through ``memref.cast`` where the two layouts are cast-compatible, and copies it where they
are not. With a size known only at run time they are always compatible: the identity layout of
``memref<12x?x64xf32>`` has strides ``[?, 64, 1]``, which admit a view's ``[2560, 64, 1]``. But the
identity layout *means* row-major strides (``? = size(1) * 64``), and whatever reads the argument computes
them from the sizes: a view of the first ``s`` rows of a 40-row buffer (a static KV cache's keys so far)
is then read as if its batches were ``s`` rows apart. Such a cast is replaced by a row-major copy of the
view (its dynamic sizes read with ``memref.dim``), freed by the deallocation pipeline of ``out-params``.

A cast whose source is provably row-major at offset 0 (`row_major`: every stride static and the product
of the static sizes inside it) is exact and stays.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import arith, memref

from pbsdk.core.passes import ops_named, row_major


def _copied(view: ir.Value, source: ir.MemRefType) -> ir.Value:
    """A fresh row-major buffer of ``view``'s sizes holding its elements (at the insertion point)."""
    index = ir.IndexType.get()
    sizes = [memref.dim(view, arith.constant(index, i)) for i, n in enumerate(source.shape)
             if source.is_dynamic_size(n)]
    fresh_t = ir.MemRefType.get(source.shape, source.element_type, memory_space=source.memory_space)
    fresh = memref.alloc(fresh_t, sizes, [])
    memref.copy(view, fresh)
    return fresh


@dataclasses.dataclass(frozen=True)
class CopyStridedCasts:
    name = "copy-strided-casts"

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        for cast in ops_named(module, "memref.cast"):
            src, result = cast.operands[0], cast.results[0]
            if not (isinstance(src.type, ir.MemRefType) and isinstance(result.type, ir.MemRefType)):
                continue  # unranked
            if not row_major(result.type) or row_major(src.type):
                continue
            with ir.InsertionPoint(cast), cast.location:
                fresh = _copied(src, ir.MemRefType(src.type))
                if fresh.type != result.type:
                    fresh = memref.cast(result.type, fresh)
            result.replace_all_uses_with(fresh)
            cast.erase()


__all__ = ["CopyStridedCasts"]
