"""pbsdk's own passes: one per file, each a small frozen object whose fields are its options."""

from __future__ import annotations

from mlir import ir


def ops_named(root: ir.Module, name: str) -> list[ir.Operation]:
    """Every op called ``name`` under ``root``, in walk order (collected first, so callers may rewrite)."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == name:
            found.append(op)
        return ir.WalkResult.ADVANCE

    root.operation.walk(visit)
    return found


def iterator_kinds(op: ir.Operation) -> list[str]:
    """A structured op's iterator types as "parallel", "reduction", or "?" for any other kind."""
    its = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    return ["parallel" if "parallel" in i else "reduction" if "reduction" in i else "?" for i in its]


def identity_layout(t: ir.Type) -> bool:
    """A static-shaped, contiguous row-major buffer with offset 0 (what lowers to a plain memcpy, and what
    can be viewed flat)."""
    if not isinstance(t, ir.MemRefType) or not t.has_static_shape:
        return False
    strides, offset = t.get_strides_and_offset()
    expected, running = [], 1
    for size in reversed(t.shape):
        expected.append(running)
        running *= size
    return offset == 0 and list(strides) == list(reversed(expected))


def row_major(t: ir.Type) -> bool:
    """A buffer with the identity layout (row-major at offset 0), whatever its sizes, dynamic ones too."""
    if not isinstance(t, ir.MemRefType):
        return False
    memref_t = ir.MemRefType(t)
    layout = memref_t.layout
    if isinstance(layout, ir.AffineMapAttr):
        return ir.AffineMapAttr(layout).value == ir.AffineMap.get_identity(memref_t.rank, context=t.context)
    # A strided layout spelling the identity (``memref<?x512xf32, strided<[512, 1]>>``: a view of whole rows
    # at offset 0): every stride static and row-major over the static sizes inside it.
    strides, offset = memref_t.get_strides_and_offset()
    running = 1
    for size, stride in zip(reversed(memref_t.shape), reversed(strides)):
        if memref_t.is_dynamic_stride_or_offset(stride) or stride != running:
            return False
        running = running * size if not memref_t.is_dynamic_size(size) else -1
    return offset == 0


def layout_at_run_time(t: ir.Type) -> bool:
    """A buffer whose strides or offset are known only at run time (a view of a dynamic buffer, a row at
    a loop's offset): under the bare-pointer convention, no function argument can carry them."""
    if not isinstance(t, ir.MemRefType):
        return False
    memref = ir.MemRefType(t)
    strides, offset = memref.get_strides_and_offset()
    return any(memref.is_dynamic_stride_or_offset(v) for v in (*strides, offset))


def contiguous(t: ir.Type) -> bool:
    """A static-shaped buffer whose elements are one run in row-major order, at any (even dynamic) offset —
    a one-row view of a padded image — which upstream's ``memref.copy`` lowering copies with one memcpy: the
    inner dimensions have row-major strides and every dimension outside them has size 1."""
    if not isinstance(t, ir.MemRefType) or not t.has_static_shape:
        return False
    strides, _ = t.get_strides_and_offset()
    running, d = 1, t.rank - 1
    while d >= 0 and strides[d] == running:
        running *= t.shape[d]
        d -= 1
    while d >= 0 and t.shape[d] == 1:
        d -= 1
    return d < 0


def defining_op(v: ir.Value) -> ir.Operation | None:
    """The op whose result ``v`` is, or None for a block argument."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    return owner.operation if hasattr(owner, "operation") else owner


def user_op(use: ir.OpOperand) -> ir.Operation:
    """The op holding the operand ``use``."""
    owner = use.owner
    return owner.operation if hasattr(owner, "operation") else owner


def ancestor_in(op: ir.Operation, parent: ir.Operation) -> ir.Operation:
    """The op directly inside ``parent`` that holds ``op`` (``op`` itself when it is directly inside; the
    outermost op when ``parent`` does not hold it)."""
    while op.parent is not None and op.parent != parent:
        op = op.parent
    return op


def match_signature(fn: ir.Operation) -> None:
    """Give ``fn`` (a ``func.func``) its entry block's argument types as its inputs, keeping its results:
    after a rewrite changed the types of block arguments or appended some."""
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    inputs = [a.type for a in fn.regions[0].blocks[0].arguments]
    if inputs != list(ftype.inputs):
        with fn.context:
            fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, list(ftype.results)))
            if "arg_attrs" in fn.attributes:  # one dictionary per argument: appended arguments get none
                attrs = list(ir.ArrayAttr(fn.attributes["arg_attrs"]))
                attrs += [ir.DictAttr.get({})] * (len(inputs) - len(attrs))
                fn.attributes["arg_attrs"] = ir.ArrayAttr.get(attrs[:len(inputs)])


def map_dims(amap: ir.AffineMap) -> list[int | None] | None:
    """An indexing map's results as loop positions, None for the constant 0 (a unit dimension); None when a
    result is anything else."""
    out: list[int | None] = []
    for e in amap.results:
        if isinstance(e, ir.AffineDimExpr):
            out.append(e.position)
        elif isinstance(e, ir.AffineConstantExpr) and e.value == 0:
            out.append(None)
        else:
            return None
    return out
