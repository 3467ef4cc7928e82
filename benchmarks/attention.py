"""Fused attention vs the unfused pbsdk pipeline vs torch ``scaled_dot_product_attention`` (CPU).

One run, interleaved repeats (each round times every implementation once, so load from other
processes hits all of them alike), medians, ratios = baseline time / fused time. Peak memory is the
resident-set high-water mark of a fresh subprocess running one implementation once (after compiling
and allocating the inputs), so the unfused score matrix shows up and nothing is shared between runs.

    .venv/bin/python benchmarks/attention.py                       # (1, 8, 1024, 64), (1, 8, 4096, 64)
    .venv/bin/python benchmarks/attention.py --causal --json out.json

``--dtype bf16``: torch's ``scaled_dot_product_attention`` on bf16 tensors, every contender on the same
tensors: ``fused`` is ``torch.compile(backend="pbsdk")`` (Q, K, V read as bf16, both matmuls on the host's
bf16 unit where it has one), ``fused-f32`` the same with option ``matrix_units=False`` (the kernel of
before: Q, K, V widened to f32 copies, vector FMAs), ``torch`` eager SDPA (its bf16 flash-attention
kernel), ``inductor`` ``torch.compile``'s default backend. Rounds of interleaved blocks of ``--block``
calls, the block's mean kept; medians over rounds and each ratio's 10th-90th percentile over rounds.

    .venv/bin/python benchmarks/attention.py --dtype bf16 --shapes 1,12,256,64 1,12,1024,64 8,12,128,64 --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

IMPLS = ("fused", "unfused", "torch")


def _inputs(shape: tuple[int, int, int, int]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(shape).astype(np.float32) for _ in range(3)]


def _make(impl: str, causal: bool, threads: int) -> Callable[..., Any]:
    if impl == "torch":
        import torch

        torch.set_num_threads(threads)

        def run(q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                out = torch.nn.functional.scaled_dot_product_attention(
                    torch.from_numpy(q), torch.from_numpy(k), torch.from_numpy(v), is_causal=causal)
            return out.numpy()
        return run
    import pbsdk
    from pbsdk import ops

    options = {"fuse_attention": impl == "fused", "threads": threads}
    fn = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v, causal=causal), options=options)
    return fn  # type: ignore[no-any-return]


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def measure_memory(impl: str, shape: tuple[int, int, int, int], causal: bool, threads: int) -> int:
    """Peak resident bytes one call adds (run in a fresh process by `main`)."""
    q, k, v = _inputs(shape)
    fn = _make(impl, causal, threads)
    if impl != "torch":
        fn.kernel(fn._signature((q, k, v)))  # type: ignore[attr-defined]  # compile first
    else:
        fn(q[..., :1, :], k[..., :1, :], v[..., :1, :])  # load torch's kernels
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # reset the high-water mark
    except OSError:
        pass
    before = _status("VmRSS")
    fn(q, k, v)
    return max(0, _status("VmHWM") - before)


def bench_shape(shape: tuple[int, int, int, int], *, causal: bool, repeats: int, unfused_repeats: int,
                threads: int, impls: tuple[str, ...], memory: bool) -> dict[str, Any]:
    q, k, v = _inputs(shape)
    fns: dict[str, Callable[..., Any]] = {}
    compile_s: dict[str, float] = {}
    outs: dict[str, np.ndarray] = {}
    for impl in impls:
        t0 = time.perf_counter()
        fns[impl] = _make(impl, causal, threads)
        outs[impl] = np.asarray(fns[impl](q, k, v))  # first call: compile (pbsdk) / warm-up
        compile_s[impl] = time.perf_counter() - t0
    times: dict[str, list[float]] = {i: [] for i in impls}
    for r in range(repeats):
        for impl in impls:
            if impl == "unfused" and r >= unfused_repeats:
                continue
            t0 = time.perf_counter()
            fns[impl](q, k, v)
            times[impl].append(time.perf_counter() - t0)
    med = {i: float(np.median(t)) for i, t in times.items()}
    ref = outs.get("torch", outs["fused"])
    row: dict[str, Any] = {
        "shape": list(shape), "causal": causal, "threads": threads,
        "median_ms": {i: med[i] * 1e3 for i in impls},
        "repeats": {i: len(t) for i, t in times.items()},
        "first_call_s": compile_s,
        "max_abs_diff_vs_" + ("torch" if "torch" in outs else "fused"):
            {i: float(np.abs(o - ref).max()) for i, o in outs.items()},
    }
    if "fused" in med:
        row["ratio_vs_fused"] = {i: med[i] / med["fused"] for i in impls if i != "fused"}
    if memory:
        peaks = {}
        for impl in impls:
            cmd = [sys.executable, os.path.abspath(__file__), "--measure-memory", impl,
                   "--shapes", ",".join(map(str, shape)), "--threads", str(threads)] + (["--causal"] if causal else [])
            res = subprocess.run(cmd, capture_output=True, text=True, check=False)
            try:
                peaks[impl] = int(res.stdout.strip().splitlines()[-1])
            except (ValueError, IndexError):
                peaks[impl] = -1
        row["peak_mb"] = {i: p / 2**20 for i, p in peaks.items()}
        row["score_matrix_mb"] = shape[0] * shape[1] * shape[2] * shape[2] * 4 / 2**20
    return row


BF16_IMPLS = ("fused", "fused-f32", "torch", "inductor")


def _make_bf16(impl: str, causal: bool, threads: int) -> Callable[..., Any]:
    """A contender of the bf16 comparison: a function of three bf16 torch tensors."""
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(threads)

    def sdpa(q: Any, k: Any, v: Any) -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    if impl == "torch":
        return sdpa
    if impl == "inductor":
        return torch.compile(sdpa)  # type: ignore[no-any-return]
    import pbsdk.frontends.torch  # noqa: F401  (registers the backend)

    opts: dict[str, Any] = {"threads": threads}
    if impl == "fused-f32":
        opts["matrix_units"] = False
    return torch.compile(sdpa, backend="pbsdk", options={"compile_options": opts})  # type: ignore[no-any-return]


def bench_bf16(shape: tuple[int, int, int, int], *, causal: bool, rounds: int, block: int, threads: int,
               impls: tuple[str, ...]) -> dict[str, Any]:
    """One shape of the bf16 comparison (see the module docstring)."""
    import torch

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.bfloat16) for _ in range(3))
    fns: dict[str, Callable[..., Any]] = {}
    first_s: dict[str, float] = {}
    outs: dict[str, Any] = {}
    with torch.no_grad():
        for impl in impls:
            t0 = time.perf_counter()
            fns[impl] = _make_bf16(impl, causal, threads)
            outs[impl] = fns[impl](q, k, v).float()
            first_s[impl] = time.perf_counter() - t0
        for impl in impls:
            for _ in range(2):
                fns[impl](q, k, v)  # warm
        times: dict[str, list[float]] = {i: [] for i in impls}
        for _ in range(rounds):
            for impl in impls:
                t0 = time.perf_counter()
                for _ in range(block):
                    fns[impl](q, k, v)
                times[impl].append((time.perf_counter() - t0) / block)
    ref = outs["torch"] if "torch" in outs else outs[impls[0]]
    expected = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)
    med = {i: float(np.median(t)) for i, t in times.items()}
    flops = 2 * shape[0] * shape[1] * shape[2] * shape[2] * 2 * shape[3] * (0.5 if causal else 1.0)
    row: dict[str, Any] = {
        "shape": list(shape), "causal": causal, "threads": threads, "dtype": "bf16",
        "median_ms": {i: med[i] * 1e3 for i in impls}, "rounds": rounds, "block": block,
        "gflops": {i: flops / med[i] / 1e9 for i in impls},
        "first_call_s": first_s,
        "max_abs_diff_vs_torch": {i: float((o - ref).abs().max()) for i, o in outs.items()},
        "max_abs_error_vs_f64": {i: float((o.double() - expected).abs().max()) for i, o in outs.items()},
    }
    if "fused" in med:
        ratios = {i: np.asarray(times[i]) / np.asarray(times["fused"]) for i in impls if i != "fused"}
        row["ratio_vs_fused"] = {i: float(np.median(r)) for i, r in ratios.items()}
        row["ratio_p10_p90"] = {i: [float(np.percentile(r, 10)), float(np.percentile(r, 90))]
                                for i, r in ratios.items()}
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", nargs="+", default=["1,8,1024,64", "1,8,4096,64"],
                   help="B,H,S,D per shape")
    p.add_argument("--causal", action="store_true")
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--unfused-repeats", type=int, default=3, help="the unfused pipeline is slow; fewer rounds")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--impls", default=",".join(IMPLS))
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--json", default=None, help="write the results here (also printed)")
    p.add_argument("--dtype", default="f32", choices=("f32", "bf16"),
                   help="bf16: torch's SDPA on bf16 tensors (pbsdk, pbsdk without units, eager, Inductor)")
    p.add_argument("--block", type=int, default=5, help="bf16: calls per timed block")
    p.add_argument("--measure-memory", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    shapes = [tuple(int(x) for x in s.split(",")) for s in args.shapes]
    if args.measure_memory:
        print(measure_memory(args.measure_memory, shapes[0], args.causal, args.threads))  # type: ignore[arg-type]
        return 0
    if args.dtype == "bf16":
        impls = BF16_IMPLS if args.impls == ",".join(IMPLS) else tuple(args.impls.split(","))
        rows = [bench_bf16(s, causal=args.causal, rounds=args.repeats, block=args.block,  # type: ignore[arg-type]
                           threads=args.threads, impls=impls) for s in shapes]
        for r in rows:
            ms = r["median_ms"]
            line = f"bf16 {tuple(r['shape'])}{' causal' if r['causal'] else ''} threads {r['threads']}: " + ", ".join(
                f"{i} {ms[i]:.3f} ms ({r['gflops'][i]:.0f} GFLOP/s)" for i in impls)
            if "ratio_vs_fused" in r:
                line += " | " + ", ".join(f"{i}/fused {x:.2f} [{r['ratio_p10_p90'][i][0]:.2f}-"
                                          f"{r['ratio_p10_p90'][i][1]:.2f}]" for i, x in r["ratio_vs_fused"].items())
            print(line, file=sys.stderr)
        return _report("attention-bf16", rows, args.json)
    impls = tuple(args.impls.split(","))
    if "torch" in impls:
        try:
            import torch  # noqa: F401
        except ImportError:
            impls = tuple(i for i in impls if i != "torch")
    rows = [bench_shape(s, causal=args.causal, repeats=args.repeats, unfused_repeats=args.unfused_repeats,  # type: ignore[arg-type]
                        threads=args.threads, impls=impls, memory=not args.no_memory) for s in shapes]
    for r in rows:
        ms = r["median_ms"]
        line = f"{tuple(r['shape'])}{' causal' if r['causal'] else ''}: " + ", ".join(
            f"{i} {ms[i]:.2f} ms" for i in impls)
        if "ratio_vs_fused" in r:
            line += " | " + ", ".join(f"{i}/fused {x:.2f}" for i, x in r["ratio_vs_fused"].items())
        if "peak_mb" in r:
            line += " | peak MB " + ", ".join(f"{i} {x:.1f}" for i, x in r["peak_mb"].items())
        print(line, file=sys.stderr)
    return _report("attention", rows, args.json)


def _report(benchmark: str, rows: list, path: str | None) -> int:
    """The rows as JSON on stdout, and in ``path`` when given; the exit status."""
    text = json.dumps({"benchmark": benchmark, "results": rows}, indent=2)
    if path:
        with open(path, "w") as f:
            f.write(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
