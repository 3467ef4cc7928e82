"""Mixture-of-experts routing and Qwen2-style decoders through ``torch.compile(backend="pbsdk")`` (issue #31,
items 3 and 4): the routing ops (``topk``, ``sort``, ``histc``, grouped matmuls), a Mixtral-style model
(4 experts, top-2) and a Qwen2 model from their own configs with small sizes, default ``use_cache``, and
``generate()``. Outputs are compared with eager at explicit tolerances; fallbacks are counted."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.frontends.torch.dynamo_backend import transformers_support

_ONE_THREAD = {"compile_options": {"threads": 1}}


def _compiled(fn: Any) -> Any:
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    return torch.compile(fn, backend="pbsdk", options=_ONE_THREAD)


def _no_fallbacks() -> list[Any]:
    reports = pbsdk_torch.reports()
    assert reports, "nothing was compiled by pbsdk"
    for r in reports:
        # Not compiled and no fallback: host checks (torch evaluates them) and views of a graph input that
        # the graph returns (torch keeps the aliasing).
        assert r.fallback_ops == () and r.failed_partitions == 0, r
    return reports


class _Router(torch.nn.Module):
    """A router's ops: softmax, top-2 and its renormalisation, the experts' stable sort and histogram."""

    def forward(self, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
        weights, experts = torch.topk(torch.softmax(logits, -1), 2, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        sorted_ids, perm = torch.sort(experts.reshape(-1), stable=True)
        counts = torch.histc(sorted_ids.float(), bins=logits.shape[-1], min=0, max=logits.shape[-1] - 1)
        return weights, experts, sorted_ids, perm, counts, torch.cumsum(counts, 0, dtype=torch.int32)


def test_routing_ops_convert_and_match_eager() -> None:
    logits = torch.randn(24, 6, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = _compiled(_Router())(logits)
        want = _Router()(logits)
    _no_fallbacks()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("descending", [False, True])
def test_sort_and_topk_order_nan_and_ties_like_torch(descending: bool) -> None:
    x = torch.randint(0, 5, (3, 17), generator=torch.Generator().manual_seed(1)).float()
    x[0, 3], x[1, 5], x[2, 0] = float("nan"), float("-inf"), float("inf")

    def f(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        values, index = torch.sort(x, dim=-1, descending=descending, stable=True)
        return values, index, torch.topk(x, 4, dim=-1, largest=not descending).values

    with torch.no_grad():
        got = _compiled(f)(x)
        want = f(x)
    _no_fallbacks()
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=0, atol=0, equal_nan=True)


def test_histc_bins_like_torch_at_the_edges() -> None:
    x = torch.tensor([-1.0, 0.0, 0.3333, 1 / 3, 0.5, 2 / 3, 0.99, 1.0, 1.5, float("nan")])

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.histc(x * 1.0, bins=3, min=0, max=1)

    with torch.no_grad():
        got = _compiled(f)(x)
    _no_fallbacks()
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)


class _Grouped(torch.nn.Module):
    """A grouped matmul over rows gathered per token, then a gated second one (an MoE's shape). By default
    torch's own grouped_mm, which traces with bf16 only (transformers calls it so for bf16 experts); ``mm``
    another grouped matmul of (rows, weights, offsets), and ``cols`` the second one's width."""

    def __init__(self, mm: Any = None, cols: int = 16, seed: int = 2) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.up = torch.nn.Parameter(torch.randn(4, 16, 32, generator=g) * 0.2)
        self.down = torch.nn.Parameter(torch.randn(4, 16, cols, generator=g) * 0.2)
        self.mm = mm or (lambda x, w, offs: torch.nn.functional.grouped_mm(x, w, offs=offs))

    def forward(self, x: torch.Tensor, perm: torch.Tensor, offs: torch.Tensor, offs2: torch.Tensor) -> torch.Tensor:
        h = self.mm(x[perm // 2], self.up, offs)
        gate, up = h.chunk(2, dim=-1)
        return self.mm(torch.nn.functional.silu(gate) * up, self.down, offs2)


@pytest.mark.parametrize(("offsets", "offsets2"), [([3, 9, 9, 16], None), ([0, 5, 11, 14], None),
                                                  ([3, 9, 9, 16], [8, 8, 12, 16])],
                         ids=["an-empty-group", "rows-left-over", "other-groups-second"])
def test_grouped_mm_of_gathered_rows_matches_torch(offsets: list[int], offsets2: list[int] | None) -> None:
    """The second grouped_mm reads the first's (token, expert) form when both have the same offsets
    (`convert.ExpertRows`); with other offsets it multiplies its rows by every expert."""
    if not hasattr(torch.nn.functional, "grouped_mm"):
        pytest.skip("torch.nn.functional.grouped_mm needs torch >= 2.10")
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(4))
    offs = torch.tensor(offsets, dtype=torch.int32)
    offs2 = offs if offsets2 is None else torch.tensor(offsets2, dtype=torch.int32)
    model = _Grouped().eval().to(torch.bfloat16)
    with torch.no_grad():
        got = _compiled(model)(x, perm, offs, offs2)
        want = model(x, perm, offs, offs2)
    _no_fallbacks()
    # bf16 results: torch rounds the first product to bf16 before the gate, pbsdk the same; the sums of 16
    # products each accumulate in f32 in both, in different orders.
    # Rows from offs[-1] on belong to no group: torch leaves them unwritten, pbsdk makes them zero.
    end = min(offsets[-1], (offsets2 or offsets)[-1])
    torch.testing.assert_close(got.float()[:end], want.float()[:end], rtol=2e-2, atol=2e-2)
    assert (got.float()[end:] == 0).all()


def test_f32_grouped_mm_multiplies_each_group_by_its_expert_only() -> None:
    """On the cpu target (sizes known at run time compile) a grouped matmul of constant f32 experts is one matmul
    per group on its own rows (`ops.grouped_matmul`): the kernel's products are (rows of the group) x 16 x 32
    and x 16 x 24, never every row times every expert. Group sizes are data: new offsets each call, one
    compile; rows beyond the last group are zero, as are empty groups' none."""
    tf = _transformers()
    if _major(tf) < 5:
        pytest.skip(f"transformers {tf.__version__} has no grouped_mm_fallback op (5.x does)")
    import transformers.integrations.moe  # noqa: F401  (registers torch.ops.transformers.grouped_mm_fallback)

    # transformers' custom op: torch's own grouped_mm takes bf16 only on CPU
    model = _Grouped(torch.ops.transformers.grouped_mm_fallback, cols=24, seed=6).eval()
    compiled = _compiled(model)
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(7))
    perm = torch.randperm(16, generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        for offsets, offsets2 in (([3, 9, 9, 16], [8, 8, 12, 16]), ([0, 5, 11, 14], [0, 0, 16, 16]),
                                  ([16, 16, 16, 16], [1, 2, 3, 4])):
            offs, offs2 = torch.tensor(offsets, dtype=torch.int32), torch.tensor(offsets2, dtype=torch.int32)
            got = compiled(x, perm, offs, offs2)
            want = model(x, perm, offs, offs2)
            end = min(offsets[-1], offsets2[-1])
            torch.testing.assert_close(got[:end], want[:end], rtol=1e-5, atol=1e-5)
            assert (got[end:] == 0).all()
    (report,) = _no_fallbacks()
    products = [c for k in report.kernels for c in k.executable.resources["contractions"]]
    assert sorted((c["n"], c["k"]) for c in products) == [(24, 16)] * 4 + [(32, 16)] * 4, products
    assert all(c["m"] == -1 and c["compute"] == "vector-fma" for c in products), products


def _transformers() -> Any:
    from pbsdk.testing.torchvision import import_transformers

    try:
        return import_transformers()
    except ImportError as exc:
        pytest.skip(f"transformers: {exc}")


_SMALL = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
          "num_key_value_heads": 2, "vocab_size": 300}


def _model(name: str, *, lm: bool = False) -> Any:
    tf = _transformers()
    torch.manual_seed(0)
    if name == "mixtral":
        config = tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, **_SMALL)
        return (tf.MixtralForCausalLM if lm else tf.MixtralModel)(config).eval()
    config = tf.Qwen2Config(**_SMALL)
    return (tf.Qwen2ForCausalLM if lm else tf.Qwen2Model)(config).eval()


def _major(tf: Any) -> int:
    return int(tf.__version__.split(".")[0])


@pytest.mark.parametrize(("name", "batch"), [("mixtral", 2), ("qwen2", 1), ("qwen2", 3)])
def test_decoder_with_default_config_compiles_without_fallbacks(name: str, batch: int) -> None:
    model = _model(name)
    ids = torch.randint(0, 300, (batch, 10), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        got = _compiled(model)(ids)
        want = model(ids)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)
    reports = _no_fallbacks()
    assert sum(r.fused_attention for r in reports) == 2, reports
    if name == "mixtral" and _major(_transformers()) >= 5:
        assert len(reports) == 1, reports  # grouped_mm experts: Dynamo gives one graph, pbsdk compiles it whole
        assert reports[0].partitions == 1 and reports[0].compiled_ops == reports[0].graph_ops, reports


@pytest.mark.parametrize("name", ["qwen2_moe", "olmoe"])
def test_other_moe_families_compile_without_fallbacks(name: str) -> None:
    """The experts implementation is transformers' own (`use_experts_implementation`), shared by its MoE
    families: Qwen2-MoE (with a shared expert) and OLMoE compile as Mixtral does."""
    tf = _transformers()
    if _major(tf) < 5:
        pytest.skip("transformers 4.x loops over the experts hit (Mixtral's 4.x path, tested above)")
    torch.manual_seed(0)
    if name == "qwen2_moe":
        config = tf.Qwen2MoeConfig(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
                                   shared_expert_intermediate_size=64, **_SMALL)
        model = tf.Qwen2MoeModel(config).eval()
    else:
        model = tf.OlmoeModel(tf.OlmoeConfig(num_experts=4, num_experts_per_tok=2, **_SMALL)).eval()
    ids = torch.randint(0, 300, (2, 10), generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        got = _compiled(model)(ids)
        want = model(ids)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)
    reports = _no_fallbacks()
    if _major(tf) >= 5:
        assert len(reports) == 1 and reports[0].compiled_ops == reports[0].graph_ops, reports


def test_mixtral_generate_gives_eagers_tokens(request: pytest.FixtureRequest) -> None:
    if _major(_transformers()) < 5 and not request.config.getoption("--runslow"):
        pytest.skip("transformers 4.x: every expert's graph compiles per token count (~40 s); run with --runslow")
    model = _model("mixtral", lm=True)
    ids = torch.randint(0, 300, (2, 8), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():  # the prompt and two decode steps (each new length compiles anew: #31 item 2)
        want = model.generate(ids, max_new_tokens=3, do_sample=False)
        model.forward = _compiled(model.forward)
        got = model.generate(ids, max_new_tokens=3, do_sample=False)
    assert torch.equal(got, want)
    _no_fallbacks()


def test_an_unsupported_transformers_version_is_stated(caplog: pytest.LogCaptureFixture) -> None:
    assert transformers_support("4.57.6") is None and transformers_support("5.23.0") is None
    why = transformers_support("4.40.2")
    assert why is not None and "4.40.2" in why and ">= 4.57" in why
    import pbsdk.frontends.torch.dynamo_backend as backend

    tf = _transformers()
    saved = tf.__version__
    backend._transformers_checked = False
    try:
        tf.__version__ = "6.1.0"
        with caplog.at_level(logging.WARNING, logger="pbsdk"), torch.no_grad():
            _compiled(lambda x: x * 2)(torch.ones(3))
    finally:
        tf.__version__ = saved
        backend._transformers_checked = False
    assert "transformers 6.1.0 is not a version" in caplog.text, caplog.text


@pytest.mark.realmodels
@pytest.mark.parametrize("name", ["mixtral", "qwen2"])
def test_full_size_decoder_compiles_without_fallbacks(name: str) -> None:
    """The benchmark's configs (benchmarks/moe_decoders.py: 4 layers, d 512, vocab 32000; Mixtral-style with 4
    experts of 1376, top-2) at batch 2 x 128 tokens, default cache: the logits against eager, no fallback."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "moe_decoders.py"
    spec = importlib.util.spec_from_file_location("moe_decoders", path)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    _transformers()
    model = bench.build(name)
    ids = torch.randint(0, 32000, (2, 128), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        got = _compiled(model)(ids).logits
        want = model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-3)
    reports = _no_fallbacks()
    assert sum(r.fused_attention for r in reports) == 4, reports


def test_a_sort_beyond_the_pair_limit_falls_back_named(caplog: pytest.LogCaptureFixture) -> None:
    x = torch.randn(5000, generator=torch.Generator().manual_seed(8))  # 25M pairs > MAX_RANK_PAIRS

    def f(x: torch.Tensor) -> torch.Tensor:
        return torch.sort(x * 2).values + 1

    with caplog.at_level(logging.INFO, logger="pbsdk"), torch.no_grad():
        got = _compiled(f)(x)
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)
    (report,) = pbsdk_torch.reports()
    assert report.fallback_ops == ("aten.sort.default",), report
    assert "comparisons (every pair is ranked)" in caplog.text, caplog.text
