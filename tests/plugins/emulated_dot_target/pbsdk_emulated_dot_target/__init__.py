"""A third-party target built on pbsdk's cpu target that replaces one hook of the contract, ``unit_step``
(one instruction of a matrix unit kept in the vector registers), with its own implementation in
``hooks.py``; every other hook stays the cpu target's."""

from __future__ import annotations

from typing import Any, ClassVar

from pbsdk.targets.cpu import CpuTarget
from pbsdk_emulated_dot_target import hooks as _hooks


class EmulatedDotTarget(CpuTarget):
    """The host CPU, its dot-product units emulated in vector arithmetic."""

    name = "emudot"
    description = "cpu with unit_step emulated in vector arithmetic (a test plugin)"
    hooks: ClassVar[Any] = _hooks
