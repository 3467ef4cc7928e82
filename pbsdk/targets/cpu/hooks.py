"""The cpu target's implementation of the lowering hooks: what it builds for the tiled form's abstract
ops on the host.

``unit_step`` is one instruction of a matrix unit kept in the vector registers (``MatrixUnit.registers ==
"vector"``): ``acc + A x B`` on register values, built as the LLVM intrinsic of the instruction through the
LLVM dialect (``llvm.call_intrinsic``), which the vector and LLVM lowerings carry through unchanged. The
micro-kernel of `pbsdk.targets.cpu.unit_kernel` calls it ``mr * nv`` times per group of k.

A plugin replaces it by subclassing `pbsdk.targets.cpu.CpuTarget` with ``hooks`` set to an object whose
``unit_step`` builds something else (`CpuTarget.unit_step_hook` picks it up).
"""

from __future__ import annotations

import dataclasses

from mlir import ir
from mlir.dialects import llvm

from pbsdk.core.errors import CompileError
from pbsdk.core.spec import ChipSpec, MatrixUnit

#: LLVM intrinsic of each unit in the vector registers, by (unit name, vector width in bits), and the
#: target features the instruction needs (any one of the sets).
INTRINSICS: dict[tuple[str, int], tuple[str, tuple[frozenset[str], ...]]] = {
    ("vdpbf16ps", 512): ("llvm.x86.avx512bf16.dpbf16ps.512", (frozenset({"+avx512bf16"}),)),
    ("vdpbf16ps", 256): ("llvm.x86.avx512bf16.dpbf16ps.256", (frozenset({"+avx512bf16", "+avx512vl"}),)),
    ("vpdpbusd", 512): ("llvm.x86.avx512.vpdpbusd.512", (frozenset({"+avx512vnni"}),)),
    ("vpdpbusd", 256): ("llvm.x86.avx512.vpdpbusd.256", (frozenset({"+avx512vnni", "+avx512vl"}),
                                                          frozenset({"+avxvnni"}))),
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnitStep:
    """One instruction of ``unit`` on register values: ``acc' = acc + A x B``. ``acc_type`` is the
    accumulator vector (``n`` lanes of the accumulator dtype), ``a_type``/``b_type`` the operands
    (``n * k`` values: a group of ``k`` values of a row of A in every lane; ``k`` rows of B interleaved)."""

    unit: MatrixUnit
    acc_type: ir.Type
    a_type: ir.Type
    b_type: ir.Type


def lowerable(unit: MatrixUnit, width_bits: int, features: str) -> str | None:
    """Why the cpu target cannot lower ``unit`` for machine code with ``features`` (an LLVM feature string)
    and ``width_bits`` vectors, or None when it can."""
    if unit.registers != "vector":
        return f"{unit.name}: the cpu target lowers units in the vector registers only (this one keeps " \
               f"{'tile registers' if unit.registers == 'tile' else 'memory tiles'})"
    found = INTRINSICS.get((unit.name, width_bits))
    if found is None:
        return f"{unit.name}: no {width_bits}-bit instruction known to the cpu target"
    flags = {f.strip() for f in features.split(",")}
    if not any(need <= flags for need in found[1]):
        need = " or ".join(",".join(sorted(s)) for s in found[1])
        return f"{unit.name}: the code's target features lack {need}"
    return None


def unit_step(step: UnitStep, acc: ir.Value, a: ir.Value, b: ir.Value, spec: ChipSpec) -> ir.Value:
    """Build one instruction of ``step.unit`` at the insertion point and return the new accumulator."""
    width = ir.VectorType(step.acc_type).shape[0] * ir.VectorType(step.acc_type).element_type.width
    found = INTRINSICS.get((step.unit.name, width))
    if found is None:
        raise CompileError(f"cpu: no {width}-bit instruction for matrix unit {step.unit.name}", op="matmul")
    return llvm.call_intrinsic(step.acc_type, found[0], [acc, a, b], [], [])
