"""One small function per converter family, compiled with ``backend="pbsdk"``: the result must match
eager torch AND the whole graph must run in pbsdk (no fallback) — so a converter that silently stopped
converting fails here, not only in a benchmark."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.testing import Tolerance, assert_close

g = torch.Generator().manual_seed(0)


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {
    "linear_transposed_weight_input": (lambda x, w, b: F.linear(x, w, b), (r(3, 8), r(5, 8), r(5))),
    "matmul_batched_broadcast": (lambda a, b: a @ b, (r(2, 3, 4, 6), r(6, 5))),
    "bmm_addmm": (lambda a, b, c: torch.bmm(a, b).sum(0) + torch.addmm(c, a[0], b[0], beta=0.5, alpha=2.0),
                  (r(2, 4, 6), r(2, 6, 3), r(4, 3))),
    "conv2d_grouped_strided": (lambda x, w, b: F.conv2d(x, w, b, stride=2, padding=1, groups=2),
                               (r(1, 4, 9, 9), r(6, 2, 3, 3), r(6))),
    "activations": (lambda x: F.relu(x) + F.gelu(x) + F.silu(x) + torch.tanh(x) + torch.sigmoid(x)
                    + F.gelu(x, approximate="tanh"), (r(4, 7),)),
    "arithmetic": (lambda a, b: (a + 2 * b - a / (b.abs() + 1)) * a - 1.5 + torch.clamp(a, -0.5, 0.5)
                   + torch.rsqrt(b.abs() + 1) + a.pow(2) + torch.maximum(a, b), (r(3, 4), r(1, 4))),
    "softmax_log_softmax": (lambda x: F.softmax(x, dim=-1) + F.log_softmax(x, dim=1), (r(2, 5, 6),)),
    "layer_norm_rms_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b) + F.rms_norm(x, (8,), w, eps=1e-6),
                            (r(2, 3, 8), r(8), r(8))),
    "batch_norm_inference": (lambda x, m, v, w, b: F.batch_norm(x, m, v, w, b, training=False),
                             (r(2, 3, 4, 4), r(3), r(3).abs() + 0.5, r(3), r(3))),
    "reductions": (lambda x: x.sum(1) + x.mean((0, 1)) + x.amax(-2) + x.var(1, keepdim=False), (r(3, 4, 5),)),
    "layout": (lambda x: x.permute(2, 0, 1).reshape(5, 12).t().unsqueeze(0).expand(2, 12, 5).transpose(1, 2)
               .contiguous().view(10, 12) * 2, (r(3, 4, 5),)),
    "cat_slice_select_split": (lambda x, y: torch.cat([x[:, 1:3], y[..., ::2].sum(-1)], 1)[:, 0]
                               + sum(torch.split(x, 2, dim=1))[:, 1], (r(4, 6), r(4, 3, 4))),
    "sdpa_causal_and_masked": (lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True)
                               + F.scaled_dot_product_attention(q, k, v, attn_mask=m),
                               (r(1, 2, 6, 4), r(1, 2, 6, 4), r(1, 2, 6, 4), torch.rand(6, 6, generator=g) > 0.3)),
    "masked_fill_where_compare": (lambda x, y: torch.where(x > y, x, y).masked_fill(x < -0.5, float("-inf"))
                                  + (x == y).float() + (x != 0).logical_and(y >= 0).float(), (r(3, 5), r(3, 5))),
    "embedding_index_select": (lambda w, i: F.embedding(i, w).sum(1) + torch.index_select(w, 0, i[0]).sum(0),
                               (r(10, 4), torch.tensor([[1, 9, 0], [3, 3, 7]]))),
    "pad_and_adaptive_pool": (lambda x: F.adaptive_avg_pool2d(F.pad(x, (1, 2, 0, 1), value=0.5), 1),
                              (r(1, 2, 5, 4),)),
    "bool_and_int_outputs": (lambda x, i: (x > 0, i * 2 + 1, x.float() * 0.5), (r(3, 4), torch.arange(6).view(2, 3))),
    "float64_and_float16": (lambda a, b: ((a @ a.t()).float() + 1.0, torch.tanh(b) * 2), (r(3, 3).double(), r(4, 4).half())),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_converts_without_fallback(name: str) -> None:
    fn, args = CASES[name]
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    with torch.no_grad():
        expected = fn(*args)
        actual = torch.compile(fn, backend="pbsdk")(*args)
    exp = expected if isinstance(expected, tuple) else (expected,)
    act = actual if isinstance(actual, tuple) else (actual,)
    for a, e in zip(act, exp):
        assert a.dtype == e.dtype and a.shape == e.shape
        if e.dtype.is_floating_point:
            tol = Tolerance(2e-3, 2e-3) if e.dtype == torch.float16 else Tolerance(1e-5, 1e-5)
            assert_close(a.numpy(), e.numpy(), op="mlp", tol=tol)
        else:
            assert torch.equal(a, e)
    reports = pbsdk_torch.reports()
    assert reports and all(rep.fallback_ops == () and rep.failed_partitions == 0 for rep in reports), reports
    assert sum(rep.compiled_ops for rep in reports) > 0
