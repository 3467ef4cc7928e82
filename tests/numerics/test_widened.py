"""bf16 and f16 products on the f32 FMAs where no unit computes them (`widened_dtype`): A and B widened as
they are packed. The option ``matrix_units=False`` puts every host in that case (on a host without
AVX512-BF16 it is the default for bf16; for f16 it is the default on every x86 host)."""

from __future__ import annotations

import re

import ml_dtypes
import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close

BF16 = np.dtype(ml_dtypes.bfloat16)
NO_UNITS = {"matrix_units": False, "cache": False}

#: (M, N, K): whole tiles; edges in every dimension; one row; several k blocks; few rows, many columns.
SHAPES = [(64, 64, 64), (37, 45, 29), (1, 100, 3), (130, 17, 1100), (12, 3000, 700)]


def _rand(shape: tuple[int, ...], seed: int, dtype: np.dtype) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def _packed(fn: pbsdk.JitFunction, *args: np.ndarray) -> str:
    from pbsdk.core.compiler import compile_text

    return str(compile_text(fn.lower(*args), fn.request, stop_after="pack-contractions"))


def _exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(np.float64) @ b.astype(np.float64)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, n, k", SHAPES)
@pytest.mark.parametrize("dtype", [BF16, np.dtype(np.float16)], ids=["bf16", "f16"])
def test_narrow_matmul_on_widened_operands(m: int, n: int, k: int, threads: int, dtype: np.dtype) -> None:
    a, b = _rand((m, k), 0, dtype), _rand((k, n), 1, dtype)
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", options={"threads": threads, **NO_UNITS})
    got = fn(a, b)
    assert got.dtype == dtype
    name = "bf16" if dtype == BF16 else "f16"
    assert_close(got, _exact(a, b).astype(dtype), op="matmul", dtype=name, reduction_size=k, accumulator="f32")
    ir_text = _packed(fn, a, b)
    assert "linalg.matmul" not in ir_text  # a packed kernel, not the generic lowering
    assert re.search(rf"arith.extf %\S+ : vector<(\d+)x{name}> to vector<\1xf32>", ir_text)  # widened as packed


def test_batched_and_transposed_operands_are_widened() -> None:
    """A batched product, and ``x @ w.T`` (B stored [n, k], packed through register transposes)."""
    a, b = _rand((3, 40, 70), 0, BF16), _rand((3, 70, 50), 1, BF16)
    got = pbsdk.jit(lambda x, w: x @ w, target="cpu", options=NO_UNITS)(a, b)
    assert_close(got, _exact(a, b).astype(BF16), op="matmul", dtype="bf16", reduction_size=70, accumulator="f32")
    x, w = _rand((33, 300), 2, BF16), _rand((90, 300), 3, BF16)
    fn = pbsdk.jit(lambda p, q: p @ ops.transpose(q, (1, 0)), target="cpu", options=NO_UNITS)
    assert_close(fn(x, w), _exact(x, w.T).astype(BF16), op="matmul", dtype="bf16", reduction_size=300,
                 accumulator="f32")


@pytest.mark.parametrize("threads", [1, 2])
def test_bias_and_gelu_after_a_widened_product_are_fused(threads: int) -> None:
    """The bf16 epilogue (the product rounded to bf16, a bf16 bias added, GELU, stored in bf16) runs in the
    kernel on each micro-tile's sums: no pass over an f32 C after it."""
    from pbsdk.testing import reference as ref

    a, b, c = _rand((70, 96), 0, BF16), _rand((96, 130), 1, BF16), _rand((130,), 2, BF16)
    fn = pbsdk.jit(lambda x, w, bias: ops.gelu(x @ w + bias), target="cpu", options={"threads": threads, **NO_UNITS})
    want = ref.gelu(ref.add(ref.matmul(a, b, dtype=np.float32).astype(BF16), c, dtype=BF16))
    assert_close(fn(a, b, c), want, op="gelu", dtype="bf16", reduction_size=96, accumulator="f32")
    packed = _packed(fn, a, b, c)
    assert "linalg.generic" not in packed and "arith.truncf" in packed, packed


def test_a_plain_widened_product_rounds_to_bf16_in_the_kernel() -> None:
    a, b = _rand((40, 300), 0, BF16), _rand((300, 50), 1, BF16)
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", options=NO_UNITS)
    assert_close(fn(a, b), _exact(a, b).astype(BF16), op="matmul", dtype="bf16", reduction_size=300, accumulator="f32")
    assert "linalg.generic" not in _packed(fn, a, b)


@pytest.mark.parametrize("m, k, n", [(128, 768, 300), (1, 70, 50)])
def test_constant_weights_are_widened_when_packed_at_compile_time(m: int, k: int, n: int, pack_log: list[str]
                                                                  ) -> None:
    """A frozen bf16 ``nn.Linear`` (B = w.T, a constant): packed once at compile time, already widened."""
    import torch

    from pbsdk.frontends import torch as pbsdk_torch

    torch._dynamo.reset()  # static shapes: a Linear compiled before would make the batch dynamic
    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n).eval().to(torch.bfloat16)
    x = torch.randn(m, k).to(torch.bfloat16)
    pbsdk_torch.clear_reports()
    with torch.no_grad():
        got = torch.compile(lin, backend="pbsdk", options={"target": "cpu", "compile_options": {"matrix_units": False}})(x)
        want = lin(x)
    assert sum(len(r.fallback_ops) for r in pbsdk_torch.reports()) == 0
    assert any("widened to f32 as packed" in n and "packed at compile time" in n for n in pack_log), pack_log
    assert_close(got.float().numpy().astype(BF16), want.float().numpy().astype(BF16), op="matmul", dtype="bf16",
                 reduction_size=k, accumulator="f32")


def test_a_dynamic_row_count_is_widened_too(pack_log: list[str]) -> None:
    """A bf16 ``nn.Linear`` compiled once for any batch (``dynamic=True``, as decoding steps come): one
    dynamic-size kernel on widened operands serves every row count."""
    import torch

    from pbsdk.frontends import torch as pbsdk_torch

    torch._dynamo.reset()
    torch.manual_seed(0)
    lin = torch.nn.Linear(96, 70).eval().to(torch.bfloat16)
    compiled = torch.compile(lin, backend="pbsdk", dynamic=True,
                             options={"target": "cpu", "compile_options": {"matrix_units": False}})
    pbsdk_torch.clear_reports()
    with torch.no_grad():
        for m in (1, 5, 33):
            x = torch.randn(m, 96).to(torch.bfloat16)
            assert_close(compiled(x).float().numpy().astype(BF16), lin(x).float().numpy().astype(BF16),
                         op="matmul", dtype="bf16", reduction_size=96, accumulator="f32")
    assert sum(len(r.fallback_ops) for r in pbsdk_torch.reports()) == 0
    assert any("dynamic sizes, packed kernel" in n and "bf16" in n for n in pack_log), pack_log


# ------------------------------------------------------------------------------------------- i8

I8_SHAPES = [(64, 64, 64), (37, 45, 29), (1, 100, 3), (33, 17, 3000), (12, 700, 1030)]


def _i8(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(-128, 128, shape, dtype=np.int8)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, n, k", I8_SHAPES)
def test_i8_matmul_on_widened_operands_is_exact(m: int, n: int, k: int, threads: int) -> None:
    """i8 x i8 -> i32 without an i8 unit: f32 FMAs on widened operands, k blocks of at most `EXACT_I8_K`
    (their sums stay within 2^24, where f32 is exact), each added to C as i32. The extreme products
    (-128 x -128 over every k) check exactness past 2^24 in total."""
    from pbsdk.core.plan.contraction import EXACT_I8_K

    a, b = _i8((m, k), 0), _i8((k, n), 1)
    a[0, :], b[:, 0] = -128, -128
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", options={"threads": threads, **NO_UNITS})
    got = fn(a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b.astype(np.int32))
    assert got[0, 0] == k * 128 * 128
    packed = _packed(fn, a, b)
    assert "linalg.matmul" not in packed and re.search(r"arith.sitofp %\S+ : vector<\d+xi8> to vector<\d+xf32>", packed)
    assert re.search(r"arith.fptosi %\S+ : vector<\d+xf32> to vector<\d+xi32>", packed)
    from pbsdk.core.plan import Contraction, plan_contraction
    from pbsdk.core.spec import load_spec

    blk = plan_contraction(load_spec("host"), Contraction(m, n, k, dtype="i8"), NO_UNITS).blocking
    assert blk is not None and blk.kc <= EXACT_I8_K


def test_batched_i8_and_a_requantize_after_it() -> None:
    a, b = _i8((3, 40, 300), 0), _i8((3, 300, 50), 1)
    got = pbsdk.jit(lambda x, w: x @ w, target="cpu", options=NO_UNITS)(a, b)
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b.astype(np.int32))
    x, w = _i8((33, 200), 2), _i8((200, 70), 3)
    scale = 1.0 / 3200

    def requant(p, q):  # type: ignore[no-untyped-def]
        acc = ops.astype(p @ q, "f32")
        return ops.astype(ops.minimum(ops.maximum(ops.round(acc * scale) + 3.0, -128.0), 127.0), "i8")

    got8 = pbsdk.jit(requant, target="cpu", options=NO_UNITS)(x, w)
    exact = (x.astype(np.int32) @ w.astype(np.int32)).astype(np.float32)
    want = np.clip(np.round(exact * np.float32(scale)) + 3, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(got8, want)


def test_constant_i8_weights_are_widened_at_compile_time(pack_log: list[str]) -> None:
    w = _i8((300, 90), 4)
    x = _i8((20, 300), 5)
    got = pbsdk.jit(lambda p: p @ ops._const(w, "i8"), target="cpu", options=NO_UNITS)(x)
    np.testing.assert_array_equal(got, x.astype(np.int32) @ w.astype(np.int32))
    assert any("widened to f32 as packed" in n and "packed at compile time" in n for n in pack_log), pack_log
