"""The runtime's typed errors. Loading a damaged or foreign file, or calling an entry with the wrong
arguments, raises one of these; none of them is ever a crash.

The runtime imports nothing of pbsdk's compiler, so these do not derive from ``pbsdk.PbsdkError``.
"""

from __future__ import annotations

from typing import ClassVar


class DeployError(Exception):
    """Base class of every error the runtime raises deliberately. ``status`` names the C API's status code
    for the same failure (``pbsdk_runtime.h``)."""

    status: ClassVar[str] = "PBSDK_ERR_FORMAT"


class FormatError(DeployError):
    """The file is not a pbsdk deploy artifact, or its manifest does not describe a valid one."""


class TruncatedError(FormatError):
    """The file is shorter than its header says (a partial copy or download)."""

    status: ClassVar[str] = "PBSDK_ERR_TRUNCATED"


class ChecksumError(FormatError):
    """A section's bytes do not match the checksum recorded for them (the section is named in
    ``section``): the file was damaged after export."""

    status: ClassVar[str] = "PBSDK_ERR_CHECKSUM"

    def __init__(self, message: str, *, section: str) -> None:
        self.section = section
        super().__init__(message)


class VersionError(FormatError):
    """The file's format version is not one this runtime reads."""

    status: ClassVar[str] = "PBSDK_ERR_VERSION"


class TargetMismatchError(DeployError):
    """The code was compiled for another target or platform (an aarch64 library on x86-64, a target this
    runtime does not run, GPU code on a host without a usable GPU: `DeviceUnavailableError`)."""

    status: ClassVar[str] = "PBSDK_ERR_TARGET"


class CpuFeatureError(TargetMismatchError):
    """The code uses CPU features this host lacks (e.g. AVX-512 code on an AVX2 machine); ``missing``
    names them."""

    status: ClassVar[str] = "PBSDK_ERR_CPU_FEATURES"

    def __init__(self, message: str, *, missing: tuple[str, ...]) -> None:
        self.missing = missing
        super().__init__(message)


class LibraryError(DeployError):
    """The dynamic loader refused the code (a missing system library such as libgomp)."""

    status: ClassVar[str] = "PBSDK_ERR_LIBRARY"


class DeviceUnavailableError(TargetMismatchError):
    """The file holds GPU code (target nvgpu) and this host cannot run it: no CUDA driver (``libcuda``), the
    driver finds no device (``cuInit`` fails), or the device is older than the code's architecture. The C
    runtime refuses such a file with ``PBSDK_ERR_TARGET`` (it runs host code only). ``reason`` is one of
    ``"no-driver"``, ``"no-device"``, ``"arch"``; ``code`` the driver's ``CUresult`` where one failed."""

    def __init__(self, message: str, *, reason: str, code: int | None = None) -> None:
        self.reason = reason
        self.code = code
        super().__init__(message)


class DeviceError(DeployError):
    """A CUDA driver call failed on a host that has a device (``call`` names it, ``code`` is its
    ``CUresult``)."""

    status: ClassVar[str] = "PBSDK_ERR_LIBRARY"

    def __init__(self, message: str, *, call: str, code: int) -> None:
        self.call = call
        self.code = code
        super().__init__(message)


class InputError(DeployError):
    """A call's arguments do not match the entry's inputs (count, shape or dtype)."""

    status: ClassVar[str] = "PBSDK_ERR_INPUT"


__all__ = ["ChecksumError", "CpuFeatureError", "DeployError", "DeviceError", "DeviceUnavailableError", "FormatError", "InputError", "LibraryError",
           "TargetMismatchError", "TruncatedError", "VersionError"]
