"""`pbsdk.core.ir.emit` builds every op form with the bindings' builders: each program of the corpus
(`emit_corpus`, every op method of the emitter) builds, verifies, prints as `emit_graph`'s text, and that
text parses back to the same module. Fused attention kernels are functions in front of the entry function."""

from __future__ import annotations

import re

import emit_corpus  # the corpus module next to this file (pytest puts this folder on sys.path)
import pytest
from mlir import ir

from pbsdk.core.errors import UnsupportedError
from pbsdk.core.ir.emit import build_graph, emit_graph
from pbsdk.core.ir.graph import Graph, TensorType

CASES = {case[0]: case for case in emit_corpus.cases()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_corpus_program_builds_verifies_and_round_trips(name: str) -> None:
    graph, kwargs = emit_corpus.traced(CASES[name])
    module = build_graph(graph, **kwargs)
    assert module.operation.verify()
    text = emit_graph(graph, **kwargs)
    assert text == str(module)
    with ir.Context() as ctx:
        assert str(ir.Module.parse(text, ctx)) == text
    # One public entry function, last; anything in front of it is a private fused-attention kernel.
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    assert len(funcs) == len(list(module.body.operations))
    *kernels, entry = funcs
    assert ir.StringAttr(entry.attributes["sym_name"]).value == "main"
    assert "llvm.emit_c_interface" in entry.attributes
    assert all(ir.StringAttr(k.attributes["sym_name"]).value.startswith("__pbsdk_attn") for k in kernels)
    assert bool(kernels) == name.endswith(("-intel-xeon-avx512", "-example-npu"))


def test_fused_kernels_are_called_on_the_operands_buffers() -> None:
    graph, kwargs = emit_corpus.traced(CASES["attention-two-intel-xeon-avx512"])
    text = emit_graph(graph, func_name="two", **kwargs)
    # (what the torch frontend counts as fused attentions)
    assert len(re.findall(r"func\.func private @__pbsdk_attn\d+\(", text)) == 2
    assert "call @__pbsdk_attn0(" in text and "call @__pbsdk_attn1(" in text
    assert "bufferization.to_buffer" in text and "bufferization.to_tensor" in text
    assert "func.func @two(" in text


def test_builds_in_the_given_context() -> None:
    graph, kwargs = emit_corpus.traced(CASES["softmax"])
    ctx = ir.Context()
    module = build_graph(graph, context=ctx, **kwargs)
    assert module.context is ctx


def test_a_graph_without_outputs_is_refused() -> None:
    graph = Graph()
    graph.add("input", [], TensorType((2,), "f32"))
    with pytest.raises(UnsupportedError):
        build_graph(graph)


def test_division_by_a_row_invariant_divisor_allows_a_reciprocal() -> None:
    """``x / s`` with ``s`` the same along the last axis (a softmax's row sum, a scalar) is ``arith.divf``
    with ``arcp`` (LLVM then divides once a row and multiplies); an elementwise ``x / y`` stays exact."""
    from pbsdk import ops
    from pbsdk.frontends.jit import trace

    def divides(text: str) -> list[str]:
        return [line.strip() for line in text.splitlines() if "arith.divf" in line]

    row = trace(lambda x: x / ops.sum(x, axis=-1, keepdims=True), (TensorType((8, 64), "f32"),))[0]
    assert [("fastmath<arcp>" in d) for d in divides(emit_graph(row))] == [True]
    scalar = trace(lambda x, s: x / s, (TensorType((8, 64), "f32"), TensorType((), "f32")))[0]
    assert [("fastmath<arcp>" in d) for d in divides(emit_graph(scalar))] == [True]
    both = trace(lambda x, y: x / y, (TensorType((8, 64), "f32"), TensorType((8, 64), "f32")))[0]
    per_column = trace(lambda x, y: x / y, (TensorType((8, 64), "f32"), TensorType((8, 1, 64), "f32")))[0]
    for graph in (both, per_column):
        assert [("fastmath" in d) for d in divides(emit_graph(graph))] == [False]
    softmax = trace(lambda x: ops.softmax(x, axis=-1), (TensorType((8, 64), "f32"),))[0]
    assert all("fastmath<arcp>" in d for d in divides(emit_graph(softmax))) and divides(emit_graph(softmax))


def test_a_softmax_shifts_by_a_max_that_skips_nan_and_a_max_reduction_does_not() -> None:
    from pbsdk import ops
    from pbsdk.frontends.jit import trace

    x = (TensorType((8, 64), "f32"),)
    for fn in (ops.softmax, ops.log_softmax):
        text = emit_graph(trace(lambda t, fn=fn: fn(t, axis=-1), x)[0])
        assert "arith.maxnumf" in text and "arith.maximumf" not in text
    text = emit_graph(trace(lambda t: ops.max(t, axis=-1), x)[0])
    assert "arith.maximumf" in text and "arith.maxnumf" not in text
