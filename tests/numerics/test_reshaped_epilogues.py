"""Epilogues that read a convolution's product through its reshape to NHWC / NCHW (isolate-contractions
rewrites them onto the product's loops; the packed kernel, implicit GEMM included, then applies them)
against numpy: batch norm with a scale computed at run time (between the patch copies and the kernel),
a residual, ReLU; a (1, O, 1, 1) bias of an NCHW 1x1 convolution; batch 2."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(23)


def _f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.standard_normal(shape) * scale).astype(np.float32)


def _fused(notes: list[str]) -> list[str]:
    return [s for s in notes if "epilogue of" in s]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("batch", [1, 2])
def test_nhwc_conv_batch_norm_residual_relu(batch: int, threads: int, pack_notes) -> None:
    x, w, res = _f32(batch, 10, 12, 24), _f32(3, 3, 24, 40, scale=0.2), _f32(batch, 10, 12, 40)
    mean, var, gamma, beta = _f32(40), np.abs(_f32(40)) + 0.5, _f32(40), _f32(40)

    def block(x, w, res, mean, var, gamma, beta):
        y = ops.conv2d(x, w, padding=1, layout="NHWC")
        y = (y - mean) * ops.rsqrt(var + 1e-5) * gamma + beta   # the scale is computed on every call
        return ops.relu(y + res)

    args = (x, w, res, mean, var, gamma, beta)
    notes = pack_notes(block, {"threads": threads}, *args)
    assert any("implicit GEMM" in s for s in _fused(notes)), notes
    got = pbsdk.jit(block, options={"threads": threads, "cache": False})(*args)
    y = ref.conv2d(x, w, padding=1, layout="NHWC")
    want = np.maximum((y - mean) / np.sqrt(var.astype(np.float64) + 1e-5) * gamma + beta + res, 0)
    assert_close(got, want.astype(np.float32), op="conv2d", reduction_size=9 * 24)


@pytest.mark.parametrize("threads", [1, 2])
def test_nchw_1x1_conv_bias_per_output_channel(threads: int, pack_notes) -> None:
    x, b = _f32(1, 64, 7, 7), _f32(48)
    w = _f32(48, 64, 1, 1, scale=0.2)   # frozen: a constant of the program

    def layer(x, b):
        return ops.relu(ops.conv2d(x, w) + ops.reshape(b, (1, 48, 1, 1)))

    assert _fused(pack_notes(layer, {"threads": threads}, x, b)), "the bias and ReLU run in the kernel"
    got = pbsdk.jit(layer, options={"threads": threads, "cache": False})(x, b)
    want = np.maximum(ref.conv2d(x, w) + b.reshape(1, 48, 1, 1), 0)
    assert_close(got, want.astype(np.float32), op="conv2d", reduction_size=64)


def test_off_with_fuse_epilogues(pack_notes) -> None:
    x, w, b = _f32(1, 8, 8, 16), _f32(3, 3, 16, 32, scale=0.2), _f32(32)
    layer = lambda x, w, b: ops.relu(ops.conv2d(x, w, padding=1, layout="NHWC") + b)
    assert not _fused(pack_notes(layer, {"fuse_epilogues": False}, x, w, b))
    got = pbsdk.jit(layer, options={"fuse_epilogues": False, "cache": False})(x, w, b)
    want = np.maximum(ref.conv2d(x, w, padding=1, layout="NHWC") + b, 0)
    assert_close(got, want.astype(np.float32), op="conv2d", reduction_size=144)


def test_constant_batch_norm_in_an_implicit_gemm(pack_notes) -> None:
    """Small constants (a frozen batch norm's) are module globals inside the contraction's function: the
    implicit-GEMM kernel reads them again at its call."""
    x, w = _f32(1, 9, 9, 16), _f32(3, 3, 16, 32, scale=0.2)
    mean, scale, beta = _f32(32), _f32(32), _f32(32)
    layer = lambda x, w: ops.relu((ops.conv2d(x, w, padding=1, layout="NHWC") - mean) * scale + beta)
    notes = pack_notes(layer, {"threads": 2}, x, w)
    assert any("implicit GEMM" in s and "epilogue of" in s for s in notes), notes
    got = pbsdk.jit(layer, options={"threads": 2, "cache": False})(x, w)
    want = np.maximum((ref.conv2d(x, w, padding=1, layout="NHWC") - mean) * scale + beta, 0)
    assert_close(got, want.astype(np.float32), op="conv2d", reduction_size=144)
