"""Graphs Dynamo traces with symbolic sizes, compiled once (issue #31 item 2): a decode loop with the default
``DynamicCache`` (each step's cache one longer), ``mark_dynamic`` on a sequence length, size-dependent
ops (``arange`` over the cache length, an ``index`` by it), and a dynamic batch whose convolution partition
is compiled per shape. Numerics against eager at explicit tolerances; graphs and ops counted from the
reports."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.testing.tolerances import Tolerance, assert_close

F32 = Tolerance(1e-5, 1e-5)


def _compiled(fn: Any, **options: Any) -> Any:
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    return torch.compile(fn, backend="pbsdk", options={"compile_options": {"threads": 1}, **options})


def _decoder(name: str) -> Any:
    from pbsdk.testing.torchvision import import_transformers

    try:
        tf = import_transformers()
    except ImportError as exc:
        pytest.skip(f"transformers: {exc}")
    torch.manual_seed(0)
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500)).eval()
    return tf.LlamaForCausalLM(tf.LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                              num_attention_heads=4, num_key_value_heads=2,
                                              vocab_size=500)).eval()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_generate_with_the_default_cache_compiles_three_graphs(name: str) -> None:
    model = _decoder(name)
    ids = torch.randint(0, 500, (2, 8), generator=torch.Generator().manual_seed(1))
    kw = {"max_new_tokens": 6, "min_new_tokens": 6, "do_sample": False, "pad_token_id": 0,
          "attention_mask": torch.ones_like(ids)}
    with torch.no_grad():
        want = model.generate(ids, **kw)
        model.forward = _compiled(model.forward)
        got = model.generate(ids, **kw)
    assert torch.equal(got, want)
    reports = pbsdk_torch.reports()
    # The prompt, the first decode step (static), the decode step with a symbolic cache length.
    assert len(reports) == 3, reports
    for r in reports:
        assert not r.fallback_ops and not r.dynamic_ops and not r.failed_partitions, r
        assert r.per_shape_partitions == 0 and r.compiled_ops + r.host_checks == r.graph_ops, r
    assert reports[2].host_checks > 0  # the symbolic step's size arithmetic stayed on the host
    # Each layer's attention over the growing cache runs as one fused kernel (key length read at run time).
    assert [r.fused_attention for r in reports] == [2, 2, 2], reports


def test_a_marked_dynamic_length_compiles_once() -> None:
    # Attention over a length marked dynamic, with the keys sliced and a position arange over it.
    torch.manual_seed(2)
    w = torch.randn(32, 32) / 6

    def fn(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        n = k.shape[1]
        pos = torch.arange(n, dtype=torch.float32) / n
        keys = torch.cat([k[:, :1], k[:, 1:] * 2.0], dim=1) @ w + pos[None, :, None]
        return F.scaled_dot_product_attention(q, keys, keys) + keys[:, -1:].sum(1, keepdim=True)

    compiled = _compiled(fn)
    q = torch.randn(4, 3, 32)
    with torch.no_grad():
        for n in (5, 17, 64, 200):
            k = torch.randn(4, n, 32)
            torch._dynamo.mark_dynamic(k, 1)
            assert_close(compiled(q, k).numpy(), fn(q, k).numpy(), op="attention", tol=F32)
    (report,) = pbsdk_torch.reports()
    assert not report.fallback_ops and not report.dynamic_ops and report.per_shape_partitions == 0, report


@pytest.mark.parametrize("gqa", [False, True])
def test_sdpa_over_a_dynamic_key_length_is_fused_once(gqa: bool) -> None:
    # One query (a decode step) over key lengths marked dynamic: one graph, one fused attention kernel for
    # every length. With GQA (8 query heads over 2 K/V heads) and an additive mask computed at run time
    # (left padding of sequence 1).
    torch.manual_seed(5)
    hkv = 2 if gqa else 8

    def fn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=gqa)

    compiled = _compiled(fn)
    with torch.no_grad():
        for n in (2, 15, 16, 17, 100, 513):
            q, k, v = torch.randn(2, 8, 1, 64), torch.randn(2, hkv, n, 64), torch.randn(2, hkv, n, 64)
            m = None
            if gqa:
                m = torch.zeros(2, 1, 1, n)
                m[1, ..., : n // 3] = float("-inf")
                torch._dynamo.mark_dynamic(m, 3)
            torch._dynamo.mark_dynamic(k, 2)
            torch._dynamo.mark_dynamic(v, 2)
            assert_close(compiled(q, k, v, m).numpy(), fn(q, k, v, m).numpy(), op="attention", tol=F32)
        (report,) = pbsdk_torch.reports()
        assert report.fused_attention == 1 and report.partitions == 1, report
        assert not report.fallback_ops and report.per_shape_partitions == 0, report
        # Dynamo specialises a size of 1 (a graph of its own, static, fused as before).
        q, k, v = torch.randn(2, 8, 1, 64), torch.randn(2, hkv, 1, 64), torch.randn(2, hkv, 1, 64)
        m = torch.zeros(2, 1, 1, 1) if gqa else None
        assert_close(compiled(q, k, v, m).numpy(), fn(q, k, v, m).numpy(), op="attention", tol=F32)
    assert [r.fused_attention for r in pbsdk_torch.reports()] == [1, 1]


def test_a_graph_whose_ops_need_their_sizes_is_compiled_per_shape(caplog: pytest.LogCaptureFixture) -> None:
    # Dynamo remembers that nn.Sequential.forward met two batch sizes (the small model's calls), so it traces
    # the CNN's first call with a symbolic batch. Its convolution and adaptive mean convert only with
    # their sizes known: rather than leave them to torch, the graph is compiled per batch size met.
    torch.manual_seed(3)
    small = _compiled(nn.Sequential(nn.Linear(4, 4)).eval())
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
                          nn.Flatten(), nn.Linear(8, 5)).eval()
    compiled = torch.compile(model, backend="pbsdk", options={"compile_options": {"threads": 1}})
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="pbsdk"):
        for n in (5, 6):
            small(torch.randn(n, 4))
        pbsdk_torch.clear_reports()
        for n in (2, 3, 2):
            x = torch.randn(n, 3, 12, 12)
            assert_close(compiled(x).numpy(), model(x).numpy(), op="conv2d", tol=F32)
    assert any("converts only with its sizes known" in r.getMessage() for r in caplog.records)
    reports = pbsdk_torch.reports()
    assert len(reports) == 2, reports  # batch 2 and batch 3, each compiled for its shape
    for r in reports:
        assert not r.fallback_ops and not r.dynamic_ops and not r.failed_partitions, r
        assert r.compiled_ops == r.graph_ops, r


def test_a_partition_that_fails_with_symbols_is_compiled_per_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    # Its ops convert with symbolic sizes, but the compile fails (here: injected, as a target without
    # dynamic shapes would): the partition is compiled for each shape met, nothing runs in torch.
    import pbsdk.frontends.torch.dynamo_backend as db

    real = db.CompiledPartition.__init__

    def refuse_symbolic(self: Any, name: str, sub: Any, *args: Any) -> None:
        if db.graph_is_symbolic(sub):
            raise db.UnsupportedError("injected: no dynamic shapes on this target")
        real(self, name, sub, *args)

    monkeypatch.setattr(db.CompiledPartition, "__init__", refuse_symbolic)
    torch.manual_seed(4)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 8)).eval()
    compiled = _compiled(model)
    with torch.no_grad():
        for n in (2, 3, 5, 3):
            x = torch.randn(n, 16)
            assert_close(compiled(x).numpy(), model(x).numpy(), op="mlp", tol=F32)
    _, symbolic = pbsdk_torch.reports()
    assert symbolic.per_shape_partitions == 1 and not symbolic.failed_partitions, symbolic
    assert symbolic.compiled_ops + symbolic.host_checks == symbolic.graph_ops, symbolic


def test_symbolic_sizes_as_sums_of_products() -> None:
    from torch._dynamo.source import ConstantSource
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    from pbsdk.core.dims import Dim
    from pbsdk.core.errors import UnsupportedError
    from pbsdk.frontends.torch.symbolic import as_dim, bound_sizes, concrete_sizes

    env = ShapeEnv()
    a, b = (env.create_symintnode(env.create_symbol(n, ConstantSource(name)), hint=n) for name, n in (("a", 5),
                                                                                                     ("b", 7)))
    sa, sb = str(a.node.expr), str(b.node.expr)
    assert as_dim(a) == Dim.parse(sa) and as_dim(2 * a + 3) == Dim.parse(f"2*{sa} + 3")
    assert as_dim(a + b) == Dim.parse(f"{sa} + {sb}") and as_dim(4) == 4
    assert as_dim(a * b) == Dim.parse(f"{sa}*{sb}") and as_dim(3 * a * a + b) == Dim.parse(f"3*{sa}*{sa} + {sb}")
    with pytest.raises(UnsupportedError, match="not a sum of products"):
        as_dim(a // 2)
    with concrete_sizes():  # the example values: would the node convert per shape?
        assert as_dim(2 * a + 3) == 13
    with bound_sizes({sa: 10}):  # a call's sizes: the partition converted for them
        assert as_dim(2 * a + 3) == 23
        with pytest.raises(UnsupportedError, match="no input gives"):
            as_dim(a + b)


def test_a_product_over_the_first_rows_of_a_buffer() -> None:
    # P @ V where V is the first s (dynamic) rows of each batch of a larger buffer (a static KV cache's keys
    # so far): the view's batches are 40 rows apart, not s. Bufferization cast it to the contraction's
    # identity layout, and the kernel read it as s rows apart (copy-strided-casts copies it instead).
    torch.manual_seed(6)
    cache = torch.randn(12, 40, 64)

    def fn(p: torch.Tensor, cache: torch.Tensor) -> torch.Tensor:
        return torch.bmm(p, (cache * 2.0)[:, : p.shape[1], :])

    compiled = _compiled(fn)
    with torch.no_grad():
        for s in (16, 9, 21):
            p = torch.randn(12, s, s)
            torch._dynamo.mark_dynamic(p, 1)
            torch._dynamo.mark_dynamic(p, 2)
            assert_close(compiled(p, cache).numpy(), fn(p, cache).numpy(), op="bmm", tol=F32)
    (report,) = pbsdk_torch.reports()
    assert not report.fallback_ops and report.per_shape_partitions == 0, report


def test_rows_written_at_a_dynamic_count_of_positions() -> None:
    # A prompt of s (dynamic) rows written into a 40-row static cache at its positions (index_copy -> index_put
    # of s indices): each row a slice at its run-time position (put_slices), one compile for every s.
    torch.manual_seed(7)
    cache = torch.randn(2, 3, 40, 8)

    def fn(x: torch.Tensor, cache: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(x.shape[2]) + start
        return cache.index_copy(2, positions, x)[:, :, : x.shape[2] + 3] * 2.0

    compiled = _compiled(fn)
    with torch.no_grad():
        for s, start in ((16, 0), (9, 4), (21, 19)):
            x = torch.randn(2, 3, s, 8)
            torch._dynamo.mark_dynamic(x, 2)
            assert_close(compiled(x, cache, torch.tensor(start)).numpy(), fn(x, cache, torch.tensor(start)).numpy(),
                         op="index_copy", tol=F32)
    (report,) = pbsdk_torch.reports()
    assert not report.fallback_ops and not report.dynamic_ops and report.per_shape_partitions == 0, report


def test_a_graph_compiled_per_shape_does_not_write_its_inputs_twice() -> None:
    # A graph with symbolic sizes that compiles only per shape (here every partition refuses symbols) and
    # writes an input (a counter, as a cache's length): the per-shape trace runs on fake copies, so the
    # counter moves once a call, as in eager.
    import pbsdk.frontends.torch.dynamo_backend as db

    def fn(x: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
        count.add_(x.shape[0])
        return torch.relu(x) * 2.0 + count

    compiled = torch.compile(fn, backend=lambda gm, ex: db.PerShape(gm, db.resolve("cpu", None, {"threads": 1}),
                                                                      db.TorchOptions(), set()))
    torch._dynamo.reset()
    got, want = torch.zeros(()), torch.zeros(())
    with torch.no_grad():
        for n in (3, 5, 3):
            x = torch.randn(n, 4)
            torch._dynamo.mark_dynamic(x, 0)
            assert_close(compiled(x, got).numpy(), fn(x, want).numpy(), op="relu", tol=F32)
    assert float(got) == float(want) == 11.0


def test_a_zero_dim_integer_input_of_a_kernel_with_symbolic_sizes(caplog: pytest.LogCaptureFixture) -> None:
    # The int64 scalar (a cache's length) is converted for the kernel, so the call takes the general path,
    # whose argument check must keep it 0-d (np.ascontiguousarray made it (1,), which the signature refused:
    # the partition then fell back to torch on its first call).
    def fn(x: torch.Tensor, n: torch.Tensor) -> torch.Tensor:
        return x * (n + 1) + torch.arange(x.shape[0])[:, None]

    compiled = _compiled(fn)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="pbsdk"):
        for rows in (3, 7, 4):
            x = torch.randn(rows, 8)
            torch._dynamo.mark_dynamic(x, 0)
            assert_close(compiled(x, torch.tensor(rows)).numpy(), fn(x, torch.tensor(rows)).numpy(), op="mul", tol=F32)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("pbsdk")]
    (report,) = pbsdk_torch.reports()
    assert not report.failed_partitions and not report.fallback_ops and report.per_shape_partitions == 0, report


@pytest.mark.parametrize("name", ["gpt2", pytest.param("llama", marks=pytest.mark.slow)])
def test_a_batch_and_a_length_both_dynamic_compile_once(name: str) -> None:
    # Both marked dynamic by Dynamo (new sizes each call): the (b, s, d) activations flattened for the
    # projections have b*s rows, a product of symbols, which compiles once (it was compiled per shape).
    model = _decoder(name).model if name == "llama" else _decoder(name).transformer
    compiled = _compiled(model)
    with torch.no_grad():
        for b, s in ((2, 5), (3, 7), (4, 9)):
            ids = torch.randint(0, 500, (b, s), generator=torch.Generator().manual_seed(b))
            assert_close(compiled(ids).last_hidden_state.numpy(), model(ids).last_hidden_state.numpy(),
                         op=name, tol=Tolerance(1e-4, 1e-4))
    *_, symbolic = pbsdk_torch.reports()
    assert symbolic.per_shape_partitions == 0 and not symbolic.fallback_ops and not symbolic.dynamic_ops, symbolic
    assert not symbolic.failed_partitions and symbolic.compiled_ops + symbolic.host_checks == symbolic.graph_ops, symbolic


def test_dynamic_true_with_a_float_attribute_compiles(caplog: pytest.LogCaptureFixture) -> None:
    # torch.compile(..., dynamic=True) makes dropout's probability a symbolic float; AOTAutograd then asks
    # Dynamo to trace again with it as a tensor (TensorifyScalarRestartAnalysis). That is Dynamo's to catch:
    # the backend caught it as a failure and the whole graph ran in torch.
    torch.manual_seed(8)
    model = nn.Sequential(nn.Linear(16, 32), nn.Dropout(0.1), nn.GELU(), nn.Linear(32, 8)).eval()
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    compiled = torch.compile(model, backend="pbsdk", dynamic=True, options={"compile_options": {"threads": 1}})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="pbsdk"):
        for n in (2, 5, 3):
            x = torch.randn(n, 16)
            assert_close(compiled(x).numpy(), model(x).numpy(), op="mlp", tol=F32)
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("pbsdk")]
    reports = pbsdk_torch.reports()
    assert reports and all(not r.failed_partitions and r.compiled_ops > 0 for r in reports), reports
