"""The real-model tier (issue #15, item 3): torchvision and Hugging Face model *definitions* with random
weights (pbsdk.testing.real_models), through ``torch.compile(backend="pbsdk")`` with default options.

Every model: zero fallbacks (every ATen op of the graph runs in a pbsdk kernel, no partition failed) and
the result against eager torch at the stated tolerance. The default run takes one small config per family;
the full-size models are marked ``realmodels`` (``--runrealmodels``; minutes each on 2 cores).
"""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.testing import Tolerance, assert_close
from pbsdk.testing.real_models import FULL, MODELS, SMALL, assert_fully_compiled

#: f32 error allowed against eager, per family. Measured on the small configs: <= 1e-6 max abs error on
#: outputs of magnitude ~1 (reordered reductions, polynomial exp/tanh/erf); the bounds leave >= 50x room.
#: Full size: contractions of length up to 3072 (BERT/GPT-2 MLPs), 2048 (ResNet-50) and 12 layers deep.
SMALL_TOL = {
    "cnn": Tolerance(atol=5e-5, rtol=5e-5),
    "vit": Tolerance(atol=5e-5, rtol=5e-5),
    "bert": Tolerance(atol=5e-5, rtol=5e-5),
    "gpt2": Tolerance(atol=5e-5, rtol=5e-5),
    "llama": Tolerance(atol=5e-5, rtol=5e-5),
    "encoder": Tolerance(atol=5e-5, rtol=5e-5),
    "speech": Tolerance(atol=5e-5, rtol=5e-5),
    "decoder": Tolerance(atol=5e-5, rtol=5e-5),
}
FULL_TOL = {
    "cnn": Tolerance(atol=1e-3, rtol=1e-3),
    "vit": Tolerance(atol=1e-3, rtol=1e-3),
    "bert": Tolerance(atol=1e-3, rtol=1e-3),
    "gpt2": Tolerance(atol=2e-3, rtol=2e-3),
    "llama": Tolerance(atol=1e-3, rtol=1e-3),
    "encoder": Tolerance(atol=1e-3, rtol=1e-3),
    "speech": Tolerance(atol=1e-3, rtol=1e-3),
    "decoder": Tolerance(atol=2e-3, rtol=2e-3),
}


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()


def _check(name: str, batch: int, tol: Tolerance, *,
           channels_last: bool = False) -> tuple[Any, Any, tuple[Any, ...]]:
    """Compile ``name`` at ``batch``, check it against eager and its reports; returns (model, compiled, inputs).
    ``channels_last``: the model and its image as torch's CPU guide has them, ``model.to(memory_format=
    torch.channels_last)`` and a channels-last input, which the kernel must read in place (no copy a call)."""
    spec = MODELS[name]
    model, inputs = spec.build(batch)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        inputs = tuple(x.contiguous(memory_format=torch.channels_last) for x in inputs)
    compiled = torch.compile(model, backend="pbsdk")
    with torch.no_grad():
        expected = model(*inputs)
        actual = compiled(*inputs)
    assert float(expected.abs().max()) > 1e-3, "a model whose output is ~0 cannot show a wrong result"
    assert_close(actual.numpy(), expected.numpy(), op=name, tol=tol)
    assert_fully_compiled(pbsdk_torch.reports(), spec, model)
    if channels_last:
        assert sum(r.stored_order_inputs for r in pbsdk_torch.reports()) == len(inputs)
    return model, compiled, inputs


def _check_padding(model: Any, compiled: Any, inputs: tuple[Any, ...]) -> None:
    """BERT's attention_mask stays a kernel input: the model compiled with no padding, called with padded keys
    and with one sequence padded throughout (torch gives that row a uniform average over finfo.min scores,
    not 0 and not NaN), matches eager without recompiling."""
    ids, ones = inputs
    padded = ones.clone()
    padded[0, 9:] = 0
    padded[1, :] = 0
    before = len(pbsdk_torch.reports())
    with torch.no_grad():
        assert_close(compiled(ids, padded).numpy(), model(ids, padded).numpy(), op="bert", tol=SMALL_TOL["bert"])
    assert len(pbsdk_torch.reports()) == before, "a new mask recompiled the model"


@pytest.mark.parametrize("name", SMALL)
def test_small_model_matches_eager_with_no_fallback(name: str) -> None:
    model, compiled, inputs = _check(name, 2, SMALL_TOL[MODELS[name].family])
    if MODELS[name].family == "bert":
        _check_padding(model, compiled, inputs)


@pytest.mark.realmodels
@pytest.mark.parametrize("name", FULL)
def test_full_model_matches_eager_with_no_fallback(name: str) -> None:
    _check(name, 1, FULL_TOL[MODELS[name].family])


CNNS = tuple(n for n in FULL if MODELS[n].family == "cnn")


def test_small_cnn_channels_last() -> None:
    _check("resnet_small", 2, SMALL_TOL["cnn"], channels_last=True)


@pytest.mark.realmodels
@pytest.mark.parametrize("name", CNNS)
def test_full_cnn_channels_last_matches_eager_with_no_fallback(name: str) -> None:
    # Issue #32: every CNN of the tier also runs after model.to(memory_format=torch.channels_last) with
    # channels-last inputs (its speed against the default layout: benchmarks/channels_last.py).
    _check(name, 1, FULL_TOL["cnn"], channels_last=True)


def test_one_small_model_per_family() -> None:
    families = ["bert", "cnn", "decoder", "encoder", "gpt2", "llama", "speech", "vit"]
    assert sorted(MODELS[n].family for n in SMALL) == families
    assert sorted({MODELS[n].family for n in FULL}) == families


def test_factories_are_seeded() -> None:
    a, (x,) = MODELS["vit_small"].build(1)
    b, (y,) = MODELS["vit_small"].build(1)
    assert torch.equal(x, y)
    for p, q in zip(a.parameters(), b.parameters()):
        assert torch.equal(p, q)
    assert float(a.heads.head.weight.detach().abs().max()) > 0  # torchvision's zero-initialised classifier was randomised


class _VmapMask(torch.nn.Module):
    """A mask built with ``torch.vmap`` inside the compiled frame, as transformers' masking_utils does."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        n = x.shape[-1]
        q = torch.arange(n)
        k = torch.arange(n)
        causal = torch.vmap(torch.vmap(lambda i, j: j <= i, in_dims=(None, 0)), in_dims=(0, None))(q, k)
        return torch.where(causal, x, torch.zeros_like(x)).softmax(-1)


def test_graph_that_enters_vmap_compiles_without_fallback() -> None:
    # functorch's functionalize used to hit an internal assert on such a graph and leave a vmap level
    # behind, after which Dynamo's guards failed ("Guard failed on the same frame it was created").
    x = torch.randn(2, 6, 6)
    model = _VmapMask()
    with torch.no_grad():
        actual = torch.compile(model, backend="pbsdk")(x)
        again = torch.compile(model, backend="pbsdk")(x + 1)
    assert_close(actual.numpy(), model(x).numpy(), op="softmax", tol=Tolerance(1e-6, 1e-6))
    assert_close(again.numpy(), model(x + 1).numpy(), op="softmax", tol=Tolerance(1e-6, 1e-6))
    (report, *_) = pbsdk_torch.reports()
    assert report.fallback_ops == () and report.failed_partitions == 0 and report.compiled_ops == report.graph_ops



def test_issue32_group_spans_the_kinds_it_names() -> None:
    # Issue #32: at least ten architectures beyond the first seven, across CNNs, vision transformers,
    # encoders, decoders and speech; the benchmark's ``--models issue32`` runs exactly these.
    from pbsdk.testing.real_models import ISSUE32

    assert len(set(ISSUE32)) == len(ISSUE32) >= 10 and set(ISSUE32) <= set(FULL)
    assert not set(ISSUE32) & {"resnet50", "resnet18", "mobilenet_v3_small", "vit_b_16", "bert_base", "gpt2", "llama"}
    assert {MODELS[n].family for n in ISSUE32} == {"cnn", "vit", "encoder", "decoder", "speech"}
