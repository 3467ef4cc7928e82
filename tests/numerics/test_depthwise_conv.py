"""Depthwise convolutions (groups = input = output channels) against numpy: emitted channels last
(`pbsdk.core.plan.window.depthwise_layout`) and run by the cpu target's register-tiled kernel (stage
``depthwise``, `pbsdk.targets.cpu.depthwise_kernel`).

Shapes are chosen against the kernel: channels that are not a multiple of the 16-lane vector (a masked
tail; 8 channels: the mask alone), rows whose width is not a multiple of the register tile (a tail tile),
strides, dilations, asymmetric padding, rectangular kernels, batches, NCHW (transposed around the kernel)
and NHWC graphs, weights as an input and as a constant, 1 and 2 threads. Each case checks that the kernel
was built, so a silent fallback to the generic loop nest fails; what the kernel does not take (f64, a
channel multiplier) still computes the convolution."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(15)

# id, (N, C, H, W), (KH, KW), stride, padding, dilation
CASES = [
    ("c20_masked_tail", (1, 20, 9, 11), (3, 3), 1, 1, 1),
    ("c72_5x5_stride2", (1, 72, 14, 14), (5, 5), 2, 2, 1),
    ("c32_5x5_stride2_batch3", (3, 32, 13, 15), (5, 5), 2, 2, 1),
    ("dilation2_asymmetric_pad", (1, 24, 12, 10), (3, 3), 1, ((2, 1), (0, 2)), 2),
    ("c8_mask_only_rect_3x5", (2, 8, 10, 17), (3, 5), (1, 2), (1, 2), 1),
    ("row_of_61_tail_tile", (1, 16, 5, 61), (3, 3), 1, 1, 1),
]


def _inputs(case: tuple) -> tuple[np.ndarray, np.ndarray]:
    _, (n, c, h, w), (kh, kw), *_ = case
    return (RNG.standard_normal((n, c, h, w)).astype(np.float32),
            RNG.standard_normal((c, 1, kh, kw)).astype(np.float32))


def _kernels(fn, options: dict, *args: np.ndarray) -> int:
    """How many depthwise kernels the cpu target built for ``fn`` on ``args``."""
    f = pbsdk.jit(fn, options=options)
    return str(compile_text(f.lower(*args), f.request, stop_after="depthwise")).count("func.func @__pbsdk_dw")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_depthwise_nchw_matches_numpy(case: tuple, threads: int) -> None:
    _, (_, c, _, _), (kh, kw), stride, padding, dilation = case
    x, w = _inputs(case)

    def conv(a, b):
        return ops.conv2d(a, b, stride=stride, padding=padding, dilation=dilation, groups=c)

    options = {"threads": threads}
    got = pbsdk.jit(conv, options=options)(x, w)
    expect = ref.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=c)
    assert got.shape == expect.shape
    assert_close(got, expect, op="conv2d", reduction_size=kh * kw)
    assert _kernels(conv, options, x, w) == 1


def test_depthwise_nhwc_constant_weights_and_epilogue() -> None:
    """An NHWC graph (no transposes) with frozen weights, then bias + relu."""
    case = CASES[3]
    _, (n, c, h, wd), (kh, kw), stride, padding, dilation = case
    x = RNG.standard_normal((n, h, wd, c)).astype(np.float32)
    w = RNG.standard_normal((kh, kw, 1, c)).astype(np.float32)
    bias = RNG.standard_normal((c,)).astype(np.float32)

    def conv(a):
        y = ops.conv2d(a, w, stride=stride, padding=padding, dilation=dilation, groups=c, layout="NHWC")
        return ops.relu(ops.add(y, bias))

    got = pbsdk.jit(conv)(x)
    expect = ref.relu(ref.add(ref.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=c,
                                         layout="NHWC"), bias))
    assert_close(got, expect, op="conv2d", reduction_size=kh * kw)
    assert _kernels(conv, {}, x) == 1


def test_what_the_kernel_does_not_take_still_computes() -> None:
    """f64, a channel multiplier (two output channels per group), conv_nhwc=False and a layer the planner
    keeps as given (3x3, stride 2, 72 channels: too few taps per transposed element) keep the generic loop
    nest, correctly."""
    x, w = _inputs(CASES[0])
    c = x.shape[1]

    def conv(a, b):
        return ops.conv2d(a, b, padding=1, groups=c)

    x64, w64 = x.astype(np.float64), w.astype(np.float64)
    assert_close(pbsdk.jit(conv)(x64, w64), ref.conv2d(x64, w64, padding=1, groups=c), op="conv2d",
                 reduction_size=9)
    assert _kernels(conv, {}, x64, w64) == 0
    w2 = RNG.standard_normal((2 * c, 1, 3, 3)).astype(np.float32)
    assert_close(pbsdk.jit(conv)(x, w2), ref.conv2d(x, w2, padding=1, groups=c), op="conv2d", reduction_size=9)
    assert _kernels(conv, {}, x, w2) == 0
    assert_close(pbsdk.jit(conv, options={"conv_nhwc": False})(x, w), ref.conv2d(x, w, padding=1, groups=c),
                 op="conv2d", reduction_size=9)
    assert _kernels(conv, {"conv_nhwc": False}, x, w) == 0
    x72, w72 = _inputs(("shallow", (1, 72, 14, 14), (3, 3)))

    def strided(a, b):
        return ops.conv2d(a, b, stride=2, padding=1, groups=72)

    assert_close(pbsdk.jit(strided)(x72, w72), ref.conv2d(x72, w72, stride=2, padding=1, groups=72), op="conv2d",
                 reduction_size=9)
    assert _kernels(strided, {}, x72, w72) == 0
