"""Whole JAX models: ``pbsdk.jax.jit`` vs ``jax.jit`` (XLA), in one run.

    .venv/bin/python benchmarks/models_jax.py [--batches 1 16] [--repeats 30] [--json PATH] [--markdown]

For each model of `pbsdk.frontends.jax.examples.MODELS` and each batch size: the median latency of
``repeats`` calls (in blocks alternating between the contenders) of ``jax.jit`` and of ``pbsdk.jax.jit`` (returning ``jax.Array``s,
as ``jax.jit`` does, and with ``output="numpy"``, which skips wrapping the kernels' arrays); the compile
time (first call: tracing, lowering, compiling; pbsdk's on-disk kernel cache is bypassed); how many
equations fell back to XLA; and the largest error against ``jax.jit``. Parameters are arguments (kernel
inputs), f32; every call ends with ``block_until_ready`` for XLA. Writes the rows as JSON to
benchmarks/results/models_jax.json (or ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import numpy as np

import pbsdk.jax
from pbsdk.frontends.jax.examples import MODELS

RESULTS = Path(__file__).resolve().parent / "results" / "models_jax.json"


def _median_ms(fns: dict[str, Any], args: tuple[Any, ...], repeats: int, rounds: int = 5) -> dict[str, float]:
    """Median latency of each function over ``repeats`` calls, taken in ``rounds`` blocks that alternate
    between the functions (so that load from elsewhere on the machine falls on all of them alike). Each
    block starts with an untimed call: XLA's worker threads keep spinning for a while after its calls and
    would otherwise slow down the first calls of the next contender on a machine with few cores."""
    times: dict[str, list[float]] = {name: [] for name in fns}
    per_round = max(1, repeats // rounds)
    for _ in range(rounds):
        for name, fn in fns.items():
            jax.block_until_ready(fn(*args))
            for _ in range(per_round):
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}


def _first_call(fn: Any, args: tuple[Any, ...]) -> tuple[float, Any]:
    start = time.perf_counter()
    y = jax.block_until_ready(fn(*args))
    return time.perf_counter() - start, y


def run(models: list[str], batches: list[int], repeats: int) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        init, apply, shape = MODELS[name]
        for batch in batches:
            rng = np.random.default_rng(0)
            params = jax.device_put(init(rng))
            x = jax.device_put(rng.standard_normal(shape(batch)).astype(np.float32))
            row: dict[str, Any] = {"model": name, "batch": batch, "input": list(x.shape)}
            xla = jax.jit(apply)
            row["xla_compile_s"], ref = _first_call(xla, (params, x))
            pbsdk.jax.clear_reports()
            fn = pbsdk.jax.jit(apply)
            row["pbsdk_compile_s"], y = _first_call(fn, (params, x))
            reports = pbsdk.jax.reports()
            ms = _median_ms({"xla": xla, "pbsdk": fn, "numpy": pbsdk.jax.jit(apply, output="numpy")}, (params, x),
                            repeats)
            row["xla_ms"], row["pbsdk_ms"], row["pbsdk_numpy_out_ms"] = ms["xla"], ms["pbsdk"], ms["numpy"]
            row["pbsdk_fallback_ops"] = sum(len(r.fallback_primitives) for r in reports)
            row["pbsdk_kernels"] = sum(r.kernels for r in reports)
            row["pbsdk_ops"] = sum(r.ops for r in reports)
            row["pbsdk_max_abs_err"] = float(np.abs(np.asarray(y) - np.asarray(ref)).max())
            row["pbsdk_vs_xla"] = row["xla_ms"] / row["pbsdk_ms"]
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [("| model | batch | jax.jit ms | pbsdk ms | pbsdk (numpy out) ms | pbsdk / XLA speed | XLA compile s "
              "| pbsdk compile s | fallbacks | max abs err |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {r['xla_ms']:.3f} | {r['pbsdk_ms']:.3f} | "
                     f"{r['pbsdk_numpy_out_ms']:.3f} | {r['pbsdk_vs_xla']:.2f}x | {r['xla_compile_s']:.2f} | "
                     f"{r['pbsdk_compile_s']:.1f} | {r['pbsdk_fallback_ops']} | {r['pbsdk_max_abs_err']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(MODELS), choices=sorted(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--json", default=str(RESULTS), help="write the rows as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as cache:
        os.environ.setdefault("PBSDK_CACHE_DIR", cache)  # compile times without the on-disk cache
        rows = run(args.models, args.batches, args.repeats)
    meta = {"jax": jax.__version__, "machine": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "python": platform.python_version()}
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    with open(args.json, "w") as fh:
        json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    print(markdown(rows) if args.markdown else json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
