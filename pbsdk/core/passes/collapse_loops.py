"""Pass ``collapse-loops``: merge adjacent loops of one kind that every operand walks contiguously.

An elementwise ``linalg.generic`` on NCHW buffers loops over (n, c, h, w); lowered as it is, the innermost
loop is one image row — 14 or 7 values in a late CNN layer — which the host compiler unrolls instead of
vectorising. When every operand either indexes two adjacent loops ``d_j, d_j+1`` at adjacent positions of
a buffer that is contiguous across them, or indexes neither (a per-channel BatchNorm scale reads only
``c``), the two loops are one loop over ``extent_j * extent_j+1`` values: the op is rebuilt on collapsed
views (``memref.collapse_shape``) of its operands with the merged loops, repeatedly, so a BatchNorm +
hardswish over 240x14x14 runs over rows of 196 values, and an op whose every operand is the whole buffer
over one loop. Two adjacent reduction loops merge the same way (a global average pool's 7x7 window is
one reduction over 49 values); a parallel loop never merges with a reduction. The body is unchanged; an
op that reads its loop indices (``linalg.index``) is left alone. The analysis (`collapsible_groups`) is
pure.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mlir import ir
from mlir.dialects import memref

from pbsdk.core.ir.builder import collapsed_type, reassociation
from pbsdk.core.passes import iterator_kinds, map_dims, ops_named

#: One operand as the analysis sees it: per buffer dimension, the loop it is indexed by (None: a constant
#: index, i.e. a broadcast dimension of size 1), its sizes and strides.
Operand = tuple[tuple[int | None, ...], tuple[int, ...], tuple[int, ...]]


def collapsible_groups(iterators: Sequence[str], operands: Sequence[Operand]) -> list[list[int]]:
    """The loops of a structured op (``iterators``: "parallel" or "reduction" per loop) in groups of adjacent
    loops that can run as one (module docstring): loops ``j`` and ``j + 1`` share a group when they are of
    one kind and every operand indexes both, ``j + 1`` right after ``j``, at buffer dimensions whose strides
    make them one run (``stride[p] == size[p + 1] * stride[p + 1]``), or indexes neither."""
    n_loops = len(iterators)

    def joinable(j: int) -> bool:
        if iterators[j] != iterators[j + 1]:
            return False
        for loops, sizes, strides in operands:
            if j not in loops and j + 1 not in loops:
                continue
            if j not in loops or j + 1 not in loops:
                return False
            p = loops.index(j)
            if p + 1 >= len(loops) or loops[p + 1] != j + 1 or strides[p] != sizes[p + 1] * strides[p + 1]:
                return False
        return True

    groups: list[list[int]] = [[0]] if n_loops else []
    for j in range(n_loops - 1):
        if joinable(j):
            groups[-1].append(j + 1)
        else:
            groups.append([j + 1])
    return groups


def _operand(v: ir.Value, amap: ir.AffineMap) -> Operand | None:
    if not isinstance(v.type, ir.MemRefType):
        return ((), (), ()) if not amap.results else None  # a scalar (a fill value)
    t = ir.MemRefType(v.type)
    if not t.has_static_shape:
        return None
    strides, _ = t.get_strides_and_offset()
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    if any(s == dyn for s in strides):
        return None
    loops = map_dims(amap)
    if loops is None:
        return None
    named = [j for j in loops if j is not None]
    if len(set(named)) != len(named):
        return None  # a loop indexing two dimensions (a diagonal)
    return tuple(loops), tuple(t.shape), tuple(strides)


@dataclasses.dataclass(frozen=True)
class CollapseLoops:
    """Rebuild every ``linalg.generic`` on static buffers whose adjacent loops can run as one
    (`collapsible_groups`) on collapsed views, with fewer, longer loops."""

    name = "collapse-loops"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        with module.context, ir.Location.unknown():
            for op in ops_named(module, "linalg.generic"):
                self._collapse(op)

    @staticmethod
    def _collapse(op: ir.Operation) -> None:
        kinds = iterator_kinds(op)
        if not kinds or "?" in kinds:
            return
        if any(inner.operation.name == "linalg.index" for inner in op.regions[0].blocks[0].operations):
            return
        maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        found = [_operand(v, m) for v, m in zip(op.operands, maps)]
        if any(f is None for f in found):
            return
        operands = [f for f in found if f is not None]
        groups = collapsible_groups(kinds, operands)
        if len(groups) == len(kinds):
            return
        loop_group = {j: g for g, members in enumerate(groups) for j in members}
        new_maps: list[ir.Attribute] = []
        with ir.InsertionPoint(op):
            views: list[ir.Value] = []
            for v, (loops, _, _) in zip(op.operands, operands):
                results: list[ir.AffineExpr] = []
                reassoc: list[list[int]] = []
                p = 0
                while p < len(loops):
                    j = loops[p]
                    if j is None:
                        results.append(ir.AffineConstantExpr.get(0))
                        reassoc.append([p])
                        p += 1
                        continue
                    size = len(groups[loop_group[j]])
                    results.append(ir.AffineDimExpr.get(loop_group[j]))
                    reassoc.append(list(range(p, p + size)))
                    p += size
                new_maps.append(ir.AffineMapAttr.get(ir.AffineMap.get(len(groups), 0, results)))
                if isinstance(v.type, ir.MemRefType) and len(reassoc) < len(loops):
                    t = ir.MemRefType(v.type)
                    views.append(memref.CollapseShapeOp(collapsed_type(t, reassoc), v, reassociation(reassoc)).result)
                else:
                    views.append(v)
            clone = op.clone()
        for i, v in enumerate(views):
            clone.operands[i] = v
        clone.attributes["indexing_maps"] = ir.ArrayAttr.get(new_maps)
        # linalg.GenericOp's own attribute builder (registered by mlir.dialects.linalg)
        clone.attributes["iterator_types"] = ir.AttrBuilder.get("IteratorTypeArrayAttr")(
            [kinds[g[0]] for g in groups], clone.context)
        op.erase()
