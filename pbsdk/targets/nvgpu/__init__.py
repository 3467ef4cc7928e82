"""The NVIDIA GPU reference target (registered; code generation lands with the NVIDIA GPU target issue).

What it will provide: outer tiles mapped to thread blocks, inner tiles to warps/warp groups and threads;
operand tiles promoted to shared memory within the spec's per-block limit (opt-in maximum where the plan
needs it); ``mma.sync``/``wgmma`` for the matrix-unit op; PTX through LLVM's NVPTX backend, a cubin
through ``ptxas``; launch through the CUDA driver API. The A100/H100/H200 presets drive every choice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pbsdk.core.errors import TargetError
from pbsdk.core.pipeline import Stage
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Artifact, Executable, Target

_NOT_YET = ("target 'nvgpu' is registered but its code generation has not landed yet "
            "(the NVIDIA GPU target issue)")


class NvgpuTarget(Target):
    name = "nvgpu"
    default_spec = "nvidia/h100"
    description = "NVIDIA GPU reference target (PTX via NVPTX, cubin via ptxas, CUDA driver launch)"
    implemented = False

    def check_spec(self, spec: ChipSpec) -> None:
        if spec.kind != "gpu":
            raise TargetError(f"target 'nvgpu' needs a chip spec of kind 'gpu'; '{spec.name}' is a {spec.kind}")

    def stages(self, spec: ChipSpec, options: Mapping[str, Any]) -> Sequence[Stage]:
        raise TargetError(_NOT_YET)

    def load(self, artifact: Artifact, spec: ChipSpec) -> Executable:
        raise TargetError(_NOT_YET)
