"""Small builders for nvgpu's stages (`schedule.py`, `lower.py`): shared-memory
types, ``scf.forall`` nests with their GPU mapping, ``scf.if`` with a value, subviews — all with the MLIR
bindings at the current insertion point — and `apply_transform`, which builds a transform-dialect script
with `mlir.dialects.transform` builders and runs it with the interpreter (`schedule.py`, `lower.py`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from mlir import ir
from mlir.dialects import memref, scf, transform
from mlir.dialects.transform import interpreter, structured

WORKGROUP = "#gpu.address_space<workgroup>"
LINEAR = ("#gpu.thread<linear_dim_0>",)


def workgroup() -> ir.Attribute:
    return ir.Attribute.parse(WORKGROUP)


def smem_type(shape: Sequence[int], elem: ir.Type) -> ir.MemRefType:
    """An identity-layout buffer in shared memory."""
    return ir.MemRefType.get(list(shape), elem, memory_space=workgroup())


def view_type(rows: int, cols: int, stride: int, elem: ir.Type, *, offset: bool = True) -> ir.MemRefType:
    """A rows x cols view of a shared tile whose rows are ``stride`` elements apart (dynamic offset unless
    ``offset`` is False, then 0)."""
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    layout = ir.StridedLayoutAttr.get(dyn if offset else 0, [stride, 1])
    return ir.MemRefType.get([rows, cols], elem, layout, workgroup())


def mapping_attr(*attrs: str) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.Attribute.parse(a) for a in attrs])


def forall(bounds: Sequence[int], mapping: ir.ArrayAttr) -> scf.ForallOp:
    """``scf.forall`` over ``bounds`` (from 0, step 1) with ``mapping``; the caller fills the body and ends
    it with ``scf.InParallelOp()``."""
    op = scf.ForallOp([0] * len(bounds), list(bounds), [1] * len(bounds))
    op.attributes["mapping"] = mapping
    return op


@contextmanager
def in_forall(bounds: Sequence[int], *mapping: str) -> Iterator[list[ir.Value]]:
    """An ``scf.forall`` over ``bounds`` with ``mapping``; the body is built inside the ``with`` block."""
    op = forall(bounds, mapping_attr(*mapping))
    with ir.InsertionPoint(op.body):
        yield list(op.body.arguments)
        scf.InParallelOp()


def if_else(cond: ir.Value, result: ir.Type, then: Callable[[], ir.Value], other: ir.Value) -> ir.Value:
    """``scf.if cond -> (result) { yield then() } else { yield other }``."""
    op = scf.IfOp(cond, [result], has_else=True)
    with ir.InsertionPoint(op.then_block):
        scf.YieldOp([then()])
    with ir.InsertionPoint(op.else_block):
        scf.YieldOp([other])
    return op.results[0]


def subview(src: ir.Value, offsets: Sequence[ir.Value | int], sizes: Sequence[int], ty: ir.MemRefType) -> ir.Value:
    """``memref.subview src[offsets] [sizes] [1, ...]`` of type ``ty`` (int offsets are static)."""
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    return memref.SubViewOp(ty, src, [o for o in offsets if not isinstance(o, int)], [], [],
                            [o if isinstance(o, int) else dyn for o in offsets], list(sizes),
                            [1] * len(sizes)).result


def apply_transform(module: ir.Module, body: Callable[[ir.Value], None]) -> None:
    """Build a transform-dialect script — ``@__transform_main(%root)``, whose body ``body(root)`` builds
    with `mlir.dialects.transform` builders — and apply it to ``module`` with the interpreter."""
    with module.context, ir.Location.unknown():
        script = ir.Module.create()
        script.operation.attributes["transform.with_named_sequence"] = ir.UnitAttr.get()
        any_op = transform.AnyOpType.get()
        with ir.InsertionPoint(script.body):
            seq = transform.NamedSequenceOp("__transform_main", [any_op], [],
                                            arg_attrs=[{"transform.readonly": ir.UnitAttr.get()}])
            with ir.InsertionPoint(seq.body):
                body(seq.bodyTarget)
                transform.YieldOp([])
        interpreter.apply_named_sequence(module.operation, seq.operation, script)


def match_tagged(root: ir.Value, name: str, tag: int) -> ir.Value:
    """``transform.structured.match attributes {name = tag : i64} in root``."""
    i64 = ir.IntegerType.get_signless(64)
    return structured.MatchOp(transform.AnyOpType.get(), root,
                              op_attrs=ir.DictAttr.get({name: ir.IntegerAttr.get(i64, tag)})).result
