"""The pure decisions for direct convolution kernels (pbsdk.core.plan.direct_conv): which route a
convolution takes, how the loop nest the emitter builds is recognised, and its register tile. No MLIR."""

from __future__ import annotations

import pytest

from pbsdk.core.plan.direct_conv import (
    SPARE_REGISTERS,
    DirectConv,
    contraction_cycles,
    direct_conv_cycles,
    direct_conv_geometry,
    direct_conv_tile,
    plan_conv_route,
)

PAR, RED = "parallel", "reduction"
ITERS = (PAR,) * 5 + (RED,) * 3
#: A Zen 4 / AVX-512 vector unit as the host spec gives it: 32 registers of 16 f32 lanes, 2 FMAs and 2 loads
#: a cycle; L1d, L2, L3 (capacity, bytes a cycle).
ZMM = {"registers": 32, "lanes": 16, "fma_per_cycle": 2, "loads_per_cycle": 2}
CACHES = ((32768, 128.0), (1 << 20, 64.0), (32 << 20, 32.0))


def _operands(sh: int = 1, sw: int = 1, dh: int = 1, dw: int = 1) -> list:
    x = [((0, 1),), ((1, sh), (5, dh)), ((2, sw), (6, dw)), ((3, 1),), ((7, 1),)]
    w = [((5, 1),), ((6, 1),), ((7, 1),), ((3, 1),), ((4, 1),)]
    out = [((0, 1),), ((1, 1),), ((2, 1),), ((3, 1),), ((4, 1),)]
    return [x, w, out]


def _route(conv: DirectConv):
    return plan_conv_route(ZMM["registers"], ZMM["lanes"], ZMM["fma_per_cycle"], ZMM["loads_per_cycle"], conv,
                           caches=CACHES)


@pytest.mark.parametrize(("name", "conv"), [
    ("grouped 3x3, groups of 16 (RegNet)", DirectConv(1, 28, 28, 8, 16, 3, 3, 16)),
    ("grouped 3x3, groups of 8", DirectConv(1, 28, 28, 16, 8, 3, 3, 8)),
    ("3 -> 16 channels on 128 images of 32x32", DirectConv(128, 32, 32, 1, 16, 3, 3, 3)),
    ("grouped 3x3 stride 2, groups of 64 (ResNeXt)", DirectConv(1, 14, 14, 32, 64, 3, 3, 64, 2, 2)),
])
def test_narrow_groups_and_few_channels_go_direct(name: str, conv: DirectConv) -> None:
    """A contraction would copy their patches (twice for groups: copied, then group-major; a 3-channel
    image's window runs are too short to read in place), which costs more than the FMAs themselves."""
    r = _route(conv)
    assert r.direct and r.tile is not None, r.reason
    assert r.direct_cycles is not None and r.direct_cycles < r.contraction_cycles
    assert r.reason.startswith("conv 3x3") and ": direct (" in r.reason and "tiles of" in r.reason


def test_dense_convolutions_stay_contractions() -> None:
    """ResNet's 3x3 of 64 channels: the implicit GEMM (reading the window in place, no copies) issues as
    many cycles as the direct kernel (the same register tile), and a tie goes to the contraction, which
    blocks for every cache level; a 3x3 of 256 channels is bound by streaming its 2.4 MB of weights from
    L3 for every tile of the direct kernel; a 1x1 of 64 -> 256 channels by streaming them from L2."""
    r = _route(DirectConv(1, 56, 56, 1, 64, 3, 3, 64))
    assert not r.direct and r.tile is None and r.direct_cycles is not None
    assert r.direct_cycles >= r.contraction_cycles and "147456 B of weights a group at 64 B a cycle" in r.reason
    deep = _route(DirectConv(1, 14, 14, 1, 256, 3, 3, 256))
    assert not deep.direct and deep.direct_cycles is not None and deep.direct_cycles > 2 * deep.contraction_cycles
    assert "at 32 B a cycle" in deep.reason
    expand = _route(DirectConv(1, 56, 56, 1, 256, 1, 1, 64))
    assert not expand.direct and "at 64 B a cycle" in expand.reason
    with pytest.raises(ValueError, match="cache level"):
        plan_conv_route(32, 16, 2, 2, DirectConv(1, 4, 4, 1, 16, 3, 3, 3), caches=())


def test_contraction_charges_copies_only_where_it_cannot_read_in_place() -> None:
    dense16 = DirectConv(1, 28, 28, 1, 16, 3, 3, 16)
    grouped = DirectConv(1, 28, 28, 2, 16, 3, 3, 16)
    few = DirectConv(1, 28, 28, 1, 16, 3, 3, 3)
    base = contraction_cycles(32, 16, 2, 2, dense16)
    # Two groups: twice the FMAs, plus the patches copied and rearranged (2 x 4 cycles an element).
    assert contraction_cycles(32, 16, 2, 2, grouped) == 2 * base + 2 * 4 * 2 * 784 * 144
    # 3 channels x 3 columns = 9-value runs: copied once.
    assert contraction_cycles(32, 16, 2, 2, few) > 4 * 784 * 27


def test_geometry_reads_strides_and_dilations() -> None:
    ops = _operands(sh=2, sw=1, dh=3, dw=2)
    ops[0][1] = tuple(reversed(ops[0][1]))  # kh * dh + oh * sh
    g = direct_conv_geometry((2, 7, 9, 4, 16, 3, 5, 8), ITERS, ops)
    assert g == DirectConv(n=2, oh=7, ow=9, groups=4, og=16, kh=3, kw=5, cg=8, sh=2, sw=1, dh=3, dw=2)
    assert g.macs == 2 * 7 * 9 * 4 * 16 * 3 * 5 * 8


def test_geometry_takes_the_input_in_any_dimension_order() -> None:
    # An NCHW graph input whose layout transpose `fuse` folded into the kernel's reads: (n, g, c, h, w).
    ops = _operands()
    n, h, w, g, c = ops[0]
    ops[0] = [n, g, c, h, w]
    geometry = direct_conv_geometry((2, 30, 30, 1, 16, 3, 3, 3), ITERS, ops)
    assert geometry == DirectConv(2, 30, 30, 1, 16, 3, 3, 3, x_order="ngchw")
    ops[0] = [n, g, c, h, h]  # the row twice, no column
    assert direct_conv_geometry((2, 30, 30, 1, 16, 3, 3, 3), ITERS, ops) is None


@pytest.mark.parametrize("change", ["order", "iterators", "weights", "output", "group", "operands"])
def test_geometry_rejects_other_loop_nests(change: str) -> None:
    extents, iters, ops = (1, 4, 4, 2, 16, 3, 3, 8), ITERS, _operands()
    if change == "order":  # the input channel read at the output channel's loop
        ops[0] = [((0, 1),), ((1, 1), (5, 1)), ((2, 1), (6, 1)), ((3, 1),), ((4, 1),)]
    elif change == "iterators":
        iters = (PAR,) * 8
    elif change == "weights":  # a weight per output pixel: not a convolution
        ops[1] = [((1, 1),), ((6, 1),), ((7, 1),), ((3, 1),), ((4, 1),)]
    elif change == "output":  # the output written per tap
        ops[2] = [((0, 1),), ((1, 1),), ((5, 1),), ((3, 1),), ((4, 1),)]
    elif change == "group":  # the input read at another group than the output's
        ops[0] = [((0, 1),), ((1, 1), (5, 1)), ((2, 1), (6, 1)), ((4, 1),), ((7, 1),)]
    else:
        ops = ops[:2]
    assert direct_conv_geometry(extents, iters, ops) is None


@pytest.mark.parametrize(("og", "lanes", "vectors", "masked"), [(16, 16, 1, 0), (8, 8, 1, 0), (64, 16, 4, 0),
                                                                (3, 4, 1, 3), (24, 16, 2, 8), (1, 1, 1, 0)])
def test_tile_vectors_cover_the_group(og: int, lanes: int, vectors: int, masked: int) -> None:
    """A group narrower than the vector takes the shortest power-of-two vector that holds it (8 channels:
    8 lanes); a wider one whole vectors, the last masked when the width is no multiple."""
    t = direct_conv_tile(32, 16, DirectConv(1, 28, 28, 4, og, 3, 3, 8))
    assert (t.lanes, t.vectors, t.masked) == (lanes, vectors, masked), t.reason
    assert t.width * t.vectors + t.vectors + SPARE_REGISTERS <= 32


@pytest.mark.parametrize(("ow", "width", "tail"), [(28, 14, 0), (32, 16, 0), (56, 19, 18), (7, 7, 0), (1, 1, 0)])
def test_tile_balances_the_row(ow: int, width: int, tail: int) -> None:
    """As many accumulators as the registers hold (27 with one weight vector), balanced over the row."""
    t = direct_conv_tile(32, 16, DirectConv(1, 4, ow, 8, 16, 3, 3, 16))
    assert (t.width, t.tail) == (width, tail), t.reason


def test_tile_rejects_an_empty_register_file() -> None:
    with pytest.raises(ValueError, match="registers 0"):
        direct_conv_tile(0, 16, DirectConv(1, 4, 4, 2, 16, 3, 3, 3))


def test_cycles_count_tiles_and_tails() -> None:
    conv = DirectConv(1, 2, 56, 1, 16, 3, 3, 4)
    t = direct_conv_tile(32, 16, conv)  # 19 + 19 + 18
    steps = 3 * 3 * 4
    per_row = 2 * t.step_cycles(2, 2) + t.step_cycles(2, 2, 18)
    assert direct_conv_cycles(conv, t, 2, 2) == 2 * steps * per_row
    # Weights streamed at 1 B a cycle: 3*3*4*16*4 B = 2304 cycles a tile, more than its FMAs.
    assert direct_conv_cycles(conv, t, 2, 2, 1.0) == 2 * 3 * 2304
    assert t.step_cycles(2, 2) == max(19 / 2, 20 / 2)


def test_prediction_names_the_direct_kernel() -> None:
    """`predict_graph` charges a convolution the planner runs as a direct kernel its kernel's cycles (and
    its memory traffic), not a contraction's estimate."""
    import numpy as np

    from pbsdk import ops
    from pbsdk.core.plan.predict import predict_graph
    from pbsdk.core.spec import load_spec
    from pbsdk.frontends.jit import trace
    from pbsdk.frontends.tracing import input_type

    x, w = np.zeros((1, 28, 28, 128), np.float32), np.zeros((3, 3, 16, 128), np.float32)
    graph, _ = trace(lambda a, b: ops.conv2d(a, b, padding=1, groups=8, layout="NHWC"),
                     (input_type(x, 0), input_type(w, 1)))
    spec = load_spec("intel/xeon-avx512")
    one, two = (predict_graph(graph, spec, {"threads": t}) for t in (1, 2))
    assert [name for name, _ in one.terms] == ["#2 conv2d (direct)"]
    assert 0 < two.seconds < one.seconds
