"""Pure decisions for transposed convolutions: zeros inserted into the input, or one stride-1 convolution
per output phase (sub-pixel convolution). No MLIR and no spec: `pbsdk.ops.conv_transpose` builds the graph
the plan describes, and each convolution in it is then routed like any other (a direct kernel or a
contraction, `pbsdk.core.plan.direct_conv`).

A transposed convolution of stride ``s`` writes output ``o`` from the taps ``k`` with ``(o + p - k*d)``
divisible by ``s``. Inserting ``s - 1`` zeros between the input's elements turns it into a stride-1
convolution of the zero-filled input, whose multiply-adds are mostly with those zeros (``s**dims`` times
the useful ones) and whose input is ``s**dims`` times larger. Split by output phase ``t = o mod s`` instead,
each phase reads the original input with the taps of one residue class — a stride-1 convolution with a
sub-kernel of about ``K / s`` taps per axis — and the phases interleave into the output: no zeros, no
wasted multiply-adds.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Literal


@dataclasses.dataclass(frozen=True)
class AxisPhase:
    """One output phase along one spatial axis: outputs ``o = q*stride + phase`` for ``q < count`` are a
    stride-1 correlation of the input — cropped by ``-pad_before`` / ``-pad_after`` elements where those are
    negative, zero-padded by them otherwise — with the kernel taps ``taps`` in correlation order (tap
    ``taps[j]`` meets input element ``q + j`` of the padded input). No taps: the phase is zero."""

    phase: int
    taps: tuple[int, ...]
    pad_before: int
    pad_after: int


@dataclasses.dataclass(frozen=True)
class AxisPlan:
    """The phases of one spatial axis: every phase has ``count`` outputs; interleaved they make
    ``count * stride`` outputs, of which the first ``out`` are the transposed convolution's."""

    stride: int
    out: int
    count: int
    phases: tuple[AxisPhase, ...]


@dataclasses.dataclass(frozen=True)
class ConvTransposePlan:
    """How a transposed convolution runs: ``"phases"`` (one stride-1 convolution per combination of the
    axes' phases, interleaved), ``"zeros"`` (one stride-1 convolution of the zero-filled input) or
    ``"matmul"`` (no two taps meet an output: one product of the input's pixels by the whole kernel, each
    result placed at its output), with the multiply-adds (per input channel and output channel of a group)
    that decided it."""

    route: Literal["phases", "zeros", "matmul"]
    axes: tuple[AxisPlan, ...]
    phase_macs: int
    zeros_macs: int
    reason: str


def output_size(size: int, kernel: int, stride: int, padding: int, output_padding: int, dilation: int = 1) -> int:
    """The length of a transposed convolution's output along one axis (as torch computes it)."""
    return (size - 1) * stride - 2 * padding + dilation * (kernel - 1) + output_padding + 1


def axis_plan(size: int, kernel: int, stride: int, padding: int, output_padding: int) -> AxisPlan:
    """The output phases of one axis (dilation 1): phase ``t`` takes the taps ``k = r + j*stride`` with
    ``r = (t + padding) mod stride``; output ``q*stride + t`` reads input ``q + (t + padding) // stride - j``."""
    if min(size, kernel, stride) < 1 or padding < 0 or output_padding < 0:
        raise ValueError(f"axis_plan: size {size}, kernel {kernel}, stride {stride}, padding {padding} and "
                         f"output_padding {output_padding} out of range")
    out = output_size(size, kernel, stride, padding, output_padding)
    if out < 1:
        raise ValueError(f"axis_plan: no output (size {size}, kernel {kernel}, stride {stride}, padding {padding})")
    count = -(-out // stride)
    phases = []
    for t in range(stride):
        r, c = (t + padding) % stride, (t + padding) // stride
        taps = tuple(range(r, kernel, stride))[::-1]  # correlation order: the last tap meets the first input
        before = len(taps) - 1 - c
        after = count - 1 + len(taps) - size - before
        phases.append(AxisPhase(t, taps, before, after) if taps else AxisPhase(t, (), 0, 0))
    return AxisPlan(stride, out, count, tuple(phases))


def plan_conv_transpose(sizes: Sequence[int], kernel: Sequence[int], stride: Sequence[int],
                        padding: Sequence[int], output_padding: Sequence[int],
                        dilation: Sequence[int], groups: int = 1) -> ConvTransposePlan:
    """Decide how a transposed convolution of input ``sizes`` (spatial) runs (module docstring): as one
    product when no two taps meet an output (ungrouped, every dilation 1, and along every axis an input of
    one element or a stride of at least the kernel: a U-Net's 2x2 stride-2 upsampling, a generator's first
    layer from a 1x1 input) — the input's pixels times the whole kernel, each product written once; by
    phases when every dilation is 1 and some stride is above 1 — the phases' multiply-adds are the useful
    ones, the zero-filled input's ``prod(stride)`` times more — else (a dilated kernel, or stride 1, where
    there is one phase: the convolution itself) with zeros inserted (none for stride 1)."""
    dims = len(sizes)
    if not all(len(v) == dims for v in (kernel, stride, padding, output_padding, dilation)):
        raise ValueError("plan_conv_transpose: one kernel size, stride, padding, output padding and dilation per axis")
    outs = [output_size(n, k, s, p, e, d) for n, k, s, p, e, d in zip(sizes, kernel, stride, padding,
                                                                       output_padding, dilation)]
    zeros_macs = math.prod(outs) * math.prod(kernel)
    if groups == 1 and all(d == 1 for d in dilation) and all(n == 1 or s >= k for n, s, k in zip(sizes, stride, kernel)):
        macs = math.prod(sizes) * math.prod(kernel)
        return ConvTransposePlan("matmul", (), macs, zeros_macs,
                                 f"transposed conv {'x'.join(map(str, kernel))} stride {tuple(stride)} of a "
                                 f"{'x'.join(map(str, sizes))} input: no two taps meet an output, one product "
                                 f"of the pixels by the whole kernel ({macs} vs {zeros_macs} multiply-adds a "
                                 "channel pair with zeros inserted)")
    if any(d != 1 for d in dilation) or all(s == 1 for s in stride):
        why = "a dilated kernel" if any(d != 1 for d in dilation) else "stride 1: one phase"
        return ConvTransposePlan("zeros", (), zeros_macs, zeros_macs,
                                 f"transposed conv {'x'.join(map(str, kernel))} stride {tuple(stride)}: zeros "
                                 f"inserted ({why})")
    axes = tuple(axis_plan(n, k, s, p, e) for n, k, s, p, e in zip(sizes, kernel, stride, padding, output_padding))
    phase_macs = 0
    for combo in _combinations(axes):
        phase_macs += math.prod(a.count for a in axes) * math.prod(len(ph.taps) for ph in combo)
    reason = (f"transposed conv {'x'.join(map(str, kernel))} stride {tuple(stride)}: "
              f"{math.prod(stride)} output phases of stride-1 convolutions ({phase_macs} vs {zeros_macs} "
              f"multiply-adds a channel pair with zeros inserted)")
    return ConvTransposePlan("phases", axes, phase_macs, zeros_macs, reason)


def _combinations(axes: Sequence[AxisPlan]) -> list[tuple[AxisPhase, ...]]:
    combos: list[tuple[AxisPhase, ...]] = [()]
    for a in axes:
        combos = [c + (ph,) for c in combos for ph in a.phases]
    return combos


def phase_combinations(plan: ConvTransposePlan) -> list[tuple[AxisPhase, ...]]:
    """Every combination of the axes' phases, the last axis fastest."""
    return _combinations(plan.axes)
