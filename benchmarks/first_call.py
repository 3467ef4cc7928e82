"""Where the first call of a real model under ``torch.compile(backend="pbsdk")`` goes (issue #15, item 1).

For each model: one fresh process with an empty pbsdk cache (``cold``), then a second fresh process over
the cache the first one filled (``cached``); Inductor's caches are kept out of it (pbsdk does not use
them). In each process the first call is timed whole, and the functions it goes through are wrapped
with timers (in this benchmark process only, nothing in pbsdk is changed):

- ``dynamo``          the first call minus everything below: Dynamo's bytecode tracing and guards,
                      torch.compile's own set-up, and the first run of the graph's torch parts;
- ``aten_trace``      the backend minus pbsdk's compile: tracing the Dynamo graph to core ATen (pbsdk's
                      ``make_fx`` in the direct path, AOTAutograd otherwise) and partitioning;
- ``convert``         the ATen partitions to pbsdk graphs (`lower_partition`, weights taken as arrays);
- ``emit``            pbsdk graphs to MLIR text (`emit_program`);
- ``cache_key``       the weights' sha256 digests and the key (`constant_digests`, `cache_key`);
- ``cache_get``       the cache lookup (a hit maps the entry);
- ``stage:NAME``      each MLIR pipeline stage (only on a miss);
- ``llvm_parse``, ``llvm_opt``, ``llvm_codegen``  the JIT of the LLVM IR in this process: parsing, the O3
                      pipeline, the back end (``finalize_object`` / ``emit_object``; on a hit, linking
                      the cached objects only);
- ``jit_rest``        the rest of loading: here mostly waiting for the JIT's worker processes, which
                      compile the other parts of a large kernel (their CPU time is reported apart);
- ``object_get``      reading the cached object file;
- ``bind``            binding the weights' addresses to the entry (`EntryCall`);
- ``run``             the compiled kernels' own first run.

``pbsdk`` is the sum of the pbsdk parts (everything but ``dynamo``, ``aten_trace`` and ``run``). The CPU
seconds of the process and of the JIT's worker processes over the first call are reported too: on a
shared machine they say what the wall time would be on idle cores.

    PYTHONPATH=. .venv/bin/python benchmarks/first_call.py --models resnet50 [--json FILE] [--profile DIR]
"""

from __future__ import annotations

import argparse
import collections
import functools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_seconds: dict[str, float] = collections.defaultdict(float)
_counts: dict[str, int] = collections.defaultdict(int)
_active: list[str] = []  # the timers now running, innermost last: a parent's own time excludes its children


def _timed(name: str, fn: Any) -> Any:
    """``fn`` with its time added to ``_seconds[name]`` (and subtracted from the enclosing timer's)."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _active.append(name)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent = time.perf_counter() - start
            _active.pop()
            _seconds[name] += spent
            _counts[name] += 1
            if _active:
                _seconds[_active[-1]] -= spent
    return wrapper


def _instrument() -> None:
    import llvmlite.binding as llvm

    import pbsdk.frontends.torch.dynamo_backend as db
    from pbsdk.core import compiler
    from pbsdk.core.pipeline import Pipeline
    from pbsdk.core.runtime import cache
    from pbsdk.targets import cpu

    for name in ("compile_inference", "compile_static"):
        setattr(db, name, _timed("aten_trace", getattr(db, name)))
    db.compile_aten = _timed("partition", db.compile_aten)
    db.lower_partition = _timed("convert", db.lower_partition)
    db.emit_program = _timed("emit", db.emit_program)
    db.compile_text = _timed("compile_rest", db.compile_text)
    cache.constant_digests = _timed("cache_key", cache.constant_digests)
    cache.cache_key = _timed("cache_key", cache.cache_key)
    cache.CompileCache.get = _timed("cache_get", cache.CompileCache.get)  # type: ignore[method-assign]
    cache.CompileCache.get_object = _timed("object_get", cache.CompileCache.get_object)  # type: ignore[method-assign]
    cache.CompileCache.put = _timed("cache_put", cache.CompileCache.put)  # type: ignore[method-assign]
    cache.CompileCache.put_object = _timed("cache_put", cache.CompileCache.put_object)  # type: ignore[method-assign]
    run_stage = Pipeline._run_stage

    def stage(stage: Any, current: Any, ctx: Any) -> Any:
        return _timed(f"stage:{stage.name}", run_stage)(stage, current, ctx)
    Pipeline._run_stage = staticmethod(stage)  # type: ignore[method-assign]
    compiler.ir.Module.parse = _timed("mlir_parse", compiler.ir.Module.parse)  # type: ignore[method-assign]
    cpu.CpuExecutable.__init__ = _timed("jit_rest", cpu.CpuExecutable.__init__)  # type: ignore[method-assign]
    cpu.parse_llvm_ir = _timed("llvm_parse", cpu.parse_llvm_ir)
    llvm.ModulePassManager.run = _timed("llvm_opt", llvm.ModulePassManager.run)  # type: ignore[method-assign]
    llvm.ExecutionEngine.finalize_object = _timed("llvm_codegen", llvm.ExecutionEngine.finalize_object)  # type: ignore[method-assign]
    llvm.TargetMachine.emit_object = _timed("llvm_codegen", llvm.TargetMachine.emit_object)  # type: ignore[method-assign]
    cpu.EntryCall.__init__ = _timed("bind", cpu.EntryCall.__init__)  # type: ignore[method-assign]
    db.CompiledPartition.forward = _timed("run", db.CompiledPartition.forward)  # type: ignore[method-assign]
    if hasattr(db, "_single_partition_call"):
        make = db._single_partition_call

        def single(fused: Any) -> Any:
            call = make(fused)
            return None if call is None else _timed("run", call)
        db._single_partition_call = single


def _cpu_seconds() -> tuple[float, float]:
    """CPU seconds (user + system) of this process, and of its finished children (the JIT's workers)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime, kids.ru_utime + kids.ru_stime


def child(name: str, profile: str | None) -> dict[str, Any]:
    start = time.perf_counter()
    import torch

    import pbsdk.frontends.torch as pt
    from pbsdk.testing.real_models import MODELS
    imported = time.perf_counter() - start
    _instrument()
    model, inputs = MODELS[name].build(1)
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
    with torch.no_grad():
        fn = torch.compile(model, backend="pbsdk")
        cpu_start = _cpu_seconds()
        start = time.perf_counter()
        if profiler is not None:
            profiler.enable()
        fn(*inputs)
        if profiler is not None:
            profiler.disable()
        first = time.perf_counter() - start
        cpu_self, cpu_children = (b - a for a, b in zip(cpu_start, _cpu_seconds()))
    if profiler is not None and profile:
        profiler.dump_stats(profile)
    parts = dict(_seconds)
    backend = parts.pop("aten_trace", 0.0)  # own time: the partition's share already taken out
    partition = parts.pop("partition", 0.0)
    pbsdk_s = sum(v for k, v in parts.items() if k != "run") + partition
    reports = pt.reports()
    return {"first_s": first, "cpu_s": cpu_self, "workers_cpu_s": cpu_children, "import_s": imported, "dynamo": first - backend - pbsdk_s - parts.get("run", 0.0),
            "aten_trace": backend, "partition_own": partition, "pbsdk_s": pbsdk_s, "parts": parts,
            "counts": dict(_counts), "report_s": sum(r.seconds for r in reports),
            "partitions": sum(r.partitions for r in reports), "graphs": len(reports),
            "fallback_ops": sorted({o for r in reports for o in r.fallback_ops})}


def _spawn(args: list[str], env: dict[str, str]) -> dict[str, Any]:
    done = subprocess.run([sys.executable, __file__, *args], check=False, env=env, capture_output=True, text=True)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"child {args} failed: {done.stderr.strip()[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


_ORDER = ("dynamo", "aten_trace", "convert", "emit", "cache_key", "cache_get", "mlir_parse", "stage:",
          "compile_rest", "llvm_parse", "llvm_opt", "llvm_codegen", "object_get", "jit_rest", "bind",
          "cache_put", "partition_own", "run")


def table(rows: list[dict[str, Any]]) -> str:
    out = [("| model | process | load | first call s (CPU s: process + JIT workers) | Dynamo + rest of torch.compile "
            "| ATen trace | pbsdk | pbsdk's parts (s) |"), "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        for kind in ("cold", "cached"):
            r = row[kind]
            parts = dict(r["parts"], partition_own=r["partition_own"])
            keys = sorted(parts, key=lambda k: next(i for i, p in enumerate(_ORDER) if k.startswith(p)))
            detail = ", ".join(f"{k} {parts[k]:.2f}" for k in keys if abs(parts[k]) >= 0.005 and k != "run")
            out.append(f"| {row['model']} | {kind} | {r['load']:.1f} | {r['first_s']:.1f} ({r['cpu_s']:.1f} + "
                       f"{r['workers_cpu_s']:.1f}) | {r['dynamo']:.1f} | "
                       f"{r['aten_trace']:.1f} | {r['pbsdk_s']:.2f} | {detail}; run {parts.get('run', 0):.2f} |")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet50"])
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--profile", help="also write each process's cProfile stats into this directory")
    parser.add_argument("--root", help="the pbsdk checkout to measure (default: this one), e.g. a worktree of an "
                        "older commit, for a before/after comparison")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1] if args.child[1] != "-" else None)))
        return
    root = str(Path(args.root).resolve() if args.root else Path(__file__).resolve().parent.parent)
    rows = []
    for name in args.models:
        row: dict[str, Any] = {"model": name, "root": root, "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        with tempfile.TemporaryDirectory(prefix="pbsdk-first-") as tmp:
            env = dict(os.environ, PBSDK_CACHE_DIR=os.path.join(tmp, "pbsdk"),
                       TORCHINDUCTOR_CACHE_DIR=os.path.join(tmp, "inductor"))
            env.pop("PBSDK_DISABLE_CACHE", None)
            env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
            for kind in ("cold", "cached"):
                profile = os.path.join(args.profile, f"{name}-{kind}.prof") if args.profile else "-"
                load = os.getloadavg()[0]
                row[kind] = _spawn(["--child", name, profile], env) | {"load": load}
                print(json.dumps({name: {kind: row[kind]}}), flush=True)
        rows.append(row)
        print(table([row]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    print(table(rows))


if __name__ == "__main__":
    main()
