"""Pass ``expose-rows``: give ``fuse-rows`` rows to split where a batch of one hides them.

``fuse-rows`` splits an op over the cores along its leading dimension. At batch 1 that dimension is 1 for
every op of a CNN between its kernels — the transposes to and from NHWC, the copy of an image into its
padded buffer, a fill — so each ran on one core while the kernels around it ran on all. And a copy into a
strided view (the interior of a padded buffer) stays a ``memref.copy`` until the lowering, which
``fuse-rows`` does not touch. In the entry functions (not pbsdk's kernels), this pass

- runs upstream ``linalg-fold-unit-extent-dims`` on the ``linalg.generic`` ops, which drops their unit
  loops and views their operands without the unit dimensions;
- rebuilds ``linalg.copy``, ``linalg.fill``, ``linalg.map`` (without ``linalg.index``) and ``memref.copy``
  on views whose leading unit dimensions are collapsed into the next one (`leading_units`); and
- turns every ``memref.copy`` that is not a plain memcpy (a strided side) into ``linalg.copy``.

The ops compute the same values on the same buffers; only their shapes change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mlir import ir, passmanager
from mlir.dialects import linalg, memref

from pbsdk.core.ir.builder import reassociation
from pbsdk.core.passes import identity_layout, ops_named
from pbsdk.core.passes.collapse_loops import _collapsed_type

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


def _collapse(v: ir.Value, k: int) -> ir.Value:
    t = ir.MemRefType(v.type)
    groups = [list(range(k + 1))] + [[d] for d in range(k + 1, t.rank)]
    return memref.CollapseShapeOp(_collapsed_type(t, groups), v, reassociation(groups)).result


@dataclasses.dataclass(frozen=True)
class ExposeRows:
    name = "expose-rows"

    def apply(self, module: ir.Module, ctx: Any = None) -> None:
        if ctx is not None and not (ctx.options.expose_rows and ctx.options.fuse_rows):
            return
        fold = passmanager.PassManager.parse("func.func(linalg-fold-unit-extent-dims)", module.context)
        for fn in ops_named(module, "func.func"):
            if not len(fn.regions[0].blocks) or ir.StringAttr(fn.attributes["sym_name"]).value.startswith("__pbsdk"):
                continue
            fold.run(fn)
            with module.context, ir.Location.unknown():
                for o in list(fn.regions[0].blocks[0].operations):
                    if o.operation.name in _REBUILT:
                        self._rebuild(o.operation)

    @staticmethod
    def _rebuild(op: ir.Operation) -> None:
        mems = [v for v in op.operands if isinstance(v.type, ir.MemRefType)]
        if not mems or any(not ir.MemRefType(v.type).has_static_shape for v in mems):
            return
        if op.name == "linalg.map" and any(inner.operation.name == "linalg.index"
                                           for inner in op.regions[0].blocks[0].operations):
            return
        k = leading_units([ir.MemRefType(v.type).shape for v in mems])
        plain = op.name == "memref.copy" and all(identity_layout(v.type) for v in mems)
        if k == 0 and (op.name != "memref.copy" or plain):
            return
        if plain and k:
            return  # a memcpy stays one (it needs no rows)
        with ir.InsertionPoint(op), op.location:
            views = {i: _collapse(v, k) if k else v for i, v in enumerate(op.operands)
                     if isinstance(v.type, ir.MemRefType)}
            if op.name in ("memref.copy", "linalg.copy"):
                src, dst = (op.operands[0], op.operands[1]) if op.name == "memref.copy" else \
                    (op.operands[0], op.operands[-1])
                linalg.copy(views[_index(op, src)], outs=[views[_index(op, dst)]])
            elif op.name == "linalg.fill":
                linalg.fill(op.operands[0], outs=[views[1]])
            else:
                clone = op.clone()
                for i, v in views.items():
                    clone.operands[i] = v
        op.erase()


def _index(op: ir.Operation, v: ir.Value) -> int:
    return next(i for i, o in enumerate(op.operands) if o == v)
