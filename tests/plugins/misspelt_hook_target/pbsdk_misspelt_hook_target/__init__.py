"""A test pbsdk target plugin whose ``hooks.py`` misspells ``matrix_unit_op`` as ``matrix_unit_opp``.

Before the hook contract was checked, the template target looked hooks up by name and ran its emulation
for a name it did not find, so this plugin would have passed conformance without ever issuing its own
instruction. Discovery now refuses it, naming the misspelt function and the hook it is closest to.
"""

from __future__ import annotations

from pbsdk.targets.template import TemplateTarget
from pbsdk_misspelt_hook_target import hooks as _hooks


class MisspeltTarget(TemplateTarget):
    name = "misspelt"
    description = "test plugin: the template target with a misspelt hook"
    hooks = _hooks
