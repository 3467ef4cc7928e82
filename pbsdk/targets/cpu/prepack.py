"""Constant B operands packed at compile time, for ``pack-contractions``.

A frozen weight reaches the entry function as an argument marked ``pbsdk.constant = i`` whose array is
``ctx.constants[i]`` (`pbsdk.core.ir.emit`). When such an argument is the B operand of exactly one packed
contraction — directly, or through the ``memref.collapse_shape`` that views a convolution's weights
``(KH, KW, C, O)`` as a ``(KH*KW*C, O)`` matrix — its array can be packed once, here, into the micro-panels
the kernel reads (`pack_b_panels`), instead of on every call and, with the rows split over threads, by
every thread. The constant is replaced (same index, the packed array; the argument takes the packed type),
so no weight is held twice by the artifact.

A product computed transposed (``C^T = B^T A^T``, `pbsdk.core.plan.contraction.orientation`) packs its
given A as the kernel's B, through register transposes on every call; a constant A is packed here
instead, as the panels of A^T (``rebind(..., transposed=True)``).

`find_constant` is the analysis (which constant, through which view, used by nothing else); `rebind` the
rewrite. A contraction function called from several places (`dedupe-functions` merges identical layers)
takes a packed B only when every call passes one: the caller checks that with `find_constant` on each.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np
from mlir import ir

from pbsdk.core.ir import attributes
from pbsdk.core.passes import defining_op, identity_layout, match_signature, user_op
from pbsdk.targets.cpu.matmul_kernel import pack_b_panels, packed_b_shape


@dataclasses.dataclass(frozen=True)
class ConstantB:
    """The entry argument ``arg`` (position ``position`` of ``entry``, constant ``index``) that reaches
    ``user`` (its only use) as a k x n matrix: directly, or through ``view`` (a collapse_shape whose only
    use is ``user``)."""

    entry: ir.Operation
    position: int
    index: int
    arg: ir.Value
    view: ir.Operation | None


def function_of(arg: ir.Value) -> ir.Operation | None:
    """The ``func.func`` whose entry block has the block argument ``arg``, or None (not a block argument)."""
    block = arg.owner
    if not isinstance(block, ir.Block):
        return None
    fn = block.owner if isinstance(block.owner, ir.Operation) else block.owner.operation
    return fn if fn.name == "func.func" else None


def _only_use(v: ir.Value) -> ir.Operation | None:
    uses = list(v.uses)
    return user_op(uses[0]) if len(uses) == 1 else None


def find_constant(value: ir.Value, user: ir.Operation, available: int) -> ConstantB | None:
    """The constant operand ``value`` is, if it is one that only ``user`` reads (see `ConstantB`) and one
    of the ``available`` constants whose arrays the compilation holds."""
    view = None
    use = _only_use(value)
    if use is None or use != user:
        return None
    source = value
    op = defining_op(value)
    if op is not None:
        if op.name != "memref.collapse_shape":
            return None
        view, source = op, op.operands[0]
        use = _only_use(source)
        if use is None or use != view:
            return None
    if not isinstance(source.owner, ir.Block):
        return None
    arg = ir.BlockArgument(source)
    entry = function_of(arg)
    if entry is None:
        return None
    index = attributes.arg_i64(entry, arg.arg_number, attributes.CONSTANT)
    if index is None or index >= available:
        return None
    if len(ir.MemRefType(value.type).shape) != 2 or not identity_layout(value.type):
        return None
    return ConstantB(entry, arg.arg_number, index, arg, view)


def set_argument_type(fn: ir.Operation, position: int, t: ir.Type) -> None:
    """Give argument ``position`` of ``fn`` (a ``func.func``) the type ``t``: block argument and signature."""
    fn.regions[0].blocks[0].arguments[position].set_type(t)
    match_signature(fn)


def packed_type(t: ir.MemRefType, nr: int, *, transposed: bool = False) -> ir.MemRefType:
    """The memref type of the k x n matrix ``t`` packed for register tiles ``nr`` wide; with
    ``transposed``, ``t`` is n x k and the packed matrix its transpose (a product computed transposed
    packs its given A as B^T)."""
    k, n = t.shape[::-1] if transposed else t.shape
    return ir.MemRefType.get(list(packed_b_shape(k, n, nr)), t.element_type, loc=ir.Location.unknown(t.context))


#: A packing of a constant k x n matrix at compile time, and the memref type of its result: what `rebind`
#: applies instead of the FMA kernel's panels (`pack_b_panels` for ``nr``) when given.
Packing = tuple[Callable[[np.ndarray], np.ndarray], ir.MemRefType]


def rebind(found: ConstantB, user: ir.Operation, operand: int, nr: int, ctx: Any, *,
           transposed: bool = False, packing: Packing | None = None) -> ir.Value:
    """Pack constant ``found.index`` for ``nr`` (in ``ctx.constants``; with ``transposed`` the matrix is
    n x k and its transpose is packed; with ``packing``, by its function into its type), give its entry
    argument the packed type and make it ``user``'s operand ``operand`` (the view goes). Returns the
    argument."""
    value = user.operands[operand]
    t = ir.MemRefType(value.type)
    rows, cols = t.shape
    matrix = ctx.constants[found.index].reshape(rows, cols)
    matrix = matrix.T if transposed else matrix
    constants = list(ctx.constants)
    constants[found.index] = packing[0](matrix) if packing else pack_b_panels(matrix, nr)
    ctx.constants = tuple(constants)
    set_argument_type(found.entry, found.position,
                      packing[1] if packing else packed_type(t, nr, transposed=transposed))
    user.operands[operand] = found.arg
    if found.view is not None:
        found.view.erase()
    return found.arg
