"""Pass ``copies-to-linalg``: rewrite ``memref.copy`` into ``linalg.copy``.

Upstream lowers a ``memref.copy`` between identity-layout buffers to an ``llvm.memcpy`` intrinsic, but
one touching a strided view (e.g. the interior of a padded buffer) to a call into MLIR's runner-utils
library. pbsdk ships no runtime library, so such copies become ``linalg.copy`` ops, which the loop
lowering turns into plain loops (and which later tiling/vectorisation can treat like any other linalg op).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import linalg

from pbsdk.core.passes import identity_layout, ops_named


@dataclasses.dataclass(frozen=True)
class CopiesToLinalg:
    """Options: ``only_strided`` keeps identity-to-identity copies as ``memref.copy`` (a memcpy)."""

    name = "copies-to-linalg"
    only_strided: bool = True

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        for op in ops_named(module, "memref.copy"):
            src, dst = op.operands[0], op.operands[1]
            if self.only_strided and identity_layout(src.type) and identity_layout(dst.type):
                continue
            with ir.InsertionPoint(op), op.location:
                linalg.copy(src, outs=[dst])
            op.erase()
