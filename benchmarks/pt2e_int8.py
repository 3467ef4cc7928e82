"""PT2E int8 models on the host's int8 unit (issue #30): pbsdk vs Inductor on the same quantized graph.

Each model goes through torchao's real flow — ``torch.export``, ``prepare_pt2e`` with the
``X86InductorQuantizer`` (u8 asymmetric activations, i8 per-channel weights), calibration on 8 random
batches, ``convert_pt2e`` — and the converted graph is then compiled by each contender:

- ``pbsdk``: ``torch.compile(gm, backend="pbsdk")`` (the cpu target; its i8 contractions on VNNI's
  ``vpdpbusd`` or AMX's ``tdpbssd`` where the host has them, the compile report saying how many),
- ``inductor``: ``torch.compile(gm)`` with ``torch._inductor.config.freezing = True`` — PyTorch's documented
  x86 int8 path, which lowers the quantized patterns to oneDNN's int8 convolutions and linears,
- ``eager``: the converted graph as it is (reference-quantized ops in f32).

All three in one process, interleaved blocks of calls, median over rounds; speed-up = other / pbsdk. The
outputs are compared with eager's (relative max error). Run on a quiet machine and name the CPU::

    .venv/bin/python benchmarks/pt2e_int8.py --models resnet18 mlp --batches 1 8 --threads 1 \\
        --json benchmarks/results/pt2e_int8.json --md benchmarks/results/pt2e_int8.md
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pbsdk.bench import cpu_model

CONTENDERS = ("pbsdk", "inductor", "eager")
#: The host int8 units the cpu target lowers (VNNI's dot product, AMX's tile product, AVX2's vpmaddwd).
INT8_UNITS = ("vpdpbusd", "tdpbssd", "vpmaddwd")


def _pt2e() -> dict[str, Any]:
    """torchao's PT2E entry points (its import warnings about CUDA kernels it does not need muted)."""
    loggers = [logging.getLogger(n) for n in ("torchao", "torch.utils._pytree")]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    from torchao.quantization.pt2e import quantize_pt2e
    from torchao.quantization.pt2e.quantizer import x86_inductor_quantizer as x86

    return {"prepare": quantize_pt2e.prepare_pt2e, "convert": quantize_pt2e.convert_pt2e,
            "quantizer": lambda: x86.X86InductorQuantizer().set_global(x86.get_default_x86_inductor_quantization_config())}


def _model(name: str, batch: int) -> tuple[Any, Any]:
    """The float model (random weights, eval mode) and an input batch."""
    import torch

    torch.manual_seed(0)
    if name == "resnet18":
        from pbsdk.testing.torchvision import import_torchvision

        tv = import_torchvision()
        return _own_relus(tv.models.resnet18().eval()), torch.randn(batch, 3, 224, 224)
    if name == "mlp":  # a transformer block's feed-forward at BERT-base width, on 128 tokens per batch entry
        mlp = torch.nn.Sequential(torch.nn.Linear(768, 3072), torch.nn.ReLU(), torch.nn.Linear(3072, 768)).eval()
        return mlp, torch.randn(batch * 128, 768)
    raise SystemExit(f"unknown model {name!r}; known: resnet18, mlp")


def _own_relus(resnet: Any) -> Any:
    """``resnet`` with each BasicBlock's second ReLU its own module: torchvision's block calls one ``self.relu``
    twice, torch.export records both calls as one source partition, and torchao 0.18's x86 quantizer then
    rejects it ("Input partition has more than one output node"). Same arithmetic."""
    import copy
    import types

    from torchvision.models.resnet import BasicBlock

    def forward(self: Any, x: Any) -> Any:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu_out(self.bn2(self.conv2(out)) + identity)

    for block in resnet.modules():
        if isinstance(block, BasicBlock):
            block.relu_out = copy.deepcopy(block.relu)
            block.forward = types.MethodType(forward, block)
    return resnet


def quantized(name: str, batch: int) -> tuple[Any, Any]:
    """``name`` through PT2E with the x86 quantizer, calibrated on 8 random batches; and an input."""
    import torch

    pt2e = _pt2e()
    model, x = _model(name, batch)
    prepared = pt2e["prepare"](torch.export.export(model, (x,)).module(), pt2e["quantizer"]())
    with torch.no_grad():
        for _ in range(8):
            prepared(torch.randn_like(x))
    return pt2e["convert"](prepared), x


def _compiled(gm: Any, contender: str, threads: int) -> Any:
    import torch

    if contender == "pbsdk":
        return torch.compile(gm, backend="pbsdk", options={"compile_options": {"threads": threads}})
    if contender == "inductor":
        import torch._inductor.config as cfg

        cfg.freezing = True
        return torch.compile(gm)
    return gm


def measure(name: str, batch: int, threads: int, rounds: int, block_s: float) -> dict[str, Any]:
    import torch

    import pbsdk.frontends.torch as pt

    torch.set_num_threads(threads)
    gm, x = quantized(name, batch)
    torch._dynamo.reset()
    pt.clear_reports()
    first: dict[str, float] = {}
    outs: dict[str, Any] = {}
    with torch.no_grad():
        fns = {}
        for c in CONTENDERS:
            fns[c] = _compiled(gm, c, threads)
            start = time.perf_counter()
            outs[c] = fns[c](x)
            first[c] = time.perf_counter() - start
        reports = pt.reports()
        ref = outs["eager"].float()
        scale = max(float(ref.abs().max()), 1e-30)
        errors = {c: float((outs[c].float() - ref).abs().max()) / scale for c in ("pbsdk", "inductor")}
        start = time.perf_counter()
        fns["eager"](x)
        reps = max(1, int(block_s / max(time.perf_counter() - start, 1e-6)))
        per_round: dict[str, list[float]] = {c: [] for c in CONTENDERS}
        for r in range(rounds):
            for c in CONTENDERS[r % 3:] + CONTENDERS[:r % 3]:
                start = time.perf_counter()
                for _ in range(reps):
                    fns[c](x)
                per_round[c].append((time.perf_counter() - start) / reps)
    planned = [c for r in reports for k in r.kernels for c in (k.executable.resources or {}).get("contractions", [])]
    ratios = {o: [a / p for a, p in zip(per_round[o], per_round["pbsdk"])] for o in ("inductor", "eager")}
    return {"model": name, "batch": batch, "threads": threads, "cpu": cpu_model(), "reps": reps, "rounds": rounds,
            "first_s": first, "relative_error": errors,
            "fallback_ops": sorted({o for r in reports for o in r.fallback_ops}),
            "graphs": len(reports), "ops": [sum(r.compiled_ops for r in reports), sum(r.graph_ops for r in reports)],
            "i8_contractions_on_unit": sum(c.get("unit") in INT8_UNITS for c in planned),
            "i8_contractions": sum(c.get("dtype") == "i8" for c in planned),
            "latency_ms": {c: 1e3 * statistics.median(v) for c, v in per_round.items()},
            "speedup": {o: {"median": statistics.median(v), "min": min(v), "max": max(v)} for o, v in ratios.items()}}


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| model | batch | threads | latency ms: pbsdk / Inductor / eager | pbsdk vs Inductor (min-max) | "
            "pbsdk vs eager | i8 contractions on a unit | fallbacks | rel. error pbsdk / Inductor | "
            "first call s: pbsdk / Inductor |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        lat, s = r["latency_ms"], r["speedup"]
        lines.append(f"| {r['model']} | {r['batch']} | {r['threads']} | {lat['pbsdk']:.2f} / {lat['inductor']:.2f} / "
                     f"{lat['eager']:.2f} | {s['inductor']['median']:.2f}x ({s['inductor']['min']:.2f}-"
                     f"{s['inductor']['max']:.2f}) | {s['eager']['median']:.2f}x | {r['i8_contractions_on_unit']} of "
                     f"{r['i8_contractions']} | {', '.join(r['fallback_ops']) or 'none'} | "
                     f"{r['relative_error']['pbsdk']:.1e} / {r['relative_error']['inductor']:.1e} | "
                     f"{r['first_s']['pbsdk']:.1f} / {r['first_s']['inductor']:.1f} |")
    cpus = sorted({r["cpu"] for r in rows})
    return (f"CPU: {', '.join(cpus)}. PT2E (X86InductorQuantizer) graphs; Inductor with freezing. Median of "
            f"{rows[0]['rounds'] if rows else 0} rounds of interleaved blocks; speed-up = other / pbsdk.\n\n"
            + head + "\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet18", "mlp"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block-s", type=float, default=0.5)
    parser.add_argument("--json", help="write the rows here (JSON)")
    parser.add_argument("--md", help="write the markdown table here")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one row, in a process of its own (Dynamo's and Inductor's global state stay per row)
        print(json.dumps(measure(args.models[0], args.batches[0], args.threads, args.rounds, args.block_s)))
        return
    rows = []
    for name in args.models:
        for batch in args.batches:
            out = subprocess.run([sys.executable, __file__, "--child", "--models", name, "--batches", str(batch),
                                  "--threads", str(args.threads), "--rounds", str(args.rounds), "--block-s",
                                  str(args.block_s)], stdout=subprocess.PIPE, text=True, check=True)
            row = json.loads(out.stdout.strip().splitlines()[-1])
            rows.append(row)
            print(table([row]).splitlines()[-1], flush=True)
    text = table(rows)
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if args.md:
        Path(args.md).write_text(text)


if __name__ == "__main__":
    main()
