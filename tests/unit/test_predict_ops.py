"""The program prediction's fused loops: what each op costs in vector instructions, checked against the
code `math-approx` really emits, and the main-memory share of one core."""

from __future__ import annotations

import collections

import numpy as np
import pytest

from pbsdk import ops
from pbsdk.core.plan import predict
from pbsdk.core.spec import load_spec
from pbsdk.core.spec.loader import validate_data


@pytest.mark.parametrize("name", sorted(predict.EXPANDED_OPS))
def test_expanded_functions_cost_what_math_approx_emits(name: str) -> None:
    from mlir import ir
    from mlir.dialects import func, math

    from pbsdk.core.passes.math_approx import MathApprox

    with ir.Context(), ir.Location.unknown():
        module = ir.Module.create()
        vt = ir.VectorType.get([16], ir.F32Type.get())
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("f", ir.FunctionType.get([vt], [vt]))
            with ir.InsertionPoint(f.add_entry_block()):
                func.ReturnOp([getattr(math, name)(f.arguments[0])])
        MathApprox().apply(module)
        counts = collections.Counter(op.operation.name for op in f.entry_block.operations)
    free = counts.pop("arith.constant", 0) + counts.pop("func.return", 0) + counts.pop("arith.bitcast", 0)
    assert free > 0 and not any(n.startswith("math.") for n in counts), counts
    assert sum(counts.values()) == predict.EXPANDED_OPS[name], counts


def _graph(fn, *shapes):
    from pbsdk.frontends.jit import trace
    from pbsdk.frontends.tracing import input_type

    return trace(fn, tuple(input_type(np.zeros(s, np.float32), i) for i, s in enumerate(shapes)))[0]


def test_fused_loops_count_expansions_and_reduction_inputs() -> None:
    host = load_spec("amd/zen4")
    loops = lambda g: dict(predict.predict_graph(g, host, {"threads": 1}).terms)["fused loops"]
    add, exp, total = (_graph(f, (256, 4096)) for f in (lambda a: ops.add(a, 1.0), ops.exp, lambda a: ops.sum(a, 1)))
    # exp is compute-bound on one core: its expansion per element; add and sum are bound by the bytes
    assert loops(exp) == pytest.approx(256 * 4096 * 32 / (16 * host.vector.fma_per_cycle * host.clock_ghz * 1e9), rel=1e-6)
    assert loops(exp) > 5 * loops(add) and loops(total) < loops(add)  # sum reads as much, writes 1/4096


def test_one_core_draws_its_share_of_main_memory() -> None:
    data = load_spec("amd/zen4").model_dump(mode="json")
    data["memory"][0]["core_bandwidth_gbps"] = 5.0
    chip = validate_data(data, "t")
    g = _graph(lambda a: ops.add(a, 1.0), (4096, 4096))
    one, two = (predict.predict_graph(g, chip, {"threads": t}).seconds for t in (1, 2))
    assert one == pytest.approx(2 * 64 * 2**20 / 5e9, rel=1e-6) and two == pytest.approx(one / 2, rel=1e-6)
    both = load_spec("amd/zen4")  # no per-core figure: one core may draw all of it
    assert predict.predict_graph(g, both, {"threads": 1}).seconds == predict.predict_graph(g, both, {"threads": 2}).seconds
