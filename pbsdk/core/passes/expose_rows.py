"""Pass ``expose-rows``: give ``fuse-rows`` rows to split where a batch of one hides them.

``fuse-rows`` splits an op over the cores along its leading dimension. At batch 1 that dimension is 1 for
every op of a CNN between its kernels — the transposes to and from NHWC, the copy of an image into its
padded buffer, a fill — so each ran on one core while the kernels around it ran on all. And a copy into a
strided view (the interior of a padded buffer) stays a ``memref.copy`` until the lowering, which
``fuse-rows`` does not touch. In the entry functions (not pbsdk's kernels), this pass

- drops a ``linalg.generic``'s first loop while its extent is 1 (and another loop is left): every operand
  indexed by it is viewed without that (unit) dimension, the indexing maps lose it (`drop_first_loop`);
- rebuilds ``linalg.copy``, ``linalg.fill``, ``linalg.map`` (without ``linalg.index``) and ``memref.copy``
  on views whose leading unit dimensions are collapsed into the next one (`leading_units`); and
- turns every ``memref.copy`` that is not a plain memcpy (a strided side) into ``linalg.copy``, and every
  ``linalg.transpose`` into the ``linalg.generic`` it stands for (then without its unit loops).

On one thread (the ``threads`` option, or a spec with one core) the pass does nothing: there is nothing to
split, and the runs ``fuse-rows`` then forms of these ops ran 1-3 % slower on mobilenet_v3_small at batch 1.
The ops compute the same values on the same buffers; only their shapes change. (Upstream
``linalg-fold-unit-extent-dims`` does the first for generics, but views a strided operand whose remaining
dimensions are contiguous with an identity layout, which ``memref.collapse_shape`` refuses.)
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence
from typing import Any

from mlir import ir
from mlir.dialects import linalg, memref

from pbsdk.core.ir.builder import buffer_generic, collapsed_type, reassociation
from pbsdk.core.passes import identity_layout, ops_named

_REBUILT = ("memref.copy", "linalg.copy", "linalg.fill", "linalg.map")


def leading_units(shapes: Sequence[Sequence[int]]) -> int:
    """How many leading dimensions of size 1 every shape has, leaving at least one dimension (pure)."""
    if not shapes:
        return 0
    rank = min(len(s) for s in shapes)
    k = 0
    while k < rank - 1 and all(s[k] == 1 for s in shapes):
        k += 1
    return k


_D0 = re.compile(r"\bd0\b")


def _collapse_groups(v: ir.Value, groups: list[list[int]]) -> ir.Value:
    return memref.CollapseShapeOp(collapsed_type(ir.MemRefType(v.type), groups), v, reassociation(groups)).result


def _collapse(v: ir.Value, k: int) -> ir.Value:
    rank = ir.MemRefType(v.type).rank
    return _collapse_groups(v, [list(range(k + 1))] + [[d] for d in range(k + 1, rank)])


def drop_first_loop(op: ir.Operation) -> ir.Operation | None:
    """Rebuild the ``linalg.generic`` ``op`` without its first loop when that loop's extent is 1 (known from
    an operand indexed by ``d0`` alone), another loop is left, and every operand uses ``d0`` only as a whole
    index of a dimension: the new op (``op`` is erased), or None where it does not apply."""
    its = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if len(its) < 2 or any(inner.operation.name == "linalg.index" for inner in op.regions[0].blocks[0].operations):
        return None
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    at: list[int | None] = []
    for v, m in zip(op.operands, maps):
        results = [str(r) for r in m.results]
        bare = [p for p, r in enumerate(results) if r == "d0"]
        if sum(bool(_D0.search(r)) for r in results) != len(bare) or len(bare) > 1:
            return None
        if bare:
            t = v.type
            if not isinstance(t, ir.MemRefType) or not ir.MemRefType(t).has_static_shape:
                return None
            if ir.MemRefType(t).shape[bare[0]] != 1 or ir.MemRefType(t).rank < 2:
                return None
        at.append(bare[0] if bare else None)
    if all(p is None for p in at):
        return None
    n = len(its)
    shift = ir.AffineMap.get(n - 1, 0, [ir.AffineConstantExpr.get(0)] +
                             [ir.AffineDimExpr.get(k) for k in range(n - 1)])
    new_maps: list[ir.Attribute] = []
    views: list[ir.Value] = []
    with ir.InsertionPoint(op), op.location:
        for v, m, p in zip(op.operands, maps, at):
            results = [r.compose(shift) for q, r in enumerate(m.results) if q != p]
            new_maps.append(ir.AffineMapAttr.get(ir.AffineMap.get(n - 1, 0, results)))
            if p is None:
                views.append(v)
                continue
            rank = ir.MemRefType(v.type).rank
            merged = [p, p + 1] if p + 1 < rank else [p - 1, p]
            groups = [[d] for d in range(merged[0])] + [merged] + [[d] for d in range(merged[1] + 1, rank)]
            views.append(_collapse_groups(v, groups))
        clone = op.clone()
    for i, v in enumerate(views):
        clone.operands[i] = v
    clone.attributes["indexing_maps"] = ir.ArrayAttr.get(new_maps)
    kinds = ["parallel" if "parallel" in i else "reduction" for i in its[1:]]
    clone.attributes["iterator_types"] = ir.AttrBuilder.get("IteratorTypeArrayAttr")(kinds, clone.context)
    op.erase()
    return clone


def transpose_as_generic(op: ir.Operation) -> ir.Operation:
    """The ``linalg.generic`` a ``linalg.transpose`` on buffers stands for (result dimension ``i`` is input
    dimension ``permutation[i]``), replacing it."""
    perm = list(ir.DenseI64ArrayAttr(op.attributes["permutation"]))
    n = len(perm)
    in_map = ir.AffineMap.get(n, 0, [ir.AffineDimExpr.get(perm.index(q)) for q in range(n)])
    with ir.InsertionPoint(op), op.location:
        new = buffer_generic([(op.operands[0], ir.AffineMapAttr.get(in_map))],
                             [(op.operands[1], ir.AffineMapAttr.get(ir.AffineMap.get_identity(n)))],
                             ["parallel"] * n, lambda args: [args[0]])
    op.erase()
    return new.operation


@dataclasses.dataclass(frozen=True)
class ExposeRows:
    name = "expose-rows"
    #: False: the pass does nothing (the cpu target sets it from its options ``expose_rows`` and
    #: ``fuse_rows``: the rows exposed are for ``fuse-rows``).
    enabled: bool = True

    def apply(self, module: ir.Module, ctx: Any = None) -> None:
        if not self.enabled:
            return
        if ctx is not None:
            threads = ctx.options.threads or ctx.spec.compute[0].count
            if threads < 2:
                return  # nothing to split on one core (and fuse-rows' runs of these ops gain nothing there)
        for fn in ops_named(module, "func.func"):
            if not len(fn.regions[0].blocks) or ir.StringAttr(fn.attributes["sym_name"]).value.startswith("__pbsdk"):
                continue
            with module.context, ir.Location.unknown():
                for o in list(fn.regions[0].blocks[0].operations):
                    op = o.operation
                    if op.name in _REBUILT:
                        self._rebuild(op)
                        continue
                    if op.name == "linalg.transpose":
                        op = transpose_as_generic(op)
                    if op.name == "linalg.generic":
                        while (rebuilt := drop_first_loop(op)) is not None:
                            op = rebuilt

    @staticmethod
    def _rebuild(op: ir.Operation) -> None:
        mems = [v for v in op.operands if isinstance(v.type, ir.MemRefType)]
        if not mems or any(not ir.MemRefType(v.type).has_static_shape for v in mems):
            return
        if op.name == "linalg.map" and any(inner.operation.name == "linalg.index"
                                           for inner in op.regions[0].blocks[0].operations):
            return
        k = leading_units([ir.MemRefType(v.type).shape for v in mems])
        if op.name == "memref.copy" and all(identity_layout(v.type) for v in mems):
            return  # a memcpy stays one (it needs no rows)
        if k == 0 and op.name != "memref.copy":
            return
        with ir.InsertionPoint(op), op.location:
            views = {i: _collapse(v, k) if k else v for i, v in enumerate(op.operands)
                     if isinstance(v.type, ir.MemRefType)}
            if op.name in ("memref.copy", "linalg.copy"):  # (source, destination) either way
                linalg.copy(views[0], outs=[views[1]])
            elif op.name == "linalg.fill":
                linalg.fill(op.operands[0], outs=[views[1]])
            else:
                clone = op.clone()
                for i, v in views.items():
                    clone.operands[i] = v
        op.erase()

