"""nvgpu on a real GPU: correctness of every test kernel and benchmarks against torch, as JSON.

Two halves, because the GPU machine cannot install pbsdk's MLIR wheels:

``prepare DIR``  (here, with MLIR) compiles the kernels of ``tests/nvgpu/gpu_cases.py``, the benchmark
                 kernels and the fused-attention kernels (`ATTENTION`, and the gpu-marked cases of
                 ``tests/nvgpu/test_nvgpu_attention.py``) for ``--spec`` (default nvidia/h200) into
                 ``DIR/<name>.pbsdk`` plus ``DIR/manifest.json``.
``run DIR OUT``  (on the GPU; needs numpy, torch optional) loads each artifact with
                 ``pbsdk.targets.nvgpu.runtime`` (ctypes on the CUDA driver, no MLIR), checks it against
                 numpy with ``pbsdk.testing.assert_close`` (numpy buffers, and torch tensors without copies
                 when torch is present), times the benchmarks against torch (cuBLAS matmul, eager softmax
                 and layernorm) with CUDA events, checks each fused attention against
                 ``torch.nn.functional.scaled_dot_product_attention`` (computed in f32 from the same f16
                 inputs) and times it against SDPA in f16 (median of repeats), and writes
                 ``OUT/gpu_check.json``.

Exit status: 0 when every check passed, 1 when one failed, 2 when the setup is wrong (no artifacts, no GPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "nvgpu"))

import numpy as np

#: (name, kind, shape, dtype): kernels timed against torch. Matmuls are m = n = k.
BENCHMARKS: tuple[tuple[str, str, tuple[int, ...], str], ...] = (
    ("bench_matmul_bf16_4096", "matmul", (4096,), "bf16"),
    ("bench_matmul_bf16_8192", "matmul", (8192,), "bf16"),
    ("bench_softmax_f32_4096x4096", "softmax", (4096, 4096), "f32"),
    ("bench_layernorm_f32_4096x4096", "layernorm", (4096, 4096), "f32"),
)


#: Fused attention timed against torch SDPA: (name, batch, heads, seq, head dim, dtype, causal).
ATTENTION: tuple[tuple[str, int, int, int, int, str, bool], ...] = tuple(
    (f"attn_f16_b1h8_s{s}_d64{'_causal' if c else ''}", 1, 8, s, 64, "f16", c)
    for s in (1024, 4096) for c in (False, True))


def _attention_text(b: int, h: int, s: int, d: int, dtype: str, causal: bool, spec: str) -> tuple[str, str]:
    """(MLIR, source): the core's fused form of ``ops.attention`` for nvgpu (`attention_cases.AttnCase`)."""
    from attention_cases import AttnCase

    return AttnCase(b, h, s, s, d, d, dtype, causal_offset=0 if causal else None).module_text(spec), "core"


def _bench_case(name: str, kind: str, shape: tuple[int, ...], dtype: str) -> Any:
    from gpu_cases import GpuCase, _layernorm, _softmax, matmul_case

    from pbsdk import ops

    if kind == "matmul":
        n = shape[0]
        c = matmul_case(n, n, n, dtype)
        return GpuCase(name, c.fn, c.types, c.reference, c.op, c.reduction, c.matmul_dtype)
    if kind == "softmax":
        return GpuCase(name, lambda x: ops.softmax(x), ((shape, dtype),), _softmax, "softmax")
    return GpuCase(name, lambda x, w, b: ops.layernorm(x, w, b), ((shape, dtype), ((shape[-1],), dtype),
                                                                   ((shape[-1],), dtype)), _layernorm, "layernorm")


def prepare(directory: Path, spec: str) -> int:
    from gpu_cases import CASES

    from pbsdk.core.compiler import compile_text, resolve

    directory.mkdir(parents=True, exist_ok=True)
    request = resolve("nvgpu", spec, {"cache": False})
    manifest: dict[str, Any] = {"spec": request.spec.name, "cases": [], "benchmarks": []}
    for case in CASES:
        t0 = time.perf_counter()
        art = compile_text(case.text(), request)
        (directory / f"{case.name}.pbsdk").write_bytes(art.payload)
        manifest["cases"].append({"name": case.name, "seconds": time.perf_counter() - t0})
        print(f"compiled {case.name} ({len(art.payload)} B)")
    for name, kind, shape, dtype in BENCHMARKS:
        art = compile_text(_bench_case(name, kind, shape, dtype).text(), request)
        (directory / f"{name}.pbsdk").write_bytes(art.payload)
        manifest["benchmarks"].append({"name": name, "kind": kind, "shape": list(shape), "dtype": dtype})
        print(f"compiled {name} ({len(art.payload)} B)")
    from test_nvgpu_attention import GPU_CASES

    manifest["attention"] = []
    for name, b, h, seq, d, dtype, causal in ATTENTION:
        text, source = _attention_text(b, h, seq, d, dtype, causal, spec)
        art = compile_text(text, request)
        (directory / f"{name}.pbsdk").write_bytes(art.payload)
        manifest["attention"].append({"name": name, "batch": b, "heads": h, "seq": seq, "d": d, "dtype": dtype,
                                      "causal": causal, "source": source, "kernels": art.metadata.get("kernels")})
        print(f"compiled {name} from the {source} form ({len(art.payload)} B)")
    for case in GPU_CASES:  # what the gpu-marked attention tests load (PBSDK_GPU_ARTIFACTS)
        art = compile_text(case.module_text(spec), request)
        (directory / f"{case.name}.pbsdk").write_bytes(art.payload)
        print(f"compiled {case.name} ({len(art.payload)} B)")
    (directory / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return 0


def _inputs(case: Any, seed: int = 0) -> list[np.ndarray]:
    from pbsdk.targets.nvgpu.emulate import round_bf16

    rng = np.random.default_rng(seed)
    out = []
    for shape, dtype in case.types:
        x = rng.standard_normal(shape).astype(np.float32)
        out.append(round_bf16(x) if dtype == "bf16" else x.astype({"f16": np.float16, "f32": np.float32,
                                                                   "f64": np.float64}[dtype]))
    return out


def _check_case(case: Any, kernel: Any, torch: Any) -> dict[str, Any]:
    from pbsdk.targets.nvgpu.emulate import from_bf16_bits, to_bf16_bits
    from pbsdk.testing import assert_close, max_error, tolerance

    args = _inputs(case)
    expected = np.asarray(case.reference(*args))
    dtype = case.types[0][1]
    tol = tolerance(case.op, dtype, reduction_size=case.reduction)
    result: dict[str, Any] = {"name": case.name}
    bf16 = any(d == "bf16" for _, d in case.types)
    host_args = [to_bf16_bits(a) if d == "bf16" else a for a, (_, d) in zip(args, case.types)]
    got = kernel(*host_args)
    if bf16 and kernel.outputs[0][1] == "bf16":
        got = from_bf16_bits(got)
    got = np.asarray(got)
    err = max_error(got.astype(np.float64), expected)
    result["numpy"] = {"max_abs": err[0], "max_rel": err[1]}
    assert_close(got, expected.astype(got.dtype), op=case.op, tol=tol)
    if torch is not None:
        targs = [torch.from_numpy(np.ascontiguousarray(a)).cuda() if d != "bf16" else
                 torch.from_numpy(np.ascontiguousarray(a)).cuda().to(torch.bfloat16) for a, (_, d) in zip(args, case.types)]
        tout = kernel(*targs)
        torch.cuda.synchronize()
        host = tout.float().cpu().numpy() if tout.dtype == torch.bfloat16 else tout.cpu().numpy()
        assert_close(host, expected.astype(host.dtype), op=case.op, tol=tol)
        result["torch_zero_copy"] = "pass"
    result["status"] = "pass"
    return result


def _time(fn: Any, torch: Any, *, warmup: int = 3, repeats: int = 10) -> float:
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return float(np.median(times))


def _benchmark(entry: dict[str, Any], kernel: Any, torch: Any) -> dict[str, Any]:
    kind, shape, dtype = entry["kind"], tuple(entry["shape"]), entry["dtype"]
    tdt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    out: dict[str, Any] = dict(entry)
    if kind == "matmul":
        n = shape[0]
        a, b = (torch.randn(n, n, device="cuda", dtype=tdt) for _ in range(2))
        ours = _time(lambda: kernel(a, b), torch, repeats=5 if n > 4096 else 10)
        ref = _time(lambda: torch.matmul(a, b), torch)
        diff = (kernel(a, b).float() - torch.matmul(a, b).float()).abs().max().item()
        flops = 2 * n ** 3
        out.update(pbsdk_s=ours, torch_s=ref, pbsdk_tflops=flops / ours / 1e12, torch_tflops=flops / ref / 1e12,
                   ratio_vs_torch=ref / ours, max_abs_diff_vs_torch=diff)
    elif kind == "softmax":
        x = torch.randn(*shape, device="cuda", dtype=tdt)
        ours, ref = _time(lambda: kernel(x), torch), _time(lambda: torch.softmax(x, -1), torch)
        diff = (kernel(x) - torch.softmax(x, -1)).abs().max().item()
        out.update(pbsdk_s=ours, torch_s=ref, ratio_vs_torch=ref / ours, max_abs_diff_vs_torch=diff,
                   pbsdk_gbps=2 * x.numel() * x.element_size() / ours / 1e9)
    else:
        x = torch.randn(*shape, device="cuda", dtype=tdt)
        w, b = torch.randn(shape[-1], device="cuda", dtype=tdt), torch.randn(shape[-1], device="cuda", dtype=tdt)
        ln = torch.nn.functional.layer_norm
        ours, ref = _time(lambda: kernel(x, w, b), torch), _time(lambda: ln(x, (shape[-1],), w, b, 1e-5), torch)
        diff = (kernel(x, w, b) - ln(x, (shape[-1],), w, b, 1e-5)).abs().max().item()
        out.update(pbsdk_s=ours, torch_s=ref, ratio_vs_torch=ref / ours, max_abs_diff_vs_torch=diff)
    return out


def _attention(entry: dict[str, Any], kernel: Any, torch: Any) -> dict[str, Any]:
    """Numerics vs SDPA (f32, same f16 inputs) at the attention tolerance, then median times vs SDPA (f16)."""
    from pbsdk.testing import assert_close, max_error, tolerance

    b, h, s, d, causal = entry["batch"], entry["heads"], entry["seq"], entry["d"], entry["causal"]
    tdt = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}[entry["dtype"]]
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=tdt, generator=gen) for _ in range(3))
    ours = kernel(q, k, v)
    torch.cuda.synchronize()
    ref32 = sdpa(q.float(), k.float(), v.float(), is_causal=causal)
    ref16 = sdpa(q, k, v, is_causal=causal)
    got = ours.float().cpu().numpy()
    expected = ref32.cpu().numpy()
    out: dict[str, Any] = dict(entry)
    err = max_error(got.astype(np.float64), expected.astype(np.float64))
    out["vs_sdpa_f32"] = {"max_abs": err[0], "max_rel": err[1]}
    out["max_abs_diff_vs_sdpa_f16"] = (ours.float() - ref16.float()).abs().max().item()
    tol = tolerance("attention", entry["dtype"], reduction_size=s + d)
    out["tolerance"] = str(tol)
    assert_close(got, expected.astype(got.dtype), op="attention", tol=tol)
    repeats = 5 if s > 2048 else 10
    t_ours = _time(lambda: kernel(q, k, v), torch, repeats=repeats)
    t_ref = _time(lambda: sdpa(q, k, v, is_causal=causal), torch, repeats=repeats)
    flops = 4 * b * h * s * s * d * (0.5 if causal else 1.0)
    out.update(pbsdk_s=t_ours, sdpa_s=t_ref, pbsdk_tflops=flops / t_ours / 1e12, sdpa_tflops=flops / t_ref / 1e12,
               ratio_vs_sdpa=t_ref / t_ours)
    return out


def run(directory: Path, out_dir: Path, *, budget_s: float = 420.0) -> int:
    from gpu_cases import CASES

    from pbsdk.core.errors import DeviceUnavailableError
    from pbsdk.targets.nvgpu import runtime

    t_start = time.perf_counter()
    out_dir.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {"artifacts": str(directory), "cases": [], "benchmarks": [], "errors": []}

    def write() -> None:
        report["seconds"] = time.perf_counter() - t_start
        (out_dir / "gpu_check.json").write_text(json.dumps(report, indent=2, default=str))

    manifest_path = directory / "manifest.json"
    if not manifest_path.is_file():
        report["errors"].append(f"no {manifest_path}: run 'scripts/gpu_check.sh prepare' where MLIR is installed")
        write()
        return 2
    manifest = json.loads(manifest_path.read_text())
    report["spec"] = manifest["spec"]
    torch: Any
    try:
        import torch

        report["torch"] = torch.__version__
        report["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
        if not torch.cuda.is_available():
            torch = None  # a CPU-only torch: numpy checks only, no benchmarks
    except Exception:  # noqa: BLE001 - no usable torch: the checks run on numpy alone
        torch = None
    if not runtime.available():
        try:
            runtime.driver()
        except DeviceUnavailableError as exc:
            report["errors"].append(str(exc))
        write()
        return 2
    failed = 0
    by_name = {c.name: c for c in CASES}
    for entry in manifest["cases"]:
        case = by_name.get(entry["name"])
        if case is None:
            continue
        try:
            kernel = runtime.load_file(directory / f"{case.name}.pbsdk")
            res = _check_case(case, kernel, torch)
            res["image"] = kernel.image_kind
        except Exception as exc:  # noqa: BLE001 - a failing kernel is a result, not a crash
            failed += 1
            res = {"name": case.name, "status": "fail", "message": f"{type(exc).__name__}: {exc}"[:2000],
                   "traceback": traceback.format_exc()[-2000:]}
        report["cases"].append(res)
        print(f"{res['status']:5} {case.name}")
        write()
    if torch is not None:
        for entry in manifest["benchmarks"]:
            if time.perf_counter() - t_start > budget_s:
                report["benchmarks"].append({"name": entry["name"], "status": "skipped: time budget"})
                continue
            try:
                kernel = runtime.load_file(directory / f"{entry['name']}.pbsdk")
                res = _benchmark(entry, kernel, torch)
                res["status"] = "measured"
            except Exception as exc:  # noqa: BLE001 - a failing benchmark is a result
                failed += 1
                res = {"name": entry["name"], "status": "fail", "message": f"{type(exc).__name__}: {exc}"[:2000]}
            report["benchmarks"].append(res)
            print(json.dumps(res, default=str))
            write()
        report["attention"] = []
        for entry in manifest.get("attention", []):
            if time.perf_counter() - t_start > budget_s:
                report["attention"].append({"name": entry["name"], "status": "skipped: time budget"})
                continue
            try:
                kernel = runtime.load_file(directory / f"{entry['name']}.pbsdk")
                res = _attention(entry, kernel, torch)
                res["status"] = "pass"
            except Exception as exc:  # noqa: BLE001 - a failing kernel is a result
                failed += 1
                res = {"name": entry["name"], "status": "fail", "message": f"{type(exc).__name__}: {exc}"[:2000],
                       "traceback": traceback.format_exc()[-2000:]}
            report["attention"].append(res)
            print(json.dumps(res, default=str))
            write()
    report["passed"] = sum(c.get("status") == "pass" for c in report["cases"])
    report["failed"] = failed
    write()
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("directory", type=Path)
    p.add_argument("--spec", default="nvidia/h200")
    r = sub.add_parser("run")
    r.add_argument("directory", type=Path)
    r.add_argument("out", type=Path)
    r.add_argument("--budget-s", type=float, default=420.0)
    args = parser.parse_args(argv)
    if args.cmd == "prepare":
        return prepare(args.directory, args.spec)
    return run(args.directory, args.out, budget_s=args.budget_s)


if __name__ == "__main__":
    sys.exit(main())
