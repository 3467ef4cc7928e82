"""The NVIDIA GPU reference target: the core's tiled form -> blocks/warps/threads -> NVVM -> PTX -> cubin.

Stages after the core's (see ``docs/nvgpu.md`` for the walk-through):

==================  ============================================================================
``promote``         core: contractions tiled and staged in shared memory (operand and accumulator
                    tiles), mma.sync-sized unit steps (`MMA_UNITS`)
``promote-vector``  core: every other op tiled and staged in shared memory
``schedule``        the core's tiled form onto blocks/warps/threads (`schedule.py`); target-neutral
                    in form, so `emulate.py` runs it on the host
``map-gpu``         ``gpu.launch`` per kernel, loops mapped to block/thread/warp ids (`lower.py`)
``outline``         kernels outlined into one ``gpu.module``; shared buffers become ``.shared`` globals
``nvvm``            NVVM/LLVM dialect for the spec's ``codegen.arch`` (libdevice linked when needed)
``ptx``             PTX text from LLVM's NVPTX back end; the host function read as a launch plan
``cubin``           ``ptxas -v``: a cubin, and registers/spills/shared memory checked against the spec
``artifact``        the ``.pbsdk`` file (`bundle.py`): PTX + cubin + launch metadata
==================  ============================================================================

Loading goes through `runtime.py` (ctypes on the CUDA driver, no MLIR): without a GPU, `load` raises
`DeviceUnavailableError`. Options (`NvgpuOptions`): ``ptxas`` (default True; False makes a PTX-only artifact
without resource checks), ``allow_spills`` (default False); the core's ``matrix_units`` (default True);
``optin_scratchpad`` and ``double_buffer`` are always off (static shared memory, single-buffered tiles).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from pbsdk.core.errors import CompileError, OptionsError, TargetError
from pbsdk.core.options import Options, TargetOptions
from pbsdk.core.target import Artifact, Executable, Target
from pbsdk.targets.nvgpu import hooks as _hooks

if TYPE_CHECKING:
    from pbsdk.core.pipeline import Stage, StageContext
    from pbsdk.core.spec import ChipSpec

ARTIFACT_KIND = "nvgpu-artifact"


def _cubin(ptx: Any, ctx: StageContext) -> Any:
    from pbsdk.targets.nvgpu import ptxas
    from pbsdk.targets.nvgpu.lower import arch_of

    if not isinstance(ptx, str):
        raise CompileError("expects PTX text")
    ctx.notes["nvgpu.ptx"] = ptx
    if not ctx.options.target_as(NvgpuOptions).ptxas:
        return ptx
    arch, _ = arch_of(ctx.spec)
    cubin, resources, _log = ptxas.assemble(ptx, arch)
    plan = ctx.notes["nvgpu.plan"]
    threads: dict[str, int] = {}
    for launch in plan["launches"]:
        threads[launch["kernel"]] = max(threads.get(launch["kernel"], 0), math.prod(launch["block"]))
    sm = ctx.spec.compute[0].limits
    thread_level = ctx.spec.compute[-1].limits
    pads = ctx.spec.scratchpads()
    ptxas.check_resources(resources, threads=threads,
                          max_registers=int(thread_level.get("max_registers", 255)),
                          max_registers_per_block=int(sm.get("max_registers_per_block", 0)),
                          max_shared=pads[0].size_bytes if pads else 0,
                          allow_spills=ctx.options.target_as(NvgpuOptions).allow_spills)
    ctx.notes["nvgpu.resources"] = {k: vars(v) | {} for k, v in resources.items()}
    ctx.notes["nvgpu.cubin"] = cubin
    return cubin


#: The matrix units this target issues (`mma.py`): warp-level mma.sync, 16x8x16, f16/bf16 -> f32.
MMA_UNITS = ("mma.sync.m16n8k16",)


def _artifact(_binary: Any, ctx: StageContext) -> Artifact:
    import pbsdk
    from pbsdk.targets.nvgpu import bundle
    from pbsdk.targets.nvgpu.lower import arch_of

    arch, features = arch_of(ctx.spec)
    plan = _embed_constants(ctx.notes["nvgpu.plan"], len(ctx.notes["inputs"]), ctx.constants)
    header = {
        "target": "nvgpu", "spec": ctx.spec.name, "arch": arch, "ptx_features": features,
        "pbsdk": getattr(pbsdk, "__version__", "?"), "entry": ctx.notes["entry"],
        "inputs": [[list(s), d] for s, d in ctx.notes["inputs"]],
        "outputs": [[list(s), d] for s, d in ctx.notes["outputs"]],
        "buffers": plan["buffers"], "launches": plan["launches"],
        "kernels": ctx.notes.get("nvgpu.resources", {}),
    }
    blobs = {"ptx": ctx.notes["nvgpu.ptx"].encode()}
    if "nvgpu.cubin" in ctx.notes:
        blobs["cubin"] = ctx.notes["nvgpu.cubin"]
    blobs.update(plan.get("consts", {}))
    data = bundle.pack(header, blobs)
    meta = {k: v for k, v in header.items() if k not in ("inputs", "outputs", "entry")}
    return Artifact(kind=ARTIFACT_KIND, payload=data, entry=ctx.notes["entry"], inputs=ctx.notes["inputs"],
                    outputs=ctx.notes["outputs"], metadata=meta)


def _embed_constants(plan: dict[str, Any], n_inputs: int, constants: Sequence[Any]) -> dict[str, Any]:
    """The launch plan with the entry's constant operands (its arguments after the inputs, `pbsdk.constant`)
    turned into ``"const"`` buffers whose bytes are blobs of the bundle, uploaded once at load like the
    module's own constants: the bundle's arguments are then the inputs and outputs alone."""
    if not constants:
        return plan
    n_c = len(constants)
    n_args = sum(1 for b in plan["buffers"] if b["role"] == "arg")
    n_out = n_args - n_inputs - n_c

    def moved(i: int) -> int:
        if i < n_inputs or i >= n_args:
            return i
        if i < n_inputs + n_c:
            return n_inputs + n_out + (i - n_inputs)
        return i - n_c

    old = plan["buffers"]
    buffers = [old[i] for i in range(n_inputs)] + [old[i] for i in range(n_inputs + n_c, n_args)]
    consts = dict(plan.get("consts", {}))
    for k, array in enumerate(constants):
        blob = f"const:arg{k}"
        consts[blob] = np.ascontiguousarray(array).tobytes()
        buffers.append(dict(old[n_inputs + k], role="const", blob=blob))
    buffers += old[n_args:]
    launches = [dict(launch, args=[dict(a, buffer=moved(int(a["buffer"]))) for a in launch["args"]])
                for launch in plan["launches"]]
    return dict(plan, buffers=buffers, launches=launches, consts=consts)


class NvgpuExecutable(Executable):
    """An artifact loaded on a GPU (through `runtime.LoadedArtifact`)."""

    def __init__(self, artifact: Artifact) -> None:
        from pbsdk.targets.nvgpu.runtime import load

        payload = artifact.payload if isinstance(artifact.payload, bytes) else artifact.payload.encode()
        self.loaded = load(payload)

    def run(self, buffers: Sequence[Any]) -> None:
        self.loaded.run(buffers)


@dataclasses.dataclass(frozen=True)
class NvgpuOptions(TargetOptions):
    """The nvgpu target's options."""

    #: Assemble the PTX with ptxas into a cubin and check its resources (False: a PTX-only artifact).
    ptxas: bool = True
    #: Accept register spills that ptxas reports (default: a spill is a compile error).
    allow_spills: bool = False


class NvgpuTarget(Target):
    """NVIDIA GPUs: code generation from the chip spec (``codegen.arch``, limits, shared memory)."""

    name = "nvgpu"
    # Fused attention in the scratchpad form: the core's kernel (`pbsdk.core.ir.attention_tiles`), mapped by
    # `schedule` like every other staged kernel.
    attention_forms: ClassVar[tuple[str, ...]] = ("scratchpad",)
    options_type = NvgpuOptions
    default_spec = "nvidia/h100"
    description = "NVIDIA GPU reference target (PTX via NVPTX, cubin via ptxas, CUDA driver launch)"
    #: Of the hook contract (`pbsdk.core.hooks`), nvgpu implements ``unit_step`` (`hooks.py`: mma.sync on a
    #: lane's fragments); a subclass whose ``hooks`` implement it replaces the instruction.
    hooks: ClassVar[Any] = _hooks

    def parse_options(self, values: Options | Mapping[str, Any] | None) -> Options:
        """The core's and `NvgpuOptions`; shared memory is placed statically (``.shared`` arrays of the
        level's ``size_bytes``) and tiles are single-buffered, so ``optin_scratchpad`` and ``double_buffer``
        are off — asking for either is an `OptionsError`."""
        raw = values if isinstance(values, Mapping) else {}
        for key in ("optin_scratchpad", "double_buffer"):
            if raw.get(key) is True:
                raise OptionsError(f"nvgpu option '{key}': not supported (shared memory is static and tiles "
                                   "single-buffered); leave it unset or false")
        return super().parse_options(values).replace(optin_scratchpad=False, double_buffer=False)

    def check_spec(self, spec: ChipSpec) -> None:
        if spec.kind != "gpu":
            raise TargetError(f"target 'nvgpu' needs a chip spec of kind 'gpu'; '{spec.name}' is a {spec.kind}")
        if not spec.codegen.get("arch"):
            raise TargetError(f"target 'nvgpu' needs codegen.arch (e.g. sm_90) in chip spec '{spec.name}'")
        if not spec.scratchpads():
            raise TargetError(f"target 'nvgpu' needs a software-managed shared-memory level in '{spec.name}'")

    def stages(self, spec: ChipSpec, options: Options) -> Sequence[Stage]:
        from pbsdk.core.passes.promote import PromoteToScratchpad
        from pbsdk.core.passes.promote_vector import PromoteVectorOps
        from pbsdk.core.pipeline import Stage
        from pbsdk.targets.nvgpu import lower
        from pbsdk.targets.nvgpu.schedule import Schedule

        return (
            Stage("promote", fn=PromoteToScratchpad(units=MMA_UNITS, accumulator_in_registers=False).apply,
                  marks=True, description="core: contractions tiled by the plan, operand and accumulator tiles "
                                          "in static shared memory, mma.sync-sized unit steps"),
            Stage("promote-vector", fn=PromoteVectorOps(units=MMA_UNITS).apply, marks=True,
                  description="core: every other op tiled by its plan and staged in shared memory"),
            Stage("schedule", fn=Schedule().apply, marks=True,
                  description="linalg ops tiled onto blocks/warps/threads (scf.forall), shared-memory tiles"),
            Stage("map-gpu", fn=functools.partial(lower.map_gpu, unit_step=self._unit_step()),
                  description="gpu.launch per kernel; loops to block/thread ids; hook unit_step: mma.sync"),
            Stage("outline", fn=lower.outline, description="kernels in one gpu.module; shared buffers as globals"),
            Stage("nvvm", fn=lower.to_nvvm, description="NVVM/LLVM dialect for the spec's arch"),
            Stage("ptx", fn=lower.to_ptx, description="PTX (LLVM NVPTX back end) and the launch plan"),
            Stage("cubin", fn=_cubin, description="ptxas: cubin; registers/spills/shared memory checked"),
            Stage("artifact", fn=_artifact, description="the .pbsdk artifact: PTX, cubin, launch metadata"),
        )

    def _unit_step(self) -> Callable[..., Any]:
        """The ``unit_step`` hook: this target's ``hooks``' where they implement it, nvgpu's otherwise."""
        return self.hooks.unit_step if "unit_step" in self.implemented_hooks() else _hooks.unit_step

    def emulate(self, text: str, spec: ChipSpec, options: Options) -> Any:
        """The ``schedule`` stage's IR run on the host (`emulate.py`): blocks, warps and threads in order."""
        from pbsdk.targets.nvgpu.emulate import emulate

        return emulate(text, spec=spec, options=options)

    def load(self, artifact: Artifact, spec: ChipSpec) -> Executable:
        if artifact.kind != ARTIFACT_KIND:
            raise TargetError(f"nvgpu loads '{ARTIFACT_KIND}' artifacts, not '{artifact.kind}'")
        return NvgpuExecutable(artifact)  # DeviceUnavailableError without a GPU
