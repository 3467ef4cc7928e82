"""ONNX import: ``pbsdk.onnx.load("model.onnx", target="cpu")`` compiles a model; call it on numpy arrays.

``pbsdk.onnx.Backend`` runs the official ONNX backend (node) tests against any target. Needs the ``onnx``
extra (``pip install 'pbsdk[onnx]'``).
"""

from __future__ import annotations

from typing import Any

from pbsdk.onnx.convert import CONVERTERS
from pbsdk.onnx.model import ImportOptions, ImportReport, OnnxModel, load

__all__ = ["CONVERTERS", "Backend", "ImportOptions", "ImportReport", "OnnxModel", "load", "supported_ops"]


def supported_ops() -> list[str]:
    """The ONNX op types pbsdk converts (any op whose inputs are known at import is folded besides)."""
    return sorted(CONVERTERS)


def __getattr__(name: str) -> Any:
    if name == "Backend":  # onnx.backend is imported only when asked for
        from pbsdk.onnx.backend import Backend
        return Backend
    raise AttributeError(name)
