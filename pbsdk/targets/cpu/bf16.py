"""Stage ``widen-bf16`` of the cpu lowering: bf16 -> f32 extensions as integer shifts, so that LLVM keeps
bf16 computations in f32 and vectorises them.

The core computes bf16 ops in f32 (``arith.extf`` to f32, the arithmetic, ``arith.truncf`` back: eager
PyTorch's op-math). LLVM's InstCombine narrows ``fptrunc(op(fpext a, fpext b))`` back to ``op`` on
``bfloat`` (exact for add, subtract, multiply, divide, maximum, minimum of two bf16 values), and x86 has no
bf16 arithmetic: every such op is promoted to f32 one element at a time, and the loop vectoriser, which
costs the scalar bf16 op as that expansion, leaves the loop scalar. A 3x3 max-pool over bf16 activations
ran at a quarter of the f32 pool's speed that way (ResNet-50, batch 8: 30 ms of 450).

An extension of a bf16 value is its 16 bits moved to the top of an f32 (``bitcast`` to i16, ``extui`` to
i32, shift left by 16, ``bitcast`` to f32) — exact, NaN and infinities included, and what the back end
emits for ``fpext`` anyway. With no ``fpext`` in the IR InstCombine has nothing to narrow; the arithmetic
stays in f32, and the rounding back to bf16 stays one ``fptrunc`` (``vcvtneps2bf16`` where the CPU has
AVX512-BF16). Scalars and vectors alike. A machine whose lowering expands bf16 altogether
(`pbsdk.targets.cpu.expands_bf16`) does not need this stage: arith's own expansion already does the same.
"""

from __future__ import annotations

from typing import Any

from mlir import ir
from mlir.dialects import arith

from pbsdk.core.ir.builder import element_of
from pbsdk.core.passes import ops_named


def _like(t: ir.Type, element: ir.Type) -> ir.Type:
    """``t`` (a scalar or a vector type) with its element type replaced by ``element``."""
    if isinstance(t, ir.VectorType):
        return ir.VectorType.get(t.shape, element)
    return element


def widen(value: ir.Value, result_type: ir.Type) -> ir.Value:
    """``value`` (bf16 or a vector of bf16) as f32 by its bits, at the current insertion point."""
    i16, i32 = ir.IntegerType.get_signless(16), ir.IntegerType.get_signless(32)
    bits = arith.extui(_like(value.type, i32), arith.bitcast(_like(value.type, i16), value))
    sixteen: ir.Attribute = ir.IntegerAttr.get(i32, 16)
    if isinstance(value.type, ir.VectorType):
        sixteen = ir.DenseElementsAttr.get_splat(ir.VectorType(_like(value.type, i32)), sixteen)
    return arith.bitcast(result_type, arith.shli(bits, arith.constant(_like(value.type, i32), sixteen)))


class WidenBf16:
    """Replace every ``arith.extf`` from bf16 to f32 (scalar or vector) by the shift of its bits.

    Contract: after the pass no ``arith.extf`` from bf16 to f32 remains; other extensions (f16, to f64) and
    ops on scalable vectors are left as they were. Results are bit-identical."""

    name = "widen-bf16"

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        with module.context:
            bf16, f32 = ir.BF16Type.get(), ir.F32Type.get()
            for op in ops_named(module, "arith.extf"):
                src, res = op.operands[0], op.results[0]
                if element_of(src.type) != bf16 or element_of(res.type) != f32:
                    continue
                if isinstance(src.type, ir.ShapedType) and (not isinstance(src.type, ir.VectorType)
                                                            or ir.VectorType(src.type).scalable):
                    continue  # scalars and fixed vectors only (the lowering has no tensors left)
                with ir.InsertionPoint(op), op.location:
                    wide = widen(src, res.type)
                res.replace_all_uses_with(wide)
                op.erase()
