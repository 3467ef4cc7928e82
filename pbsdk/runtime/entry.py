"""An entry point of a loaded file as the caller sees it: `Entry` checks the arguments against the
exported shapes and dtypes and allocates the outputs; the target's entry (`pbsdk.runtime.model.HostEntry`,
`pbsdk.runtime.cuda.CudaEntry`) runs the code. numpy only."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from pbsdk.runtime import format as fmt
from pbsdk.runtime.errors import InputError


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        try:
            import ml_dtypes
        except ImportError:
            raise InputError("this entry takes bfloat16 arrays, which need the ml_dtypes package") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


class Entry:
    """One entry point of a loaded file, called with numpy arrays (its inputs, in order); returns its
    output, or a tuple of them. Inputs must match the exported shapes and dtypes exactly (an `InputError`
    otherwise); non-contiguous ones are copied to C order. Outputs are fresh arrays on every call. This
    class checks the arguments; `HostEntry` and `pbsdk.runtime.cuda.CudaEntry` run the code."""

    def __init__(self, desc: fmt.EntryDesc) -> None:
        self.desc = desc
        self.name = desc.name
        self._in = [(t.shape, _numpy_dtype(t.dtype)) for t in desc.inputs]
        self._given = [_numpy_dtype(t.given) if t.given else None for t in desc.inputs]
        self._out = [(t.shape, _numpy_dtype(t.dtype)) for t in desc.outputs]

    @property
    def inputs(self) -> tuple[fmt.TensorDesc, ...]:
        return self.desc.inputs

    @property
    def outputs(self) -> tuple[fmt.TensorDesc, ...]:
        return self.desc.outputs

    def _arrays(self, args: Sequence[Any]) -> list[np.ndarray]:
        if len(args) != len(self._in):
            raise InputError(f"{self.name}: takes {len(self._in)} input(s) "
                             f"({', '.join(t.name for t in self.desc.inputs)}), got {len(args)}")
        arrays = []
        for i, (arg, (shape, dtype), given) in enumerate(zip(args, self._in, self._given)):
            if not isinstance(arg, np.ndarray):
                raise InputError(f"{self.name}: input {i} must be a numpy array, got {type(arg).__name__}")
            if arg.dtype != (given or dtype):
                raise InputError(f"{self.name}: input {i} ({self.desc.inputs[i].name}) has dtype {arg.dtype}, "
                                 f"expected {given or dtype}")
            if arg.shape != shape:
                raise InputError(f"{self.name}: input {i} ({self.desc.inputs[i].name}) has shape {arg.shape}, "
                                 f"expected {shape}")
            # Integers the code takes as floats (`TensorDesc.given`) are converted; others copied if strided.
            arrays.append(arg.astype(dtype, order="C") if given is not None else np.ascontiguousarray(arg))
        return arrays

    def __call__(self, *args: Any) -> Any:
        arrays = self._arrays(args)
        outs = [np.empty(shape, dtype) for shape, dtype in self._out]
        self._run(arrays, outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _run(self, arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
        raise NotImplementedError

    def __repr__(self) -> str:
        ins = ", ".join(f"{t.name}: {t.dtype}{list(t.shape)}" for t in self.desc.inputs)
        return f"<pbsdk.runtime.Entry {self.name}({ins})>"
