"""Pass ``copies-to-linalg``: rewrite ``memref.copy`` into ``linalg.copy``.

Upstream lowers a ``memref.copy`` between identity-layout buffers to an ``llvm.memcpy`` intrinsic, but
one touching a strided view (e.g. the interior of a padded buffer) to a call into MLIR's runner-utils
library. pbsdk ships no runtime library, so such copies become ``linalg.copy`` ops, which the loop
lowering turns into plain loops (and which later tiling/vectorisation can treat like any other linalg op).
A copy whose two sides are each one contiguous run (`contiguous`: identity layouts, or a one-row view of
a padded image at a dynamic offset) is a memcpy to upstream too and stays a ``memref.copy``; with
``memcpy_contiguous`` such a ``linalg.copy`` becomes one (the cpu target: ``fuse-rows`` splits a strided
copy into row copies that are contiguous, which LLVM would otherwise get as three nested loops to
vectorise, ~0.1-0.3 s of compile each).

With ``row_copies``, a strided copy whose two sides share a contiguous inner run (`row_split`: the
longest suffix of dimensions packed row-major on both sides) of at least `MIN_ROW_BYTES` becomes
``scf.for`` loops over the other dimensions around a ``memref.copy`` of one row — a memcpy each — instead
of a ``linalg.copy`` whose loops move one element at a time. An activation copied into the interior of
its padded buffer (``8x56x56x64`` i8 into ``8x58x58x64``) is 448 memcpys of 3584 bytes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from mlir import ir
from mlir.dialects import arith, linalg, memref

from pbsdk.core.ir.builder import loop
from pbsdk.core.passes import contiguous, ops_named

#: Least bytes in one row for a strided copy to be copied row by row. A row's size is a constant, so LLVM
#: expands the memcpy of a short row into a few vector moves and calls memcpy only for long ones, while
#: the element loops it gets from ``linalg.copy`` run short rows slowly. Measured on Zen 4 (`benchmarks/row_copies.py`, i8 pads, ~1.6 MB): per-row memcpys take 0.2x
#: the time at rows of 16-64 B, 0.1x for ``8x56x56x64`` into its padded buffer (4 loops, 64 B innermost),
#: the same from 128 B on in 2-D (where LLVM vectorises the row loop well). 16 B is one 128-bit move;
#: shorter rows gained less (0.4-0.75x at 2-8 B) and are a few scalars or a transposing copy's single
#: element, which stay element loops.
MIN_ROW_BYTES = 16


def row_split(shape: Sequence[int], src_strides: Sequence[int], dst_strides: Sequence[int]) -> int:
    """The first dimension of the longest suffix of dimensions that both sides lay out packed row-major
    (each stride the product of the inner sizes; a dimension of size 1 never breaks the run): the copy is
    ``prod(shape[:k])`` rows of ``prod(shape[k:])`` contiguous elements on both sides (pure)."""
    running, k = 1, len(shape)
    while k > 0 and (shape[k - 1] == 1 or src_strides[k - 1] == running == dst_strides[k - 1]):
        running *= shape[k - 1]
        k -= 1
    return k


def row_copy_split(shape: Sequence[int], src_strides: Sequence[int], dst_strides: Sequence[int],
                   element_bytes: int, min_row_bytes: int = MIN_ROW_BYTES) -> int | None:
    """`row_split` where a copy row by row pays: None when the whole copy is one run already (one memcpy)
    or its rows are shorter than ``min_row_bytes`` (pure)."""
    k = row_split(shape, src_strides, dst_strides)
    if k == 0 or math.prod(shape[k:]) * element_bytes < min_row_bytes:
        return None
    return k


def _planned_split(src: ir.Value, dst: ir.Value) -> int | None:
    """`row_copy_split` of a copy between static buffers of one element type, else None."""
    s, d = src.type, dst.type
    if not (isinstance(s, ir.MemRefType) and isinstance(d, ir.MemRefType) and s.has_static_shape
            and d.has_static_shape and s.element_type == d.element_type):
        return None
    s, d, et = ir.MemRefType(s), ir.MemRefType(d), s.element_type
    if not isinstance(et, (ir.FloatType, ir.IntegerType)):
        return None
    bits = et.width
    return row_copy_split(list(s.shape), s.get_strides_and_offset()[0], d.get_strides_and_offset()[0],
                          bits // 8, MIN_ROW_BYTES)


def _row_view(v: ir.Value, at: Sequence[ir.Value | None], k: int) -> ir.Value:
    """The row of ``v`` at outer indices ``at`` (None: a dimension of size 1, index 0): a subview dropping
    the outer dimensions and the inner ones of size 1, at a dynamic offset."""
    t = ir.MemRefType(v.type)
    shape, strides = list(t.shape), t.get_strides_and_offset()[0]
    kept = [d for d in range(k, t.rank) if shape[d] != 1] or [t.rank - 1]
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    layout = ir.StridedLayoutAttr.get(dyn, [strides[d] for d in kept])
    row_type = ir.MemRefType.get([shape[d] for d in kept], t.element_type, layout, t.memory_space)
    offsets = [dyn if i is not None else 0 for i in at] + [0] * (t.rank - k)
    sizes = [1] * k + shape[k:]
    return memref.SubViewOp(row_type, v, [i for i in at if i is not None], [], [],
                            ir.DenseI64ArrayAttr.get(offsets), ir.DenseI64ArrayAttr.get(sizes),
                            ir.DenseI64ArrayAttr.get([1] * t.rank)).result


def _copy_rows(src: ir.Value, dst: ir.Value, k: int) -> None:
    """The copy as loops over its outer dimensions ``0..k-1`` (none over one of size 1), each innermost
    iteration a ``memref.copy`` of one row, at the insertion point."""
    idx = ir.IndexType.get()
    outer = ir.MemRefType(src.type).shape[:k]
    consts = {n: arith.ConstantOp(idx, n).result for n in sorted({0, 1, *outer})}
    _nest(src, dst, [None if n == 1 else consts[n] for n in outer], consts, [])


def _nest(src: ir.Value, dst: ir.Value, bounds: list[ir.Value | None], consts: dict[int, ir.Value],
          at: list[ir.Value | None]) -> None:
    """The loops of `_copy_rows` from dimension ``len(at)`` in, ``at`` the indices of the enclosing ones."""
    if len(at) == len(bounds):
        memref.copy(_row_view(src, at, len(at)), _row_view(dst, at, len(at)))
        return
    bound = bounds[len(at)]
    if bound is None:
        _nest(src, dst, bounds, consts, [*at, None])
        return
    with loop(consts[0], bound, consts[1]) as for_op:
        _nest(src, dst, bounds, consts, [*at, for_op.induction_variable])


@dataclasses.dataclass(frozen=True)
class CopiesToLinalg:
    """Options: ``only_strided`` keeps copies between contiguous sides as ``memref.copy`` (a memcpy);
    ``memcpy_contiguous`` also turns such ``linalg.copy`` ops (same element type) into ``memref.copy``;
    ``row_copies`` copies a strided copy (``memref.copy``, or ``linalg.copy`` of one element type) with
    rows of at least `MIN_ROW_BYTES` contiguous on both sides row by row, a ``memref.copy`` per row."""

    name = "copies-to-linalg"
    only_strided: bool = True
    memcpy_contiguous: bool = False
    row_copies: bool = False

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        for op in ops_named(module, "memref.copy"):
            src, dst = op.operands[0], op.operands[1]
            if self.only_strided and contiguous(src.type) and contiguous(dst.type):
                continue
            with ir.InsertionPoint(op), op.location:
                if not self._by_rows(src, dst):
                    linalg.copy(src, outs=[dst])
            op.erase()
        if not (self.memcpy_contiguous or self.row_copies):
            return
        for op in ops_named(module, "linalg.copy"):
            src, dst = op.operands[0], op.operands[1]
            if not (isinstance(src.type, ir.MemRefType) and isinstance(dst.type, ir.MemRefType)):
                continue
            same = ir.MemRefType(src.type).element_type == ir.MemRefType(dst.type).element_type
            with ir.InsertionPoint(op), op.location:
                if self.memcpy_contiguous and same and contiguous(src.type) and contiguous(dst.type):
                    memref.copy(src, dst)
                elif not self._by_rows(src, dst):
                    continue
            op.erase()

    def _by_rows(self, src: ir.Value, dst: ir.Value) -> bool:
        """With ``row_copies``, the copy row by row at the insertion point where it pays; whether it was."""
        k = _planned_split(src, dst) if self.row_copies else None
        if k is None:
            return False
        _copy_rows(src, dst, k)
        return True
