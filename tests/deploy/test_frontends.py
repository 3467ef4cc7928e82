"""Exporting from each frontend: ONNX (API and ``pbsdk compile model.onnx -o m.pbsdk``), torch modules
(through torch.export; a module with an op that would fall back to torch is refused, naming it),
``pbsdk.jax.jit`` functions (refused when an equation would run in XLA), and a target that cannot export
(refused clearly)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pbsdk
import pbsdk.runtime
from pbsdk.cli import main


def _onnx_model(path: Path, *, unsupported: bool = False) -> Path:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(3)
    w = rng.standard_normal((64, 32)).astype(np.float32)
    b = rng.standard_normal(32).astype(np.float32)
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Softmax", ["r"], ["y"], axis=-1)]
    if unsupported:
        nodes.append(helper.make_node("Shrink", ["r"], ["z"]))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 32])]
    if unsupported:
        outputs.append(helper.make_tensor_value_info("z", TensorProto.FLOAT, [4, 32]))
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 64])],
                              outputs, [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_onnx_export_equals_the_jit(tmp_path: Path) -> None:
    import pbsdk.onnx

    model_file = _onnx_model(tmp_path / "tiny.onnx")
    x = np.random.default_rng(4).standard_normal((4, 64)).astype(np.float32)
    want = pbsdk.onnx.load(str(model_file))(x)
    path = pbsdk.export(str(model_file), (), tmp_path / "tiny.pbsdk")
    model = pbsdk.runtime.load(path)
    assert [t.name for t in model.manifest.entries[0].inputs] == ["x"]
    assert [t.name for t in model.manifest.entries[0].outputs] == ["y"]
    np.testing.assert_array_equal(model(x), want)


def test_onnx_cli_export_and_inspect(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_file = _onnx_model(tmp_path / "tiny.onnx")
    out = tmp_path / "tiny.pbsdk"
    assert main(["compile", str(model_file), "-o", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    x = tmp_path / "x.npy"
    np.save(x, np.ones((4, 64), np.float32))
    assert main(["inspect", str(out), "--inputs", str(x)]) == 0
    text = capsys.readouterr().out
    assert "entry tiny" in text and "in  x: float32[4, 64]" in text and "y: float32[4, 32]" in text
    out.write_bytes(out.read_bytes()[:100])
    assert main(["inspect", str(out)]) == 2
    assert "TruncatedError" in capsys.readouterr().err


def test_onnx_fallback_is_refused(tmp_path: Path) -> None:
    model_file = _onnx_model(tmp_path / "bad.onnx", unsupported=True)
    with pytest.raises(pbsdk.UnsupportedError, match="Shrink"):
        pbsdk.export(str(model_file), (), tmp_path / "bad.pbsdk")


def test_torch_module_export_equals_torch_compile(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                              torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 5)).eval()
    x = torch.randn(2, 3, 12, 12)
    model = pbsdk.runtime.load(pbsdk.export(net, (x,), tmp_path / "net.pbsdk"))
    # A fresh Dynamo: an earlier test's Sequential of other shapes would have it trace this one with a
    # symbolic batch (automatic dynamic shapes), whose kernels round differently from the static export.
    torch._dynamo.reset()
    with torch.no_grad():
        want = torch.compile(net, backend="pbsdk")(x).numpy()
        eager = net(x).numpy()
    got = model(x.numpy())
    np.testing.assert_array_equal(got, want)
    np.testing.assert_allclose(got, eager, rtol=1e-4, atol=1e-5)


def test_torch_fallback_ops_are_refused_by_name(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")

    class Bessel(torch.nn.Module):
        def forward(self, x):  # type: ignore[no-untyped-def]
            return torch.special.i0(x) * 2  # aten.i0: no converter (docs/frontends.md)

    with pytest.raises(pbsdk.UnsupportedError, match=r"aten\.i0\.default x1"):
        pbsdk.export(Bessel(), (torch.randn(3, 4),), tmp_path / "s.pbsdk")
    assert not (tmp_path / "s.pbsdk").exists()


def test_other_targets_are_refused() -> None:
    """Only targets whose code a runtime path runs export (cpu, template and its derivatives, nvgpu:
    tests/deploy/test_targets.py); any other is a TargetError before anything is compiled."""
    from pbsdk.core.target import Target
    from pbsdk.deploy import runtime_target

    class Elsewhere(Target):
        name = "elsewhere"

        def stages(self, spec, options):  # type: ignore[no-untyped-def]
            return ()

        def load(self, artifact, spec):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    with pytest.raises(pbsdk.TargetError, match="not supported"):
        runtime_target(Elsewhere())


def test_integer_inputs_carried_as_floats(tmp_path: Path) -> None:
    """Token ids: int64 for the caller, floats inside the kernel; the runtime converts them."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)

    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)

        def forward(self, ids):  # type: ignore[no-untyped-def]
            return torch.tanh(self.emb(ids)).sum(-1)

    module = Embed().eval()
    ids = torch.randint(0, 50, (2, 5))
    model = pbsdk.runtime.load(pbsdk.export(module, (ids,), tmp_path / "embed.pbsdk"))
    (desc,) = model.manifest.entries[0].inputs
    assert desc.given == "int64" and desc.dtype.startswith("float")
    with torch.no_grad():
        want = module(ids).numpy()
    np.testing.assert_allclose(model(ids.numpy()), want, rtol=1e-5, atol=1e-6)
    with pytest.raises(pbsdk.runtime.InputError, match="int64"):
        model(ids.numpy().astype(np.float32))


def test_jax_function_export(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    import pbsdk.jax

    w = np.random.default_rng(6).standard_normal((16, 8)).astype(np.float32)

    def layer(x):  # type: ignore[no-untyped-def]
        return jax.nn.relu(x @ w) * 2.0

    f = pbsdk.jax.jit(layer, target="cpu")
    x = np.random.default_rng(7).standard_normal((4, 16)).astype(np.float32)
    model = pbsdk.runtime.load(pbsdk.export(f, (x,), tmp_path / "layer.pbsdk"))
    np.testing.assert_array_equal(model(x), np.asarray(f(x)))


def test_jax_xla_fallback_is_refused(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    import pbsdk.jax

    f = pbsdk.jax.jit(lambda x: jax.numpy.sort(x, axis=-1) + 1.0, target="cpu")
    with pytest.raises(pbsdk.UnsupportedError, match="XLA"):
        pbsdk.export(f, (np.ones((3, 5), np.float32),), tmp_path / "s.pbsdk")
