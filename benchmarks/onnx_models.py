"""Exported ONNX models: pbsdk (`pbsdk.onnx.load`, cpu target) vs onnxruntime's CPU provider, same threads.

    PYTHONPATH=. .venv/bin/python benchmarks/onnx_models.py [--models resnet18 gpt2 bert] [--threads 1 2]
        [--rounds 7] [--repeats 10] [--json out.json] [--markdown]

For each model of `pbsdk.onnx.export` (random weights, static shapes: resnet18 1x3x64x64, GPT-2 and BERT
2 layers, 1x32 tokens) and each thread count: pbsdk compiled with ``threads=T``, onnxruntime with
``intra_op_num_threads=T`` and ``inter_op_num_threads=1`` (graph optimisations at their default, all).
Latency: each round runs every contender's block of ``repeats`` back-to-back calls in turn (interleaved,
so drift on this shared machine hits both alike) and keeps each block's fastest call; the figure is the
median over rounds, and the ratio's spread is the range of the per-round ratios. Also: compile times
(pbsdk's import + compile, onnxruntime's session creation) and the largest difference of the outputs.
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

import numpy as np


def _fastest(fn: Any, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def run(models: list[str], threads: list[int], rounds: int, repeats: int) -> list[dict[str, Any]]:
    import onnxruntime as ort

    import pbsdk.onnx
    from pbsdk.onnx.export import export, inputs_of

    rows = []
    for name in models:
        data = export(name)
        feeds = inputs_of(name)
        for t in threads:
            start = time.perf_counter()
            model = pbsdk.onnx.load(data, target="cpu", options={"threads": t})
            pbsdk_compile = time.perf_counter() - start
            so = ort.SessionOptions()
            so.intra_op_num_threads, so.inter_op_num_threads = t, 1
            start = time.perf_counter()
            session = ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
            ort_compile = time.perf_counter() - start
            want = session.run(None, feeds)[0]
            got = model.run(feeds)[0]
            contenders = {"pbsdk": lambda: model.run(feeds), "onnxruntime": lambda: session.run(None, feeds)}
            per_round: dict[str, list[float]] = {k: [] for k in contenders}
            for _ in range(rounds):
                for k, fn in contenders.items():
                    per_round[k].append(_fastest(fn, repeats))
            ratios = [p / o for p, o in zip(per_round["pbsdk"], per_round["onnxruntime"])]
            rows.append({
                "model": name, "threads": t,
                "pbsdk_ms": statistics.median(per_round["pbsdk"]) * 1e3,
                "onnxruntime_ms": statistics.median(per_round["onnxruntime"]) * 1e3,
                "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                "pbsdk_compile_s": pbsdk_compile, "onnxruntime_session_s": ort_compile,
                "max_abs_diff": float(np.abs(got - want).max()), "fallback": sum(model.report.fallback.values()),
            })
            print(json.dumps(rows[-1]), file=sys.stderr)
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| model | thr | pbsdk ms | onnxruntime ms | pbsdk / ort (spread) | pbsdk compile s | ort session s "
             "| max abs diff | fallback ops |", "|---|--:|--:|--:|--:|--:|--:|--:|--:|"]
    for r in rows:
        lines.append(f"| {r['model']} | {r['threads']} | {r['pbsdk_ms']:.3g} | {r['onnxruntime_ms']:.3g} | "
                     f"{r['ratio']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f}) | {r['pbsdk_compile_s']:.2f} | "
                     f"{r['onnxruntime_session_s']:.2f} | {r['max_abs_diff']:.1e} | {r['fallback']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["resnet18", "gpt2", "bert"])
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    rows = run(args.models, args.threads, args.rounds, args.repeats)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": platform.processor() or platform.machine(), "rows": rows}, f, indent=1)
    print(markdown(rows) if args.markdown else json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
