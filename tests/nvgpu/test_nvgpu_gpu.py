"""nvgpu kernels on a real GPU (marker ``gpu``; skipped without one).

Artifacts come from ``PBSDK_GPU_ARTIFACTS`` (a directory written by ``scripts/gpu_check.sh prepare``) when
set — the GPU machine has no MLIR — and are compiled here otherwise. Needs numpy; torch for the zero-copy
test."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from gpu_cases import CASES, GpuCase

pytestmark = pytest.mark.gpu


def _artifact(case: GpuCase) -> bytes:
    directory = os.environ.get("PBSDK_GPU_ARTIFACTS")
    if directory:
        path = Path(directory) / f"{case.name}.pbsdk"
        if not path.is_file():
            pytest.skip(f"{path} was not prepared")
        return path.read_bytes()
    pytest.importorskip("mlir")
    from pbsdk.core.compiler import compile_text, resolve

    return compile_text(case.text(), resolve("nvgpu", os.environ.get("PBSDK_GPU_SPEC", "nvidia/h100"),
                                             {"cache": False})).payload  # type: ignore[no-any-return]


def _inputs(case: GpuCase) -> list[np.ndarray]:
    from pbsdk.targets.nvgpu.emulate import round_bf16

    rng = np.random.default_rng(0)
    out = []
    for shape, dtype in case.types:
        x = rng.standard_normal(shape).astype(np.float32)
        out.append(round_bf16(x) if dtype == "bf16" else x.astype({"f16": np.float16, "f32": np.float32}[dtype]))
    return out


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_on_gpu_matches_numpy(case: GpuCase) -> None:
    from pbsdk.targets.nvgpu.emulate import from_bf16_bits, to_bf16_bits
    from pbsdk.targets.nvgpu.runtime import load
    from pbsdk.testing import assert_close, tolerance

    kernel = load(_artifact(case))
    args = _inputs(case)
    host = [to_bf16_bits(a) if d == "bf16" else a for a, (_, d) in zip(args, case.types)]
    got: Any = kernel(*host)
    if kernel.outputs[0][1] == "bf16":
        got = from_bf16_bits(got)
    expected = np.asarray(case.reference(*args))
    tol = tolerance(case.op, case.types[0][1], reduction_size=case.reduction)
    assert_close(np.asarray(got), expected.astype(np.asarray(got).dtype), op=case.op, tol=tol)


def test_torch_tensors_without_copies() -> None:
    torch = pytest.importorskip("torch")
    from pbsdk.targets.nvgpu.runtime import load
    from pbsdk.testing import assert_close, tolerance

    case = next(c for c in CASES if c.name == "matmul_bf16_64x64x64")
    kernel = load(_artifact(case))
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    c = kernel(a, b)
    assert c.is_cuda and c.dtype == torch.bfloat16 and tuple(c.shape) == (64, 64)
    expected = (a.double() @ b.double()).cpu().numpy()
    assert_close(c.float().cpu().numpy(), expected.astype(np.float32), op="matmul",
                 tol=tolerance("matmul", "bf16", reduction_size=64))


def test_wrong_shape_is_an_argument_error() -> None:
    from pbsdk.core.errors import ArgumentError
    from pbsdk.targets.nvgpu.runtime import load

    kernel = load(_artifact(CASES[0]))
    with pytest.raises(ArgumentError, match="shape"):
        kernel(np.zeros((3, 3), np.float16), np.zeros((3, 3), np.float16))
