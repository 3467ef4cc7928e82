"""Operands that a transpose fills just for a packed matmul, for ``pack-contractions``.

``x @ w.T`` with a ``w`` that is not a constant (an activation, a weight passed as an input, ``q @ k^T``
outside a fused attention) reaches the cpu target as a ``linalg.transpose`` of ``w`` into a temporary
buffer, which the isolated contraction then reads as its ``[k, n]`` B (the core emits row-major operands
for every target; `pbsdk.core.ir.emit` folds only a constant's transpose at compile time). The packed
kernel packs B anyway, and it can pack a B stored ``[n, k]`` through register transposes
(`MatmulShape.b_layout`, likewise an A stored ``[k, m]``), so the transpose is a pass over ``w`` and a
temporary for nothing: 9 % of a 512x768x3072 product.

`transposed_operand` finds such an operand: the matmul's operand is a buffer (``memref.alloc``) that one
``linalg.transpose`` swapping its last two dimensions fills and nothing else reads (but deallocations;
the matmul may read it through a ``memref.collapse_shape`` of its batch dimensions) — in the matmul's own
function, or, for a matmul on an argument of its isolated function, at every call
of that function. `read_source` then passes the transpose's source instead and deletes the transpose and
its buffer; the kernel reads the source with the swapped layout.

Reading the source at the matmul instead of at the transpose is only right while nothing writes it in
between: any op between the two that may write the source or a view of the same buffer keeps the
transpose (known reads: loads, views, and linalg ops that take it as an input only; a call may write), and
so does a product that may write it itself (an output sharing the source's buffer).
"""

from __future__ import annotations

import dataclasses
import math

from mlir import ir
from mlir.dialects import memref

from pbsdk.core.ir.builder import reassociation_groups
from pbsdk.core.passes import defining_op, identity_layout, user_op
from pbsdk.targets.cpu.aliasing import aliases, may_write, reads_only
from pbsdk.targets.cpu.prepack import function_of


@dataclasses.dataclass(frozen=True)
class TransposedFeed:
    """``user`` reads, as one of its operands, the buffer ``alloc`` that ``transpose`` fills from
    ``source`` (its last two dimensions swapped) and that nothing else uses but ``deallocs`` — directly,
    or through ``view``, a ``memref.collapse_shape`` of its leading (batch) dimensions."""

    user: ir.Operation
    transpose: ir.Operation
    alloc: ir.Operation
    deallocs: tuple[ir.Operation, ...]
    source: ir.Value
    view: ir.Operation | None = None

    @property
    def read_type(self) -> ir.MemRefType:
        """The type of what the user reads instead: the source, or the same collapse of its contiguous
        buffer."""
        t = ir.MemRefType(self.source.type)
        if self.view is None:
            return t
        groups = reassociation_groups(self.view)
        shape = [math.prod(t.shape[d] for d in g) for g in groups]
        return ir.MemRefType.get(shape, t.element_type, memory_space=t.memory_space, loc=self.view.location)


def _swaps_last_two(transpose: ir.Operation) -> bool:
    perm = list(ir.DenseI64ArrayAttr(transpose.attributes["permutation"]))
    r = len(perm)
    return r >= 2 and perm == [*range(r - 2), r - 1, r - 2]


def _batch_collapse(op: ir.Operation | None, user: ir.Operation) -> bool:
    """Whether ``op`` is a ``memref.collapse_shape`` of leading dimensions only (the last two kept as they
    are) that only ``user`` reads, in ``user``'s block."""
    if op is None or op.name != "memref.collapse_shape" or op.block != user.block:
        return False
    groups = reassociation_groups(op)
    rank = sum(len(g) for g in groups)
    return (len(groups) >= 2 and groups[-2:] == [[rank - 2], [rank - 1]]
            and all(user_op(u) == user for u in op.results[0].uses))


def find_transposed(value: ir.Value, user: ir.Operation, operand: int, callee: ir.Operation | None = None
                    ) -> TransposedFeed | None:
    """The `TransposedFeed` that ``value`` (operand ``operand`` of ``user``; of a call, ``callee`` the function
    it calls) is, or None."""
    view = defining_op(value)
    if _batch_collapse(view, user):
        assert view is not None
        value = view.operands[0]
    else:
        view = None
    alloc = defining_op(value)
    if alloc is None or alloc.name != "memref.alloc" or len(alloc.operands) or alloc.block != user.block:
        return None
    transposes, deallocs = [], []
    for use in value.uses:
        op = user_op(use)
        if (op == user and use.operand_number == operand) or (view is not None and op == view):
            continue
        if op.name == "linalg.transpose" and use.operand_number == 1:
            transposes.append(op)
        elif op.name == "memref.dealloc":
            deallocs.append(op)
        else:
            return None
    read = view.results[0] if view is not None else value
    if len(transposes) != 1 or sum(1 for v in user.operands if v == read) != 1:
        return None
    (transpose,) = transposes
    source = transpose.operands[0]
    if transpose.block != user.block or not _swaps_last_two(transpose) or not isinstance(source.type, ir.MemRefType):
        return None
    strides, _ = ir.MemRefType(source.type).get_strides_and_offset()
    if strides[-1] != 1 or (view is not None and not identity_layout(source.type)):
        return None  # the kernel loads vectors along the source's rows; a collapse needs a contiguous source
    ops = [o.operation for o in user.block.operations]
    at, upto = ops.index(transpose), ops.index(user)
    if at > upto:
        return None
    buffers = aliases(source)
    if any(may_write(o, buffers) for o in ops[at + 1:upto]) or _user_may_write(user, buffers, callee):
        return None
    return TransposedFeed(user, transpose, alloc, tuple(deallocs), source, view)


def _user_may_write(user: ir.Operation, buffers: list[ir.Value], callee: ir.Operation | None) -> bool:
    """Whether ``user`` may write one of ``buffers`` (an output of the product that shares the source's
    buffer would then be written while the kernel still reads the source): for a call, whether ``callee``
    may write the arguments that take them (any call whose callee is not given may)."""
    if user.name != "func.call":
        return not reads_only(user, buffers)
    positions = [i for i, v in enumerate(user.operands) if any(v == w for w in buffers)]
    if not positions:
        return False
    if callee is None:
        return True
    args = [callee.regions[0].blocks[0].arguments[i] for i in positions]
    return any(may_write(o.operation, args) for o in callee.regions[0].blocks[0].operations)


def transposed_operand(mm: ir.Operation, operand: int, calls: dict[str, list[ir.Operation]]
                       ) -> list[TransposedFeed] | None:
    """The transposes that fill operand ``operand`` of the matmul ``mm`` (0: A, 1: B): ``[feed]`` when
    ``mm`` reads the buffer in its own function; one feed per call when ``mm`` reads an argument of its
    function (read by nothing else) and every call passes such a buffer, the sources all of one type.
    None otherwise."""
    value = mm.operands[operand]
    if defining_op(value) is not None:
        found = find_transposed(value, mm, operand)
        return [found] if found is not None else None
    fn = function_of(value)
    if fn is None or len(list(value.uses)) != 1:
        return None
    position = ir.BlockArgument(value).arg_number
    sites = calls.get(ir.StringAttr(fn.attributes["sym_name"]).value, [])
    feeds = [find_transposed(call.operands[position], call, position, fn) for call in sites]
    if not feeds or any(f is None for f in feeds):
        return None
    if len({str(f.read_type) for f in feeds if f is not None}) != 1:
        return None
    return [f for f in feeds if f is not None]


def source_type(feeds: list[TransposedFeed]) -> ir.MemRefType:
    """The type the user reads instead (the same for every feed of `transposed_operand`)."""
    return feeds[0].read_type


def read_source(feeds: list[TransposedFeed]) -> None:
    """Whatever reads a feed's transposed buffer now (the user, or the op that replaced a matmul user)
    reads its source instead; the buffer goes with its transpose and deallocations. (A function argument
    that took the buffer must take the source's type: the caller sets it.)"""
    for f in feeds:
        f.transpose.erase()
        for d in f.deallocs:
            d.erase()
        if f.view is not None:  # the same collapse of the source, where the old one was
            with ir.InsertionPoint(f.view), f.view.location:
                new = memref.CollapseShapeOp(f.read_type, f.source, f.view.attributes["reassociation"]).result
            f.view.results[0].replace_all_uses_with(new)
            f.view.erase()
        else:
            f.alloc.results[0].replace_all_uses_with(f.source)
        f.alloc.erase()
