"""Tracing Python functions written with `pbsdk.ops` into a `Graph`."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from pbsdk.core.errors import ArgumentError, PbsdkError, UnsupportedError
from pbsdk.core.ir.graph import NUMPY_TO_DTYPE, Graph, TensorType, Value

_state = threading.local()


def current_graph() -> Graph:
    graph = getattr(_state, "graph", None)
    if graph is None:
        raise PbsdkError("pbsdk.ops work on traced tensors: call them inside a function decorated with @pbsdk.jit")
    return graph


@contextlib.contextmanager
def tracing(graph: Graph) -> Iterator[Graph]:
    previous = getattr(_state, "graph", None)
    _state.graph = graph
    try:
        yield graph
    finally:
        _state.graph = previous


class Tensor:
    """A traced tensor: a graph value with numpy-like operators."""

    __array_priority__ = 1000  # numpy scalars/arrays on the left defer to our reflected operators

    def __init__(self, value: Value, graph: Graph) -> None:
        self.value = value
        self.graph = graph

    @property
    def shape(self) -> tuple[int, ...]:
        return self.value.shape

    @property
    def dtype(self) -> str:
        return self.value.dtype

    @property
    def ndim(self) -> int:
        return len(self.value.shape)

    def __repr__(self) -> str:
        return f"Tensor({self.value.type})"

    def __bool__(self) -> bool:
        raise PbsdkError("a traced tensor has no truth value: data-dependent Python control flow cannot be traced")

    # Operators delegate to pbsdk.ops (imported lazily to avoid a cycle).
    def _ops(self) -> Any:
        from pbsdk import ops
        return ops

    def __add__(self, o: Any) -> Tensor: return self._ops().add(self, o)
    def __radd__(self, o: Any) -> Tensor: return self._ops().add(o, self)
    def __sub__(self, o: Any) -> Tensor: return self._ops().sub(self, o)
    def __rsub__(self, o: Any) -> Tensor: return self._ops().sub(o, self)
    def __mul__(self, o: Any) -> Tensor: return self._ops().mul(self, o)
    def __rmul__(self, o: Any) -> Tensor: return self._ops().mul(o, self)
    def __truediv__(self, o: Any) -> Tensor: return self._ops().div(self, o)
    def __rtruediv__(self, o: Any) -> Tensor: return self._ops().div(o, self)
    def __pow__(self, o: Any) -> Tensor: return self._ops().pow(self, o)
    def __rpow__(self, o: Any) -> Tensor: return self._ops().pow(o, self)
    def __matmul__(self, o: Any) -> Tensor: return self._ops().matmul(self, o)
    def __rmatmul__(self, o: Any) -> Tensor: return self._ops().matmul(o, self)
    def __neg__(self) -> Tensor: return self._ops().neg(self)

    @property
    def T(self) -> Tensor:
        return self._ops().transpose(self)

    def reshape(self, *shape: Any) -> Tensor:
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return self._ops().reshape(self, shape)


def input_type(array: Any, index: int) -> TensorType:
    """The traced type of a jit argument; rejects what pbsdk cannot take."""
    if not isinstance(array, np.ndarray):
        if isinstance(array, (int, float, np.generic)):
            array = np.asarray(array, dtype=np.float32 if isinstance(array, (int, float)) else None)
        else:
            raise ArgumentError(f"argument {index}: expected a numpy array, got {type(array).__name__}")
    dtype = NUMPY_TO_DTYPE.get(array.dtype.name)
    if dtype is None:
        raise UnsupportedError(
            f"argument {index}: dtype {array.dtype} is not supported "
            f"(supported: {', '.join(sorted(NUMPY_TO_DTYPE))})")
    if any(d == 0 for d in array.shape):
        raise ArgumentError(f"argument {index}: shape {array.shape} has an empty dimension; pbsdk needs sizes >= 1")
    return TensorType(tuple(int(d) for d in array.shape), dtype)
