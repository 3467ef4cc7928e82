"""Issue #31: ``generate()`` as people run it. A Hugging Face decoder from its own config (random weights,
nothing downloaded, ``use_cache=True`` left alone), its ``forward`` compiled by ``torch.compile`` with
backend ``pbsdk`` and with Inductor, against eager, all in one process: greedy decoding of ``--new`` tokens
after a ``--prompt``-token prompt, with the default dynamic cache (``DynamicCache``: each step's keys and
values one longer, so Dynamo traces the decode step with a symbolic length) or a static cache
(``cache_implementation="static"``).

Per model, cache and batch, each contender's ``forward`` is compiled once and:

- its first ``generate()`` is timed (compiles included) and its tokens compared with eager's (equal, or the
  first position where they differ); then a prompt-only and a full ``generate()`` more (a static cache,
  initialised by then, gives the prompt a graph of its own), and the graphs Dynamo compiled in all three
  are counted;
- then rounds of interleaved calls, the order rotated per round: ``generate(max_new_tokens=new)`` and
  ``generate(max_new_tokens=1)`` (the prompt alone); decode tokens/s = ``(new - 1) * batch /`` their
  difference. A contender's figure is the median over rounds; the ratio to Inductor is the median of the
  per-round ratios, with their min..max.

Graphs compiled: Dynamo's ``unique_graphs`` counter for each contender (pbsdk's `CompileReport`s give the
ops compiled per graph, the compile seconds and the ops left to torch). ``compiled_during_rounds`` must
be 0 (no timed call compiles).

    python benchmarks/generate_decode.py --models gpt2 llama --caches dynamic static --batches 1 8 \\
        --threads 1 --json benchmarks/results/generate_decode.json
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from typing import Any

CONTENDERS = ("pbsdk", "inductor", "eager")

#: A Llama-style decoder (the shape of benchmarks/moe_decoders.py's; 8 query / 2 key-value heads).
LLAMA = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 1024}


def build(name: str) -> Any:
    from pbsdk.testing.torchvision import import_transformers

    tf = import_transformers()
    import torch

    torch.manual_seed(0)
    if name == "gpt2":
        return tf.GPT2LMHeadModel(tf.GPT2Config()).eval()  # 12 layers, d 768: GPT-2 small's shape
    if name == "llama":
        return tf.LlamaForCausalLM(tf.LlamaConfig(**LLAMA)).eval()
    if name == "qwen2":
        return tf.Qwen2ForCausalLM(tf.Qwen2Config(**LLAMA)).eval()
    raise SystemExit(f"unknown model {name!r} (gpt2, llama, qwen2)")


def _generate(model: Any, ids: Any, new: int, cache: str) -> Any:
    kw: dict[str, Any] = {"max_new_tokens": new, "min_new_tokens": new, "do_sample": False,
                          "attention_mask": ids.new_ones(ids.shape), "pad_token_id": 0}
    if cache == "static":
        kw["cache_implementation"] = "static"
    return model.generate(ids, **kw)


def _first_difference(got: Any, want: Any) -> int | None:
    if got.shape == want.shape and bool((got == want).all()):
        return None
    n = min(got.shape[1], want.shape[1])
    diff = (got[:, :n] != want[:, :n]).any(dim=0).nonzero()
    return int(diff[0]) if len(diff) else n


def run_case(name: str, cache: str, batch: int, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    import pbsdk.frontends.torch as pbsdk_torch

    # Each case as in a fresh process: Dynamo remembers which sizes changed between calls of a code object
    # (automatic dynamic shapes), so a batch-1 case would make the next case's batch symbolic from its
    # first call.
    torch._dynamo.reset()
    base = build(name)
    # One model per contender (the same weights): a static cache lives on its model, so each contender
    # keeps its own, as a user's single model would.
    models = {who: copy.deepcopy(base) if who != "eager" else base for who in CONTENDERS}
    ids = torch.randint(0, 1000, (batch, args.prompt), generator=torch.Generator().manual_seed(1))
    row: dict[str, Any] = {"model": name, "cache": cache, "batch": batch, "prompt": args.prompt, "new": args.new}
    with torch.no_grad():
        want = _generate(base, ids, args.new, cache)
        for who in ("pbsdk", "inductor"):
            model = models[who]
            stats = torch._dynamo.utils.counters["stats"]
            before, reports_before = int(stats["unique_graphs"]), len(pbsdk_torch.reports())
            options = {"compile_options": {"threads": args.threads}} if who == "pbsdk" else None
            model.forward = torch.compile(model.forward, backend=who, options=options)
            start = time.perf_counter()
            got = _generate(model, ids, args.new, cache)
            row[f"{who}_first_s"] = round(time.perf_counter() - start, 2)
            row[f"{who}_differs_at"] = _first_difference(got, want)
            _generate(model, ids, 1, cache)  # a later prompt (a static cache is then initialised: its own graph)
            _generate(model, ids, args.new, cache)
            row[f"{who}_graphs"] = int(stats["unique_graphs"]) - before
            if who == "pbsdk":
                reports = pbsdk_torch.reports()[reports_before:]
                row["pbsdk_ops"] = [f"{r.compiled_ops}/{r.graph_ops}" for r in reports]
                row["pbsdk_compile_s"] = [round(r.seconds, 1) for r in reports]
                row["pbsdk_left_to_torch"] = sorted({*(o for r in reports for o in r.fallback_ops),
                                                     *(o for r in reports for o in r.dynamic_ops)})
                row["pbsdk_failed_partitions"] = sum(r.failed_partitions for r in reports)
        graphs = int(torch._dynamo.utils.counters["stats"]["unique_graphs"])
        rates: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(args.rounds):
            order = CONTENDERS[r % 3:] + CONTENDERS[:r % 3]
            for who in order:
                model = models[who]
                start = time.perf_counter()
                _generate(model, ids, 1, cache)
                prefill = time.perf_counter() - start
                start = time.perf_counter()
                _generate(model, ids, args.new, cache)
                total = time.perf_counter() - start
                rates[who].append((args.new - 1) * batch / max(total - prefill, 1e-9))
        # Nothing may compile inside the rounds: their times would include it.
        row["compiled_during_rounds"] = int(torch._dynamo.utils.counters["stats"]["unique_graphs"]) - graphs
    for who in CONTENDERS:
        row[f"{who}_decode_tok_s"] = round(statistics.median(rates[who]), 1)
    ratios = [p / i for p, i in zip(rates["pbsdk"], rates["inductor"])]
    row["pbsdk_vs_inductor"] = round(statistics.median(ratios), 3)
    row["pbsdk_vs_inductor_range"] = [round(min(ratios), 3), round(max(ratios), 3)]
    row["pbsdk_vs_eager"] = round(statistics.median(p / e for p, e in zip(rates["pbsdk"], rates["eager"])), 3)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt2", "llama"])
    ap.add_argument("--caches", nargs="+", default=["dynamic", "static"], choices=["dynamic", "static"])
    ap.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=128)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    import torch

    from pbsdk.bench import cpu_model

    torch.set_num_threads(args.threads)
    # Both compiled forwards live in Dynamo's cache of one code object (no reset between contenders, which
    # would make the rounds recompile); room for both sets of graphs and the static cache's re-initialised
    # prompt.
    torch._dynamo.config.recompile_limit = 64
    torch._dynamo.config.accumulated_recompile_limit = 512
    rows = []
    for name in args.models:
        for cache in args.caches:
            for batch in args.batches:
                row = run_case(name, cache, batch, args)
                row["cpu"] = cpu_model()
                row["load"] = round(os.getloadavg()[0], 2)
                print(json.dumps(row), flush=True)
                rows.append(row)
                if args.json:
                    with open(args.json, "w") as f:
                        json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
