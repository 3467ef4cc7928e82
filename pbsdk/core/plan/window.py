"""Pure decisions for convolutions read in place (implicit GEMM): what the core's im2col copies say about
the window, and the reduction block that keeps a tap's channels together. No MLIR: the cpu target's
`pbsdk.targets.cpu.implicit_conv` collects the facts from the IR and asks these."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class TapCopy:
    """One copy into the patch buffer: the destination view's and the source view's static geometry."""

    dst_offsets: tuple[int, ...]
    dst_sizes: tuple[int, ...]
    dst_strides: tuple[int, ...]
    src_offsets: tuple[int, ...]
    src_sizes: tuple[int, ...]
    src_strides: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """An NHWC convolution's window over its (padded) input, as the im2col copies showed it."""

    kh: int
    kw: int
    sh: int
    sw: int
    dh: int
    dw: int
    oh: int
    ow: int


def im2col_geometry(patch_shape: Sequence[int], x_shape: Sequence[int],
                    copies: Sequence[TapCopy]) -> ConvGeometry | None:
    """The window that ``copies`` (one per tap) fill the patch buffer of shape ``(N, OH, OW, KH, KW, C)``
    with from an input of shape ``(N, Hp, Wp, C)``; None unless every tap is copied exactly once, whole,
    with one stride and one dilation."""
    if len(patch_shape) != 6 or len(x_shape) != 4:
        return None
    n, oh, ow, kh, kw, ch = patch_shape
    if x_shape[0] != n or x_shape[3] != ch or len(copies) != kh * kw:
        return None
    taps: dict[tuple[int, int], TapCopy] = {}
    for cp in copies:
        if (len(cp.dst_offsets) != 6 or cp.dst_sizes != (n, oh, ow, 1, 1, ch) or any(cp.dst_strides)
                and cp.dst_strides != (1,) * 6):
            return None
        i, j = cp.dst_offsets[3], cp.dst_offsets[4]
        if cp.dst_offsets != (0, 0, 0, i, j, 0) or not (0 <= i < kh and 0 <= j < kw) or (i, j) in taps:
            return None
        if cp.src_sizes != (n, oh, ow, ch) or cp.src_offsets[0] != 0 or cp.src_offsets[3] != 0:
            return None
        if cp.src_strides[0] != 1 or cp.src_strides[3] != 1:
            return None
        taps[(i, j)] = cp
    sh, sw = taps[(0, 0)].src_strides[1:3]
    dh = taps[(1, 0)].src_offsets[1] - taps[(0, 0)].src_offsets[1] if kh > 1 else 1
    dw = taps[(0, 1)].src_offsets[2] - taps[(0, 0)].src_offsets[2] if kw > 1 else 1
    if min(sh, sw, dh, dw) < 1 or taps[(0, 0)].src_offsets[1:3] != (0, 0):
        return None
    for (i, j), cp in taps.items():
        if cp.src_strides != (1, sh, sw, 1) or cp.src_offsets != (0, i * dh, j * dw, 0):
            return None
    if (oh - 1) * sh + (kh - 1) * dh >= x_shape[1] or (ow - 1) * sw + (kw - 1) * dw >= x_shape[2]:
        return None
    return ConvGeometry(kh, kw, sh, sw, dh, dw, oh, ow)


#: The shortest channel run a convolution's window is read in place with (see `window_k_block`).
MIN_CHANNEL_RUN = 16


def window_k_block(channels: int, taps: int, kc: int, *, min_run: int = MIN_CHANNEL_RUN) -> int | None:
    """The reduction block of an implicit-GEMM convolution whose reduction runs over ``taps`` kernel
    taps of ``channels`` contiguous input channels each (NHWC: k = (i, j, c)), given the plan's ``kc``.

    A block must not split a tap's channels unevenly, so that inside it the input address is one base per
    tap plus the channel: whole taps (a multiple of ``channels``, at most ``kc`` and at most every tap)
    when a tap fits, else the largest divisor of ``channels`` not above ``kc``. None when the inner
    channel loop would run fewer than ``min_run`` steps (a 3-channel image stem): there the loop overhead
    of reading the window in place outweighs the copy, and im2col stays."""
    if min(channels, taps, kc) < 1:
        raise ValueError(f"window_k_block: channels {channels}, taps {taps} and kc {kc} must be positive")
    if channels <= kc:
        run, block = channels, channels * min(taps, kc // channels)
    else:
        run = block = max(d for d in range(1, kc + 1) if channels % d == 0)
    return block if run >= min_run else None


def window_run(channels: int, kernel_width: int, dilation_w: int) -> tuple[int, bool] | None:
    """How long a contiguous run of the input a window read takes per step of its tap loop, and whether a
    run is a whole kernel row: a tap's ``channels`` when there are at least `MIN_CHANNEL_RUN`; else, when
    the kernel's columns are adjacent (``dilation_w == 1``), the ``kernel_width * channels`` values of one
    kernel row, which NHWC stores together (a 3-channel 7x7 stem reads runs of 21); None when even that is
    too short (im2col stays)."""
    if channels >= MIN_CHANNEL_RUN:
        return channels, False
    if dilation_w == 1 and kernel_width > 1 and kernel_width * channels >= MIN_CHANNEL_RUN:
        return kernel_width * channels, True
    return None


def padded_k(k: int, run: int, k_run: int) -> int:
    """The reduction length of ``k`` values in runs of ``run`` once each run is padded to ``k_run``
    (`pad_runs`)."""
    return k // run * k_run


def pad_runs(b: np.ndarray, run: int, k_run: int) -> np.ndarray:
    """B (k x n, k in runs of ``run`` rows) with every run padded by zero rows to ``k_run`` (a window read
    whose runs are no whole number of unit groups): the extra k values a group reads past a run's end
    meet zeros."""
    k, n = b.shape
    runs = b.reshape(k // run, run, n)
    out = np.zeros((k // run, k_run, n), b.dtype)
    out[:, :run] = runs
    return out.reshape(padded_k(k, run, k_run), n)


@dataclasses.dataclass(frozen=True)
class ConvLayout:
    """Whether an NCHW convolution runs in NHWC (transposes around one contraction of output pixels by
    output channels) or as given (per image, output channels by pixels over copied patches), with the
    issue-cycle estimates that decided it."""

    nhwc: bool
    nhwc_cycles: float
    nchw_cycles: float
    reason: str


def _tile_cycles(registers: int, lanes: int, fma: int, loads: int, m: int, n: int, k: int) -> float:
    from pbsdk.core.plan.contraction import issue_cycles, register_tile

    mr, nv, _ = register_tile(registers, lanes, fma, loads, m, n)
    return float(issue_cycles(fma, loads, lanes, m, n, mr, nv) * k)


#: Cycles per element of a copy with a strided side (a layout transpose, a patch copy) in `nchw_conv_layout`.
COPY_CYCLES = 4


def nchw_conv_layout(registers: int, lanes: int, fma_per_cycle: int, loads_per_cycle: int, *, batch: int,
                     channels: int, out_channels: int, in_pixels: int, out_pixels: int, taps: int,
                     kernel_width: int = 1, dilation_w: int = 1, pointwise: bool = False,
                     weights_constant: bool = False, input_nhwc: bool = False,
                     output_nhwc: bool = False) -> ConvLayout:
    """Decide where an NCHW convolution runs, from the vector unit's register tile.

    NHWC: one contraction ``(batch*out_pixels) x out_channels x (taps*channels)`` whose A can be read in
    place when `window_run` finds runs long enough (else its patches are copied too), plus transposing the
    input and the output; its B is the weights, transposed and packed once a call (vector copies) — or
    neither, when they are a constant (both done at compile time). As given: per image ``out_channels x out_pixels x
    (taps*channels)`` over a patch matrix that is copied first (none for a ``pointwise`` 1x1 stride-1 conv,
    whose input is the matrix), with the weights as A, packed for every image (and, past one image, first
    copied per image). A copy with a strided side — a transpose, a patch copy — costs `COPY_CYCLES` an
    element (a 1x1 conv at 14x14x1024 spent 13 cycles an element on its two transposes alone; beside the
    elementwise ops they fuse with, less; none for the input when ``input_nhwc`` — a graph kept channels
    last, `pbsdk.core.ir.layout`, already has it in NHWC — nor for the result when ``output_nhwc``, its
    users taking it in NHWC), packing A one (scalar loads and stores), packing B
    ``1/lanes`` (vector copies); the rest is the register tile's issue cycles. The register tile decides most: a
    contraction with few output channels (under a vector or two) wastes lanes or is bound by loads in NHWC,
    where NCHW has whole vectors of pixels; few pixels (a late 1x1 layer) waste lanes as given, where NHWC
    has whole vectors of output channels."""
    k = taps * channels
    nhwc = _tile_cycles(registers, lanes, fma_per_cycle, loads_per_cycle, batch * out_pixels, out_channels, k)
    nhwc += COPY_CYCLES * batch * ((0 if input_nhwc else channels * in_pixels)
                                   + (0 if output_nhwc else out_channels * out_pixels))
    if not pointwise and window_run(channels, kernel_width, dilation_w) is None:
        nhwc += COPY_CYCLES * batch * k * out_pixels
    if not weights_constant:  # transposed to (KH, KW, C, O) on every call, then packed
        nhwc += COPY_CYCLES * k * out_channels + k * out_channels / lanes
    nchw = batch * _tile_cycles(registers, lanes, fma_per_cycle, loads_per_cycle, out_channels, out_pixels, k)
    if input_nhwc:  # as given, an input the graph holds in NHWC is transposed back first
        nchw += COPY_CYCLES * batch * channels * in_pixels
    if not pointwise:
        nchw += COPY_CYCLES * batch * k * out_pixels
    nchw += batch * out_channels * k + (batch * out_channels * k / lanes if batch > 1 else 0)
    chosen = nhwc <= nchw
    reason = (f"NCHW conv {channels}->{out_channels}, {taps} taps, {out_pixels} pixels x {batch}: "
              f"{'NHWC' if chosen else 'as given'} ({nhwc:.3g} vs {nchw:.3g} issue cycles in NHWC vs as given)")
    return ConvLayout(chosen, nhwc, nchw, reason)


@dataclasses.dataclass(frozen=True)
class DepthwiseLayout:
    """Where a depthwise convolution (one input channel per group, one output channel per group) runs:
    channels last (``nhwc``: the channel loop innermost, a vector of channels per multiply-add) or as
    given, with the issue-cycle estimates that decided it."""

    nhwc: bool
    nhwc_cycles: float
    given_cycles: float
    reason: str


#: Issue cycles per element of a layout transpose in front of or behind a depthwise convolution (a strided
#: scalar copy; measured on MobileNetV3's layers, 1 thread, against the convolution kernels themselves).
TRANSPOSE_CYCLES = 2


def depthwise_layout(lanes: int, *, batch: int, channels: int, in_pixels: int, out_pixels: int, taps: int,
                     given_nhwc: bool) -> DepthwiseLayout:
    """Decide where a depthwise convolution runs, from the vector width.

    Its loop nest has no reduction over channels: per output pixel and channel, a sum over the ``taps``
    kernel taps. Channels last, the channel loop goes innermost (loops n, oh, ow, kh, kw, c), so every
    multiply-add is a vector of ``lanes`` channels — the input, the weights and the output all contiguous
    along it — at ``ceil(channels / lanes)`` vectors per tap and pixel. An NCHW convolution then transposes
    its input to channels last and its result back: a strided element-by-element pass over each, charged
    `TRANSPOSE_CYCLES` per element (they fuse with the elementwise ops around them, but their strided side
    stays). As given in NCHW, the innermost loop is a kernel row (a few taps): about one multiply-add a
    cycle. So wide, shallow early layers (16 channels at 112x112) stay as given and the deep ones go
    channels last. A graph already in NHWC (``given_nhwc``) pays no transposes."""
    if min(lanes, batch, channels, in_pixels, out_pixels, taps) < 1:
        raise ValueError(f"depthwise_layout: lanes {lanes}, batch {batch}, channels {channels}, pixels "
                         f"{in_pixels}/{out_pixels} and taps {taps} must be positive")
    vectors = -(-channels // lanes)
    nhwc = float(batch * out_pixels * taps * vectors)
    if not given_nhwc:
        nhwc += TRANSPOSE_CYCLES * batch * channels * (in_pixels + out_pixels)
    given = float(batch * out_pixels * taps * channels) if not given_nhwc else nhwc
    chosen = given_nhwc or nhwc < given
    reason = (f"depthwise conv, {channels} channels, {taps} taps, {out_pixels} pixels x {batch}: "
              + ("channels last (already NHWC)" if given_nhwc else
                 f"{'channels last' if chosen else 'as given'} ({nhwc:.3g} vs {given:.3g} issue cycles)"))
    return DepthwiseLayout(chosen, nhwc, given, reason)


@dataclasses.dataclass(frozen=True)
class DepthwiseGeometry:
    """A depthwise convolution as the loop nest (n, oh, ow, kh, kw, c) that `pbsdk.core.ir.emit` builds for
    it channels last: ``out[n, oh, ow, c] += x[n, oh*sh + kh*dh, ow*sw + kw*dw, c] * w[kh, kw, c]``."""

    n: int
    oh: int
    ow: int
    kh: int
    kw: int
    c: int
    sh: int
    sw: int
    dh: int
    dw: int


def depthwise_geometry(extents: Sequence[int], iterators: Sequence[str],
                       operands: Sequence[Sequence[Sequence[tuple[int, int]]]]) -> DepthwiseGeometry | None:
    """The geometry of a loop nest (``extents``, ``iterators``, and per operand — input, weights, output — the
    (loop, coefficient) terms of each index; `pbsdk.core.plan.vector_tiles.Access.dims`) that is a
    channels-last depthwise convolution in the loop order above; None for anything else."""
    if len(extents) != 6 or tuple(iterators) != ("parallel",) * 3 + ("reduction",) * 2 + ("parallel",) \
            or len(operands) != 3:
        return None
    x, w, out = ([tuple(sorted(t)) for t in dims] for dims in operands)
    if w != [((3, 1),), ((4, 1),), ((5, 1),)] or out != [((0, 1),), ((1, 1),), ((2, 1),), ((5, 1),)]:
        return None
    if len(x) != 4 or x[0] != ((0, 1),) or x[3] != ((5, 1),) or len(x[1]) != 2 or len(x[2]) != 2:
        return None
    (l1, sh), (l3, dh) = x[1]
    (l2, sw), (l4, dw) = x[2]
    if (l1, l3, l2, l4) != (1, 3, 2, 4):
        return None
    n, oh, ow, kh, kw, c = extents
    return DepthwiseGeometry(n, oh, ow, kh, kw, c, sh, sw, dh, dw)


@dataclasses.dataclass(frozen=True)
class DepthwiseTile:
    """The register tile of a channels-last depthwise convolution: ``width`` adjacent output pixels of one
    output row by one vector of ``lanes`` channels, accumulated in ``width`` vector registers over every
    kernel tap (one weight vector loaded per tap, reused ``width`` times); the last ``tail`` pixels of a row
    (``ow % width``) form a narrower tile, and the last ``c % lanes`` channels a masked vector."""

    lanes: int
    width: int
    tail: int
    masked_channels: int
    reason: str


#: The most accumulators a depthwise register tile takes (half of a 32-register file: the rest holds the
#: weight vector, the input vectors in flight and addresses, and an unrolled tap stays short).
MAX_DEPTHWISE_WIDTH = 8


def depthwise_tile(registers: int, lanes: int, geometry: DepthwiseGeometry) -> DepthwiseTile:
    """Choose the register tile (`DepthwiseTile`) of ``geometry`` on a vector unit of ``registers``
    registers of ``lanes`` elements.

    Each kernel tap costs one weight load and, per pixel of the tile, one input load and one multiply-add;
    the accumulators stay in registers across all taps and are stored once. The widest tile (at most
    `MAX_DEPTHWISE_WIDTH` and half the registers, at most the row) amortises the weight load and the loop
    overhead best; the width is then balanced over the row (``ceil(ow / tiles)``), so a 28-pixel row is
    4 tiles of 7 rather than 3 of 8 and one of 4."""
    if min(registers, lanes) < 1:
        raise ValueError(f"depthwise_tile: registers {registers} and lanes {lanes} must be positive")
    cap = max(1, min(MAX_DEPTHWISE_WIDTH, registers // 2, geometry.ow))
    tiles = -(-geometry.ow // cap)
    width = -(-geometry.ow // tiles)
    tail = geometry.ow % width
    masked = geometry.c % lanes
    reason = (f"depthwise {geometry.kh}x{geometry.kw}, {geometry.c} channels, rows of {geometry.ow}: tiles of "
              f"{width} pixels x {lanes} channels in {width} accumulators"
              + (f", a tail tile of {tail}" if tail else "")
              + (f", the last {masked} channels masked" if masked else ""))
    return DepthwiseTile(lanes, width, tail, masked, reason)


def depthwise_cycles(geometry: DepthwiseGeometry, tile: DepthwiseTile, fma_per_cycle: int,
                     loads_per_cycle: int) -> float:
    """Issue cycles of the depthwise kernel (`pbsdk.targets.cpu.depthwise_kernel`) with ``tile``: per output
    row and vector of channels, its tiles, each tap of a ``width``-pixel tile one weight load, ``width``
    input loads and ``width`` FMAs, bound by whichever issue slower."""
    g, t = geometry, tile

    def step(width: int) -> float:
        return max(width / fma_per_cycle, (width + 1) / loads_per_cycle)

    main = (g.ow - t.tail) // t.width
    row = g.kh * g.kw * (main * step(t.width) + (step(t.tail) if t.tail else 0.0))
    return float(g.n * g.oh * -(-g.c // t.lanes) * row)
