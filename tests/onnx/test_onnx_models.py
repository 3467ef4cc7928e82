"""The real models (`pbsdk.testing.real_models`: torchvision and transformers definitions, random weights)
exported with ``torch.onnx.export`` (`pbsdk.onnx.export`) compile with no unsupported op and no fallback, in
one kernel, and match onnxruntime (the reference, CPU provider).

Default run: the small BERT config on cpu (10 s with the export, at load 4). ``--runslow``: the other
small configs (ResNet, ViT, GPT-2, Llama with GQA + RoPE) on cpu, and the small BERT on template (its
compile for the template target took 130 s of CPU time, 290-340 s under load 5-9; the 2-layer BERT of
hidden 128 exported before with its all-ones mask inside the graph, folded at import, took 14 s: the
attention mask as a run-time input is the likely difference). ``--runrealmodels``: the
seven full-size models (resnet18, resnet50, mobilenet_v3_small, vit_b_16 at 224x224; BERT-base, GPT-2
12 layers, the 4-layer Llama-style model at 128 tokens) on cpu; each takes 0.5-3 minutes to export,
compile and run on 2 shared cores.

Tolerance: f32 throughout; pbsdk and onnxruntime sum in different orders (convolutions over up to
3x3x512 windows, matmuls over up to 3072), and the outputs' magnitudes differ by model (mobilenet's
logits are ~1e-2, GPT-2's ~3), so the bound is relative to the output's largest magnitude:
``|pbsdk - ort| <= 1e-4 * max|ort|`` elementwise. Measured: at most 1.3e-6 of the output's magnitude on
the full-size models (docs/onnx.md lists each).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("transformers")

import pbsdk.onnx
from pbsdk.core.spec import load_spec
from pbsdk.onnx.export import export, inputs_of
from pbsdk.onnx.nodesuite import MODEL_OPS
from pbsdk.testing import Tolerance, assert_close
from pbsdk.testing.real_models import FULL

#: relative to the reference output's largest magnitude (see the module docstring)
RELATIVE = 1e-4


def _spec(target: str):  # type: ignore[no-untyped-def]
    """The target's default spec; for template, example/npu with f64 added: the transformer models' int64
    token ids are carried as f64 (exact integers), which that fictional NPU does not list."""
    if target != "template":
        return None
    spec = load_spec("example/npu")
    return spec.model_copy(update={"dtypes": [*spec.dtypes, "f64"]})


def _check(name: str, target: str) -> pbsdk.onnx.OnnxModel:
    data = export(name)
    compiled = pbsdk.onnx.load(data, target=target, spec=_spec(target))
    assert not compiled.report.fallback, compiled.report.format()
    assert len(compiled.plan.steps) == 1  # one kernel: nothing ran elsewhere
    feeds = inputs_of(name)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    scale = float(np.abs(want).max())
    assert scale > 1e-3, "an output that is ~0 cannot show a wrong result"
    assert_close(compiled.run(feeds)[0], want, op=f"onnx {name}", tol=Tolerance(atol=RELATIVE * scale, rtol=0.0))
    return compiled


_SLOW = pytest.mark.slow


@pytest.mark.parametrize(("name", "target"), [
    ("bert_small", "cpu"),
    *(pytest.param(n, "cpu", marks=_SLOW) for n in ("resnet_small", "vit_small", "gpt2_small", "llama_small")),
    pytest.param("bert_small", "template", marks=_SLOW),
])
def test_exported_small_model_matches_onnxruntime(name: str, target: str) -> None:
    _check(name, target)


@pytest.mark.realmodels
@pytest.mark.parametrize("name", FULL)
def test_exported_full_model_matches_onnxruntime(name: str) -> None:
    compiled = _check(name, "cpu")
    # the node suite's default selection covers every op these models compile
    assert set(compiled.report.converted) <= MODEL_OPS, sorted(set(compiled.report.converted) - MODEL_OPS)

