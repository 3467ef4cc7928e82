"""The real-model tier's benchmark (issue #15, item 3): pbsdk vs eager vs Inductor on torchvision and Hugging
Face model definitions with random weights (pbsdk.testing.real_models; nothing downloaded).

Per model and batch size:

- ``first``: the first call in a fresh process, per contender, each with an empty cache (pbsdk's on-disk
  cache and Inductor's are fresh temporary directories): Dynamo, tracing, compiling, loading, one run.
  Eager's "first call" is its first run.
- ``peak``: that process's peak resident set (VmHWM) minus its resident set right after the model was
  built, i.e. what compiling and running added on top of the model and its weights.
- ``latency``: one further process holds all three contenders (pbsdk and Inductor compile from the caches
  the first-call runs filled) and times them in interleaved blocks: each round runs every contender for
  a block of calls (in a rotated order), a contender's round figure is the block's mean per call, the
  latency is the median over rounds, and each speed ratio's spread is the min..max of the per-round
  ratios. The outputs are compared with eager once (maximum error relative to the output's magnitude).
  Each contender's first call in this process is recorded too (``cached_first_s``: pbsdk from its on-disk
  cache in a fresh process, Inductor from its FX graph cache).

``--dtype bf16`` runs every contender on the same bf16 model: ``model.to(torch.bfloat16)``, floating-point
inputs cast to bf16 (token ids and masks stay integers). The error is the maximum absolute difference from
eager's output (both taken to f32) over the maximum magnitude of eager's output, and it is judged against the
dtype's bound (`ERROR_BOUND`: ``error_ok`` in the rows, ``FAIL`` in the table). Rows carry their dtype; the
JSON keeps one row per (model, batch, dtype), so f32 rows and bf16 rows of the same model live side by side.

Example (the table goes to stdout and, as markdown, to ``--md``):

    .venv/bin/python benchmarks/real_models.py --models resnet18 gpt2 --batches 1 8 \\
        --json benchmarks/results/real_models.json --md benchmarks/results/real_models.md
    .venv/bin/python benchmarks/real_models.py --dtype bf16 --models resnet50 gpt2 llama --batches 1 8 \
        --threads 2 --rounds 3
    .venv/bin/python benchmarks/real_models.py --models issue32 --threads 1 --rounds 5 --block-s 0.3 \
        --json benchmarks/results/real_models_issue32.json --md benchmarks/results/real_models_issue32.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

CONTENDERS = ("pbsdk", "eager", "inductor")
DTYPES = ("f32", "bf16")

#: The largest error (max |out - eager| / max |eager|, over the whole output) a contender may show, per
#: dtype. f32: the real-model tests' full-size bound (contractions up to 3072 long, 12 layers). bf16: every
#: contender rounds its intermediates to bf16 in its own places (eager after each op, Inductor and pbsdk
#: after each fused kernel, with f32 inside), so two correct runs differ by a few roundings of u = 2^-8 per
#: layer; 5e-2 is ~13 u (measured at batch 1 and 8: ResNet-50 3.6e-3..7.2e-3, GPT-2 1.2e-2, Llama 8e-3..1e-2,
#: Inductor alike).
ERROR_BOUND = {"f32": 2e-3, "bf16": 5e-2}


def _status_mb(key: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _threads() -> int | None:
    """``--threads N`` (passed to the children as PBSDK_BENCH_THREADS): every contender on N threads."""
    value = os.environ.get("PBSDK_BENCH_THREADS")
    if not value:
        return None
    import torch

    torch.set_num_threads(int(value))
    return int(value)


def _build(name: str, batch: int, dtype: str) -> tuple[Any, tuple[Any, ...]]:
    """The model and its inputs at ``dtype``: bf16 casts the parameters, buffers and floating-point inputs."""
    import torch

    from pbsdk.testing.real_models import MODELS

    model, inputs = MODELS[name].build(batch)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
        inputs = tuple(x.to(torch.bfloat16) if x.is_floating_point() else x for x in inputs)
    return model, inputs


def _compiled(model: Any, contender: str) -> Any:
    import torch

    if contender == "pbsdk":
        threads = int(os.environ.get("PBSDK_BENCH_THREADS") or 0)
        options: Any = {"compile_options": {"threads": threads}} if threads else None
        return torch.compile(model, backend="pbsdk", options=options)
    if contender == "inductor":
        return torch.compile(model)
    return model


def child_first(name: str, batch: int, contender: str, dtype: str) -> dict[str, Any]:
    """One fresh process: build the model, time the contender's first call, peak memory over built."""
    import torch

    _threads()
    model, inputs = _build(name, batch, dtype)
    built = _status_mb("VmRSS")
    with torch.no_grad():
        fn = _compiled(model, contender)
        start = time.perf_counter()
        fn(*inputs)
        first = time.perf_counter() - start
    result: dict[str, Any] = {"first_s": first, "built_mb": built, "peak_mb": _status_mb("VmHWM"),
                              "added_mb": _status_mb("VmHWM") - built}
    if contender == "pbsdk":
        import pbsdk.frontends.torch as pt

        reports = pt.reports()
        result |= {"pbsdk_s": sum(r.seconds for r in reports), "partitions": sum(r.partitions for r in reports),
                   "fallback_ops": sorted({o for r in reports for o in r.fallback_ops}),
                   "fused_attention": sum(r.fused_attention for r in reports)}
    return result


def child_latency(name: str, batch: int, rounds: int, block_s: float, dtype: str) -> dict[str, Any]:
    """All contenders in one process, interleaved blocks, median over rounds."""
    import torch

    _threads()
    model, inputs = _build(name, batch, dtype)
    with torch.no_grad():
        fns = {c: _compiled(model, c) for c in CONTENDERS}
        outs, warm_first_s = {}, {}
        for c, fn in fns.items():  # compile from the caches the first-call runs filled, and warm up
            start = time.perf_counter()
            outs[c] = fn(*inputs)
            warm_first_s[c] = time.perf_counter() - start
        ref = outs["eager"].float()
        scale = float(ref.abs().max())
        errors = {c: float((outs[c].float() - ref).abs().max()) / max(scale, 1e-30) for c in ("pbsdk", "inductor")}
        start = time.perf_counter()
        fns["eager"](*inputs)
        reps = max(1, int(block_s / max(time.perf_counter() - start, 1e-6)))
        per_round: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(rounds):
            order = CONTENDERS[r % 3:] + CONTENDERS[:r % 3]
            for c in order:
                fn = fns[c]
                start = time.perf_counter()
                for _ in range(reps):
                    fn(*inputs)
                per_round[c].append((time.perf_counter() - start) / reps)
    ratios = {other: [o / p for o, p in zip(per_round[other], per_round["pbsdk"])] for other in ("eager", "inductor")}
    return {"reps": reps, "rounds": rounds, "relative_error": errors, "output_dtype": str(outs["pbsdk"].dtype),
            "error_ok": {c: e <= ERROR_BOUND[dtype] for c, e in errors.items()}, "cached_first_s": warm_first_s,
            "latency_ms": {c: 1e3 * statistics.median(v) for c, v in per_round.items()},
            "per_round_ms": {c: [1e3 * x for x in v] for c, v in per_round.items()},
            # speed of pbsdk relative to the other contender (> 1: pbsdk faster), median and min..max
            "speedup": {o: {"median": statistics.median(v), "min": min(v), "max": max(v)} for o, v in ratios.items()}}


def _spawn(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    from pbsdk.bench import child_json

    return child_json(__file__, args, env, timeout)


def measure(name: str, batch: int, rounds: int, block_s: float, timeout: float,
            threads: int | None = None, dtype: str = "f32") -> dict[str, Any]:
    root = str(Path(__file__).resolve().parent.parent)
    with tempfile.TemporaryDirectory(prefix="pbsdk-real-") as tmp:
        env = dict(os.environ, PBSDK_CACHE_DIR=os.path.join(tmp, "pbsdk"),
                   TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"))
        env.pop("PBSDK_DISABLE_CACHE", None)
        if threads:
            env["PBSDK_BENCH_THREADS"] = str(threads)
        env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
        row: dict[str, Any] = {"model": name, "batch": batch, "dtype": dtype, "threads": threads, "first": {}}
        for c in CONTENDERS:
            row["first"][c] = _spawn(["--child-first", name, str(batch), c, dtype], env, timeout)
        row["steady"] = _spawn(["--child-latency", name, str(batch), str(rounds), str(block_s), dtype], env,
                               timeout)
    return row


def _fmt_first(r: dict[str, Any]) -> str:
    return "err" if "error" in r else f"{r['first_s']:.1f} s / {r['added_mb']:.0f} MB"


def _key(row: dict[str, Any]) -> tuple[str, int, str]:
    """A row's identity in the JSON: rows written before ``--dtype`` existed are f32."""
    return row["model"], row["batch"], row.get("dtype", "f32")


def table(rows: list[dict[str, Any]]) -> str:
    from pbsdk.testing.real_models import MODELS

    out = [("| model (input) | dtype | batch | first call + peak mem. added: pbsdk | Inductor | eager | latency ms: pbsdk | "
           "eager | Inductor | pbsdk vs Inductor (spread) | pbsdk vs eager | fallbacks | "
           "rel. error: pbsdk | Inductor |"),
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in rows:
        f, s = row["first"], row["steady"]
        model = f"{row['model']} ({MODELS[row['model']].shape})"
        dtype = row.get("dtype", "f32")
        fallbacks = ", ".join(f["pbsdk"].get("fallback_ops", [])) or "none"
        if "error" in s:
            lat = f"error: {s['error']} | | | | "
            err = " | "
        else:
            ms, sp = s["latency_ms"], s["speedup"]
            lat = (f"{ms['pbsdk']:.2f} | {ms['eager']:.2f} | {ms['inductor']:.2f} | "
                   f"{sp['inductor']['median']:.2f}x ({sp['inductor']['min']:.2f}-{sp['inductor']['max']:.2f}) | "
                   f"{sp['eager']['median']:.2f}x ({sp['eager']['min']:.2f}-{sp['eager']['max']:.2f})")
            err = " | ".join(f"{s['relative_error'][c]:.1e}"
                             + ("" if s["relative_error"][c] <= ERROR_BOUND[dtype] else " FAIL")
                             for c in ("pbsdk", "inductor"))
        out.append(f"| {model} | {dtype} | {row['batch']} | {_fmt_first(f['pbsdk'])} | {_fmt_first(f['inductor'])} | "
                   f"{_fmt_first(f['eager'])} | {lat} | {fallbacks} | {err} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet18", "mobilenet_v3_small", "resnet50", "gpt2",
                                                          "bert_base"],
                        help="models of pbsdk.testing.real_models, or issue32 (the thirteen of issue #32)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-s", type=float, default=0.5, help="seconds of calls per contender per round")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--threads", type=int, help="run every contender on this many threads (default: "
                        "each one's own default)")
    parser.add_argument("--dtype", choices=DTYPES, default="f32", help="the model's and its float inputs' dtype "
                        "(bf16: model.to(torch.bfloat16), for every contender)")
    parser.add_argument("--json", help="append the rows to this JSON file (rows of the same model/batch/dtype "
                        "replaced)")
    parser.add_argument("--md", help="write the markdown table of all rows in --json (or of this run) here")
    parser.add_argument("--child-first", nargs=4, help=argparse.SUPPRESS)
    parser.add_argument("--child-latency", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_first:
        name, batch, contender, dtype = args.child_first
        print(json.dumps(child_first(name, int(batch), contender, dtype)))
        return
    if args.child_latency:
        name, batch, rounds, block, dtype = args.child_latency
        print(json.dumps(child_latency(name, int(batch), int(rounds), float(block), dtype)))
        return
    from pbsdk.testing.real_models import ISSUE32, MODELS

    groups = {"issue32": ISSUE32}  # named lists of models
    args.models = [m for name in args.models for m in groups.get(name, (name,))]
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        raise SystemExit(f"unknown models {unknown} (known: {', '.join(MODELS)})")
    rows: list[dict[str, Any]] = []
    if args.json and Path(args.json).exists():
        rows = json.loads(Path(args.json).read_text())
    for name in args.models:
        for batch in args.batches:
            load = os.getloadavg()[0]
            row = measure(name, batch, args.rounds, args.block_s, args.timeout, args.threads, args.dtype)
            row |= {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load_before": load,
                    "load_after": os.getloadavg()[0]}
            rows = [r for r in rows if _key(r) != _key(row)] + [row]
            print(json.dumps(row), flush=True)
            print(table([row]), flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps(rows, indent=2))
    md = table(rows)
    print(md)
    if args.md:
        Path(args.md).write_text(md + "\n")


if __name__ == "__main__":
    main()
