"""Activations that read a product more than once, traced op by op (leaky ReLU as ``where(x > 0, x, a * x)``,
SiLU as ``x * sigmoid(x)``), go into the contraction's kernel as its epilogue (isolate-contractions'
`_epilogue_region`, then fusion and pack-contractions), against numpy; an activation whose intermediate is
also returned stays outside and is still right."""

from __future__ import annotations

import re

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close

RNG = np.random.default_rng(32)


def _f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


W, B = _f32(96, 80, scale=0.1), _f32(80)


def _leaky(x, w):  # type: ignore[no-untyped-def]
    y = ops.matmul(x, w) + B
    y = y * 2.0
    return ops.where(ops.greater(y, 0.0), y, y * 0.1)


def _silu(x, w):  # type: ignore[no-untyped-def]
    y = ops.matmul(x, w) + B
    return y * ops.sigmoid(y) * 1.5


def _numpy_leaky(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    y = (x.astype(np.float64) @ w + B) * 2.0
    return np.where(y > 0, y, 0.1 * y)


def _numpy_silu(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    y = x.astype(np.float64) @ w + B
    return y / (1 + np.exp(-y)) * 1.5


def _fused_ops(notes: list[str]) -> int:
    (note,) = notes
    found = re.search(r"epilogue of (\d+) ops fused", note)
    return int(found[1]) if found else 0


# The kernel's epilogue holds the activation's ops, not only the bias (and scale) before it: without the
# region the leaky ReLU's kernel fuses 3 ops (bias, scale) and the SiLU's 1 (bias).
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("fn", "reference", "at_least"), [(_leaky, _numpy_leaky, 8), (_silu, _numpy_silu, 6)])
def test_activation_reading_the_product_twice_runs_in_the_kernel(fn, reference, at_least: int,  # type: ignore[no-untyped-def]
                                                                 threads: int, pack_notes) -> None:
    x, w = _f32(40, 96), W
    notes = pack_notes(fn, {"threads": threads}, x, w)
    assert _fused_ops(notes) >= at_least, notes
    got = pbsdk.jit(fn, options={"threads": threads, "cache": False})(x, w)
    assert_close(got, reference(x, w).astype(np.float32), op="matmul", reduction_size=96)


def test_activation_whose_mask_is_returned_stays_outside_and_is_right() -> None:
    def fn(x, w):  # type: ignore[no-untyped-def]
        y = ops.matmul(x, w) + B
        mask = ops.greater(y, 0.0)
        return ops.where(mask, y, y * 0.1), mask

    x = _f32(40, 96)
    got, mask = pbsdk.jit(fn, options={"cache": False})(x, W)
    y = x.astype(np.float64) @ W + B
    assert_close(got, np.where(y > 0, y, 0.1 * y).astype(np.float32), op="matmul", reduction_size=96)
    np.testing.assert_array_equal(np.asarray(mask) != 0, y > 0)
