"""Channels-last CNNs (issue #32): the tier's CNNs after ``model.to(memory_format=torch.channels_last)`` with
channels-last inputs — the layout torch's CPU performance guide recommends — against the same model in the
default layout, through ``torch.compile(backend="pbsdk")``.

Per model (pbsdk.testing.real_models, random weights) and batch, one process holds four contenders:
``pbsdk`` (default layout), ``pbsdk_cl`` (channels last), ``inductor_cl`` and ``eager_cl``. After one call
each (compiles, and the outputs checked against eager in the default layout), they run in interleaved
blocks (the order rotated each round); a contender's round figure is its block's mean per call, its figure
the median over rounds, and each ratio's spread the min..max of the per-round ratios. ``--clock cpu`` times
with the calling thread's CPU time (meaningful with ``--threads 1`` only: it leaves out the time the thread
waited for a core while other jobs ran), ``wall`` with ``time.perf_counter``.

The bar: ``pbsdk_cl`` no slower than ``pbsdk`` (ratio ``default / cl`` >= 1 within the noise), 0 fallbacks,
and the channels-last input read in place (``stored_order_inputs``: no copy to C order on a call).

    .venv/bin/python benchmarks/channels_last.py --threads 1 --clock cpu --rounds 7 \\
        --json benchmarks/results/channels_last.json --md benchmarks/results/channels_last.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

CONTENDERS = ("pbsdk", "pbsdk_cl", "inductor_cl", "eager_cl")


def _clock(name: str) -> Any:
    return time.thread_time if name == "cpu" else time.perf_counter


def child(name: str, batch: int, threads: int, rounds: int, block_s: float, clock_name: str) -> dict[str, Any]:
    import torch

    import pbsdk.frontends.torch as pt
    from pbsdk.testing.real_models import MODELS

    torch.set_num_threads(threads)
    model, (x,) = MODELS[name].build(batch)
    model = model.eval()
    cl_model = MODELS[name].build(batch)[0].eval().to(memory_format=torch.channels_last)
    cl_x = x.contiguous(memory_format=torch.channels_last)
    options = {"compile_options": {"threads": threads}}
    fns = {"pbsdk": (torch.compile(model, backend="pbsdk", options=options), x),
           "pbsdk_cl": (torch.compile(cl_model, backend="pbsdk", options=options), cl_x),
           "inductor_cl": (torch.compile(cl_model), cl_x), "eager_cl": (cl_model, cl_x)}
    clock = _clock(clock_name)
    with torch.no_grad():
        ref = model(x)
        scale = float(ref.abs().max())
        first, errors = {}, {}
        for c, (fn, arg) in fns.items():
            before = len(pt.reports())
            start = time.perf_counter()
            out = fn(arg)
            first[c] = time.perf_counter() - start
            errors[c] = float((out - ref).abs().max()) / max(scale, 1e-30)
            if c == "pbsdk_cl":
                reports = pt.reports()[before:]
        start = time.perf_counter()
        fns["pbsdk"][0](x)
        reps = max(1, int(block_s / max(time.perf_counter() - start, 1e-6)))
        per_round: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(rounds):
            for c in CONTENDERS[r % 4:] + CONTENDERS[:r % 4]:
                fn, arg = fns[c]
                start = clock()
                for _ in range(reps):
                    fn(arg)
                per_round[c].append((clock() - start) / reps)
    ratios = {c: [o / p for o, p in zip(per_round[c], per_round["pbsdk_cl"])] for c in CONTENDERS if c != "pbsdk_cl"}
    return {"model": name, "batch": batch, "threads": threads, "clock": clock_name, "rounds": rounds, "reps": reps,
            "relative_error": errors, "first_s": first,
            "fallback_ops": sorted({o for r in reports for o in r.fallback_ops}),
            "stored_order_inputs": sum(r.stored_order_inputs for r in reports),
            "ms": {c: 1e3 * statistics.median(v) for c, v in per_round.items()},
            "per_round_ms": {c: [1e3 * t for t in v] for c, v in per_round.items()},
            # > 1: channels-last pbsdk is faster than that contender
            "cl_speedup": {c: {"median": statistics.median(v), "min": min(v), "max": max(v)} for c, v in ratios.items()}}


def table(rows: list[dict[str, Any]]) -> str:
    out = [("| model | batch | thr | clock | pbsdk ms | pbsdk CL ms | default / CL (spread) | Inductor CL ms | "
            "x Inductor CL | eager CL ms | CL input in place | fallbacks | rel. error CL |"),
           "|---|--:|--:|---|--:|--:|---|--:|--:|--:|---|---|--:|"]
    for r in rows:
        if "error" in r:
            out.append(f"| {r.get('model', '?')} | {r.get('batch', '')} | | | error: {r['error']} | | | | | | | | |")
            continue
        ms, sp = r["ms"], r["cl_speedup"]
        d = sp["pbsdk"]
        out.append(f"| {r['model']} | {r['batch']} | {r['threads']} | {r['clock']} | {ms['pbsdk']:.2f} | "
                   f"{ms['pbsdk_cl']:.2f} | {d['median']:.2f} ({d['min']:.2f}-{d['max']:.2f}) | "
                   f"{ms['inductor_cl']:.2f} | {sp['inductor_cl']['median']:.2f} | {ms['eager_cl']:.2f} | "
                   f"{'yes' if r['stored_order_inputs'] else 'no'} | {', '.join(r['fallback_ops']) or 'none'} | "
                   f"{r['relative_error']['pbsdk_cl']:.1e} |")
    return "\n".join(out)


def main() -> None:
    from pbsdk.testing.real_models import FULL, MODELS

    cnns = [n for n in FULL if MODELS[n].family == "cnn"]
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=cnns, choices=[n for n in MODELS if MODELS[n].family == "cnn"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-s", type=float, default=0.5)
    parser.add_argument("--clock", choices=("wall", "cpu"), default="wall")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json")
    parser.add_argument("--md")
    parser.add_argument("--child", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        name, batch, threads, rounds, block, clock = args.child
        print(json.dumps(child(name, int(batch), int(threads), int(rounds), float(block), clock)))
        return
    from pbsdk.bench import child_json, cpu_model

    root = str(Path(__file__).resolve().parent.parent)
    env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    rows = []
    for name in args.models:
        for batch in args.batches:
            load = os.getloadavg()[0]
            row = child_json(__file__, ["--child", name, str(batch), str(args.threads), str(args.rounds),
                                        str(args.block_s), args.clock], env, args.timeout)
            row |= {"model": name, "batch": batch, "cpu": cpu_model(),
                    "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": load,
                    "load_after": os.getloadavg()[0]}
            rows.append(row)
            print(table([row]), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=2))
    md = table(rows)
    print(md)
    if args.md:
        Path(args.md).write_text(md + "\n")


if __name__ == "__main__":
    sys.exit(main())
