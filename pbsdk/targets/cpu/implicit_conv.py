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
has no other use, and nothing between the copies and the call may write ``X`` or a view of its buffer
(`pbsdk.targets.cpu.aliasing`; so reading ``X`` at the call reads what the copies read) or touches the
patch buffer (an epilogue's operands computed there, a batch norm's scale, are fine).
"""

from __future__ import annotations

import dataclasses
import math

from mlir import ir
from mlir.dialects import func, memref, vector

from pbsdk.core.ir.builder import Indices, element_bits, reassociation_groups, zero_vector
from pbsdk.core.ir.builder import for_each as _for
from pbsdk.core.passes import defining_op, identity_layout, user_op
from pbsdk.core.plan.window import ConvGeometry, TapCopy, im2col_geometry
from pbsdk.targets.cpu.aliasing import aliases, may_write
from pbsdk.targets.cpu.matmul_kernel import window_start


@dataclasses.dataclass(frozen=True)
class Im2col:
    """A recognised im2col: the input ``x`` read in place, its window, the copies (and their views) that
    filled the patch matrix for this call, and the patch matrix's collapse and buffer (shared when
    bufferization reused them for another convolution)."""

    x: ir.Value
    geometry: ConvGeometry
    ops: tuple[ir.Operation, ...]
    collapse: ir.Operation
    buffer: ir.Operation

    def erase_copies(self) -> None:
        """Erase the tap copies and their views once unused (the patch buffer stays)."""
        for o in self.ops:
            if all(not list(r.uses) for r in o.results):
                o.erase()

    def erase(self) -> None:
        """Erase what only the (already rewritten) call needed: its copies, their views once unused, and
        the collapse and the buffer (with its dealloc) once nothing else uses them."""
        self.erase_copies()
        if not list(self.collapse.results[0].uses):
            self.collapse.erase()
        users = [user_op(u) for u in self.buffer.results[0].uses]
        if all(u.name == "memref.dealloc" for u in users):
            for u in users:
                u.erase()
            self.buffer.erase()


def _static(op: ir.Operation, name: str) -> tuple[int, ...]:
    return tuple(int(v) for v in ir.DenseI64ArrayAttr(op.attributes[name]))


#: Ops that may sit between the patch copies and the call: they neither read nor write buffer contents.
_INERT = {"memref.subview", "memref.collapse_shape", "memref.expand_shape", "memref.alloc", "memref.cast",
          "arith.constant"}


def _operands_within(op: ir.Operation) -> list[ir.Value]:
    """The operands of ``op`` and of every op nested in it."""
    found: list[ir.Value] = []

    def visit(inner: ir.Operation) -> ir.WalkResult:
        found.extend(inner.operands)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return found


def find_im2col(call: ir.Operation) -> Im2col | None:
    """The im2col feeding ``call``'s first operand (see the module docstring), or None.

    Bufferization may reuse one patch buffer (and its views) for several convolutions of the same shape:
    each call then reads the generation of copies made since the previous call. A call qualifies only if
    every call reading the buffer has a whole generation of its own before it (so erasing this call's
    copies cannot leave another call reading them)."""
    collapse = defining_op(call.operands[0])
    if collapse is None or collapse.name != "memref.collapse_shape":
        return None
    if reassociation_groups(collapse) != [[0, 1, 2], [3, 4, 5]]:
        return None
    patches = collapse.operands[0]
    alloc = defining_op(patches)
    if alloc is None or alloc.name != "memref.alloc" or len(alloc.operands) or not identity_layout(patches.type):
        return None
    block = call.block
    readers = [user_op(u) for u in collapse.results[0].uses]
    if any(r.name != "func.call" or r.block != block for r in readers):
        return None
    # Every write into the patch buffer: a copy into a view of it, in this block.
    copy_views: dict[ir.Operation, tuple[ir.Operation, ir.Operation]] = {}  # copy -> (dst view, src view)
    dealloc: list[ir.Operation] = []
    for use in patches.uses:
        user = user_op(use)
        if user == collapse:
            continue
        if user.name == "memref.dealloc":
            dealloc.append(user)
            continue
        if user.name != "memref.subview" or len(user.operands) != 1:
            return None
        for view_use in user.results[0].uses:
            cp = user_op(view_use)
            if cp.name != "memref.copy" or cp.operands[1] != user.results[0] or cp.block != block:
                return None
            src = defining_op(cp.operands[0])
            if src is None or src.name != "memref.subview" or len(src.operands) != 1:
                return None
            copy_views[cp] = (user, src)
    if len(dealloc) > 1:
        return None
    ops = [o.operation for o in block.operations]
    position = {o: i for i, o in enumerate(ops)}
    taps = ir.MemRefType(patches.type).shape[3] * ir.MemRefType(patches.type).shape[4]
    found: Im2col | None = None
    previous = -1
    for reader in sorted(readers, key=lambda r: position[r]):
        at = position[reader]
        generation = [cp for cp in copy_views if previous < position[cp] < at]
        if len(generation) != taps:
            return None
        if reader == call:
            found = _generation(patches, generation, copy_views, ops[previous + 1:at], collapse, alloc)
        previous = at
    if any(position[cp] > previous for cp in copy_views):  # copies no call reads: not the core's im2col
        return None
    return found


def _generation(patches: ir.Value, copies: list[ir.Operation],
                copy_views: dict[ir.Operation, tuple[ir.Operation, ir.Operation]], between: list[ir.Operation],
                collapse: ir.Operation, alloc: ir.Operation) -> Im2col | None:
    """The `Im2col` of one generation of copies read by a call (``between``: the ops from after the
    previous reader up to the call), or None if they are not one window of one input or if anything else
    between the first copy and the call writes memory."""
    views = [copy_views[cp] for cp in copies]
    sources = {src.operands[0] for _, src in views}
    if len(sources) != 1:
        return None
    x = views[0][1].operands[0]
    if not identity_layout(x.type):
        return None
    tap_copies = [TapCopy(_static(dst, "static_offsets"), _static(dst, "static_sizes"),
                          _static(dst, "static_strides"), _static(src, "static_offsets"),
                          _static(src, "static_sizes"), _static(src, "static_strides"))
                  for dst, src in views]
    geometry = im2col_geometry(ir.MemRefType(patches.type).shape, ir.MemRefType(x.type).shape, tap_copies)
    if geometry is None:
        return None
    started = False
    x_buffers, patch_buffers = aliases(x), aliases(patches)
    for o in between:
        started = started or o in copy_views
        if started and o not in copy_views and o.name not in _INERT and (
                may_write(o, x_buffers) or any(v == w for v in _operands_within(o) for w in patch_buffers)):
            return None
    erase = dict.fromkeys([*copies, *(dst for dst, _ in views), *(src for _, src in views)])  # in order, once
    return Im2col(x, geometry, tuple(erase), collapse, alloc)


#: Bytes one vector register moves in the row copies of `copy_by_rows` (a 512-bit register; a run wider
#: than one goes in several).
ROW_COPY_BYTES = 64


def copy_by_rows(module: ir.Module, found: Im2col, name: str) -> None:
    """Fill ``found``'s patch buffer a kernel row at a time instead of a tap at a time: with adjacent kernel
    columns (``dw == 1``) the ``KW * C`` values of one output pixel's kernel row are adjacent in the NHWC
    input and in the patch row, so one masked vector copy moves them (a 3-channel 7x7 stem: 21 values), where
    the core's copies move a tap's ``C`` values at a time through scalar loops (49 copies of 3-value runs
    took 35 ms of a bf16 ResNet-50 at batch 8). The copies go; a call of ``@name(X, P)`` (appended to
    ``module``) takes their place. Needs ``dw == 1`` and an identity-layout ``X``."""
    g, x_type = found.geometry, ir.MemRefType(found.x.type)
    p_type = ir.MemRefType(found.buffer.results[0].type)
    if g.dw != 1 or not identity_layout(x_type):
        raise ValueError(f"copy_by_rows: needs adjacent kernel columns and a contiguous input, got {g}, {x_type}")
    anchor = next(o for o in found.ops if o.name == "memref.copy")
    with anchor.location:
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp(name, ([x_type, p_type], []), visibility="private")
            entry = fn.add_entry_block()
            with ir.InsertionPoint(entry):
                _row_copies(entry, g, x_type, p_type)
                func.ReturnOp([])
        func.CallOp(fn, [found.x, found.buffer.results[0]], ip=ir.InsertionPoint(anchor))
    found.erase_copies()


def _row_copies(entry: ir.Block, g: ConvGeometry, x_type: ir.MemRefType, p_type: ir.MemRefType) -> None:
    """The body of `copy_by_rows`' function: for each output pixel and kernel row, its run of ``KW * C``
    values, in vector chunks (the last one masked)."""
    x = Indices(entry)
    c = x.c
    et = x_type.element_type
    _, _, wp, ch = x_type.shape
    n = x_type.shape[0]
    run, depth = g.kw * ch, g.kh * g.kw * ch
    width = element_bits(et)
    lanes = max(1, ROW_COPY_BYTES * 8 // width)
    flat = [memref.collapse_shape(ir.MemRefType.get([math.prod(t.shape)], et), v, [list(range(t.rank))])
            for v, t in ((entry.arguments[0], x_type), (entry.arguments[1], p_type))]
    vt = ir.VectorType.get([lanes], et)
    i1 = ir.IntegerType.get_signless(1)
    zero = zero_vector(vt)

    def pixel(r: ir.Value) -> None:
        base = window_start(r, g, x_type, c)
        for i in range(g.kh):
            src = x.add(base, c(i * g.dh * wp * ch))
            dst = x.add(x.mul(r, depth), c(i * run))
            for t in range(0, run, lanes):
                count = min(lanes, run - t)
                mask = vector.create_mask(ir.VectorType.get([lanes], i1), [c(count)])
                v = vector.maskedload(vt, flat[0], [x.add(src, c(t))], mask, zero)
                vector.maskedstore(flat[1], [x.add(dst, c(t))], mask, v)

    _for(c(0), c(n * g.oh * g.ow), c(1), pixel)
    x.hoist()

