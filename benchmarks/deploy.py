"""Issue #34: a model exported with ``pbsdk.export`` and run by ``pbsdk.runtime`` vs the same compilation run
by the JIT (the cpu target's in-process executable of the very artifact that was exported), and vs
``torch.compile(backend="pbsdk")`` for context.

- ``export_s``: pbsdk.export from the module (torch.export, conversion, compilation, the linked library).
- ``load_s``: ``pbsdk.runtime.load`` in a fresh Python process of a virtualenv holding only the
  ``pbsdk-runtime`` wheel and numpy (`scripts/runtime_wheel.py`; numpy + the runtime imported first, not
  counted), median of 5 processes, with and without the weights' checksums; the file is in the page cache.
- latency: interleaved rounds (each round runs every contender for a block of calls, rotating the order); a
  contender's figure is the median over rounds of its block mean; the ratio's spread is the min..max of the
  per-round ratios. The outputs are compared once: runtime vs JIT must be identical.

    .venv/bin/python benchmarks/deploy.py --models resnet50 --threads 2 --rounds 7
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]

_LOAD = r'''
import sys, time
import numpy, pbsdk.runtime
t = time.perf_counter()
m = pbsdk.runtime.load(sys.argv[1], verify=sys.argv[2] == "1")
print(time.perf_counter() - t)
'''


def runtime_python(workdir: Path) -> Path:
    """The Python of a fresh virtualenv holding the pbsdk-runtime wheel and numpy (built under ``workdir``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("runtime_wheel", REPO / "scripts" / "runtime_wheel.py")
    assert spec is not None and spec.loader is not None
    runtime_wheel = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runtime_wheel)
    return runtime_wheel.fresh_venv(workdir)


def load_seconds(python: Path, path: Path, verify: bool, runs: int = 5) -> float:
    times = []
    for _ in range(runs):
        done = subprocess.run([str(python), "-I", "-c", _LOAD, str(path), "1" if verify else "0"], check=False,
                              capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"loading {path} in a fresh process failed: {done.stderr[-3000:]}")
        times.append(float(done.stdout.strip().splitlines()[-1]))
    return statistics.median(times)


def first(out: Any) -> Any:
    return out[0] if isinstance(out, (tuple, list)) else out


def interleaved(contenders: dict[str, Any], rounds: int, block: int) -> dict[str, list[float]]:
    per: dict[str, list[float]] = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for name in order:
            fn = contenders[name]
            t0 = time.perf_counter()
            for _ in range(block):
                out = fn()
                del out
            per[name].append((time.perf_counter() - t0) / block)
    return per


def bench(name: str, batch: int, rounds: int, block: int, workdir: Path, threads: int | None,
          python: Path) -> dict[str, Any]:
    import torch

    import pbsdk.runtime
    from pbsdk.core.compiler import resolve
    from pbsdk.core.runtime.kernel import Kernel
    from pbsdk.deploy import write_artifact
    from pbsdk.deploy.torch_export import from_torch
    from pbsdk.testing.real_models import MODELS

    model, inputs = MODELS[name].make(batch)
    model.eval()
    compile_options = {"threads": threads} if threads else None
    request = resolve("cpu", None, compile_options)
    t0 = time.perf_counter()
    entry = from_torch(model, inputs, request, name)
    path = write_artifact(workdir / f"{name}.pbsdk", [entry], request)
    export_s = time.perf_counter() - t0
    x = [np.ascontiguousarray(i.numpy()) for i in inputs]
    loads = {"load_s": load_seconds(python, path, True), "load_noverify_s": load_seconds(python, path, False)}
    jit = Kernel(entry.artifact, request.target.load(entry.artifact, request.spec), name=name)
    t0 = time.perf_counter()
    runtime = pbsdk.runtime.load(path)
    load_in_process_s = time.perf_counter() - t0
    with torch.no_grad():
        compiled = torch.compile(model, backend="pbsdk",
                                 options={"compile_options": compile_options} if compile_options else None)
        compiled(*inputs)
    # The JIT's kernel takes integer inputs as the floats it computes with; the runtime converts them itself.
    xj = [a.astype(t.dtype) if t.given else a for a, t in zip(x, runtime.manifest.entries[0].inputs)]
    with torch.no_grad():
        y_rt, y_jit, y_tc = runtime(*x), jit(*xj), first(compiled(*inputs)).numpy()
    identical = bool(np.array_equal(y_rt, y_jit))
    vs_tc = float(np.abs(y_rt - y_tc).max() / max(np.abs(y_tc).max(), 1e-30))
    with torch.no_grad():
        per = interleaved({"runtime": lambda: runtime(*x), "jit": lambda: jit(*xj),
                           "torch.compile": lambda: compiled(*inputs)}, rounds, block)
    ratios = [a / b for a, b in zip(per["runtime"], per["jit"])]
    size = path.stat().st_size
    weights = sum(runtime.manifest.sections[c].size for c in runtime.manifest.entries[0].constants)
    return {"model": name, "batch": batch, "export_s": export_s, "file_mb": size / 2**20,
            "weights_mb": weights / 2**20, "code_kb": runtime.manifest.sections[0].size / 1024,
            **loads, "load_in_process_s": load_in_process_s,
            "runtime_ms": 1e3 * statistics.median(per["runtime"]), "jit_ms": 1e3 * statistics.median(per["jit"]),
            "torch_compile_ms": 1e3 * statistics.median(per["torch.compile"]),
            "runtime_over_jit": statistics.median(ratios), "spread": [min(ratios), max(ratios)],
            "identical_to_jit": identical, "rel_error_vs_torch_compile": vs_tc}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["resnet50"])
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--threads", type=int, default=None,
                        help="compile for N threads (pbsdk option threads) and run torch on N")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--block", type=int, default=5)
    parser.add_argument("--json", default=None)
    parser.add_argument("--keep", default=None, help="write the exported files here (default: a temporary directory)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        python = runtime_python(Path(tmp))
        for name in args.models:
            row = bench(name, args.batch, args.rounds, args.block, Path(args.keep or tmp), args.threads, python)
            row["threads"] = args.threads
            print(json.dumps(row), flush=True)
            rows.append(row)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
