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
