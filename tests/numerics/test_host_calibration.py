"""The host calibration's probes on this machine: JIT-compiled, run, and giving figures a CPU can have."""

from __future__ import annotations

import pytest

from pbsdk.core.spec import calibrate as cal
from pbsdk.core.spec import host as host_mod


def test_the_probes_measure_this_cpu(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PBSDK_HOST_DIR", str(tmp_path))
    monkeypatch.delenv("PBSDK_CALIBRATE", raising=False)
    cpu, features, enabled, triple = host_mod._llvm_host()
    if not triple.startswith("x86_64"):
        pytest.skip(f"the probes are checked on x86-64 hosts (this is {triple})")
    _, _, widths = host_mod._vector_shape(enabled, triple)
    levels = [("l1d", 32 << 10, False), ("l2", 1 << 20, False), ("dram", 0, True)]
    got = cal.derive(cal.measure(cpu, features, enabled, widths, levels, cores=1))
    assert 0.5 <= got.clock_ghz <= 7.0, got
    # every x86 core of the last decade issues between one FMA every two cycles and four a cycle
    assert set(got.fma_per_cycle) == set(widths) and all(0.4 <= r <= 4.5 for r in got.fma_per_cycle.values()), got
    if enabled.get("avx512vnni"):
        assert 0.4 <= got.unit_per_cycle["vpdpbusd"] <= 4.5, got
    assert got.bandwidth_gbps["l1d"] > got.bandwidth_gbps["dram"] > 0.5, got


def test_the_detected_host_is_calibrated_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PBSDK_HOST_DIR", str(tmp_path))
    monkeypatch.delenv("PBSDK_CALIBRATE", raising=False)
    data = host_mod.host_spec_data()
    if not data["codegen"]["triple"].startswith("x86_64"):
        pytest.skip("x86-64 hosts only")
    assert data["provenance"]["clock_ghz"].startswith("measured"), data["provenance"]
    assert len(list(tmp_path.glob("*.json"))) == 1
    monkeypatch.setattr(cal, "measure", lambda *a, **k: pytest.fail("measured again"))
    again = host_mod.host_spec_data()
    assert again["clock_ghz"] == data["clock_ghz"] and again["vector"] == data["vector"]


def test_pbsdk_spec_calibrate_measures_again_and_lists_the_figures(tmp_path, monkeypatch, capsys) -> None:
    from pbsdk.cli import main

    monkeypatch.setenv("PBSDK_HOST_DIR", str(tmp_path))
    monkeypatch.delenv("PBSDK_CALIBRATE", raising=False)
    if not host_mod.host_spec_data(calibrate=False)["codegen"]["triple"].startswith("x86_64"):
        pytest.skip("x86-64 hosts only")
    assert main(["spec", "calibrate"]) == 0
    out = capsys.readouterr().out
    assert "clock_ghz = " in out and "vector.fma_per_cycle = " in out and "[measured" in out
    assert "memory.l1d.bandwidth_gbps = " in out
    monkeypatch.setenv("PBSDK_CALIBRATE", "0")
    assert main(["spec", "calibrate"]) == 2  # nothing measured: a clear error, not a listing of estimates
    assert "PBSDK_CALIBRATE=0" in capsys.readouterr().err
