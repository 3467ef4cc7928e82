"""A test pbsdk target plugin: the template target with its own matrix-unit and DMA hooks.

It is what a third-party chip team writes when it replaces hooks: it knows the hook contract
(`pbsdk.core.hooks`) and the MLIR Python bindings, and nothing about pbsdk's SSA names or
text formats. Its two hooks build IR where pbsdk asks them to:

- ``matrix_unit_op``: one unit instruction as its own ``scf.for`` loop nest over scalar loads and stores,
  in another loop order than the emulation's (reduction loops outermost, then the parallel loops from
  the last to the first), reading the operands through the op's indexing maps (so transposed B and
  broadcast batch work), rounding like the unit; one count per instruction.
- ``dma_copy``: an element-by-element copy with ``scf.for`` over the tile (``memref.dim`` for dynamic
  sizes), counting each element's bytes inside the loop.

Every other hook is the template's. The counters therefore come out the same as the template's, and so
do the numbers (the k order per output element is unchanged).
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping, Sequence

from mlir import ir
from mlir.dialects import arith, memref, scf

from pbsdk.core.hooks import DmaCopy, UnitOp
from pbsdk.core.spec import ChipSpec
from pbsdk.targets.template import TemplateTarget


def _index(value: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), value)


def _loop_nest(extents: Mapping[int, ir.Value], order: Sequence[int], body: Callable[[dict[int, ir.Value]], None],
               ivs: dict[int, ir.Value] | None = None) -> None:
    """``scf.for`` loops over ``extents`` in ``order`` (outermost first), ``body(ivs)`` innermost."""
    ivs = dict(ivs or {})
    if not order:
        body(ivs)
        return
    loop = scf.ForOp(_index(0), extents[order[0]], _index(1))
    with ir.InsertionPoint(loop.body):
        _loop_nest(extents, order[1:], body, {**ivs, order[0]: loop.induction_variable})
        scf.YieldOp([])


def _indices(amap: ir.AffineMap, ivs: Mapping[int, ir.Value]) -> list[ir.Value]:
    """The operand's indices at loop position ``ivs``: each map result is a loop dimension or a constant."""
    out = []
    for expr in amap.results:
        if isinstance(expr, ir.AffineDimExpr):
            out.append(ivs[expr.position])
        elif isinstance(expr, ir.AffineConstantExpr):
            out.append(_index(expr.value))
        else:
            raise NotImplementedError(f"indexing map result {expr} is neither a dimension nor a constant")
    return out


def matrix_unit_op(op: UnitOp, a: ir.Value, b: ir.Value, c: ir.Value, spec: ChipSpec) -> None:
    operands = (a, b, c)
    # Each loop's extent from an operand dimension it indexes (the unit's tiles are static).
    extents: dict[int, ir.Value] = {}
    for value, amap in zip(operands, op.indexing_maps):
        shape = ir.MemRefType(value.type).shape
        for pos, expr in enumerate(amap.results):
            if isinstance(expr, ir.AffineDimExpr) and expr.position not in extents:
                extents[expr.position] = _index(shape[pos])
    reductions = [d for d, it in enumerate(op.iterator_types) if it == "reduction"]
    parallels = [d for d, it in enumerate(op.iterator_types) if it == "parallel"]

    def mac(ivs: dict[int, ir.Value]) -> None:
        x, y, z = (memref.load(v, _indices(m, ivs)) for v, m in zip(operands, op.indexing_maps))
        memref.store(op.multiply_accumulate(x, y, z), c, _indices(op.indexing_maps[2], ivs))

    _loop_nest(extents, reductions + parallels[::-1], mac)
    op.count()


def dma_copy(copy: DmaCopy, src: ir.Value, dst: ir.Value, spec: ChipSpec) -> None:
    rank = len(copy.shape)
    extents = {i: _index(d) if d is not None else memref.dim(src, _index(i)) for i, d in enumerate(copy.shape)}
    et = copy.element_type
    element_bytes = max(1, (et.width + 7) // 8) if isinstance(et, ir.FloatType | ir.IntegerType) else 8

    def move(ivs: dict[int, ir.Value]) -> None:
        at = [ivs[i] for i in range(rank)]
        memref.store(memref.load(src, at), dst, at)
        copy.count_bytes(element_bytes)

    _loop_nest(extents, list(range(rank)), move)


class LoopHooksTarget(TemplateTarget):
    """The template's emulated chip with the matrix-unit and DMA hooks above."""

    name = "loophooks"
    description = "test plugin: template target with its own scf matrix-unit and element-wise DMA hooks"
    hooks = types.SimpleNamespace(matrix_unit_op=matrix_unit_op, dma_copy=dma_copy)
