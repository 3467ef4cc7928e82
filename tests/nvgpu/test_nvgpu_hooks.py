"""nvgpu's part of the hook contract (`pbsdk.core.hooks`): it implements ``unit_step`` (one mma.sync on a
lane's fragments, `pbsdk.targets.nvgpu.hooks`), which a subclass's ``hooks`` replaces; discovering it and
checking its hooks needs no MLIR."""

from __future__ import annotations

import subprocess
import sys
import types
from pathlib import Path
from typing import Any

from mlir import ir

from pbsdk.core.compiler import compile_text, resolve
from pbsdk.core.hooks import UnitStep
from pbsdk.core.spec import ChipSpec
from pbsdk.targets.nvgpu import NvgpuTarget
from pbsdk.targets.nvgpu import hooks as nvgpu_hooks

sys.path.insert(0, str(Path(__file__).parent))
from gpu_cases import matmul_case


def test_nvgpu_implements_unit_step() -> None:
    assert NvgpuTarget.hooks is nvgpu_hooks
    assert NvgpuTarget.implemented_hooks() == {"unit_step"}


def test_a_subclass_replaces_the_unit_step() -> None:
    """A plugin's ``unit_step`` gets each 16x8x16 instruction's description and the lane's fragments; here
    it delegates to nvgpu's, so the PTX still issues mma.sync."""
    seen: list[tuple[str, str, str, str, str]] = []

    def unit_step(step: UnitStep, acc: ir.Value, a: ir.Value, b: ir.Value, spec: ChipSpec) -> ir.Value:
        seen.append((step.unit.name, step.unit.operand_dtype, str(step.acc_type), str(step.a_type), str(step.b_type)))
        assert (acc.type, a.type, b.type) == (step.acc_type, step.a_type, step.b_type)
        return nvgpu_hooks.unit_step(step, acc, a, b, spec)

    cls: type[NvgpuTarget] = type("SpyTarget", (NvgpuTarget,), {"name": "spy_nvgpu",
                                                                "hooks": types.SimpleNamespace(unit_step=unit_step)})
    request = resolve(cls(), "nvidia/a100", {"cache": False})
    ptx: Any = compile_text(matmul_case(64, 32, 48, "bf16").text(), request, stop_after="ptx")
    assert "mma.sync.aligned.m16n8k16" in str(ptx)
    assert seen and set(seen) == {("mma.sync.m16n8k16", "bf16", "vector<4xf32>", "vector<8xbf16>", "vector<4xbf16>")}


def test_discovering_nvgpu_and_checking_its_hooks_needs_no_mlir() -> None:
    # nvgpu's entry point alone (the cpu target imports MLIR): what the MLIR-free loader needs discovered
    code = ("import sys, importlib.metadata as md; from pbsdk.core.target import discover; "
            "[info] = discover(entry_points=lambda: [e for e in md.entry_points(group='pbsdk.targets') "
            "if e.name == 'nvgpu']); assert info.cls is not None, info.error; "
            "print(sorted(info.cls.implemented_hooks())); "
            "bad = sorted(m for m in sys.modules if m == 'mlir' or m.startswith('mlir.')); print(bad); "
            "sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[0] == "['unit_step']"
