"""pbsdk: a retargetable MLIR compiler SDK for AI chips.

Quick use::

    import numpy as np, pbsdk
    from pbsdk import ops

    @pbsdk.jit(target="cpu")
    def layer(x, w, b):
        return ops.softmax(ops.gelu(x @ w + b), axis=-1)
"""

import importlib
from typing import Any

from pbsdk.core.errors import (
    ArgumentError,
    CompileError,
    DeviceUnavailableError,
    OptionsError,
    PbsdkError,
    SpecError,
    TargetError,
    UnsupportedError,
)

__version__ = "0.1.0"

_LAZY = {"jit", "compile_mlir", "JitFunction"}


def __getattr__(name: str) -> Any:
    # The compiler entry points load the MLIR bindings; import them on first use so that the spec,
    # planner and testing helpers (and their unit tests) stay MLIR-free.
    # ``ops`` too, so that ``import pbsdk.runtime`` (the deploy runtime: numpy and ctypes only) loads no
    # part of the compiler.
    if name in _LAZY:
        from pbsdk.frontends import jit as _jit

        return getattr(_jit, name)
    if name == "ops":
        return importlib.import_module("pbsdk.ops")
    if name == "export":
        from pbsdk.deploy import export

        return export
    raise AttributeError(f"module 'pbsdk' has no attribute {name!r}")

__all__ = [
    "ArgumentError", "CompileError", "DeviceUnavailableError", "JitFunction", "OptionsError", "PbsdkError", "SpecError",
    "TargetError", "UnsupportedError", "__version__", "compile_mlir", "export", "jit", "ops",
]
