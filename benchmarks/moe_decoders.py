"""Issue #31: a Mixtral-style mixture-of-experts decoder (4 experts, top-2) and a Qwen2-style decoder, as
people call them: ``XForCausalLM`` from its own config (random weights, nothing downloaded), default
``use_cache=True``, ``torch.compile(model, backend="pbsdk")`` against ``torch.compile(model)`` (Inductor)
and eager, all three in one process.

Two calls per model and batch:

- ``prefill``: the logits (and the returned cache) of a ``--seq``-token prompt;
- ``decode``: one new token per sequence after that prompt, with the prompt's ``DynamicCache`` (a deep copy
  of it for every call, made outside the timed region, so every call has the same cache length).

Timing: every contender is compiled and run once (its first call, reported), then rounds of interleaved
blocks (the order rotated per round); a contender's round figure is its block's mean per call, its latency
the median over rounds; the speed ratio is the median of the per-round ratios, with their min..max. The
pbsdk reports give the graphs, the ops compiled and the fallbacks (named).

    python benchmarks/moe_decoders.py --models mixtral qwen2 --batches 1 8 --threads 1 \\
        --json benchmarks/results/moe_decoders.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

CONTENDERS = ("pbsdk", "inductor", "eager")

#: The Llama-style shape of benchmarks/real_models.py's ``llama`` (4 layers, d 512, 8 query / 2 key-value
#: heads); the Mixtral-style model has 4 experts of the same MLP size, 2 per token.
COMMON = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 1024}


def build(name: str) -> Any:
    from pbsdk.testing.torchvision import import_torchvision

    import_torchvision()
    import torch
    import transformers as tf

    torch.manual_seed(0)
    if name == "mixtral":
        config = tf.MixtralConfig(num_local_experts=4, num_experts_per_tok=2, attn_implementation="sdpa", **COMMON)
        return tf.MixtralForCausalLM(config).eval()
    if name == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(attn_implementation="sdpa", **COMMON)).eval()
    raise SystemExit(f"unknown model {name!r} (mixtral, qwen2)")


def _time(fns: dict[str, Any], make_args: Any, rounds: int, block_s: float) -> dict[str, list[float]]:
    """Per-round mean seconds per call of each contender, interleaved, the order rotated per round."""
    start = time.perf_counter()
    fns["eager"](**make_args())
    reps = max(1, int(block_s / max(time.perf_counter() - start, 1e-6)))
    per_round: dict[str, list[float]] = {c: [] for c in fns}
    names = list(fns)
    for r in range(rounds):
        for c in names[r % len(names):] + names[:r % len(names)]:
            calls = [make_args() for _ in range(reps)]  # cache copies made before the clock starts
            start = time.perf_counter()
            for kwargs in calls:
                fns[c](**kwargs)
            per_round[c].append((time.perf_counter() - start) / reps)
    return per_round


def measure(name: str, batch: int, seq: int, rounds: int, block_s: float) -> list[dict[str, Any]]:
    import torch

    import pbsdk.frontends.torch as pt

    threads = torch.get_num_threads()
    model = build(name)
    ids = torch.randint(0, COMMON["vocab_size"], (batch, seq), generator=torch.Generator().manual_seed(1))
    rows = []
    with torch.no_grad():
        prefill = model(ids)
        cache = prefill.past_key_values
        step = prefill.logits[:, -1:].argmax(-1)
        calls = {"prefill": lambda: {"input_ids": ids},
                 "decode": lambda: {"input_ids": step, "past_key_values": copy.deepcopy(cache)}}
        torch._dynamo.reset()
        fns = {"pbsdk": torch.compile(model, backend="pbsdk", options={"compile_options": {"threads": threads}}),
               "inductor": torch.compile(model), "eager": model}
        for call, make_args in calls.items():
            pt.clear_reports()
            outs, first = {}, {}
            for c, fn in fns.items():
                start = time.perf_counter()
                outs[c] = fn(**make_args()).logits
                first[c] = time.perf_counter() - start
            reports = pt.reports()
            ref = outs["eager"]
            errors = {c: float((outs[c] - ref).abs().max() / ref.abs().max()) for c in ("pbsdk", "inductor")}
            per_round = _time(fns, make_args, rounds, block_s)
            ratios = [i / p for i, p in zip(per_round["inductor"], per_round["pbsdk"])]
            rows.append({
                "model": name, "call": call, "batch": batch, "seq": seq, "threads": threads,
                "latency_ms": {c: 1e3 * statistics.median(v) for c, v in per_round.items()},
                "speedup_vs_inductor": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
                "first_s": first, "relative_error": errors, "graphs": len(reports),
                "ops": sum(r.graph_ops for r in reports), "compiled_ops": sum(r.compiled_ops for r in reports),
                "fallback_ops": sorted(o for r in reports for o in r.fallback_ops),
                "failed_partitions": sum(r.failed_partitions for r in reports),
                "fused_attention": sum(r.fused_attention for r in reports)})
            print(_line(rows[-1]), flush=True)
    return rows


def _line(row: dict[str, Any]) -> str:
    lat, s = row["latency_ms"], row["speedup_vs_inductor"]
    return (f"{row['model']:8} {row['call']:8} b{row['batch']:<2} pbsdk {lat['pbsdk']:8.2f} ms  inductor "
            f"{lat['inductor']:8.2f} ms  eager {lat['eager']:8.2f} ms  x{s['median']:.2f} ({s['min']:.2f}.."
            f"{s['max']:.2f})  graphs {row['graphs']}  ops {row['compiled_ops']}/{row['ops']}  fallbacks "
            f"{len(row['fallback_ops'])}  first pbsdk {row['first_s']['pbsdk']:.1f}s inductor "
            f"{row['first_s']['inductor']:.1f}s  err {row['relative_error']['pbsdk']:.1e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["mixtral", "qwen2"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--block-s", type=float, default=0.5, help="seconds of calls per contender per round")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    import transformers

    rows = []
    for name in args.models:
        for batch in args.batches:
            rows += measure(name, batch, args.seq, args.rounds, args.block_s)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        meta = {"transformers": transformers.__version__, "torch": torch.__version__,
                "load_average": os.getloadavg()}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
