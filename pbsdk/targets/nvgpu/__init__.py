"""The NVIDIA GPU reference target (registered placeholder).

What it will provide: the core's bufferized linalg mapped onto the GPU's thread/block hierarchy from the
chip spec (e.g. ``nvidia/h100``), lowered through MLIR's GPU and NVVM dialects to PTX via LLVM's NVPTX
backend, assembled to a cubin with ``ptxas``, and loaded and launched through the CUDA driver API; without a
GPU, loading raises `DeviceUnavailableError`.

What it provides today: only its registration. It is listed by ``pbsdk targets`` as planned
(``implemented = False``), and any attempt to compile for it raises `TargetError` until the NVIDIA GPU
target issue lands its code generation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from pbsdk.core.errors import TargetError
from pbsdk.core.target import Artifact, Executable, Target

if TYPE_CHECKING:
    from pbsdk.core.pipeline import Stage
    from pbsdk.core.spec import ChipSpec

_NOT_YET = ("target 'nvgpu' is registered but its code generation has not landed yet "
            "(tracked by the NVIDIA GPU target issue)")


def _not_landed() -> NoReturn:
    raise TargetError(_NOT_YET)


class NvgpuTarget(Target):
    """Placeholder: listed, never compiles."""

    name = "nvgpu"
    default_spec = "nvidia/h100"
    description = "NVIDIA GPU reference target (PTX via NVPTX, cubin via ptxas, CUDA driver launch)"
    implemented = False

    def check_spec(self, spec: ChipSpec) -> None:
        if spec.kind != "gpu":
            raise TargetError(f"target 'nvgpu' needs a chip spec of kind 'gpu'; '{spec.name}' is a {spec.kind}")

    def stages(self, spec: ChipSpec, options: Mapping[str, Any]) -> Sequence[Stage]:
        _not_landed()

    def load(self, artifact: Artifact, spec: ChipSpec) -> Executable:
        _not_landed()
