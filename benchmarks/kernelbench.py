"""KernelBench problems through ``torch.compile(backend="pbsdk")`` (issue #32): correctness, fallbacks, first call
and latency against eager (and optionally Inductor), per problem and summarised.

KernelBench (https://github.com/ScalingIntelligence/KernelBench) is not part of pbsdk: ``--root`` names a
checkout (its ``KernelBench/levelN/*.py``, or ``levelN/`` directly). Each problem file defines ``Model``,
``get_init_inputs()``, ``get_inputs()`` and its sizes as module constants. Per problem, in a fresh process
(a crash or a hang, ``--timeout``, ends that problem only):

- seed, build ``Model(*get_init_inputs())`` in eval mode (an inference compiler: BatchNorm uses its running
  statistics, Dropout is the identity; KernelBench itself leaves the modules in training mode), seed, build
  the inputs from ``get_inputs()``; everything under ``torch.no_grad()``, ``torch.set_num_threads(--threads)``
  and pbsdk's ``threads`` option alike;
- eager's time (the fastest of the warm calls made in 0.1 s, 3 at least: on a shared host the least disturbed
  one; a first warm call above 1.5x the bound decides alone); above ``--max-eager-ms`` the problem is
  recorded as skipped with that time;
- ``torch.compile(model, backend="pbsdk")``: the first call's time, the backend's reports (ops compiled, ops
  left to torch, partitions that failed), and the output against eager's: ``torch.allclose`` with
  ``--atol``/``--rtol`` (KernelBench's 1e-2 both), the largest absolute difference and that difference over
  eager's largest magnitude;
- latency: the contenders in interleaved blocks (each round runs every contender for ``--block-s`` of calls, in
  a rotated order; a round's figure is the block's mean per call), the median over ``--rounds`` rounds, and
  pbsdk's speed over eager per round: median and min-max;
- ``floor`` (``--contenders eager,pbsdk,floor``): ``torch.compile`` with a backend whose compiled graph costs
  nothing (it returns the outputs it computed once): Dynamo's own frame, guards and wrappers, the least any
  backend's call can take through ``torch.compile``. Its speed over eager (``floor_speedup``) below 1 says
  that no backend can make that problem faster than eager on this host.

The summary counts the problems measured, correct, fully compiled, faster than eager, and the geometric mean
of the speed-ups (`summarize`). Example (2 threads, the issue's bar):

    .venv/bin/python benchmarks/kernelbench.py --root /tmp/kernelbench --level 2 --threads 2 \\
        --max-eager-ms 150 --json benchmarks/results/kernelbench_level2.json \\
        --md benchmarks/results/kernelbench_level2.md
    .venv/bin/python benchmarks/kernelbench.py --root /tmp/kernelbench --level 2 --only '^(12|76)_' \\
        --contenders eager,pbsdk,inductor
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

CONTENDERS = ("eager", "pbsdk", "inductor", "floor")


# ------------------------------------------------------------------------------------------ pure logic

def problem_files(root: Path, level: int, only: str | None = None) -> list[Path]:
    """The level's problem files under ``root`` (``KernelBench/levelN`` or ``levelN``), by problem number;
    ``only``: a regular expression searched in the file name."""
    for d in (root / "KernelBench" / f"level{level}", root / f"level{level}"):
        if d.is_dir():
            files = [p for p in d.glob("*.py") if re.match(r"\d+_", p.name)]
            break
    else:
        raise SystemExit(f"no level{level} directory under {root} (expected KernelBench/level{level} or "
                         f"level{level})")
    if only:
        files = [p for p in files if re.search(only, p.name)]
    return sorted(files, key=lambda p: int(p.name.split("_", 1)[0]))


def geomean(values: Iterable[float]) -> float:
    """The geometric mean of positive values (nan for none)."""
    logs = [math.log(v) for v in values]
    return math.exp(sum(logs) / len(logs)) if logs else float("nan")


def status(row: dict[str, Any]) -> str:
    """``error`` (crashed or timed out), ``skipped`` (eager above the bound), ``wrong`` (measured, not within
    tolerance) or ``ok``."""
    if "error" in row:
        return "error"
    if row.get("skipped"):
        return "skipped"
    return "ok" if row.get("correct") else "wrong"


def fully_compiled(row: dict[str, Any]) -> bool:
    """Every op of every graph ran in pbsdk kernels: none left to torch, no partition failed."""
    return not row.get("fallback_ops") and not row.get("failed_partitions") and row.get("graphs", 0) > 0


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Counts and the geometric-mean speed-up over eager of the problems measured (neither skipped nor errors).
    A wrong result counts as measured but not as faster; its speed-up still enters the geomean (it is shown as
    wrong beside it), so a fast wrong kernel cannot hide."""
    measured = [r for r in rows if status(r) in ("ok", "wrong")]
    speedups = [r["speedup"]["median"] for r in measured if r.get("speedup")]
    faster = [r for r in measured if status(r) == "ok" and r.get("speedup", {}).get("median", 0.0) > 1.0]
    summary: dict[str, Any] = {
        "problems": len(rows),
        "skipped": sum(status(r) == "skipped" for r in rows),
        "errors": sum(status(r) == "error" for r in rows),
        "measured": len(measured),
        "correct": sum(status(r) == "ok" for r in measured),
        "fully_compiled": sum(fully_compiled(r) for r in measured),
        "faster": len(faster),
        "faster_share": len(faster) / len(measured) if measured else float("nan"),
        "geomean": geomean(speedups),
    }
    if any(r.get("speedup_inductor") for r in measured):
        summary["geomean_vs_inductor"] = geomean(r["speedup_inductor"]["median"] for r in measured
                                                 if r.get("speedup_inductor"))
    return summary


def meets_bar(summary: dict[str, Any], share: float = 0.9, mean: float = 1.5) -> bool:
    """Issue #32's bar: at least ``share`` of the problems measured faster than eager, geomean >= ``mean``."""
    return bool(summary["measured"]) and summary["faster_share"] >= share and summary["geomean"] >= mean


def _spread(s: dict[str, float]) -> str:
    return f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f})"


def markdown(rows: Sequence[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The per-problem table and the summary, as markdown."""
    s = summarize(rows)
    inductor = any(r.get("speedup_inductor") for r in rows)
    floor = any(r.get("floor_speedup") for r in rows)
    head = "| problem | eager ms | pbsdk ms | x eager (min-max) | "
    head += "Inductor ms | pbsdk x Inductor | " if inductor else ""
    head += "floor ms | floor x eager | " if floor else ""
    head += "first call s | fallbacks | correct (max abs / rel err) |"
    title = (f"KernelBench level {meta.get('level')} ({meta.get('source', meta.get('root'))}), "
             f"{meta.get('threads')} threads, eager <= {meta.get('max_eager_ms')} ms, {meta.get('rounds')} rounds of "
             f"{meta.get('block_s')} s blocks; {meta.get('cpu')}, load {meta.get('load')}; {meta.get('date')}")
    line = (f"**{s['faster']} of {s['measured']} faster than eager ({100 * s['faster_share']:.0f}%), geomean "
            f"{s['geomean']:.2f}x eager**; {s['correct']} correct, {s['fully_compiled']} fully compiled; "
            f"{s['skipped']} skipped (eager above the bound), {s['errors']} errors"
            + (f"; geomean {s['geomean_vs_inductor']:.2f}x Inductor" if "geomean_vs_inductor" in s else ""))
    out = [title, "", line, "",
           head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        st = status(r)
        if st == "error":
            out.append(f"| {r['name']} | error: {r['error'][:120]} |")
            continue
        if st == "skipped":
            out.append(f"| {r['name']} | {r['eager_ms']:.1f} (skipped) |")
            continue
        lat = r["latency_ms"]
        cells = [r["name"], f"{lat['eager']:.3f}", f"{lat['pbsdk']:.3f}", _spread(r["speedup"])]
        if inductor:
            si = r.get("speedup_inductor")
            cells += [f"{lat['inductor']:.3f}" if "inductor" in lat else "", _spread(si) if si else ""]
        if floor:
            sf = r.get("floor_speedup")
            cells += [f"{lat['floor']:.3f}" if "floor" in lat else "", _spread(sf) if sf else ""]
        fallbacks = ", ".join(r.get("fallback_ops", [])) or ("0" if fully_compiled(r) else "failed partition")
        cells += [f"{r['first_s']:.2f}", fallbacks,
                  f"{'yes' if st == 'ok' else 'NO'} ({r['max_abs_err']:.1e} / {r['max_rel_err']:.1e})"]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


# ------------------------------------------------------------------------------------------ one problem

def _load(path: Path) -> Any:
    spec = importlib.util.spec_from_file_location(f"kernelbench_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _flat(out: Any) -> list[Any]:
    return [t for o in (out if isinstance(out, (tuple, list)) else [out]) for t in _flat_one(o)]


def _flat_one(o: Any) -> list[Any]:
    return _flat(o) if isinstance(o, (tuple, list)) else [o]


def _compare(got: Any, want: Any, atol: float, rtol: float) -> dict[str, Any]:
    import torch

    got_l, want_l = _flat(got), _flat(want)
    if len(got_l) != len(want_l) or any(g.shape != w.shape for g, w in zip(got_l, want_l)):
        return {"correct": False, "max_abs_err": float("inf"), "max_rel_err": float("inf"),
                "mismatch": "outputs differ in number or shape"}
    ok, abs_err, rel_err = True, 0.0, 0.0
    for g, w in zip(got_l, want_l):
        g, w = g.double(), w.double()
        ok = ok and bool(torch.allclose(g, w, atol=atol, rtol=rtol))
        diff = float((g - w).abs().max()) if g.numel() else 0.0
        abs_err = max(abs_err, diff)
        rel_err = max(rel_err, diff / max(float(w.abs().max()) if w.numel() else 0.0, 1e-30))
    return {"correct": ok, "max_abs_err": abs_err, "max_rel_err": rel_err}


def _time_calls(fn: Any, inputs: Sequence[Any], n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        fn(*inputs)
    return (time.perf_counter() - start) / n


def _eager_seconds(model: Any, inputs: Sequence[Any], at_least_s: float = 0.1) -> float:
    """Eager's time per call, warm: calls until ``at_least_s`` has passed (3 at least), the fastest of them
    (on a shared host the least disturbed one: this decides whether the problem is measured at all)."""
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < 3 or time.perf_counter() - start < at_least_s:
        times.append(_time_calls(model, inputs, 1))
    return min(times)


def _compiled(model: Any, contender: str, threads: int) -> Any:
    import torch

    if contender == "pbsdk":
        return torch.compile(model, backend="pbsdk", options={"compile_options": {"threads": threads}})
    if contender == "inductor":
        return torch.compile(model)
    if contender == "floor":
        return torch.compile(model, backend=_free_backend)
    return model


def _free_backend(gm: Any, example_inputs: Sequence[Any]) -> Any:
    """A compiled graph that costs nothing: the outputs computed once, returned by every call."""
    outputs = gm(*example_inputs)
    return lambda *args: outputs


def _pbsdk_reports() -> dict[str, Any]:
    import pbsdk.frontends.torch as pt

    reports = pt.reports()
    return {"graphs": len(reports), "graph_ops": sum(r.graph_ops for r in reports),
            "compiled_ops": sum(r.compiled_ops for r in reports), "partitions": sum(r.partitions for r in reports),
            "fallback_ops": sorted({o for r in reports for o in r.fallback_ops}),
            "failed_partitions": sum(r.failed_partitions for r in reports),
            "compile_errors": sorted({e for r in reports for e in r.errors})}


def run_problem(path: Path, opts: argparse.Namespace) -> dict[str, Any]:
    """One problem, in this process (the child's work)."""
    import torch

    torch.set_num_threads(opts.threads)
    module = _load(path)
    torch.manual_seed(opts.seed)
    model = module.Model(*module.get_init_inputs()).eval()
    torch.manual_seed(opts.seed + 1)
    inputs = list(module.get_inputs())
    row: dict[str, Any] = {"name": path.stem}
    with torch.no_grad():
        want = model(*inputs)  # warm-up, and the reference
        eager_s = _time_calls(model, inputs, 1)
        if eager_s * 1e3 <= 1.5 * opts.max_eager_ms:  # far above the bound: one warm call says enough
            eager_s = _eager_seconds(model, inputs)
        row["eager_ms"] = 1e3 * eager_s
        if row["eager_ms"] > opts.max_eager_ms:
            return row | {"skipped": True}
        fns = {c: _compiled(model, c, opts.threads) for c in opts.contenders}
        first: dict[str, float] = {}
        for c in opts.contenders:
            start = time.perf_counter()
            got = fns[c](*inputs)
            first[c] = time.perf_counter() - start
            if c == "pbsdk":
                row |= _compare(got, want, opts.atol, opts.rtol) | _pbsdk_reports()
            elif c == "inductor":
                row["inductor_correct"] = _compare(got, want, opts.atol, opts.rtol)["correct"]
        row["first_s"] = first["pbsdk"]
        row["first_s_all"] = first
        row |= _latency(fns, inputs, opts, eager_s)
    return row


def _latency(fns: dict[str, Any], inputs: Sequence[Any], opts: argparse.Namespace, eager_s: float) -> dict[str, Any]:
    names = list(fns)
    for fn in fns.values():  # warm: a second call (the pbsdk output pool, Inductor's first steady call)
        fn(*inputs)
    reps = max(1, round(opts.block_s / max(eager_s, 1e-6)))
    per_round: dict[str, list[float]] = {c: [] for c in names}
    for r in range(opts.rounds):
        for c in names[r % len(names):] + names[:r % len(names)]:
            per_round[c].append(_time_calls(fns[c], inputs, reps))
    out: dict[str, Any] = {"reps": reps, "latency_ms": {c: 1e3 * statistics.median(v) for c, v in per_round.items()},
                           "per_round_ms": {c: [1e3 * x for x in v] for c, v in per_round.items()}}
    for other, key in (("eager", "speedup"), ("inductor", "speedup_inductor")):
        if other in per_round:
            ratios = [o / p for o, p in zip(per_round[other], per_round["pbsdk"])]
            out[key] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    if "floor" in per_round:
        ratios = [e / f for e, f in zip(per_round["eager"], per_round["floor"])]
        out["floor_speedup"] = {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}
    return out


# ------------------------------------------------------------------------------------------ the sweep

def _child(path: Path, argv: list[str], timeout: float) -> dict[str, Any]:
    cmd = [sys.executable, __file__, "--child", str(path), *argv]
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"name": path.stem, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return {"name": path.stem, "error": tail[:300]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def _cpu() -> str:
    from pbsdk.bench import cpu_model

    return f"{cpu_model(cpuid=True)}, {os.cpu_count()} cores"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--root", type=Path, help="a KernelBench checkout")
    p.add_argument("--level", type=int, default=2)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads and pbsdk's threads option")
    p.add_argument("--max-eager-ms", type=float, default=150.0, help="skip problems whose eager call is slower")
    p.add_argument("--only", help="a regular expression: the problem files whose name it is found in")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--block-s", type=float, default=0.2, help="seconds of calls per contender per round")
    p.add_argument("--contenders", default="eager,pbsdk", help="comma-separated, of eager,pbsdk,inductor,floor")
    p.add_argument("--atol", type=float, default=1e-2)
    p.add_argument("--rtol", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--timeout", type=float, default=900, help="seconds per problem")
    p.add_argument("--source", help="what --root is, for the report (e.g. 'KernelBench c6c4ab6')")
    p.add_argument("--json", type=Path, help="write the rows and the summary here (rows of a previous run "
                   "with the same names are replaced)")
    p.add_argument("--md", type=Path, help="write the markdown table here")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    args.contenders = [c for c in CONTENDERS if c in args.contenders.split(",")]
    if "pbsdk" not in args.contenders or "eager" not in args.contenders:
        raise SystemExit("--contenders must include eager and pbsdk")
    if args.child:
        print(json.dumps(run_problem(args.child, args)), flush=True)
        return 0
    if args.root is None:
        raise SystemExit("--root DIR (a KernelBench checkout) is required")
    files = problem_files(args.root, args.level, args.only)
    child_argv = ["--threads", str(args.threads), "--max-eager-ms", str(args.max_eager_ms), "--rounds",
                  str(args.rounds), "--block-s", str(args.block_s), "--contenders", ",".join(args.contenders),
                  "--atol", str(args.atol), "--rtol", str(args.rtol), "--seed", str(args.seed)]
    previous = json.loads(args.json.read_text()) if args.json and args.json.exists() else {}
    names = {p.stem for p in files}
    rows = [r for r in previous.get("rows", []) if r["name"] not in names]
    loads: list[float] = []
    meta = {"level": args.level, "root": str(args.root), "source": args.source or str(args.root),
            "threads": args.threads, "max_eager_ms": args.max_eager_ms, "rounds": args.rounds,
            "block_s": args.block_s, "atol": args.atol, "rtol": args.rtol, "cpu": _cpu(),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    for path in files:
        loads.append(os.getloadavg()[0])
        row = _child(path, child_argv, args.timeout) | {"load_before": loads[-1]}
        rows.append(row)
        rows.sort(key=lambda r: int(r["name"].split("_", 1)[0]))
        print(markdown([row], meta).splitlines()[-1], flush=True)
        meta["load"] = f"{min(loads):.1f}-{max(loads):.1f}"
        if args.json:
            args.json.write_text(json.dumps({"meta": meta, "summary": summarize(rows), "rows": rows}, indent=1))
    md = markdown(rows, meta)
    print(md)
    if args.md:
        args.md.write_text(md + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
