"""``pbsdk explain``: the plan chosen for each contraction of a program, its estimate, bound and why."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pbsdk.core.dims import Dim, is_dynamic
from pbsdk.core.ir.graph import Graph, Node
from pbsdk.core.options import Options, as_options
from pbsdk.core.plan.contraction import Contraction, ContractionPlan, plan_contraction
from pbsdk.core.plan.dynamic import DYNAMIC_EXTENT, DynamicContractionPlan, plan_dynamic_contraction
from pbsdk.core.spec import ChipSpec


def contraction_of(node: Node) -> Contraction | None:
    """The contraction a graph node performs (matmul directly; conv2d as an implicit GEMM per group)."""
    if node.op == "matmul":
        a, _b = node.inputs
        out = node.out.shape
        m, n = out[-2], out[-1]
        k = a.shape[-2] if node.attrs["transpose_a"] else a.shape[-1]
        batch = 1
        for d in out[:-2]:
            batch *= d
        return Contraction(m, n, k, batch, a.dtype, node.out.dtype)
    if node.op == "conv2d":
        x, w = node.inputs
        groups = node.attrs["groups"]
        nhwc = node.attrs["layout"] == "NHWC"
        o_shape = node.out.shape
        n_, oh, ow = (o_shape[0], o_shape[1], o_shape[2]) if nhwc else (o_shape[0], o_shape[2], o_shape[3])
        kh, kw, cg, o = w.shape if nhwc else (w.shape[2], w.shape[3], w.shape[1], w.shape[0])
        return Contraction(n_ * oh * ow, o // groups, cg * kh * kw, groups, x.dtype, node.out.dtype)
    return None


def _has_dynamic_sizes(node: Node) -> bool:
    return is_dynamic(node.out.shape) or any(is_dynamic(v.shape) for v in node.inputs)


def explain_graph(graph: Graph, spec: ChipSpec,
                  options: Options | Mapping[str, Any] | None = None) -> list[tuple[str, ContractionPlan]]:
    """The contraction plan of every node that runs as a contraction (not the convolutions that
    `explain_conv_routes` sends to a direct kernel). Those with sizes known only at call time are
    `explain_dynamic_contractions`'."""
    plans = []
    direct = {title for title, route in _conv_routes(graph, spec, options) if route.direct}
    for i, node in enumerate(graph.live_nodes()):
        if _has_dynamic_sizes(node):
            continue
        op = contraction_of(node)
        title = f"#{i} {node.op} {node.out.type}"
        if op is not None and title not in direct:
            plans.append((title, plan_contraction(spec, op, options)))
    return plans


def _conv_routes(graph: Graph, spec: ChipSpec, options: Options | Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    from pbsdk.core.ir.emit import direct_conv_route
    from pbsdk.core.options import parse_options

    opts = options if isinstance(options, Options) else parse_options(options)
    routes = []
    for i, node in enumerate(graph.live_nodes()):
        if node.op == "conv2d" and not _has_dynamic_sizes(node):
            route = direct_conv_route(node, spec, opts)
            if route is not None:
                routes.append((f"#{i} {node.op} {node.out.type}", route))
    return routes


def explain_conv_routes(graph: Graph, spec: ChipSpec, options: Options | Mapping[str, Any] | None = None) -> list[str]:
    """Per float convolution the planner routed (`pbsdk.core.plan.direct_conv.plan_conv_route`): a direct
    kernel or a contraction, and why."""
    return [f"{title}: {route.reason}" for title, route in _conv_routes(graph, spec, options)]


def explain_dynamic_contractions(graph: Graph, spec: ChipSpec,
                                 options: Options | Mapping[str, Any] | None = None) -> list[str]:
    """Per matmul with a size known only at call time (a `Dim`): how the cpu target's `pack-contractions`
    plans it (`plan_dynamic_contraction`: size buckets for a dynamic row count, one kernel planned at
    `DYNAMIC_EXTENT` for a dynamic n or k), or why it takes the generic lowering. A convolution with such
    sizes takes the generic lowering."""
    lines = []
    for i, node in enumerate(graph.live_nodes()):
        if node.op not in ("matmul", "conv2d") or not _has_dynamic_sizes(node):
            continue
        title = f"#{i} {node.op} {node.out.type}"
        if node.op == "conv2d":
            lines.append(f"{title}: sizes known at call time: generic lowering")
            continue
        a, out = node.inputs[0], node.out.shape
        m, n = out[-2], out[-1]
        k = a.shape[-2] if node.attrs["transpose_a"] else a.shape[-1]
        lead = out[:-2]
        if is_dynamic(lead) and len(node.inputs[1].shape) == 2 and not node.attrs["transpose_a"]:
            # (b, s, k) @ (k, n): the emitter flattens the leading sizes into the rows (b*s rows).
            title += f" (rows {' * '.join(map(str, out[:-1]))})"
            m, lead = _product(out[:-1]), ()
        elif is_dynamic(lead):
            lines.append(f"{title}: a batch known at call time: one packed kernel looping over the batch read at "
                         "run time where every operand has it, else the generic lowering")
            continue
        batch = 1
        for d in lead:
            batch *= d
        sizes = {"n": n, "k": k}
        plan = plan_dynamic_contraction(
            spec, n=DYNAMIC_EXTENT if isinstance(n, Dim) else n, k=DYNAMIC_EXTENT if isinstance(k, Dim) else k,
            batch=batch, dtype=a.dtype, options=options, m=None if isinstance(m, Dim) else m)
        shown = "x".join("?" if isinstance(d, Dim) else str(d) for d in (m, n, k))
        if plan is None:
            lines.append(f"{title}: {batch}x {shown}: a size bucket has no packed blocking: generic lowering")
            continue
        late = [f"{name} = {d} planned at {DYNAMIC_EXTENT}" for name, d in sizes.items() if isinstance(d, Dim)]
        if isinstance(m, Dim):
            late.insert(0, f"rows m = {m}")
        lines.append(format_dynamic_plan(title, plan, spec, options,
                                         what=f"{shown}, known at call time: {'; '.join(late)}"))
    return lines


def _product(sizes: Any) -> Any:
    """The product of ``sizes`` (ints and `Dim`s: a `Dim` where any is one)."""
    total: Any = 1
    for d in sizes:
        total = total * d
    return total


def format_dynamic_plan(title: str, plan: DynamicContractionPlan, spec: ChipSpec,
                        options: Options | Mapping[str, Any] | None = None, *, what: str | None = None) -> str:
    """A contraction with a dynamic row count: its size buckets (`pbsdk.core.plan.dynamic`), then each
    bucket's kernel as the static plan at the size it was planned for. ``what``: the sizes known at call
    time (default: the row count)."""
    opts = dataclasses.replace(as_options(options), transpose_gemm=False)
    what = what or f"?x{plan.n}x{plan.k} {plan.dtype}, rows known at call time"
    lines = [(f"{title}: {plan.batch}x {what}: "
              f"{len(plan.buckets)} kernel(s), one per size bucket, picked by the row count at run time")]
    for b in plan.buckets:
        span = f"{b.lo}" if b.hi == b.lo else f"{b.lo}..{b.hi}" if b.hi is not None else f"{b.lo}.."
        static = plan_contraction(spec, Contraction(b.at, plan.n, plan.k, plan.batch, plan.dtype), opts)
        lines.append(format_plan(f"  rows {span} (planned at {b.at})", static).replace("\n", "\n  "))
    return "\n".join(lines)


def format_plan(title: str, plan: ContractionPlan) -> str:
    op, u = plan.op, plan.compute
    lines = [f"{title}: {op.batch}x {op.m}x{op.n}x{op.k} {op.dtype}->{op.accumulator} ({op.flops / 1e9:.3f} GFLOP)",
             f"  compute tile   {u.kind} {u.name}: {u.m}x{u.n}x{u.k} on '{u.scope}'"
             + (f" ({op.dtype} operands widened to {plan.widened_to} as they are packed)" if plan.widened_to else "")]
    for t in plan.levels:
        extra = ", double-buffered" if t.double_buffered else ""
        extra += ", holds C" if t.holds_accumulator else ""
        lines.append(f"  tile @{t.level:<8} {t.m}x{t.n}x{t.k}  {t.footprint_bytes} B of {t.budget_bytes} B "
                     f"({t.managed}{extra}); {t.traffic_bytes / 1e6:.2f} MB from outside")
    if plan.parallel_level:
        lines.append(f"  parallel       {plan.parallel_ways}-way over '{plan.parallel_level}' on dims {', '.join(plan.parallel_dims)}")
    else:
        lines.append("  parallel       none (one unit)")
    if plan.parallel:
        split = " x ".join(f"{loop} in {parts} parts" for loop, parts in plan.parallel)
        lines.append(f"  forall         {split} (scf.forall over the outermost compute level)")
    lines.append(f"  loop order     {' > '.join(plan.loop_order)}")
    b = plan.blocking
    if b is not None and b.transposed:
        lines.append(f"  packing        computed transposed, C^T = B^T A^T (register tile {b.mr}x{b.nr} over the "
                     f"transposed output): A^T (the given B) read in place, B^T (the given A) {b.kc}x{b.nc} in "
                     f"{b.nc_level} packed through register transposes; {b.threads} thread(s) split along the "
                     f"transposed {b.split}")
    elif b is not None:
        bpack = (f"B {b.kc}x{b.nc} in {b.nc_level} (micro-panels {b.kc}x{b.nr} from {b.kc_level})" if b.pack_b
                 else "B read in place")
        apack = f"A {b.mc}x{b.kc} in {b.mc_level}" if b.pack_a else "A read in place"
        lines.append(f"  packing        {apack}, {bpack}; {b.threads} thread(s) split along {b.split}")
    terms = ", ".join(f"{name} {s * 1e3:.3f} ms" for name, s in plan.estimate.terms)
    lines.append(f"  estimate       {plan.estimate.seconds * 1e3:.3f} ms, bound by {plan.estimate.bound} ({terms})")
    lines.append("  why:")
    lines += [f"    - {r}" for r in plan.reasons]
    return "\n".join(lines)
