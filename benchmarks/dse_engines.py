"""One sweep on the local engine and on Ray (issue #35): the same report, and how much faster.

Runs ``pbsdk dse`` as a user does, in a fresh process each time with its own empty compile cache, for
each contender in interleaved rounds (the order rotating): by default ``local`` with ``--jobs 1`` (the
baseline) and ``ray`` with ``--jobs 2`` (a local Ray of 2 CPUs started for the run). The default sweep is
issue #35's: 16 variants, the scratchpad size times the DRAM bandwidth, on the GPT-2 block.

Reported per contender: the wall time of the command (median over rounds, min-max in brackets), the
sweep's own ``seconds`` from its report, and whether every round's report equals the baseline's first
(timings aside); then the speed-up of each contender over the baseline as the median of the per-round
ratios. Example::

    PYTHONPATH=. .venv/bin/python benchmarks/dse_engines.py --rounds 2 --json out.json --md out.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from pbsdk.bench import cpu_model

SPEC = "npu"
MODEL = "gpt2-block:seq=256,d=768,heads=12"
VARY = ("memory.spm.size_bytes=65536,131072,262144,524288", "memory.dram.bandwidth_gbps=50,100,200,400")
#: Report fields that are timings (they differ between any two runs).
TIMES = ("seconds", "compile_seconds")


def _command(engine: str, jobs: int, out: str, spec: str, model: str, vary: tuple[str, ...]) -> list[str]:
    cmd = [sys.executable, "-m", "pbsdk.cli", "dse", "--spec", spec, "--model", model, "--engine", engine,
           "--jobs", str(jobs), "--out", out]
    for v in vary:
        cmd += ["--vary", v]
    return cmd


def _untimed(report: dict[str, Any]) -> dict[str, Any]:
    rows = [{k: v for k, v in row.items() if k not in TIMES} for row in report["variants"]]
    return {**{k: v for k, v in report.items() if k not in TIMES}, "variants": rows}


def _run(name: str, engine: str, jobs: int, tmp: Path, args: argparse.Namespace, round_: int) -> dict[str, Any]:
    out = tmp / f"{name}-{round_}"
    env = dict(os.environ, PBSDK_CACHE_DIR=str(tmp / f"cache-{name}-{round_}"))
    env.pop("PBSDK_CACHE_URL", None)
    t0 = time.perf_counter()
    done = subprocess.run(_command(engine, jobs, str(out), args.spec, args.model, tuple(args.vary)), env=env,
                          capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{name}: pbsdk dse exited {done.returncode}: {done.stderr.strip()[-2000:]}")
    report = json.loads((out / "dse.json").read_text())
    return {"wall": wall, "seconds": report["seconds"], "report": _untimed(report),
            "load": os.getloadavg()[0], "progress_shown": "variants" in done.stderr}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--contenders", default="local:1,ray:2", help="ENGINE:JOBS,... (the first is the baseline)")
    ap.add_argument("--spec", default=SPEC)
    ap.add_argument("--model", default=MODEL)
    ap.add_argument("--vary", action="append", help="as pbsdk dse's (default: issue #35's 4 x 4 sweep)")
    ap.add_argument("--json")
    ap.add_argument("--md")
    args = ap.parse_args()
    args.vary = args.vary or list(VARY)
    contenders = [(f"{e}x{j}", e, int(j)) for e, j in (c.split(":") for c in args.contenders.split(","))]
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in contenders}
    with tempfile.TemporaryDirectory(prefix="pbsdk-dse-engines-") as tmp:
        for r in range(args.rounds):
            order = contenders[r % len(contenders):] + contenders[:r % len(contenders)]
            for name, engine, jobs in order:
                res = _run(name, engine, jobs, Path(tmp), args, r)
                runs[name].append(res)
                print(f"round {r} {name}: {res['wall']:.1f} s (load {res['load']:.2f})", file=sys.stderr)
    base_name = contenders[0][0]
    reference = runs[base_name][0]["report"]
    rows = []
    for name, engine, jobs in contenders:
        walls = [x["wall"] for x in runs[name]]
        ratios = [b["wall"] / x["wall"] for b, x in zip(runs[base_name], runs[name])]
        rows.append({"contender": name, "engine": engine, "jobs": jobs, "wall_s": walls,
                     "median_wall_s": statistics.median(walls), "report_seconds": [x["seconds"] for x in runs[name]],
                     "speedup_vs_baseline": statistics.median(ratios), "speedup_per_round": ratios,
                     "same_report": all(x["report"] == reference for x in runs[name]),
                     "progress_shown": all(x["progress_shown"] for x in runs[name]),
                     "load": [x["load"] for x in runs[name]]})
    meta = {"cpu": cpu_model(cpuid=True), "cpu_count": os.cpu_count(), "spec": args.spec,
            "model": args.model, "vary": args.vary, "rounds": args.rounds,
            "variants": len(reference["variants"]), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    lines = [f"`pbsdk dse --spec {args.spec} --model {args.model} " + " ".join(f"--vary {v}" for v in args.vary)
             + f"`: {meta['variants']} variants, {args.rounds} interleaved rounds, each run a fresh process with an "
             f"empty compile cache; {meta['cpu']}, {os.cpu_count()} CPUs; {meta['date']}.", "",
             "| engine | jobs | wall s, median (min-max) | x baseline, median of rounds (min-max) | same report | progress |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        w, s = row["wall_s"], row["speedup_per_round"]
        lines.append(f"| {row['engine']} | {row['jobs']} | {row['median_wall_s']:.1f} ({min(w):.1f}-{max(w):.1f}) | "
                     f"{row['speedup_vs_baseline']:.2f} ({min(s):.2f}-{max(s):.2f}) | "
                     f"{'yes' if row['same_report'] else 'NO'} | {'yes' if row['progress_shown'] else 'no'} |")
    print("\n".join(lines))
    if args.json:
        Path(args.json).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    if args.md:
        Path(args.md).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
