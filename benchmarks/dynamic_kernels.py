"""A kernel compiled once for a dynamic row count against the static kernel compiled for each size (issue #31
item 2: "a dynamic-shape kernel on a size it has not seen is correct and within 1.2x of the static kernel
compiled for that size").

Per op (a matmul with a bias + ReLU epilogue at GPT-2's widths, a layer normalisation over 768 rows of a
dynamic count, a decoder step's attention over a dynamic key length, unfused from MLIR and fused from pbsdk's
graph: `pbsdk.ops.attention` on a (1, 8, s0, 64) cache, one query) the dynamic kernel is compiled once; for
each size the static kernel is compiled for exactly that size,
both are checked against each other, then timed in one process: per round each contender runs a block of
calls, interleaved, timed with ``time.thread_time`` (CPU time of this thread: the kernels run at 1 thread, so
other processes' load does not count); the report gives the median over rounds of the per-call time and the
ratio dynamic / static, for two ways of calling: ``Kernel.__call__`` (numpy in, fresh outputs, the dynamic
kernel binding its sizes in Python) and ``raw``, the executable's ``run_pointers`` on prepared buffers (what
the torch frontend's per-call path calls): the kernels alone. Run::

    PBSDK_CACHE_DIR=/tmp/cache .venv/bin/python benchmarks/dynamic_kernels.py --md benchmarks/results/dynamic_kernels.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from pbsdk.bench import cpu_model

#: ``{M}`` is the row count (``?`` for the dynamic kernel), ``{E}`` the operands of a ``tensor.empty`` of it.
MATMUL = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @f(%x: tensor<{M}x{K}xf32>, %w: tensor<{K}x{N}xf32>, %bias: tensor<{N}xf32>) -> tensor<{M}x{N}xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %x, %c0 : tensor<{M}x{K}xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty({E}) : tensor<{M}x{N}xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<{M}x{N}xf32>) -> tensor<{M}x{N}xf32>
  %p = linalg.matmul ins(%x, %w : tensor<{M}x{K}xf32>, tensor<{K}x{N}xf32>) outs(%f : tensor<{M}x{N}xf32>) -> tensor<{M}x{N}xf32>
  %e2 = tensor.empty({E}) : tensor<{M}x{N}xf32>
  %r = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%p, %bias : tensor<{M}x{N}xf32>, tensor<{N}xf32>) outs(%e2 : tensor<{M}x{N}xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %zero = arith.constant 0.0 : f32
    %y = arith.maximumf %s, %zero : f32
    linalg.yield %y : f32
  } -> tensor<{M}x{N}xf32>
  return %r : tensor<{M}x{N}xf32>
}
"""

LAYERNORM = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @f(%x: tensor<{M}x768xf32>) -> tensor<{M}x768xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %x, %c0 : tensor<{M}x768xf32>
  %z = arith.constant 0.0 : f32
  %inv = arith.constant 0.00130208337 : f32
  %eps = arith.constant 1.0e-5 : f32
  %e1 = tensor.empty({E}) : tensor<{M}xf32>
  %f1 = linalg.fill ins(%z : f32) outs(%e1 : tensor<{M}xf32>) -> tensor<{M}xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<{M}x768xf32>) outs(%f1 : tensor<{M}xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  } -> tensor<{M}xf32>
  %e2 = tensor.empty({E}) : tensor<{M}x768xf32>
  %c = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %sum : tensor<{M}x768xf32>, tensor<{M}xf32>) outs(%e2 : tensor<{M}x768xf32>) {
  ^bb0(%a: f32, %s: f32, %o: f32):
    %mean = arith.mulf %s, %inv : f32
    %d = arith.subf %a, %mean : f32
    linalg.yield %d : f32
  } -> tensor<{M}x768xf32>
  %f2 = linalg.fill ins(%z : f32) outs(%e1 : tensor<{M}xf32>) -> tensor<{M}xf32>
  %ss = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%c : tensor<{M}x768xf32>) outs(%f2 : tensor<{M}xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %sq = arith.mulf %a, %a : f32
    %s = arith.addf %sq, %acc : f32
    linalg.yield %s : f32
  } -> tensor<{M}xf32>
  %e3 = tensor.empty({E}) : tensor<{M}x768xf32>
  %y = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c, %ss : tensor<{M}x768xf32>, tensor<{M}xf32>) outs(%e3 : tensor<{M}x768xf32>) {
  ^bb0(%a: f32, %s: f32, %o: f32):
    %var = arith.mulf %s, %inv : f32
    %ve = arith.addf %var, %eps : f32
    %r = math.rsqrt %ve : f32
    %v = arith.mulf %a, %r : f32
    linalg.yield %v : f32
  } -> tensor<{M}x768xf32>
  return %y : tensor<{M}x768xf32>
}
"""


#: A decoder step's attention, unfused (MLIR input is not fused: that happens on pbsdk's graph), over a key
#: length ``{M}``: 8 heads of 64, one query.
ATTENTION = """#id = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#row = affine_map<(d0, d1, d2) -> (d0, d1)>
func.func @f(%q: tensor<8x1x64xf32>, %kt: tensor<8x64x{M}xf32>, %v: tensor<8x{M}x64xf32>) -> tensor<8x1x64xf32> {
  %c2 = arith.constant 2 : index
  %s = tensor.dim %kt, %c2 : tensor<8x64x{M}xf32>
  %z = arith.constant 0.0 : f32
  %ninf = arith.constant -3.4e38 : f32
  %e = tensor.empty({E}) : tensor<8x1x{M}xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<8x1x{M}xf32>) -> tensor<8x1x{M}xf32>
  %sc = linalg.batch_matmul ins(%q, %kt : tensor<8x1x64xf32>, tensor<8x64x{M}xf32>) outs(%f : tensor<8x1x{M}xf32>) -> tensor<8x1x{M}xf32>
  %em = tensor.empty() : tensor<8x1xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%em : tensor<8x1xf32>) -> tensor<8x1xf32>
  %mx = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%sc : tensor<8x1x{M}xf32>) outs(%fm : tensor<8x1xf32>) {
  ^bb0(%a: f32, %m: f32):
    %y = arith.maximumf %a, %m : f32
    linalg.yield %y : f32
  } -> tensor<8x1xf32>
  %ex = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%sc, %mx : tensor<8x1x{M}xf32>, tensor<8x1xf32>) outs(%e : tensor<8x1x{M}xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %d = arith.subf %a, %m : f32
    %y = math.exp %d : f32
    linalg.yield %y : f32
  } -> tensor<8x1x{M}xf32>
  %fs = linalg.fill ins(%z : f32) outs(%em : tensor<8x1xf32>) -> tensor<8x1xf32>
  %sm = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%ex : tensor<8x1x{M}xf32>) outs(%fs : tensor<8x1xf32>) {
  ^bb0(%a: f32, %m: f32):
    %y = arith.addf %a, %m : f32
    linalg.yield %y : f32
  } -> tensor<8x1xf32>
  %p = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%ex, %sm : tensor<8x1x{M}xf32>, tensor<8x1xf32>) outs(%e : tensor<8x1x{M}xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %y = arith.divf %a, %m : f32
    linalg.yield %y : f32
  } -> tensor<8x1x{M}xf32>
  %eo = tensor.empty() : tensor<8x1x64xf32>
  %fo = linalg.fill ins(%z : f32) outs(%eo : tensor<8x1x64xf32>) -> tensor<8x1x64xf32>
  %o = linalg.batch_matmul ins(%p, %v : tensor<8x1x{M}xf32>, tensor<8x{M}x64xf32>) outs(%fo : tensor<8x1x64xf32>) -> tensor<8x1x64xf32>
  return %o : tensor<8x1x64xf32>
}
"""


def text(template: str, m: int | None, **sizes: int) -> str:
    """The op's module for ``m`` rows (None: dynamic)."""
    empty = "%s" if template is ATTENTION else "%m"
    out = template.replace("{M}", "?" if m is None else str(m)).replace("{E}", empty if m is None else "")
    for k, v in sizes.items():
        out = out.replace("{" + k + "}", str(v))
    return out


#: The fused attention is traced from `pbsdk.ops.attention` (the recogniser fuses pbsdk graphs, not MLIR input).
FUSED_ATTENTION = "fused attention"

OPS: dict[str, tuple[str, dict[str, int]]] = {
    "matmul+bias+relu 768x768": (MATMUL, {"K": 768, "N": 768}),
    "matmul+bias+relu 768x3072": (MATMUL, {"K": 768, "N": 3072}),
    "layernorm 768": (LAYERNORM, {}),
    "attention 8x1x64, key length m": (ATTENTION, {}),
    "fused attention 8x1x64, key length m": (FUSED_ATTENTION, {}),
}


def compile_fused_attention(m: int | None, options: dict[str, Any]) -> Any:
    """`pbsdk.ops.attention` of one query over ``m`` keys (None: a symbolic key length), 8 heads of 64, compiled
    for the host; checks that the attention was fused."""
    from pbsdk import ops
    from pbsdk.core.compiler import compile_text, resolve
    from pbsdk.core.dims import Dim
    from pbsdk.core.ir.emit import emit_program
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.core.runtime.kernel import Kernel
    from pbsdk.frontends.jit import trace

    sk = Dim.parse("s0") if m is None else m
    graph, _ = trace(lambda q, k, v: ops.attention(q, k, v),
                     tuple(TensorType(s, "f32") for s in ((1, 8, 1, 64), (1, 8, sk, 64), (1, 8, sk, 64))))
    request = resolve("cpu", None, options)
    program = emit_program(graph, spec=request.spec, options=request.options, forms=request.target.attention_forms)
    assert "func.func private @__pbsdk_attn0(" in program.text, "the attention was not fused"
    artifact = compile_text(program.text, request, constants=program.constants)
    return Kernel(artifact, request.target.load(artifact, request.spec), name=artifact.entry)


def compile_op(op: str, m: int | None, options: dict[str, Any]) -> Any:
    """The kernel of ``op`` for ``m`` rows (None: dynamic)."""
    import pbsdk

    template, dims = OPS[op]
    if template is FUSED_ATTENTION:
        return compile_fused_attention(m, options)
    return pbsdk.compile_mlir(text(template, m, **dims), options=options)


def operands(op: str, m: int, rng: np.random.Generator) -> list[np.ndarray]:
    template, sizes = OPS[op]
    if template is LAYERNORM:
        return [rng.standard_normal((m, 768)).astype(np.float32)]
    if template is ATTENTION:
        return [rng.standard_normal(s).astype(np.float32) for s in ((8, 1, 64), (8, 64, m), (8, m, 64))]
    if template is FUSED_ATTENTION:
        return [rng.standard_normal(s).astype(np.float32) for s in ((1, 8, 1, 64), (1, 8, m, 64), (1, 8, m, 64))]
    k, n = sizes["K"], sizes["N"]
    return [rng.standard_normal(s).astype(np.float32) for s in ((m, k), (k, n), (n,))]


def measure(ops: list[str], sizes: list[int], rounds: int, budget: float) -> dict[str, Any]:
    options: dict[str, Any] = {"threads": 1}
    rng = np.random.default_rng(0)
    rows = []
    for op in ops:
        t0 = time.perf_counter()
        dynamic = compile_op(op, None, options)
        compile_dynamic = time.perf_counter() - t0
        for m in sizes:
            static = compile_op(op, m, options)
            args = operands(op, m, rng)
            np.testing.assert_allclose(dynamic(*args), static(*args), rtol=1e-4, atol=1e-4)
            # Calls per block: about `budget` seconds of the static kernel.
            t0 = time.thread_time()
            static(*args)
            once = max(time.thread_time() - t0, 1e-6)
            calls = max(1, min(2000, int(budget / once)))
            shapes, size_buffer = dynamic.sizes(args)
            outs = [np.empty(shape, np.float32) for shape in shapes]
            raw = {"dynamic raw": (dynamic, [a.ctypes.data for a in (*args, *outs, size_buffer)]),
                   "static raw": (static, [a.ctypes.data for a in (*args, *outs)])}

            per: dict[str, list[float]] = {"dynamic": [], "static": [], "dynamic raw": [], "static raw": []}
            for _ in range(rounds):
                for name, times in per.items():
                    kernel, pointers = raw.get(name, (dynamic if name == "dynamic" else static, None))
                    t0 = time.thread_time()
                    if pointers is not None:
                        for _ in range(calls):
                            kernel.executable.run_pointers(pointers)
                    else:
                        for _ in range(calls):
                            kernel(*args)
                    times.append((time.thread_time() - t0) / calls * 1e6)
            med = {n: statistics.median(v) for n, v in per.items()}
            row: dict[str, Any] = {"op": op, "m": int(m), "calls": calls, "us": med, "compile_dynamic_s": compile_dynamic}
            for kind in ("", " raw"):
                ratios = [d / s for d, s in zip(per[f"dynamic{kind}"], per[f"static{kind}"])]
                row[f"ratio{kind}"] = (med[f"dynamic{kind}"] / med[f"static{kind}"], min(ratios), max(ratios))
            rows.append(row)
            print(f"{op} m={m}: call {med['dynamic']:.1f} / {med['static']:.1f} us = {row['ratio'][0]:.3f}; "
                  f"raw {med['dynamic raw']:.1f} / {med['static raw']:.1f} us = {row['ratio raw'][0]:.3f} "
                  f"({row['ratio raw'][1]:.3f}-{row['ratio raw'][2]:.3f})", flush=True)
    return {"cpu": cpu_model(), "rounds": rounds, "threads": 1, "rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [(f"CPU: {result['cpu']}. 1 thread, f32; thread CPU time per call, median of {result['rounds']} "
              "interleaved rounds; ratio = dynamic / static (per-round ratios' min-max)."), "",
             "| op | rows | raw dynamic us | raw static us | raw ratio (min-max) | call ratio (min-max) |",
             "|---|---|---|---|---|---|"]
    for r in result["rows"]:
        us, raw, call = r["us"], r["ratio raw"], r["ratio"]
        lines.append(f"| {r['op']} | {r['m']} | {us['dynamic raw']:.1f} | {us['static raw']:.1f} | "
                     f"{raw[0]:.3f} ({raw[1]:.3f}-{raw[2]:.3f}) | {call[0]:.3f} ({call[1]:.3f}-{call[2]:.3f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", nargs="*", default=list(OPS))
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 5, 17, 33, 200, 1000, 4096])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.05, help="seconds per block of calls")
    parser.add_argument("--json", help="write the result here (JSON)")
    parser.add_argument("--md", help="write the markdown table here")
    args = parser.parse_args()
    result = measure(args.ops, args.sizes, args.rounds, args.budget)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    out = table(result)
    if args.md:
        Path(args.md).write_text(out)
    print(out)


if __name__ == "__main__":
    main()
