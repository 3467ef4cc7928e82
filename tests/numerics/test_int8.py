"""int8 quantized inference through pbsdk.ops: the dtype decisions (no MLIR), then quantize / dequantize /
i8 matmul with exact i32 accumulation / quantized_linear on the cpu and template targets, bit-exact against
numpy (`pbsdk.testing.reference`), the i8 contraction on the example NPU's i8 -> i32 matrix unit."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.plan import Contraction, plan_contraction
from pbsdk.core.quant import compute_dtype, plan_requantize, quant_params, quant_storage
from pbsdk.core.spec import load_spec
from pbsdk.testing import cannot_run
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

#: The host, the portable AVX-512 baseline (its code runs only where the host has AVX-512: skipped elsewhere,
#: `cannot_run`), the npu's emulation.
TARGETS = [("cpu", None), pytest.param("cpu", "avx512", marks=pytest.mark.skipif(
    cannot_run("avx512") is not None, reason=str(cannot_run("avx512")))), ("template", "npu")]


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


# ----------------------------------------------- u8 activations, per-channel weights, narrow ranges

def _mxu_ops(f: Any) -> int:
    from pbsdk.conformance.runner import _reported

    used = _reported(f.kernel(f.signatures[0])[0])
    assert used is not None
    return used["matrix_unit_ops"].get("mxu", 0)


@pytest.mark.parametrize("target, spec, qmin, qmax, zero_point", [
    ("cpu", None, 0, 255, 136), ("template", "npu", 0, 255, 136), ("cpu", None, 0, 255, 0), ("cpu", None, 0, 127, 64),
], ids=["u8-zp136-cpu", "u8-zp136-npu", "u8-zp0-cpu", "u8-reduced-range-cpu"])
def test_u8_activations_held_in_i8_are_bit_exact(target: str, spec: str | None, qmin: int, qmax: int,
                                                 zero_point: int) -> None:
    """A u8 activation (PT2E's x86 quantizer: asymmetric, any zero point) held in i8 shifted by 128
    (`quant_storage`): the quantized values and the i8 contraction of ``dequantize(x) @ dequantize(w)`` with
    per-channel weights equal numpy's u8 arithmetic bit for bit, on the i8 matrix unit."""
    st = quant_storage("u8", qmin, qmax)
    x = (RNG.standard_normal((24, 96)) * 1.5).astype(np.float32)
    x[0, :3] = [1e6, -1e6, 0.5 * 0.02]  # both saturations and a tie
    w = (RNG.standard_normal((96, 40)) * 0.1).astype(np.float32)
    ws = np.abs(w).max(axis=0) / 127  # per output column
    wq = ref.quantize(w, ws, 0, axis=1, qmin=-127, qmax=127)
    (z,) = st.zero_points([zero_point])

    def fn(v, wt):
        q8 = ops.quantize(v, 0.02, z, qmin=st.qmin, qmax=st.qmax)
        return q8, ops.dequantize(q8, 0.02, z) @ ops.dequantize(wt, ws, 0, axis=1)

    f = pbsdk.jit(fn, target=target, spec=spec)
    q8, y = f(x, wq)
    xu8 = ref.quantize(x, 0.02, zero_point, qmin=qmin, qmax=qmax, dtype=np.uint8)
    assert q8.dtype == np.int8 and xu8.min() == qmin and xu8.max() == qmax
    np.testing.assert_array_equal(q8.astype(np.int32) + st.offset, xu8)
    np.testing.assert_array_equal(y, ref.quantized_matmul(xu8, 0.02, zero_point, wq, ws))
    if target == "template":
        assert _mxu_ops(f) > 0


@pytest.mark.parametrize("target, spec", TARGETS[::2])
def test_quantized_linear_u8_in_and_out(target: str, spec: str | None) -> None:
    """``quantized_linear`` on u8 input and output conventions (through `quant_storage`), per-channel
    [-127, 127] weights: bit-exact against numpy's u8 arithmetic."""
    st = quant_storage("u8", 0, 255)
    x = RNG.standard_normal((16, 70)).astype(np.float32)
    w = (RNG.standard_normal((40, 70)) * 0.1).astype(np.float32)
    b = RNG.standard_normal(40).astype(np.float32)
    ws = np.abs(w).max(axis=1) / 127
    wq = ref.quantize(w, ws, 0, axis=0, qmin=-127, qmax=127)
    (zx,), (zo,) = st.zero_points([140]), st.zero_points([120])

    def fn(v, wt, bias):
        xq = ops.quantize(v, 0.02, zx, qmin=st.qmin, qmax=st.qmax)
        return ops.quantized_linear(xq, 0.02, zx, wt, ws, bias, out_scale=0.01, out_zero_point=zo,
                                    out_qmin=st.qmin, out_qmax=st.qmax)

    got = pbsdk.jit(fn, target=target, spec=spec)(x, wq, b)
    xu8 = ref.quantize(x, 0.02, 140, qmin=0, qmax=255, dtype=np.uint8)
    want = ref.quantized_linear(xu8, 0.02, 140, wq, ws, b, out_scale=0.01, out_zero_point=120, out_qmin=0,
                                out_qmax=255, out_dtype=np.uint8)
    assert want.min() == 0 and want.max() == 255  # both ends of the u8 range reached
    np.testing.assert_array_equal(got.astype(np.int32) + st.offset, want)


def test_narrow_range_quantize_never_reaches_minus_128() -> None:
    w = np.array([[-3.0, -1.0, 0.5, 2.0], [1.0, -1e3, 0.0, 0.25]], np.float32)
    scales = np.array([0.01, 0.5])
    got = pbsdk.jit(lambda v: ops.quantize(v, scales, 0, axis=0, qmin=-127, qmax=127), target="cpu")(w)
    np.testing.assert_array_equal(got, ref.quantize(w, scales, 0, axis=0, qmin=-127, qmax=127))
    assert got.min() == -127


@pytest.mark.parametrize("zero_point, axis, why", [(3, None, "asymmetric"), (0, 0, "not along its output")])
def test_unsupported_weights_take_the_float_path_and_say_why(zero_point: int, axis: int | None, why: str,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    """Asymmetric weights, or per-channel scales along K: the float contraction (correct, no i8 unit),
    with the reason logged on ``pbsdk.quant``."""
    xq, wq = _i8(8, 64), _i8(64, 32)
    ws = np.full(64, 0.01) if axis == 0 else np.array([0.01])

    def fn(a, b):
        return ops.dequantize(a, 0.05, -4) @ ops.dequantize(b, ws, zero_point, axis=axis)

    with caplog.at_level(logging.INFO, logger="pbsdk.quant"):
        f = pbsdk.jit(fn, target="template", spec="npu")
        got = f(xq, wq)
    want = ref.dequantize(xq, 0.05, -4) @ ref.dequantize(wq, ws, zero_point, axis=axis)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert _mxu_ops(f) == 0  # f32 has no matrix unit on the npu: the contraction ran on the vector unit
    assert any(why in r.getMessage() and "runs in float" in r.getMessage() for r in caplog.records), caplog.text


# ----------------------------------------------- quantize(max_pool(x)) pools the quantized input

@pytest.mark.parametrize("pool, axis", [((3, 2, 1), None), ((3, 2, 1), 1), ((2, 2, 0), None), ((3, 1, 1), None),
                                        ((3, 2, 1), 3)], ids=["3x3s2p1", "per-channel", "blocks", "3x3s1p1",
                                                              "pooled-axis"])
def test_quantize_of_a_max_pool_pools_integers(pool: tuple[int, int, int], axis: int | None) -> None:
    """PT2E's x86 quantizer leaves a max pool in float between a convolution's ReLU and the next quantize;
    quantizing is monotone, so pbsdk pools the quantized input (padding with i8's least value where the
    float pool pads with -inf): the same integers as torch's order, the pool on a quarter of the bytes, the
    quantize next to its producer. Not where the channel axis of per-channel parameters is pooled."""
    from pbsdk.frontends.jit import trace

    x = (RNG.standard_normal((2, 4, 9, 9)) * 3).astype(np.float32)
    x[0, 0, :3, :3] = -50.0  # a window that saturates at qmin, next to the padding
    scale, zp = (0.05, -3) if axis in (None, 3) else ([0.05, 0.1, 0.02, 0.3], [0, 1, -2, 5])
    if axis == 3:
        scale, zp = [0.05] * 5, [-3] * 5

    def fn(v):
        return ops.quantize(ops.max_pool(v, *pool), scale, zp, axis=axis)

    got = pbsdk.jit(fn)(x)
    want = ref.quantize(_max_pool(x, *pool), scale, zp, axis=axis)
    np.testing.assert_array_equal(got, want)
    graph, _ = trace(fn, pbsdk.jit(fn)._signature((x,)))
    pooled_dtypes = {n.inputs[0].type.dtype for n in graph.live_nodes() if n.group == "max_pool" and n.inputs}
    assert pooled_dtypes == ({"f32"} if axis == 3 else {"i8"}), pooled_dtypes


def _max_pool(x: np.ndarray, k: int, s: int, p: int) -> np.ndarray:
    import torch

    return torch.nn.functional.max_pool2d(torch.from_numpy(x), k, s, p).numpy()


@pytest.mark.parametrize("params, folds", [
    ((0.05, -3, None, None), True),
    (([0.05, 0.1, 0.02, 0.3], [0, 1, -2, 5], 1, None), True),
    ((0.05, -3, None, (-127, 127)), False),  # a narrower range clamps -128
], ids=["per-tensor", "per-channel", "narrow-range"])
def test_quantize_of_its_own_dequantize_is_the_integers(params: tuple, folds: bool) -> None:
    """PT2E's quantize/dequantize pair around a max pool it leaves in float (a ResNet's stem): the quantize
    after the pool, with the same parameters, is the integers again — exact for every i8 value in f32 — so
    the pool runs on them and nothing between the convolutions is float."""
    from pbsdk.frontends.jit import trace

    scale, zp, axis, qrange = params
    q = RNG.integers(-128, 128, (2, 4, 9, 9), dtype=np.int8)
    q.reshape(-1)[:2] = [-128, 127]
    lo, hi = qrange or (None, None)

    def fn(v):
        f = ops.dequantize(v, scale, zp, axis=axis)
        return ops.quantize(ops.max_pool(f, 3, 2, 1), scale, zp, axis=axis, qmin=lo, qmax=hi)

    got = pbsdk.jit(fn)(q)
    want = ref.quantize(_max_pool(ref.dequantize(q, scale, zp, axis=axis).astype(np.float32), 3, 2, 1), scale, zp,
                        axis=axis, **({"qmin": lo, "qmax": hi} if qrange else {}))
    np.testing.assert_array_equal(got, want)
    graph, _ = trace(fn, pbsdk.jit(fn)._signature((q,)))
    floats = {n.op for n in graph.live_nodes() if n.out.type.dtype == "f32"}
    assert (floats == set()) is folds, floats


def test_rounding_is_one_instruction_where_the_cpu_has_it() -> None:
    """math.roundeven (every quantize and requantize epilogue) stays an llvm.roundeven on a CPU with SSE4.1
    (roundps / vrndscaleps) instead of upstream's ~55-op arith expansion; a CPU without keeps the expansion.
    Half-way values still round to even (checked bit for bit)."""
    from pbsdk.core.options import as_options
    from pbsdk.core.spec import load_spec
    from pbsdk.targets.cpu import MATH_EXPANDED, lowering_stages, machine, math_expansions

    assert math_expansions("") == MATH_EXPANDED
    native = math_expansions("+avx2,+sse4.1,+fma")
    assert "roundeven" not in native and "ceil" not in native and "fma" not in native and "tanh" in native
    spec = load_spec("host")
    (lower,) = [s for s in lowering_stages(spec, as_options({})) if s.name == "lower-llvm"]
    assert f"math-expand-ops{{ops={','.join(math_expansions(machine(spec)[2]))}}}" in lower.passes
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 126.5, -127.5, 0.49999997], np.float32)
    np.testing.assert_array_equal(pbsdk.jit(lambda v: ops.quantize(v, 1.0, 0))(x), ref.quantize(x, 1.0, 0))
