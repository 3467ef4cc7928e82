"""Pure decisions for convolutions run by a direct kernel: whether a channels-last convolution goes to one
(rather than to a contraction over copied or in-place patches), how the loop nest the emitter builds for it
is recognised, and its register tile. No MLIR: the emitter (`pbsdk.core.ir.emit`) asks `plan_conv_route`,
the cpu target's ``direct-conv`` stage (`pbsdk.targets.cpu.direct_conv_kernel`) asks
`direct_conv_geometry` and `direct_conv_tile`.

A direct kernel computes, per register tile of ``width`` adjacent output pixels by the ``og`` output channels
of one group (``vectors`` vectors of ``lanes``), the sum over the kernel taps and the group's ``cg`` input
channels of a broadcast input value times a vector of weights: no patch matrix, no packing, every operand
read where it lies (NHWC input and output, weights (KH, KW, CG, G*OG)). It is what a grouped convolution
with narrow groups (RegNet, ResNeXt: 8 to 64 channels a group) and a convolution of a few-channel image (3
channels: the implicit GEMM's window runs are too short to read in place) need: there a contraction pays
for copying patches (twice for groups: copied, then rearranged group-major) more than it gains.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal

from pbsdk.core.plan.window import COPY_CYCLES, window_run

#: Registers a direct tile leaves free beside its accumulators and weight vectors: the broadcast input
#: values in flight and the addresses' spill room.
SPARE_REGISTERS = 4
#: The direct kernel is chosen only where its estimate is at most this share of the contraction's. The two
#: estimates count the issue cycles of different kernels, each within about 10% of what it measures on
#: the suite's rows; a closer call goes to the contraction, whose kernels block for every cache level. The
#: cases the direct kernel is for win by far more (groups of 8-16: 3-6x fewer cycles; 3->16 channels: 2x).
DIRECT_MARGIN = 0.9


@dataclasses.dataclass(frozen=True)
class DirectConv:
    """A channels-last convolution as the direct kernel sees it: ``out[n, oh, ow, g, o] += x[n, oh*sh +
    kh*dh, ow*sw + kw*dw, g, c] * w[kh, kw, c, g, o]`` over the (already padded) input, loops (n, oh, ow, g,
    o, kh, kw, c). ``x_order`` names the input's dimensions in its memory order: ``"nhwgc"`` as the emitter
    builds it, ``"ngchw"`` where ``fuse`` folded the transpose of an NCHW graph input into the kernel's
    reads (the kernel broadcasts one input value at a time, so any order reads alike)."""

    n: int
    oh: int
    ow: int
    groups: int
    og: int
    kh: int
    kw: int
    cg: int
    sh: int = 1
    sw: int = 1
    dh: int = 1
    dw: int = 1
    x_order: str = "nhwgc"

    @property
    def macs(self) -> int:
        return self.n * self.oh * self.ow * self.groups * self.og * self.kh * self.kw * self.cg


def direct_conv_geometry(extents: Sequence[int], iterators: Sequence[str],
                         operands: Sequence[Sequence[Sequence[tuple[int, int]]]]) -> DirectConv | None:
    """The geometry of a loop nest (``extents``, ``iterators``, and per operand — input, weights, output — the
    (loop, coefficient) terms of each index; `pbsdk.core.plan.vector_tiles.Access.dims`) that is the
    channels-last convolution above in that loop order; None for anything else."""
    if len(extents) != 8 or tuple(iterators) != ("parallel",) * 5 + ("reduction",) * 3 or len(operands) != 3:
        return None
    x, w, out = ([tuple(sorted(t)) for t in dims] for dims in operands)
    if w != [((5, 1),), ((6, 1),), ((7, 1),), ((3, 1),), ((4, 1),)]:
        return None
    if out != [((0, 1),), ((1, 1),), ((2, 1),), ((3, 1),), ((4, 1),)]:
        return None
    order = _input_order(x)
    if order is None:
        return None
    (l1, sh), (l5, dh) = x[order.index("h")]
    (l2, sw), (l6, dw) = x[order.index("w")]
    if (l1, l5, l2, l6) != (1, 5, 2, 6):
        return None
    n, oh, ow, g, og, kh, kw, cg = extents
    return DirectConv(n, oh, ow, g, og, kh, kw, cg, sh, sw, dh, dw, order)


#: The input's index terms by role: the batch, the group, the channel in the group (one loop each); the
#: row and the column are two terms each (output position and tap).
_INPUT_ROLES: dict[tuple[tuple[int, int], ...], str] = {((0, 1),): "n", ((3, 1),): "g", ((7, 1),): "c"}


def _input_order(x: Sequence[tuple[tuple[int, int], ...]]) -> str | None:
    """The input's dimension roles in memory order (`DirectConv.x_order`), or None when its five indices
    are not the batch, row, column, group and channel each once."""
    if len(x) != 5:
        return None
    roles = []
    for terms in x:
        if len(terms) == 2:
            roles.append({1: "h", 2: "w"}.get(terms[0][0], "?"))
        else:
            roles.append(_INPUT_ROLES.get(terms, "?"))
    order = "".join(roles)
    return order if sorted(order) == sorted("nhwgc") else None


@dataclasses.dataclass(frozen=True)
class DirectConvTile:
    """The register tile of a direct convolution: ``width`` adjacent output pixels of one output row by a
    group's output channels in ``vectors`` vectors of ``lanes`` (the last one using ``masked`` lanes when
    not 0), accumulated in ``width * vectors`` registers over every tap and input channel; per (tap,
    channel) step ``vectors`` weight loads, ``width`` broadcast input loads and ``width * vectors`` FMAs.
    The last ``tail`` pixels of a row form a narrower tile. The kernel's rows, columns and input channels
    are loops, none unrolled: unrolled, the compiler hoists the input values of later steps ahead (and
    shares one between adjacent columns' pixels), past the register file, and spills the accumulators
    (Zen 4, 1 thread: 16-channel groups with the columns unrolled 0.45 ms against 0.27; 32-channel groups
    with 16 channels unrolled 2682 spill and reload instructions, 0.75 ms against 0.52)."""

    lanes: int
    vectors: int
    masked: int
    width: int
    tail: int
    reason: str

    def step_cycles(self, fma_per_cycle: int, loads_per_cycle: int, width: int | None = None) -> float:
        """Issue cycles of one (tap, channel) step of a tile ``width`` pixels wide (this tile's by default):
        bound by its FMAs or its loads, whichever issue slower."""
        w = self.width if width is None else width
        return max(w * self.vectors / fma_per_cycle, (w + self.vectors) / loads_per_cycle)


def _vector_lanes(og: int, lanes: int) -> int:
    """The vector length that carries ``og`` output channels: the spec's lanes, or for fewer channels the
    shortest power of two that holds them (8 channels on 16 lanes: 8-lane vectors, not half-empty 16s)."""
    v = 1
    while v < og and v < lanes:
        v *= 2
    return min(v, lanes)


def direct_conv_tile(registers: int, lanes: int, conv: DirectConv) -> DirectConvTile:
    """Choose the register tile (`DirectConvTile`) of ``conv`` on a vector unit of ``registers`` registers of
    ``lanes`` elements.

    Every output channel of a group in vectors (``ceil(og / lanes)``; a group narrower than the vector in
    the shortest power-of-two vector that holds it); as many pixels as the registers left after the weight
    vectors and `SPARE_REGISTERS` hold as accumulators (at most the row), balanced over the row
    (``ceil(ow / tiles)``: a 28-pixel row is 2 tiles of 14, not 27 and 1)."""
    if min(registers, lanes) < 1:
        raise ValueError(f"direct_conv_tile: registers {registers} and lanes {lanes} must be positive")
    vl = _vector_lanes(conv.og, lanes)
    vectors = -(-conv.og // vl)
    masked = conv.og % vl
    cap = max(1, min(conv.ow, (registers - vectors - SPARE_REGISTERS) // vectors))
    tiles = -(-conv.ow // cap)
    width = -(-conv.ow // tiles)
    tail = conv.ow % width
    reason = (f"direct {conv.kh}x{conv.kw}, {conv.groups} group(s) of {conv.cg}->{conv.og} channels, rows of "
              f"{conv.ow}: tiles of {width} pixels x {vectors} vector(s) of {vl} lanes"
              + (f" (the last {masked} used)" if masked else "")
              + f" in {width * vectors} accumulators" + (f", a tail tile of {tail}" if tail else ""))
    return DirectConvTile(vl, vectors, masked, width, tail, reason)


def direct_conv_cycles(conv: DirectConv, tile: DirectConvTile, fma_per_cycle: int, loads_per_cycle: int,
                       weight_bytes_per_cycle: float = math.inf, element_bytes: int = 4) -> float:
    """Issue cycles of ``conv`` run by the direct kernel with ``tile``: per output row and group, its full
    tiles and its tail, each ``taps * cg`` steps of `DirectConvTile.step_cycles` — or, when longer, the
    time to stream the group's weights (which every tile reads once) at ``weight_bytes_per_cycle`` from
    the cache level that holds them."""
    steps = conv.kh * conv.kw * conv.cg
    stream = steps * conv.og * element_bytes / weight_bytes_per_cycle
    main = (conv.ow - tile.tail) // tile.width
    row = main * max(steps * tile.step_cycles(fma_per_cycle, loads_per_cycle), stream)
    if tile.tail:
        row += max(steps * tile.step_cycles(fma_per_cycle, loads_per_cycle, tile.tail), stream)
    return float(conv.n * conv.oh * conv.groups * row)


def contraction_cycles(registers: int, lanes: int, fma_per_cycle: int, loads_per_cycle: int,
                       conv: DirectConv) -> float:
    """Issue cycles of ``conv`` as the contraction the emitter builds otherwise: per group, (pixels) x (og)
    x (taps * cg) on the register tile the packed kernels use; its patches copied (`COPY_CYCLES` an element)
    unless one group reads them in place (`window_run`: channel runs long enough), and rearranged group-major
    (another copy) when there are several groups."""
    from pbsdk.core.plan.contraction import issue_cycles, register_tile

    m, k = conv.n * conv.oh * conv.ow, conv.kh * conv.kw * conv.cg
    mr, nv, _ = register_tile(registers, lanes, fma_per_cycle, loads_per_cycle, m, conv.og)
    cycles = conv.groups * issue_cycles(fma_per_cycle, loads_per_cycle, lanes, m, conv.og, mr, nv) * k
    in_place = conv.groups == 1 and (conv.kh == conv.kw == 1 and conv.sh == conv.sw == 1
                                     or window_run(conv.cg, conv.kw, conv.dw) is not None)
    if not in_place:
        cycles += COPY_CYCLES * m * k * conv.groups * (2 if conv.groups > 1 else 1)
    return float(cycles)


@dataclasses.dataclass(frozen=True)
class ConvRoute:
    """How a float convolution runs: ``"direct"`` (the direct kernel, with ``tile``) or ``"contraction"``
    (implicit GEMM, or a batched contraction over groups), with the issue-cycle estimates that decided it."""

    route: Literal["direct", "contraction"]
    direct_cycles: float | None
    contraction_cycles: float
    tile: DirectConvTile | None
    reason: str

    @property
    def direct(self) -> bool:
        return self.route == "direct"


def plan_conv_route(registers: int, lanes: int, fma_per_cycle: int, loads_per_cycle: int, conv: DirectConv, *,
                    caches: Sequence[tuple[int, float]], element_bytes: int = 4) -> ConvRoute:
    """Decide whether ``conv`` runs as a direct kernel or as a contraction, from the vector unit and the
    data caches (``caches``: (capacity bytes, bytes a cycle) per level, innermost first).

    Both are charged their issue cycles (`direct_conv_cycles`, `contraction_cycles`, copies included); the
    direct kernel runs where it takes at most `DIRECT_MARGIN` of the contraction's, else the contraction
    (its kernels block for every cache level). The direct
    kernel re-reads a group's weights for every tile: from the innermost level where they take at most half
    the capacity (the rest holds the input rows and the output), at its bandwidth; with no such level, from
    the outermost one given (a dense 3x3 of 256 channels, 2.4 MB, streams from L3 and goes to the
    contraction; a group of 16 channels, 9 KB, stays in L1)."""
    if not caches:
        raise ValueError("plan_conv_route: needs at least one cache level")
    tile = direct_conv_tile(registers, lanes, conv)
    gemm = contraction_cycles(registers, lanes, fma_per_cycle, loads_per_cycle, conv)
    weights = conv.kh * conv.kw * conv.cg * conv.og * element_bytes
    bandwidth = next((bw for size, bw in caches if 2 * weights <= size), caches[-1][1])
    direct = direct_conv_cycles(conv, tile, fma_per_cycle, loads_per_cycle, bandwidth, element_bytes)
    chosen: Literal["direct", "contraction"] = "direct" if direct <= DIRECT_MARGIN * gemm else "contraction"
    reason = (f"conv {conv.kh}x{conv.kw} {conv.groups}x({conv.cg}->{conv.og}) channels, "
              f"{conv.oh}x{conv.ow} pixels x {conv.n}: {chosen} ({direct:.3g} vs {gemm:.3g} issue cycles direct "
              f"vs contraction; {weights} B of weights a group at {bandwidth:.3g} B a cycle)"
              + (f"; {tile.reason}" if chosen == "direct" else ""))
    return ConvRoute(chosen, direct, gemm, tile if chosen == "direct" else None, reason)
