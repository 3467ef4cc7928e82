"""int8 quantized inference through pbsdk.ops: the dtype decisions (no MLIR), then quantize / dequantize /
i8 matmul with exact i32 accumulation / quantized_linear on the cpu and template targets, bit-exact against
numpy (`pbsdk.testing.reference`), the i8 contraction on the example NPU's i8 -> i32 matrix unit."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.plan import Contraction, plan_contraction
from pbsdk.core.quant import compute_dtype, plan_requantize, quant_params
from pbsdk.core.spec import load_spec
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(7)


def _i8(*shape: int) -> np.ndarray:
    return RNG.integers(-128, 128, shape).astype(np.int8)


# ------------------------------------------------------------------------------------------ no MLIR

def test_what_each_op_computes_in() -> None:
    assert compute_dtype("matmul", ["i8", "i8"]) == "i32"
    assert compute_dtype("conv2d", ["i8", "i8"]) == "i32"
    assert compute_dtype("matmul", ["bf16", "bf16"]) == "f32"
    assert compute_dtype("add", ["i32", "i32"]) == "i32"
    with pytest.raises(UnsupportedError, match="exp on integer tensors.*dequantize"):
        compute_dtype("exp", ["i8"])
    with pytest.raises(UnsupportedError, match="mix integer and float"):
        compute_dtype("matmul", ["i8", "f32"])
    assert Contraction(64, 64, 64, dtype="i8").accumulator == "i32"


def test_quant_params_are_checked() -> None:
    p = quant_params([0.1, 0.2, 0.3], 0, axis=-1, shape=(5, 3))
    assert p.axis == 1 and p.zero_point == (0, 0, 0) and (p.qmin, p.qmax) == (-128, 127)
    with pytest.raises(PbsdkError, match="needs 3 scales"):
        quant_params([0.1, 0.2], 0, axis=1, shape=(5, 3))
    with pytest.raises(PbsdkError, match="> 0"):
        quant_params(0.0)
    with pytest.raises(PbsdkError, match="outside i8"):
        quant_params(0.1, 200)


def test_requantize_multiplier_per_channel() -> None:
    rq = plan_requantize(quant_params(0.02, 3), quant_params([0.01, 0.04], 0, axis=0, shape=(2, 8)),
                         quant_params(0.05, -2))
    assert rq.multiplier == pytest.approx((0.004, 0.016)) and rq.zero_point == -2
    with pytest.raises(UnsupportedError, match="symmetric"):
        plan_requantize(quant_params(0.02), quant_params(0.01, 1), quant_params(0.05))


def test_the_npu_maps_i8_onto_its_i8_matrix_unit() -> None:
    tile = plan_contraction(load_spec("npu"), Contraction(256, 256, 256, dtype="i8")).compute
    assert (tile.kind, tile.name, tile.operand_dtype, tile.accumulator_dtype) == ("matrix-unit", "mxu", "i8", "i32")
    assert (tile.m, tile.n, tile.k) == (32, 32, 64)


# ------------------------------------------------------------------------------------------- kernels

TARGETS = [("cpu", None), ("cpu", "avx512"), ("template", "npu")]


@pytest.mark.parametrize("target, spec", TARGETS)
@pytest.mark.parametrize("shape", [(32, 32, 64), (37, 45, 70), (2, 33, 31, 129)])
def test_i8_matmul_accumulates_exactly_in_i32(target: str, spec: str | None, shape: tuple[int, ...]) -> None:
    *batch, m, n, k = shape
    a, b = _i8(*batch, m, k), _i8(*batch, k, n)
    f = pbsdk.jit(lambda x, y: x @ y, target=target, spec=spec)
    got = f(a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b.astype(np.int32))
    if target == "template":
        from pbsdk.conformance.runner import _reported

        used = _reported(f.kernel(f.signatures[0])[0])
        assert used is not None and used["matrix_unit_ops"].get("mxu", 0) > 0, used


@pytest.mark.parametrize("target, spec", TARGETS[::2])
def test_quantize_dequantize_per_tensor_and_per_channel(target: str, spec: str | None) -> None:
    x = (RNG.standard_normal((6, 5)) * 3).astype(np.float32)
    x[0, :4] = [0.25, 0.75, -0.25, 1e6]  # ties (half to even) and saturation
    scales, zps = np.array([0.5, 0.1, 0.02, 0.3, 1.0]), np.array([0, 3, -7, 127, -128])

    def fn(v):
        q1 = ops.quantize(v, 0.5, 1)
        q2 = ops.quantize(v, scales, zps, axis=1)
        return q1, q2, ops.dequantize(q2, scales, zps, axis=1)

    q1, q2, d = pbsdk.jit(fn, target=target, spec=spec)(x)
    np.testing.assert_array_equal(q1, ref.quantize(x, 0.5, 1))
    np.testing.assert_array_equal(q2, ref.quantize(x, scales, zps, axis=1))
    np.testing.assert_array_equal(d, ref.dequantize(q2, scales, zps, axis=1))
    assert q1.dtype == np.int8 and d.dtype == np.float32


@pytest.mark.parametrize("target, spec", TARGETS[::2])
@pytest.mark.parametrize("per_channel", [False, True])
def test_quantized_linear_is_bit_exact(target: str, spec: str | None, per_channel: bool) -> None:
    x = RNG.standard_normal((16, 70)).astype(np.float32)
    w = (RNG.standard_normal((40, 70)) * 0.1).astype(np.float32)
    b = RNG.standard_normal(40).astype(np.float32)
    ws = np.abs(w).max(axis=1) / 127 if per_channel else np.array([np.abs(w).max() / 127])
    axis = 0 if per_channel else None

    def fn(v, wt, bias):
        xq = ops.quantize(v, 0.02, 3)
        wq = ops.quantize(wt, ws, 0, axis=axis)
        return ops.quantized_linear(xq, 0.02, 3, wq, ws, bias, out_scale=0.05, out_zero_point=-2)

    f = pbsdk.jit(fn, target=target, spec=spec)
    got = f(x, w, b)
    wq = ref.quantize(w, ws, 0, axis=axis)
    want = ref.quantized_linear(ref.quantize(x, 0.02, 3), 0.02, 3, wq, ws, b, out_scale=0.05, out_zero_point=-2)
    np.testing.assert_array_equal(got, want)
    # And close to the float layer (quantization error only; x saturates at (127 - 3) * 0.02).
    fl = np.clip(x, -2.5, 2.48) @ w.T + b
    assert np.abs(ref.dequantize(got, 0.05, -2) - fl).max() < 0.2
    if target == "template":
        from pbsdk.conformance.runner import _reported

        used = _reported(f.kernel(f.signatures[0])[0])
        assert used is not None and used["matrix_unit_ops"].get("mxu", 0) > 0, used


def test_integer_tensors_refuse_float_ops() -> None:
    with pytest.raises(UnsupportedError, match="exp on integer tensors"):
        pbsdk.jit(lambda q: ops.exp(q), target="cpu")(_i8(3, 4))
    with pytest.raises(UnsupportedError, match="non-integer operand"):
        pbsdk.jit(lambda q: q * 0.5, target="cpu")(_i8(3, 4))
    with pytest.raises(UnsupportedError, match="dequantize"):
        pbsdk.jit(lambda q, f: q @ f, target="cpu")(_i8(3, 4), np.ones((4, 2), np.float32))
