"""``pbsdk compile model.onnx`` and ``pbsdk run model.onnx --inputs ...``: results, and typed errors (exit 2,
one line, no traceback)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper, numpy_helper

from pbsdk.cli import main


@pytest.fixture
def model_file(tmp_path: Path) -> Path:
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["y"]),
         helper.make_node("Shrink", ["h"], ["z"])], "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 3])], [numpy_helper.from_array(w, "w")])
    path = tmp_path / "mlp.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_compile_reports_unsupported_op_then_compiles_with_fallback(model_file: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", str(model_file), "--target", "template"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pbsdk: error:") and "Shrink (opset 17)" in err and "Traceback" not in err
    assert main(["compile", str(model_file), "--target", "template", "--fallback"]) == 0
    out = capsys.readouterr().out
    assert "on template" in out and "onnx.reference fallback (1 nodes): Shrink x1" in out


def test_run_prints_and_saves_outputs(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    assert main(["run", str(model_file), "--inputs", str(tmp_path / "x.npy"), "--fallback",
                 "--output-dir", str(tmp_path / "out")]) == 0
    assert "y: float32[2, 3]" in capsys.readouterr().out
    w = np.arange(12, dtype=np.float32).reshape(4, 3) / 10
    h = x @ w
    np.testing.assert_allclose(np.load(tmp_path / "out" / "y.npy"), np.maximum(h, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "out" / "z.npy"), np.where(np.abs(h) > 0.5, h, 0), rtol=1e-5,
                               atol=1e-6)


def test_run_errors_are_one_line(model_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    np.save(tmp_path / "bad.npy", np.zeros((2, 5), np.float32))
    assert main(["run", str(model_file), "--fallback", "--inputs", str(tmp_path / "bad.npy")]) == 2
    assert "input 'x' must be float32[2, 4]" in capsys.readouterr().err
    assert main(["run", str(tmp_path / "missing.onnx")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["compile", str(model_file), "--input-shape", "x"]) == 2
    assert "expected NAME=D0,D1" in capsys.readouterr().err


def test_a_model_with_shape_inputs_compiles_when_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    graph = helper.make_graph([helper.make_node("Reshape", ["x", "shape"], ["y"])], "reshape",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6]),
                               helper.make_tensor_value_info("shape", TensorProto.INT64, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])])
    path = tmp_path / "reshape.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["compile", str(path)]) == 0
    assert "compiles when run, once per value of 'shape' (Reshape's shape)" in capsys.readouterr().out
    np.save(tmp_path / "x.npy", np.arange(12, dtype=np.float32).reshape(2, 6))
    np.save(tmp_path / "s.npy", np.array([3, 4], np.int64))
    assert main(["run", str(path), "--inputs", str(tmp_path / "x.npy"), str(tmp_path / "s.npy"),
                 "--output-dir", str(tmp_path / "out")]) == 0
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "y.npy"), np.arange(12, dtype=np.float32).reshape(3, 4))
