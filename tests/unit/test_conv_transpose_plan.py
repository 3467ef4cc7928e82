"""The pure decisions for transposed convolutions (pbsdk.core.plan.conv_transpose): the output phases
along one axis, checked against the definition on 1-D data, and which route a convolution takes. No MLIR."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from pbsdk.core.plan.conv_transpose import axis_plan, output_size, phase_combinations, plan_conv_transpose


def _definition(x: np.ndarray, w: np.ndarray, stride: int, padding: int, output_padding: int) -> np.ndarray:
    """1-D transposed convolution by its definition: x[i] * w[k] lands on i*stride + k - padding."""
    out = np.zeros(output_size(len(x), len(w), stride, padding, output_padding))
    for i, k in itertools.product(range(len(x)), range(len(w))):
        o = i * stride + k - padding
        if 0 <= o < len(out):
            out[o] += x[i] * w[k]
    return out


def _by_phases(x: np.ndarray, w: np.ndarray, stride: int, padding: int, output_padding: int) -> np.ndarray:
    """The same from the plan: per phase a stride-1 correlation of the cropped or padded input, interleaved."""
    a = axis_plan(len(x), len(w), stride, padding, output_padding)
    full = np.zeros(a.count * a.stride)
    for ph in a.phases:
        if not ph.taps:
            continue
        xin = x[max(-ph.pad_before, 0):len(x) - max(-ph.pad_after, 0)]
        xin = np.pad(xin, (max(ph.pad_before, 0), max(ph.pad_after, 0)))
        taps = w[list(ph.taps)]
        assert len(xin) - len(taps) + 1 == a.count, (ph, a)
        full[ph.phase::stride] = np.correlate(xin, taps, mode="valid")
    return full[:a.out]


@pytest.mark.parametrize(("size", "kernel", "stride", "padding", "output_padding"), [
    (28, 3, 2, 1, 1), (7, 3, 2, 0, 0), (5, 4, 2, 1, 0), (6, 2, 3, 0, 2), (6, 5, 3, 2, 1), (1, 3, 2, 1, 1),
    (9, 1, 3, 0, 0), (4, 7, 2, 3, 1), (8, 3, 4, 0, 3), (5, 3, 1, 1, 0),
])
def test_phases_reproduce_the_definition(size: int, kernel: int, stride: int, padding: int,
                                         output_padding: int) -> None:
    rng = np.random.default_rng(size * 100 + kernel * 10 + stride)
    x, w = rng.standard_normal(size), rng.standard_normal(kernel)
    np.testing.assert_allclose(_by_phases(x, w, stride, padding, output_padding),
                               _definition(x, w, stride, padding, output_padding), rtol=1e-12, atol=1e-12)


def test_phase_taps_of_the_usual_upsampling() -> None:
    """3 taps, stride 2, padding 1, output padding 1 (a decoder's 2x upsampling): even outputs take the middle
    tap alone, odd ones the outer two, read backwards (tap 2 meets the earlier input)."""
    a = axis_plan(28, 3, 2, 1, 1)
    assert (a.out, a.count) == (56, 28)
    assert [(p.phase, p.taps, p.pad_before, p.pad_after) for p in a.phases] == [(0, (1,), 0, 0), (1, (2, 0), 0, 1)]


def test_a_kernel_shorter_than_the_stride_leaves_zero_phases() -> None:
    a = axis_plan(6, 1, 3, 0, 0)
    assert [p.taps for p in a.phases] == [(0,), (), ()]
    with pytest.raises(ValueError, match="out of range"):
        axis_plan(0, 3, 2, 1, 1)


def test_route_by_phases_counts_only_useful_multiply_adds() -> None:
    p = plan_conv_transpose((28, 28), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1))
    assert p.route == "phases" and len(phase_combinations(p)) == 4
    # Output 56x56; per output pixel 9/4 taps on average, against 9 with the zeros inserted.
    assert p.phase_macs == 28 * 28 * (1 + 2 + 2 + 4) and p.zeros_macs == 56 * 56 * 9
    assert "4 output phases" in p.reason
    three = plan_conv_transpose((8, 16, 16), (3, 3, 3), (2, 2, 2), (1, 1, 1), (1, 1, 1), (1, 1, 1))
    assert three.route == "phases" and len(phase_combinations(three)) == 8
    assert three.zeros_macs == 8 * three.phase_macs


def test_dilated_or_unit_stride_kernels_insert_zeros() -> None:
    dilated = plan_conv_transpose((6, 6), (3, 3), (2, 2), (1, 1), (1, 1), (1, 2))
    assert dilated.route == "zeros" and "dilated" in dilated.reason
    unit = plan_conv_transpose((6,), (3,), (1,), (1,), (0,), (1,))
    assert unit.route == "zeros" and "one phase" in unit.reason
    with pytest.raises(ValueError, match="per axis"):
        plan_conv_transpose((6, 6), (3,), (2, 2), (1, 1), (1, 1), (1, 1))


def test_taps_that_never_meet_are_one_product() -> None:
    # A U-Net's 2x2 stride-2 upsampling and a generator's first layer (a 1x1 input) place every tap's product
    # at its own output: one matmul, the useful multiply-adds only.
    unet = plan_conv_transpose((28, 28), (2, 2), (2, 2), (0, 0), (0, 0), (1, 1))
    assert unet.route == "matmul" and unet.phase_macs == 28 * 28 * 4 and "no two taps meet" in unet.reason
    first = plan_conv_transpose((1, 1), (4, 4), (1, 1), (0, 0), (0, 0), (1, 1))
    assert first.route == "matmul" and first.phase_macs == 16 < first.zeros_macs
    # Overlapping taps, a dilated kernel or groups keep their routes.
    assert plan_conv_transpose((28, 28), (3, 3), (2, 2), (1, 1), (1, 1), (1, 1)).route == "phases"
    assert plan_conv_transpose((5, 5), (2, 2), (2, 2), (0, 0), (0, 0), (2, 2)).route == "zeros"
    assert plan_conv_transpose((5, 5), (2, 2), (2, 2), (0, 0), (0, 0), (1, 1), groups=2).route == "phases"
