"""Small helpers for building IR with the MLIR Python bindings' builders.

Each works at the current ``ir.InsertionPoint``, ``ir.Location`` and ``ir.Context`` (the bindings' usual
``with`` blocks), takes and returns ``ir.Type``/``ir.Value``/``ir.Attribute`` objects, and stands for one
idiom that would otherwise be repeated: a pbsdk dtype as an MLIR type, an affine map from a list of
expressions, a float constant, a ``linalg.fill``, a reassociation list, a ``linalg.generic`` whose body is
built by a callback.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir import ir
from mlir.dialects import arith, linalg

_FLOAT_TYPES: dict[str, Callable[[], ir.Type]] = {
    "f64": ir.F64Type.get, "f32": ir.F32Type.get, "f16": ir.F16Type.get, "bf16": ir.BF16Type.get,
}


def element_type(dtype: str) -> ir.Type:
    """The MLIR element type of a pbsdk dtype name (``"f32"``, ...)."""
    return _FLOAT_TYPES[dtype]()


def tensor_type(shape: Sequence[int], dtype: str) -> ir.RankedTensorType:
    """``tensor<shape x dtype>`` (static shape)."""
    return ir.RankedTensorType.get(list(shape), element_type(dtype))


def dims(n: int) -> list[ir.AffineExpr]:
    """The loop dimensions ``d0 .. d(n-1)`` of an n-loop affine map."""
    return [ir.AffineDimExpr.get(i) for i in range(n)]


def affine_map(n_dims: int, results: Sequence[ir.AffineExpr | int]) -> ir.AffineMapAttr:
    """``affine_map<(d0, ..., d(n_dims-1)) -> (results)>``; an int result is that constant."""
    exprs = [ir.AffineConstantExpr.get(r) if isinstance(r, int) else r for r in results]
    return ir.AffineMapAttr.get(ir.AffineMap.get(n_dims, 0, exprs))


def float_constant(value: float, t: ir.Type) -> ir.Value:
    """``arith.constant value : t`` for a float type ``t`` (non-finite values included)."""
    return arith.ConstantOp(t, ir.FloatAttr.get(t, value)).result


def fill(value: ir.Value, init: ir.Value) -> ir.Value:
    """``linalg.fill ins(value) outs(init)`` on a tensor, built as the op itself (the opdsl wrapper
    ``linalg.fill`` builds the same op through its op-definition machinery, about ten times slower)."""
    op = linalg.FillOp([init.type], [value], [init])
    linalg.fill_builtin_region(op.operation)
    return op.results[0]


def reassociation(groups: Sequence[Sequence[int]]) -> ir.ArrayAttr:
    """A reshape's reassociation attribute (``[[0, 1], [2]]``)."""
    i64 = ir.IntegerType.get_signless(64)
    return ir.ArrayAttr.get([ir.ArrayAttr.get([ir.IntegerAttr.get(i64, d) for d in g]) for g in groups])


def generic(ins: Sequence[tuple[ir.Value, ir.AffineMapAttr]], init: ir.Value, out_map: ir.AffineMapAttr,
            iterators: Sequence[str], body: Callable[[Sequence[ir.Value]], ir.Value]) -> ir.Value:
    """A one-result ``linalg.generic`` on tensors: ``ins`` read through their maps, ``init`` written through
    ``out_map``; ``body`` builds the scalar code from the block arguments (one per input, then the output's
    current element) at the block's insertion point and returns the value to yield."""
    kinds = {i: ir.Attribute.parse(f"#linalg.iterator_type<{i}>") for i in set(iterators)}
    iterator_attrs = ir.ArrayAttr.get([kinds[i] for i in iterators])
    maps = ir.ArrayAttr.get([m for _, m in ins] + [out_map])
    op = linalg.GenericOp([init.type], [v for v, _ in ins], [init], maps, iterator_attrs)
    element_types = [ir.ShapedType(v.type).element_type for v, _ in ins] + [ir.ShapedType(init.type).element_type]
    block = op.regions[0].blocks.append(*element_types)
    with ir.InsertionPoint(block):
        linalg.YieldOp([body(list(block.arguments))])
    return op.results[0]
