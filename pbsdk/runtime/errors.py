"""The runtime's typed errors. Loading a damaged or foreign file, or calling an entry with the wrong
arguments, raises one of these; none of them is ever a crash.

The runtime imports nothing of pbsdk's compiler, so these do not derive from ``pbsdk.PbsdkError``.
"""

from __future__ import annotations


class DeployError(Exception):
    """Base class of every error the runtime raises deliberately."""


class FormatError(DeployError):
    """The file is not a pbsdk deploy artifact, or its manifest does not describe a valid one."""


class TruncatedError(FormatError):
    """The file is shorter than its header says (a partial copy or download)."""


class ChecksumError(FormatError):
    """A section's bytes do not match the checksum recorded for them (the section is named in
    ``section``): the file was damaged after export."""

    def __init__(self, message: str, *, section: str) -> None:
        self.section = section
        super().__init__(message)


class VersionError(FormatError):
    """The file's format version is not one this runtime reads."""


class TargetMismatchError(DeployError):
    """The code was compiled for another target or platform (an nvgpu artifact on the cpu runtime, an
    aarch64 library on x86-64)."""


class CpuFeatureError(TargetMismatchError):
    """The code uses CPU features this host lacks (e.g. AVX-512 code on an AVX2 machine); ``missing``
    names them."""

    def __init__(self, message: str, *, missing: tuple[str, ...]) -> None:
        self.missing = missing
        super().__init__(message)


class LibraryError(DeployError):
    """The dynamic loader refused the code (a missing system library such as libgomp)."""


class InputError(DeployError):
    """A call's arguments do not match the entry's inputs (count, shape or dtype)."""


__all__ = ["ChecksumError", "CpuFeatureError", "DeployError", "FormatError", "InputError", "LibraryError",
           "TargetMismatchError", "TruncatedError", "VersionError"]
