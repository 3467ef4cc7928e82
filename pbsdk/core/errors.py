"""Typed errors. Every error pbsdk raises on purpose is a `PbsdkError`; the CLI turns them into a
one-paragraph message and exit code 2, never a traceback."""

from __future__ import annotations


class PbsdkError(Exception):
    """Base class of every error pbsdk raises deliberately."""


class SpecError(PbsdkError):
    """A chip spec is malformed or inconsistent. The message names the file, the field path and why."""

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None) -> None:
        self.source = source
        self.field = field
        super().__init__(message)


class TargetError(PbsdkError):
    """A target plugin is missing, broken, clashes with another, or cannot handle a spec."""


class OptionsError(PbsdkError):
    """An unknown compile option, or a value of the wrong type. Names the option and the known ones."""


class CompileError(PbsdkError):
    """A pipeline stage failed. Names the stage, the op (where known) and the reason."""

    def __init__(self, reason: str, *, stage: str | None = None, op: str | None = None) -> None:
        self.stage = stage
        self.op = op
        self.reason = reason
        where = []
        if stage:
            where.append(f"stage '{stage}'")
        if op:
            where.append(f"op '{op}'")
        prefix = ("in " + ", ".join(where) + ": ") if where else ""
        super().__init__(prefix + reason)


class UnsupportedError(CompileError):
    """An op, dtype or shape that a target (or pbsdk) does not support."""


class DynamicShapeError(UnsupportedError):
    """A dynamic (``?``) dimension where a stage, a target or a frontend compiles static sizes only. A
    frontend that meets it compiles the graph once per concrete shape instead (logged), never a wrong
    result."""


class ArgumentError(PbsdkError):
    """Wrong arity, shape, dtype or layout of the arguments passed to a compiled function."""


class DeviceUnavailableError(PbsdkError):
    """A compiled artifact needs a device this machine does not have (e.g. running nvgpu code here)."""


class CacheWarning(UserWarning):
    """A compile-cache entry was unreadable (and has been removed), the cache directory is unusable, or its
    remote tier failed (`pbsdk.core.runtime.cache`, `pbsdk.core.runtime.remote`): a warning, never an error."""
