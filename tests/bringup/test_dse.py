"""`pbsdk dse`, `pbsdk explain --modelled` and the modelled time in conformance reports, end to end on the
template target's emulation."""

from __future__ import annotations

import json

import pytest

from pbsdk import ops
from pbsdk.cli import main
from pbsdk.emulation import emulate


def test_dse_sweeps_a_scratchpad_and_writes_json_and_plot(tmp_path, capsys):
    rc = main(["dse", "--spec", "npu", "--vary", "memory.spm.size_bytes=65536,262144", "--model",
               "matmul:256,256,512,f16", "--jobs", "1", "--out", str(tmp_path)])
    assert rc == 0
    report = json.loads((tmp_path / "dse.json").read_text())
    small, big = report["variants"]
    assert (small["values"], big["values"]) == ({"memory.spm.size_bytes": 65536}, {"memory.spm.size_bytes": 262144})
    # A smaller scratchpad holds smaller tiles: it refills more often, and the run cannot get faster.
    assert small["bytes_per_level"]["spm"] > big["bytes_per_level"]["spm"]
    assert small["modelled"]["seconds"] >= big["modelled"]["seconds"] > 0
    assert small["counters"]["matrix_unit:mxu"] == big["counters"]["matrix_unit:mxu"] == 8 * 8 * 16
    assert (tmp_path / "dse.png").stat().st_size > 1000
    assert "memory.spm.size_bytes | modelled us" in capsys.readouterr().out


def test_dse_shards_merge_to_the_whole_sweep(tmp_path):
    args = ["dse", "--spec", "npu", "--vary", "memory.spm.size_bytes=65536,131072,262144", "--model",
            "matmul:128,128,128,f16", "--jobs", "1"]
    for i in range(2):
        assert main([*args, "--shard", f"{i}/2", "--out", str(tmp_path / f"s{i}")]) == 0
    assert main(["dse", "--merge", str(tmp_path / "s0" / "dse.json"), str(tmp_path / "s1" / "dse.json"),
                 "--out", str(tmp_path / "all")]) == 0
    merged = json.loads((tmp_path / "all" / "dse.json").read_text())
    assert [r["values"]["memory.spm.size_bytes"] for r in merged["variants"]] == [65536, 131072, 262144]


def test_dse_reports_a_variant_that_does_not_compile(tmp_path, capsys):
    rc = main(["dse", "--spec", "npu", "--vary", "memory.spm.size_bytes=64", "--model", "matmul:64,64,64,f16",
               "--out", str(tmp_path)])
    assert rc == 1
    (row,) = json.loads((tmp_path / "dse.json").read_text())["variants"]
    assert "error" in row


@pytest.mark.parametrize("argv, needle", [
    (["dse", "--spec", "npu", "--vary", "memory.nowhere.size_bytes=1", "--model", "gpt2-block"], "no memory entry"),
    (["dse", "--spec", "npu", "--vary", "clock_ghz=1", "--model", "bert"], "not a .mlir file nor a built-in"),
    (["dse", "--spec", "npu", "--model", "gpt2-block"], "--vary"),
])
def test_dse_bad_arguments_are_one_line_errors(argv, needle, capsys, tmp_path):
    assert main([*argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err


def test_explain_prints_the_modelled_time_next_to_the_planner(capsys):
    assert main(["explain", "--matmul", "128", "128", "256", "--dtype", "f16", "--spec", "npu", "--modelled"]) == 0
    out = capsys.readouterr().out
    assert "modelled on example/npu (template emulation" in out and "planner" in out and "matrix_unit:mxu" in out


def test_emulated_matmul_counts_what_the_chip_would_do():
    run = emulate(lambda a, b: ops.matmul(a, b), [((128, 256), "f16"), ((256, 64), "f16")], spec="npu")
    assert run.counters["matrix_unit:mxu"] == 4 * 2 * 8
    t = run.modelled
    assert t.seconds == pytest.approx(t.compute_seconds + t.dma_seconds) or t.overlapped
    assert run.planner_estimate_seconds and run.planner_estimate_seconds > 0
    # Every operand byte crosses from main memory at least once.
    assert run.bytes_per_level()["dram"] >= (128 * 256 + 256 * 64) * 2


def test_conform_reports_each_cases_modelled_time_and_the_planners(tmp_path):
    report = tmp_path / "r.json"
    assert main(["conform", "--target", "template", "--spec", "npu", "--ops", "matmul", "--report", str(report)]) == 0
    cases = [c for c in json.loads(report.read_text())["cases"] if c["status"] == "pass"]
    assert cases and all(c["resources"]["modelled"]["seconds"] > 0 for c in cases)
    unit = [c for c in cases if c["resources"].get("matrix_unit_ops")]
    assert unit and all(c["resources"]["modelled"]["terms"]["matrix_unit:mxu"] > 0 for c in unit)
    assert all(c["resources"]["planner_estimate_seconds"] > 0 for c in unit)


def test_torch_and_jax_reports_give_a_whole_models_modelled_time():
    torch = pytest.importorskip("torch")
    import numpy as np

    import pbsdk.frontends.torch as pt

    pt.clear_reports()
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 32)).eval()
    compiled = torch.compile(model, backend="pbsdk", options={"target": "template", "spec": "npu"})
    with torch.no_grad():
        compiled(torch.randn(16, 64))
    (report,) = pt.reports()
    assert report.modelled_seconds() is not None and report.modelled_seconds() > 0

    jax = pytest.importorskip("jax")
    from pbsdk.frontends import jax as pj

    pj.clear_reports()
    fn = pj.jit(lambda x, w: jax.nn.relu(x @ w), target="template", spec="npu")
    fn(np.ones((32, 64), np.float32), np.ones((64, 32), np.float32))
    assert pj.reports()[-1].modelled_seconds() > 0
    # The cpu target models no chip time.
    cpu = pj.jit(lambda x: x * 2.0)
    cpu(np.ones(8, np.float32))
    assert pj.reports()[-1].modelled_seconds() is None
