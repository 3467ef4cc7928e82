"""Pure decisions for convolutions read in place (implicit GEMM): what the core's im2col copies say about
the window, and the reduction block that keeps a tap's channels together. No MLIR: the cpu target's
`pbsdk.targets.cpu.implicit_conv` collects the facts from the IR and asks these."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


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


def window_k_block(channels: int, taps: int, kc: int, *, min_run: int = 16) -> int | None:
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
