"""pbsdk's own passes: one per file, each a small frozen object whose fields are its options."""

from __future__ import annotations

from mlir import ir


def ops_named(root: ir.Module, name: str) -> list[ir.Operation]:
    """Every op called ``name`` under ``root``, in walk order (collected first, so callers may rewrite)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    root.operation.walk(visit)
    return found
