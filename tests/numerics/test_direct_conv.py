"""Convolutions on the cpu target's direct kernel (`pbsdk.core.plan.direct_conv`, stage ``direct-conv``):
grouped ones with narrow groups and few-channel ones, against numpy in both layouts, over the tile's
edges (a group narrower than the vector, a masked last vector, several vectors, a row's tail tile),
strides, dilations, rectangular kernels, weights given at run time or as constants, one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.ir.emit import direct_conv_route
from pbsdk.core.options import parse_options
from pbsdk.core.spec import load_spec
from pbsdk.frontends.jit import trace
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(33)

# id, (N, C, H, W), (O, KH, KW), groups, stride, padding, dilation
CASES = [
    ("g16_w16", (1, 128, 14, 14), (128, 3, 3), 8, 1, 1, 1),       # one 16-lane vector a group
    ("g16_w8", (1, 128, 10, 10), (128, 3, 3), 16, 1, 1, 1),       # 8-lane vectors
    ("g4_w4_masked_tail", (2, 16, 9, 31), (12, 3, 3), 4, 1, 1, 1),  # 3 outputs a group: a masked 4-lane vector
    ("g2_w24_two_vectors", (1, 48, 8, 12), (48, 3, 3), 2, 1, 1, 1),  # 16 + 8 masked lanes
    ("g8_stride2_dilated_rect", (1, 64, 17, 15), (64, 3, 5), 8, 2, (2, 4), 2),
    ("rgb_3to16", (4, 3, 16, 16), (16, 3, 3), 1, 1, 1, 1),       # few channels: im2col avoided
    ("rgb_3to24_stride2_5x5", (2, 3, 23, 23), (24, 5, 5), 1, 2, 2, 1),  # a 7x7 is a near tie: the contraction
]


def _inputs(case: tuple, layout: str) -> tuple[np.ndarray, np.ndarray]:
    _, (n, c, h, w), (o, kh, kw), groups, *_ = case
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    k = RNG.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
    if layout == "NHWC":
        x, k = x.transpose(0, 2, 3, 1).copy(), k.transpose(2, 3, 1, 0).copy()
    return x, k


def _conv(case: tuple, layout: str, weights: np.ndarray | None = None):
    _, _, _, groups, stride, padding, dilation = case
    if weights is not None:
        return lambda x: ops.conv2d(x, weights, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                    layout=layout)
    return lambda x, w: ops.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                   layout=layout)


def _route(fn: pbsdk.JitFunction, *args: np.ndarray):
    graph, _ = trace(fn.fn, fn._signature(args))
    (node,) = [n for n in graph.live_nodes() if n.op == "conv2d"]
    return direct_conv_route(node, load_spec("host"), parse_options({}))


def _has_vector_fma() -> bool:
    vec = load_spec("host").vector
    return vec is not None and vec.fma and "f32" in vec.dtypes


@pytest.mark.skipif(not _has_vector_fma(), reason="the host spec has no f32 vector FMA unit")
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_direct_conv_matches_numpy(case: tuple, layout: str, threads: int) -> None:
    _, (_, c, _, _), (_, kh, kw), groups, stride, padding, dilation = case
    x, w = _inputs(case, layout)
    fn = pbsdk.jit(_conv(case, layout), options={"cache": False, "threads": threads})
    route = _route(fn, x, w)
    assert route is not None and route.direct, route
    got = fn(x, w)
    want = ref.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    assert_close(got, want, op="conv2d", reduction_size=c // groups * kh * kw)
    assert "batch_matmul" not in fn.lower(x, w) and "linalg.matmul" not in fn.lower(x, w)
    assert fn.kernel(fn._signature((x, w)))[0].executable.resources["contractions"] == []


@pytest.mark.skipif(not _has_vector_fma(), reason="the host spec has no f32 vector FMA unit")
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_direct_conv_with_constant_weights(layout: str) -> None:
    """Frozen weights go to (KH, KW, CG, G*OG) at compile time (NCHW: from (O, CG, KH, KW))."""
    case = CASES[1]
    x, w = _inputs(case, layout)
    fn = pbsdk.jit(_conv(case, layout, w), options={"cache": False})
    want = ref.conv2d(x, w, stride=1, padding=1, groups=16, layout=layout)
    assert_close(fn(x), want, op="conv2d", reduction_size=8 * 9)
    assert "linalg.transpose" not in fn.lower(x)


def test_explain_names_the_route() -> None:
    """``explain`` says which route each convolution takes, and why."""
    x = np.zeros((1, 28, 28, 128), np.float32)
    w = np.zeros((3, 3, 16, 128), np.float32)
    text = pbsdk.jit(lambda a, b: ops.conv2d(a, b, padding=1, groups=8, layout="NHWC")).explain(x, w)
    route = _route(pbsdk.jit(lambda a, b: ops.conv2d(a, b, padding=1, groups=8, layout="NHWC")), x, w)
    assert route is not None and route.reason in text
