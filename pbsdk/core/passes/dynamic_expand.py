"""Pass ``dynamic-expand``: a ``memref.expand_shape`` that splits one dimension into several sizes known only
at run time, as the ``memref.reinterpret_cast`` it stands for.

A batch of sequences flattened for a matmul (``(b*s, 64)``) is viewed back as ``(b, s, 64)`` by an
``expand_shape`` whose group ``[0, 1]`` has two dynamic sizes. The op is valid (its ``output_shape`` gives
every size), but upstream ``expand-strided-metadata`` takes at most one dynamic size per group (it asserts
otherwise). This pass rewrites each such view before it: the source's base, offset and strides
(``memref.extract_strided_metadata``), and the expanded strides computed from the output sizes, innermost
first (the last dimension of a group keeps its source dimension's stride, each outer one is the next one's
stride times its size). Views of at most one dynamic size per group are left to upstream.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import arith, memref

from pbsdk.core.passes import ops_named


def _groups(op: ir.Operation) -> list[list[int]]:
    return [[ir.IntegerAttr(d).value for d in ir.ArrayAttr(g)] for g in ir.ArrayAttr(op.attributes["reassociation"])]


def _needs_rewrite(op: ir.Operation) -> bool:
    t = ir.MemRefType(op.results[0].type)
    dyn = ir.ShapedType.get_dynamic_size()
    return any(sum(t.shape[d] == dyn for d in g) > 1 for g in _groups(op))


def _value(v: ir.Value | int) -> ir.Value:
    return v if isinstance(v, ir.Value) else arith.constant(ir.IndexType.get(), v)


def _rewrite(op: ir.Operation) -> None:
    """``op`` (a memref.expand_shape) replaced by a reinterpret_cast of its source's base buffer."""
    result_t = ir.MemRefType(op.results[0].type)
    dyn = ir.ShapedType.get_dynamic_size()
    dyn_stride = ir.ShapedType.get_dynamic_stride_or_offset()
    src = op.operands[0]
    with ir.InsertionPoint(op), op.location:
        meta = memref.ExtractStridedMetadataOp(src)
        src_strides = list(meta.strides)
        # the output sizes: static ones from the type, dynamic ones from the op's output_shape operands
        dynamic_sizes = iter(list(op.operands)[1:])
        sizes: list[ir.Value | int] = [next(dynamic_sizes) if n == dyn else n for n in result_t.shape]
        strides: list[ir.Value | int] = [0] * result_t.rank
        for d, group in enumerate(_groups(op)):
            running: ir.Value | int = src_strides[d]
            for o in reversed(group):
                strides[o] = running
                if o == group[0]:
                    break  # the group's outermost dimension: no stride outside it
                size = sizes[o]
                if isinstance(running, int) and isinstance(size, int):
                    running = running * size
                else:
                    running = arith.muli(_value(running), _value(size))
        want_strides, want_offset = result_t.get_strides_and_offset()
        offset_static = want_offset if not result_t.is_dynamic_stride_or_offset(want_offset) else dyn_stride
        static_strides = [s if not result_t.is_dynamic_stride_or_offset(s) else dyn_stride for s in want_strides]
        cast = memref.reinterpret_cast(
            result_t, meta.base_buffer, [meta.offset] if offset_static == dyn_stride else [],
            [s for s in sizes if isinstance(s, ir.Value)],
            [_value(s) for s, w in zip(strides, static_strides) if w == dyn_stride],
            [offset_static], [dyn if isinstance(s, ir.Value) else s for s in sizes], static_strides)
    op.results[0].replace_all_uses_with(cast)
    op.erase()


@dataclasses.dataclass(frozen=True)
class DynamicExpand:
    """Views splitting a dimension into several run-time sizes as reinterpret_casts (module docstring)."""

    name = "dynamic-expand"

    def apply(self, module: ir.Module, ctx: Any = None) -> None:
        with module.context, ir.Location.unknown():
            for op in ops_named(module, "memref.expand_shape"):
                if _needs_rewrite(op):
                    _rewrite(op)
