"""The planner's widening of narrow float operands (`widened_dtype`): a bf16 or f16 product on a chip with
no unit and no vector arithmetic for them runs on the accumulator's FMAs, its operands widened as they are
packed. Pure planning: no MLIR."""

from __future__ import annotations

import pytest

from pbsdk.core.plan import Contraction, plan_contraction
from pbsdk.core.plan.contraction import widened_dtype
from pbsdk.core.spec import load_spec

SKYLAKE = load_spec("intel/xeon-avx512")  # AVX-512, no AVX512-BF16, no VNNI unit for bf16
ZEN4 = load_spec("amd/zen4")  # vdpbf16ps for bf16; nothing for f16


@pytest.mark.parametrize("spec, dtype, options, wide", [
    (SKYLAKE, "bf16", None, "f32"),
    (SKYLAKE, "f16", None, "f32"),
    (ZEN4, "bf16", None, None),  # its unit computes bf16
    (ZEN4, "f16", None, "f32"),
    (ZEN4, "bf16", {"matrix_units": False}, "f32"),  # the unit turned off: the FMAs on widened operands
    (SKYLAKE, "f32", None, None),
    (SKYLAKE, "i8", None, "f32"),  # no VNNI unit: i8 on the f32 FMAs, exact k blocks
    (ZEN4, "i8", None, None),  # vpdpbusd
    (load_spec("example/rvv-edge"), "f16", None, None),  # its vector unit computes f16 itself
    (load_spec("example/npu"), "f16", None, None),  # a matrix unit for it
])
def test_which_products_are_widened(spec: object, dtype: str, options: dict | None, wide: str | None) -> None:
    assert widened_dtype(spec, Contraction(256, 256, 256, dtype=dtype), options) == wide  # type: ignore[arg-type]


def test_a_widened_plan_is_the_accumulators_product_with_both_operands_packed() -> None:
    op = Contraction(512, 3072, 768, dtype="bf16")
    plan = plan_contraction(SKYLAKE, op)
    f32 = plan_contraction(SKYLAKE, Contraction(512, 3072, 768, dtype="f32"))
    assert plan.widened_to == "f32" and plan.op == op  # the plan is of the product asked for
    assert plan.compute == f32.compute and plan.levels == f32.levels  # ... tiled as the f32 product is
    assert plan.estimate == f32.estimate  # at the f32 FMAs' rate, not a sixteenth of the peak
    assert plan.blocking is not None and plan.blocking.pack_a and plan.blocking.pack_b
    assert plan.reasons[0].startswith("no matrix unit for bf16 and no bf16 arithmetic in the vector unit")
    assert plan_contraction(SKYLAKE, Contraction(512, 3072, 768, dtype="f32")).widened_to is None


def test_a_widened_i8_plan_keeps_its_k_blocks_exact() -> None:
    from pbsdk.core.plan.contraction import EXACT_I8_K

    assert EXACT_I8_K == 1024  # 1024 products of at most 2^14 each: within 2^24
    plan = plan_contraction(SKYLAKE, Contraction(512, 512, 4096, dtype="i8"))
    assert plan.widened_to == "f32" and plan.blocking is not None and plan.blocking.kc <= EXACT_I8_K
    assert "exactly" in plan.reasons[0]


def test_a_scratchpad_lowering_is_not_widened() -> None:
    """Widening is for the register-tile kernels (accumulators in registers): a target whose unit steps
    keep C in a scratchpad plans the product as it comes."""
    plan = plan_contraction(SKYLAKE, Contraction(256, 256, 256, dtype="bf16"), accumulator_in_registers=False)
    assert plan.widened_to is None
    assert plan_contraction(SKYLAKE, Contraction(256, 256, 256, dtype="bf16"), widen=False).widened_to is None


def test_explain_says_the_operands_are_widened() -> None:
    from pbsdk.core.plan.explain import format_plan

    text = format_plan("matmul", plan_contraction(SKYLAKE, Contraction(64, 64, 64, dtype="bf16")))
    assert "64x64x64 bf16->f32" in text and "(bf16 operands widened to f32 as they are packed)" in text
    assert "widened" not in format_plan("matmul", plan_contraction(ZEN4, Contraction(64, 64, 64, dtype="bf16")))
