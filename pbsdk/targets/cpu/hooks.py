"""The cpu target's implementation of the lowering hooks: what it builds for the tiled form's abstract
ops on the host.

``unit_step`` is one instruction of a matrix unit kept in the vector registers (``MatrixUnit.registers ==
"vector"``): ``acc + A x B`` on register values, built as the LLVM intrinsic of the instruction through the
LLVM dialect (``llvm.call_intrinsic``), which the vector and LLVM lowerings carry through unchanged; for an
instruction that yields the products alone (AVX2's ``vpmaddwd``), the intrinsic and an ``arith.addi``. The
micro-kernel of `pbsdk.targets.cpu.unit_kernel` calls it ``mr * nv`` times per group of k.

This module is the cpu target's ``hooks`` (`pbsdk.core.target.Target.hooks`), checked against the contract
(`pbsdk.core.hook_contract.HOOKS`) like any plugin's. A plugin replaces a hook by subclassing
`pbsdk.targets.cpu.CpuTarget` with ``hooks`` set to its own module or object: what that implements is used
(`CpuTarget.resolved_hook`), this module's function otherwise.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, llvm

from pbsdk.core.errors import CompileError
from pbsdk.core.hooks import UnitStep
from pbsdk.core.spec import ChipSpec, MatrixUnit

#: Public functions here that are not hooks (`pbsdk.core.hook_contract.check_hooks`).
__pbsdk_helpers__ = ("lowerable", "resolve_tiles")

#: LLVM intrinsic of each unit in the vector registers, by (unit name, vector width in bits), and the
#: target features the instruction needs (any one of the sets).
INTRINSICS: dict[tuple[str, int], tuple[str, tuple[frozenset[str], ...]]] = {
    ("vdpbf16ps", 512): ("llvm.x86.avx512bf16.dpbf16ps.512", (frozenset({"+avx512bf16"}),)),
    ("vdpbf16ps", 256): ("llvm.x86.avx512bf16.dpbf16ps.256", (frozenset({"+avx512bf16", "+avx512vl"}),)),
    ("vpdpbusd", 512): ("llvm.x86.avx512.vpdpbusd.512", (frozenset({"+avx512vnni"}),)),
    ("vpdpbusd", 256): ("llvm.x86.avx512.vpdpbusd.256", (frozenset({"+avx512vnni", "+avx512vl"}),
                                                          frozenset({"+avxvnni"}))),
}
#: Units in the vector registers whose instruction yields the products alone (not added to an accumulator):
#: the step is that intrinsic, then an add to the accumulator (``vpmaddwd``: i16 pairs into i32 lanes).
PRODUCTS: dict[tuple[str, int], tuple[str, tuple[frozenset[str], ...]]] = {
    ("vpmaddwd", 512): ("llvm.x86.avx512.pmaddw.d.512", (frozenset({"+avx512bw"}),)),
    ("vpmaddwd", 256): ("llvm.x86.avx2.pmadd.wd", (frozenset({"+avx2"}),)),
}


#: Units with tile registers the cpu target lowers (`pbsdk.targets.cpu.tile_kernel`): the target features
#: each needs (all of them).
TILE_UNITS: dict[str, frozenset[str]] = {
    "tdpbf16ps": frozenset({"+amx-tile", "+amx-bf16"}),
    "tdpbssd": frozenset({"+amx-tile", "+amx-int8"}),
}


def resolve_tiles(tiles: str, features: str) -> str:
    """The cpu option ``amx`` with "auto" decided for machine code of ``features``: "on" where they have
    AMX's tile features and either this host lacks AMX (the code is for another machine, which asks Linux
    for the tile state when it loads it) or Linux grants this process the state (`request_amx`); else "off".
    The other values are returned as they are."""
    if tiles != "auto":
        return tiles
    flags = {f.strip() for f in features.split(",")}
    if "+amx-tile" not in flags:
        return "off"
    from pbsdk.targets.cpu.tile_kernel import host_has_amx, request_amx

    return "on" if not host_has_amx() or request_amx() else "off"


def lowerable(unit: MatrixUnit, width_bits: int, features: str, tiles: str = "auto") -> str | None:
    """Why the cpu target cannot lower ``unit`` for machine code with ``features`` (an LLVM feature string)
    and ``width_bits`` vectors, or None when it can. ``tiles`` is the cpu option ``amx``: units with tile
    registers are lowered when it is "on" (their instructions; the machine code needs the features),
    "auto" (`resolve_tiles`) or "emulate" (their arithmetic on host buffers, any machine)."""
    flags = {f.strip() for f in features.split(",")}
    if unit.registers == "tile":
        need = TILE_UNITS.get(unit.name)
        if need is None:
            return f"{unit.name}: no tile unit of that name is known to the cpu target"
        if tiles == "off":
            return f"{unit.name}: AMX kernels are off (cpu option amx=off)"
        if tiles in ("on", "auto") and not need <= flags:
            return f"{unit.name}: the code's target features lack {','.join(sorted(need - flags))}"
        if resolve_tiles(tiles, features) == "off":
            return f"{unit.name}: Linux did not grant this process AMX's tile state (arch_prctl ARCH_REQ_XCOMP_PERM)"
        return None
    if unit.registers != "vector":
        return f"{unit.name}: the cpu target lowers units in registers only (this one keeps memory tiles)"
    found = INTRINSICS.get((unit.name, width_bits)) or PRODUCTS.get((unit.name, width_bits))
    if found is None:
        return f"{unit.name}: no {width_bits}-bit instruction known to the cpu target"
    if not any(need <= flags for need in found[1]):
        wanted = " or ".join(",".join(sorted(s)) for s in found[1])
        return f"{unit.name}: the code's target features lack {wanted}"
    return None


def unit_step(step: UnitStep, acc: ir.Value, a: ir.Value, b: ir.Value, spec: ChipSpec) -> ir.Value:
    """Build one instruction of ``step.unit`` at the insertion point and return the new accumulator."""
    width = ir.VectorType(step.acc_type).shape[0] * ir.VectorType(step.acc_type).element_type.width
    found = INTRINSICS.get((step.unit.name, width))
    if found is not None:
        return llvm.call_intrinsic(step.acc_type, found[0], [acc, a, b], [], [])
    products = PRODUCTS.get((step.unit.name, width))
    if products is None:
        raise CompileError(f"cpu: no {width}-bit instruction for matrix unit {step.unit.name}", op="matmul")
    return arith.addi(acc, llvm.call_intrinsic(step.acc_type, products[0], [a, b], [], []))
