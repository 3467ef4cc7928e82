"""Emulated execution of the GPU schedule on the host: the tiled, shared-memory-staged, warp/thread-mapped IR
(before any GPU-specific lowering), its parallel loops serialised, checked against numpy."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from pbsdk.testing import assert_close, tolerance

sys.path.insert(0, str(Path(__file__).parent))
from gpu_cases import CASES, GpuCase, matmul_case

NUMPY = {"f16": np.float16, "f32": np.float32, "f64": np.float64}


def _inputs(case: GpuCase, seed: int = 0) -> list[np.ndarray]:
    from pbsdk.targets.nvgpu.emulate import round_bf16

    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in case.types:
        x = rng.standard_normal(shape).astype(np.float32)
        out.append(round_bf16(x) if dtype == "bf16" else x.astype(NUMPY[dtype]))
    return out


def _check(case: GpuCase, spec: str, **options: object) -> None:
    from pbsdk.targets.nvgpu.emulate import emulate

    kernel = emulate(case.text(), spec=spec, options={"cache": False, **options})
    args = _inputs(case)
    got = np.asarray(kernel(*args))
    expected = np.asarray(case.reference(*args))
    dtype = case.types[0][1]
    # bf16 results come back widened to float32; compare them at bf16's tolerance
    tol = tolerance(case.op, dtype, reduction_size=case.reduction)
    assert_close(got, expected.astype(got.dtype), op=case.op, tol=tol)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_emulated_schedule_matches_numpy(case: GpuCase) -> None:
    _check(case, "nvidia/a100")


def test_emulation_runs_the_scheduled_ir() -> None:
    from pbsdk.targets.nvgpu.emulate import emulate

    case = matmul_case(40, 24, 48, "f16")
    kernel = emulate(case.text(), spec="h100", options={"cache": False})
    assert "#gpu.address_space<workgroup>" in kernel.scheduled and "pbsdk.matrix_unit" in kernel.scheduled
    assert "#gpu.warp<linear_dim_0>" in kernel.scheduled
    (mm,) = [k for k in kernel.kernels if k["unit_ops"]]
    assert mm["kind"] == "tiled" and mm["compute"] == "mma"


@pytest.mark.parametrize("shape", [(16, 8, 16), (17, 9, 33), (130, 66, 20)])
def test_emulated_mma_tiling_at_edges(shape: tuple[int, int, int]) -> None:
    _check(matmul_case(*shape, "f16"), "nvidia/h100")


def test_emulated_thread_path_without_matrix_units() -> None:
    _check(matmul_case(70, 45, 38, "f16"), "nvidia/a100", matrix_units=False)


def test_emulation_detects_a_wrong_schedule(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapping bug (here: the warps' share of the unit steps leaves out the last accumulator tile)
    must show up as a numerical failure."""
    from pbsdk.targets.nvgpu import schedule

    real = schedule._Mapper.spread_over_warps

    def short(self: object, call: object, c_values: object, block: object) -> None:
        real(self, call, c_values, block)  # type: ignore[arg-type]
        for op in schedule.ops_named(self.module, "scf.for"):  # type: ignore[attr-defined]
            ub = op.operands[1]
            if not isinstance(ub.owner, schedule.ir.Block) and ub.owner.name == "arith.constant" and \
                    op.parent.name == "scf.forall" and "#gpu.warp" in str(op.parent.attributes["mapping"]):
                with schedule.ir.InsertionPoint(op), op.location:
                    one = schedule.arith.constant(schedule.ir.IndexType.get(), 1)
                    op.operands[1] = schedule.arith.subi(ub, one)

    monkeypatch.setattr(schedule._Mapper, "spread_over_warps", short)
    with pytest.raises(AssertionError):
        _check(matmul_case(32, 16, 64, "f16"), "nvidia/a100")
