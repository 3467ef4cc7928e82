"""Small builders for nvgpu's stages (`schedule.py`, `lower.py`): the workgroup address space, GPU loop
mappings, ``scf.forall`` with a mapping — at the current insertion point — and `apply_transform`, which
builds a transform-dialect script with `mlir.dialects.transform` builders and runs it with the
interpreter."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir import ir
from mlir.dialects import scf, transform
from mlir.dialects.transform import interpreter, structured

WORKGROUP = "#gpu.address_space<workgroup>"


def workgroup() -> ir.Attribute:
    return ir.Attribute.parse(WORKGROUP)


def _mapping(names: Sequence[str]) -> ir.ArrayAttr:
    # The bindings have no builders for the GPU mapping attributes: they are parsed, one name each.
    return ir.ArrayAttr.get([ir.Attribute.parse(f"#gpu.{n}") for n in names])


def axis_mapping(kind: str, n: int) -> ir.ArrayAttr:
    """A forall mapping of ``n`` loops onto ``#gpu.<kind><z|y|x>`` (``kind``: block, thread), innermost x."""
    return _mapping([f"{kind}<{a}>" for a in "zyx"[3 - n:]])


def linear_mapping(kind: str, n: int) -> ir.ArrayAttr:
    """A forall mapping of ``n`` loops onto ``#gpu.<kind><linear_dim_i>`` (``kind``: thread, warp), the
    innermost loop on ``linear_dim_0``."""
    return _mapping([f"{kind}<linear_dim_{n - 1 - i}>" for i in range(n)])


def forall(bounds: Sequence[int], mapping: ir.ArrayAttr) -> scf.ForallOp:
    """``scf.forall`` over ``bounds`` (from 0, step 1) with ``mapping``; the caller fills the body and ends
    it with ``scf.InParallelOp()``."""
    op = scf.ForallOp([0] * len(bounds), list(bounds), [1] * len(bounds))
    op.attributes["mapping"] = mapping
    return op


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
