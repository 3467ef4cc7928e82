"""The torch backend's inference path without AOTAutograd's runtime wrappers (``direct``), and the
per-call pointer path of `CompiledPartition`: same results as eager, and the cases they must leave
to the general path (input mutation, non-contiguous or mistyped inputs) stay correct."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch import nn

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.frontends.torch import dynamo_backend as db
from pbsdk.frontends.torch.examples import MLP


def _backend_result(fn, *args, **options):
    """What the backend hands Dynamo for ``fn`` (called directly, as Dynamo would)."""
    captured = {}

    def spy(gm, example_inputs):
        captured["compiled"] = db.backend(gm, example_inputs, options=options)
        return captured["compiled"]

    torch._dynamo.reset()
    out = torch.compile(fn, backend=spy)(*args)
    return out, captured["compiled"]


def test_inference_graph_gets_a_plain_function_and_matches_eager():
    m = MLP(32, 64, 16).eval()
    x = torch.randn(3, 32)
    with torch.no_grad():
        out, compiled = _backend_result(m, x)
        expected = m(x)
    assert not isinstance(compiled, torch.nn.Module)  # not the FX module, not AOTAutograd's wrapper
    assert compiled.__qualname__.endswith("_single_partition_call.<locals>.run")
    torch.testing.assert_close(out, expected, atol=2e-5, rtol=2e-5)


def test_direct_false_goes_through_aotautograd():
    m = MLP(32, 64, 16).eval()
    x = torch.randn(3, 32)
    with torch.no_grad():
        out, compiled = _backend_result(m, x, direct=False)
        torch.testing.assert_close(out, m(x), atol=2e-5, rtol=2e-5)
    assert "run" not in getattr(compiled, "__qualname__", "")


def test_input_mutation_is_left_to_aotautograd_and_replayed():
    def fn(x, y):
        x.add_(1.0)
        return x * y

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    x_ref = x.clone()
    with torch.no_grad():
        out, _ = _backend_result(fn, x, y)
    torch.testing.assert_close(x, x_ref + 1.0)  # the caller's tensor was mutated, as in eager
    torch.testing.assert_close(out, (x_ref + 1.0) * y)


def test_pointer_path_falls_back_for_non_contiguous_and_other_dtypes():
    lin = nn.Linear(16, 8).eval()
    with torch.no_grad():
        f = torch.compile(lambda x: torch.relu(lin(x)) * 2.0, backend="pbsdk", options={"direct": True})
        x = torch.randn(16, 5).t()  # (5, 16), not contiguous
        torch.testing.assert_close(f(x), torch.relu(lin(x)) * 2.0, atol=1e-5, rtol=1e-5)
        xc = x.contiguous()
        torch.testing.assert_close(f(xc), torch.relu(lin(xc)) * 2.0, atol=1e-5, rtol=1e-5)


def test_changed_parameters_are_still_seen_on_the_direct_path():
    lin = nn.Linear(8, 4).eval()
    x = torch.randn(2, 8)
    with torch.no_grad():
        f = torch.compile(lin, backend="pbsdk")
        f(x)
        lin.weight.mul_(2.0)
        torch.testing.assert_close(f(x), lin(x), atol=1e-5, rtol=1e-5)
    assert pbsdk_torch.reports()
