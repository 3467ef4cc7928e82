"""torch's ``scaled_dot_product_attention`` on bf16 tensors: AOTAutograd's decomposition computes it in f32 on
Q, K and V widened to f32 and rounds the result back to bf16. The recogniser reads that as one bf16 attention:
the fused kernel takes the bf16 tensors themselves (no f32 copies: nothing in the entry function widens), runs
both matmuls on the host's bf16 unit and writes bf16. Eager torch (its bf16 flash-attention kernel, which also
rounds P to bf16) is the reference, at the table's bf16 attention tolerance."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.core.spec import load_spec
from pbsdk.targets.cpu.pack_contractions import lowers_unit
from pbsdk.testing import assert_close, tolerance

pytestmark = pytest.mark.skipif(not lowers_unit(load_spec("host"), "vdpbf16ps"),
                                reason="the host has no AVX512-BF16: a bf16 SDPA runs the f32 kernel on widened copies")
BF16 = torch.bfloat16


def _compiled(fn, *args, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``fn`` through ``torch.compile(backend="pbsdk")``: its output, compile report and emitted MLIR."""
    monkeypatch.setenv("PBSDK_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    out = torch.compile(fn, backend="pbsdk")(*args)
    (report,) = pbsdk_torch.reports()
    return out, report, (tmp_path / "00-input.mlir").read_text()


def _kernel_args(text: str) -> list[str]:
    """The element types of the fused attention declaration's arguments (Q, K, V[, M], O)."""
    decl = re.search(r"func\.func private @__pbsdk_attn0\(([^)]*)\)", text)
    assert decl is not None, "attention was not fused"
    return re.findall(r"x(b?f\d+)>", decl.group(1))


CASES = {  # name: (q shape, kv shape, kwargs)
    "plain": ((1, 12, 256, 64), (1, 12, 256, 64), {}),
    "causal": ((1, 4, 70, 64), (1, 4, 70, 64), {"is_causal": True}),
    "scale": ((2, 2, 33, 80), (2, 2, 40, 80), {"scale": 0.3}),
    "gqa": ((1, 8, 20, 64), (1, 2, 20, 64), {"enable_gqa": True}),
    "one-query": ((1, 2, 1, 64), (1, 2, 50, 64), {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bf16_sdpa_is_fused_on_bf16_operands_and_matches_eager(name, tmp_path, monkeypatch):
    qs, kvs, kwargs = CASES[name]
    g = torch.Generator().manual_seed(len(name))
    q, k, v = (torch.randn(s, generator=g, dtype=BF16) for s in (qs, kvs, kvs))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    out, report, text = _compiled(fn, q, k, v, tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert report.fused_attention == 1 and not report.fallback_ops
    assert _kernel_args(text) == ["bf16"] * 4
    entry = text[text.index("func.func @"):]
    assert "arith.extf" not in entry, "Q, K or V is copied to f32"
    assert "llvm.x86.avx512bf16.dpbf16ps" not in text  # the core leaves the unit to the target's hook
    assert out.dtype == BF16
    assert_close(out.float().numpy(), fn(q, k, v).float().numpy(), op="attention",
                 tol=tolerance("attention", "bfloat16"))


@pytest.mark.parametrize("mask_dtype", [BF16, torch.bool])
def test_bf16_sdpa_with_a_mask(mask_dtype, tmp_path, monkeypatch):
    """A bf16 mask is read as bf16, and so is a boolean one (torch's decomposition makes it a bf16 0 / -inf). Rows
    with every key masked give 0, as torch's safe softmax does."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 30, 64, generator=g, dtype=BF16) for _ in range(3))
    if mask_dtype == torch.bool:
        mask = torch.rand(1, 1, 30, 30, generator=g) > 0.4
        mask[..., 3, :] = False  # row 3 sees no key
    else:
        mask = torch.randn(1, 1, 30, 30, generator=g, dtype=BF16)

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    out, report, text = _compiled(fn, q, k, v, mask, tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert report.fused_attention == 1
    assert _kernel_args(text) == ["bf16"] * 5
    if mask_dtype == BF16:  # (a boolean mask is computed: where(m, 0, -inf))
        assert "arith.extf" not in text[text.index("func.func @"):]
    assert_close(out.float().numpy(), fn(q, k, v, mask).float().numpy(), op="attention",
                 tol=tolerance("attention", "bfloat16"))
    if mask_dtype == torch.bool:
        assert (out[..., 3, :] == 0).all()


def test_an_attention_on_upcast_tensors_keeps_its_f32_result(tmp_path, monkeypatch):
    """Widened by the caller with an f32 result: read as bf16 all the same, but P stays f32 (P·V as f32 FMAs), so
    the result is as exact as eager's f32 SDPA."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 4, 40, 64, generator=g, dtype=BF16) for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)

    out, report, text = _compiled(fn, q, k, v, tmp_path=tmp_path, monkeypatch=monkeypatch)
    assert report.fused_attention == 1 and _kernel_args(text) == ["bf16"] * 3 + ["f32"]
    assert 'p_dtype = "f32"' in text
    assert out.dtype == torch.float32
    assert_close(out.numpy(), fn(q, k, v).numpy(), op="attention", dtype="float32", reduction_size=40 + 64)


def test_without_matrix_units_the_f32_kernel_reads_widened_copies(tmp_path, monkeypatch):
    """Option matrix_units=False (as a spec without a bf16 unit): the kernel of before, on f32 copies."""
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 2, 33, 64, generator=g, dtype=BF16) for _ in range(3))
    monkeypatch.setenv("PBSDK_DUMP_DIR", str(tmp_path))
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    fn = torch.compile(lambda q, k, v: F.scaled_dot_product_attention(q, k, v), backend="pbsdk",
                       options={"compile_options": {"matrix_units": False}})
    out = fn(q, k, v)
    (report,) = pbsdk_torch.reports()
    text = (tmp_path / "00-input.mlir").read_text()
    assert report.fused_attention == 1 and _kernel_args(text) == ["f32"] * 4
    assert_close(out.float().numpy(), F.scaled_dot_product_attention(q, k, v).float().numpy(), op="attention",
                 tol=tolerance("attention", "bfloat16"))
