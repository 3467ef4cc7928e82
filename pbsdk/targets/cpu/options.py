"""The cpu target's own compile options (`CpuOptions`, the target's ``options_type``; the others are the
core's, `pbsdk.core.options.Options`).

A user passes them like any option (``pbsdk.jit(options={"pack": False})``, ``pbsdk compile --options
pack=false``); `pbsdk.core.options.parse_options` routes every key that is not a core field here, so another
target rejects them as unknown. Stages read them as ``cpu_options(ctx).pack``. The core passes that only the
cpu pipeline runs (``fuse-rows``, ``expose-rows``, ``fill-borders``, ``transpose-blocks``, ``plan-workspace``)
take them as pass fields, set by `pbsdk.targets.cpu.CpuTarget.scheduling_stages`; the core stage
``isolate-contractions`` asks `CpuOptions.isolate_contractions` and `CpuOptions.isolate_epilogues`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pbsdk.core.options import TargetOptions


@dataclasses.dataclass(frozen=True)
class CpuOptions(TargetOptions):
    """The cpu target's own options (the others are the core's, `pbsdk.core.options.Options`)."""

    #: Matrix units with tile registers (AMX: ``tdpbf16ps``, ``tdpbssd``): "auto" lowers their instructions
    #: where the code's target features have AMX and, when this host has AMX itself, Linux grants the
    #: process the tile state (`pbsdk.targets.cpu.hooks.resolve_tiles`); "on" lowers them whenever the
    #: features allow, "off" leaves them out of the plans (the vector-register units serve bf16/i8),
    #: "emulate" builds the same kernels with the instructions' arithmetic on host buffers (any machine: what
    #: checks the AMX kernels where there is no AMX).
    amx: Literal["auto", "off", "on", "emulate"] = "auto"
    #: Pack planned matmuls into register-tiled kernels (``pack-contractions``; off, the core stage
    #: ``isolate-contractions`` leaves them in place too).
    pack: bool = True
    #: Pack a constant B operand (a frozen weight) into the kernel's micro-panels at compile time, and a
    #: constant A of a product computed transposed (as the panels of A^T).
    prepack_b: bool = True
    #: Let a packed matmul read an operand that a transpose fills just for it (``x @ w.T``, ``q @ k^T``)
    #: from the transpose's source, through its packing, instead of materialising the transpose.
    transposed_reads: bool = True
    #: Fuse elementwise epilogues into packed matmuls (``isolate-contractions`` moves them in with the
    #: contraction; ``pack-contractions`` applies them in the kernel's final store).
    fuse_epilogues: bool = True
    #: Read an NHWC convolution's input in place in its packed kernel instead of copying its patches
    #: (implicit GEMM).
    implicit_conv: bool = True
    #: Run row-local chains (softmax, layernorm, ...) row by row (``fuse-rows``).
    fuse_rows: bool = True
    #: Give ``fuse-rows`` rows to split where leading dimensions are 1 (batch 1) and strided copies
    #: (``expose-rows``; only with ``fuse_rows``).
    expose_rows: bool = True
    #: Run the loops of row ops (a softmax's max and sum, its maps) as vector loops with their reductions in
    #: registers (``vectorize-rows``).
    vectorize_rows: bool = True
    #: Fill a padded buffer only around the box a later op overwrites (``fill-borders``).
    fill_borders: bool = True
    #: Move copies and elementwise maps that transpose their innermost dimension (NCHW <-> NHWC) as
    #: register-transposed blocks (``transpose-blocks``).
    transpose_blocks: bool = True
    #: Place the entry's temporaries in one workspace planned at compile time, which the executable
    #: allocates once, instead of allocating them on every call (``plan-workspace``).
    workspace: bool = True

    def isolate_contractions(self) -> bool:
        return self.pack

    def isolate_epilogues(self) -> bool:
        return self.fuse_epilogues


def cpu_options(ctx: Any) -> CpuOptions:
    """The cpu options of a stage's context (their defaults where the options were parsed without a
    target, e.g. ``pbsdk opt`` without ``--target``)."""
    return ctx.options.target_as(CpuOptions)
