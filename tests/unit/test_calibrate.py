"""Host calibration as decisions (no CPU needed): figures from raw timings, the probes' buffer plan, the
per-machine cache and its failure modes, and how measured figures replace the host spec's estimates."""

from __future__ import annotations

import json
import logging

import pytest

from pbsdk.core.spec import calibrate as cal
from pbsdk.core.spec import host as host_mod
from pbsdk.core.spec.loader import validate_data


def _timings(clock_hz: float = 3.5e9) -> cal.Timings:
    steps = int(clock_hz / 2 * 0.01)  # 10 ms of dependent add/xor pairs
    return cal.Timings(clock=cal.Timing(steps, 0.01),
                       fma={512: cal.Timing(int(clock_hz * 0.01), 0.01), 256: cal.Timing(int(2 * clock_hz * 0.01), 0.01)},
                       units={"vpdpbusd": cal.Timing(int(clock_hz * 0.01), 0.01)},
                       reads={"l1d": cal.Timing(int(220e9 * 0.01), 0.01), "dram": cal.Timing(int(27e9 * 0.01), 0.01)},
                       fma_latency=cal.Timing(int(clock_hz / 4 * 0.01), 0.01))  # one FMA every 4 cycles


def test_figures_follow_from_the_timings() -> None:
    c = cal.derive(_timings())
    assert c.clock_ghz == pytest.approx(3.5, abs=1e-3)
    assert c.fma_per_cycle == {512: pytest.approx(1.0, abs=1e-3), 256: pytest.approx(2.0, abs=1e-3)}
    assert c.unit_per_cycle == {"vpdpbusd": pytest.approx(1.0, abs=1e-3)}
    assert c.bandwidth_gbps == {"l1d": pytest.approx(220.0, abs=0.1), "dram": pytest.approx(27.0, abs=0.1)}
    assert c.fma_latency == pytest.approx(4.0, abs=0.01)
    assert cal.Calibration.from_json(c.to_json()) == c
    assert cal.derive(cal.Timings(cal.Timing(100, 1.0), {}, {}, {})).fma_latency is None  # not probed
    with pytest.raises(ValueError, match="clock"):
        cal.derive(cal.Timings(cal.Timing(0, 1.0), {}, {}, {}))


@pytest.mark.parametrize("measured, rate", [(0.97, 1), (1.0, 1), (0.6, 1), (1.66, 2), (1.98, 2), (2.3, 2), (0.2, 1)])
def test_issue_rates_round_to_whole_pipes(measured: float, rate: int) -> None:
    assert cal.issue_rate(measured) == rate


def test_read_plan_sizes_each_level_past_the_inner_ones() -> None:
    levels = [("l1d", 32 << 10, False), ("l2", 1 << 20, False), ("l3", 32 << 20, True), ("dram", 0, True)]
    plan = {name: (threads, nbytes) for name, threads, nbytes in cal.read_plan(levels, cores=2)}
    assert plan["l1d"] == (1, 16 << 10) and plan["l2"] == (1, 512 << 10)
    assert plan["l3"] == (2, 8 << 20)  # half the shared cache, split over both cores
    assert plan["dram"] == (2, 64 << 20)  # 4x the last cache in all
    assert plan["l3@core"] == (1, 8 << 20) and plan["dram@core"] == (1, 64 << 20)  # one core alone
    assert "l2@core" not in plan
    small = {n: b for n, _, b in cal.read_plan([("l1d", 4096, False), ("dram", 0, True)], cores=1)}
    assert small == {"dram": cal.DRAM_MIN_BYTES}  # a level under a page is not probed; one core: no @core


def test_the_key_changes_with_the_machine() -> None:
    levels = [("l1d", 32768, False)]
    base = cal.host_key("AMD EPYC", "znver4", "+avx512f", 2, levels)
    assert base == cal.host_key("AMD EPYC", "znver4", "+avx512f", 2, levels)
    assert len({base, cal.host_key("AMD EPYC", "znver4", "+avx512f", 4, levels),
                cal.host_key("AMD EPYC", "znver4", "-avx512f", 2, levels),
                cal.host_key("Xeon", "sapphirerapids", "+avx512f", 2, levels),
                cal.host_key("AMD EPYC", "znver4", "+avx512f", 2, [("l1d", 49152, False)])}) == 5


@pytest.fixture
def host_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PBSDK_HOST_DIR", str(tmp_path))
    monkeypatch.delenv("PBSDK_CALIBRATE", raising=False)
    return tmp_path


def test_measured_once_then_read_from_the_cache(host_dir) -> None:
    runs: list[int] = []

    def run() -> cal.Timings:
        runs.append(1)
        return _timings()

    first = cal.calibration("k1", run)
    assert first is not None and runs == [1] and first.seconds >= 0
    assert cal.calibration("k1", run) == first and runs == [1]  # cached
    assert json.loads((host_dir / "k1.json").read_text())["version"] == cal.PROBE_VERSION
    assert cal.calibration("k1", run, force=True) is not None and runs == [1, 1]  # pbsdk spec calibrate
    assert cal.calibration("k2", run) is not None and runs == [1, 1, 1]  # another machine


@pytest.mark.parametrize("damage", ["{not json", json.dumps({"version": -1}), json.dumps({"version": cal.PROBE_VERSION}),
                                    json.dumps({"version": cal.PROBE_VERSION, "clock_ghz": 900.0, "fma_per_cycle": {},
                                                "unit_per_cycle": {}, "bandwidth_gbps": {}, "seconds": 0})])
def test_a_damaged_or_stale_entry_is_measured_again(host_dir, damage: str) -> None:
    (host_dir / "k.json").write_text(damage)
    got = cal.calibration("k", _timings)
    assert got is not None and got.clock_ghz == pytest.approx(3.5, abs=1e-3)
    assert cal.Calibration.from_json(json.loads((host_dir / "k.json").read_text())) == got


def test_off_or_failing_calibration_keeps_the_estimates(host_dir, monkeypatch, caplog) -> None:
    def broken() -> cal.Timings:
        raise RuntimeError("no JIT here")

    with caplog.at_level(logging.WARNING, logger="pbsdk.calibrate"):
        assert cal.calibration("k", broken) is None
    assert "host calibration failed (RuntimeError: no JIT here)" in caplog.text
    monkeypatch.setenv("PBSDK_CALIBRATE", "0")
    assert cal.calibration("k", lambda: pytest.fail("measured although PBSDK_CALIBRATE=0")) is None


def test_measured_figures_replace_the_estimates_and_say_so(monkeypatch) -> None:
    c = cal.Calibration(clock_ghz=3.7, fma_per_cycle={512: 0.99, 256: 2.0}, unit_per_cycle={"vpdpbusd": 1.01},
                        bandwidth_gbps={"l1d": 230.0, "l2": 118.0, "dram": 27.0, "dram@core": 24.0}, seconds=0.5,
                        fma_latency=4.02)
    monkeypatch.setattr(host_mod, "_llvm_host", lambda: ("znver4", "+avx512f", {"avx512f": True, "fma": True,
                                                                                  "avx512vnni": True},
                                                         "x86_64-unknown-linux-gnu"))
    monkeypatch.setattr(host_mod, "_core_count", lambda: 2)
    monkeypatch.setattr(host_mod.cal, "calibration", lambda key, run, force=False: c)
    data = host_mod.host_spec_data()
    spec = validate_data(data, source="host")
    assert spec.clock_ghz == 3.7 and spec.vector.fma_per_cycle == 1 and spec.vector.width_bits == 512
    assert spec.vector.loads_per_cycle == 1  # 230 GB/s / 3.7 GHz = 62 B a cycle: one 64-byte load
    assert spec.memory_level("l1d").bandwidth_gbps == 230.0 and spec.main_memory.bandwidth_gbps == 27.0
    assert spec.main_memory.core_bandwidth_gbps == 24.0 and spec.memory_level("l2").core_bandwidth_gbps is None
    assert spec.main_memory.shared_bandwidth(1) == 24.0 and spec.main_memory.shared_bandwidth(2) == 27.0
    (unit,) = [u for u in spec.matrix_units if u.name == "vpdpbusd"]
    assert unit.per_cycle == 1.01
    assert spec.peak_tflops["f32"] == pytest.approx(2 * 3.7 * 16 * 1 * 2 / 1000, rel=1e-3)
    assert spec.peak_tflops["i8"] == pytest.approx(2 * 3.7 * 1.01 * 2 * 16 * 4 / 1000, rel=1e-3)
    prov = spec.provenance
    assert prov["clock_ghz"].startswith("measured") and prov["vector.fma_per_cycle"].startswith("measured 0.99")
    assert prov["memory.l2.bandwidth_gbps"] == "measured (one core reading)"
    assert spec.vector.fma_latency == 4 and prov["vector.fma_latency"].startswith("measured 4.02")
    assert prov["matrix_units.vpdpbusd.per_cycle"] == "measured"
    assert prov["memory.l1d.size_bytes"] in ("sysfs", "default")


def test_without_calibration_the_estimates_are_labelled(monkeypatch) -> None:
    monkeypatch.setenv("PBSDK_CALIBRATE", "0")
    spec = validate_data(host_mod.host_spec_data(), source="host")
    assert not any(v.startswith("measured") for v in spec.provenance.values())
    assert spec.provenance["vector.fma_per_cycle"].startswith("estimate")
    assert spec.provenance["clock_ghz"].startswith("/proc/cpuinfo")
    if spec.vector is not None and spec.vector.fma:
        assert spec.vector.fma_latency == host_mod.FMA_LATENCY_ESTIMATE
        assert spec.provenance["vector.fma_latency"].startswith("estimate")
