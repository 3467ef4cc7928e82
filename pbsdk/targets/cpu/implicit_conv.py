"""Finding the core's im2col in front of a contraction, so that ``pack-contractions`` can read the
convolution's input in place instead (implicit GEMM).

The core emits an ungrouped NHWC convolution as a patch matrix filled by one strided copy per kernel tap
(`pbsdk.core.ir.emit`, ``_conv2d_as_matmul``), collapsed to 2-D and handed to the isolated contraction.
After bufferization that is, in the caller::

    %P = memref.alloc() : memref<N x OH x OW x KH x KW x C>
    memref.copy (subview %X[0, i*dh, j*dw, 0] [N, OH, OW, C] [1, sh, sw, 1]),
                (subview %P[0, 0, 0, i, j, 0] [N, OH, OW, 1, 1, C] [1, ...])      -- for every tap (i, j)
    %A = memref.collapse_shape %P [[0, 1, 2], [3, 4, 5]]
    call @contraction(%A, %W, %C)

`im2col_geometry` is the pure part: from the copies' static offsets, sizes and strides it proves that
``A[(n, oh, ow), (i, j, c)] = X[n, oh*sh + i*dh, ow*sw + j*dw, c]`` for every element, or returns None.
`find_im2col` collects those facts from the IR and checks what the geometry cannot see: the patch buffer
has no other use, and nothing between the copies and the call writes anything (so reading ``X`` at the
call reads what the copies read).
"""

from __future__ import annotations

import dataclasses

from mlir import ir

from pbsdk.core.plan.window import ConvGeometry, TapCopy, im2col_geometry


@dataclasses.dataclass(frozen=True)
class Im2col:
    """A recognised im2col: the input ``x`` read in place, its window, and the ops that built the patch
    matrix (erased, in this order, once the call no longer reads it)."""

    x: ir.Value
    geometry: ConvGeometry
    ops: tuple[ir.Operation, ...]


def _op(v: ir.Value) -> ir.Operation | None:
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def _static(op: ir.Operation, name: str) -> tuple[int, ...]:
    return tuple(int(v) for v in ir.DenseI64ArrayAttr(op.attributes[name]))


def _contiguous(t: ir.Type) -> bool:
    if not isinstance(t, ir.MemRefType):
        return False
    mt = ir.MemRefType(t)
    if not mt.has_static_shape:
        return False
    strides, offset = mt.get_strides_and_offset()
    expect, running = [], 1
    for d in reversed(mt.shape):
        expect.append(running)
        running *= d
    return offset == 0 and list(strides) == list(reversed(expect))


#: Ops that may sit between the patch copies and the call: they neither read nor write buffer contents.
_INERT = {"memref.subview", "memref.collapse_shape", "memref.expand_shape", "memref.alloc", "memref.cast",
          "arith.constant"}


def find_im2col(call: ir.Operation) -> Im2col | None:
    """The im2col feeding ``call``'s first operand (see the module docstring), or None."""
    collapse = _op(call.operands[0])
    if collapse is None or collapse.name != "memref.collapse_shape":
        return None
    groups = [[int(ir.IntegerAttr(d).value) for d in ir.ArrayAttr(g)]
              for g in ir.ArrayAttr(collapse.attributes["reassociation"])]
    if groups != [[0, 1, 2], [3, 4, 5]] or len(list(collapse.results[0].uses)) != 1:
        return None
    patches = collapse.operands[0]
    alloc = _op(patches)
    if alloc is None or alloc.name != "memref.alloc" or len(alloc.operands) or not _contiguous(patches.type):
        return None
    block = call.block
    copies: list[tuple[ir.Operation, ir.Operation, ir.Operation]] = []  # (copy, dst view, src view)
    dealloc: list[ir.Operation] = []
    x: ir.Value | None = None
    for use in patches.uses:
        user = use.owner.operation if hasattr(use.owner, "operation") else use.owner
        if user == collapse:
            continue
        if user.name == "memref.dealloc":
            dealloc.append(user)
            continue
        if user.name != "memref.subview" or len(user.operands) != 1:
            return None
        view_uses = list(user.results[0].uses)
        if len(view_uses) != 1:
            return None
        cp = view_uses[0].owner
        cp = cp.operation if hasattr(cp, "operation") else cp
        if cp.name != "memref.copy" or cp.operands[1] != user.results[0] or cp.block != block:
            return None
        src = _op(cp.operands[0])
        if src is None or src.name != "memref.subview" or len(src.operands) != 1:
            return None
        if x is None:
            x = src.operands[0]
        elif src.operands[0] != x:
            return None
        copies.append((cp, user, src))
    if x is None or not _contiguous(x.type) or len(dealloc) > 1:
        return None
    taps = [TapCopy(_static(dst, "static_offsets"), _static(dst, "static_sizes"), _static(dst, "static_strides"),
                    _static(src, "static_offsets"), _static(src, "static_sizes"), _static(src, "static_strides"))
            for _, dst, src in copies]
    geometry = im2col_geometry(ir.MemRefType(patches.type).shape, ir.MemRefType(x.type).shape, taps)
    if geometry is None:
        return None
    # Nothing between the first copy and the call may write memory (X must hold what the copies read).
    ops = [o.operation for o in block.operations]
    copy_ops = {cp for cp, _, _ in copies}
    at = [i for i, o in enumerate(ops) if o in copy_ops]
    end = next(i for i, o in enumerate(ops) if o == call)
    if not at or max(at) > end:
        return None
    for o in ops[min(at):end]:
        if o not in copy_ops and o.name not in _INERT:
            return None
    erase: list[ir.Operation] = [cp for cp, _, _ in copies] + [dst for _, dst, _ in copies]
    erase += [src for _, _, src in copies]
    erase += [collapse, *dealloc, alloc]
    unique: list[ir.Operation] = []
    for o in erase:
        if o not in unique:
            unique.append(o)
    return Im2col(x, geometry, tuple(unique))
