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

#: The compiler's entry points, loaded on first use (module, attribute; None: the module itself): they load
#: the MLIR bindings, and the spec, planner and testing helpers (and their unit tests) stay MLIR-free; ``ops``
#: too, so that ``import pbsdk.runtime`` (the deploy runtime: numpy and ctypes only) loads no part of the
#: compiler. Where only the ``pbsdk-runtime`` distribution is installed they are an ImportError that says so.
_LAZY = {"jit": ("pbsdk.frontends.jit", "jit"), "compile_mlir": ("pbsdk.frontends.jit", "compile_mlir"),
         "JitFunction": ("pbsdk.frontends.jit", "JitFunction"), "ops": ("pbsdk.ops", None),
         "export": ("pbsdk.deploy", "export")}


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'pbsdk' has no attribute {name!r}")
    module_name, attr = _LAZY[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if not (exc.name or "").startswith("pbsdk."):
            raise
        raise ImportError(f"pbsdk.{name} is part of the compiler, which this environment does not hold (only "
                          f"the pbsdk-runtime distribution is installed: {exc.name} is missing); "
                          "pip install pbsdk for the compiler") from exc
    return module if attr is None else getattr(module, attr)


__all__ = [
    "ArgumentError", "CompileError", "DeviceUnavailableError", "JitFunction", "OptionsError", "PbsdkError", "SpecError",
    "TargetError", "UnsupportedError", "__version__", "compile_mlir", "export", "jit", "ops",
]
