"""The core's promote pass: decisions checked without IR, then the IR it writes."""

from __future__ import annotations

import pytest
from bringup_helpers import with_scratchpad

from pbsdk.core.errors import CompileError
from pbsdk.core.passes.promote import ContractionOp, promotion_for
from pbsdk.core.spec import ChipSpec

# C[m, n] += A[m, k] * B[k, n]: loops (m, n, k)
MATMUL_MAPS = ((0, 2), (2, 1), (0, 1))


def matmul(m: int, n: int, k: int, dtype: str = "f16", acc: str = "f32") -> ContractionOp:
    return ContractionOp((m, n, k), ("m", "n", "k"), MATMUL_MAPS, (dtype, dtype, acc))


def test_levels_nest_and_buffers_follow_the_plan(npu: ChipSpec) -> None:
    p = promotion_for(npu, matmul(129, 65, 257), function="f", options={})
    assert [lv for lv, _ in p.levels] == ["sram", "spm"]  # outermost promoted level first
    assert p.uses_matrix_unit and p.plan.compute.name == "mxu"
    (_, outer), (_, inner) = p.levels
    for o, i, u in zip(outer, inner, (32, 32, 32)):
        assert i % u == 0 and o % i == 0  # every tile holds whole tiles of the level inside it
    names = {b.name: b for b in p.buffers}
    assert set(names) == {"A_sram", "B_sram", "C_sram", "A_spm", "B_spm", "C_spm"}
    assert names["A_spm"].shape == (inner[0], inner[2]) and names["A_spm"].dtype == "f16"
    assert names["C_spm"].dtype == "f32" and names["C_spm"].space == 2 and names["A_sram"].space == 1
    assert names["A_spm"].alignment == 64
    used = p.bytes_per_level()
    assert used["spm"] == sum(b.bytes for b in p.buffers if b.level == "spm") <= 262144


def test_transposed_and_batched_operands_keep_their_layout(npu: ChipSpec) -> None:
    # loops (b, m, n, k); B read as [b, n, k] (transposed), A broadcast over the batch ([0, m, k])
    op = ContractionOp((3, 40, 24, 64), ("batch", "m", "n", "k"), ((-1, 1, 3), (0, 2, 3), (0, 1, 2)),
                       ("f16", "f16", "f32"))
    p = promotion_for(npu, op, function="f", options={})
    b_spm = next(b for b in p.buffers if b.name == "B_spm")
    a_spm = next(b for b in p.buffers if b.name == "A_spm")
    inner = dict(p.levels)["spm"]
    assert b_spm.shape == (1, inner[2], inner[3])  # batch tile 1, then n, then k
    assert a_spm.shape == (1, inner[1], inner[3])


def test_an_overflowing_scratchpad_names_the_buffer_and_the_level(npu: ChipSpec) -> None:
    with pytest.raises(CompileError) as err:
        promotion_for(npu, matmul(512, 512, 512), function="f", options={}, tiles={"spm": (256, 256, 256)})
    msg = str(err.value)
    assert "C_spm" in msg and "'spm'" in msg and "262144 B" in msg  # 128 + 128 KiB of A, B; C does not fit


def test_a_scratchpad_smaller_than_one_unit_tile_is_a_compile_error(npu: ChipSpec) -> None:
    small = with_scratchpad(npu, "spm", 4096)  # one 32x32 f16 tile is 2 KiB: A and B fit, C (4 KiB) does not
    with pytest.raises(CompileError, match=r"buffer C_spm does not fit in level 'spm'.*capacity is 4096 B"):
        promotion_for(small, matmul(64, 64, 64), function="f", options={})


def test_opt_in_capacity_is_used_unless_refused(npu: ChipSpec) -> None:
    data = npu.model_dump()
    spm = next(m for m in data["memory"] if m["name"] == "spm")
    spm["size_bytes"], spm["max_size_bytes"] = 4096, 262144
    spec = type(npu).model_validate(data)
    promotion_for(spec, matmul(64, 64, 64), function="f", options={}, tiles={"spm": (32, 32, 32)})
    with pytest.raises(CompileError, match="'spm'"):
        promotion_for(spec, matmul(64, 64, 64), function="f", options={"optin_scratchpad": False},
                      tiles={"spm": (32, 32, 32)})


def test_tiles_are_rounded_up_to_whole_inner_tiles(npu: ChipSpec) -> None:
    p = promotion_for(npu, matmul(100, 100, 100), function="f", options={}, tiles={"spm": (40, 32, 32)})
    assert dict(p.levels)["spm"][0] == 64 and any("rounded up" in n for n in p.notes)


def test_f32_without_a_unit_is_promoted_but_not_unit_mapped(npu: ChipSpec) -> None:
    p = promotion_for(npu, matmul(64, 64, 64, "f32", "f32"), function="f", options={})
    assert not p.uses_matrix_unit and p.plan.compute.kind == "vector-fma"
    assert p.bytes_per_level()["spm"] > 0


# ------------------------------------------------------------------------------------------------ IR

F16_MATMUL = """
func.func @main(%a: memref<33x40xf16>, %b: memref<40x65xf16>, %c: memref<33x65xf32>) {
  linalg.matmul ins(%a, %b : memref<33x40xf16>, memref<40x65xf16>) outs(%c : memref<33x65xf32>)
  return
}
"""


def _promote(text: str, spec: ChipSpec, **options):
    from mlir import ir

    from pbsdk.core.passes.promote import PromoteToScratchpad
    from pbsdk.core.pipeline import StageContext

    ctx = StageContext(spec, options)
    module = ir.Module.parse(text, ir.Context())
    PromoteToScratchpad().apply(module, ctx)
    module.operation.verify()
    return str(module), ctx.notes["promote"]


def test_ir_allocates_per_level_copies_explicitly_and_computes_at_the_unit_shape(npu: ChipSpec) -> None:
    text, (promo,) = _promote(F16_MATMUL, npu)
    assert "call @__pbsdk_promoted_0(" in text and "linalg.matmul" not in text
    # One buffer per operand and level, in that level's memory space (sram = 1, spm = 2).
    for b in promo.buffers:
        shape = "x".join(map(str, b.shape))
        assert f"memref.alloc() {{alignment = 64 : i64}} : memref<{shape}x{b.dtype}, {b.space}>" in text
    for direction in ("dram->sram", "sram->spm", "spm->sram", "sram->dram"):
        assert f'pbsdk.dma = "{direction}"' in text
    assert "linalg.fill" in text  # the partial edge tiles (33, 65, 40 are not multiples) are zero-padded
    units = [ln for ln in text.splitlines() if "pbsdk.matrix_unit" in ln]
    assert units and all("memref<32x32xf16" in ln and "memref<32x32xf32" in ln for ln in units)
    assert all('pbsdk.unit_operand = "f16"' in ln for ln in units)


def test_ir_leaves_what_is_not_a_contraction_alone(npu: ChipSpec) -> None:
    text, promos = _promote("""
func.func @main(%a: memref<8x8xf32>, %c: memref<8x8xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i, j)>],
                  iterator_types = ["parallel", "parallel"]} ins(%a : memref<8x8xf32>) outs(%c : memref<8x8xf32>) {
  ^bb0(%x: f32, %y: f32):
    %e = math.exp %x : f32
    linalg.yield %e : f32
  }
  return
}""", npu)
    assert promos == [] and "memref.alloc" not in text and "math.exp" in text


def test_ir_a_generic_that_only_looks_like_a_contraction_is_not_promoted(npu: ChipSpec) -> None:
    # out * a + b: one mulf and one addf with matmul-like maps, but not a multiply-accumulate.
    text, promos = _promote("""
func.func @main(%a: memref<64x64xf32>, %b: memref<64x64xf32>, %c: memref<64x64xf32>) {
  linalg.generic {indexing_maps = [affine_map<(i, j, k) -> (i, k)>, affine_map<(i, j, k) -> (k, j)>,
                                   affine_map<(i, j, k) -> (i, j)>],
                  iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%a, %b : memref<64x64xf32>, memref<64x64xf32>) outs(%c : memref<64x64xf32>) {
  ^bb0(%x: f32, %y: f32, %acc: f32):
    %p = arith.mulf %acc, %x : f32
    %s = arith.addf %p, %y : f32
    linalg.yield %s : f32
  }
  return
}""", npu)
    assert promos == [] and "memref.alloc" not in text
