"""The template target: an emulated accelerator on the host, and what ``pbsdk new-target`` renders from.

Its pipeline, after the core's stages (bufferized linalg on memrefs):

- ``promote`` (core, `pbsdk.core.passes.promote`): each contraction planned by the core planner, tiled by
  the plan's memory-level tiles, its tiles staged in one buffer per scratchpad level (memory space ``i``
  = ``spec.memory[i]``) with explicit copies, the innermost compute at exactly the matrix unit's
  m x n x k; a level whose live buffers exceed its capacity is a `CompileError` naming buffer and level.
- ``matrix-unit``, ``dma``, ``scratchpad``: the lowering hooks (`pbsdk.targets.template.hooks`) turn
  unit ops, copies and scratchpad buffers into code — in the emulator: rounding to the unit's operand
  dtype and accumulating in its accumulator dtype, counting unit ops and bytes per level pair, host
  allocations — then everything is inlined and the memory spaces become host memory.
- ``parallel``, ``lower-loops``, ``lower-llvm``, ``emit``: the hooks' pipelines to loops, LLVM dialect,
  then LLVM IR run by the host JIT. A subclass with ``emit_after`` (a C-toolchain chip, ``pbsdk new-target
  --toolchain c``) ends after that stage instead: ``emit`` hands the module to the ``toolchain_emission``
  hook (C source, `pbsdk.core.emit_c`), which the emulation compiles with the host's C compiler together
  with the target's ``c_sources`` (`pbsdk.targets.template.c_toolchain`).

A chip whose levels besides main memory are all caches is staged through its packing view
(`pbsdk.core.plan.packing`: each cache a software-managed packing level of half its size): every stage
above gets that view as ``ctx.spec``, the executable the spec itself (the chip's modelled time).

The loaded `TemplateExecutable` exposes ``last_counters`` (per run) and ``resources`` (compile time);
`pbsdk.Kernel.executable` reaches it. A subclass changes the chip by its ``default_spec`` and the code by
its ``hooks`` (`Target.hooks`: a module, class or object implementing part of the contract of
`pbsdk.core.hooks`); every hook it does not implement is the emulation's (`pbsdk.targets.template.hooks`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pbsdk.core.errors import TargetError
from pbsdk.core.options import CONVERT, Options, TargetOptions
from pbsdk.core.target import Artifact, Executable, Target

if TYPE_CHECKING:
    from pbsdk.core.pipeline import Stage
    from pbsdk.core.spec import ChipSpec


def _tiles(value: Any) -> tuple[tuple[str, tuple[int, int, int]], ...]:
    """``{"level": (m, n, k), ...}`` as a sorted tuple (hashable, order-independent)."""
    if not isinstance(value, Mapping):
        raise TypeError(f"must map memory level names to (m, n, k) tiles, got {value!r}")
    out = []
    for level, tile in value.items():
        t = tuple(tile)
        if len(t) != 3 or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in t):
            raise ValueError(f"the tile of level {level!r} must be three positive ints (m, n, k), got {tile!r}")
        out.append((str(level), t))
    return tuple(sorted(out))  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True)
class TemplateOptions(TargetOptions):
    """The template target's options."""

    #: Per-level contraction tiles overriding the plan's, ``{"spm": (m, n, k)}`` (experiments, tests).
    tiles: tuple[tuple[str, tuple[int, int, int]], ...] = dataclasses.field(default=(), metadata={CONVERT: _tiles})


def _packing(spec: ChipSpec) -> ChipSpec | None:
    """The spec the template's stages tile and stage with: for a cache-only chip its packing view
    (`pbsdk.core.plan.packing.packing_view`: each cache a packing level of half its size), else None
    (the spec itself)."""
    from pbsdk.core.plan.packing import is_cache_only, packing_view

    return packing_view(spec) if is_cache_only(spec) and not spec.scratchpads() else None


def _staged_on(view: ChipSpec | None, stage: Stage) -> Stage:
    """``stage`` run with ``ctx.spec`` = ``view`` (the rest of the context, notes included, shared)."""
    fn = stage.fn
    if view is None or fn is None:
        return stage
    return dataclasses.replace(stage, fn=lambda m, c: fn(m, dataclasses.replace(c, spec=view)))


class TemplateTarget(Target):
    """An accelerator emulated on the host from its chip spec (see the module docstring)."""

    name = "template"
    attention_forms = ("scratchpad",)
    options_type = TemplateOptions
    default_spec = "example/npu"
    description = "emulated accelerator on the host (scratchpads, matrix unit, counters); what `pbsdk new-target` renders from"
    #: With ``emit_after`` (`Target.emit_after`): the C files implementing the chip's intrinsics on the host
    #: (the emulation), compiled with every kernel's C by the host's C compiler; their directories are on
    #: the include path (the intrinsics' header lives there).
    c_sources: ClassVar[tuple[str, ...]] = ()

    def check_spec(self, spec: ChipSpec) -> None:
        from pbsdk.core.plan.packing import is_cache_only

        if spec.kind == "gpu":
            raise TargetError(f"target '{self.name}' emulates accelerators and CPUs with scratchpads; "
                              f"'{spec.name}' is a gpu spec")
        if not spec.scratchpads() and not is_cache_only(spec):
            raise TargetError(f"target '{self.name}' needs a spec with a memory level besides main memory: a "
                              f"software-managed one (a scratchpad) or only caches; '{spec.name}' has none")

    def resolved_hooks(self) -> Mapping[str, Callable[..., Any]]:
        """The function the template calls for each of its hooks (`hooks.TEMPLATE_HOOKS`): the target's
        own where ``hooks`` implements it (`Target.implemented_hooks`, which raises `TargetError` for a
        misspelt hook), the emulation's otherwise."""
        from pbsdk.targets.template import hooks as emulation

        own = self.implemented_hooks()
        return {name: getattr(self.hooks if name in own else emulation, name) for name in emulation.TEMPLATE_HOOKS}

    def stages(self, spec: ChipSpec, options: Options) -> Sequence[Stage]:
        from pbsdk.core.passes.copies_to_linalg import CopiesToLinalg
        from pbsdk.core.passes.promote import PromoteToScratchpad
        from pbsdk.core.passes.promote_vector import PromoteVectorOps
        from pbsdk.core.pipeline import Stage
        from pbsdk.targets.template import emulation as emu

        hooks = self.resolved_hooks()
        tiles = options.target_as(TemplateOptions).tiles
        return tuple(_staged_on(_packing(spec), stage) for stage in (
            Stage("promote", fn=PromoteToScratchpad(tiles=tiles).apply,  # type: ignore[arg-type]
                  description="contractions tiled by the plan, tiles staged in scratchpads, capacity checked"),
            Stage("promote-vector", fn=PromoteVectorOps().apply,  # type: ignore[arg-type]
                  description="every other op on main memory tiled by its plan and staged in the innermost "
                              "scratchpad (elementwise, reductions in chunks, fills, convolutions)"),
            Stage("matrix-unit", fn=lambda m, c: emu.lower_matrix_units(m, c, hooks),
                  description="hook matrix_unit_op: each unit-sized op becomes the unit's instruction"),
            Stage("vector-unit", fn=lambda m, c: emu.lower_vector_tiles(m, c, hooks),
                  description="hook vector_tile_op: each pbsdk.compute op on tiles, built in place, counted"),
            Stage("dma", fn=lambda m, c: emu.lower_dma(m, c, hooks),
                  description="hook dma_copy: copies between levels, bytes counted per level pair"),
            Stage("scratchpad", fn=lambda m, c: emu.lower_scratchpads(m, c, hooks),
                  description="hook scratchpad_alloc; hooks' functions inlined; levels become host memory"),
            Stage("lower-copies", fn=CopiesToLinalg().apply,
                  description="strided memref.copy to linalg.copy (no runtime library needed)"),
            Stage("parallel", passes=hooks["parallel_loop"](spec), description="hook parallel_loop"),
            Stage("lower-loops", passes=hooks["vector_ops"](spec), description="hook vector_ops: the rest to loops"),
            Stage("lower-llvm", passes=emu.lower_llvm(), description="to the LLVM dialect, bare-pointer memrefs"),
            self._emit_stage(hooks),
        ))

    def _emit_stage(self, hooks: Mapping[str, Callable[..., Any]]) -> Stage:
        from pbsdk.core.pipeline import Stage
        from pbsdk.targets.template import emulation as emu

        after = self.emit_after
        if after is None:
            return Stage("emit", fn=lambda m, c: emu.emit(m, c, hooks), description="hook final_emission (the artifact)")
        return Stage("emit", fn=lambda m, c: emu.emit(m, c, hooks, after=after),
                     description=f"hook toolchain_emission: the module after stage '{after}' as C for the chip's "
                                 "toolchain (the emulation compiles it with the host's C compiler)")

    def load(self, artifact: Artifact, spec: ChipSpec) -> Executable:
        from pbsdk.targets.template.emulation import C_SOURCE, TemplateExecutable

        if artifact.kind == C_SOURCE:
            from pbsdk.targets.template.c_toolchain import CExecutable

            return CExecutable(artifact, spec, sources=tuple(self.c_sources))
        return TemplateExecutable(artifact, spec)
