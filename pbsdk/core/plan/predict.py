"""The planner's predicted time of a whole program: what the kernel benchmark ranks against measurements.

- Each contraction (matmul, batch matmul, conv2d as an implicit GEMM) takes its plan's estimate
  (`plan_contraction`: the roofline of its tiles on the spec's levels, on the cores its parallel plan uses);
  a conv2d that runs as a direct kernel (`pbsdk.core.plan.direct_conv`) or a depthwise one channels last
  (`pbsdk.core.plan.window.depthwise_cycles`), its kernel's issue cycles at the clock.
- The other ops (elementwise, reductions, softmax/layernorm rows, layout ops) run as fused loops: as one
  group, they take the larger of (a) the bytes that cross the group's boundary — every value read from
  outside it (at its size before any broadcast) and every value written for a contraction or the caller,
  each once; intermediates stay in registers — at the bandwidth of the innermost level that holds them
  all (its ports on the cores used; a chip-wide level serves at most ``core_bandwidth_gbps`` a core), and
  (b) their vector instructions on the cores used, at the vector unit's issue rate: one per element of an
  elementwise op, `EXPANDED_OPS` for the functions ``math-approx`` expands into arithmetic, one per *input*
  element of a reduction.

Pure: graphs and specs in, a frozen `Prediction` out; no IR.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pbsdk.core.ir.graph import Graph, Value
from pbsdk.core.options import Options, as_options
from pbsdk.core.plan.contraction import holding_level, plan_contraction
from pbsdk.core.plan.explain import contraction_of
from pbsdk.core.spec import ChipSpec
from pbsdk.core.spec.models import dtype_bits

#: Ops that move no data of their own (views the fused loops read through).
_VIEWS = frozenset({"reshape", "broadcast", "input", "const"})
#: Vector instructions per element of the functions the ``math-approx`` pass expands into ``arith`` (its f32
#: sequences, bitcasts not counted; tests/unit/test_predict_ops.py counts them in the pass's output).
EXPANDED_OPS = {"exp": 32, "log": 40, "tanh": 25, "erf": 31}
#: Elementwise ops emitted as one of those plus a few arithmetic ops (`pbsdk.core.ir.emit._scalar_body`).
COMPOSED_OPS = {"sigmoid": EXPANDED_OPS["exp"] + 3, "gelu": EXPANDED_OPS["erf"] + 4,
                "gelu_tanh": EXPANDED_OPS["tanh"] + 7, "pow": EXPANDED_OPS["exp"] + EXPANDED_OPS["log"] + 1}


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
        direct = _direct_seconds(node, spec, opts) if node.op == "conv2d" else None
        if direct is not None:
            terms.append((f"#{i} {node.op} (direct)", direct))
        elif op is not None:
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
        vector_ops = sum(map(_vector_ops, loops))
        terms.append(("fused loops", _loops_seconds(spec, opts, sum(map(_bytes, crossing.values())), vector_ops)))
    return Prediction(sum(s for _, s in terms), tuple(terms))


def _vector_ops(node: Any) -> int:
    """Element operations of one fused-loop node (lanes not divided out): a reduction reads every input
    element once; an expanded function costs its sequence per element; anything else one per element."""
    if node.op.startswith("reduce_"):
        return int(node.inputs[0].type.size)
    return int(node.out.type.size) * {**EXPANDED_OPS, **COMPOSED_OPS}.get(node.op, 1)


def _direct_seconds(node: Any, spec: ChipSpec, opts: Options) -> float | None:
    """A convolution the planner runs as a direct kernel (`pbsdk.core.ir.emit.direct_conv_route`), or a
    depthwise one channels last (`pbsdk.core.ir.emit.depthwise_channels_last`): its issue cycles at the
    spec's clock, its output rows split over the cores used; None for any other."""
    from pbsdk.core.ir.emit import depthwise_channels_last, direct_conv_route

    if not spec.clock_ghz or spec.vector is None:
        return None
    nhwc = node.attrs["layout"] == "NHWC"
    n, rows = node.out.shape[0], node.out.shape[1] if nhwc else node.out.shape[2]
    cores = max(1, min(opts.threads or spec.compute[0].count, spec.compute[0].count, n * rows))
    route = direct_conv_route(node, spec, opts)
    if route is not None and route.direct and route.direct_cycles is not None:
        return _with_memory(node, spec, opts, route.direct_cycles / (spec.clock_ghz * 1e9) / cores)
    if node.out.dtype == "f32" and depthwise_channels_last(node, spec, opts):
        from pbsdk.core.plan.window import DepthwiseGeometry, depthwise_cycles, depthwise_tile

        x, w = node.inputs
        (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
        oh, ow = node.out.shape[1:3] if nhwc else node.out.shape[2:4]
        kh, kw = w.shape[:2] if nhwc else w.shape[2:4]
        c = x.shape[3] if nhwc else x.shape[1]
        g = DepthwiseGeometry(n, oh, ow, kh, kw, c, sh, sw, dh, dw)
        vec = spec.vector
        tile = depthwise_tile(vec.registers, vec.lanes("f32"), g)
        cycles = depthwise_cycles(g, tile, vec.fma_per_cycle, vec.loads_per_cycle)
        return _with_memory(node, spec, opts, cycles / (spec.clock_ghz * 1e9) / cores)
    return None


def _with_memory(node: Any, spec: ChipSpec, opts: Options, compute: float) -> float:
    """A direct convolution kernel's time from its ``compute`` time and its memory traffic, at the bandwidth
    of the innermost level holding its input and output (`_loops_seconds`' choice): the kernel reads the
    input and writes the output once (overlapping its FMAs: the larger of the two), after a padded input
    was copied into a fresh buffer (read and written once more, before)."""
    x, _ = node.inputs
    padded = any(p for pair in node.attrs["padding"] for p in pair)
    kernel_bytes = _bytes(x) + _bytes(node.out)
    copy_bytes = 2 * _bytes(x) if padded else 0
    return max(compute, _loops_seconds(spec, opts, kernel_bytes, 0)) + \
        (_loops_seconds(spec, opts, copy_bytes, 0) if copy_bytes else 0.0)


def _source(v: Value, producer: Mapping[int, Any]) -> Value:
    """``v`` through the views (reshape, broadcast) that produced it."""
    node = producer.get(v.id)
    while node is not None and node.op in ("reshape", "broadcast"):
        v = node.inputs[0]
        node = producer.get(v.id)
    return v


def _loops_seconds(spec: ChipSpec, opts: Options, nbytes: int, element_ops: int) -> float:
    cores = max(1, min(opts.threads or spec.compute[0].count, spec.compute[0].count))
    level = holding_level(spec, nbytes, cores)  # the innermost that holds the working set
    bandwidth = level.shared_bandwidth(cores) if level.scope == "device" else level.bandwidth_gbps * cores
    memory = nbytes / (bandwidth * 1e9)
    # the f32 peak is 2 FLOP per lane per FMA issued: half of it is the rate of element operations
    peak = {str(k): v for k, v in spec.peak_tflops.items()}.get("f32") or max(spec.peak_tflops.values(), default=1.0)
    compute = element_ops / (peak * 1e12 / 2 * cores / spec.compute[0].count)
    return max(memory, compute)

