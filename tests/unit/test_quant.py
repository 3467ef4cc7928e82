"""The quantization decisions of `pbsdk.core.quant` without MLIR: how a framework's i8/u8 quantized tensor is
held in the graph's i8 (`quant_storage`), clamp ranges narrower than i8's, and when a contraction of two
dequantized tensors runs on integers (`plan_integer_contraction`) and why not."""

from __future__ import annotations

import numpy as np
import pytest

from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.quant import plan_integer_contraction, quant_params, quant_storage


def test_u8_is_held_in_i8_shifted_by_128() -> None:
    st = quant_storage("u8", 0, 255)
    assert (st.offset, st.qmin, st.qmax) == (128, -128, 127)
    assert st.zero_points([136, 0, 255]) == (8, -128, 127)
    # PT2E's reduce_range activations: [0, 127].
    assert (quant_storage("u8", 0, 127).qmin, quant_storage("u8", 0, 127).qmax) == (-128, -1)


def test_i8_is_held_as_is_narrow_ranges_kept() -> None:
    st = quant_storage("i8", -127, 127)  # XNNPACK-style symmetric weights
    assert (st.offset, st.qmin, st.qmax) == (0, -127, 127)
    assert st.zero_points([-3]) == (-3,)


def test_the_shift_is_exact_for_every_u8_value_and_zero_point() -> None:
    """quantize and dequantize through the i8 storage equal the u8 convention for all 256 x 256 pairs."""
    st = quant_storage("u8", 0, 255)
    q = np.arange(256)[:, None]
    z = np.arange(256)[None, :]
    stored_q, stored_z = q - st.offset, np.asarray(st.zero_points(z.ravel().tolist()))[None, :]
    assert stored_q.min() >= -128 and stored_q.max() <= 127 and stored_z.min() >= -128 and stored_z.max() <= 127
    np.testing.assert_array_equal(stored_q - stored_z, q - z)  # dequantize's (q - z), hence everything after
    r = np.arange(-400, 400)[:, None]  # quantize: clamp(round(x / s) + z) for every rounded value r
    np.testing.assert_array_equal(np.clip(r + stored_z, st.qmin, st.qmax), np.clip(r + z, 0, 255) - st.offset)


@pytest.mark.parametrize("dtype, lo, hi, match", [("i16", -32768, 32767, "quantized dtype i16"),
                                                  ("i32", 0, 10, "quantized dtype i32"),
                                                  ("u8", 0, 256, r"range \[0, 256\]"),
                                                  ("i8", -128, 128, r"range \[-128, 128\]"),
                                                  ("u8", 5, 5, r"range \[5, 5\]")])
def test_other_dtypes_and_ranges_are_refused_naming_the_op(dtype: str, lo: int, hi: int, match: str) -> None:
    with pytest.raises(UnsupportedError, match=f"dequantize_per_tensor: {match}"):
        quant_storage(dtype, lo, hi, op="dequantize_per_tensor")


def test_narrow_clamp_ranges_are_checked() -> None:
    p = quant_params(0.1, 0, qmin=-127, qmax=127)
    assert (p.qmin, p.qmax, p.qrange) == (-127, 127, (-127, 127))
    assert quant_params(0.1, qmin=-128, qmax=127).qrange is None  # the full range is the default
    with pytest.raises(PbsdkError, match=r"range \[-129, 127\]"):
        quant_params(0.1, qmin=-129)
    with pytest.raises(PbsdkError, match=r"range \[3, 3\]"):
        quant_params(0.1, qmin=3, qmax=3)


def test_which_contractions_of_dequantized_tensors_run_on_integers() -> None:
    act = quant_params(0.02, 12)  # asymmetric per tensor (a u8 activation held in i8): fine
    w_oc = quant_params([0.01, 0.02, 0.03], 0, axis=0, shape=(3, 8))
    assert plan_integer_contraction(act, w_oc, channel_axis=0).integer
    assert plan_integer_contraction(act, quant_params(0.05), channel_axis=1).integer
    refused = {
        "asymmetric": plan_integer_contraction(act, quant_params(0.05, 3), channel_axis=1),
        "per channel along axis 0, not along its output channels (axis 1)":
            plan_integer_contraction(act, w_oc, channel_axis=1),
        "input is quantized per channel": plan_integer_contraction(w_oc, quant_params(0.05), channel_axis=1),
    }
    for why, plan in refused.items():
        assert not plan.integer and why in plan.reason, (why, plan)
