"""The conformance suite: cases follow the spec; the cpu target passes; reports are well formed."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from pbsdk.conformance import generate_cases
from pbsdk.core.plan import Contraction, plan_contraction
from pbsdk.core.spec import load_spec
from pbsdk.testing import cannot_run

#: The spec the cpu target's conformance runs on: the portable AVX-512 baseline where this host runs its
#: code, else the host's own (an AVX2 machine).
RUNNABLE = "avx512" if cannot_run("avx512") is None else "host"


def test_cases_follow_the_compute_tile_and_capacities() -> None:
    spec = load_spec("npu")
    cases = generate_cases(spec)
    names = [c.name for c in cases]
    # Every dtype the spec lists has cases (bf16 through ml_dtypes; i32 as operands); bf16 matmuls use the 32x32x32
    # matrix unit and are judged at the tolerance of its f32 accumulator.
    assert {c.dtype for c in cases} == {"f32", "bf16", "f16", "i8", "i32"}
    bf16 = next(c for c in cases if c.name == "matmul/bf16/unit/32x32x32")
    assert bf16.matrix_unit == "mxu" and bf16.accumulator == "f32" and bf16.skip is None
    # i8 on the i8 -> i32 mxu (32x32x64), compared bit for bit.
    i8 = next(c for c in cases if c.name == "matmul/i8/unit/32x32x64")
    assert i8.matrix_unit == "mxu" and i8.accumulator == "i32" and i8.compare == "exact"
    assert any(c.name.startswith("quantized_linear/i8/per-channel/") for c in cases)
    # i32 operands: elementwise, and an i8 contraction's i32 result feeding i32 ops (inputs i8, i8, i32).
    i32 = [c for c in cases if c.dtype == "i32"]
    assert {c.name.split("/")[0] for c in i32} == {"elementwise", "matmul"} and all(c.compare == "exact" for c in i32)
    chained = next(c for c in i32 if c.name.startswith("matmul/i32/i8-matmul-bias-max/"))
    assert [x.dtype for x in chained.inputs()] == [np.int8, np.int8, np.int32]
    u = plan_contraction(spec, Contraction(1024, 1024, 1024, dtype="f32")).compute
    assert f"matmul/f32/unit/{u.m}x{u.n}x{u.k}" in names
    assert f"matmul/f32/unit+1/{u.m + 1}x{u.n + 1}x{u.k + 1}" in names
    assert any(n.startswith("matmul/f32/straddle-spm-under/") for n in names)
    assert any(n.startswith("matmul/f32/straddle-spm-over/") for n in names)


def test_a_smaller_scratchpad_moves_the_straddle_cases() -> None:
    spec = load_spec("npu")
    data = spec.model_dump()
    for m in data["memory"]:
        if m["name"] == "spm":
            m["size_bytes"] //= 4
    small = type(spec).model_validate(data)

    def straddle(s):  # side of the under-capacity case for spm
        return next(c.shapes[0][0] for c in generate_cases(s, ops_filter=["matmul"])
                    if c.name.startswith("matmul/f32/straddle-spm-under"))

    assert straddle(small) < straddle(spec)


def test_cpu_target_passes_conformance(tmp_path: Path) -> None:
    from pbsdk.cli import main

    report, junit = tmp_path / "r.json", tmp_path / "r.xml"
    code = main(["conform", "--target", "cpu", "--spec", RUNNABLE, "--ops", "matmul,softmax,conv2d",
                 "--report", str(report), "--junit", str(junit)])
    data = json.loads(report.read_text())
    bad = [c for c in data["cases"] if c["status"] in ("fail", "error")]
    assert code == 0 and not bad, bad
    assert data["summary"]["pass"] >= 20
    suite = ET.fromstring(junit.read_text())
    assert suite.tag == "testsuite" and int(suite.get("tests")) == len(data["cases"])


def test_a_wrong_target_is_reported_case_by_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """A target that computes the wrong thing fails conformance with the error measured."""
    from pbsdk.conformance import run_cases
    from pbsdk.conformance.cases import Case
    from pbsdk.testing import reference as ref

    wrong = Case("matmul/f32/wrong", "matmul", "f32", ((3, 4), (4, 5)), lambda a, b: a @ b + 1e-3,
                 ref.matmul, 4)
    (result,) = run_cases([wrong], target="cpu", spec=load_spec(RUNNABLE))
    assert result.status == "fail" and result.max_abs_error == pytest.approx(1e-3, rel=1e-2)
    assert "worst" in result.message or "mismatch" in result.message


def test_pytest_plugin_runs_generated_cases(tmp_path: Path) -> None:
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--pbsdk-target", "cpu",
                             "--pbsdk-spec", RUNNABLE, "--pbsdk-ops", "softmax,layernorm", str(tmp_path)],
                            capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert " passed" in result.stdout and "conformance" not in result.stderr


def test_nvgpu_target_runs_the_suite_compile_only(tmp_path: Path) -> None:
    """With --no-emulate and no GPU every nvgpu case compiles (PTX + cubin) and is reported 'compiled, not run'."""
    from pbsdk.cli import main
    from pbsdk.targets.nvgpu.runtime import available

    report = tmp_path / "nv.json"
    code = main(["conform", "--target", "nvgpu", "--spec", "h100", "--ops", "matmul,softmax,attention",
                 "--no-emulate", "--report", str(report)])
    data = json.loads(report.read_text())
    bad = [c for c in data["cases"] if c["status"] in ("fail", "error")]
    assert code == 0 and not bad, bad
    if not available():
        not_run = [c for c in data["cases"] if c["status"] == "skip" and "compiled, not run" in c["message"]]
        assert len(not_run) >= 20, data["summary"]


def test_nvgpu_cases_run_on_the_host_emulation_without_a_gpu(tmp_path: Path) -> None:
    """Without a GPU the nvgpu schedule of each case runs on the host (`Target.emulate`) and is checked."""
    from pbsdk.cli import main
    from pbsdk.conformance.runner import EMULATED
    from pbsdk.targets.nvgpu.runtime import available

    if available():
        pytest.skip("a GPU is present: the cases run on it")
    report = tmp_path / "nv.json"
    code = main(["conform", "--target", "nvgpu", "--spec", "a100", "--ops", "softmax,layernorm", "--report", str(report)])
    data = json.loads(report.read_text())
    ran = [c for c in data["cases"] if c["status"] == "pass" and c["message"].startswith(EMULATED)]
    assert code == 0 and len(ran) >= 4, data["summary"]


def test_the_resource_check_bars() -> None:
    """What a case's reported resources must respect: operands through a scratchpad (where the chip has
    one and the target reports counters), no level over capacity, no more cores than the chip has."""
    from pbsdk.conformance.runner import check_resources

    spec = load_spec("example/npu")  # dram, sram, spm (4 cores)
    case = next(c for c in generate_cases(spec, ops_filter=["softmax"]) if not c.skip)
    moved = {"bytes:dram->spm": 4096}
    assert check_resources(case, spec, {"counters": moved, "scratchpad_bytes": {"spm": 1024}, "cores": 4}) == "ok"
    assert "no bytes moved from dram into a scratchpad" in check_resources(case, spec, {"counters": {}})
    assert "runs on 5 cores; the chip has 4" in check_resources(case, spec, {"counters": moved, "cores": 5})
    over = check_resources(case, spec, {"counters": moved, "scratchpad_bytes": {"spm": 10**9}})
    assert "spm" in over and over != "ok"
    assert check_resources(case, spec, None) == "not reported"


def test_cpu_cases_on_the_host_units_say_so() -> None:
    """On the host spec, every bf16/i8 case whose contraction the planner puts on a matrix unit passes its
    resource check from the cpu target's compile-time record — fused attention's two products included —
    and its one-line summary names the unit (the cpu target has no run-time counters)."""
    from pbsdk.conformance import run_cases
    from pbsdk.conformance.runner import resource_summary

    spec = load_spec("host")
    cases = [c for c in generate_cases(spec, ops_filter=["matmul", "attention", "quantized_linear"])
             if c.matrix_unit and not c.skip and c.dtype in ("bf16", "i8")]
    if not cases:
        pytest.skip("this host lists no bf16 or i8 matrix unit (pbsdk spec show host)")
    wanted = {"attention", "matmul"}
    cases = [c for c in cases if c.name.split("/")[0] in wanted and ("unit/" in c.name or "attention" in c.name)]
    results = run_cases(cases, target="cpu", spec=spec)
    for case, result in zip(cases, results):
        assert result.status == "pass" and result.resource_check == "ok", (case.name, result.message)
        # the planner's unit, or (fused attention on an AMX host) the vector-register unit of the same dtype
        names = {case.matrix_unit} | {u.name for u in spec.matrix_units if u.operand_dtype == case.dtype}
        assert any(f"{n} " in resource_summary(result) for n in names), (case.name, resource_summary(result))
    fused = [r for r in results if r.name.startswith("attention/")]
    for r in fused:
        assert len(r.resources["contractions"]) == 2


def test_the_summary_of_a_compile_time_record() -> None:
    from pbsdk.conformance.runner import CaseResult, resource_summary

    record = [{"compute": "matrix-unit", "unit": "vpdpbusd"}, {"compute": "vector-fma", "unit": None},
              {"compute": "matrix-unit", "unit": "vpdpbusd"}]
    result = CaseResult("x", "pass", "", 0.0, resources={"scratchpad_bytes": {}, "contractions": record})
    assert resource_summary(result) == "vector-fma 1/3 contractions, vpdpbusd 2/3 contractions"
    counted = CaseResult("x", "pass", "", 0.0, resources={"scratchpad_bytes": {}, "matrix_unit_ops": {"mxu": 4},
                                                          "contractions": record})
    assert resource_summary(counted) == "mxu 4 ops"
    assert resource_summary(CaseResult("x", "pass", "", 0.0, resources={"scratchpad_bytes": {}})) == \
        "no scratchpad, no matrix unit"
