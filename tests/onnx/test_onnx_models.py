"""Real models exported with ``torch.onnx.export`` (random weights; `pbsdk.onnx.export`) compile with no
unsupported op and no fallback, and match onnxruntime. The 2-layer BERT runs by default; resnet18 at 64x64
and the 2-layer GPT-2 (export ~7 s each) with --runslow.

Tolerances: f32 throughout; pbsdk and onnxruntime sum in different orders (convolutions over 3x3xC
windows, matmuls over 128-512), so atol/rtol 1e-4 on outputs of magnitude ~1-4 (measured errors: resnet18
1.2e-6, GPT-2 1.7e-6, BERT 7e-7 absolute)."""

from __future__ import annotations

import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

import pbsdk.onnx
from pbsdk.core.spec import load_spec
from pbsdk.onnx.export import export, inputs_of
from pbsdk.testing import Tolerance, assert_close

TOL = Tolerance(atol=1e-4, rtol=1e-4)


def _spec(target: str):  # type: ignore[no-untyped-def]
    """The target's default spec; for template, example/npu with f64 added: the transformer models' int64
    token ids are carried as f64 (exact integers), which that fictional NPU does not list."""
    if target != "template":
        return None
    spec = load_spec("example/npu")
    return spec.model_copy(update={"dtypes": [*spec.dtypes, "f64"]})


@pytest.mark.parametrize("name", ["bert", pytest.param("resnet18", marks=pytest.mark.slow),
                                  pytest.param("gpt2", marks=pytest.mark.slow)])
@pytest.mark.parametrize("target", ["cpu", "template"])
def test_exported_model_matches_onnxruntime(name: str, target: str) -> None:
    data = export(name)
    compiled = pbsdk.onnx.load(data, target=target, spec=_spec(target))
    assert not compiled.report.fallback, compiled.report.format()
    assert len(compiled.plan.steps) == 1  # one kernel: nothing ran elsewhere
    feeds = inputs_of(name)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert_close(compiled.run(feeds)[0], want, op=f"onnx {name}", tol=TOL)
