"""The pure decisions for depthwise convolutions (pbsdk.core.plan.window): where one runs, how the loop
nest the emitter builds is recognised, and its register tile. No MLIR."""

from __future__ import annotations

import pytest

from pbsdk.core.plan.window import (
    MAX_DEPTHWISE_WIDTH,
    DepthwiseGeometry,
    depthwise_geometry,
    depthwise_layout,
    depthwise_tile,
)

PAR, RED = "parallel", "reduction"
ITERS = (PAR, PAR, PAR, RED, RED, PAR)


def _operands(sh: int = 1, sw: int = 1, dh: int = 1, dw: int = 1) -> list:
    x = [((0, 1),), ((1, sh), (3, dh)), ((2, sw), (4, dw)), ((5, 1),)]
    w = [((3, 1),), ((4, 1),), ((5, 1),)]
    out = [((0, 1),), ((1, 1),), ((2, 1),), ((5, 1),)]
    return [x, w, out]


def test_layout_goes_channels_last_for_deep_layers_only() -> None:
    """MobileNetV3's depthwise layers: from 88 channels at 28x28 on, channels last (the transposes included)
    beats one scalar multiply-add a cycle as given; the wide, shallow early ones (16 channels at 112x112,
    72 at 56x56, stride 2: few taps per transposed element) stay as given."""
    for c, hw, k, s, nhwc in [(16, 112, 3, 2, False), (72, 56, 3, 2, False), (88, 28, 3, 1, True),
                              (96, 28, 5, 2, True), (240, 14, 5, 1, True), (576, 7, 5, 1, True)]:
        got = depthwise_layout(16, batch=1, channels=c, in_pixels=hw * hw, out_pixels=(hw // s) ** 2, taps=k * k,
                               given_nhwc=False)
        assert got.nhwc == nhwc and (got.nhwc_cycles < got.given_cycles) == nhwc, got.reason
        assert ("channels last" if nhwc else "as given") in got.reason


def test_layout_keeps_few_channels_with_one_tap_as_given() -> None:
    """2 channels, a 1x1 kernel: a 16-lane vector carries 2 useful values and the transposes cost more than
    the two scalar multiply-adds per pixel they save."""
    got = depthwise_layout(16, batch=1, channels=2, in_pixels=64, out_pixels=64, taps=1, given_nhwc=False)
    assert not got.nhwc and "as given" in got.reason


def test_layout_of_an_nhwc_graph_pays_no_transposes() -> None:
    got = depthwise_layout(16, batch=2, channels=2, in_pixels=64, out_pixels=64, taps=1, given_nhwc=True)
    assert got.nhwc and got.nhwc_cycles == 2 * 64 * 1 * 1
    with pytest.raises(ValueError, match="lanes 0"):
        depthwise_layout(0, batch=1, channels=1, in_pixels=1, out_pixels=1, taps=1, given_nhwc=False)


def test_geometry_reads_strides_and_dilations_in_any_term_order() -> None:
    ops = _operands(sh=2, sw=1, dh=3, dw=2)
    ops[0][1] = tuple(reversed(ops[0][1]))  # kh * dh + oh * sh
    g = depthwise_geometry((2, 7, 9, 3, 5, 40), ITERS, ops)
    assert g == DepthwiseGeometry(n=2, oh=7, ow=9, kh=3, kw=5, c=40, sh=2, sw=1, dh=3, dw=2)


@pytest.mark.parametrize("change", ["order", "iterators", "weights", "output", "operands"])
def test_geometry_rejects_other_loop_nests(change: str) -> None:
    extents, iters, ops = (1, 4, 4, 3, 3, 20), ITERS, _operands()
    if change == "order":  # channel loop before the taps (x reads it at position 3, taps at 4, 5)
        ops[0] = [((0, 1),), ((1, 1), (4, 1)), ((2, 1), (5, 1)), ((3, 1),)]
    elif change == "iterators":
        iters = (PAR,) * 6
    elif change == "weights":  # a weight per output pixel: not a convolution
        ops[1] = [((1, 1),), ((4, 1),), ((5, 1),)]
    elif change == "output":  # the output written per tap
        ops[2] = [((0, 1),), ((1, 1),), ((3, 1),), ((5, 1),)]
    else:
        ops = ops[:2]
    assert depthwise_geometry(extents, iters, ops) is None


def _geometry(ow: int, c: int) -> DepthwiseGeometry:
    return DepthwiseGeometry(n=1, oh=ow, ow=ow, kh=5, kw=5, c=c, sh=1, sw=1, dh=1, dw=1)


@pytest.mark.parametrize(("ow", "width", "tail"), [(56, 8, 0), (28, 7, 0), (14, 7, 0), (7, 7, 0), (3, 3, 0),
                                                    (61, 8, 5), (9, 5, 4)])
def test_tile_balances_the_row(ow: int, width: int, tail: int) -> None:
    """The widest tile the cap allows, balanced over the row: 28 -> 4 tiles of 7, not 3 of 8 and one of 4."""
    t = depthwise_tile(32, 16, _geometry(ow, 96))
    assert (t.width, t.tail) == (width, tail)
    assert t.width <= MAX_DEPTHWISE_WIDTH and t.masked_channels == 0


def test_tile_masks_the_channel_tail_and_respects_small_register_files() -> None:
    t = depthwise_tile(32, 16, _geometry(14, 88))
    assert t.masked_channels == 8 and "last 8 channels masked" in t.reason
    small = depthwise_tile(8, 4, _geometry(14, 88))  # 8 registers: at most 4 accumulators
    assert small.width == 4 and small.tail == 2 and small.masked_channels == 0
    with pytest.raises(ValueError, match="registers 0"):
        depthwise_tile(0, 16, _geometry(14, 88))


def test_pointwise_layout_counts_no_patches() -> None:
    """1x1 stride-1 convolutions (MobileNetV3's expand/project layers) have no patches in either layout;
    at 56x56 with 16 -> 72 channels the transposes outweigh any tile gain: as given. (At 7x7, 96 <-> 576,
    both layouts measured within 2.5 % in the whole model, so either choice is right there.)"""
    from pbsdk.core.plan.window import nchw_conv_layout

    def layout(batch: int, c: int, o: int, hw: int, pointwise: bool = True):
        return nchw_conv_layout(32, 16, 2, 2, batch=batch, channels=c, out_channels=o, in_pixels=hw * hw,
                                out_pixels=hw * hw, taps=1, pointwise=pointwise, weights_constant=True)

    for batch in (1, 8):
        assert not layout(batch, 16, 72, 56).nhwc
    with_patches, without = layout(1, 96, 576, 7, pointwise=False), layout(1, 96, 576, 7)
    assert with_patches.nchw_cycles > without.nchw_cycles and with_patches.nhwc_cycles == without.nhwc_cycles


def test_cycles_count_taps_of_every_tile() -> None:
    """Per tap of a w-pixel tile: one weight load, w input loads, w FMAs (2 a cycle, 2 loads a cycle)."""
    from pbsdk.core.plan.window import depthwise_cycles

    g = DepthwiseGeometry(n=1, oh=2, ow=28, kh=3, kw=3, c=20, sh=1, sw=1, dh=1, dw=1)
    t = depthwise_tile(32, 16, g)  # 4 tiles of 7, 2 channel vectors (the second masked)
    assert (t.width, t.tail) == (7, 0)
    assert depthwise_cycles(g, t, 2, 2) == 2 * 2 * 9 * 4 * max(7 / 2, 8 / 2)
