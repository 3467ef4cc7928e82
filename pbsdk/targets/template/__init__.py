"""The template target (registered; lands with the bring-up kit issue).

What it will provide: an emulated accelerator on the host, derived from the chip spec — each scratchpad a
separate, capacity-checked allocation, the matrix-unit op executed at exactly the spec's m x n x k and
dtypes, explicit counted copies between memory levels — and the jinja2 sources ``pbsdk new-target``
renders a new target plugin from.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pbsdk.core.errors import TargetError
from pbsdk.core.pipeline import Stage
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Artifact, Executable, Target

_NOT_YET = ("target 'template' is registered but its emulator has not landed yet (the bring-up kit issue)")


class TemplateTarget(Target):
    name = "template"
    default_spec = "example/npu"
    description = "emulated accelerator on the host; what `pbsdk new-target` renders from"
    implemented = False

    def stages(self, spec: ChipSpec, options: Mapping[str, Any]) -> Sequence[Stage]:
        raise TargetError(_NOT_YET)

    def load(self, artifact: Artifact, spec: ChipSpec) -> Executable:
        raise TargetError(_NOT_YET)
