"""Small torch modules covering the op set real models use (issue #15): each runs through
``torch.compile(backend="pbsdk")`` with no ATen op falling back and matches eager torch."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F
from torch import nn

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.testing import Tolerance, assert_close

g = torch.Generator().manual_seed(0)


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=g)


class Fn(nn.Module):
    def __init__(self, fn: Any) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def rope(q: torch.Tensor, emb: torch.Tensor) -> torch.Tensor:
    half = q.shape[-1] // 2
    return q * emb.cos() + torch.cat((-q[..., half:], q[..., :half]), -1) * emb.sin()


def index_put_slice_scatter(x: torch.Tensor, i: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """In-place writes as models make them (functionalised into index_put / slice_scatter / select_scatter)."""
    a = x.clone()
    a[i] = x[0] * 3
    a[:, i] += 1.0
    a[x > 0.5] = -1.0
    b = x.clone()
    b[:, ::2] = 0.5
    b[1] = x[2]
    b[:, :, 3:5] = x[:, :, :2] * 2  # a KV-cache write
    return a, b


class Each(nn.Module):
    """Every module applied to the same input; their results as a list."""

    def __init__(self, *modules: nn.Module) -> None:
        super().__init__()
        self.each = nn.ModuleList(modules)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [m(x) for m in self.each]


#: name -> (module, inputs). Modules run in eval mode unless their name says "train"; parameters are frozen
#: into the kernels.
MODULES: dict[str, tuple[nn.Module, tuple[Any, ...]]] = {
    "conv1d": (nn.Conv1d(3, 4, 3, padding=1, dilation=2), (r(2, 3, 10),)),
    "conv3d": (nn.Conv3d(4, 6, 3, stride=(1, 2, 1), padding=1, groups=2), (r(1, 4, 5, 6, 6),)),
    "conv_transpose1d": (nn.ConvTranspose1d(4, 2, 3, stride=2), (r(1, 4, 5),)),
    "conv_transpose2d": (nn.ConvTranspose2d(4, 3, 3, stride=2, padding=1, output_padding=1), (r(1, 4, 5, 5),)),
    "conv_transpose3d": (nn.ConvTranspose3d(4, 2, 3, stride=2, padding=1, groups=2), (r(1, 4, 3, 4, 4),)),
    "log1p_expm1_sin_cos": (Fn(lambda x: torch.log1p(x.abs()) + torch.expm1(x) + torch.sin(x) * torch.cos(x)
                               + torch.tan(x * 0.3)), (r(3, 8),)),
    "rounding_sign_isnan_isinf": (Fn(lambda x, i: (torch.floor(x * 3) + torch.ceil(x) + torch.round(x * 2)
                                                   + torch.trunc(x * 3) + torch.sign(x), torch.isnan(x.log()),
                                                   torch.isinf(1 / x.round()), torch.sign(i))),
                                  (r(3, 8), torch.tensor([-3, 0, 5]))),
    # every activation module of torch.nn (RReLU in eval mode: the mean slope)
    "activations": (Each(
        nn.ELU(0.5), nn.Hardshrink(0.3), nn.Hardsigmoid(), nn.Hardtanh(-0.5, 0.7), nn.Hardswish(), nn.LeakyReLU(0.2),
        nn.LogSigmoid(), nn.PReLU(), nn.ReLU(), nn.ReLU6(), nn.RReLU().eval(), nn.SELU(), nn.CELU(0.7), nn.GELU(),
        nn.GELU("tanh"), nn.Sigmoid(), nn.SiLU(), nn.Mish(), nn.Softplus(2.0, 5.0), nn.Softshrink(0.2),
        nn.Softsign(), nn.Tanh(), nn.Tanhshrink(), nn.Threshold(0.1, 2.0), nn.Softmin(1), nn.Softmax(1),
        nn.LogSoftmax(1)), (r(4, 8) * 4,)),
    "glu_softmax2d": (Fn(lambda x: nn.GLU(1)(x) + nn.Softmax2d()(x)[:, :2]), (r(2, 4, 3, 3),)),
    "group_norm": (nn.GroupNorm(2, 6), (r(2, 6, 3, 5),)),
    "instance_norm": (Each(nn.Sequential(Fn(lambda x: x[..., 0]), nn.InstanceNorm1d(3)),
                           nn.InstanceNorm2d(3, affine=True)), (r(2, 3, 4, 5),)),
    "batch_norm_train": (nn.BatchNorm2d(3), (r(2, 3, 4, 4),)),  # batch statistics, running ones updated
    "repeat": (Fn(lambda x: x.repeat(2, 1, 3) * 2), (r(3, 4),)),
    "max_pool": (Each(nn.Sequential(nn.Flatten(2), nn.MaxPool1d(3, 2)), nn.MaxPool2d(3, 2, 1), nn.MaxPool2d(2, return_indices=True),
                      nn.AdaptiveMaxPool2d((2, 3), return_indices=True), nn.AdaptiveMaxPool2d((3, 1))), (r(2, 4, 6, 9),)),
    "max_pool3d": (nn.MaxPool3d(2, return_indices=True), (r(1, 2, 4, 4, 6),)),
    "avg_pool": (Each(nn.Sequential(nn.Flatten(2), nn.AvgPool1d(3, 2, 1)), nn.AvgPool2d(3, 2, 1, ceil_mode=True, count_include_pad=False),
                      nn.AvgPool3d((2, 3, 2), 1, 1), nn.AdaptiveAvgPool2d((4, 3)), nn.AdaptiveAvgPool3d(2),
                      nn.LPPool2d(2, 3, 2)), (r(2, 3, 9, 8).abs(),)),
    "min_max_argmin_argmax": (Fn(lambda x, i: (torch.min(x, 1), torch.max(x, 0, keepdim=True), torch.argmax(x, -1),
                                               torch.argmin(x), x.max(), x.min(), torch.max(i, 1), torch.argmax(i, 0))),
                              (torch.tensor([[1.0, float("nan"), 3.0, 3.0], [2.0, 5.0, 5.0, -1.0]]),
                               torch.tensor([[4, 2, 4], [-1, 7, 7]]))),
    "cumsum_cumprod_prod": (Fn(lambda x, i: (torch.cumsum(x, 1), torch.cumprod(x, 0), torch.prod(x, 1), x.prod(),
                                             torch.cumsum(i, 0))),
                            (r(5, 33) * 0.2 + 1, torch.tensor([[1, 2], [3, -4], [5, 6]]))),
    "norms": (Fn(lambda x: (torch.linalg.vector_norm(x, dim=1), x.norm(p=1, dim=-1, keepdim=True), x.norm(),
                            torch.linalg.vector_norm(x, float("inf"), (0, 1)), F.normalize(x, dim=1))), (r(3, 4, 5),)),
    "gather_scatter_index": (Fn(lambda x, i, j: (
        torch.gather(x, 1, i), x.scatter(1, i, 2.5), x.scatter_add(1, i, x[:, :2] * 3),
        torch.zeros(6, 6).scatter_add(0, i[:3], x[:3, :2]), x[i[:, 0]], x[:, j], x[i[:, 0], i[:, 1]],
        torch.index_select(x, 1, j.abs()))), (r(4, 6), torch.tensor([[0, 3], [1, 1], [2, 0], [3, 3]]), torch.tensor([5, -1, 0]))),
    "cat_stack_flip_pad_roll_clamp": (Fn(lambda x, y: (
        torch.cat([x, y], -1), torch.stack([x, x * 2], 1), torch.flip(x, (0, 2)), F.pad(x, (1, 2, 0, 1), value=0.5),
        torch.roll(x, (1, -2), (1, 2)), torch.roll(x, 3), torch.clamp(x, y[..., :1], y[..., 1:2] + 1),
        torch.clamp_min(x, y[..., :1]))), (r(2, 3, 4), r(2, 3, 2))),
    "integer_and_boolean_ops": (Fn(lambda i, j, x: (
        i // j, i % j, torch.fmod(i, j), torch.div(i, j, rounding_mode="trunc"), i & j, i | j, i ^ j, ~i, i.sum(1),
        (i > 0) & (j > 0), (i > 0) | (j > 0), (i > 0) ^ (j > 0), ~(i > 0), torch.logical_xor(i, j), x // 0.3,
        x % -1.5, torch.fmod(x, 0.7))),
        (torch.tensor([[7, -7, 9, 0], [-3, 12, 5, -1]]), torch.tensor([[2, 2, -4, 3], [5, -5, 3, 7]]), r(2, 4) * 3)),
    # GPT-2 with an empty KV cache: torch.cat of a (B, H, 0, D) past and the new keys
    "cat_empty_kv_cache": (Fn(lambda k, past: torch.softmax(torch.cat([past, k], dim=-2) @ k.transpose(-1, -2), -1)),
                           (r(1, 2, 5, 4), torch.zeros(1, 2, 0, 4))),
    # Llama's rotary embedding: cos/sin of position x inverse frequency, rotate_half by cat
    "rope": (Fn(lambda q, inv: rope(q, torch.cat([torch.arange(6).float()[:, None] * inv[None]] * 2, -1))),
             (r(1, 2, 6, 4), torch.rand(2))),
    "index_put_slice_scatter": (Fn(index_put_slice_scatter), (r(4, 5, 6), torch.tensor([2, 0, -1]))),
}


def leaves(x: Any) -> list[torch.Tensor]:
    return [t for v in x for t in leaves(v)] if isinstance(x, (tuple, list)) else [x]


@pytest.mark.parametrize("name", sorted(MODULES))
def test_module_runs_without_fallback(name: str) -> None:
    module, args = MODULES[name]
    module.train("train" in name)
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    with torch.no_grad():
        expected = module(*args)
        actual = torch.compile(module, backend="pbsdk")(*args)
    exp, act = leaves(expected), leaves(actual)
    assert len(act) == len(exp)
    for a, e in zip(act, exp):
        assert a.dtype == e.dtype and a.shape == e.shape, (a.dtype, e.dtype, a.shape, e.shape)
        if e.dtype.is_floating_point:
            assert_close(a.numpy(), e.numpy(), op=name, tol=Tolerance(1e-5, 1e-5))
        else:
            assert torch.equal(a, e), (a, e)
    reports = pbsdk_torch.reports()
    assert reports and all(rep.fallback_ops == () and rep.failed_partitions == 0 for rep in reports), reports
    assert sum(rep.compiled_ops for rep in reports) > 0


def test_an_unsupported_variant_falls_back_with_the_op_named(caplog: pytest.LogCaptureFixture) -> None:
    """A pooling window beyond the tap limit is not converted: the op runs in torch, named in the log."""
    x = r(1, 2, 30, 30)
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    pool = nn.MaxPool2d(25, 1)
    with torch.no_grad(), caplog.at_level("INFO", logger="pbsdk.torch"):
        out = torch.compile(lambda t: pool(t * 2) + 1, backend="pbsdk")(x)
    assert torch.equal(out, pool(x * 2) + 1)
    assert [rep.fallback_ops for rep in pbsdk_torch.reports()] == [("aten.max_pool2d_with_indices.default",)]
    assert any("aten.max_pool2d_with_indices.default falls back to torch" in m and "625 taps" in m
               for m in caplog.messages), caplog.messages


def test_training_batch_norm_updates_running_statistics() -> None:
    """Batch statistics over several non-trailing axes (N and L of an (N, C, L) input), the running ones
    updated in place (the functional overload plus torch's copy back)."""
    x, w, b = r(5, 5, 5) * 5, r(5), r(5)
    stats = [r(5), r(5).abs()]
    mine = [t.clone() for t in stats]

    def fn(x: torch.Tensor, rm: torch.Tensor, rv: torch.Tensor) -> torch.Tensor:
        return F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.5, eps=0.6)

    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    with torch.no_grad():
        expected = fn(x, *stats)
        actual = torch.compile(fn, backend="pbsdk")(x, *mine)
    assert_close(actual.numpy(), expected.numpy(), op="batch_norm", tol=Tolerance(1e-5, 1e-5))
    for a, e in zip(mine, stats):
        assert_close(a.numpy(), e.numpy(), op="batch_norm", tol=Tolerance(1e-5, 1e-5))
    assert all(rep.fallback_ops == () and rep.failed_partitions == 0 for rep in pbsdk_torch.reports())
