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
def runtime_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Python of a fresh virtualenv holding only the ``pbsdk-runtime`` wheel and numpy
    (`test_isolated.runtime_venv`)."""
    from test_isolated import runtime_venv

    return runtime_venv(tmp_path_factory.mktemp("runtime-venv"))


@pytest.fixture(scope="session")
def exported_mlp(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    import pbsdk

    mlp = _mlp()
    x = np.random.default_rng(1).standard_normal((8, 96)).astype(np.float32)
    path = pbsdk.export(mlp, (x,), tmp_path_factory.mktemp("deploy") / "mlp.pbsdk")
    return Exported(path, (x,), tuple(mlp(x)), mlp)


def _layer_weights() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(5)
    return rng.standard_normal((64, 32)).astype(np.float32), rng.standard_normal(32).astype(np.float32)


@pytest.fixture(scope="session")
def exported_template(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """A layer with weights (matrix unit, vector ops, DMA on the emulated chip) exported for the template
    target's default spec (example/npu); ``expected`` is the JIT's template run."""
    import pbsdk
    from pbsdk import ops

    w, b = _layer_weights()

    @pbsdk.jit(target="template")
    def layer(x: Any) -> Any:
        return ops.softmax(ops.gelu(x @ w + b), axis=-1)

    x = np.random.default_rng(6).standard_normal((16, 64)).astype(np.float32)
    path = pbsdk.export(layer, (x,), tmp_path_factory.mktemp("deploy-template") / "layer.pbsdk")
    return Exported(path, (x,), (layer(x),), layer)


@pytest.fixture(scope="session")
def exported_nvgpu(tmp_path_factory: pytest.TempPathFactory) -> Exported:
    """An f16 layer with a weight exported for nvgpu (spec ``$PBSDK_GPU_SPEC``, default nvidia/h100), its
    PTX assembled by ptxas (skipped without it); ``expected`` is numpy's result in f32, ``jit`` the bundle
    the target compiled (`pbsdk.targets.nvgpu.bundle`), for comparison with the file."""
    import os

    import pbsdk
    from pbsdk import ops
    from pbsdk.targets.nvgpu.ptxas import find_ptxas

    if find_ptxas() is None:
        pytest.skip("no ptxas: the nvgpu export assembles its PTX")
    w = (_layer_weights()[0] / 8).astype(np.float16)

    @pbsdk.jit(target="nvgpu", spec=os.environ.get("PBSDK_GPU_SPEC", "nvidia/h100"))
    def layer(x: Any) -> Any:
        return ops.relu(x @ w)

    x = np.random.default_rng(7).standard_normal((16, 64)).astype(np.float16)
    path = pbsdk.export(layer, (x,), tmp_path_factory.mktemp("deploy-nvgpu") / "layer.pbsdk")
    expected = np.maximum(x.astype(np.float32) @ w.astype(np.float32), 0)
    return Exported(path, (x,), (expected,), layer.artifact(layer._signature((x,))))
