"""Which buffers an op may write, for the cpu stages that move a read later (`transposed_reads`: the
kernel reads a transpose's source at the matmul; `implicit_conv`: it reads the convolution's input at the
call instead of at the patch copies). Conservative: any use of a buffer but a known read may write it."""

from __future__ import annotations

from mlir import ir

from pbsdk.core.passes import defining_op, user_op

#: Ops whose result views (aliases) their first operand's buffer.
_VIEWS = frozenset({"memref.subview", "memref.collapse_shape", "memref.expand_shape", "memref.cast",
                    "memref.reinterpret_cast", "memref.transpose", "memref.view"})


def aliases(value: ir.Value) -> list[ir.Value]:
    """Every value that may view ``value``'s buffer: walked down through view ops to the root, then up
    through every view of it."""
    root = value
    while (op := defining_op(root)) is not None and op.name in _VIEWS:
        root = op.operands[0]
    found, todo = [root], [root]
    while todo:
        v = todo.pop()
        for use in v.uses:
            op = user_op(use)
            if op.name in _VIEWS and use.operand_number == 0:
                found.extend(op.results)
                todo.extend(op.results)
    return found


#: Ops that only read a buffer operand.
_READS = frozenset({"memref.load", "memref.dim", "memref.prefetch"}) | _VIEWS


def reads_only(op: ir.Operation, values: list[ir.Value]) -> bool:
    """Whether ``op`` reads, and never writes, each of ``values`` it has as an operand: a view or a load,
    the source of a copy, or a linalg op that has them as inputs only (its inits come after its inputs)."""
    positions = [i for i, v in enumerate(op.operands) if any(v == w for w in values)]
    if not positions or op.name in _READS:
        return True
    if op.name == "memref.copy":  # (source, target)
        return all(i == 0 for i in positions)
    if op.name.startswith("linalg.") and "operandSegmentSizes" in op.attributes:
        inputs = ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])[0]
        return all(i < inputs for i in positions)
    return False


def may_write(op: ir.Operation, values: list[ir.Value]) -> bool:
    """Whether ``op`` or an op nested in it may write one of ``values`` (any use but a known read may)."""
    hit = False

    def visit(inner: ir.Operation) -> ir.WalkResult:
        nonlocal hit
        if not reads_only(inner, values):
            hit = True
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return hit
