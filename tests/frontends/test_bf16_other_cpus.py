"""bf16 models compiled for CPUs whose LLVM back end cannot legalise bf16 arithmetic (AVX512-FP16: Sapphire
Rapids) never abort the process: the cpu lowering keeps bf16 arithmetic out of LLVM IR there, and what still
reaches the back end is a `CompileError` naming the instruction (the torch frontend then falls back).

Code for another CPU is generated and linked, never run: the machine running the tests may lack its
instructions. The compilation runs in a subprocess, so an abort fails the test instead of killing pytest."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from pbsdk.core.errors import CompileError
from pbsdk.core.spec import load_spec

#: The bf16 ResNet-18 of issue 30 (it aborted in LLVM on an AMX Xeon), compiled by torch.compile for the
#: intel/xeon-amx preset; loading stops after the machine code is made (jit_cached) and the partition then
#: runs in torch.
_SCRIPT = textwrap.dedent("""
    import logging, sys, torch
    from pbsdk.core.errors import DeviceUnavailableError
    from pbsdk.targets import cpu
    from pbsdk.testing.torchvision import import_torchvision

    made = []

    def load(self, artifact, spec):
        try:  # LLVM's optimiser and back end run here; nothing is called
            cpu.CpuExecutable(artifact, spec)
        except DeviceUnavailableError:  # AMX code, on a host without AMX: refused after its machine code is made
            pass
        made.append(artifact.entry)
        raise DeviceUnavailableError(f"code for {spec.name} is not run on this host")

    cpu.CpuTarget.load = load
    tv = import_torchvision()
    torch.manual_seed(0)
    model = tv.models.resnet18().eval().to(torch.bfloat16)
    x = torch.randn(1, 3, 64, 64).to(torch.bfloat16)
    with torch.no_grad():
        want = model(x)
        got = torch.compile(model, backend="pbsdk", options={"target": "cpu", "spec": "intel/xeon-amx"})(x)
    assert torch.equal(got, want), "the fallback runs torch"
    print("machine code made for", len(made), "partition(s)")
""")


def test_bf16_resnet18_for_an_amx_xeon_does_not_abort() -> None:
    proc = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "machine code made for 1 partition(s)" in proc.stdout, proc.stdout + proc.stderr[-2000:]


_BF16_FADD = """
define void @f(ptr %p, ptr %q) {
  %a = load <4 x bfloat>, ptr %p
  %b = load <4 x bfloat>, ptr %q
  %s = fadd <4 x bfloat> %a, %b
  store <4 x bfloat> %s, ptr %p
  ret void
}
"""


def test_bf16_arithmetic_for_avx512fp16_is_a_compile_error() -> None:
    from pbsdk.targets.cpu import expands_bf16, jit_in_process, parse_llvm_ir, target_machine
    from pbsdk.targets.cpu.llvm_worker import illegal_bf16

    spec = load_spec("intel/xeon-amx")
    features = spec.codegen["features"]
    assert expands_bf16(features)  # the lowering keeps bf16 arithmetic out of the IR there
    assert not expands_bf16(load_spec("amd/zen4").codegen["features"])  # converts bf16 and can legalise
    assert expands_bf16(load_spec("intel/xeon-avx512").codegen["features"])  # no conversion instruction
    mod = parse_llvm_ir(_BF16_FADD)
    assert "fadd <4 x bfloat>" in (illegal_bf16(mod, features) or "")
    maxnum = parse_llvm_ir(_BF16_FADD.replace("fadd <4 x bfloat> %a, %b", "tail call <4 x bfloat> @llvm.maxnum.v4bf16("
                                              "<4 x bfloat> %a, <4 x bfloat> %b)")
                           + "declare <4 x bfloat> @llvm.maxnum.v4bf16(<4 x bfloat>, <4 x bfloat>)\n")
    assert "@llvm.maxnum.v4bf16(" in (illegal_bf16(maxnum, features) or "") and "(in @f)" in illegal_bf16(maxnum, features)
    plain = parse_llvm_ir(_BF16_FADD.replace("fadd <4 x bfloat> %a, %b", "shufflevector <4 x bfloat> %a, <4 x bfloat> %b, "
                                             "<4 x i32> <i32 0, i32 5, i32 2, i32 7>"))
    assert illegal_bf16(plain, features) is None  # moving bf16 values is legal
    assert illegal_bf16(mod, load_spec("amd/zen4").codegen["features"]) is None
    with pytest.raises(CompileError, match=r"cannot legalise: .*fadd <4 x bfloat>.*\(in @f\)"):
        jit_in_process(parse_llvm_ir(_BF16_FADD), target_machine(spec), "f", features=features)
