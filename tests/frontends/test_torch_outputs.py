"""Output buffers of the torch backend are recycled once the caller has dropped them (`OutputPool`): a loop
that drops each result reuses its memory (no fresh mapping and page faults per call), while a result the
caller keeps — or a view of it — is never written by a later call. Both the pointer path and the general
path (a non-contiguous input)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn

import pbsdk.frontends.torch  # noqa: F401  (registers the backend)


@pytest.fixture(scope="module")
def compiled():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 1024), nn.ReLU()).eval()   # 512 x 1024 f32 out: 2 MiB, pooled
    torch._dynamo.reset()
    return model, torch.compile(model, backend="pbsdk", options={"compile_options": {"threads": 1}})


@pytest.mark.parametrize("contiguous", [True, False])
def test_results_kept_are_never_overwritten(compiled, contiguous: bool) -> None:
    model, f = compiled

    def x(seed: int) -> torch.Tensor:
        t = torch.randn(64, 512, generator=torch.Generator().manual_seed(seed))
        return t.T.contiguous() if contiguous else t.T      # the transposed view takes the general path

    with torch.no_grad():
        kept = f(x(1))
        expect = model(x(1))
        view = f(x(2))[100:200]                              # only a view of the second result survives
        expect_view = model(x(2))[100:200]
        for seed in range(3, 8):                             # results dropped at once: buffers come back
            y = f(x(seed))
            torch.testing.assert_close(y, model(x(seed)), rtol=1e-5, atol=1e-5)
            del y
        torch.testing.assert_close(kept, expect, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(view, expect_view, rtol=1e-5, atol=1e-5)


def test_a_dropped_result_is_reused(compiled) -> None:
    _, f = compiled
    x = torch.randn(512, 64)
    with torch.no_grad():
        ptrs = set()
        for _ in range(4):
            ptrs.add(f(x).data_ptr())    # each result dropped before the next call
    assert len(ptrs) == 1
