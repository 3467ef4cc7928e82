"""Shared exports for the deploy tests: a small MLP with weights (two outputs) compiled for the host."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import pytest


@dataclasses.dataclass(frozen=True)
class Exported:
    path: Path
    inputs: tuple[np.ndarray, ...]
    expected: tuple[np.ndarray, ...]  # the JIT's outputs for ``inputs``
    jit: Any


def _mlp() -> Any:
    import pbsdk
    from pbsdk import ops

    rng = np.random.default_rng(0)
    w1 = rng.standard_normal((96, 64)).astype(np.float32)
    b1 = rng.standard_normal(64).astype(np.float32)
    w2 = rng.standard_normal((64, 16)).astype(np.float32)

    @pbsdk.jit(target="cpu")
    def mlp(x: Any) -> Any:
        h = ops.gelu(x @ w1 + b1)
        return ops.softmax(h @ w2, axis=-1), ops.sum(h, axis=-1)

    return mlp


@pytest.fixture(scope="session")
def exported_mlp(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    import pbsdk

    mlp = _mlp()
    x = np.random.default_rng(1).standard_normal((8, 96)).astype(np.float32)
    path = pbsdk.export(mlp, (x,), tmp_path_factory.mktemp("deploy") / "mlp.pbsdk")
    return Exported(path, (x,), tuple(mlp(x)), mlp)
