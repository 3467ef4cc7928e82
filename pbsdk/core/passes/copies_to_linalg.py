"""Pass ``copies-to-linalg``: rewrite ``memref.copy`` into ``linalg.copy``.

Upstream lowers a ``memref.copy`` between identity-layout buffers to an ``llvm.memcpy`` intrinsic, but
one touching a strided view (e.g. the interior of a padded buffer) to a call into MLIR's runner-utils
library. pbsdk ships no runtime library, so such copies become ``linalg.copy`` ops, which the loop
lowering turns into plain loops (and which later tiling/vectorisation can treat like any other linalg op).
A copy whose two sides are each one contiguous run (`contiguous`: identity layouts, or a one-row view of
a padded image at a dynamic offset) is a memcpy to upstream too and stays a ``memref.copy``; with
``memcpy_contiguous`` such a ``linalg.copy`` becomes one (the cpu target: ``fuse-rows`` splits a strided
copy into row copies that are contiguous, which LLVM would otherwise get as three nested loops to
vectorise, ~0.1-0.3 s of compile each).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import linalg, memref

from pbsdk.core.passes import contiguous, ops_named


@dataclasses.dataclass(frozen=True)
class CopiesToLinalg:
    """Options: ``only_strided`` keeps copies between contiguous sides as ``memref.copy`` (a memcpy);
    ``memcpy_contiguous`` also turns such ``linalg.copy`` ops (same element type) into ``memref.copy``."""

    name = "copies-to-linalg"
    only_strided: bool = True
    memcpy_contiguous: bool = False

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        for op in ops_named(module, "memref.copy"):
            src, dst = op.operands[0], op.operands[1]
            if self.only_strided and contiguous(src.type) and contiguous(dst.type):
                continue
            with ir.InsertionPoint(op), op.location:
                linalg.copy(src, outs=[dst])
            op.erase()
        if not self.memcpy_contiguous:
            return
        for op in ops_named(module, "linalg.copy"):
            src, dst = op.operands[0], op.operands[1]
            if contiguous(src.type) and contiguous(dst.type) and \
                    ir.MemRefType(src.type).element_type == ir.MemRefType(dst.type).element_type:
                with ir.InsertionPoint(op), op.location:
                    memref.copy(src, dst)
                op.erase()
