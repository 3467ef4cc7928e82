"""torch's ``scaled_dot_product_attention``, decomposed by AOTAutograd (Q and Kᵀ each scaled by √scale,
a causal mask built as an additive constant, the safe softmax that zeroes fully masked rows), is found
by the core's recogniser and runs as one fused kernel; eager torch is the reference."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.testing import Tolerance, assert_close

TOL = Tolerance(atol=2e-5, rtol=2e-5)


def _compiled(fn, *args, target="cpu"):
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    out = torch.compile(fn, backend="pbsdk", options={"target": target})(*args)
    (report,) = pbsdk_torch.reports()
    return out, report


CASES = {  # name: (q shape, kv shape, kwargs)
    "causal": ((1, 4, 64, 32), (1, 4, 64, 32), {"is_causal": True}),
    "plain": ((2, 2, 33, 64), (2, 2, 40, 64), {}),
    "scale": ((1, 2, 17, 64), (1, 2, 17, 64), {"scale": 0.3, "is_causal": True}),
    "gqa": ((1, 8, 20, 32), (1, 2, 20, 32), {"enable_gqa": True}),
    "one-query": ((1, 2, 1, 64), (1, 2, 50, 64), {}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_sdpa_is_fused_and_matches_eager(name):
    qs, kvs, kwargs = CASES[name]
    g = torch.Generator().manual_seed(len(name))
    q, k, v = torch.randn(qs, generator=g), torch.randn(kvs, generator=g), torch.randn(kvs, generator=g)

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, **kwargs)

    out, report = _compiled(fn, q, k, v)
    assert report.fused_attention == 1 and not report.fallback_ops
    assert_close(out.numpy(), fn(q, k, v).numpy(), op="attention", tol=TOL)


@pytest.mark.parametrize("target,fused", [("cpu", 1), ("template", 0)])
def test_sdpa_with_a_general_mask_keeps_torchs_fully_masked_rows(target, fused):
    """A boolean mask may mask a whole row (torch's safe softmax gives 0 there): the cpu kernel reads the mask
    and zeroes such rows; the scratchpad kernel does not, so there it is not fused. Both stay right."""
    g = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(1, 2, 9, 16, generator=g) for _ in range(3))
    mask = torch.rand(1, 1, 9, 9, generator=g) > 0.5
    mask[..., 3, :] = False  # row 3 sees no key

    def fn(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    out, report = _compiled(fn, q, k, v, mask, target=target)
    expected = fn(q, k, v, mask)
    assert report.fused_attention == fused
    assert_close(out.numpy(), expected.numpy(), op="attention", tol=TOL)
    assert (out[..., 3, :] == 0).all()


def test_sdpa_on_the_template_target_uses_the_scratchpad_kernel():
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 40, 64, generator=g, dtype=torch.float16) for _ in range(3))

    def fn(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    out, report = _compiled(fn, q, k, v, target="template")
    assert report.fused_attention == 1
    expected = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True)
    assert_close(out.float().numpy(), expected.numpy(), op="attention", tol=Tolerance(atol=2e-3, rtol=2e-3))
