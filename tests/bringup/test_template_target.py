"""The template target end to end: numerics vs numpy, counters, the matrix unit's precision, the
capacity error, and a broken hook caught by the conformance suite."""

from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest
from mlir import ir

import pbsdk
from pbsdk import ops
from pbsdk.conformance import generate_cases, run_cases
from pbsdk.core.errors import CompileError
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Executable
from pbsdk.targets.template import TemplateTarget
from pbsdk.targets.template import hooks as emulated
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

NO_CACHE = {"cache": False}


def _run(fn, *arrays, spec=None, **options):
    f = pbsdk.jit(fn, target="template", spec=spec, options={**NO_CACHE, **options})
    out = f(*arrays)
    kernel, _ = f.kernel(f.signatures[0])
    return out, kernel.executable


def _inputs(*shapes, dtype=np.float16, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


@pytest.mark.parametrize("shape", [(64, 64, 64), (33, 65, 40), (1, 7, 100)])
def test_f16_matmul_matches_numpy_and_counts_unit_ops(shape: tuple[int, int, int]) -> None:
    m, n, k = shape
    a, b = _inputs((m, k), (k, n))
    out, exe = _run(lambda x, y: x @ y, a, b)
    assert_close(out, ref.matmul(a, b), op="matmul", dtype="f16", reduction_size=k)
    (c,) = exe.resources["contractions"]
    assert c["unit"] == "mxu" and (c["m"], c["n"], c["k"]) == shape
    # The unit is issued once per 32x32x32 block of the padded problem (the outermost tile, rounded up).
    tm, tn, tk = c["tiles"]["sram"]
    padded = [-(-d // t) * t for d, t in zip(shape, (tm, tn, tk))]
    assert exe.last_counters["matrix_unit:mxu"] == (padded[0] // 32) * (padded[1] // 32) * (padded[2] // 32)


def test_counters_follow_the_bytes_each_level_moves() -> None:
    a, b = _inputs((64, 64), (64, 64))
    _, exe = _run(lambda x, y: x @ y, a, b)
    c = exe.last_counters
    (con,) = exe.resources["contractions"]
    assert con["tiles"]["sram"] == [64, 64, 64]  # the whole problem fits in sram: each operand moves once
    # A and B; the f32 accumulator starts as zeros in sram (the fill that initialises it is folded) and
    # goes out once.
    assert c["bytes:dram->sram"] == a.nbytes + b.nbytes
    assert c["bytes:sram->dram"] == 64 * 64 * 4
    assert c["bytes:sram->spm"] > 0 and c["bytes:spm->sram"] > 0
    # Counters are per run: a second run reports the same, not twice as much.
    f = pbsdk.jit(lambda x, y: x @ y, target="template", options=NO_CACHE)
    f(a, b)
    exe2 = f.kernel(f.signatures[0])[0].executable
    first = dict(exe2.last_counters)
    f(a, b)
    assert exe2.last_counters == first


@pytest.mark.parametrize("shape", [(64, 64, 96), (70, 50, 100)])
def test_folded_fill_with_k_steps_at_the_outer_level(shape: tuple[int, int, int]) -> None:
    """sram tiles of k 32: C starts as zeros at the first k step and reads back its partial sums at the
    later ones (edges zero-padded where m, n or k is not a multiple of the tile)."""
    m, n, k = shape
    a, b = _inputs((m, k), (k, n))
    out, exe = _run(lambda x, y: x @ y, a, b, tiles={"sram": [64, 64, 32], "spm": [32, 32, 32]})
    assert_close(out, ref.matmul(a, b), op="matmul", dtype="f16", reduction_size=k)
    (c,) = exe.resources["contractions"]
    assert c["tiles"]["sram"][2] == 32
    if shape == (64, 64, 96):  # one sram tile of C, three k steps: C comes in for the last two only
        assert exe.last_counters["bytes:dram->sram"] == a.nbytes + b.nbytes + 2 * m * n * 4


def _bf16(x: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even f32 -> bf16 -> f32 (what arith.truncf does)."""
    bits = x.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded.astype(np.uint32).view(np.float32)


def test_the_unit_rounds_operands_to_its_dtype() -> None:
    """With the mixed precision policy an f32 matmul runs on the bf16 unit: operands are rounded to bf16,
    products accumulated in f32 — the result is numpy on bf16-rounded inputs, not exact f32."""
    a, b = _inputs((32, 64), (64, 32), dtype=np.float32, seed=3)
    out, exe = _run(lambda x, y: x @ y, a, b, matmul_precision="mixed")
    assert exe.resources["contractions"][0]["unit"] == "mxu" and exe.last_counters["matrix_unit:mxu"] == 2
    rounded = _bf16(a).astype(np.float64) @ _bf16(b).astype(np.float64)
    np.testing.assert_allclose(out, rounded, rtol=1e-5, atol=1e-5)
    assert np.abs(out - a.astype(np.float64) @ b.astype(np.float64)).max() > 1e-3  # it did round


def test_f32_without_a_unit_is_staged_but_not_unit_mapped() -> None:
    a, b = _inputs((40, 24), (24, 56), dtype=np.float32)
    out, exe = _run(lambda x, y: x @ y, a, b)
    assert_close(out, ref.matmul(a, b), op="matmul", dtype="f32", reduction_size=24)
    assert exe.resources["contractions"][0]["compute"] == "vector-fma"
    assert not any(k.startswith("matrix_unit:") for k in exe.last_counters)
    assert exe.last_counters["bytes:dram->sram"] >= a.nbytes + b.nbytes


def test_an_overflowing_tile_is_a_compile_error_naming_buffer_and_level() -> None:
    a, b = _inputs((256, 256), (256, 256))
    with pytest.raises(CompileError) as err:
        _run(lambda x, y: x @ y, a, b, tiles={"spm": (256, 256, 256)})
    assert err.value.stage == "promote" and "C_spm" in str(err.value) and "'spm'" in str(err.value)


def test_elementwise_and_attention_run_through_the_host_lowering() -> None:
    q, k, v = _inputs((2, 35, 16), (2, 35, 16), (2, 35, 16), dtype=np.float32)
    def attention(q, k, v):
        return ops.softmax(ops.matmul(q, k, transpose_b=True), axis=-1) @ v

    expected = ref.matmul(ref.softmax(ref.matmul(q, k, transpose_b=True), axis=-1), v)
    out, exe = _run(attention, q, k, v, fuse_attention=False)
    assert_close(out, expected, op="softmax", dtype="f32", reduction_size=35)
    assert len(exe.resources["contractions"]) == 2  # QK^T (B read transposed) and PV are both staged
    # Fused (the default): one scratchpad kernel; only the output leaves the scratchpad.
    out, exe = _run(attention, q, k, v)
    assert_close(out, expected, op="softmax", dtype="f32", reduction_size=35)
    assert not exe.resources["contractions"] and exe.last_counters["bytes:spm->dram"] == out.nbytes


def test_the_second_spec_uses_its_own_unit_and_scratchpad(tiny: ChipSpec) -> None:
    a, b = _inputs((17, 33), (33, 20), dtype=np.float32)
    out, exe = _run(lambda x, y: x @ y, a, b, spec=tiny)
    assert_close(out, ref.matmul(a, b), op="matmul", dtype="f32", reduction_size=33)
    assert set(exe.resources["scratchpad_bytes"]) == {"tcm"}
    assert exe.last_counters["matrix_unit:mac8"] > 0


# --------------------------------------------------------------------------- broken hooks are caught


def _transposed_unit(op: emulated.UnitOp, a, b, c, spec: ChipSpec) -> None:
    """A wrong emulation: B read transposed inside the unit (its map's results swapped)."""
    a_map, b_map, c_map = op.indexing_maps
    swapped = ir.AffineMap.get(b_map.n_dims, b_map.n_symbols, list(reversed(list(b_map.results))))
    emulated.matrix_unit_op(dataclasses.replace(op, indexing_maps=(a_map, swapped, c_map)), a, b, c, spec)


class TransposedUnitTarget(TemplateTarget):
    name = "transposed_unit_test"
    hooks = types.SimpleNamespace(matrix_unit_op=_transposed_unit)


class SilentUnitTarget(TemplateTarget):
    """Correct results, but the unit op does not count: as if the unit were never used."""

    name = "silent_unit_test"
    hooks = types.SimpleNamespace(matrix_unit_op=lambda op, a, b, c, spec: emulated.matrix_unit_op(
        dataclasses.replace(op, count=lambda value=1: None), a, b, c, spec))


def test_a_transposed_unit_emulation_fails_conformance_case_by_case(npu: ChipSpec) -> None:
    cases = [c for c in generate_cases(npu, ops_filter=["matmul"]) if c.dtype == "f16" and not c.skip][:3]
    results = run_cases(cases, target=TransposedUnitTarget(), spec=npu)  # type: ignore[arg-type]
    assert [r.status for r in results] == ["fail"] * 3
    assert all(r.max_abs_error is not None and r.max_abs_error > 0.1 for r in results)


def test_a_unit_that_is_never_issued_fails_the_resource_check(npu: ChipSpec) -> None:
    case = next(c for c in generate_cases(npu, ops_filter=["matmul"]) if c.dtype == "f16")
    assert case.matrix_unit == "mxu"
    (result,) = run_cases([case], target=SilentUnitTarget(), spec=npu)  # type: ignore[arg-type]
    assert result.status == "fail" and "should have used matrix unit mxu" in result.message
    (ok,) = run_cases([case], target="template", spec=npu)
    assert ok.status == "pass" and ok.resource_check == "ok" and ok.resources["matrix_unit_ops"]["mxu"] >= 1


class _Quiet(Executable):
    """Runs the template's code but reports neither resources nor counters (like most targets)."""

    def __init__(self, inner: Executable) -> None:
        self.inner = inner

    def run(self, buffers) -> None:
        self.inner.run(buffers)


class QuietTarget(TemplateTarget):
    name = "quiet_test"

    def load(self, artifact, spec):
        return _Quiet(super().load(artifact, spec))


def test_a_target_without_resource_reports_is_not_reported(npu: ChipSpec) -> None:
    case = next(c for c in generate_cases(npu, ops_filter=["matmul"]) if c.dtype == "f16")
    (result,) = run_cases([case], target=QuietTarget(), spec=npu)  # type: ignore[arg-type]
    assert result.status == "pass" and result.resource_check == "not reported" and result.resources is None


def test_stages_are_listed() -> None:
    from pbsdk.cli import main

    assert main(["compile", "-", "--target", "template", "--list-stages"]) == 0
