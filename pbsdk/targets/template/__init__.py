"""The template target: an emulated accelerator on the host (registered placeholder).

What it will provide: the reference a new chip's bring-up starts from. Its stages will tile and stage the
core's bufferized linalg by the chip spec's memory hierarchy and matrix units (``example/npu`` by default)
and emulate the accelerator on the host CPU, so every step of a port can be tested without hardware; and
``pbsdk new-target`` will render a new plugin package from its files (the ``scaffold/`` templates).

What it provides today: only its registration. It is listed by ``pbsdk targets`` as planned
(``implemented = False``), and any attempt to compile for it raises `TargetError` until the bring-up kit
issue lands its code generation.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

from pbsdk.core.errors import TargetError
from pbsdk.core.target import Artifact, Executable, Target

if TYPE_CHECKING:
    from pbsdk.core.pipeline import Stage
    from pbsdk.core.spec import ChipSpec

_NOT_YET = ("target 'template' is registered but its code generation has not landed yet "
            "(tracked by the bring-up kit issue)")


def _not_landed() -> NoReturn:
    raise TargetError(_NOT_YET)


class TemplateTarget(Target):
    """Placeholder: listed, never compiles."""

    name = "template"
    default_spec = "example/npu"
    description = "emulated accelerator on the host; what `pbsdk new-target` renders from"
    implemented = False

    def stages(self, spec: ChipSpec, options: Mapping[str, Any]) -> Sequence[Stage]:
        _not_landed()

    def load(self, artifact: Artifact, spec: ChipSpec) -> Executable:
        _not_landed()
