"""ONNX symbolic dimensions (issue #31 item 2): a BERT-style model exported with dynamic batch and sequence
axes, compiled once with symbolic sizes, against the same model compiled with ``input_shapes=`` (static
kernels) for each size ("a dynamic-shape kernel on a size it has not seen is correct and within 1.2x of the
static kernel compiled for that size").

    PBSDK_CACHE_DIR=/tmp/cache .venv/bin/python benchmarks/onnx_symbolic.py [--layers 2] [--hidden 128]
        [--sizes 1x16 1x77 2x128 4x33] [--rounds 7] [--budget 0.2] [--json out.json] [--md out.md]

The model: transformers' ``BertModel`` (random weights, ``add_pooling_layer=False``, 4 heads, intermediate
4x hidden, SDPA attention as exported by the TorchScript exporter) with its last hidden state as output,
exported by `pbsdk.onnx.export.export_module` with ``dim_param`` ``batch`` and ``seq``. Both contenders are
compiled for the cpu target with ``threads=1``; the outputs are compared to each other (and to
onnxruntime) once per size. Timing, in one process: per round each contender runs a block of calls
(``OnnxModel.run``: the whole model, its Python boundary included, numpy in and out), interleaved, timed
with ``time.thread_time`` (this thread's CPU time: one thread, so other processes' load counts less); the
report gives the median per call over rounds and the ratio symbolic / static (median of the per-round
ratios, with their min-max).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from pbsdk.bench import cpu_model


def export_bert(layers: int, hidden: int, positions: int, axes: dict[int, str]) -> bytes:
    import torch

    from pbsdk.onnx.export import export_module
    from pbsdk.testing.real_models import _transformers

    transformers = _transformers()
    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=1024, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=4, intermediate_size=4 * hidden,
                                     max_position_embeddings=positions, attn_implementation="sdpa")
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()

    class Hidden(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.inner = bert

        def forward(self, ids: Any, mask: Any) -> Any:
            return self.inner(input_ids=ids, attention_mask=mask)[0]

    inputs = {"input_ids": np.ones((1, 8), np.int64), "attention_mask": np.ones((1, 8), np.int64)}
    return export_module(Hidden(), inputs, dynamic_axes={n: dict(axes) for n in (*inputs, "out")})


def feeds_for(b: int, s: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    mask = np.ones((b, s), np.int64)
    mask[-1, (s + 1) // 2:] = 0
    return {"input_ids": rng.integers(0, 1024, (b, s)).astype(np.int64), "attention_mask": mask}


def measure(data: bytes, sizes: list[tuple[int, int]], rounds: int, budget: float) -> dict[str, Any]:
    import onnxruntime as ort

    import pbsdk.onnx

    options = {"threads": 1}
    t0 = time.perf_counter()
    symbolic = pbsdk.onnx.load(data, options=options)
    compile_symbolic = time.perf_counter() - t0
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    rows = []
    for b, s in sizes:
        t0 = time.perf_counter()
        static = pbsdk.onnx.load(data, options=options, input_shapes={"input_ids": (b, s), "attention_mask": (b, s)})
        compile_static = time.perf_counter() - t0
        feeds = feeds_for(b, s, rng)
        want = session.run(None, feeds)[0]
        got_sym, got_static = symbolic.run(feeds)[0], static.run(feeds)[0]
        scale = float(np.abs(want).max())
        error = max(float(np.abs(got_sym - want).max()), float(np.abs(got_static - want).max())) / scale
        assert error < 1e-4, error
        t0 = time.thread_time()
        static.run(feeds)
        once = max(time.thread_time() - t0, 1e-6)
        calls = max(1, min(2000, int(budget / once)))
        per: dict[str, list[float]] = {"symbolic": [], "static": []}
        for r in range(rounds):
            order = (("symbolic", symbolic), ("static", static))
            for name, model in order if r % 2 == 0 else order[::-1]:
                t0 = time.thread_time()
                for _ in range(calls):
                    model.run(feeds)
                per[name].append((time.thread_time() - t0) / calls * 1e6)
        ratios = [d / s_ for d, s_ in zip(per["symbolic"], per["static"])]
        row = {"batch": b, "seq": s, "calls": calls, "us": {n: statistics.median(v) for n, v in per.items()},
               "ratio": (statistics.median(ratios), min(ratios), max(ratios)), "compile_static_s": compile_static,
               "max_rel_error": error}
        rows.append(row)
        print(f"batch {b} seq {s}: {row['us']['symbolic']:.1f} / {row['us']['static']:.1f} us = "
              f"{row['ratio'][0]:.3f} ({row['ratio'][1]:.3f}-{row['ratio'][2]:.3f}); static compile "
              f"{compile_static:.1f} s", flush=True)
    return {"cpu": cpu_model(), "rounds": rounds, "threads": 1, "compile_symbolic_s": compile_symbolic, "rows": rows}


def table(result: dict[str, Any], title: str) -> str:
    lines = [(f"{title}. CPU: {result['cpu']}, 1 thread, f32; `OnnxModel.run` thread CPU time per call, median of "
              f"{result['rounds']} interleaved rounds; ratio = symbolic / static (per-round ratios' min-max). "
              f"Symbolic compile (once): {result['compile_symbolic_s']:.0f} s."), "",
             "| batch x seq | symbolic us | static us | ratio (min-max) | static compile s |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        ratio = r["ratio"]
        lines.append(f"| {r['batch']}x{r['seq']} | {r['us']['symbolic']:.1f} | {r['us']['static']:.1f} | "
                     f"{ratio[0]:.3f} ({ratio[1]:.3f}-{ratio[2]:.3f}) | {r['compile_static_s']:.0f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--positions", type=int, default=512)
    parser.add_argument("--sizes", nargs="*", default=["1x16", "1x77", "2x128", "4x33"], help="BATCHxSEQ")
    parser.add_argument("--static-batch", action="store_true",
                        help="only the sequence length symbolic (batch 1 in the model): sizes 1xSEQ")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--budget", type=float, default=0.2, help="seconds per block of calls")
    parser.add_argument("--json", help="write the result here (JSON)")
    parser.add_argument("--md", help="write the markdown table here")
    args = parser.parse_args()
    sizes = [(int(b), int(s)) for b, s in (x.split("x") for x in args.sizes)]
    axes = {1: "seq"} if args.static_batch else {0: "batch", 1: "seq"}
    if args.static_batch and any(b != 1 for b, _ in sizes):
        parser.error("--static-batch: sizes are 1xSEQ")
    result = measure(export_bert(args.layers, args.hidden, args.positions, axes), sizes, args.rounds, args.budget)
    result["model"] = {"layers": args.layers, "hidden": args.hidden, "heads": 4}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    what = "dynamic seq, batch 1" if args.static_batch else "dynamic batch and seq"
    out = table(result, f"BERT-style, {args.layers} layers, hidden {args.hidden}, 4 heads, {what}")
    if args.md:
        Path(args.md).write_text(out)
    print(out)


if __name__ == "__main__":
    main()
