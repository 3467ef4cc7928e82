"""The converter tables of the frontends (torch, JAX, ONNX): one decorator registers a function for
several source op names."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Converter = Callable[..., Any]


def registrar(table: dict[str, Converter]) -> Callable[..., Callable[[Converter], Converter]]:
    """``converts = registrar(CONVERTERS)``; then ``@converts("aten.add.Tensor", ...)`` enters the
    decorated function in ``table`` under each name."""

    def converts(*names: str) -> Callable[[Converter], Converter]:
        def register(fn: Converter) -> Converter:
            for name in names:
                table[name] = fn
            return fn
        return register

    return converts
