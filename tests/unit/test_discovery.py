"""Target discovery through real importlib.metadata entry points: built-ins, a third-party plugin, a
broken plugin, clashes, contract violations."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import pbsdk
from pbsdk.core import target as target_mod
from pbsdk.core.errors import TargetError

PLUGINS = Path(__file__).parent.parent / "plugins"


def _dist(root: Path, name: str, entry_points: dict[str, str]) -> None:
    """Write an installed-distribution record (what pip leaves in site-packages) into ``root``."""
    info = root / f"{name.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1.0\n")
    lines = ["[pbsdk.targets]"] + [f"{k} = {v}" for k, v in entry_points.items()]
    (info / "entry_points.txt").write_text("\n".join(lines) + "\n")


@pytest.fixture(autouse=True)
def _fresh_cache():
    target_mod._cache.clear()
    yield
    target_mod._cache.clear()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def _by_name() -> dict[str, target_mod.TargetInfo]:
    return {i.name: i for i in target_mod.discover()}


def test_builtins_are_discovered_through_entry_points() -> None:
    infos = _by_name()
    for name in ("cpu", "nvgpu", "template"):
        assert name in infos and infos[name].cls is not None, infos.get(name)
    assert infos["cpu"].cls.implemented
    assert infos["cpu"].value == "pbsdk.targets.cpu:CpuTarget"


def test_third_party_plugin_is_discovered_and_runs(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS / "sample_target"))
    _dist(site, "pbsdk-sample-target", {"sample": "pbsdk_sample_target:SampleTarget"})
    info = _by_name()["sample"]
    assert info.cls is not None and info.distribution == "pbsdk-sample-target"
    assert pbsdk.core.target.get_target("sample").name == "sample"
    f = pbsdk.jit(lambda a, b: a @ b + 1.0, target="sample")
    a, b = np.ones((3, 4), np.float32), np.ones((4, 2), np.float32)
    np.testing.assert_array_equal(f(a, b), np.full((3, 2), 5.0, np.float32))


def test_broken_plugin_is_reported_and_skipped(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS / "broken_target"))
    _dist(site, "pbsdk-broken-target", {"broken": "pbsdk_broken_target:BrokenTarget"})
    infos = _by_name()
    assert infos["broken"].cls is None
    assert "ImportError" in infos["broken"].error and "vendor SDK" in infos["broken"].error
    assert infos["cpu"].cls is not None  # the others still load
    with pytest.raises(TargetError, match="cannot be used: import failed"):
        target_mod.get_target("broken")


def test_name_clash_is_an_error(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(PLUGINS / "sample_target"))
    _dist(site, "pbsdk-sample-target", {"sample": "pbsdk_sample_target:SampleTarget"})
    _dist(site, "other-vendor", {"sample": "pbsdk.targets.cpu:CpuTarget"})
    info = _by_name()["sample"]
    assert info.cls is None and "name clash" in info.error
    with pytest.raises(TargetError) as err:
        target_mod.get_target("sample")
    assert "pbsdk_sample_target:SampleTarget" in str(err.value) and "pbsdk.targets.cpu:CpuTarget" in str(err.value)


def test_contract_violations_are_reported(site: Path) -> None:
    (site / "pbsdk_bad_plugins.py").write_text(textwrap.dedent("""
        from pbsdk.targets.cpu import CpuTarget

        class Renamed(CpuTarget):
            name = "something-else"

        class OldApi(CpuTarget):
            name = "oldapi"
            api_version = 0

        NOT_A_TARGET = object()
    """))
    _dist(site, "pbsdk-bad-plugins", {"renamed": "pbsdk_bad_plugins:Renamed", "oldapi": "pbsdk_bad_plugins:OldApi",
                                      "notatarget": "pbsdk_bad_plugins:NOT_A_TARGET"})
    infos = _by_name()
    assert "whose name is 'something-else'" in infos["renamed"].error
    assert "written for target API 0" in infos["oldapi"].error
    assert "not a pbsdk Target subclass" in infos["notatarget"].error
    sys.modules.pop("pbsdk_bad_plugins", None)


def test_unknown_target_lists_known_ones() -> None:
    with pytest.raises(TargetError, match=r"unknown target 'nope' \(installed targets: .*cpu.*nvgpu.*template"):
        target_mod.get_target("nope")


@pytest.mark.parametrize("name", ["nvgpu", "template"])
def test_planned_targets_refuse_to_compile_clearly(name: str) -> None:
    with pytest.raises(TargetError, match=f"target '{name}' is registered but"):
        pbsdk.jit(lambda a: a + 1.0, target=name)


def test_cli_targets_lists_broken_plugins(site: Path, monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    from pbsdk.cli import main

    monkeypatch.syspath_prepend(str(PLUGINS / "broken_target"))
    _dist(site, "pbsdk-broken-target", {"broken": "pbsdk_broken_target:BrokenTarget"})
    assert main(["targets"]) == 0
    out = capsys.readouterr().out
    assert "cpu" in out and "ready" in out and "nvgpu" in out and "planned" in out
    assert "broken" in out and "BROKEN" in out and "vendor SDK" in out
    assert main(["targets", "--strict"]) == 1


def test_sample_plugin_builds_as_a_wheel(tmp_path: Path) -> None:
    """The sample plugin is a real installable package: its wheel carries the entry point."""
    import subprocess
    import zipfile

    result = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path),
                             str(PLUGINS / "sample_target")], capture_output=True, text=True, timeout=300)
    if result.returncode != 0 and "No matching distribution" in result.stderr:
        pytest.skip("setuptools not available to the build backend offline")
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = tmp_path.glob("pbsdk_sample_target-*.whl")
    with zipfile.ZipFile(wheel) as z:
        ep = next(n for n in z.namelist() if n.endswith("entry_points.txt"))
        assert "[pbsdk.targets]" in z.read(ep).decode() and "sample = pbsdk_sample_target:SampleTarget" in z.read(ep).decode()
