"""bf16 end to end: ``ml_dtypes.bfloat16`` arrays at the host boundary of ``pbsdk.jit``, ``compile_mlir``,
the torch backend (bf16 tensors) and JAX; the cpu lowering on a machine without bf16 conversions; the
tolerance of a contraction that follows its accumulator."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close, cannot_run, tolerance
from pbsdk.testing import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


def _rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(BF16)


# ------------------------------------------------------------------------------------------ no MLIR

def test_tolerance_follows_the_accumulator() -> None:
    k = 1024
    wide = tolerance("matmul", "bf16", reduction_size=k)  # as if accumulated in bf16: sqrt(K) * bf16
    acc = tolerance("matmul", "bf16", reduction_size=k, accumulator="f32")
    # One rounding to bf16 plus an f32 sum of K terms: ~100x tighter than sqrt(K) bf16 roundings.
    assert acc.rtol == pytest.approx(tolerance("astype", "bf16").rtol + 1e-5 * math.sqrt(k))
    assert acc.rtol < wide.rtol / 30
    # Same width or no contraction: the accumulator changes nothing.
    assert tolerance("matmul", "f32", reduction_size=k, accumulator="f32") == tolerance("matmul", "f32",
                                                                                       reduction_size=k)
    assert tolerance("exp", "bf16", accumulator="f32") == tolerance("exp", "bf16")


def test_assert_close_takes_bfloat16_arrays() -> None:
    e = _rand(4, 5)
    assert_close(e.copy(), e, op="add")
    bad = e.copy()
    bad[1, 2] = bad[1, 2] * 2 + 1
    with pytest.raises(AssertionError, match="1 of 20 elements"):
        assert_close(bad, e, op="add")


def test_reference_keeps_bfloat16() -> None:
    a, b = _rand(3, 4), _rand(4, 2, seed=1)
    got = ref.matmul(a, b)
    assert got.dtype == BF16
    np.testing.assert_array_equal(got, (a.astype(np.float64) @ b.astype(np.float64)).astype(BF16))
    assert ref.add(a, np.ones((3, 4), np.float16)).dtype == np.float32  # as pbsdk.ops: neither holds the other


def test_which_machines_convert_bf16() -> None:
    from pbsdk.core.spec import load_spec
    from pbsdk.targets.cpu import converts_bf16, machine

    assert not converts_bf16(machine(load_spec("avx512"))[2])  # the portable Skylake baseline
    assert converts_bf16("+avx512f,+avx512bf16") and converts_bf16("+avxneconvert")
    assert not converts_bf16("+avx512f,-avx512bf16")


# ------------------------------------------------------------------------------------------- kernels

#: The host and the portable Skylake baseline, whose code runs only where the host has AVX-512 (`cannot_run`).
SPECS = ["host", pytest.param("avx512", marks=pytest.mark.skipif(cannot_run("avx512") is not None,
                                                  reason=str(cannot_run("avx512"))))]


@pytest.mark.parametrize("spec", SPECS)
def test_jit_matmul_gelu_in_bf16(spec: str) -> None:
    """On ``avx512`` (no bf16 instructions) LLVM would call ``__truncsfbf2``, which this process lacks:
    the lowering expands bf16 in arith and the JIT provides the helper."""
    a, b = _rand(33, 70), _rand(70, 17, seed=1)

    f = pbsdk.jit(lambda x, y: ops.gelu(x @ y) + 1.0, target="cpu", spec=spec)
    got = f(a, b)
    assert got.dtype == BF16 and got.shape == (33, 17)
    mm = ref.matmul(a, b, dtype=np.float32)
    assert_close(got, ref.add(ref.gelu(mm), 1.0, dtype=BF16), op="gelu", dtype="bf16")
    assert f.signatures[0][0].dtype == "bf16"


@pytest.mark.parametrize("spec", SPECS)
def test_rounding_to_bf16_is_nearest_even_bit_for_bit(spec: str) -> None:
    """f32 -> bf16 on the kernel (expanded arith, or the JIT's ``__truncsfbf2`` that a vectorised max
    needs) matches ml_dtypes bit for bit: ties to even, overflow to inf, NaN kept, subnormals. The one
    documented exception: AVX512-BF16's VCVTNEPS2BF16 (``host`` where the machine has it and the lowering
    uses it: not on an AVX512-FP16 machine, where the conversions are expanded, `expands_bf16`) reads f32
    subnormal inputs as zero."""
    from pbsdk.core.spec import load_spec
    from pbsdk.targets.cpu import expands_bf16, machine

    specials = np.array([0.0, -0.0, 1.0, 1.00390625, 1.01171875, 1.005859375, 3.3895314e38, 3.4e38, np.inf,
                         -np.inf, np.nan, 1e-40, -1e-41, 9.2e-41, 65504.0, -2.5], np.float32)
    x = np.concatenate([specials, np.random.default_rng(3).standard_normal(1000).astype(np.float32)])
    x = x.reshape(2, -1)
    got = pbsdk.jit(lambda v: ops.astype(v, "bf16"), target="cpu", spec=spec)(x)
    want = x.astype(BF16)
    if not expands_bf16(machine(load_spec(spec))[2]):
        tiny = (x != 0) & (np.abs(x) < np.finfo(np.float32).tiny)
        want = np.where(tiny, np.copysign(np.zeros_like(x), x), x).astype(BF16)
    nan = np.isnan(want.astype(np.float32))
    assert np.array_equal(np.isnan(got.astype(np.float32)), nan)
    np.testing.assert_array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
    rows = pbsdk.jit(lambda v: ops.max(v, axis=1), target="cpu", spec=spec)(want)  # bf16 selects; NaN propagates
    np.testing.assert_array_equal(rows, np.max(want.astype(np.float32), axis=1).astype(BF16))


def test_compile_mlir_takes_bf16() -> None:
    text = """
    func.func @main(%a: tensor<8x16xbf16>, %b: tensor<16x4xbf16>) -> tensor<8x4xf32> {
      %zero = arith.constant 0.0 : f32
      %e = tensor.empty() : tensor<8x4xf32>
      %z = linalg.fill ins(%zero : f32) outs(%e : tensor<8x4xf32>) -> tensor<8x4xf32>
      %c = linalg.matmul ins(%a, %b : tensor<8x16xbf16>, tensor<16x4xbf16>) outs(%z : tensor<8x4xf32>)
             -> tensor<8x4xf32>
      return %c : tensor<8x4xf32>
    }"""
    a, b = _rand(8, 16), _rand(16, 4, seed=2)
    got = pbsdk.compile_mlir(text, target="cpu")(a, b)
    # Products of bf16 values are exact in f32; a 16-term f32 sum.
    assert_close(got, ref.matmul(a, b, dtype=np.float32), op="matmul", reduction_size=16)


def test_template_matrix_unit_runs_bf16() -> None:
    from pbsdk.conformance.runner import _reported

    a, b = _rand(64, 96), _rand(96, 40, seed=1)
    f = pbsdk.jit(lambda x, y: x @ y, target="template", spec="npu")
    got = f(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", dtype="bf16", reduction_size=96, accumulator="f32")
    used = _reported(f.kernel(f.signatures[0])[0])
    assert used is not None and used["matrix_unit_ops"].get("mxu", 0) > 0, used


def test_torch_bf16_tensors() -> None:
    torch = pytest.importorskip("torch")
    from pbsdk.frontends.torch import clear_reports, reports

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.GELU(), torch.nn.Linear(96, 32)).to(torch.bfloat16)
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    clear_reports()
    with torch.no_grad():
        got = torch.compile(model, backend="pbsdk")(x)
        want = model.float()(x.float())
    (report,) = reports()
    assert report.fallback_ops == () and report.failed_partitions == 0 and report.compiled_ops == report.graph_ops
    assert got.dtype == torch.bfloat16
    # Each linear rounds its result to bf16 once (f32 accumulation): a few bf16 roundings in all.
    assert_close(got.float().numpy(), want.numpy(), op="mlp", dtype="float32", tol=pbsdk.testing.Tolerance(3e-2, 3e-2))


def test_jax_bf16_arrays() -> None:
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    import pbsdk.jax

    def fn(a, w):
        return jax.nn.gelu(a @ w, approximate=False) * 2.0

    a, w = jnp.asarray(_rand(16, 64)), jnp.asarray(_rand(64, 32, seed=1))
    pbsdk.jax.clear_reports()
    got = pbsdk.jax.jit(fn, target="cpu")(a, w)
    (report,) = pbsdk.jax.reports()
    assert report.fallback_primitives == () and report.kernels == 1
    assert got.dtype == jnp.bfloat16
    want = fn(a.astype(jnp.float32), w.astype(jnp.float32))
    assert_close(np.asarray(got).astype(np.float32), np.asarray(want), op="gelu", dtype="float32",
                 tol=pbsdk.testing.Tolerance(3e-2, 2e-2))
