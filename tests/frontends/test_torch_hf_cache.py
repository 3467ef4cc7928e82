"""Hugging Face decoders as they are called by default (issue #31): ``use_cache=True``, so each attention's
key and value heads go to the returned cache as well as into the attention. The fused attention leaves
those views to be emitted beside it (`pbsdk.core.ir.attention._kept`); before, the emitter met a view it
never made and the whole partition ran in torch (``KeyError: 'value'``)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import pbsdk.frontends.torch as pbsdk_torch


def _transformers() -> Any:
    from pbsdk.testing.torchvision import import_transformers

    try:
        return import_transformers()
    except ImportError as exc:
        pytest.skip(f"transformers: {exc}")


def _decoder(name: str) -> Any:
    tf = _transformers()
    torch.manual_seed(0)
    if name == "gpt2":
        return tf.GPT2Model(tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500)).eval()
    return tf.LlamaModel(tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, vocab_size=500)).eval()


def _keys(cache: Any, layer: int) -> torch.Tensor:
    """Layer ``layer``'s cached keys, from a DynamicCache of either API generation or a legacy tuple."""
    if hasattr(cache, "layers"):
        return cache.layers[layer].keys
    if hasattr(cache, "key_cache"):
        return cache.key_cache[layer]
    return cache[layer][0]


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decoder_with_its_default_cache_compiles_with_fused_attention(name: str) -> None:
    model = _decoder(name)
    ids = torch.randint(0, 500, (1, 12), generator=torch.Generator().manual_seed(3))
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    with torch.no_grad():
        got = torch.compile(model, backend="pbsdk")(ids)
        want = model(ids)
    torch.testing.assert_close(got.last_hidden_state, want.last_hidden_state, rtol=1e-4, atol=1e-4)
    for layer in range(2):
        torch.testing.assert_close(_keys(got.past_key_values, layer), _keys(want.past_key_values, layer),
                                   rtol=1e-5, atol=1e-5)
    reports = pbsdk_torch.reports()
    assert sum(r.failed_partitions for r in reports) == 0, reports
    assert sum(r.compiled_ops for r in reports) >= 0.95 * sum(r.graph_ops for r in reports), reports
    assert sum(r.fused_attention for r in reports) == 2, reports


class _CacheWrite(torch.nn.Module):
    """A static cache's prompt write: ``cache[:, :, positions] = keys`` (``aten.index_put``), then a read of it."""

    def forward(self, cache: torch.Tensor, positions: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        out = cache.clone()
        out[:, :, positions] = keys
        return out * 2.0


def test_a_cache_write_past_the_pair_limit_writes_one_slice_per_position() -> None:
    """128 positions into a 256-position cache of 12 x 64 (25 M (position, index) pairs, past
    `pbsdk.ops.MAX_SCATTER_PAIRS`): on the cpu target each slice is written at its run-time position
    (`pbsdk.ops.put_slices`) instead of the op going to torch; positions change between calls (one compile),
    negative ones count from the end, and a repeated position takes the later slice."""
    cache = torch.randn(1, 12, 256, 64, generator=torch.Generator().manual_seed(0))
    keys = torch.randn(1, 12, 128, 64, generator=torch.Generator().manual_seed(1))
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    compiled = torch.compile(_CacheWrite(), backend="pbsdk", options={"compile_options": {"threads": 1}})
    for positions in (torch.arange(128) + 3, torch.cat([torch.arange(127, -1, -1)[:120], torch.tensor([-1] * 8)]),
                      torch.randint(0, 256, (128,), generator=torch.Generator().manual_seed(2))):
        with torch.no_grad():
            got = compiled(cache, positions, keys)
        want = _CacheWrite()(cache, positions, keys)
        torch.testing.assert_close(got, want, rtol=0, atol=0)
    (report,) = pbsdk_torch.reports()
    assert report.fallback_ops == () and report.failed_partitions == 0, report
