"""Chips whose toolchain is a C compiler (issue #36, item 2): ``Target.emit_after`` ends the pipeline at the
tiled form or later, ``pbsdk.core.emit_c`` prints the kernel as C, and ``pbsdk new-target --toolchain c``
renders a plugin whose hooks call the chip's intrinsics, compiled with the host's C compiler to emulate.
The C scaffold of example/npu conforms with the same counts as the LLVM scaffold, every kernel compiling
with ``-Wall -Wextra -Werror``."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlir import ir

from pbsdk.core.emit_c import CEmitError, prepare, print_c
from pbsdk.core.errors import PbsdkError
from pbsdk.core.hook_contract import check_hooks
from pbsdk.core.pipeline import TILED_FORM, Stage, end_after
from pbsdk.targets.template.newtarget import new_target

NPU_SPEC = Path(__file__).resolve().parents[2] / "chip_specs" / "example" / "npu.yaml"
CC = shutil.which(os.environ.get("CC", "cc"))
WERROR = ["-std=c11", "-Wall", "-Wextra", "-Werror"]
needs_cc = pytest.mark.skipif(CC is None, reason="no host C compiler")


def _stages(*names: str) -> tuple[Stage, ...]:
    return tuple(Stage(n, fn=lambda m, c: None) for n in names)


def test_end_after_keeps_the_stages_up_to_it_then_the_final_one() -> None:
    stages = _stages("input", "promote", TILED_FORM, "matrix-unit", "lower-loops", "lower-llvm", "emit")
    kept = end_after(stages, "lower-loops", final=stages[-1])
    assert [s.name for s in kept] == ["input", "promote", TILED_FORM, "matrix-unit", "lower-loops", "emit"]
    assert [s.name for s in end_after(stages, TILED_FORM, final=stages[-1])][-2:] == [TILED_FORM, "emit"]
    with pytest.raises(PbsdkError, match="unknown stage 'lower-loop'.*lower-loops"):
        end_after(stages, "lower-loop", final=stages[-1])
    with pytest.raises(PbsdkError, match=f"tiled form \\(stage '{TILED_FORM}'\\)"):
        end_after(stages, "promote", final=stages[-1])


def _module(text: str) -> ir.Module:
    module = ir.Module.parse(text, ir.Context())
    prepare(module)
    return module


def test_the_printer_refuses_an_op_it_does_not_know() -> None:
    module = _module("""
    func.func @f(%x: memref<4xf32>) {
      %c0 = arith.constant 0 : index
      %v = vector.load %x[%c0] : memref<4xf32>, vector<4xf32>
      vector.store %v, %x[%c0] : memref<4xf32>, vector<4xf32>
      return
    }""")
    with pytest.raises(CEmitError, match="does not know op 'vector.load'") as err:
        print_c(module)
    assert err.value.op == "vector.load"
    branches = _module("""
    func.func @g(%x: memref<4xf32>, %p: i1) {
      cf.cond_br %p, ^a, ^b
    ^a:
      %c0 = arith.constant 0 : index
      %one = arith.constant 1.0 : f32
      memref.store %one, %x[%c0] : memref<4xf32>
      cf.br ^b
    ^b:
      return
    }""")
    with pytest.raises(CEmitError, match="unstructured control flow"):
        print_c(branches)


@pytest.fixture(scope="module")
def c_plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The C scaffold of example/npu, importable in this process (as ``pbsdk_npuc``)."""
    out = tmp_path_factory.mktemp("c") / "npuc"
    new_target("npuc", NPU_SPEC, out, toolchain="c")
    sys.path.insert(0, str(out))
    yield out
    sys.path.remove(str(out))
    sys.modules.pop("pbsdk_npuc", None)
    sys.modules.pop("pbsdk_npuc.hooks", None)


def test_the_c_scaffold_renders_header_emulation_and_checked_hooks(c_plugin: Path) -> None:
    rel = sorted(str(p.relative_to(c_plugin)) for p in c_plugin.rglob("*") if p.is_file())
    assert rel == ["README.md", "pbsdk_npuc/__init__.py", "pbsdk_npuc/csrc/npuc_intrinsics.c",
                   "pbsdk_npuc/csrc/npuc_intrinsics.h", "pbsdk_npuc/hooks.py", "pbsdk_npuc/spec.yaml",
                   "pyproject.toml", "tests/test_conformance.py"]
    header = (c_plugin / "pbsdk_npuc" / "csrc" / "npuc_intrinsics.h").read_text()
    for fn in ("npuc_mma_mxu_bf16_f32", "npuc_mma_mxu_f16_f32", "npuc_mma_mxu_i8_i32", "npuc_dma"):
        assert f"void {fn}(" in header
    assert '"csrc/*.h", "csrc/*.c"' in (c_plugin / "pyproject.toml").read_text()
    hooks = importlib.import_module("pbsdk_npuc.hooks")
    assert {"matrix_unit_op", "dma_copy", "scratchpad_alloc", "toolchain_emission"} <= check_hooks(hooks, target="npuc")
    target = importlib.import_module("pbsdk_npuc").NpucTarget
    assert target.emit_after == "lower-loops" and Path(target.c_sources[0]).is_file()
    with pytest.raises(PbsdkError, match="unknown toolchain 'rust'"):
        new_target("npur", NPU_SPEC, c_plugin.parent / "r", toolchain="rust")


@needs_cc
def test_the_intrinsics_compile_warning_free(c_plugin: Path, tmp_path: Path) -> None:
    csrc = c_plugin / "pbsdk_npuc" / "csrc"
    proc = subprocess.run([str(CC), *WERROR, "-c", str(csrc / "npuc_intrinsics.c"), "-o", str(tmp_path / "i.o")],
                          capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr


@needs_cc
@pytest.mark.parametrize("family", ["matmul/f16/unit+1", "matmul/bf16/transposed-b", "softmax/bf16", "conv2d/f16/nchw-groups2",
                                    "quantized_linear/i8/per-channel", "attention/f16"])
def test_generated_c_compiles_warning_free_and_runs(c_plugin: Path, tmp_path: Path, family: str) -> None:
    """One case per op family: its kernel is C calling the intrinsics, compiles with -Werror, and passes."""
    from pbsdk.conformance import generate_cases
    from pbsdk.conformance.runner import run_case
    from pbsdk.core.compiler import resolve
    from pbsdk.targets.template import c_toolchain

    target = importlib.import_module("pbsdk_npuc").NpucTarget()
    request = resolve(target, None, None)
    case = next(c for c in generate_cases(request.spec) if c.name.startswith(family))
    sources: list[str] = []
    build = c_toolchain.build_library

    def keep(source: str, *args: object, **kwargs: object) -> Path:
        sources.append(source)
        return build(source, *args, **kwargs)  # type: ignore[arg-type]

    c_toolchain.build_library = keep  # type: ignore[assignment]
    try:
        result = run_case(case, target=target, spec=request.spec)
    finally:
        c_toolchain.build_library = build  # type: ignore[assignment]
    assert result.status == "pass", result.message
    assert result.resource_check == "ok" and result.resources and result.resources["modelled"]["seconds"] > 0
    assert sources, "the kernel was not loaded from C"
    (tmp_path / "k.c").write_text(sources[0])
    proc = subprocess.run([str(CC), *WERROR, f"-I{c_plugin / 'pbsdk_npuc' / 'csrc'}", "-c", str(tmp_path / "k.c"),
                           "-o", str(tmp_path / "k.o")], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "npuc_dma(" in sources[0]
    assert "npuc_mma_" in sources[0] or not family.startswith(("matmul", "quantized", "attention"))


def _install(src: Path, site: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--no-index", "--target", str(site), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _conform(site: Path, target: str, report: Path) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "PBSDK_CFLAGS": "-Werror"}  # a warning in any kernel fails its case
    proc = subprocess.run([sys.executable, "-m", "pbsdk.cli", "conform", "--target", target, "--report", str(report)],
                          capture_output=True, text=True, timeout=900, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data: dict[str, object] = json.loads(report.read_text())
    return data


@needs_cc
def test_c_scaffold_conforms_with_the_llvm_scaffolds_counts(tmp_path: Path) -> None:
    """The issue's 'done when': new-target --toolchain c, pip install, conform: the same cases pass (and skip)
    as on the LLVM scaffold of the same spec, every kernel's C compiled with -Werror."""
    t0 = time.perf_counter()
    site = tmp_path / "site"
    for name, toolchain in (("npullvm", "llvm"), ("npuc", "c")):
        _install(new_target(name, NPU_SPEC, tmp_path / name, toolchain=toolchain).out, site)
    llvm = _conform(site, "npullvm", tmp_path / "llvm.json")
    c = _conform(site, "npuc", tmp_path / "c.json")
    counts = [{k: r[k] for k in ("passed", "failed", "skipped", "errors")} for r in (llvm, c)]
    assert counts[0] == counts[1] and counts[1]["failed"] == counts[1]["errors"] == 0, counts
    status = [{case["name"]: case["status"] for case in r["cases"]} for r in (llvm, c)]  # type: ignore[attr-defined]
    assert status[0] == status[1]
    passed = [case for case in c["cases"] if case["status"] == "pass"]  # type: ignore[attr-defined]
    assert all(case["resource_check"] == "ok" and case["resources"]["modelled"]["seconds"] > 0 for case in passed)
    print(f"llvm and c scaffolds: {counts[1]}, {time.perf_counter() - t0:.1f} s")


@needs_cc
@pytest.mark.slow
@pytest.mark.parametrize("spec", ["tiny_npu", "edge_npu", "int8_npu"])
def test_c_scaffold_conforms_on_other_specs(spec: str, tmp_path: Path) -> None:
    """The C variant of other chips (f32 and bf16 units of other shapes, a single core, i8 and bf16 units):
    every generated case passes with its resources checked, in this process (no install)."""
    from pbsdk.conformance import generate_cases
    from pbsdk.conformance.runner import run_case
    from pbsdk.core.compiler import resolve

    name = spec.replace("_", "")
    out = new_target(name, Path(__file__).with_name("data") / f"{spec}.yaml", tmp_path / name, toolchain="c").out
    sys.path.insert(0, str(out))
    try:
        package = importlib.import_module(f"pbsdk_{name}")
        target = next(v for k, v in vars(package).items() if k.endswith("Target") and k != "TemplateTarget")()
        request = resolve(target, None, None)
        results = [run_case(c, target=target, spec=request.spec) for c in generate_cases(request.spec)]
    finally:
        sys.path.remove(str(out))
    bad = [f"{r.name}: {r.status} {r.message[:300]}" for r in results
           if r.status in ("fail", "error") or (r.status == "pass" and r.resource_check != "ok")]
    assert not bad and sum(r.status == "pass" for r in results) >= 50, bad
