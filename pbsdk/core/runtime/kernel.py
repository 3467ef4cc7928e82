"""Calling a compiled kernel from numpy: argument checks, output allocation, results."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pbsdk.core.errors import ArgumentError
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY
from pbsdk.core.target import Artifact, Executable


def aligned_empty(nbytes: int, alignment: int = 64) -> np.ndarray:
    """An uninitialised byte array of ``nbytes`` bytes whose first byte is at an ``alignment``-byte address
    (buffers a kernel reads with aligned vector loads: packed weights, a workspace)."""
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes]


class Kernel:
    """A loaded artifact callable with numpy arrays.

    Inputs must match the compiled shapes and dtypes exactly (a mismatch is an `ArgumentError`, never a
    silent conversion). Non-contiguous inputs are copied to C order first (documented; no error). Outputs
    are freshly allocated on every call, so a returned array is never reused behind the caller's back.
    """

    def __init__(self, artifact: Artifact, executable: Executable, *, name: str = "kernel") -> None:
        self.artifact = artifact
        self.executable = executable
        self.name = name
        self._in = [(shape, np.dtype(DTYPE_TO_NUMPY[dt])) for shape, dt in artifact.inputs]
        self._in_exact = [(tuple(int(d) for d in shape), dtype) for shape, dtype in self._in]
        self._out = [(shape, np.dtype(DTYPE_TO_NUMPY[dt])) for shape, dt in artifact.outputs]

    def __repr__(self) -> str:
        sig = ", ".join(f"{s}:{d}" for s, d in self.artifact.inputs)
        return f"<pbsdk.Kernel {self.name}({sig})>"

    def _fast_args(self, args: Sequence[Any]) -> list[np.ndarray] | None:
        """``args`` as they are when every one is a C-contiguous array of exactly the expected shape and
        dtype (the common case, checked in a few microseconds); None sends them to `check_args`."""
        if len(args) != len(self._in):
            return None
        for arg, (shape, dtype) in zip(args, self._in_exact):
            if (type(arg) is not np.ndarray or arg.dtype != dtype or arg.shape != shape
                    or not arg.flags.c_contiguous):
                return None
        return list(args)

    def check_args(self, args: Sequence[Any]) -> list[np.ndarray]:
        if len(args) != len(self._in):
            raise ArgumentError(f"{self.name}: expected {len(self._in)} arguments, got {len(args)}")
        arrays = []
        for i, (arg, (shape, dtype)) in enumerate(zip(args, self._in)):
            if not isinstance(arg, np.ndarray):
                if isinstance(arg, (int, float, np.generic)) and shape == ():
                    arg = np.asarray(arg, dtype=dtype)
                else:
                    raise ArgumentError(f"{self.name}: argument {i} must be a numpy array, got {type(arg).__name__}")
            if arg.dtype != dtype:
                raise ArgumentError(f"{self.name}: argument {i} has dtype {arg.dtype}, expected {dtype}")
            if tuple(arg.shape) != tuple(shape):
                raise ArgumentError(f"{self.name}: argument {i} has shape {tuple(arg.shape)}, expected {tuple(shape)}")
            arrays.append(np.ascontiguousarray(arg))
        return arrays

    def __call__(self, *args: Any) -> Any:
        arrays = self._fast_args(args)
        if arrays is None:
            arrays = self.check_args(args)
        outs = [np.empty(shape, dtype) for shape, dtype in self._out]
        self.executable.run(arrays + outs)
        return outs[0] if len(outs) == 1 else tuple(outs)
