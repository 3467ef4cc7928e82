"""Fused attention on nvgpu: the core's scratchpad kernel (`pbsdk.core.ir.attention_tiles`), mapped by nvgpu's
``schedule`` like every other staged kernel — emulated on the host against numpy (f16/bf16 on mma.sync,
f32 accumulation), PTX/cubin for sm_80 and sm_90 within the spec's resources, and — with a GPU (marker
``gpu``) — the kernel itself. nvgpu has no attention kernel of its own.

The modules come from `attention_cases.AttnCase.module_text`: ``ops.attention`` traced and emitted by the
core with nvgpu's options."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pbsdk.testing import assert_close, tolerance

sys.path.insert(0, str(Path(__file__).parent))
from attention_cases import AttnCase

EMULATED = [
    AttnCase(1, 2, 1, 1, 64, 64, "f16"),
    AttnCase(1, 2, 7, 7, 128, 128, "bf16"),
    AttnCase(1, 2, 128, 128, 64, 64, "f16", causal_offset=0),
    AttnCase(1, 1, 300, 300, 64, 64, "f16", causal_offset=0),
    AttnCase(2, 8, 33, 40, 64, 64, "f16", kv_heads=2),
    AttnCase(2, 4, 37, 29, 64, 64, "bf16", kv_heads=2, bshd=True),
    AttnCase(2, 3, 21, 45, 64, 64, "bf16", mask=True),
    AttnCase(1, 2, 50, 70, 40, 24, "f16"),
]


def _emulate_and_check(case: AttnCase, spec: str = "nvidia/h100", **options: Any) -> Any:
    from pbsdk.targets.nvgpu.emulate import emulate

    kernel = emulate(case.module_text(spec), spec=spec, options={"cache": False, **options})
    args = case.inputs()
    got = np.asarray(kernel(*args))
    expected = case.reference(*args)
    # f16 comes back as float16, bf16 widened to float32: compared at the operand dtype's tolerance
    tol = tolerance("attention", case.dtype, reduction_size=case.sk + case.d)
    assert_close(got, expected.astype(got.dtype), op="attention", tol=tol)
    return kernel


@pytest.mark.parametrize("case", EMULATED, ids=lambda c: c.name)
def test_emulated_attention_matches_numpy(case: AttnCase) -> None:
    spec = "nvidia/a100" if case.sq == 300 else "nvidia/h100"
    from pbsdk.core.spec import load_spec  # pydantic: not on the GPU machine, whose tests need no spec

    kernel = _emulate_and_check(case, spec)
    # one kernel, nothing unfused around it; both matmuls on the matrix unit, issued by warps
    (rec,) = kernel.kernels
    assert rec["kind"] == "attention" and rec["compute"] == "mma" and rec["unit_ops"] == 2
    assert rec["grid"][0] <= load_spec(spec).compute[0].count
    assert "#gpu.warp<linear_dim_0>" in kernel.scheduled and "pbsdk.attention" not in kernel.scheduled


def test_emulation_detects_a_lost_unit_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """A mapping bug (here: the warps skip every P·V step) must show up as a numerical failure."""
    from pbsdk.targets.nvgpu import schedule

    real = schedule._Mapper.to_warps
    seen: list[int] = []

    def lossy(self: Any, op: Any, block: Any) -> bool:
        seen.append(1)
        if len(seen) == 2:  # the second unit op of the kernel: O += P·V
            op.erase()
            return True
        return real(self, op, block)

    monkeypatch.setattr(schedule._Mapper, "to_warps", lossy)
    with pytest.raises(AssertionError):
        _emulate_and_check(AttnCase(1, 2, 64, 64, 64, 64, "f16"))


COMPILED = [
    AttnCase(1, 8, 1024, 1024, 64, 64, "f16", causal_offset=0),
    AttnCase(1, 8, 1024, 1024, 128, 128, "bf16"),
    AttnCase(2, 8, 333, 333, 64, 64, "f16", mask=True, kv_heads=2),
]


def _compile(case: AttnCase, spec: str) -> Any:
    from pbsdk.core.compiler import compile_text, resolve

    return compile_text(case.module_text(spec), resolve("nvgpu", spec, {"cache": False}))


@pytest.mark.parametrize("spec", ["nvidia/a100", "nvidia/h100"])
@pytest.mark.parametrize("case", COMPILED, ids=lambda c: c.name)
def test_attention_compiles_within_the_spec(spec: str, case: AttnCase) -> None:
    from pbsdk.core.spec import load_spec
    from pbsdk.targets.nvgpu.ptxas import find_ptxas
    from pbsdk.targets.nvgpu.runtime import read

    if find_ptxas() is None:
        pytest.skip("ptxas not available")
    header, blobs = read(_compile(case, spec).payload)
    chip = load_spec(spec)
    (launch,) = header["launches"]
    assert launch["grid"][0] <= chip.compute[0].count and np.prod(launch["block"]) <= 1024
    ptx = blobs["ptx"].decode()
    assert set(re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(\w+)\.", ptx)) == {case.dtype}
    (res,) = header["kernels"].values()
    assert res["spill_stores"] == 0 and res["shared_bytes"] <= chip.scratchpads()[0].size_bytes


@pytest.mark.parametrize("spec", ["a100", "h100"])
def test_jit_attention_compiles_to_a_cubin_with_mma(spec: str) -> None:
    import pbsdk
    from pbsdk import ops
    from pbsdk.core.compiler import compile_text
    from pbsdk.core.spec import load_spec
    from pbsdk.targets.nvgpu.ptxas import find_ptxas
    from pbsdk.targets.nvgpu.runtime import read

    if find_ptxas() is None:
        pytest.skip("ptxas not available")
    q = np.zeros((1, 8, 1024, 64), np.float16)
    jf = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v, causal=True), target="nvgpu", spec=spec,
                   options={"cache": False})
    text = jf.lower(q, q, q)
    assert "pbsdk.attention" in text
    header, blobs = read(compile_text(text, jf.request).payload)
    (launch,) = header["launches"]
    assert "mma.sync.aligned.m16n8k16" in blobs["ptx"].decode() and blobs["cubin"][:4] == b"\x7fELF"
    assert launch["grid"][0] == load_spec(spec).compute[0].count  # one block per SM, work items round-robin
    (res,) = header["kernels"].values()
    assert res["spill_stores"] == 0 and res["shared_bytes"] <= 49152


# --------------------------------------------------------------------------------------------- on a GPU

#: What the gpu-marked test runs (``scripts/gpu_check.py prepare`` writes their artifacts too).
GPU_CASES = (*COMPILED[:2], AttnCase(1, 1, 300, 300, 64, 64, "f16", causal_offset=0),
             AttnCase(2, 3, 21, 45, 64, 64, "bf16", mask=True),
             AttnCase(2, 4, 37, 29, 64, 64, "bf16", kv_heads=2, bshd=True),
             AttnCase(1, 2, 64, 64, 64, 64, "f16"))


def _gpu_artifact(case: AttnCase) -> bytes:
    directory = os.environ.get("PBSDK_GPU_ARTIFACTS")
    if directory:  # the GPU machine has no MLIR: artifacts prepared elsewhere
        path = Path(directory) / f"{case.name}.pbsdk"
        if not path.is_file():
            pytest.skip(f"{path} was not prepared")
        return path.read_bytes()
    pytest.importorskip("mlir")
    return _compile(case, os.environ.get("PBSDK_GPU_SPEC", "nvidia/h100")).payload  # type: ignore[no-any-return]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_attention_on_gpu_matches_numpy(case: AttnCase) -> None:
    from pbsdk.targets.nvgpu.emulate import from_bf16_bits, to_bf16_bits
    from pbsdk.targets.nvgpu.runtime import load

    kernel = load(_gpu_artifact(case))
    args = case.inputs()
    got = kernel(*[to_bf16_bits(a) if case.dtype == "bf16" else a for a in args])
    got = from_bf16_bits(got) if case.dtype == "bf16" else np.asarray(got)
    tol = tolerance("attention", case.dtype, reduction_size=case.sk + case.d)
    assert_close(got, case.reference(*args).astype(got.dtype), op="attention", tol=tol)


@pytest.mark.gpu
def test_attention_on_gpu_with_misaligned_torch_views() -> None:
    """A contiguous torch view that starts off a 16-byte boundary runs like an aligned one."""
    torch = pytest.importorskip("torch")
    from pbsdk.targets.nvgpu.runtime import load

    case = AttnCase(1, 2, 64, 64, 64, 64, "f16")
    kernel = load(_gpu_artifact(case))
    args = case.inputs()
    views = []
    for a in args:
        flat = torch.zeros(a.size + 1, dtype=torch.float16, device="cuda")
        flat[1:] = torch.from_numpy(a.reshape(-1)).cuda()
        views.append(flat[1:].view(a.shape))  # contiguous, 2 bytes past an aligned start
    got = kernel(*views).cpu().numpy()
    tol = tolerance("attention", "f16", reduction_size=case.sk + case.d)
    assert_close(got, case.reference(*args).astype(got.dtype), op="attention", tol=tol)
