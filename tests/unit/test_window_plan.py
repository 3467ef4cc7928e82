"""The pure decisions behind implicit-GEMM convolutions (`pbsdk.core.plan.window`), without MLIR."""

from __future__ import annotations

import pytest

from pbsdk.core.plan.window import ConvGeometry, TapCopy, im2col_geometry, window_k_block


def _copies(n: int, oh: int, ow: int, kh: int, kw: int, c: int, sh: int = 1, sw: int = 1, dh: int = 1,
            dw: int = 1) -> list[TapCopy]:
    """The copies the core's emitter makes for this convolution (one per tap)."""
    return [TapCopy((0, 0, 0, i, j, 0), (n, oh, ow, 1, 1, c), (1,) * 6,
                    (0, i * dh, j * dw, 0), (n, oh, ow, c), (1, sh, sw, 1))
            for i in range(kh) for j in range(kw)]


def test_geometry_of_a_padded_3x3() -> None:
    g = im2col_geometry((1, 56, 56, 3, 3, 64), (1, 58, 58, 64), _copies(1, 56, 56, 3, 3, 64))
    assert g == ConvGeometry(kh=3, kw=3, sh=1, sw=1, dh=1, dw=1, oh=56, ow=56)


def test_geometry_with_stride_dilation_and_a_rectangular_kernel() -> None:
    copies = _copies(2, 5, 4, 2, 3, 8, sh=2, sw=3, dh=2, dw=1)
    g = im2col_geometry((2, 5, 4, 2, 3, 8), (2, 11, 12, 8), copies)
    assert g == ConvGeometry(kh=2, kw=3, sh=2, sw=3, dh=2, dw=1, oh=5, ow=4)


@pytest.mark.parametrize("break_it", ["missing_tap", "duplicate_tap", "wrong_offset", "mixed_stride",
                                      "channel_offset", "partial_tap", "out_of_bounds", "batch_mismatch"])
def test_geometry_refuses_what_is_not_an_im2col(break_it: str) -> None:
    copies = _copies(1, 6, 6, 3, 3, 16)
    patch, x = (1, 6, 6, 3, 3, 16), (1, 8, 8, 16)
    if break_it == "missing_tap":
        copies = copies[:-1]
    elif break_it == "duplicate_tap":
        copies[4] = copies[3]
    elif break_it == "wrong_offset":  # tap (2, 2) reads one pixel too far right: not a window
        last = copies[-1]
        copies[-1] = TapCopy(last.dst_offsets, last.dst_sizes, last.dst_strides, (0, 2, 3, 0), last.src_sizes,
                             last.src_strides)
    elif break_it == "mixed_stride":
        c0 = copies[1]
        copies[1] = TapCopy(c0.dst_offsets, c0.dst_sizes, c0.dst_strides, c0.src_offsets, c0.src_sizes, (1, 1, 2, 1))
    elif break_it == "channel_offset":
        c0 = copies[2]
        copies[2] = TapCopy(c0.dst_offsets, c0.dst_sizes, c0.dst_strides, (0, 0, 2, 1), c0.src_sizes, c0.src_strides)
    elif break_it == "partial_tap":
        c0 = copies[0]
        copies[0] = TapCopy(c0.dst_offsets, (1, 6, 5, 1, 1, 16), c0.dst_strides, c0.src_offsets, (1, 6, 5, 16),
                            c0.src_strides)
    elif break_it == "out_of_bounds":
        x = (1, 7, 8, 16)
    elif break_it == "batch_mismatch":
        x = (2, 8, 8, 16)
    assert im2col_geometry(patch, x, copies) is None


@pytest.mark.parametrize(("channels", "taps", "kc", "expect"), [
    (64, 9, 256, 256),     # four whole taps per block
    (64, 9, 384, 384),
    (64, 2, 384, 128),     # never more than every tap
    (256, 9, 256, 256),    # one tap per block
    (512, 9, 384, 256),    # more channels than kc: the largest divisor that fits
    (2048, 1, 256, 256),
    (16, 49, 256, 256),
    (3, 49, 256, None),    # an image stem: a 3-step channel run is not worth reading in place
    (257, 9, 256, None),   # a prime channel count over kc: runs of 1
])
def test_window_k_block(channels: int, taps: int, kc: int, expect: int | None) -> None:
    got = window_k_block(channels, taps, kc)
    assert got == expect
    if got is not None:
        assert got % channels == 0 or channels % got == 0


def test_window_k_block_rejects_nonsense() -> None:
    with pytest.raises(ValueError, match="positive"):
        window_k_block(0, 9, 256)


def _layout(batch: int, c: int, o: int, hw: int, k: int, stride: int = 1, constant: bool = True):
    """A model's layer: frozen weights (transposed and packed at compile time) unless ``constant=False``."""
    from pbsdk.core.plan.window import nchw_conv_layout

    out = (hw + 2 * (k // 2) - k) // stride + 1
    return nchw_conv_layout(32, 16, 2, 2, batch=batch, channels=c, out_channels=o, in_pixels=(hw + 2 * (k // 2)) ** 2,
                            out_pixels=out * out, taps=k * k, weights_constant=constant)


def test_nchw_conv_layout_prefers_nhwc_for_resnet_layers() -> None:
    for batch, c, o, hw in [(1, 64, 64, 56), (8, 64, 64, 56), (1, 256, 256, 14), (16, 16, 16, 16)]:
        choice = _layout(batch, c, o, hw, 3)
        assert choice.nhwc and choice.nhwc_cycles <= choice.nchw_cycles, choice.reason
    # weights given at run time are transposed on every call in NHWC: the choice counts it
    assert _layout(1, 256, 256, 14, 3, constant=False).nhwc_cycles > _layout(1, 256, 256, 14, 3).nhwc_cycles
    assert _layout(1, 64, 64, 56, 3, constant=False).nhwc  # 37K weights against 200K input values


def test_nchw_conv_layout_keeps_few_channel_convs_as_given() -> None:
    """A 3- or 8-channel input cannot be read in place (its patches would be copied in NHWC too), and
    pixels fill whole vectors in NCHW: as given."""
    for c, o in [(3, 16), (8, 16), (3, 64)]:
        choice = _layout(16, c, o, 32, 3)
        assert not choice.nhwc, choice.reason
        assert "as given" in choice.reason


def test_nchw_pointwise_convs_move_to_nhwc_only_where_the_weights_dominate() -> None:
    """A 1x1 stride-1 NCHW conv copies no patches as given, but packs its weights (A) for every image and,
    past one image, copies them per image too; in NHWC its weights are B, packed at compile time when
    constant, at the price of two transposes. Measured (1 thread, CPU time): 7x7 2048->512 1.08x in NHWC
    at batch 1, 3.1x at batch 8; 14x14 1024->256 0.74x at batch 1 (its transposes cost more than the
    weights' packing), 1.00x at batch 8."""
    from pbsdk.core.plan.window import nchw_conv_layout

    def layout(batch: int, c: int, o: int, hw: int, constant: bool = True):
        return nchw_conv_layout(32, 16, 2, 2, batch=batch, channels=c, out_channels=o, in_pixels=hw * hw,
                                out_pixels=hw * hw, taps=1, pointwise=True, weights_constant=constant)

    assert layout(1, 2048, 512, 7).nhwc and layout(8, 2048, 512, 7).nhwc
    for batch, c, o, hw in [(1, 1024, 256, 14), (8, 1024, 256, 14), (1, 64, 256, 56), (8, 256, 64, 56)]:
        assert not layout(batch, c, o, hw).nhwc, layout(batch, c, o, hw).reason
    # weights given at run time are transposed and packed in NHWC on every call: 1M of them outweigh the
    # gain (the suite's conv1x1_7_2048to512_nchw, weights an input, ran 0.17x torch in NHWC)
    assert layout(1, 2048, 512, 7, constant=False).nhwc_cycles > layout(1, 2048, 512, 7).nhwc_cycles
    assert not layout(1, 2048, 512, 7, constant=False).nhwc


def test_window_run_reads_kernel_rows_for_few_channels() -> None:
    from pbsdk.core.plan.window import window_run

    assert window_run(64, 3, 1) == (64, False)
    assert window_run(3, 7, 1) == (21, True)       # a 7x7 stem: one kernel row per run
    assert window_run(3, 3, 1) is None             # 9 values: too short
    assert window_run(3, 7, 2) is None             # dilated columns are not adjacent
    assert window_run(8, 1, 1) is None


def test_pad_runs_puts_zero_rows_after_each_run() -> None:
    """A 3-channel 7x7 kernel's rows of 21 values laid out as 24 (six groups of four): the three k values a
    group reads past each row meet zero weights."""
    import numpy as np

    from pbsdk.core.plan.window import pad_runs

    b = np.arange(1, 147 * 2 + 1, dtype=np.int8).reshape(147, 2)
    padded = pad_runs(b, 21, 24)
    assert padded.shape == (168, 2) and padded.dtype == np.int8
    runs = padded.reshape(7, 24, 2)
    assert (runs[:, 21:] == 0).all()
    np.testing.assert_array_equal(runs[:, :21].reshape(147, 2), b)
    np.testing.assert_array_equal(pad_runs(b, 21, 21), b)
