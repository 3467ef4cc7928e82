"""NHWC convolutions whose packed kernel reads the input in place (implicit GEMM, `pack-contractions`)
against numpy.

Shapes are chosen against the kernel: output rows that are and are not a multiple of the 14-row register
tile (tiles that wrap to the next image row take the per-row-address copy of the loop), output channels
past a vector, strides, dilations, rectangular kernels, batches, more channels than one k block (the block
then is a run of one tap's channels), bias + relu after it, 1 and 2 threads. Each case also checks which path
the compiler took, so a silent fallback to im2col fails."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.spec import load_spec
from pbsdk.targets.cpu.pack_contractions import lowers_unit
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref
from pbsdk.testing.tolerances import Tolerance, tolerance

#: The implicit GEMM on the units in the vector registers, which these tests check: an AMX host's tiles off
#: (their own implicit GEMM is `test_implicit_conv_on_amx_tiles_emulated`'s).
VEC = {"amx": "off"}

RNG = np.random.default_rng(11)

# id, (N, H, W, C), (O, KH, KW), stride, padding, dilation
CASES = [
    ("3x3_pad1_wrap", (1, 9, 11, 16), (20, 3, 3), 1, 1, 1),
    ("3x3_row_multiple", (1, 14, 28, 32), (64, 3, 3), 1, 1, 1),
    ("stride2", (2, 13, 15, 24), (33, 3, 3), 2, 1, 1),
    ("dilation2", (1, 12, 12, 16), (16, 3, 3), 1, 2, 2),
    ("rect_1x5", (1, 6, 17, 32), (7, 1, 5), (1, 2), (0, 2), 1),
    ("1x1_stride2", (1, 14, 14, 64), (48, 1, 1), 2, 0, 1),
    ("deep_channels", (1, 5, 6, 640), (17, 3, 3), 1, 1, 1),
    ("7x7_stem_like", (1, 20, 20, 16), (32, 7, 7), 2, 3, 1),
    # 8-pixel rows: every tile wraps, and the last tile's clamped rows once cancelled a wrap's jump in a
    # first-to-last-base linearity check (a ResNet layer at 64x64 input computed wrong rows).
    ("wrap_and_clamp", (2, 8, 8, 128), (128, 3, 3), 1, 1, 1),
    # 3 channels: each kernel row's 7 taps x 3 channels are one run of 21 adjacent values (an image stem).
    ("stem_row_runs", (2, 30, 27, 3), (16, 7, 7), 2, 3, 1),
    ("row_runs_kc_split", (1, 9, 40, 8), (24, 5, 40), 1, (2, 0), 1),
]


def _inputs(case: tuple) -> tuple[np.ndarray, np.ndarray]:
    _, (n, h, w, c), (o, kh, kw), *_ = case
    return (RNG.standard_normal((n, h, w, c)).astype(np.float32),
            RNG.standard_normal((kh, kw, c, o)).astype(np.float32))


def _conv(case: tuple, epilogue: bool = False):
    _, _, _, stride, padding, dilation = case

    def conv(a, b, *bias):
        y = ops.conv2d(a, b, stride=stride, padding=padding, dilation=dilation, layout="NHWC")
        return ops.relu(ops.add(y, bias[0])) if epilogue else y

    return conv


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=lambda c: c[0])
def test_implicit_conv_matches_numpy(case: tuple, threads: int, pack_notes) -> None:
    _, (_, _, _, c), (_, kh, kw), stride, padding, dilation = case
    x, w = _inputs(case)
    options = {"threads": threads, **VEC}
    got = pbsdk.jit(_conv(case), options=options)(x, w)
    expect = ref.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, layout="NHWC")
    assert got.shape == expect.shape
    assert_close(got, expect, op="conv2d", reduction_size=c * kh * kw)
    if kh * kw > 1 or stride != 1:
        assert any("implicit GEMM" in n for n in pack_notes(_conv(case), options, x, w))


def test_implicit_conv_then_bias_relu(pack_notes) -> None:
    case = CASES[0]
    x, w = _inputs(case)
    bias = RNG.standard_normal((20,)).astype(np.float32)
    conv = _conv(case, epilogue=True)
    got = pbsdk.jit(conv)(x, w, bias)
    expect = ref.relu(ref.add(ref.conv2d(x, w, padding=1, layout="NHWC"), bias))
    assert_close(got, expect, op="conv2d", reduction_size=16 * 9)
    assert any("implicit GEMM" in n for n in pack_notes(conv, {}, x, w, bias))


def test_few_channels_and_the_option_keep_im2col(pack_notes) -> None:
    """A 3-channel image stem is not read in place (too short a channel run), and implicit_conv=False
    turns the path off; both still compute the convolution. (In f32 the planner sends such a stem to a
    direct kernel, `pbsdk.core.plan.direct_conv`, unless option direct_conv=False keeps the contraction.)"""
    x = RNG.standard_normal((1, 16, 16, 3)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 3, 8)).astype(np.float32)
    case = ("stem", (1, 16, 16, 3), (8, 3, 3), 1, 1, 1)
    options = {"direct_conv": False}
    notes = pack_notes(_conv(case), options, x, w)
    assert any("im2col of 3 channel(s) kept" in n for n in notes), notes
    assert_close(pbsdk.jit(_conv(case), options=options)(x, w), ref.conv2d(x, w, padding=1, layout="NHWC"),
                 op="conv2d", reduction_size=27)
    x16, w16 = _inputs(CASES[0])
    assert not any("implicit GEMM" in n for n in pack_notes(_conv(CASES[0]), {"implicit_conv": False}, x16, w16))


# bf16 on the host's dot-product unit (vdpbf16ps): the unit kernel reads the input in place too, in groups
# of the unit's two values of k, so a tap's channels must come in whole pairs (and at least a run's worth:
# an image stem's 3 channels keep their im2col).
BF16 = np.dtype(ml_dtypes.bfloat16)
BF16_CASES = [c for c in CASES if c[1][3] % 2 == 0 and c[1][3] >= 16]
needs_bf16_unit = pytest.mark.skipif(not lowers_unit(load_spec("host"), "vdpbf16ps"),
                                     reason="this host has no AVX512-BF16 (vdpbf16ps)")


@needs_bf16_unit
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", BF16_CASES, ids=lambda c: c[0])
def test_bf16_implicit_conv_on_the_unit(case: tuple, threads: int, pack_notes) -> None:
    _, (_, _, _, c), (o, kh, kw), stride, padding, dilation = case
    x, w = (v.astype(BF16) for v in _inputs(case))
    bias = RNG.standard_normal((o,)).astype(BF16)
    conv = _conv(case, epilogue=True)
    options = {"threads": threads, **VEC}
    got = pbsdk.jit(conv, options=options)(x, w, bias)
    assert got.dtype == BF16
    # The op's own roundings: the product to bf16, then bias + relu (eager PyTorch's bf16 op-math).
    y = ref.conv2d(x.astype(np.float32), w.astype(np.float32), stride=stride, padding=padding,
                   dilation=dilation, layout="NHWC").astype(BF16).astype(np.float32)
    expect = np.maximum(y + bias.astype(np.float32), 0).astype(BF16)
    # The product's own rounding to bf16 happens at its magnitude, before the bias: a different f32
    # summation order may round it to the neighbouring bf16 value, one ulp of |y| (2^-8 relative), which
    # the bias can leave on a much smaller result. Allowed: two such ulps, plus the sum's own tolerance.
    base = tolerance("conv2d", "bf16", reduction_size=c * kh * kw, accumulator="f32")
    tol = Tolerance(atol=base.atol + 2 * 2.0**-8 * float(np.abs(y).max()), rtol=base.rtol)
    assert_close(got, expect, op="conv2d", dtype="bf16", tol=tol)
    assert any("implicit GEMM on vdpbf16ps" in n for n in pack_notes(conv, options, x, w, bias))


# i8 on the host's i8 unit. VNNI's vpdpbusd: groups of four channels; A's bytes offset by 128 at each broadcast
# from the input, the accumulators started at -128 x B's column sums. AVX2's vpmaddwd: groups of two channels
# read as i16 from a widened copy of the input. Either way the i32 result is exact.
I8_UNIT, I8_GROUP = next(((u, g) for u, g in (("vpdpbusd", 4), ("vpmaddwd", 2)) if lowers_unit(load_spec("host"), u)),
                         ("", 4))
I8_CASES = [c for c in CASES if c[1][3] % 4 == 0 and c[1][3] >= 16]
needs_i8_unit = pytest.mark.skipif(not I8_UNIT, reason="this host has no i8 unit (VNNI's vpdpbusd, AVX2's vpmaddwd)")


@needs_i8_unit
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", I8_CASES, ids=lambda c: c[0])
def test_i8_implicit_conv_on_the_unit_is_exact(case: tuple, threads: int, pack_notes) -> None:
    _, (n, h, w_, c), (o, kh, kw), stride, padding, dilation = case
    rng = np.random.default_rng(17)
    x = rng.integers(-128, 128, (n, h, w_, c), dtype=np.int8)
    w = rng.integers(-128, 128, (kh, kw, c, o), dtype=np.int8)
    x.reshape(-1)[:7] = -128  # the extremes, whose offset (+128) is 0
    options = {"threads": threads, **VEC}
    got = pbsdk.jit(_conv(case), options=options)(x, w)
    assert got.dtype == np.int32
    want = ref.conv2d(x.astype(np.float64), w.astype(np.float64), stride=stride, padding=padding,
                      dilation=dilation, layout="NHWC")
    np.testing.assert_array_equal(got, want.astype(np.int64))
    assert any(f"implicit GEMM on {I8_UNIT}" in n for n in pack_notes(_conv(case), options, x, w))


@needs_bf16_unit
@pytest.mark.parametrize("case", [c for c in CASES if c[1][3] < 16], ids=lambda c: c[0])
def test_few_channels_on_the_unit_copy_patches_by_kernel_rows(case: tuple, pack_notes) -> None:
    """3 or 8 channels (an image stem) are no whole groups of the unit's k: the im2col stays, but copies a
    kernel row's KW x C adjacent values at a time (`copy_by_rows`)."""
    _, (_, _, _, c), (_, kh, kw), stride, padding, dilation = case
    x, w = (v.astype(BF16) for v in _inputs(case))
    got = pbsdk.jit(_conv(case))(x, w)
    y = ref.conv2d(x.astype(np.float32), w.astype(np.float32), stride=stride, padding=padding,
                   dilation=dilation, layout="NHWC")
    assert_close(got, y.astype(BF16), op="conv2d", dtype="bf16", reduction_size=c * kh * kw, accumulator="f32")
    notes = pack_notes(_conv(case), {}, x, w)
    assert any("copy_by_rows" in n for n in notes), notes
    xi = np.random.default_rng(3).integers(-128, 128, x.shape, dtype=np.int8)
    wi = np.random.default_rng(4).integers(-128, 128, w.shape, dtype=np.int8)
    want = ref.conv2d(xi.astype(np.float64), wi.astype(np.float64), stride=stride, padding=padding,
                      dilation=dilation, layout="NHWC")
    np.testing.assert_array_equal(pbsdk.jit(_conv(case))(xi, wi), want.astype(np.int64))


# i8 with few channels and a constant weight: each kernel row's KW x C adjacent values are one run, read in
# groups of four that go on past the run's end into the next pixel, where B's zero rows (`pad_runs`) make
# the extra products exact zeros. Not where the last group would read past the input (im2col stays).
ROW_RUN_CASES = [
    ("stem_7x7_s2", (2, 30, 27, 3), (16, 7, 7), 2, 3, 21, True),
    ("rgb_3x3", (1, 12, 40, 3), (8, 5, 5), 1, 2, 15, False),  # 15 < 16: too short a run, im2col
    ("eight_channels_5x5", (1, 9, 40, 8), (24, 5, 5), 1, 2, 40, True),  # 40: whole groups, no zero rows
    ("reads_past_the_end", (1, 15, 15, 3), (16, 7, 7), 2, 0, 21, False),  # the last pixel's last run overruns
]


@needs_i8_unit
@pytest.mark.parametrize("case", ROW_RUN_CASES, ids=lambda c: c[0])
def test_i8_few_channels_read_kernel_rows_in_place(case: tuple, pack_notes) -> None:
    _, (n, h, w_, c), (o, kh, kw), stride, padding, run, in_place = case
    rng = np.random.default_rng(23)
    x = rng.integers(-128, 128, (n, h, w_, c), dtype=np.int8)
    w = rng.integers(-128, 128, (kh, kw, c, o), dtype=np.int8)
    x.reshape(-1)[-5:] = 127  # the pixels a group past the last run would meet

    def conv(a):
        return ops.conv2d(a, w, stride=stride, padding=padding, layout="NHWC")

    got = pbsdk.jit(conv, options={"threads": 1, **VEC})(x)
    want = ref.conv2d(x.astype(np.float64), w.astype(np.float64), stride=stride, padding=padding, layout="NHWC")
    np.testing.assert_array_equal(got, want.astype(np.int64))
    notes = pack_notes(conv, {"threads": 1, **VEC}, x)
    place = [t for t in notes if f"implicit GEMM on {I8_UNIT}" in t]
    assert bool(place) is in_place, notes
    if in_place and run % I8_GROUP:
        assert f"kernel rows of {run} values as {-(-run // I8_GROUP)} groups of {I8_GROUP}" in place[0], place
    if not in_place:
        assert any("im2col kept" in t for t in notes), notes


# AMX tiles: the tile kernel packs A from the input (a step's 32 bf16 / 64 i8 values from one tap's channels),
# checked through the instructions' arithmetic on host buffers (any machine) against numpy.
TILE_CASES = [
    ("3x3_row_multiple", (1, 14, 28, 32), (64, 3, 3), 1, 1, 1),
    ("1x1_stride2", (1, 14, 14, 64), (48, 1, 1), 2, 0, 1),
    ("stride2_dilation2", (2, 11, 13, 64), (40, 3, 3), 2, 1, 2),
    ("wrap_and_clamp", (2, 8, 8, 128), (128, 3, 3), 1, 1, 1),
    ("deep_channels", (1, 5, 6, 640), (17, 3, 3), 1, 1, 1),
]


def _amx_spec() -> object:
    base = load_spec("host")
    tiles = [u for u in load_spec("intel/xeon-amx").matrix_units if u.registers == "tile"]
    return base.model_copy(update={"matrix_units": tiles + list(base.matrix_units)})


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", TILE_CASES, ids=lambda c: c[0])
def test_implicit_conv_on_amx_tiles_emulated(case: tuple, threads: int, pack_notes) -> None:
    _, (n, h, w_, c), (o, kh, kw), stride, padding, dilation = case
    spec = _amx_spec()
    options = {"threads": threads, "amx": "emulate", "cache": False}
    x, w = (v.astype(BF16) for v in _inputs(case))
    fn = pbsdk.jit(_conv(case), spec=spec, options=options)
    y = ref.conv2d(x.astype(np.float32), w.astype(np.float32), stride=stride, padding=padding, dilation=dilation,
                   layout="NHWC")
    assert_close(fn(x, w), y.astype(BF16), op="conv2d", dtype="bf16", reduction_size=c * kh * kw, accumulator="f32")
    notes = pack_notes(_conv(case), options, x, w, spec=spec)
    assert any("implicit GEMM on tdpbf16ps, tile kernel" in t for t in notes), notes
    if c % 64:
        return
    rng = np.random.default_rng(29)
    xi = rng.integers(-128, 128, (n, h, w_, c), dtype=np.int8)
    wi = rng.integers(-128, 128, (kh, kw, c, o), dtype=np.int8)
    gi = pbsdk.jit(_conv(case), spec=spec, options=options)
    want = ref.conv2d(xi.astype(np.float64), wi.astype(np.float64), stride=stride, padding=padding,
                      dilation=dilation, layout="NHWC")
    np.testing.assert_array_equal(gi(xi, wi), want.astype(np.int64))
    assert any("implicit GEMM on tdpbssd, tile kernel" in t for t in pack_notes(_conv(case), options, xi, wi, spec=spec))
