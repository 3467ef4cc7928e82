#!/usr/bin/env python
"""bf16 and int8 GEMMs on the host's matrix units: pbsdk against torch (oneDNN), 1 and 2 threads.

    .venv/bin/python benchmarks/units.py [--threads 1,2] [--rounds 7] [--only NAME...] [--out DIR]

Cases (M x N x K): bf16 ``a @ b`` at 1024^3, 2048^3 and 512x768x3072, and 512x768x3072 + bias + GELU (torch:
``gelu(a @ b + bias)`` in bf16, pbsdk: the same with `pbsdk.ops`); i8 x i8 -> i32 at the same shapes
(torch: ``torch._int_mm``) and with a requantize epilogue to i8 (torch: ``_int_mm`` then the same
arithmetic in eager ops), on torch's own copies of the inputs (aligned as torch allocates). Each thread count runs in its own worker process (``OMP_NUM_THREADS`` and
``torch.set_num_threads`` set to it, pbsdk compiled with ``threads=n``). Per round the contenders run in
interleaved blocks (each block: 3 calls, the minimum kept); the reported time is the median over rounds,
the noise the spread of the pbsdk/torch ratio over rounds (its 10th-90th percentiles). Results are checked
against torch before timing (bf16: within 2 bf16 ulps of the largest output; i8: exactly). Writes
``units.json`` and ``units.md`` under ``--out`` (default benchmarks/results/) and prints the table; the
CPU model and the host's matrix units head it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from pbsdk.bench import cpu_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = [(1024, 1024, 1024), (2048, 2048, 2048), (512, 768, 3072)]


def _cases() -> list[tuple[str, str, tuple[int, int, int], bool]]:
    """(name, dtype, (M, N, K), with epilogue)."""
    out = []
    for dtype in ("bf16", "i8"):
        for m, n, k in SHAPES:
            out.append((f"{dtype}_mm_{m}x{n}x{k}", dtype, (m, n, k), False))
        m, n, k = SHAPES[-1]
        out.append((f"{dtype}_mm_{'bias_gelu' if dtype == 'bf16' else 'requant'}_{m}x{n}x{k}", dtype, (m, n, k), True))
    return out


def _contenders(dtype: str, shape: tuple[int, int, int], epilogue: bool, threads: int):
    """(pbsdk call, torch call, check) for one case."""
    import ml_dtypes
    import numpy as np
    import torch

    import pbsdk
    from pbsdk import ops

    m, n, k = shape
    rng = np.random.default_rng(0)
    opts = {"threads": threads, "cache": False}
    if dtype == "bf16":
        a = (rng.random((m, k), np.float32) - 0.5).astype(ml_dtypes.bfloat16)
        b = (rng.random((k, n), np.float32) - 0.5).astype(ml_dtypes.bfloat16)
        bias = rng.random(n, np.float32).astype(ml_dtypes.bfloat16)
        # torch's own (64-byte aligned) copies: oneDNN's bf16 GEMM took 1.9x as long on a numpy buffer 48 bytes
        # off a line (Xeon with AMX, 1024^3, 1 thread), which is not how a torch user's tensors come
        ta, tb, tbias = (torch.from_numpy(v.view(np.int16)).view(torch.bfloat16).clone() for v in (a, b, bias))
        if epilogue:
            fn = pbsdk.jit(lambda x, w, c: ops.gelu(x @ w + c), target="cpu", options=opts)
            mine, theirs = (lambda: fn(a, b, bias)), (lambda: torch.nn.functional.gelu(ta @ tb + tbias))
        else:
            fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", options=opts)
            mine, theirs = (lambda: fn(a, b)), (lambda: ta @ tb)

        def check() -> str:
            got, want = mine().astype(np.float32), theirs().float().numpy()
            err = float(np.abs(got - want).max())
            bound = 2 * 2.0 ** -7 * float(np.abs(want).max())  # two bf16 ulps of the largest output
            if err > bound:
                raise AssertionError(f"max error {err} > {bound}")
            return f"max error {err:.3g} (bound {bound:.3g})"
        return mine, theirs, check
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    ta, tb = torch.from_numpy(a).clone(), torch.from_numpy(b).clone()
    scale = 1.0 / (16 * k)
    if epilogue:
        def requant(acc):
            return ops.astype(ops.minimum(ops.maximum(ops.round(ops.astype(acc, "f32") * scale) + 3.0, -128.0),
                                          127.0), "i8")
        fn = pbsdk.jit(lambda x, w: requant(x @ w), target="cpu", options=opts)
        mine = lambda: fn(a, b)
        theirs = lambda: torch.clamp(torch.round(torch._int_mm(ta, tb).float() * scale) + 3, -128, 127).to(torch.int8)
    else:
        fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", options=opts)
        mine, theirs = (lambda: fn(a, b)), (lambda: torch._int_mm(ta, tb))

    def check_i8() -> str:
        got, want = mine(), theirs().numpy()
        if not np.array_equal(got, want):
            raise AssertionError(f"{int((got != want).sum())} of {got.size} outputs differ")
        return "exact"
    return mine, theirs, check_i8


def _worker(threads: int, rounds: int, only: list[str]) -> list[dict]:
    import numpy as np
    import torch

    torch.set_num_threads(threads)
    rows = []
    for name, dtype, shape, epilogue in _cases():
        if only and not any(o in name for o in only):
            continue
        t0 = time.perf_counter()
        mine, theirs, check = _contenders(dtype, shape, epilogue, threads)
        checked = check()  # the first pbsdk call compiles
        compile_s = time.perf_counter() - t0
        times: dict[str, list[float]] = {"pbsdk": [], "torch": []}
        for _ in range(rounds):
            for who, fn in (("pbsdk", mine), ("torch", theirs)):
                best = float("inf")
                for _ in range(3):
                    t = time.perf_counter()
                    fn()
                    best = min(best, time.perf_counter() - t)
                times[who].append(best)
        ratios = sorted(q / p for p, q in zip(times["pbsdk"], times["torch"]))
        p, q = statistics.median(times["pbsdk"]), statistics.median(times["torch"])
        ops_ = 2 * shape[0] * shape[1] * shape[2]
        rows.append({"case": name, "threads": threads, "pbsdk_ms": p * 1e3, "torch_ms": q * 1e3,
                     "speedup": q / p, "ratio_p10": float(np.percentile(ratios, 10)),
                     "ratio_p90": float(np.percentile(ratios, 90)), "pbsdk_gops": ops_ / p / 1e9,
                     "torch_gops": ops_ / q / 1e9, "first_call_s": compile_s, "check": checked})
        r = rows[-1]
        print(f"  {name:<34} {threads}t pbsdk {r['pbsdk_ms']:8.2f} ms ({r['pbsdk_gops']:6.0f} G/s)  torch "
              f"{r['torch_ms']:8.2f} ms ({r['torch_gops']:6.0f})  {r['speedup']:.2f}x "
              f"[{r['ratio_p10']:.2f}-{r['ratio_p90']:.2f}]  first call {compile_s:.2f} s", file=sys.stderr)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/units.py", description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--only", nargs="*", default=[])
    ap.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        print(json.dumps(_worker(args.worker, args.rounds, args.only)))
        return 0
    from pbsdk.core.spec import load_spec

    host = load_spec("host")
    units = ", ".join(f"{u.name} ({u.operand_dtype}->{u.accumulator_dtype}, {u.m}x{u.n}x{u.k})"
                      for u in host.matrix_units) or "none"
    cpu = cpu_model()
    print(f"CPU: {cpu}; host matrix units: {units}", file=sys.stderr)
    rows: list[dict] = []
    for t in [int(x) for x in args.threads.split(",")]:
        env = dict(os.environ, OMP_NUM_THREADS=str(t), MKL_NUM_THREADS=str(t))
        out = subprocess.run([sys.executable, __file__, "--worker", str(t), "--rounds", str(args.rounds),
                              "--only", *args.only], env=env, stdout=subprocess.PIPE, check=True, text=True)
        rows += json.loads(out.stdout.strip().splitlines()[-1])
    lines = [f"CPU: {cpu}. Host matrix units: {units}. Median of {args.rounds} rounds of interleaved blocks; "
             "speedup = torch / pbsdk, its 10th-90th percentile over rounds in brackets.", "",
             "| case | threads | pbsdk ms | torch ms | speedup | G(FL)OP/s pbsdk / torch | first call s |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['case']} | {r['threads']} | {r['pbsdk_ms']:.2f} | {r['torch_ms']:.2f} | "
                     f"{r['speedup']:.2f} [{r['ratio_p10']:.2f}-{r['ratio_p90']:.2f}] | "
                     f"{r['pbsdk_gops']:.0f} / {r['torch_gops']:.0f} | {r['first_call_s']:.2f} |")
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "units.json").write_text(json.dumps({"cpu": cpu, "units": units, "rows": rows}, indent=1))
    (out_dir / "units.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
