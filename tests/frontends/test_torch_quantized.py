"""PT2E-quantized models through ``torch.compile(backend="pbsdk")``: the ``quantized_decomposed``
quantize/dequantize pattern around linear and conv compiles with no fallback, the contractions run as
i8 x i8 -> i32 on the template target's matrix unit, and the result matches torch's own quantized reference
(eager execution of the same graph).

Two sources of such graphs: modules that write the pattern out by hand (static per-tensor i8 activations,
symmetric per-channel i8 weights stored quantized), and torchao's real ``prepare_pt2e -> calibrate ->
convert_pt2e`` flow with its quantizers (x86: u8 asymmetric activations, per-channel weights; XNNPACK-style:
i8 activations, [-127, 127] per-channel weights; ARM: per-tensor weights), skipped without torchao."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torch.ao.quantization.fx._decomposed")  # registers the quantized_decomposed ops
F = torch.nn.functional

import pbsdk  # noqa: F401
from pbsdk.core.spec import load_spec
from pbsdk.frontends.torch import clear_reports, reports
from pbsdk.frontends.torch.dynamo_backend import CompiledPartition
from pbsdk.targets.cpu.pack_contractions import lowers_unit

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
        compiled = original(self, frozen)  # (kernel, inputs, inputs taken in their storage order)
        kernels.append(compiled[0])
        return compiled

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
    planned = [c for k in kernels for c in (k.executable.resources or {}).get("contractions", [])]
    assert planned and all((c["dtype"], c["unit"]) == ("i8", "mxu") for c in planned), planned


def test_the_same_graph_on_cpu_matches_bit_for_bit_where_the_sums_agree() -> None:
    torch._dynamo.reset()
    m = QuantizedMLP().eval()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        got = torch.compile(m, backend="pbsdk")(x)
        want = m(x)
    assert np.abs((got - want).numpy() / 0.04).round().max() <= 1


# --------------------------------------------------------------------------- real PT2E (torchao's flow)

@pytest.fixture(scope="module")
def pt2e() -> Any:
    """torchao's PT2E entry points and quantizers. Imported with the ``torchao`` and ``torch.utils._pytree``
    loggers at ERROR: torchao 0.18's wheel carries two CUDA kernel libraries that cannot load beside the CPU
    torch, and registers an Enum that torch 2.13 calls deprecated; both are logged warnings at import, and
    PT2E (pure Python) needs neither."""
    import logging

    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        from torchao.quantization.pt2e import quantize_pt2e
        from torchao.quantization.pt2e.quantizer import arm_inductor_quantizer as arm
        from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86
        from torchao.testing.pt2e import _xnnpack_quantizer as xnnpack
    except ImportError as exc:
        pytest.skip(f"torchao's PT2E flow is not importable: {exc}")
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)
    return {"prepare": quantize_pt2e.prepare_pt2e, "convert": quantize_pt2e.convert_pt2e,
            "x86": lambda: x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config()),
            "xnnpack": lambda: xnnpack.XNNPACKQuantizer().set_global(
                xnnpack.get_symmetric_quantization_config(is_per_channel=True)),
            "arm": lambda: arm.ArmInductorQuantizer().set_global(arm.get_default_arm_inductor_quantization_config())}


class FloatMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(64, 96), torch.nn.Linear(96, 32)

    def forward(self, x: Any) -> Any:
        return self.l2(F.relu(self.l1(x)))


class FloatCNN(torch.nn.Module):
    """conv + relu + max pool, then a linear classifier (max pooling: no averaging ties, below)."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.fc = torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.Linear(16 * 6 * 6, 10)

    def forward(self, x: Any) -> Any:
        return self.fc(F.max_pool2d(F.relu(self.conv(x)), 2).flatten(1))


def _pt2e_quantized(pt2e: Any, quantizer: str, model: type, shape: tuple[int, ...]) -> Any:
    """``model`` through torchao's real flow: export, prepare_pt2e, calibrate on 8 batches, convert_pt2e."""
    torch.manual_seed(0)
    m = model().eval()
    x = torch.randn(*shape)
    prepared = pt2e["prepare"](torch.export.export(m, (x,)).module(), pt2e[quantizer]())
    with torch.no_grad():
        for _ in range(8):
            prepared(torch.randn(*shape))
    return pt2e["convert"](prepared)


def _quant_nodes(gm: Any) -> list[Any]:
    return [n for n in gm.graph.nodes if n.op == "call_function"
            and getattr(n.target, "namespace", "") == "quantized_decomposed"]


_SLOW = pytest.mark.slow


@pytest.mark.parametrize("quantizer, model, shape", [
    ("x86", FloatMLP, (32, 64)), ("x86", FloatCNN, (8, 3, 12, 12)),
    pytest.param("xnnpack", FloatMLP, (32, 64), marks=_SLOW), pytest.param("xnnpack", FloatCNN, (8, 3, 12, 12), marks=_SLOW),
    pytest.param("arm", FloatMLP, (32, 64), marks=_SLOW), pytest.param("arm", FloatCNN, (8, 3, 12, 12), marks=_SLOW),
], ids=["x86-mlp", "x86-cnn", "xnnpack-mlp", "xnnpack-cnn", "arm-mlp", "arm-cnn"])
def test_real_pt2e_models_run_on_the_i8_matrix_unit(pt2e: Any, quantizer: str, model: type,
                                                    shape: tuple[int, ...]) -> None:
    gm = _pt2e_quantized(pt2e, quantizer, model, shape)
    quant = _quant_nodes(gm)
    dtypes = {n.args[-1] for n in quant}
    if quantizer == "x86":  # what the test is about: u8 asymmetric activations, zero points off 0 and 128
        assert torch.uint8 in dtypes and any(n.args[-1] == torch.uint8 and n.args[2] not in (0, 128) for n in quant)
    elif quantizer == "xnnpack":  # [-127, 127] per-channel weights
        assert any("per_channel" in str(n.target) and n.args[4:6] == (-127, 127) for n in quant)

    torch._dynamo.reset()
    clear_reports()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * 1.2
    with torch.no_grad():
        compiled = torch.compile(gm, backend="pbsdk", options={"target": "template", "spec": "npu"})
        got = compiled(x)
        want = gm(x)
    (report,) = reports()
    assert report.fallback_ops == () and report.failed_partitions == 0 and report.compiled_ops == report.graph_ops, \
        report

    # The i8 unit issued the contractions. The planned matmuls (one per linear and per convolution — an i8
    # convolution is a contraction of its patches —, plus one per nonzero input zero point) are i8 on the mxu
    # and issue ceil(m/32) ceil(n/32) ceil(k/64) of its i8 instructions each. The graph holds no bf16/f16 and
    # the mxu has no f32 form, so every mxu instruction is an i8 one.
    planned = [c for k in report.kernels for c in (k.executable.resources or {}).get("contractions", [])]
    linears = sum(n.target == torch.ops.aten.linear.default for n in gm.graph.nodes)
    convs = sum(n.target == torch.ops.aten.conv2d.default for n in gm.graph.nodes)
    assert len(planned) >= linears + convs and all((c["dtype"], c["unit"]) == ("i8", "mxu") for c in planned), planned
    unit = next(u for u in load_spec("npu").matrix_units if u.operand_dtype == "i8")
    by_matmuls = sum(c["batch"] * math.ceil(c["m"] / unit.m) * math.ceil(c["n"] / unit.n) * math.ceil(c["k"] / unit.k)
                     for c in planned)
    issued = sum(n for k in report.kernels for key, n in (k.executable.last_counters or {}).items()
                 if key == "matrix_unit:mxu")
    assert issued == by_matmuls > 0, (issued, by_matmuls, convs)

    # Against torch's quantized reference. pbsdk sums the integers exactly; torch sums the dequantized values
    # in f32, so a value next to a rounding boundary of the next quantize may land one step apart, and that
    # flipped activation moves a whole row of the next layer's outputs. The bound: each output within two
    # steps of the last layer's input quantizer times its largest weight (two flipped inputs; float outputs)
    # or one output step (requantized outputs), and at most 15% of outputs beyond f32 rounding (one row of
    # 8 is 12.5%). Seen with these seeds: no flip, every output within f32 rounding (max 3.6e-7); on other
    # seeds during development, one row in 8 flipped (11% of outputs, 8.2e-4).
    last = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default][-1]
    x_dq, w_dq = last.args[0], last.args[1]
    w_max = 127 * float(torch.as_tensor(_value(gm, w_dq.args[1])).max())  # |w| <= 127 * its largest scale
    (out,) = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    requantized = "dequantize" in str(out.target)
    tol = float(out.args[1]) if requantized else 2 * float(x_dq.args[1]) * w_max
    diff = (got - want).abs()
    assert diff.max().item() <= tol * (1 + 1e-5), (diff.max().item(), tol)
    assert (diff > 1e-5 * want.abs().max()).float().mean().item() <= 0.15, diff


def _value(gm: Any, arg: Any) -> Any:
    """An FX argument's value: a ``get_attr`` node's tensor, else the argument itself."""
    return getattr(gm, arg.target) if isinstance(arg, torch.fx.Node) and arg.op == "get_attr" else arg


class Int16Activations(torch.nn.Module):
    """A quantize/dequantize pair pbsdk does not hold (int16): torch keeps it, the linear still compiles."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.randn(16, 32, generator=torch.Generator().manual_seed(4)) * 0.1

    def forward(self, x: Any) -> Any:
        q = qd.quantize_per_tensor.default(x, 0.001, 3, -32768, 32767, torch.int16)
        return F.linear(qd.dequantize_per_tensor.default(q, 0.001, 3, -32768, 32767, torch.int16), self.w)


def test_unsupported_quantized_dtypes_stay_with_torch_and_say_why(caplog: pytest.LogCaptureFixture) -> None:
    import logging

    torch._dynamo.reset()
    clear_reports()
    m = Int16Activations().eval()
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(6))
    with caplog.at_level(logging.INFO, logger="pbsdk"), torch.no_grad():
        got = torch.compile(m, backend="pbsdk")(x)
        want = m(x)
    (report,) = reports()
    assert set(report.fallback_ops) == {"quantized_decomposed.quantize_per_tensor.default",
                                        "quantized_decomposed.dequantize_per_tensor.default"}
    assert report.compiled_ops == report.graph_ops - 2 and report.failed_partitions == 0, report
    assert "quantized dtype int16" in caplog.text, caplog.text
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(not lowers_unit(load_spec("host"), "vpdpbusd"), reason="this host has no VNNI: the cpu target's i8 contractions "
                    "run on the f32 FMAs on widened operands (tests/numerics/test_widened.py; "
                    "tests/numerics/test_units.py checks the code for a VNNI CPU)")
@pytest.mark.parametrize("model, shape", [(FloatMLP, (32, 64)), (FloatCNN, (8, 3, 12, 12))], ids=["mlp", "cnn"])
def test_x86_pt2e_models_run_on_the_host_int8_unit(pt2e: Any, model: type, shape: tuple[int, ...]) -> None:
    """X86InductorQuantizer's graph (u8 activations, i8 per-channel weights) on the cpu target: every linear
    and convolution is an i8 contraction on the host's int8 unit (VNNI's vpdpbusd, or AMX's tdpbssd where
    the host has it; the compile-time record says so), no fallback, and the
    result is torch's quantized reference within one step of the last layer's output (the same bound as
    on the template target above)."""
    gm = _pt2e_quantized(pt2e, "x86", model, shape)
    torch._dynamo.reset()
    clear_reports()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5)) * 1.2
    with torch.no_grad():
        got = torch.compile(gm, backend="pbsdk", options={"target": "cpu"})(x)
        want = gm(x)
    (report,) = reports()
    assert report.fallback_ops == () and report.failed_partitions == 0, report
    planned = [c for k in report.kernels for c in (k.executable.resources or {}).get("contractions", [])]
    layers = sum(n.target in (torch.ops.aten.linear.default, torch.ops.aten.conv2d.default) for n in gm.graph.nodes)
    on_unit = [c for c in planned if c["unit"] in ("vpdpbusd", "tdpbssd")]
    assert len(on_unit) >= layers and all(c["dtype"] == "i8" for c in on_unit), planned
    last = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default][-1]
    x_dq, w_dq = last.args[0], last.args[1]
    w_max = 127 * float(torch.as_tensor(_value(gm, w_dq.args[1])).max())
    diff = (got - want).abs()
    assert diff.max().item() <= 2 * float(x_dq.args[1]) * w_max * (1 + 1e-5), diff.max().item()


@pytest.mark.parametrize("model, shape", [(FloatMLP, (32, 64)), (FloatCNN, (8, 3, 12, 12))], ids=["mlp", "cnn"])
def test_pt2e_with_inductor_freezing_on_still_compiles_on_the_unit(pt2e: Any, model: type,
                                                                   shape: tuple[int, ...]) -> None:
    """PyTorch's x86 int8 recipe sets ``torch._inductor.config.freezing = True``; Dynamo then keeps the
    weights on the graph module (``get_attr``) instead of passing them as inputs. The whole graph once fell
    back to torch ('Please convert all Tensors to FakeTensors first'), and with that fixed alone every
    convolution became a float one (its weight a kernel input, not an i8 constant). Both checked here."""
    import torch._inductor.config as inductor_config

    gm = _pt2e_quantized(pt2e, "x86", model, shape)
    torch._dynamo.reset()
    clear_reports()
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(5))
    with torch.no_grad(), inductor_config.patch(freezing=True):
        got = torch.compile(gm, backend="pbsdk", options={"target": "template", "spec": "npu"})(x)
        want = gm(x)
    (report,) = reports()
    assert report.failed_partitions == 0 and report.compiled_ops == report.graph_ops and report.frozen, report
    planned = [c for k in report.kernels for c in (k.executable.resources or {}).get("contractions", [])]
    layers = sum(n.target in (torch.ops.aten.linear.default, torch.ops.aten.conv2d.default) for n in gm.graph.nodes)
    assert len(planned) >= layers and all((c["dtype"], c["unit"]) == ("i8", "mxu") for c in planned), planned
    last = [n for n in gm.graph.nodes if n.target == torch.ops.aten.linear.default][-1]
    w_max = 127 * float(torch.as_tensor(_value(gm, last.args[1].args[1])).max())
    assert (got - want).abs().max().item() <= 2 * float(last.args[0].args[1]) * w_max * (1 + 1e-5)
