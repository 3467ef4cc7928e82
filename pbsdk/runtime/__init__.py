"""pbsdk's deploy runtime: run a model exported by ``pbsdk.export`` without the compiler.

Imports numpy, ctypes and the standard library only (no MLIR, LLVM, torch or onnx)::

    import pbsdk.runtime
    model = pbsdk.runtime.load("model.pbsdk")
    y = model(x)

Files for the cpu and template targets hold host code; nvgpu files run through the CUDA driver
(`pbsdk.runtime.cuda`, where a GPU is). The C API (``runtime/c/pbsdk_runtime.h``, ``make runtime-c``) loads
the same files (host code only). See docs/deploy.md.
"""

from pbsdk.runtime.errors import (
    ChecksumError,
    CpuFeatureError,
    DeployError,
    DeviceError,
    DeviceUnavailableError,
    FormatError,
    InputError,
    LibraryError,
    TargetMismatchError,
    TruncatedError,
    VersionError,
)
from pbsdk.runtime.format import FORMAT_VERSION, Manifest
from pbsdk.runtime.model import Entry, Model, load

__all__ = ["FORMAT_VERSION", "ChecksumError", "CpuFeatureError", "DeployError", "DeviceError",
           "DeviceUnavailableError", "Entry", "FormatError",
           "InputError", "LibraryError", "Manifest", "Model", "TargetMismatchError", "TruncatedError",
           "VersionError", "load"]
