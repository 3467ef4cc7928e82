"""Fused attention in the transformers real models (issue #15): the same model through
``torch.compile(backend="pbsdk")`` with attention fused (the default) and with ``fuse_attention=False`` (the
unfused matmul + masked softmax + matmul the transformers graphs ran before their masks were recognised).

- ``first``: the first call in a fresh process with an empty pbsdk cache, per variant, alternating
  (fused, unfused, fused, ...) for ``--first-repeats`` pairs: Dynamo, tracing, compiling, one run; plus
  pbsdk's own share (the `CompileReport` seconds) and the number of fused attentions.
- ``latency``: one more process holds both variants (compiled from the caches just filled) and eager
  torch, and times them in interleaved blocks of calls (the order rotates each round); a variant's round
  figure is the block's mean per call, the latency is the median over rounds, the ratio's spread the
  min..max of the per-round ratios unfused / fused. Each output is compared with eager once.

The load average (1 min) is recorded before and after every process: the host is shared.

    PYTHONPATH=. .venv/bin/python benchmarks/attention_masks.py --model gpt2 --threads 1 --json out.json
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
from typing import Any

VARIANTS = ("fused", "unfused")


def _compiled(model: Any, variant: str, threads: int) -> Any:
    import torch

    options: dict[str, Any] = {"threads": threads} if threads else {}
    if variant == "unfused":
        options["fuse_attention"] = False
    return torch.compile(model, backend="pbsdk", options={"compile_options": options})


def _setup(name: str, batch: int, threads: int) -> tuple[Any, tuple[Any, ...]]:
    import torch

    from pbsdk.testing.real_models import MODELS

    if threads:
        torch.set_num_threads(threads)
    return MODELS[name].build(batch)


def child_first(name: str, batch: int, variant: str, threads: int) -> dict[str, Any]:
    import torch

    import pbsdk.frontends.torch as pbsdk_torch

    model, inputs = _setup(name, batch, threads)
    start = time.perf_counter()
    with torch.no_grad():
        _compiled(model, variant, threads)(*inputs)
    seconds = time.perf_counter() - start
    reports = pbsdk_torch.reports()
    return {"variant": variant, "first_s": seconds, "backend_s": sum(r.seconds for r in reports),
            "fused_attention": sum(r.fused_attention for r in reports)}


def child_latency(name: str, batch: int, threads: int, rounds: int, block_s: float) -> dict[str, Any]:
    import torch

    model, inputs = _setup(name, batch, threads)
    calls = {"eager": model}
    errors = {}
    with torch.no_grad():
        expected = model(*inputs)
        for variant in VARIANTS:
            calls[variant] = _compiled(model, variant, threads)
            out = calls[variant](*inputs)
            errors[variant] = float((out - expected).abs().max() / expected.abs().max())
        names = list(calls)
        per_round: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            for n in names[r % len(names):] + names[:r % len(names)]:
                fn, count, start = calls[n], 0, time.perf_counter()
                while True:
                    fn(*inputs)
                    count += 1
                    elapsed = time.perf_counter() - start
                    if elapsed >= block_s:
                        break
                per_round[n].append(elapsed / count)
    ratios = [u / f for u, f in zip(per_round["unfused"], per_round["fused"])]
    return {"latency_ms": {n: statistics.median(v) * 1e3 for n, v in per_round.items()},
            "rounds_ms": {n: [x * 1e3 for x in v] for n, v in per_round.items()},
            "unfused_over_fused": statistics.median(ratios), "ratio_spread": [min(ratios), max(ratios)],
            "rel_error_vs_eager": errors}


def _spawn(args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    load = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, __file__, *args], check=False, env=env, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"child {args} failed:\n{proc.stderr[-4000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["load_before_after"] = [load, os.getloadavg()[0]]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="gpt2")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--threads", type=int, default=1, help="torch and pbsdk threads (0: their defaults)")
    ap.add_argument("--first-repeats", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--block-s", type=float, default=1.0)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--json")
    ap.add_argument("--child", choices=("first", "latency"), help=argparse.SUPPRESS)
    ap.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child == "first":
        print(json.dumps(child_first(a.model, a.batch, a.variant, a.threads)))
        return
    if a.child == "latency":
        print(json.dumps(child_latency(a.model, a.batch, a.threads, a.rounds, a.block_s)))
        return
    common = ["--model", a.model, "--batch", str(a.batch), "--threads", str(a.threads)]
    result: dict[str, Any] = {"model": a.model, "batch": a.batch, "threads": a.threads, "first": []}
    with tempfile.TemporaryDirectory(prefix="pbsdk-attn-masks-") as tmp:
        for i in range(a.first_repeats):
            for variant in VARIANTS:  # fresh, empty cache per first call
                env = dict(os.environ, PBSDK_CACHE_DIR=os.path.join(tmp, f"{variant}-{i}"))
                env.pop("PBSDK_DISABLE_CACHE", None)
                r = _spawn(common + ["--child", "first", "--variant", variant], env, a.timeout)
                print(json.dumps(r), flush=True)
                result["first"].append(r)
        # The latency process loads the fused variant from its cache and compiles the unfused one (untimed).
        cache = f"fused-{a.first_repeats - 1}" if a.first_repeats else "latency"
        env = dict(os.environ, PBSDK_CACHE_DIR=os.path.join(tmp, cache))
        env.pop("PBSDK_DISABLE_CACHE", None)
        result["latency"] = _spawn(common + ["--child", "latency", "--rounds", str(a.rounds), "--block-s",
                                             str(a.block_s)], env, a.timeout)
    print(json.dumps(result["latency"]), flush=True)
    for variant in VARIANTS:
        firsts = [r for r in result["first"] if r["variant"] == variant]
        if not firsts:
            print(f"{variant:8s} latency {result['latency']['latency_ms'][variant]:.2f} ms")
            continue
        first = ", ".join(f"{r['first_s']:.1f}" for r in firsts)
        backend = ", ".join(f"{r['backend_s']:.1f}" for r in firsts)
        print(f"{variant:8s} first call {first} s (pbsdk {backend} s), fused attention "
              f"{firsts[0]['fused_attention']}, latency {result['latency']['latency_ms'][variant]:.2f} ms")
    lat = result["latency"]
    print(f"eager latency {lat['latency_ms']['eager']:.2f} ms; unfused / fused {lat['unfused_over_fused']:.3f}x "
          f"({lat['ratio_spread'][0]:.3f}-{lat['ratio_spread'][1]:.3f})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
