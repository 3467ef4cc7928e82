"""JAX shape polymorphism (issue #31 item 2): ``pbsdk.jax.jit(fn, polymorphic_shapes=...)``, compiled once for
every size, against ``pbsdk.jax.jit(fn)`` compiled for each size (the static kernels).

Per function (an MLP layer ``gelu(x @ w + b)`` at GPT-2's widths over a polymorphic row count; an attention
``softmax(q @ kᵀ / 8) @ v`` of 8 heads, one query, over a polymorphic key length) the polymorphic function is
traced and compiled once; at each size the static one compiles for that size, both are checked against
``jax.jit``, then timed in one process: per round each contender runs a block of calls, interleaved, timed
with ``time.thread_time`` (CPU time of this thread; pbsdk's kernels run at 1 thread). Two ways of calling:
``call``, the whole ``pbsdk.jax.jit`` function (numpy outputs: ``output="numpy"``), and ``kernel``, the
functions' one pbsdk kernel run by its executable's ``run_pointers`` on prepared buffers (the kernels alone).
The report gives the median over rounds of the time per call and the ratio polymorphic / static, with the
per-round ratios' min-max. Run::

    PBSDK_CACHE_DIR=/tmp/cache PYTHONPATH=. .venv/bin/python benchmarks/jax_polymorphic.py --json ... --md ...
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import numpy as np

import pbsdk.jax
from pbsdk.bench import cpu_model
from pbsdk.frontends.jax.function import KernelStage


def mlp(x: Any, w: Any, b: Any) -> Any:
    return jax.nn.gelu(x @ w + b)


def attention(q: Any, k: Any, v: Any) -> Any:
    return jax.nn.softmax(q @ k.swapaxes(-1, -2) / 8.0, axis=-1) @ v


#: name -> (function, polymorphic_shapes, arguments at size n).
CASES: dict[str, tuple[Callable[..., Any], list[Any], Callable[[int, np.random.Generator], tuple[Any, ...]]]] = {
    "mlp 768x3072 + bias + gelu (rows)": (
        mlp, ["(b, 768)", None, None],
        lambda n, r: (r.standard_normal((n, 768), np.float32), r.standard_normal((768, 3072), np.float32) * 0.03,
                      r.standard_normal(3072, np.float32))),
    "attention 8 heads x 64, 1 query (key length)": (
        attention, [None, "(8, s, 64)", "(8, s, 64)"],
        lambda n, r: (r.standard_normal((8, 1, 64), np.float32), r.standard_normal((8, n, 64), np.float32),
                      r.standard_normal((8, n, 64), np.float32))),
}


def _kernel_pointers(f: Any, args: tuple[Any, ...]) -> tuple[Any, list[int], list[np.ndarray]] | None:
    """The one kernel of ``f``'s plan for ``args`` and the pointers of prepared buffers for it (None when the
    plan is not exactly one kernel stage on the function's own inputs)."""
    plan = f._plan(args, {})
    if plan is None or len(plan[0].stages) != 1 or not isinstance(plan[0].stages[0], KernelStage):
        return None
    stage = plan[0].stages[0]
    env = dict(zip(plan[0].program.inputs, plan[2]))
    arrays = [np.ascontiguousarray(env[r], dtype=dt) for r, dt in zip(stage.inputs, stage.in_dtypes)]
    kernel = stage.kernel
    shapes, sizes = kernel.sizes(arrays)
    outs = [np.empty(s, np.float32) for s in shapes]
    keep = [*arrays, *outs] + ([] if sizes is None else [sizes])
    return kernel, [a.ctypes.data for a in keep], keep


def measure(names: list[str], sizes: list[int], rounds: int, budget: float) -> dict[str, Any]:
    options = {"threads": 1}
    rng = np.random.default_rng(0)
    rows = []
    for name in names:
        fn, spec, make = CASES[name]
        poly = pbsdk.jax.jit(fn, polymorphic_shapes=spec, options=options, output="numpy")
        for n in sizes:
            args = make(n, rng)
            static = pbsdk.jax.jit(fn, options=options, output="numpy")
            t0 = time.perf_counter()
            got = poly(*args)
            first = time.perf_counter() - t0
            want = np.asarray(jax.jit(fn)(*args))
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(static(*args), want, rtol=1e-4, atol=1e-4)
            t0 = time.thread_time()
            static(*args)
            calls = max(1, min(5000, int(budget / max(time.thread_time() - t0, 1e-6))))
            raw = {"poly kernel": _kernel_pointers(poly, args), "static kernel": _kernel_pointers(static, args)}
            contenders: dict[str, Callable[[], Any]] = {"poly": lambda p=poly, a=args: p(*a),
                                                        "static": lambda s=static, a=args: s(*a)}
            if all(raw.values()):
                for key, (kernel, pointers, _) in raw.items():  # type: ignore[misc]
                    contenders[key] = lambda k=kernel, p=pointers: k.executable.run_pointers(p)
            per: dict[str, list[float]] = {k: [] for k in contenders}
            for _ in range(rounds):
                for key, run in contenders.items():
                    t0 = time.thread_time()
                    for _ in range(calls):
                        run()
                    per[key].append((time.thread_time() - t0) / calls * 1e6)
            med = {k: statistics.median(v) for k, v in per.items()}
            row: dict[str, Any] = {"case": name, "size": n, "calls": calls, "us": med, "first_call_s": first,
                                   "load": os.getloadavg()}
            for kind in ("", " kernel"):
                if f"poly{kind}" in per:
                    ratios = [d / s for d, s in zip(per[f"poly{kind}"], per[f"static{kind}"])]
                    row[f"ratio{kind}"] = (med[f"poly{kind}"] / med[f"static{kind}"], min(ratios), max(ratios))
            rows.append(row)
            print(f"{name} n={n}: call {med['poly']:.1f} / {med['static']:.1f} us = {row['ratio'][0]:.3f}"
                  + (f"; kernel {med['poly kernel']:.1f} / {med['static kernel']:.1f} us = "
                     f"{row['ratio kernel'][0]:.3f} ({row['ratio kernel'][1]:.3f}-{row['ratio kernel'][2]:.3f})"
                     if "ratio kernel" in row else "") + f"; load {row['load'][0]:.1f}", flush=True)
        reports = [r for r in pbsdk.jax.reports() if r.function == fn.__name__ and r.symbols]
        assert len(reports) == 1, f"{name}: the polymorphic function compiled {len(reports)} times"
        rows.append({"case": name, "compile_s": reports[0].seconds, "kernels": reports[0].kernels})
    return {"cpu": cpu_model(), "rounds": rounds, "threads": 1, "rows": rows}


def table(result: dict[str, Any]) -> str:
    lines = [(f"CPU: {result['cpu']}. 1 thread, f32; thread CPU time per call, median of {result['rounds']} "
              "interleaved rounds; ratio = polymorphic / static (per-round ratios' min-max)."), "",
             ("| function (the polymorphic size) | size | kernel poly us | kernel static us | kernel ratio (min-max) "
              "| call ratio (min-max) | load |"), "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if "size" not in r:
            continue
        us, call = r["us"], r["ratio"]
        kern = r.get("ratio kernel")
        kernel = (f"{us['poly kernel']:.1f} | {us['static kernel']:.1f} | {kern[0]:.3f} ({kern[1]:.3f}-{kern[2]:.3f})"
                  if kern else "– | – | –")
        lines.append(f"| {r['case']} | {r['size']} | {kernel} | {call[0]:.3f} ({call[1]:.3f}-{call[2]:.3f}) | "
                     f"{r['load'][0]:.1f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", nargs="*", default=list(CASES))
    parser.add_argument("--sizes", type=int, nargs="*", default=[1, 7, 128, 1000])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.05, help="seconds per block of calls")
    parser.add_argument("--json", help="write the result here (JSON)")
    parser.add_argument("--md", help="write the markdown table here")
    args = parser.parse_args()
    result = measure(args.cases, args.sizes, args.rounds, args.budget)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    out = table(result)
    if args.md:
        Path(args.md).write_text(out)
    print(out)


if __name__ == "__main__":
    main()
