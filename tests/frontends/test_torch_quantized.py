"""PT2E-quantized models through ``torch.compile(backend="pbsdk")``: the ``quantized_decomposed``
quantize/dequantize pattern around linear and conv (what ``convert_pt2e`` produces; the quantizer itself now
lives in torchao, not installed here, so the modules below write the same pattern out: static per-tensor
activations, symmetric per-channel int8 weights stored quantized) compiles with no fallback, the
contractions run as i8 x i8 -> i32 on the template target's matrix unit, and the result matches torch's own
quantized reference (eager execution of the same graph)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.ao.quantization.fx._decomposed")  # registers the quantized_decomposed ops
F = torch.nn.functional

import pbsdk  # noqa: F401
from pbsdk.frontends.torch import clear_reports, reports
from pbsdk.frontends.torch.dynamo_backend import CompiledPartition

qd = torch.ops.quantized_decomposed
I8 = (-128, 127, torch.int8)


def _q(x: Any, s: float, z: int) -> Any:
    return qd.dequantize_per_tensor.default(qd.quantize_per_tensor.default(x, s, z, *I8), s, z, *I8)


class _QWeights(torch.nn.Module):
    def quantized(self, name: str, w: Any) -> None:
        """Symmetric per-output-channel int8 weights, stored quantized (frozen buffers)."""
        scale = w.abs().amax(dim=tuple(range(1, w.ndim))).clamp_min(1e-8) / 127
        q = torch.clamp(torch.round(w / scale.view(-1, *[1] * (w.ndim - 1))), -127, 127).to(torch.int8)
        self.register_buffer(f"{name}_q", q)
        self.register_buffer(f"{name}_s", scale)
        self.register_buffer(f"{name}_z", torch.zeros(len(scale), dtype=torch.int64))

    def weight(self, name: str) -> Any:
        return qd.dequantize_per_channel.default(getattr(self, f"{name}_q"), getattr(self, f"{name}_s"),
                                                 getattr(self, f"{name}_z"), 0, -127, 127, torch.int8)


class QuantizedMLP(_QWeights):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.quantized("w1", torch.randn(96, 64, generator=g) * 0.1)
        self.quantized("w2", torch.randn(32, 96, generator=g) * 0.1)
        self.b1, self.b2 = torch.randn(96, generator=g) * 0.1, torch.randn(32, generator=g) * 0.1

    def forward(self, x: Any) -> Any:
        h = F.relu(F.linear(_q(x, 0.03, 2), self.weight("w1"), self.b1))
        return _q(F.linear(_q(h, 0.02, -128), self.weight("w2"), self.b2), 0.04, 5)


class QuantizedCNN(_QWeights):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(1)
        self.quantized("c1", torch.randn(16, 3, 3, 3, generator=g) * 0.2)
        self.quantized("c2", torch.randn(32, 16, 3, 3, generator=g) * 0.1)
        self.quantized("fc", torch.randn(10, 32, generator=g) * 0.1)
        self.b1, self.b2, self.b3 = (torch.randn(n, generator=g) * 0.1 for n in (16, 32, 10))

    def forward(self, x: Any) -> Any:
        h = F.relu(F.conv2d(_q(x, 0.03, 0), self.weight("c1"), self.b1, padding=1))
        h = F.relu(F.conv2d(_q(h, 0.02, -128), self.weight("c2"), self.b2, stride=2, padding=1))
        h = h.mean(dim=(2, 3))
        return _q(F.linear(_q(h, 0.01, -128), self.weight("fc"), self.b3), 0.05, 0)


@pytest.mark.parametrize("model, shape", [(QuantizedMLP, (16, 64)), (QuantizedCNN, (2, 3, 12, 12))],
                         ids=["mlp", "cnn"])
def test_pt2e_pattern_runs_on_the_i8_matrix_unit(model: Any, shape: tuple[int, ...],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    kernels = []
    original = CompiledPartition._compile

    def spy(self: Any, frozen: Any) -> Any:
        kernel, inputs = original(self, frozen)
        kernels.append(kernel)
        return kernel, inputs

    monkeypatch.setattr(CompiledPartition, "_compile", spy)
    torch._dynamo.reset()
    clear_reports()
    m = model().eval()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        got = torch.compile(m, backend="pbsdk", options={"target": "template", "spec": "npu"})(x)
        want = m(x)
    (report,) = reports()
    assert report.fallback_ops == () and report.failed_partitions == 0, report
    # The integer contraction is exact; torch's reference sums the dequantized values in f32 and may land
    # on the other side of a rounding boundary: at most one quantization step, on a few elements.
    step = 0.04 if model is QuantizedMLP else 0.05
    lsb = ((got - want).abs() / step).round()
    assert lsb.max().item() <= 1 and (lsb > 0).float().mean().item() < 0.02, lsb.max()
    units = {}
    for k in kernels:
        for key, n in (k.executable.last_counters or {}).items():
            if key.startswith("matrix_unit:"):
                units[key] = units.get(key, 0) + n
    assert units.get("matrix_unit:mxu", 0) > 0, units
    assert any("i8" in str(t) for k in kernels for _, t in k.artifact.inputs) or kernels


def test_the_same_graph_on_cpu_matches_bit_for_bit_where_the_sums_agree() -> None:
    torch._dynamo.reset()
    m = QuantizedMLP().eval()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = torch.compile(m, backend="pbsdk")(x)
        want = m(x)
    assert np.abs((got - want).numpy() / 0.04).round().max() <= 1
