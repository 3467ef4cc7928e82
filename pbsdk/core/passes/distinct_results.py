"""Pass ``distinct-results``: give every returned buffer its own allocation.

After bufferization a function can return one buffer twice (CSE merged ``x * s`` and ``s * x``), and
upstream ``buffer-results-to-out-params{hoist-static-allocs}`` crashes on that. Each repeated result is
copied into a fresh buffer first, so each output parameter is written exactly once.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import memref

from pbsdk.core.passes import ops_named


@dataclasses.dataclass(frozen=True)
class DistinctResults:
    name = "distinct-results"

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        for ret in ops_named(module, "func.return"):
            seen: set[Any] = set()
            for i, value in enumerate(list(ret.operands)):
                key = value  # Values hash and compare by the SSA value they name
                if key in seen and isinstance(value.type, ir.MemRefType):
                    with ir.InsertionPoint(ret), ret.location:
                        fresh = memref.alloc(value.type, [], [])
                        memref.copy(value, fresh)
                    ret.operands[i] = fresh
                seen.add(key)
