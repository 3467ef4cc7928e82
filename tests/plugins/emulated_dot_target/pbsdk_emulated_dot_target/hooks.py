"""``unit_step`` without the instruction: the groups of ``k`` products of a dot-product unit computed with
vector arithmetic (deinterleave, widen, multiply-add), built with the MLIR bindings' op builders."""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, vector

from pbsdk.core.hooks import UnitStep
from pbsdk.core.spec import ChipSpec


def unit_step(step: UnitStep, acc: ir.Value, a: ir.Value, b: ir.Value, spec: ChipSpec) -> ir.Value:
    """``acc[j] += sum_t a[j*k + t] * b[j*k + t]`` for each lane ``j``: floats in the accumulator's type, A's
    bytes as unsigned (the u8 x i8 convention of vpdpbusd) and B's as signed for integers."""
    acc_t = ir.VectorType(step.acc_type)
    lanes, k = acc_t.shape[0], step.unit.k
    wide_t = acc_t.element_type
    floats = isinstance(wide_t, ir.FloatType)
    for t in range(k):
        pick = [j * k + t for j in range(lanes)]
        x = vector.shuffle(a, a, pick)
        y = vector.shuffle(b, b, pick)
        if floats:
            acc = arith.addf(acc, arith.mulf(arith.extf(acc_t, x), arith.extf(acc_t, y)))
        else:
            acc = arith.addi(acc, arith.muli(arith.extui(acc_t, x), arith.extsi(acc_t, y)))
    return acc
