"""Grouped convolutions (not depthwise) as one batched contraction over their groups
(`pbsdk.core.ir.emit.grouped_as_batch`) or, f32 where the planner finds it cheaper, a direct kernel: against numpy in both layouts, strides, dilations, rectangular
kernels, groups with one input channel and a channel multiplier, f32 on the packed vector-FMA kernels and
bf16 on the host's dot-product unit, whose counters must say so."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.spec import load_spec
from pbsdk.targets.cpu.pack_contractions import lowers_unit, unit_spec
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
RNG = np.random.default_rng(21)

# id, (N, C, H, W), (O, KH, KW), groups, stride, padding, dilation
CASES = [
    ("g8_3x3", (1, 64, 14, 14), (64, 3, 3), 8, 1, 1, 1),
    ("g2_stride2_rect", (2, 12, 11, 9), (10, 3, 1), 2, 2, (1, 0), 1),
    ("g4_dilated", (1, 16, 12, 12), (32, 3, 3), 4, 1, 2, 2),
    ("g3_1x1", (2, 24, 7, 7), (9, 1, 1), 3, 1, 0, 1),
    ("one_channel_per_group_x2", (1, 6, 9, 9), (12, 3, 3), 6, 1, 1, 1),
]


def _inputs(case: tuple, layout: str, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    _, (n, c, h, w), (o, kh, kw), groups, *_ = case
    x = RNG.standard_normal((n, c, h, w)).astype(np.float32)
    k = RNG.standard_normal((o, c // groups, kh, kw)).astype(np.float32)
    if layout == "NHWC":
        x, k = x.transpose(0, 2, 3, 1).copy(), k.transpose(2, 3, 1, 0).copy()
    return x.astype(dtype), k.astype(dtype)


def _conv(case: tuple, layout: str):
    _, _, _, groups, stride, padding, dilation = case
    return lambda x, w: ops.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups,
                                   layout=layout)


def _contractions(fn: pbsdk.JitFunction, *args: np.ndarray) -> list[dict]:
    exe = fn.kernel(fn._signature(args))[0].executable
    return list(exe.resources["contractions"])


def _route(fn: pbsdk.JitFunction, *args: np.ndarray):
    """The planner's route for the program's one convolution (`pbsdk.core.ir.emit.direct_conv_route`)."""
    from pbsdk.core.ir.emit import direct_conv_route
    from pbsdk.core.options import parse_options
    from pbsdk.frontends.jit import trace

    graph, _ = trace(fn.fn, fn._signature(args))
    (node,) = [n for n in graph.live_nodes() if n.op == "conv2d"]
    return direct_conv_route(node, load_spec("host"), parse_options({}))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_grouped_conv_f32_runs_where_the_planner_says(case: tuple, layout: str) -> None:
    """One batched contraction over the groups, or the direct kernel (`pbsdk.core.plan.direct_conv`) where
    the planner finds it cheaper — groups of 8 channels (g8_3x3) always on a host with a vector unit."""
    _, (_, c, _, _), (_, kh, kw), groups, stride, padding, dilation = case
    x, w = _inputs(case, layout, np.dtype(np.float32))
    fn = pbsdk.jit(_conv(case, layout), options={"cache": False})
    got = fn(x, w)
    want = ref.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    assert_close(got, want, op="conv2d", reduction_size=c // groups * kh * kw)
    records = _contractions(fn, x, w)
    route = _route(fn, x, w)
    if route is not None and route.direct:
        assert records == [], (route.reason, records)
    else:
        assert [r["batch"] for r in records] == [groups], records
    if case[0] == "g8_3x3" and load_spec("host").vector is not None:
        assert route is not None and route.direct, route


@pytest.mark.skipif(not lowers_unit(load_spec("host"), "vdpbf16ps"), reason="this host has no AVX512-BF16 (vdpbf16ps)")
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_grouped_conv_bf16_on_the_unit(case: tuple, layout: str) -> None:
    _, (_, c, _, _), (_, kh, kw), groups, stride, padding, dilation = case
    x, w = _inputs(case, layout, BF16)
    fn = pbsdk.jit(lambda a, b: ops.astype(ops.astype(_conv(case, layout)(a, b), "f32"), "bf16"),
                   options={"cache": False})
    got = fn(x, w)
    want = ref.conv2d(x.astype(np.float32), w.astype(np.float32), stride=stride, padding=padding,
                      dilation=dilation, groups=groups, layout=layout).astype(BF16)
    assert_close(got, want, op="conv2d", dtype="bf16", reduction_size=c // groups * kh * kw, accumulator="f32")
    records = _contractions(fn, x, w)
    # the host's first bf16 unit the cpu target lowers: vdpbf16ps, or AMX's tdpbf16ps where the host has it
    unit = next(u.name for u in unit_spec(load_spec("host"))[0].matrix_units if u.operand_dtype == "bf16")
    assert [(r["batch"], r["compute"], r.get("unit")) for r in records] == [(groups, "matrix-unit", unit)], records
