"""Whole models through torch.compile: pbsdk vs torch eager vs Inductor, in one run.

    .venv/bin/python benchmarks/models.py [--batches 1 16] [--repeats 30] [--json out.json] [--markdown]

For each model of `pbsdk.frontends.torch.examples.MODELS` and each batch size: latency (median over 7
interleaved rounds of the fastest of ``repeats`` calls) for eager torch, ``torch.compile`` with Inductor (its default) and
``torch.compile(backend="pbsdk")``; the compile time (first call, including Dynamo and AOTAutograd);
how many ATen ops fell back to torch in pbsdk's graphs; and the largest error against eager. Inference
(``torch.no_grad``), f32, ``torch.get_num_threads()`` threads for torch.
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import statistics
import sys
import time
from typing import Any

import torch

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk.frontends.torch.examples import MODELS

ROUNDS = 7


def _interleaved_ms(contenders: dict[str, Any], x: torch.Tensor, repeats: int) -> dict[str, float]:
    """Per contender: the median over ``ROUNDS`` rounds of the fastest of ``repeats`` back-to-back calls.
    Every round runs each contender's block in turn, so slow drift on this shared machine hits all of
    them alike (sequential medians swung by 2x between runs)."""
    for fn in contenders.values():
        fn(x)
    minima: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(ROUNDS):
        for name, fn in contenders.items():
            best = math.inf
            for _ in range(repeats):
                start = time.perf_counter()
                fn(x)
                best = min(best, time.perf_counter() - start)
            minima[name].append(best)
            time.sleep(0.01)
    return {name: statistics.median(v) * 1e3 for name, v in minima.items()}


def _first_call(make: Any, x: torch.Tensor) -> tuple[Any, float, torch.Tensor]:
    start = time.perf_counter()
    fn = make()
    y = fn(x)
    return fn, time.perf_counter() - start, y


def run(models: list[str], batches: list[int], repeats: int, threads: int = 0) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        build, shape = MODELS[name]
        for batch in batches:
            torch.manual_seed(0)
            model = build().eval()
            x = torch.randn(*shape(batch))
            row: dict[str, Any] = {"model": name, "batch": batch, "input": list(x.shape)}
            with torch.no_grad():
                ref = model(x)
                contenders: dict[str, Any] = {"eager": model}
                torch._dynamo.reset()
                try:
                    fn, secs, _ = _first_call(lambda m=model: torch.compile(m), x)
                    contenders["inductor"], row["inductor_compile_s"] = fn, secs
                except Exception as exc:  # noqa: BLE001 - no C++ compiler, ...: report, keep going
                    row["inductor_compile_s"] = None
                    row["inductor_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
                pbsdk_torch.clear_reports()
                opts = {"compile_options": {"threads": threads}} if threads else None
                fn, secs, y = _first_call(lambda m=model, o=opts: torch.compile(m, backend="pbsdk", options=o), x)
                contenders["pbsdk"], row["pbsdk_compile_s"] = fn, secs
                reports = pbsdk_torch.reports()
                row["pbsdk_fallback_ops"] = sum(len(r.fallback_ops) for r in reports)
                row["pbsdk_partitions"] = sum(r.partitions for r in reports)
                row["pbsdk_max_abs_err"] = float((y - ref).abs().max())
                times = _interleaved_ms(contenders, x, repeats)
                row["eager_ms"], row["pbsdk_ms"] = times["eager"], times["pbsdk"]
                row["inductor_ms"] = times.get("inductor")
            if row["inductor_ms"]:
                row["pbsdk_vs_inductor"] = row["inductor_ms"] / row["pbsdk_ms"]
            row["pbsdk_vs_eager"] = row["eager_ms"] / row["pbsdk_ms"]
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    def f(v: Any, spec: str) -> str:
        return "n/a" if v is None else format(v, spec)

    lines = [("| model | batch | eager ms | Inductor ms | pbsdk ms | pbsdk / Inductor speed | Inductor compile s "
              "| pbsdk compile s | fallbacks | max abs err |"),
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['batch']} | {f(r['eager_ms'], '.3f')} | {f(r['inductor_ms'], '.3f')} | "
                     f"{f(r['pbsdk_ms'], '.3f')} | {f(r.get('pbsdk_vs_inductor'), '.2f')}x | "
                     f"{f(r['inductor_compile_s'], '.1f')} | {f(r['pbsdk_compile_s'], '.1f')} | "
                     f"{r['pbsdk_fallback_ops']} | {r['pbsdk_max_abs_err']:.1e} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=sorted(MODELS), choices=sorted(MODELS))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 16])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=0,
                        help="every contender on N threads (torch.set_num_threads, pbsdk's threads option); "
                             "0: torch's default and every core of the spec for pbsdk")
    parser.add_argument("--json", help="write the rows as JSON here")
    parser.add_argument("--markdown", action="store_true", help="print a markdown table")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = run(args.models, args.batches, args.repeats, args.threads)
    meta = {"torch": torch.__version__, "threads": torch.get_num_threads(), "machine": platform.processor()
            or platform.machine(), "python": platform.python_version()}
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)
    print(markdown(rows) if args.markdown else json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
