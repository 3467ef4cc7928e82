"""Constant B operands (frozen weights) packed at compile time for the cpu kernels (`pbsdk.targets.cpu.
prepack`), against numpy.

Shapes are chosen against the packed layout: columns that are not a multiple of the register tile (the last
panel is zero-padded and its extra columns must never be stored), a row count of one (the matrix-vector
shape, which otherwise reads B in place), row counts past one tile and one A block, k past one k block (the
kernel reads rows pc..pc+kc of every panel), 1 and 2 threads (split along m: both threads read the one
packed copy; along n: each reads its own panels), a fused bias + relu, and convolution weights (implicit GEMM
and im2col). Each case checks that the weight was packed at compile time, so a silent fallback fails."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.ir.graph import TensorType
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(5)

# id, m, k, n
MATMULS = [
    ("gemv", 1, 300, 1000),
    ("small_tail", 5, 64, 70),
    ("rows_past_a_tile", 200, 130, 250),
    ("k_past_a_block", 40, 700, 96),
    ("n_split", 16, 256, 2000),
]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", MATMULS, ids=lambda c: c[0])
def test_constant_weight_matmul(case: tuple, threads: int, pack_notes) -> None:
    _, m, k, n = case
    w = RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal((n,)).astype(np.float32)
    x = RNG.standard_normal((m, k)).astype(np.float32)

    def layer(a):
        return ops.relu(ops.add(ops.matmul(a, w), bias))

    options = {"threads": threads}
    notes = pack_notes(layer, options, TensorType((m, k), "f32"))
    assert any("B packed at compile time" in s for s in notes), notes
    got = pbsdk.jit(layer, options={"cache": False, **options})(x)
    assert_close(got, ref.relu(ref.add(ref.matmul(x, w), bias)), op="matmul", reduction_size=k)


def test_a_transposed_weight_is_packed_too(pack_notes) -> None:
    """``x @ w.T`` (every nn.Linear): the emitter folds the transpose, the target packs the result."""
    w = RNG.standard_normal((90, 48)).astype(np.float32)
    x = RNG.standard_normal((33, 48)).astype(np.float32)

    def linear(a):
        return ops.matmul(a, w, transpose_b=True)

    assert any("B packed at compile time" in s for s in pack_notes(linear, {}, TensorType((33, 48), "f32")))
    assert_close(pbsdk.jit(linear, options={"cache": False})(x), ref.matmul(x, w.T), op="matmul", reduction_size=48)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("channels", [3, 32])  # 3: the stem's runs; 32: one tap's channels per run
def test_constant_convolution_weights(channels: int, threads: int, pack_notes) -> None:
    w = RNG.standard_normal((3, 3, channels, 40)).astype(np.float32)
    x = RNG.standard_normal((2, 11, 13, channels)).astype(np.float32)

    def conv(a):
        return ops.conv2d(a, w, stride=1, padding=1, layout="NHWC")

    # the contraction's packing (3 channels alone would take the direct kernel: tests/numerics/test_direct_conv.py)
    options = {"threads": threads, "direct_conv": False}
    notes = pack_notes(conv, options, TensorType(x.shape, "f32"))
    assert any("B packed at compile time" in s for s in notes), notes
    got = pbsdk.jit(conv, options={**options, "cache": False})(x)
    assert_close(got, ref.conv2d(x, w, stride=1, padding=1, layout="NHWC"), op="conv2d",
                 reduction_size=9 * channels)


def test_the_option_keeps_the_weight_as_given(pack_notes) -> None:
    w = RNG.standard_normal((64, 64)).astype(np.float32)
    notes = pack_notes(lambda a: ops.matmul(a, w), {"prepack_b": False}, TensorType((20, 64), "f32"))
    assert notes and not any("compile time" in s for s in notes)
    f = pbsdk.jit(lambda a: ops.matmul(a, w), options={"cache": False, "prepack_b": False})
    kernel, _ = f.kernel((TensorType((20, 64), "f32"),))
    assert kernel.artifact.constants[0].shape == (64, 64)



@pytest.mark.parametrize("batch", [1, 2])
def test_a_late_nchw_1x1_conv_runs_in_nhwc_with_packed_weights(batch: int, pack_notes) -> None:
    """A 1x1 NCHW conv over 7x7 pixels: as given its 49 pixels would leave a register tile half masked and
    its weights would be packed (and, past one image, copied) on every call; the planner runs it in NHWC,
    where the weights are B, packed at compile time."""
    w = (RNG.standard_normal((256, 1024, 1, 1)) / 32).astype(np.float32)
    x = RNG.standard_normal((batch, 1024, 7, 7)).astype(np.float32)

    def conv(a):
        return ops.conv2d(a, w, stride=1, padding=0, layout="NCHW")

    notes = pack_notes(conv, {}, TensorType(x.shape, "f32"))
    assert any(f"matmul {batch * 49}x256x1024" in s and "B packed at compile time" in s for s in notes), notes
    got = pbsdk.jit(conv, options={"cache": False})(x)
    assert_close(got, ref.conv2d(x, w, stride=1, padding=0, layout="NCHW"), op="conv2d", reduction_size=1024)
    # without the layout change it runs as given: per image, weights as A
    notes = pack_notes(conv, {"conv_nhwc": False}, TensorType(x.shape, "f32"))
    assert not any("B packed at compile time" in s for s in notes), notes
