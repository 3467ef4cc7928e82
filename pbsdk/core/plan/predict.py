"""The planner's predicted time of a whole program: what the kernel benchmark ranks against measurements.

- Each contraction (matmul, batch matmul, conv2d as an implicit GEMM) takes its plan's estimate
  (`plan_contraction`: the roofline of its tiles on the spec's levels, on the cores its parallel plan uses).
- The other ops (elementwise, reductions, softmax/layernorm rows, layout ops) run as fused loops: as one
  group, they take the larger of (a) the bytes that cross the group's boundary — every value read from
  outside it (at its size before any broadcast) and every value written for a contraction or the caller,
  each once; intermediates stay in registers — at the bandwidth of the innermost level that holds them
  all (its ports on the cores used), and (b) their elements, at one vector FMA per element on every core.

Pure: graphs and specs in, a frozen `Prediction` out; no IR.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pbsdk.core.ir.graph import Graph, Value
from pbsdk.core.options import Options, as_options
from pbsdk.core.plan.contraction import plan_contraction
from pbsdk.core.plan.explain import contraction_of
from pbsdk.core.spec import ChipSpec
from pbsdk.core.spec.models import dtype_bits

#: Ops that move no data of their own (views the fused loops read through).
_VIEWS = frozenset({"reshape", "broadcast", "input", "const"})


@dataclasses.dataclass(frozen=True)
class Prediction:
    """``seconds`` in all; ``terms``: (what, seconds) — one per contraction, one for the fused loops."""

    seconds: float
    terms: tuple[tuple[str, float], ...]


def _bytes(v: Value) -> int:
    return v.type.size * max(8, dtype_bits(v.dtype)) // 8


def predict_graph(graph: Graph, spec: ChipSpec, options: Options | Mapping[str, Any] | None = None) -> Prediction:
    """The predicted run time of ``graph`` on ``spec`` (see the module docstring)."""
    opts = as_options(options)
    nodes = graph.live_nodes()
    producer = {n.out.id: n for n in nodes}
    terms: list[tuple[str, float]] = []
    loops = [n for n in nodes if contraction_of(n) is None and n.op not in _VIEWS]
    for i, node in enumerate(nodes):
        op = contraction_of(node)
        if op is not None:
            terms.append((f"#{i} {node.op}", plan_contraction(spec, op, opts).estimate.seconds))
    if loops:
        in_loops = {n.out.id for n in loops}
        consumed_outside = {v.id for n in nodes if n.out.id not in in_loops for v in n.inputs}
        consumed_outside |= {v.id for v in graph.outputs}
        crossing: dict[int, Value] = {}
        for node in loops:
            for v in node.inputs:  # read from outside the loops: at its source's size (views are free)
                if v.id not in in_loops:
                    src = _source(v, producer)
                    crossing[src.id] = src
            if node.out.id in consumed_outside:  # written for a contraction or the caller
                crossing[node.out.id] = node.out
        elements = sum(n.out.type.size for n in loops)
        terms.append(("fused loops", _loops_seconds(spec, opts, sum(map(_bytes, crossing.values())), elements)))
    return Prediction(sum(s for _, s in terms), tuple(terms))


def _source(v: Value, producer: Mapping[int, Any]) -> Value:
    """``v`` through the views (reshape, broadcast) that produced it."""
    node = producer.get(v.id)
    while node is not None and node.op in ("reshape", "broadcast"):
        v = node.inputs[0]
        node = producer.get(v.id)
    return v


def _loops_seconds(spec: ChipSpec, opts: Options, nbytes: int, elements: int) -> float:
    cores = max(1, min(opts.threads or spec.compute[0].count, spec.compute[0].count))
    level = spec.memory[0]
    for lv in spec.memory[1:]:  # outermost to innermost: the innermost that holds the working set
        capacity = lv.size_bytes * (cores if lv.scope != "device" else 1)
        if nbytes <= capacity:
            level = lv
    ports = 1 if level.scope == "device" else cores
    memory = nbytes / (level.bandwidth_gbps * 1e9 * ports)
    peak = {str(k): v for k, v in spec.peak_tflops.items()}.get("f32") or max(spec.peak_tflops.values(), default=1.0)
    compute = elements / (peak * 1e12 / 2 * cores / spec.compute[0].count)  # one FMA (2 FLOP) per element
    return max(memory, compute)
