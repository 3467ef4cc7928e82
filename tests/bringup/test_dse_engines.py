"""Where sweeps and conformance run (`pbsdk.engines`): results streamed as they finish, an interrupted
sweep resumed, and — with ``--runray`` — the same reports from Ray tasks on a local Ray of two workers,
also when a worker is killed mid-sweep."""

from __future__ import annotations

import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

import pytest

from pbsdk import dse
from pbsdk.cli import main

SWEEP = ["--spec", "npu", "--vary", "memory.spm.size_bytes=65536,131072,262144", "--vary", "clock_ghz=1.0,2.0",
         "--model", "matmul:128,128,256,f16"]
#: What may differ between two runs of one sweep: how long things took.
TIMES = ("seconds", "compile_seconds", "run_seconds", "wall_seconds")


def _untimed(report: dict[str, Any]) -> dict[str, Any]:
    return {k: ([{f: v for f, v in row.items() if f not in TIMES} for row in val] if k == "variants" else val)
            for k, val in report.items() if k not in TIMES}


def _report(path: Path) -> dict[str, Any]:
    return dict(json.loads((path / "dse.json").read_text()))


def test_rows_stream_in_and_an_interrupted_sweep_resumes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dse", *SWEEP, "--jobs", "1", "--out", str(tmp_path / "whole")]) == 0
    assert "6/6 variants" in capsys.readouterr().err  # the progress bar
    whole = _report(tmp_path / "whole")

    ran: list[int] = []
    real = dse.run_variant

    def interrupted_after_two(model: str, spec: Any, options: Any = None) -> dict[str, Any]:
        if len(ran) == 2:
            raise KeyboardInterrupt  # the user's Ctrl-C mid-sweep
        ran.append(1)
        return real(model, spec, options)

    monkeypatch.setattr(dse, "run_variant", interrupted_after_two)
    assert main(["dse", *SWEEP, "--jobs", "1", "--out", str(tmp_path / "cut")]) == 130  # interrupted
    partial = _report(tmp_path / "cut")
    assert len(partial["variants"]) == 2  # written as each finished

    ran.clear()
    monkeypatch.setattr(dse, "run_variant", lambda *a, **k: (ran.append(1), real(*a, **k))[1])
    assert main(["dse", *SWEEP, "--jobs", "1", "--resume", "--out", str(tmp_path / "cut")]) == 0
    assert len(ran) == 4 and _untimed(_report(tmp_path / "cut")) == _untimed(whole)


def test_variants_start_in_run_order_and_report_in_index_order(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[float] = []

    def fake(model: str, spec: Any, options: Any = None) -> dict[str, Any]:
        started.append(spec.memory_level("spm").size_bytes * 10 + spec.clock_ghz)
        return {"modelled": {"seconds": 1.0}}

    monkeypatch.setattr(dse, "run_variant", fake)
    vary = [dse.parse_vary("memory.spm.size_bytes=65536,131072,262144"), dse.parse_vary("clock_ghz=1.0,2.0,3.0")]
    report = dse.explore("npu", vary, "matmul:128,128,256,f16", jobs=1)
    grid = [65536 * 10 + 1.0, 65536 * 10 + 2.0, 65536 * 10 + 3.0, 131072 * 10 + 1.0, 131072 * 10 + 2.0,
            131072 * 10 + 3.0, 262144 * 10 + 1.0, 262144 * 10 + 2.0, 262144 * 10 + 3.0]
    assert started == [grid[i] for i in dse.run_order([3, 3])]
    assert started[:3] == [65536 * 10 + 1.0, 131072 * 10 + 2.0, 262144 * 10 + 3.0]  # each spm size, each clock
    assert [row["index"] for row in report["variants"]] == list(range(9))


def test_resume_refuses_another_sweeps_report(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dse", *SWEEP, "--jobs", "1", "--out", str(tmp_path)]) == 0
    other = ["--spec", "npu", "--vary", "clock_ghz=1.0,3.0", "--model", "matmul:128,128,256,f16"]
    assert main(["dse", *other, "--jobs", "1", "--resume", "--out", str(tmp_path)]) == 2
    assert "another sweep" in capsys.readouterr().err


def test_an_unknown_engine_is_a_clear_error() -> None:
    from pbsdk.core.errors import PbsdkError
    from pbsdk.engines import run_unordered

    with pytest.raises(PbsdkError, match="unknown engine 'dask'"):
        list(run_unordered(abs, [(0, -1)], engine="dask"))


ray_only = pytest.mark.ray


@ray_only
def test_a_ray_sweep_reports_what_the_local_one_does(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("ray")
    # The local Ray's workers inherit this process's environment: they compile into its cache directory.
    monkeypatch.setenv("PBSDK_CACHE_DIR", str(tmp_path / "cache"))
    assert main(["dse", *SWEEP, "--jobs", "2", "--engine", "ray", "--out", str(tmp_path / "ray")]) == 0
    assert list((tmp_path / "cache").glob("*.pbsdk-artifact"))
    assert main(["dse", *SWEEP, "--jobs", "1", "--out", str(tmp_path / "local")]) == 0
    assert _untimed(_report(tmp_path / "ray")) == _untimed(_report(tmp_path / "local"))


def _ray_task_pids(name: str) -> list[int]:
    """Processes running a Ray task of ``name`` (Ray titles a busy worker ``ray::<task name>``)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if cmdline.startswith(f"ray::{name}".encode()) and entry.name.isdigit():
            pids.append(int(entry.name))
    return pids


@ray_only
def test_a_worker_killed_mid_sweep_loses_no_variant(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    killed: list[int] = []

    def kill_one(partial: dict[str, Any]) -> None:
        if killed:
            return
        for _ in range(200):  # the next task's worker: kill it while it runs its variant
            pids = _ray_task_pids("_worker")
            if pids:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])
                return
            threading.Event().wait(0.02)

    vary = [dse.parse_vary(v) for v in ("memory.spm.size_bytes=65536,131072,262144,524288", "clock_ghz=1.0,2.0")]
    report = dse.explore("npu", vary, "matmul:128,128,256,f16", jobs=2, engine="ray", on_row=kill_one)
    assert killed, "no running worker was found to kill"
    assert [r["index"] for r in report["variants"]] == list(range(8))
    assert all("error" not in r for r in report["variants"])


@ray_only
def test_conformance_on_ray_counts_what_the_local_run_counts(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    args = ["conform", "--target", "template", "--spec", "npu", "--ops", "softmax,elementwise"]
    assert main([*args, "--report", str(tmp_path / "local.json")]) == 0
    assert main([*args, "--engine", "ray", "--jobs", "2", "--report", str(tmp_path / "ray.json")]) == 0
    local, ray = (json.loads((tmp_path / f).read_text()) for f in ("local.json", "ray.json"))
    assert local["summary"] == ray["summary"] and local["summary"]["pass"] > 0
    assert [c["name"] for c in local["cases"]] == [c["name"] for c in ray["cases"]]


#: A shell command printing the parent of the process that runs it (`subprocess.getoutput`, a plain function
#: of the standard library, travels to Ray's workers by reference).
PARENT = "awk '{print $4}' /proc/$PPID/stat"


@ray_only
def test_while_a_local_ray_starts_a_forked_process_runs_the_first_item() -> None:
    pytest.importorskip("ray")
    import subprocess

    from pbsdk.engines import run_unordered

    # The first item's process is a child of this one (forked before Ray starts); every other item's is a
    # worker of Ray's raylet.
    me = str(os.getpid())
    parents = dict(run_unordered(subprocess.getoutput, [(i, PARENT) for i in range(5)], engine="ray", jobs=2))
    assert sorted(parents) == list(range(5))
    assert parents[0] == me and all(p != me for k, p in parents.items() if k != 0)


@ray_only
def test_an_item_whose_forked_process_dies_runs_again_on_ray() -> None:
    pytest.importorskip("ray")
    import subprocess

    from pbsdk.engines import run_unordered

    dies_here = f'[ "$({PARENT})" = {os.getpid()} ] && kill -9 $PPID; echo ran on ray'
    items = [(0, dies_here), (1, "echo 1"), (2, "echo 2")]
    assert dict(run_unordered(subprocess.getoutput, items, engine="ray", jobs=2)) == {0: "ran on ray", 1: "1", 2: "2"}
