"""Pass ``fill-borders``: a buffer filled and then overwritten in a box is filled only around the box.

A padded convolution input arrives as

    linalg.fill / linalg.map (a constant) outs(%pad)             the whole 58x58x64 buffer: zero
    %in = memref.subview %pad[0, 1, 1, 0] [1, 56, 56, 64] [1, 1, 1, 1]
    memref.copy %x, %in                                          the 56x56x64 interior: the image

which writes the interior twice. When the op that writes the box (a copy, a ``linalg.map``, a transpose, or
an all-parallel ``linalg.generic`` that does not read its output) overwrites every element of a static,
unit-stride box of the filled buffer, and nothing between the two ops touches the buffer, the fill is
replaced by fills of the box's frame (`frame`): for each dimension in turn, the slabs before and after the
box along it, within the box along the dimensions already done and whole along the later ones (at most two
per dimension; none where the box reaches the edge). A box that is the whole buffer drops the fill. The
fill value and the buffer are unchanged; only what the fill writes shrinks, by the box's size.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from mlir import ir
from mlir.dialects import linalg, memref

from pbsdk.core.passes import ancestor_in, defining_op, ops_named, user_op

#: A box of a buffer: (offsets, sizes), one entry per dimension.
Box = tuple[tuple[int, ...], tuple[int, ...]]

#: Ops that only make a view of their first operand.
_VIEWS = ("memref.subview", "memref.expand_shape", "memref.collapse_shape", "memref.cast")
#: Ops that write every element of their (single) output when it is a box of the filled buffer.
_OVERWRITES = ("memref.copy", "linalg.copy", "linalg.map", "linalg.transpose", "linalg.generic")


def frame(shape: Sequence[int], box: Box) -> list[Box]:
    """The boxes that tile ``shape`` minus ``box`` (pure): slabs before and after the box along each
    dimension in turn, limited to the box along earlier dimensions and whole along later ones."""
    offsets, sizes = box
    if len(offsets) != len(shape) or len(sizes) != len(shape):
        raise ValueError(f"box of rank {len(offsets)} in a buffer of rank {len(shape)}")
    if any(o < 0 or s < 0 or o + s > n for o, s, n in zip(offsets, sizes, shape)):
        raise ValueError(f"box {box} does not fit in {tuple(shape)}")
    slabs: list[Box] = []
    for d, n in enumerate(shape):
        inner_o, inner_s = tuple(offsets[:d]), tuple(sizes[:d])
        outer_o, outer_s = (0,) * (len(shape) - d - 1), tuple(shape[d + 1:])
        lo, hi = offsets[d], offsets[d] + sizes[d]
        for start, stop in ((0, lo), (hi, n)):
            if stop > start and all(inner_s) and all(outer_s):
                slabs.append((inner_o + (start,) + outer_o, inner_s + (stop - start,) + outer_s))
    return slabs


def _fill_value(op: ir.Operation) -> tuple[ir.Value, ir.Value] | None:
    """(the value, the buffer) of a fill: ``linalg.fill``, or a ``linalg.map`` without inputs whose body
    yields a value defined outside it."""
    if op.name == "linalg.fill":
        return op.operands[0], op.operands[1]
    if op.name == "linalg.map" and len(op.operands) == 1:
        body = op.regions[0].blocks[0]
        yielded = [o for o in body.operations][-1].operation
        v = yielded.operands[0] if len(yielded.operands) == 1 else None
        if v is None:
            return None
        owner = defining_op(v)
        if owner is None and isinstance(v.owner, ir.Block) and v.owner == body:
            return None  # yields its block argument (the old value)
        if owner is not None and owner.parent == op:
            return None
        return v, op.operands[0]
    return None


def _static_box(view: ir.Operation) -> Box | None:
    """The box a ``memref.subview`` takes when its offsets, sizes and strides are static, strides 1, and
    it keeps the source's rank."""
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    offsets = list(ir.DenseI64ArrayAttr(view.attributes["static_offsets"]))
    sizes = list(ir.DenseI64ArrayAttr(view.attributes["static_sizes"]))
    strides = list(ir.DenseI64ArrayAttr(view.attributes["static_strides"]))
    source = ir.MemRefType(view.operands[0].type)
    if any(o == dyn for o in offsets) or any(s < 0 for s in sizes) or any(s != 1 for s in strides):
        return None
    if ir.MemRefType(view.results[0].type).rank != source.rank:
        return None
    return tuple(offsets), tuple(sizes)


def _overwritten(op: ir.Operation) -> ir.Value | None:
    """The buffer ``op`` writes in full (every element, none read first), or None."""
    if op.name == "memref.copy":
        return op.operands[1]
    if op.name in ("linalg.copy", "linalg.map", "linalg.transpose"):
        return op.operands[-1]
    if op.name == "linalg.generic":
        seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
        if seg[1] != 1:
            return None
        its = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
        if any("parallel" not in i for i in its):
            return None
        maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        out_map = maps[-1]
        if out_map != ir.AffineMap.get_identity(out_map.n_dims):
            return None
        body = op.regions[0].blocks[0]
        if list(body.arguments[-1].uses):
            return None  # reads the old value
        return op.operands[len(op.operands) - 1]
    return None


@dataclasses.dataclass(frozen=True)
class FillBorders:
    name = "fill-borders"
    #: False: the pass does nothing (the cpu target sets it from its option ``fill_borders``).
    enabled: bool = True

    def apply(self, module: ir.Module, ctx: Any = None) -> None:
        if not self.enabled:
            return
        with module.context:
            for name in ("linalg.fill", "linalg.map"):
                for op in ops_named(module, name):
                    self._shrink(op)

    @staticmethod
    def _shrink(fill: ir.Operation) -> None:
        found = _fill_value(fill)
        if found is None:
            return
        value, buf = found
        t = buf.type
        if not isinstance(t, ir.MemRefType) or not t.has_static_shape or not t.rank:
            return
        strides, offset = ir.MemRefType(t).get_strides_and_offset()
        dyn = ir.ShapedType.get_dynamic_stride_or_offset()
        if offset == dyn or dyn in strides:
            return
        block_owner = fill.parent
        ops = [o.operation for o in fill.block.operations]   # the fill's block, in order
        where_in = {o: i for i, o in enumerate(ops)}
        pos = where_in[fill]
        # Every non-view user of the buffer (through views), by its op at the block's level.
        users: list[tuple[int, ir.Operation, ir.Value]] = []
        stack = [buf]
        while stack:
            v = stack.pop()
            for use in v.uses:
                user = user_op(use)
                if user.name in _VIEWS and user.operands[0] == v:
                    stack.append(user.results[0])
                    continue
                where = where_in.get(ancestor_in(user, block_owner))
                if where is None:
                    return  # used outside this block
                users.append((where, user, v))
        later = sorted((w for w, _, _ in users if w > pos))
        if not later:
            return
        # The first op after the fill that touches the buffer must write the box, and touch nothing else of it.
        first = [(u, v) for w, u, v in users if w == later[0]]
        writer, written = first[0]
        if ops[later[0]] != writer:
            return  # inside a loop or a region: not known to run
        if any(u != writer or v != written for u, v in first):
            return
        target = _overwritten(writer) if writer.name in _OVERWRITES else None
        if target is None or target != written:
            return
        if sum(1 for operand in writer.operands if operand == written) != 1:
            return  # reads the box too
        sub = defining_op(written)
        if sub is None or sub.name != "memref.subview" or sub.operands[0] != buf:
            return
        box = _static_box(sub)
        if box is None:
            return
        slabs = frame(list(ir.MemRefType(t).shape), box)
        with ir.InsertionPoint(fill), fill.location:
            for offsets, sizes in slabs:
                view = memref.SubViewOp(_slab_type(ir.MemRefType(t), offsets, sizes), buf, [], [], [],
                                        ir.DenseI64ArrayAttr.get(offsets), ir.DenseI64ArrayAttr.get(sizes),
                                        ir.DenseI64ArrayAttr.get([1] * len(sizes))).result
                linalg.fill(value, outs=[view])
        fill.erase()


def _slab_type(t: ir.MemRefType, offsets: Sequence[int], sizes: Sequence[int]) -> ir.MemRefType:
    strides, offset = t.get_strides_and_offset()
    start = offset + sum(o * s for o, s in zip(offsets, strides))
    layout = ir.StridedLayoutAttr.get(start, list(strides))
    return ir.MemRefType.get(list(sizes), t.element_type, layout=layout, memory_space=t.memory_space)
