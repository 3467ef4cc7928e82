"""pbsdk: a retargetable MLIR compiler SDK for AI chips.

Quick use::

    import numpy as np, pbsdk
    from pbsdk import ops

    @pbsdk.jit(target="cpu")
    def layer(x, w, b):
        return ops.softmax(ops.gelu(x @ w + b), axis=-1)
"""

from pbsdk import ops
from pbsdk.core.errors import (
    ArgumentError,
    CompileError,
    DeviceUnavailableError,
    PbsdkError,
    SpecError,
    TargetError,
    UnsupportedError,
)
from pbsdk.frontends.jit import JitFunction, compile_mlir, jit

__version__ = "0.1.0"

__all__ = [
    "ArgumentError", "CompileError", "DeviceUnavailableError", "JitFunction", "PbsdkError", "SpecError",
    "TargetError", "UnsupportedError", "__version__", "compile_mlir", "jit", "ops",
]
