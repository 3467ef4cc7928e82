"""Transposed convolutions (`pbsdk.ops.conv_transpose`) by output phases (`pbsdk.core.plan.conv_transpose`)
or with zeros inserted, against the float64 definition (`pbsdk.testing.reference.conv_transpose`, itself
checked against torch): 1-D to 3-D, NCHW and 2-D NHWC, groups, phases with no taps, cropped and padded
phases, a dilated kernel."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.plan.conv_transpose import plan_conv_transpose
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(7)

# id, (N, Cin, *S), (Cout/groups, *K), groups, stride, padding, output_padding, dilation, route
CASES = [
    ("up2x_3x3", (1, 16, 9, 9), (8, 3, 3), 1, 2, 1, 1, 1, "phases"),
    ("4x4_s2_p1", (2, 8, 5, 6), (4, 4, 4), 1, 2, 1, 0, 1, "phases"),
    ("grouped_s2", (1, 12, 6, 6), (2, 3, 3), 3, 2, 1, 1, 1, "phases"),
    ("rect_s23_crop", (1, 4, 6, 7), (3, 5, 2), 1, (2, 3), (2, 0), (1, 2), 1, "phases"),
    ("kernel_below_stride", (1, 4, 5, 5), (4, 1, 2), 1, 3, 0, 0, 1, "matmul"),
    ("unet_k2s2", (2, 8, 5, 6), (4, 2, 2), 1, 2, 0, 0, 1, "matmul"),
    ("from_1x1", (2, 6, 1, 1), (4, 4, 4), 1, 1, 0, 0, 1, "matmul"),
    ("from_1x1_padded", (1, 6, 1, 1), (3, 4, 4), 1, 2, 1, 1, 1, "matmul"),
    ("gaps_cropped", (1, 4, 3, 4), (3, 2, 2), 1, 3, 1, 1, 1, "matmul"),
    ("grouped_k2s2", (1, 8, 3, 3), (2, 2, 2), 2, 2, 0, 0, 1, "phases"),
    ("1d_k3s3", (2, 5, 7), (3, 3), 1, 3, 0, 2, 1, "matmul"),
    ("3d_k2s2", (1, 4, 2, 3, 3), (2, 2, 2, 2), 1, 2, 0, 0, 1, "matmul"),
    ("dilated", (1, 4, 6, 6), (4, 3, 3), 1, 2, 1, 1, 2, "zeros"),
    ("stride1", (1, 4, 6, 6), (4, 3, 3), 1, 1, 1, 0, 1, "zeros"),
    ("1d_s2", (2, 6, 11), (5, 3), 1, 2, 1, 1, 1, "phases"),
    ("3d_s2", (1, 8, 4, 5, 5), (4, 3, 3, 3), 1, 2, 1, 1, 1, "phases"),
    ("3d_grouped_s2", (1, 4, 3, 4, 4), (2, 3, 3, 2), 2, 2, 1, 0, 1, "phases"),
]


def _case(case: tuple) -> tuple[np.ndarray, np.ndarray, dict]:
    _, xs, (cout_g, *k), groups, stride, padding, output_padding, dilation, _ = case
    x = RNG.standard_normal(xs).astype(np.float32)
    w = RNG.standard_normal((xs[1], cout_g, *k)).astype(np.float32)
    return x, w, {"stride": stride, "padding": padding, "output_padding": output_padding, "dilation": dilation,
                  "groups": groups}


def _axes(v, dims: int) -> tuple[int, ...]:
    return (v,) * dims if isinstance(v, int) else tuple(v)


def test_reference_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    f = torch.nn.functional
    for case in CASES:
        x, w, kw = _case(case)
        fn = {3: f.conv_transpose1d, 4: f.conv_transpose2d, 5: f.conv_transpose3d}[x.ndim]
        want = fn(torch.from_numpy(x).double(), torch.from_numpy(w).double(), **kw).numpy()
        np.testing.assert_allclose(ref.conv_transpose(x, w, **kw, dtype=np.float64), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_route(case: tuple) -> None:
    x, w, kw = _case(case)
    dims = x.ndim - 2
    plan = plan_conv_transpose(x.shape[2:], w.shape[2:], _axes(kw["stride"], dims), _axes(kw["padding"], dims),
                               _axes(kw["output_padding"], dims), _axes(kw["dilation"], dims), kw["groups"])
    assert plan.route == case[-1], plan.reason


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_conv_transpose_matches_the_definition(case: tuple, layout: str) -> None:
    x, w, kw = _case(case)
    if layout == "NHWC":
        if x.ndim != 4:
            pytest.skip("NHWC is 2-D only")
        x = np.ascontiguousarray(np.moveaxis(x, 1, -1))
    got = pbsdk.jit(lambda a, b: ops.conv_transpose(a, b, **kw, layout=layout), options={"cache": False})(x, w)
    want = ref.conv_transpose(x, w, **kw, layout=layout)
    taps = int(np.prod(w.shape[2:]))
    assert_close(got, want, op="conv2d", reduction_size=w.shape[0] // kw["groups"] * taps)


def test_nhwc_rejected_beyond_2d() -> None:
    x = np.zeros((1, 3, 3, 3, 4), np.float32)
    w = np.zeros((4, 2, 3, 3, 3), np.float32)
    with pytest.raises(pbsdk.PbsdkError, match="NHWC"):
        pbsdk.jit(lambda a, b: ops.conv_transpose(a, b, stride=2, layout="NHWC"))(x, w)


def test_grouped_phases_run_on_the_direct_kernel() -> None:
    """A grouped transposed convolution's phases go to the direct kernel (narrow groups), their weights
    strided views of the sliced kernel: every phase becomes a kernel call, none stays a loop nest."""
    from pbsdk.core.compiler import compile_text

    x, w, kw = _case(CASES[2])  # grouped_s2: 3 groups of 4 -> 2 channels
    x = np.ascontiguousarray(np.moveaxis(x, 1, -1))  # NHWC: each phase's weight a slice of the whole one
    f = pbsdk.jit(lambda a, b: ops.conv_transpose(a, b, **kw, layout="NHWC"), options={"cache": False})
    assert_close(f(x, w), ref.conv_transpose(x, w, **kw, layout="NHWC"), op="conv2d", reduction_size=4 * 9)
    text = str(compile_text(f.lower(x, w), f.request, stop_after="direct-conv"))
    assert text.count("call @__pbsdk_conv") == 4, text[-3000:]
    assert '"reduction", "reduction", "reduction"' not in text


def test_phases_are_woven_in_one_write_each_from_folded_weights() -> None:
    """The graph of a strided transposed convolution: the input padded once for every phase (one
    concatenation per padded axis), its phases written into the output by one `interleave` (no stacking
    concatenations, no reshapes of the output), and, with a constant weight, every phase's sub-kernel a
    constant (no slice, flip or transpose of the weight left to run a call)."""
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.frontends.jit import trace

    x, w, kw = _case(CASES[0])
    graph, _ = trace(lambda a: ops.conv_transpose(a, w, **kw), (TensorType(x.shape, "f32"),))
    live = [n.op for n in graph.live_nodes()]
    assert live.count("interleave") == 1 and live.count("concat") == 2 and "reshape" not in live
    assert live.count("conv2d") == 4
    weights = {n.inputs[1].id for n in graph.live_nodes() if n.op == "conv2d"}
    assert all(n.op == "const" for n in graph.live_nodes() if n.out.id in weights)


# parts shape, axes, strides, output shape
WEAVES = [
    ((2, 3, 4), (1,), (2,), None),
    ((2, 3, 4), (1, 2), (2, 3), (2, 5, 11)),     # both axes cropped: the last phases one short
    ((1, 2, 2, 3), (2, 1), (3, 2), (1, 4, 5, 3)),  # axes not in order: phases row-major in the given order
    ((3, 1), (1,), (3,), (3, 1)),                  # phases with no position in the output
]


@pytest.mark.parametrize("weave", WEAVES, ids=lambda w: f"{w[0]}x{w[2]}")
def test_interleave_matches_numpy(weave: tuple) -> None:
    shape, axes, strides, out = weave
    parts = [RNG.standard_normal(shape).astype(np.float32) for _ in range(int(np.prod(strides)))]
    full = list(shape)
    for a, s in zip(axes, strides):
        full[a] *= s
    want = np.zeros(full, np.float32)
    for q, part in enumerate(parts):
        index = [slice(None)] * len(shape)
        for a, s, p in zip(axes, strides, np.unravel_index(q, strides)):
            index[a] = slice(int(p), None, s)
        want[tuple(index)] = part
    want = want[tuple(slice(0, o) for o in (out or full))]
    got = pbsdk.jit(lambda *ps: ops.interleave(ps, axes, strides, out), options={"cache": False})(*parts)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("shape", "axes", "strides", "out", "match"), [
    ((2, 3), (1,), (2,), (2, 4), "does not fit"),        # cropped by a whole stride
    ((2, 3), (1,), (3,), None, "needs 3 parts"),
    ((2, 3), (1, 1), (2, 2), None, "repeated axis"),
    ((2, 3), (1,), (0,), None, "strides"),
])
def test_interleave_rejects(shape, axes, strides, out, match) -> None:
    parts = [np.zeros(shape, np.float32)] * 2
    with pytest.raises(pbsdk.PbsdkError, match=match):
        pbsdk.jit(lambda *ps: ops.interleave(ps, axes, strides, out), options={"cache": False})(*parts)
