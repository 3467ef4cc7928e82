"""Exported ONNX models: pbsdk (`pbsdk.onnx.load`, cpu target) vs onnxruntime's CPU provider, same threads.

    PYTHONPATH=. .venv/bin/python benchmarks/onnx_models.py [--models resnet18 gpt2 ...] [--threads 1 2]
        [--rounds 7] [--block-s 0.5] [--json out.json] [--md out.md]

The models are the real-model tier's (`pbsdk.testing.real_models`, random weights, batch 1: the full-size
ones by default) exported with ``torch.onnx.export`` (`pbsdk.onnx.export`, static shapes). For each model
and thread count T: pbsdk compiled with the cpu target's option ``threads=T``, onnxruntime with
``intra_op_num_threads=T`` and ``inter_op_num_threads=1`` (graph optimisations at their default, all).

- ``first``: per contender, a fresh process (pbsdk with an empty on-disk cache) reads the .onnx file and
  times the import, compilation (onnxruntime: session creation) and one call. ``added_mb``: that process's
  peak resident set (VmHWM) minus its resident set before the model was read, i.e. the model's weights
  as each contender holds them plus what compiling and running added.
- ``latency``: one more process holds both (pbsdk from the cache the first-call run filled) and times them
  in interleaved blocks: each round runs each contender for a block of back-to-back calls (the order
  alternates between rounds), a contender's round figure is the block's mean per call, the latency is the
  median over rounds, and the ratio pbsdk / onnxruntime is the median of the per-round ratios, with their
  min..max as its spread. The outputs are compared once (max abs difference, and max |onnxruntime|).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

CONTENDERS = ("pbsdk", "onnxruntime")


def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _contender(contender: str, path: str, threads: int) -> tuple[Any, dict[str, Any]]:
    """Load ``path`` for ``contender`` on ``threads`` threads: a function of the feeds, and facts about it."""
    if contender == "pbsdk":
        import pbsdk.onnx

        model = pbsdk.onnx.load(path, target="cpu", options={"threads": threads})
        return (lambda feeds: model.run(feeds)[0]), {"fallback": sum(model.report.fallback.values()),
                                                    "kernels": len(model.plan.compiled)}
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
    session = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return (lambda feeds: session.run(None, feeds)[0]), {}


def _imports() -> None:
    import onnxruntime  # noqa: F401

    import pbsdk.onnx  # noqa: F401


def child_first(path: str, feeds_path: str, contender: str, threads: int) -> dict[str, Any]:
    """One fresh process: the contender's import + compile + first call, and the memory it added."""
    _imports()
    feeds = dict(np.load(feeds_path))
    before = _status_mb("VmRSS")
    start = time.perf_counter()
    fn, facts = _contender(contender, path, threads)
    compiled = time.perf_counter() - start
    fn(feeds)
    first = time.perf_counter() - start
    return {"first_s": first, "compile_s": compiled, "added_mb": _status_mb("VmHWM") - before, **facts}


def child_latency(path: str, feeds_path: str, threads: int, rounds: int, block_s: float) -> dict[str, Any]:
    """Both contenders in one process, interleaved blocks, median over rounds."""
    _imports()
    feeds = dict(np.load(feeds_path))
    fns = {c: _contender(c, path, threads)[0] for c in CONTENDERS}
    outs = {c: fn(feeds) for c, fn in fns.items()}  # warm-up, and the outputs compared
    start = time.perf_counter()
    fns["onnxruntime"](feeds)
    reps = max(1, int(block_s / max(time.perf_counter() - start, 1e-6)))
    per_round: dict[str, list[float]] = {c: [] for c in CONTENDERS}
    for r in range(rounds):
        for c in (CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]):
            fn = fns[c]
            start = time.perf_counter()
            for _ in range(reps):
                fn(feeds)
            per_round[c].append((time.perf_counter() - start) / reps)
    ratios = [p / o for p, o in zip(per_round["pbsdk"], per_round["onnxruntime"])]
    return {"reps": reps, "rounds": rounds,
            "latency_ms": {c: 1e3 * statistics.median(v) for c, v in per_round.items()},
            "per_round_ms": {c: [1e3 * x for x in v] for c, v in per_round.items()},
            "ratio": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
            "max_abs_diff": float(np.abs(outs["pbsdk"] - outs["onnxruntime"]).max()),
            "max_abs_ref": float(np.abs(outs["onnxruntime"]).max())}


def _spawn(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    from pbsdk.bench import child_json

    return child_json(__file__, args, env, timeout)


def _load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def measure(name: str, threads: list[int], rounds: int, block_s: float, timeout: float) -> list[dict[str, Any]]:
    """Export ``name``, then per thread count the first-call processes and the latency process."""
    from pbsdk.onnx.export import export, inputs_of

    root = str(Path(__file__).resolve().parent.parent)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pbsdk-onnx-bench-") as tmp:
        start = time.perf_counter()
        data = export(name)
        export_s = time.perf_counter() - start
        path, feeds_path = os.path.join(tmp, f"{name}.onnx"), os.path.join(tmp, "feeds.npz")
        Path(path).write_bytes(data)
        np.savez(feeds_path, **inputs_of(name))
        for t in threads:
            env = dict(os.environ, PBSDK_CACHE_DIR=os.path.join(tmp, f"cache-{t}"))
            env.pop("PBSDK_DISABLE_CACHE", None)
            env.pop("PBSDK_CACHE", None)
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
            row: dict[str, Any] = {"model": name, "threads": t, "batch": 1, "onnx_mb": len(data) / 2**20,
                                   "export_s": export_s, "load_before": _load(), "first": {}}
            for c in CONTENDERS:
                row["first"][c] = _spawn(["--child-first", path, feeds_path, c, str(t)], env, timeout)
            row["steady"] = _spawn(["--child-latency", path, feeds_path, str(t), str(rounds), str(block_s)], env,
                                   timeout)
            row["load_after"] = _load()
            print(json.dumps(row), file=sys.stderr, flush=True)
            rows.append(row)
    return rows


def _first(r: dict[str, Any]) -> str:
    return f"error: {r['error']}" if "error" in r else f"{r['first_s']:.1f} s / {r['added_mb']:.0f} MB"


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [("| model | thr | first call s / peak mem. added: pbsdk | onnxruntime | latency ms: pbsdk "
              "| onnxruntime | pbsdk / ort (spread) | max abs diff (max abs out) | fallback ops | load before-after |"),
             "|---|--:|--:|--:|--:|--:|--:|--:|--:|--|"]
    for r in rows:
        f, s = r["first"], r["steady"]
        if "error" in s:
            lat = f"error: {s['error']} | | | "
        else:
            ms, q = s["latency_ms"], s["ratio"]
            lat = (f"{ms['pbsdk']:.3g} | {ms['onnxruntime']:.3g} | {q['median']:.2f} ({q['min']:.2f}-{q['max']:.2f}) "
                   f"| {s['max_abs_diff']:.1e} ({s['max_abs_ref']:.2g})")
        fallback = f["pbsdk"].get("fallback", "?")
        lines.append(f"| {r['model']} | {r['threads']} | {_first(f['pbsdk'])} | {_first(f['onnxruntime'])} | {lat} "
                     f"| {fallback} | {r['load_before'].split()[0]}-{r['load_after'].split()[0]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "--child-first":
        print(json.dumps(child_first(argv[1], argv[2], argv[3], int(argv[4]))))
        return 0
    if argv and argv[0] == "--child-latency":
        print(json.dumps(child_latency(argv[1], argv[2], int(argv[3]), int(argv[4]), float(argv[5]))))
        return 0
    from pbsdk.testing.real_models import FULL

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(FULL))
    p.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block-s", type=float, default=0.5, help="seconds of calls per contender per round")
    p.add_argument("--timeout", type=float, default=1800, help="seconds per child process")
    p.add_argument("--json", default=None)
    p.add_argument("--md", default=None)
    args = p.parse_args(argv)
    import subprocess as sp

    commit = sp.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False,
                    cwd=Path(__file__).parent).stdout.strip()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    rows = [row for name in args.models
            for row in measure(name, args.threads, args.rounds, args.block_s, args.timeout)]
    table = markdown(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"started": started, "finished": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                       "commit": commit, "cpus": os.cpu_count(), "rows": rows}, f, indent=1)
    if args.md:
        Path(args.md).write_text(table + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
