"""A static KV cache (``cache_implementation="static"``): its rows written in place by torch between the kernels
(`pbsdk.frontends.torch.inplace`), not copied whole each step; and a second model of the same class
compiled in the process (Dynamo then traces the prompt with a symbolic length, which compiles once).
The rewrite is checked on small FX graphs (no MLIR), `generate()` against eager's tokens."""

from __future__ import annotations

import copy
import logging
from typing import Any

import pytest
import torch
import torch.fx

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.frontends.torch.convert import op_name
from pbsdk.frontends.torch.inplace import write_in_place

aten = torch.ops.aten


def _graph(build: Any) -> torch.fx.GraphModule:
    g = torch.fx.Graph()
    build(g)
    return torch.fx.GraphModule(torch.nn.Module(), g)


def _ops(gm: torch.fx.GraphModule) -> list[str]:
    return [op_name(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def _cache_update(g: torch.fx.Graph, *, also_read: bool = False, accumulate: bool = False) -> None:
    """``new = index_put(cache, [None, pos], rows); out = new * 2; copy_(cache, new)`` (AOTAutograd's form of
    ``cache.index_copy_(1, pos, rows)`` with the input mutation kept in the graph)."""
    cache, pos, rows = g.placeholder("cache"), g.placeholder("pos"), g.placeholder("rows")
    args: tuple[Any, ...] = (cache, [None, pos], rows) + ((True,) if accumulate else ())
    new = g.call_function(aten.index_put.default, args)
    out = g.call_function(aten.mul.Tensor, (new, 2.0))
    if also_read:
        out = g.call_function(aten.add.Tensor, (out, g.call_function(aten.sum.default, (cache,))))
    g.call_function(aten.copy_.default, (cache, new))
    g.output((out,))


def test_a_cache_update_becomes_a_write_in_place() -> None:
    gm = _graph(_cache_update)
    writes = write_in_place(gm)
    assert (writes.written, writes.in_place, writes.copies) == (frozenset({"cache"}), 1, 0)
    assert _ops(gm) == ["aten.index_put_.default", "aten.mul.Tensor"]
    (write,) = [n for n in gm.graph.nodes if n.op == "call_function" and n.target == aten.index_put_.default]
    assert [u.target for u in write.users] == [aten.mul.Tensor]  # the readers read the written input
    cache, pos, rows = torch.zeros(2, 5), torch.tensor([3]), torch.ones(2, 1)
    (out,) = gm(cache, pos, rows)
    assert cache[:, 3].tolist() == [1.0, 1.0] and out[:, 3].tolist() == [2.0, 2.0] and float(cache.sum()) == 2.0


@pytest.mark.parametrize("what", ["old value read", "accumulate"])
def test_updates_that_cannot_be_written_early_stay_copies(what: str) -> None:
    # The old cache read by another op (writing early would change what it reads), or index_put with
    # accumulate (a sum, not a write): the copy_ stays at the graph's end, where torch runs it.
    gm = _graph(lambda g: _cache_update(g, also_read=what == "old value read", accumulate=what == "accumulate"))
    writes = write_in_place(gm)
    assert (writes.written, writes.in_place, writes.copies) == (frozenset({"cache"}), 0, 1)
    assert "aten.index_put.default" in _ops(gm) and _ops(gm)[-1] == "aten.copy_.default"


def _gpt2() -> Any:
    from pbsdk.testing.torchvision import import_transformers

    try:
        tf = import_transformers()
    except ImportError as exc:
        pytest.skip(f"transformers: {exc}")
    torch.manual_seed(0)
    return tf.GPT2LMHeadModel(tf.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=500)).eval()


def _generate(model: Any, ids: torch.Tensor, new: int) -> torch.Tensor:
    return model.generate(ids, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0,
                          attention_mask=torch.ones_like(ids), cache_implementation="static")


def test_generate_with_a_static_cache_writes_its_rows_in_place(caplog: pytest.LogCaptureFixture) -> None:
    base = _gpt2()
    ids = torch.randint(0, 500, (2, 8), generator=torch.Generator().manual_seed(1))
    model = copy.deepcopy(base)
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    model.forward = torch.compile(model.forward, backend="pbsdk", options={"compile_options": {"threads": 1}})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="pbsdk"):
        want = _generate(base, ids, 6)
        assert torch.equal(_generate(model, ids, 6), want)
        assert torch.equal(_generate(model, ids, 6), want)  # the initialised cache: the prompt written in place
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("pbsdk")]
    reports = pbsdk_torch.reports()
    for r in reports:
        assert not r.fallback_ops and not r.failed_partitions and not r.dynamic_ops, r
    # The decode step writes each layer's key and value rows in place (and the cache's length counters).
    assert any(r.input_writes >= 4 and r.compiled_ops + r.host_checks + r.input_writes == r.graph_ops
               for r in reports), reports


def test_a_second_model_of_the_class_compiles_its_prompt_once(caplog: pytest.LogCaptureFixture) -> None:
    # A model compiled after another of its class (here by backend "eager") meets Dynamo's memory of the
    # sizes it saw: the prompt is traced with a symbolic length. Before, that graph failed to compile (an
    # index_put of a symbolic count), its per-shape trace wrote the cache's length once more, and the user's
    # generate() raised an IndexError; then a view of a product read its batches at the wrong stride.
    base = _gpt2()
    ids = torch.randint(0, 500, (2, 8), generator=torch.Generator().manual_seed(2))
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    first, second = copy.deepcopy(base), copy.deepcopy(base)
    first.forward = torch.compile(first.forward, backend="eager")
    second.forward = torch.compile(second.forward, backend="pbsdk", options={"compile_options": {"threads": 1}})
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="pbsdk"):
        want = _generate(base, ids, 5)
        for model in (first, second):
            for new in (5, 1, 5):
                assert torch.equal(_generate(model, ids, new), want[:, : ids.shape[1] + new])
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name.startswith("pbsdk")]
    for r in pbsdk_torch.reports():
        assert not r.fallback_ops and not r.failed_partitions, r


def _add_then_read(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    w = x[0].t()  # 16 x 6
    before = (c @ w).sum()
    c.add_(x[:, :1])
    return c @ w + before


def _write_after_a_copy(x: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    old = c.clone()
    c.index_copy_(1, torch.tensor([4]), x[:, :1])
    return (c - old).sum(1)


@pytest.mark.parametrize("fn", [_add_then_read, _write_after_a_copy])
def test_input_writes_whose_old_value_is_read(fn: Any) -> None:
    # The old value is read (before the add_, or through a clone): the write is not moved; the copy_ at the
    # graph's end writes the input, as AOTAutograd's wrapper did.
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    compiled = torch.compile(fn, backend="pbsdk", options={"compile_options": {"threads": 1}})
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for _ in range(2):
            x, c = torch.randn(3, 6, 16, generator=gen), torch.randn(3, 8, 16, generator=gen)
            mine = c.clone()
            torch.testing.assert_close(compiled(x, mine), fn(x, c), rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(mine, c)
    (report,) = pbsdk_torch.reports()
    assert report.input_writes == 1 and not report.fallback_ops and not report.failed_partitions, report
