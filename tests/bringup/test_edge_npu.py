"""One tiled form for every op family: on a single-core edge NPU whose only on-chip memory is a 64 KiB
scratchpad, every conformance case moves its operands through the scratchpad (``promote`` for
contractions, ``promote-vector`` for the rest), within capacity, and f16 convolutions use the matrix unit."""

from __future__ import annotations

import pytest
from bringup_helpers import DATA, with_scratchpad

from pbsdk.conformance import generate_cases, run_cases
from pbsdk.conformance.runner import check_resources
from pbsdk.core.errors import CompileError
from pbsdk.core.spec import ChipSpec, load_spec

EDGE_SPEC = DATA / "edge_npu.yaml"


@pytest.fixture(scope="module")
def edge() -> ChipSpec:
    return load_spec(EDGE_SPEC)


def test_every_case_passes_through_the_scratchpad(edge: ChipSpec) -> None:
    cases = generate_cases(edge)
    assert {c.name.split("/")[0] for c in cases} >= {"matmul", "conv2d", "elementwise", "reduction", "softmax",
                                                    "layernorm", "attention"}
    wide = [c.name for c in cases if "wide-spm" in c.name]
    assert len(wide) == 6  # softmax, layernorm, sum over rows wider than 64 KiB, in f32 and f16
    results = run_cases(cases, target="template", spec=edge)
    bad = [f"{r.name}: {r.status} {r.message[:300]}" for r in results if r.status != "pass"]
    assert not bad, "\n".join(bad)
    for r in results:
        assert r.resource_check == "ok", r.name
        counters = r.resources["counters"]
        assert counters.get("bytes:dram->spm", 0) > 0, (r.name, counters)
        assert 0 < r.resources["scratchpad_bytes"]["spm"] <= 65536, r.name  # fused attention's buffers too
    convs = {r.name: r.resources["matrix_unit_ops"] for r in results if r.name.startswith("conv2d/f16/")}
    assert len(convs) == 7
    for name, units in convs.items():
        if "depthwise" in name:  # a reduction over the kernel taps alone: vector work
            assert not units.get("mac16"), name
        else:
            assert units.get("mac16", 0) > 0, (name, units)


def test_a_case_that_stays_in_main_memory_fails_the_resource_check(edge: ChipSpec) -> None:
    case = next(c for c in generate_cases(edge, ops_filter=["softmax"]))
    on_dram = {"scratchpad_bytes": {}, "counters": {"bytes:dram->dram": 64}, "matrix_unit_ops": {}}
    assert "no bytes moved from dram into a scratchpad" in check_resources(case, edge, on_dram)
    staged = {"scratchpad_bytes": {"spm": 1024}, "counters": {"bytes:dram->spm": 64}, "matrix_unit_ops": {}}
    assert check_resources(case, edge, staged) == "ok"
    assert check_resources(case, edge, {"scratchpad_bytes": {}}) == "ok"  # no run-time counters: not judged


# ------------------------------------------------------------------------------------------------ IR

WIDE_SUM = """
func.func @main(%x: memref<3x20000xf32>, %y: memref<3xf32>) {
  %zero = arith.constant 0.0 : f32
  linalg.fill ins(%zero : f32) outs(%y : memref<3xf32>)
  linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                  iterator_types = ["parallel", "reduction"]} ins(%x : memref<3x20000xf32>) outs(%y : memref<3xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  }
  return
}
"""


def _stage(text: str, spec: ChipSpec):
    from mlir import ir

    from pbsdk.core.passes.promote import PromoteToScratchpad
    from pbsdk.core.passes.promote_vector import PromoteVectorOps
    from pbsdk.core.pipeline import StageContext

    ctx = StageContext(spec, {})
    module = ir.Module.parse(text, ir.Context())
    PromoteToScratchpad().apply(module, ctx)
    PromoteVectorOps().apply(module, ctx)
    module.operation.verify()
    return str(module), ctx.notes["promote_vector"]


def test_ir_a_row_wider_than_the_scratchpad_streams_through_its_accumulator(edge: ChipSpec) -> None:
    text, (staged,) = _stage(WIDE_SUM, edge)
    assert staged.kind == "reduction" and staged.folded_fill and staged.plan.chunked
    chunk = staged.plan.tile[1]
    lines = text.splitlines()
    # The fill of the accumulator happens in the scratchpad (space 1), not in main memory.
    assert any("linalg.fill" in ln and 'pbsdk.compute = "vector"' in ln and "memref<1xf32, 1>" in ln for ln in lines)
    assert not any("linalg.fill" in ln and ", 1>" not in ln for ln in lines)
    # rows, then chunks of the row: the input chunk moves inside the inner loop, the sum comes out once a row
    loops = [i for i, ln in enumerate(lines) if "scf.for" in ln]
    assert len(loops) == 2 and f"step %c{chunk}" in lines[loops[1]].replace("_", "")
    dma_in = [i for i, ln in enumerate(lines) if 'pbsdk.dma = "dram->spm"' in ln]
    dma_out = [i for i, ln in enumerate(lines) if 'pbsdk.dma = "spm->dram"' in ln]
    assert len(dma_in) == 1 and dma_in[0] > loops[1] and len(dma_out) == 1
    assert "affine.min" in text  # 20000 is not a multiple of the chunk: a dynamic-size edge chunk
    compute = [ln for ln in lines if "linalg.generic" in ln]
    assert len(compute) == 1 and 'pbsdk.compute = "vector"' in text


def test_ir_a_scratchpad_too_small_is_a_compile_error_naming_buffer_and_level(edge: ChipSpec) -> None:
    small = with_scratchpad(edge, "spm", 4)  # the input element fits, the accumulator's does not
    with pytest.raises(CompileError, match=r"buffer y0_spm does not fit in level 'spm'.*capacity is 4 B"):
        _stage(WIDE_SUM, small)
