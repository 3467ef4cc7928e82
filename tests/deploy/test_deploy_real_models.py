"""Full-size models exported and run without the compiler (``--runrealmodels``; minutes each on 2 cores):
ResNet-50 (torchvision, random weights) and GPT-2 (12 layers, 128 tokens) through torch.export, and
BERT-base through ONNX. The isolated
runtime process (`test_isolated`) and the C program (`test_c_api`) must give outputs identical to the JIT's
run of the same compilation."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.realmodels


def _jit_outputs(entry, request, inputs):  # type: ignore[no-untyped-def]
    from pbsdk.core.runtime.kernel import Kernel

    kernel = Kernel(entry.artifact, request.target.load(entry.artifact, request.spec))
    out = kernel(*inputs)
    return out if isinstance(out, tuple) else (out,)


def _run_isolated(path: Path, inputs: list[np.ndarray], tmp: Path) -> list[np.ndarray]:
    """The file run by the runtime alone: a fresh virtualenv holding the pbsdk-runtime wheel and numpy
    (`test_isolated`)."""
    from test_isolated import run_in_venv, runtime_venv

    return run_in_venv(runtime_venv(tmp), path, inputs, tmp)


def _exported(name: str, tmp: Path):  # type: ignore[no-untyped-def]
    """Real model ``name`` exported through torch.export for cpu: (entry, request, file, inputs as numpy)."""
    from pbsdk.core.compiler import resolve
    from pbsdk.deploy import write_artifact
    from pbsdk.deploy.torch_export import from_torch
    from pbsdk.testing.real_models import MODELS

    model, inputs = MODELS[name].make(1)
    request = resolve("cpu", None, None)
    entry = from_torch(model.eval(), inputs, request, name)
    path = write_artifact(tmp / f"{name}.pbsdk", [entry], request)
    return entry, request, path, [np.ascontiguousarray(i.numpy()) for i in inputs]


def test_resnet50_runtime_and_c_match_the_jit(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    entry, request, path, x = _exported("resnet50", tmp_path)
    (want,) = _jit_outputs(entry, request, x)
    np.testing.assert_array_equal(_run_isolated(path, x, tmp_path)[0], want)

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("make") is None:
        pytest.skip("the C half needs cc and make")
    from test_c_api import REPO

    build = tmp_path / "c"
    subprocess.run(["make", "-s", "-C", str(REPO), "runtime-c", f"RUNTIME_BUILD={build}"], check=True)
    exe = build / "run_model"
    subprocess.run([cc, "-O2", f"-I{build}", "-o", str(exe), str(REPO / "tests/deploy/c/run_model.c"), f"-L{build}",
                    "-lpbsdk_runtime", f"-Wl,-rpath,{build}", "-lpthread"], check=True)
    x[0].tofile(tmp_path / "x.bin")
    done = subprocess.run([str(exe), str(path), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")], check=False,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y.bin", np.float32).reshape(want.shape), want)


def test_onnx_bert_base_runtime_matches_the_jit(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("transformers")
    import pbsdk.onnx
    from pbsdk.onnx.export import export, inputs_of

    compiled = pbsdk.onnx.load(export("bert_base"))
    feeds = inputs_of("bert_base")
    want = compiled.run(feeds)
    path = pbsdk.export(compiled, (), tmp_path / "bert.pbsdk")
    got = _run_isolated(path, [feeds[n] for n in compiled.input_names], tmp_path)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_gpt2_runtime_matches_the_jit(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    entry, request, path, ids = _exported("gpt2", tmp_path)
    assert [i.dtype for i in ids] == [np.int64]
    (want,) = _jit_outputs(entry, request, [i.astype(np.float64) for i in ids])  # the kernel takes floats
    np.testing.assert_array_equal(_run_isolated(path, ids, tmp_path)[0], want)
