"""Calling a compiled kernel from numpy: argument checks, output allocation, results."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from pbsdk.core.dims import Signature, is_dynamic
from pbsdk.core.errors import ArgumentError
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY
from pbsdk.core.target import DYNAMIC_SIZES, Artifact, Executable


def aligned_empty(nbytes: int, alignment: int = 64) -> np.ndarray:
    """An uninitialised byte array of ``nbytes`` bytes whose first byte is at an ``alignment``-byte address
    (buffers a kernel reads with aligned vector loads: packed weights, a workspace)."""
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes]


def _free_refs() -> int:
    """What ``sys.getrefcount`` says of an array that only `OutputPool`'s list holds, seen from its loop."""
    held = [np.empty(1)]
    for a in held:
        return sys.getrefcount(a)
    raise AssertionError


class OutputPool:
    """Output buffers for the calls of one kernel, taken back once nobody refers to them any more.

    Per output of at least ``min_bytes``, up to ``keep`` arrays handed out before are held; `take` gives
    one whose only remaining reference is this pool's (the caller dropped it, and every view of it: a
    numpy view, or a torch tensor made with ``torch.from_numpy``, keeps the array referenced). Otherwise a
    fresh array, held if there is room. So a loop that drops each result before the next call (or holds
    the previous one while computing the next: ``keep = 2``) reuses two buffers instead of mapping and
    faulting in fresh memory on every call; a caller that keeps every result gets fresh ones, as before.
    Smaller outputs are always fresh (malloc serves them without faults). Thread-safe: an array is
    marked taken (referenced) before the lock is released."""

    KEEP = 2
    MIN_BYTES = 1 << 20
    _FREE = _free_refs()

    def __init__(self, outputs: Sequence[tuple[tuple[int, ...], np.dtype]], *, keep: int = KEEP,
                 min_bytes: int = MIN_BYTES) -> None:
        self._outputs = [(tuple(int(d) for d in shape), np.dtype(dtype),
                          int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize >= min_bytes)
                         for shape, dtype in outputs]
        self._keep = keep
        self._held: list[list[np.ndarray]] = [[] for _ in outputs]
        self._lock = threading.Lock()

    def take(self) -> list[np.ndarray]:
        outs: list[np.ndarray] = []
        with self._lock:
            for (shape, dtype, pooled), held in zip(self._outputs, self._held):
                if pooled:
                    for a in held:
                        if sys.getrefcount(a) <= self._FREE:
                            outs.append(a)
                            break
                    else:
                        a = np.empty(shape, dtype)
                        if len(held) < self._keep:
                            held.append(a)
                        outs.append(a)
                else:
                    outs.append(np.empty(shape, dtype))
        return outs


class Kernel:
    """A loaded artifact callable with numpy arrays.

    Inputs must match the compiled shapes and dtypes exactly (a mismatch is an `ArgumentError`, never a
    silent conversion). Non-contiguous inputs are copied to C order first (documented; no error). Outputs
    are freshly allocated on every call, so a returned array is never reused behind the caller's back.
    """

    SIZED = 64

    def __init__(self, artifact: Artifact, executable: Executable, *, name: str = "kernel") -> None:
        self.artifact = artifact
        self.executable = executable
        self.name = name
        self._in = [(shape, np.dtype(DTYPE_TO_NUMPY[dt])) for shape, dt in artifact.inputs]
        self._out = [(shape, np.dtype(DTYPE_TO_NUMPY[dt])) for shape, dt in artifact.outputs]
        #: Some dimension is known only at call time (`pbsdk.core.dims`): each call binds the sizes from
        #: the inputs, allocates outputs of the sizes they imply and passes the entry its sizes buffer.
        self.dynamic = any(is_dynamic(shape) for shape, _ in (*artifact.inputs, *artifact.outputs))
        #: The outputs' shapes and the sizes buffer of the input shapes seen last (at most `SIZED` of them).
        self._sized: dict[tuple[tuple[int, ...], ...], tuple[list[tuple[int, ...]], np.ndarray]] = {}
        self._signature = Signature([s for s, _ in artifact.inputs], [s for s, _ in artifact.outputs],
                                    artifact.metadata.get(DYNAMIC_SIZES, ()), what=name) if self.dynamic else None
        self._in_exact = [(tuple(d if isinstance(d, str) else int(d) for d in shape), dtype)
                          for shape, dtype in self._in]

    def __repr__(self) -> str:
        sig = ", ".join(f"{s}:{d}" for s, d in self.artifact.inputs)
        return f"<pbsdk.Kernel {self.name}({sig})>"

    def _fast_args(self, args: Sequence[Any]) -> list[np.ndarray] | None:
        """``args`` as they are when every one is a C-contiguous array of exactly the expected shape and
        dtype (the common case, checked in a few microseconds); None sends them to `check_args`. A dynamic
        kernel's shapes are checked by `sizes` instead."""
        if len(args) != len(self._in):
            return None
        dynamic = self.dynamic
        for arg, (shape, dtype) in zip(args, self._in_exact):
            if (type(arg) is not np.ndarray or arg.dtype != dtype or (arg.shape != shape and not dynamic)
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
            if not is_dynamic(shape) and tuple(arg.shape) != tuple(shape):
                raise ArgumentError(f"{self.name}: argument {i} has shape {tuple(arg.shape)}, expected {tuple(shape)}")
            # (np.ascontiguousarray would make a 0-d argument 1-d, which a dynamic signature then refuses.)
            arrays.append(arg if arg.flags.c_contiguous else np.ascontiguousarray(arg))
        return arrays

    def sizes(self, arrays: Sequence[np.ndarray]) -> tuple[list[tuple[int, ...]], np.ndarray | None]:
        """The outputs' shapes for inputs ``arrays`` (checked ones), and the sizes buffer a dynamic entry
        takes after its outputs (None for a static kernel)."""
        if self._signature is None:
            return [tuple(int(d) for d in shape) for shape, _ in self._out], None
        return self.sized(tuple(tuple(a.shape) for a in arrays))

    def sized(self, key: tuple[tuple[int, ...], ...]) -> tuple[list[tuple[int, ...]], np.ndarray]:
        """A dynamic kernel's outputs' shapes and sizes buffer for inputs of shapes ``key`` (remembered for
        the last `SIZED` keys); an `ArgumentError` when the shapes do not fit the signature."""
        assert self._signature is not None, "sized() is for dynamic kernels"
        known = self._sized.get(key)
        if known is None:
            outs, sizes = self._signature(key)
            buffer = np.array(sizes, dtype=np.int64)
            buffer.flags.writeable = False  # shared by every call of these shapes: the kernel only reads it
            if len(self._sized) >= self.SIZED:
                self._sized.clear()
            known = self._sized[key] = (outs, buffer)
        return known

    def __call__(self, *args: Any) -> Any:
        arrays = self._fast_args(args)
        if arrays is None:
            arrays = self.check_args(args)
        shapes, sizes = self.sizes(arrays)
        outs = [np.empty(shape, dtype) for shape, (_, dtype) in zip(shapes, self._out)]
        self.executable.run(arrays + outs + ([] if sizes is None else [sizes]))
        return outs[0] if len(outs) == 1 else tuple(outs)
