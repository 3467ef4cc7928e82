"""``torch.compile(backend="pbsdk")`` on whole models, compared with eager torch at stated tolerances;
plus the backend's contract: entry-point registration, options, freezing, fallback logging, dynamic
shapes, training, zero-copy boundaries."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F
from torch import nn

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.frontends.torch.dynamo_backend import _to_numpy, _to_torch
from pbsdk.frontends.torch.examples import MLP, BasicBlock, GPT2Block, SmallCNN, randomise_batchnorm
from pbsdk.testing import Tolerance, assert_close

#: Per model (f32): the error allowed against eager torch. Contractions of length <= 512 and
#: transcendental approximations (erf, tanh, exp) each contribute a few ulp; these bounds leave ~10x room.
TOLERANCES = {
    "mlp": Tolerance(atol=2e-5, rtol=2e-5),
    "gpt2_block": Tolerance(atol=5e-5, rtol=5e-5),
    "resnet_block": Tolerance(atol=5e-5, rtol=5e-5),
    "small_cnn": Tolerance(atol=2e-5, rtol=2e-5),
}


#: The benchmark's models at test sizes (compile time grows with the frozen weights' bytes).
MODELS = {
    "mlp": (lambda: MLP(64, 128, 32), (2, 64)),
    "gpt2_block": (lambda: GPT2Block(64, 4), (2, 16, 64)),
    "resnet_block": (lambda: randomise_batchnorm(BasicBlock(8)), (2, 8, 8, 8)),
    "small_cnn": (lambda: randomise_batchnorm(SmallCNN()), (2, 3, 16, 16)),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()


def _compiled(model: nn.Module, **options: object) -> object:
    return torch.compile(model, backend="pbsdk", options=options or None)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_model_matches_eager_with_no_fallback(name: str) -> None:
    make, shape = MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    x = torch.randn(*shape)
    with torch.no_grad():
        actual = _compiled(model)(x)
        expected = model(x)
    assert_close(actual.numpy(), expected.numpy(), op="mlp", tol=TOLERANCES[name])
    (report,) = pbsdk_torch.reports()
    assert report.fallback_ops == () and report.failed_partitions == 0
    assert report.compiled_ops == report.graph_ops and report.frozen


def test_parameters_as_inputs_and_mutation_after_freezing() -> None:
    torch.manual_seed(1)
    model = MLP(32, 64, 16).eval()
    x = torch.randn(3, 32)
    with torch.no_grad():
        unfrozen = _compiled(model, freeze=False)
        assert_close(unfrozen(x).numpy(), model(x).numpy(), op="mlp", tol=TOLERANCES["mlp"])
        assert not pbsdk_torch.reports()[-1].frozen
        torch._dynamo.reset()
        frozen = _compiled(model)
        assert_close(frozen(x).numpy(), model(x).numpy(), op="mlp", tol=TOLERANCES["mlp"])
        assert pbsdk_torch.reports()[-1].frozen
        model.fc2.weight.mul_(-2.0)  # an in-place update of a frozen weight must be seen
        assert_close(frozen(x).numpy(), model(x).numpy(), op="mlp", tol=TOLERANCES["mlp"])


class _WithSort(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.special.i0(F.relu(self.conv(x)))    # i0 has no converter
        return torch.logcumsumexp(y, dim=-1).tanh()  # nor has logcumsumexp


def test_unsupported_ops_fall_back_with_one_log_line_each(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(2)
    model = _WithSort().eval()
    x = torch.randn(2, 3, 8, 8)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="pbsdk"):
        actual = _compiled(model)(x)
        expected = model(x)
    assert_close(actual.numpy(), expected.numpy(), op="conv2d", tol=Tolerance(1e-5, 1e-5))
    lines = [r.getMessage() for r in caplog.records if "falls back" in r.getMessage()]
    assert len(lines) == 2, lines
    assert any("aten.i0.default" in line for line in lines)
    assert any("aten.logcumsumexp.default" in line for line in lines)
    (report,) = pbsdk_torch.reports()
    assert sorted(report.fallback_ops) == ["aten.i0.default", "aten.logcumsumexp.default"]
    assert report.partitions == 2  # conv+relu before i0, tanh after logcumsumexp


def test_dynamic_shapes_compile_once_with_symbolic_sizes(caplog: pytest.LogCaptureFixture) -> None:
    # Dynamo's second batch size traces the graph with a symbolic batch: one more compile, then every
    # size runs the same kernels (rows read at run time), none per shape.
    torch.manual_seed(3)
    model = MLP(16, 32, 8).eval()
    pbsdk_torch.clear_reports()
    fn = _compiled(model, max_shapes=2)
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="pbsdk"):
        for n in (2, 3, 5, 7, 64, 1000):
            x = torch.randn(n, 16)
            assert_close(fn(x).numpy(), model(x).numpy(), op="mlp", tol=TOLERANCES["mlp"])
    reports = pbsdk_torch.reports()
    assert len(reports) == 2, reports  # batch 2 (static), then symbolic
    dynamic = reports[1]
    assert dynamic.compiled_ops == dynamic.graph_ops and dynamic.per_shape_partitions == 0, dynamic
    assert any(k.executable is not None for k in dynamic.kernels)
    assert not any("max_shapes" in r.getMessage() or "per shape" in r.getMessage() for r in caplog.records)


def test_dynamic_shapes_compile_per_shape_up_to_the_limit(caplog: pytest.LogCaptureFixture) -> None:
    torch.manual_seed(3)
    model = MLP(16, 32, 8).eval()
    fn = _compiled(model, max_shapes=2, dynamic="per_shape")
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="pbsdk"):
        for n in (2, 3, 5, 7):
            x = torch.randn(n, 16)
            assert_close(fn(x).numpy(), model(x).numpy(), op="mlp", tol=TOLERANCES["mlp"])
    assert any("max_shapes" in r.getMessage() for r in caplog.records)


def test_training_forward_compiled_backward_in_torch() -> None:
    torch.manual_seed(4)
    model = MLP(16, 32, 8)
    x = torch.randn(4, 16)
    _compiled(model)(x).square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model(x).square().sum().backward()
    for g, p in zip(grads, model.parameters()):
        assert_close(g.numpy(), p.grad.numpy(), op="mlp", tol=Tolerance(1e-4, 1e-4))
    assert not pbsdk_torch.reports()[-1].frozen


def test_unknown_option_is_a_clear_error() -> None:
    with pytest.raises(Exception, match="unknown option.*colour"):
        _compiled(nn.Linear(2, 2), colour="blue")(torch.randn(1, 2))
    # a misspelt pipeline option is refused too, naming the known ones (it was silently ignored before)
    with pytest.raises(Exception, match="unknown option 'thread'; known options .*threads"):
        _compiled(nn.Linear(2, 2), compile_options={"thread": 1})(torch.randn(1, 2))


def test_boundaries_share_memory() -> None:
    t = torch.randn(4, 5)
    a = _to_numpy(t, "f32")
    assert np.shares_memory(a, t.numpy())
    out = np.ones((2, 3), np.float32)
    assert np.shares_memory(_to_torch(out, torch.float32).numpy(), out)
    assert _to_torch(np.array([0.0, 1.0], np.float32), torch.bool).tolist() == [False, True]


def test_registered_by_entry_point_without_importing_pbsdk(tmp_path: object) -> None:
    script = textwrap.dedent("""
        import sys, torch
        assert "pbsdk" not in sys.modules
        m = torch.nn.Linear(8, 4).eval()
        x = torch.randn(2, 8)
        with torch.no_grad():
            y = torch.compile(m, backend="pbsdk", options={"target": "cpu"})(x)
            assert torch.allclose(y, m(x), atol=1e-5, rtol=1e-5)
        assert "pbsdk.frontends.torch" in sys.modules
        print("ok")
    """)
    env = dict(os.environ, PBSDK_LOG="")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stderr[-2000:]
