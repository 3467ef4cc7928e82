"""The kernel benchmark suite (`pbsdk.bench`, ``benchmarks/suite.py``) in --quick mode: it runs end to end,
writes its outputs with the documented schema, and every pbsdk result is checked. No timing assertions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pbsdk import bench
from pbsdk.cli import main as cli_main

ROOT = Path(__file__).resolve().parents[2]
# A case of each workload builder (batched matmul shares matmul's), both conv layouts and a grouped conv, choosing the
# ones that compile fastest: ~15 s on 2 idle cores.
SMOKE_CASES = ["matmul_256", "conv1x1_56_64to256_nhwc", "conv1x1_7_2048to512_nchw", "conv3x3_28_128_g8_nhwc",
               "convT3x3s2_28_64to32_nhwc", "matmul_bias_gelu_512x768x3072", "softmax_512x4096",
               "layernorm_512x4096"]


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[subprocess.CompletedProcess[str], Path]:
    out = tmp_path_factory.mktemp("bench")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "suite.py"), "--quick", "--threads", "1",
                           "--out", str(out), "--only", *SMOKE_CASES], capture_output=True, text=True,
                          timeout=240, cwd=ROOT, check=False)
    return proc, out


def test_quick_run_writes_results(quick_run: tuple[subprocess.CompletedProcess[str], Path]) -> None:
    proc, out = quick_run
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "results.json").read_text())
    assert report["schema"] == bench.SCHEMA
    for key in ("cpu_model", "cores", "numpy", "torch", "pbsdk", "date", "pbsdk_commit"):
        assert key in report["machine"]
    assert report["config"]["quick"] is True and report["config"]["threads"] == [1]
    assert [c["name"] for c in report["cases"]] == SMOKE_CASES
    assert [(r["case"], r["threads"]) for r in report["results"]] == [(c, 1) for c in SMOKE_CASES]
    for r in report["results"]:
        assert r["correct"] is True, (r["case"], r["checks"], r["errors"])
        assert r["checks"]["pbsdk"]["correct"] is True
        assert r["checks"]["pbsdk"]["max_abs_error"] is not None
        assert r["compile_s"]["pbsdk"] > 0
        assert set(r["times_ms"]) >= {"pbsdk", "numpy"}
        assert all(t > 0 for t in r["times_ms"].values())
        assert set(r["ratio"]) >= {"numpy"} and "inductor" not in r["times_ms"]  # quick: no Inductor
        assert all(len(v) == 1 for v in r["round_minimums_ms"].values())
        assert r["repeats"]["pbsdk"] == 1
    table = (out / "table.md").read_text()
    assert "| case | shape | thr |" in table and all(f"| {c} |" in table for c in SMOKE_CASES)
    if report["plot"] is not None:  # matplotlib is optional (the `bench` extra)
        assert (out / report["plot"]).stat().st_size > 0


@pytest.mark.parametrize("argv", [["--threads", "0"], ["--threads", "1,x"], ["--only", "no_such_case"],
                                  ["--contenders", "pbsdk,mkl"], ["--rounds", "0"]])
def test_bad_options_exit_2(argv: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["bench", "--out", str(tmp_path / "o"), *argv]) == 2
    assert "pbsdk: error: --" in capsys.readouterr().err
    assert bench.main(["--out", str(tmp_path / "o"), *argv]) == 2
    assert not (tmp_path / "o").exists()


def test_selection_by_name_family_and_glob() -> None:
    assert bench.select(["softmax"]) == ["softmax_4096x4096", "softmax_512x4096"]
    assert bench.select(["conv1x1*", "matmul_256"]) == ["matmul_256", "conv1x1_56_64to256_nhwc",
                                                         "conv1x1_56_64to256_nchw", "conv1x1_7_2048to512_nchw"]
    assert len(bench.select(None)) == len(bench.CASES)


def test_spec_at_clock_scales_per_cycle_figures_only() -> None:
    from pbsdk.core.spec import load_spec

    spec = load_spec("zen3")
    slow = bench.spec_at_clock(spec, spec.clock_ghz / 2)
    assert slow.clock_ghz == spec.clock_ghz / 2
    assert slow.peak_tflops["f32"] == pytest.approx(spec.peak_tflops["f32"] / 2)
    for lv, lv2 in zip(spec.memory, slow.memory):
        half = lv.scope != "device"  # per-core caches deliver bytes a cycle; chip-wide levels keep theirs
        assert lv2.bandwidth_gbps == pytest.approx(lv.bandwidth_gbps / (2 if half else 1)), lv.name
    assert bench.spec_at_clock(spec.model_copy(update={"clock_ghz": None}), 3.0) is None


def test_cost_model_table_reports_the_clock_the_case_ran_at() -> None:
    results = [{"case": c, "threads": 1, "predicted_ms": p, "times_ms": {"pbsdk": m}, "clock_ghz": [2.9, 3.0],
                "predicted_ms_at_clock": p * 1.1} for c, p, m in (("a", 10.0, 12.0), ("b", 20.0, 22.0),
                                                                  ("c", 5.0, 6.0))]
    check = bench.cost_model_check(results)
    rows = {r["case"]: r for r in check["1"]["cases"]}
    assert rows["a"]["ratio"] == pytest.approx(1.2) and rows["a"]["ratio_at_clock"] == pytest.approx(12 / 11)
    table = bench.cost_model_table(check)
    assert "clock during the case, GHz" in table and "| a | 10 | 12 | 1.20 | 2.90–3.00 | 1.09 |" in table
    # results without a clock (older files, --quick) keep the four columns
    plain = bench.cost_model_table(bench.cost_model_check([{k: v for k, v in r.items() if "clock" not in k}
                                                           for r in results]))
    assert "clock" not in plain and "| a | 10 | 12 | 1.20 |" in plain
