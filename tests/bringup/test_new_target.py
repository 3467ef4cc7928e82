"""``pbsdk new-target``: name and spec validation, overwrite rules, and the whole flow — scaffold,
pip-install, conformance — on two different specs with no edits."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from bringup_helpers import TINY_SPEC

from pbsdk.cli import main
from pbsdk.core.errors import PbsdkError
from pbsdk.core.target import TargetInfo
from pbsdk.targets.template.newtarget import check_name, new_target

NPU_SPEC = Path(__file__).resolve().parents[2] / "chip_specs" / "example" / "npu.yaml"


@pytest.mark.parametrize("bad", ["../x", "x/../y", 'a"b', "a'b", "a b", "a-b", "a.b", "A", "Mynpu", "1npu", "_npu", "",
                                 "x" * 41, "class", "import", "match", "cpu", "template", "nvgpu", "npu\n",
                                 "npu; rm -rf /", "npu=evil:Target", "é"])
def test_bad_names_are_refused_with_exit_2_and_no_traceback(bad: str, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "out"
    assert main(["new-target", bad, "--spec", str(NPU_SPEC), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pbsdk: error: ") and "Traceback" not in err
    assert not out.exists()  # nothing written


def test_the_name_of_an_installed_target_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import pbsdk.core.target as target_mod

    monkeypatch.setattr(target_mod, "discover", lambda **_: [TargetInfo("acme", "acme:T", "acme", None, None)])
    with pytest.raises(PbsdkError, match="already installed"):
        check_name("acme")
    check_name("acme2")


def test_the_spec_is_validated_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(NPU_SPEC.read_text().replace("size_bytes: 262144", "size_bytes: 9999999999"))  # spm > sram
    out = tmp_path / "out"
    assert main(["new-target", "mynpu", "--spec", str(bad), "--out", str(out)]) == 2
    assert "size_bytes" in capsys.readouterr().err and not out.exists()
    assert main(["new-target", "mynpu", "--spec", str(tmp_path / "missing.yaml"), "--out", str(out)]) == 2
    gpu = Path(NPU_SPEC).parents[1] / "nvidia" / "h100.yaml"
    assert main(["new-target", "mynpu", "--spec", str(gpu), "--out", str(out)]) == 2  # nothing to emulate
    assert not out.exists()


def test_an_existing_directory_needs_force(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "plugin"
    assert main(["new-target", "mynpu", "--spec", str(NPU_SPEC), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"pip install -e {out}" in printed and "pbsdk conform --target mynpu" in printed
    hooks = out / "pbsdk_mynpu" / "hooks.py"
    hooks.write_text("# my edits\n")
    (out / "notes.txt").write_text("mine")
    assert main(["new-target", "mynpu", "--spec", str(NPU_SPEC), "--out", str(out)]) == 2
    assert "--force" in capsys.readouterr().err and hooks.read_text() == "# my edits\n"
    assert main(["new-target", "mynpu", "--spec", str(NPU_SPEC), "--out", str(out), "--force"]) == 0
    assert "def matrix_unit_op" in hooks.read_text() and (out / "notes.txt").read_text() == "mine"
    a_file = tmp_path / "file"
    a_file.write_text("x")
    assert main(["new-target", "mynpu", "--spec", str(NPU_SPEC), "--out", str(a_file), "--force"]) == 2


def test_rendered_files(tmp_path: Path) -> None:
    done = new_target("my_npu2", TINY_SPEC, tmp_path / "p")
    rel = sorted(str(f.relative_to(done.out)) for f in done.files)
    assert rel == ["README.md", "pbsdk_my_npu2/__init__.py", "pbsdk_my_npu2/hooks.py", "pbsdk_my_npu2/spec.yaml",
                   "pyproject.toml", "tests/test_conformance.py"]
    pyproject = (done.out / "pyproject.toml").read_text()
    assert 'my_npu2 = "pbsdk_my_npu2:MyNpu2Target"' in pyproject and 'name = "pbsdk-my-npu2"' in pyproject
    assert (done.out / "pbsdk_my_npu2" / "spec.yaml").read_text() == TINY_SPEC.read_text()
    hooks = (done.out / "pbsdk_my_npu2" / "hooks.py").read_text()
    for hook in ("matrix_unit_op", "vector_tile_op", "scratchpad_alloc", "dma_copy", "parallel_loop", "vector_ops",
                 "final_emission"):
        assert f"def {hook}(" in hooks
    for f in done.files:
        if f.suffix == ".py":
            compile(f.read_text(), str(f), "exec")


def _install(src: Path, site: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--no-index", "--target", str(site), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _pbsdk(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "pbsdk.cli", *args], capture_output=True, text=True, timeout=600,
                          env=env, check=False)


def test_scaffold_install_and_conform(tmp_path: Path) -> None:
    """The issue's 'done when': new-target, pip install, conform passes every case; no edits."""
    t0 = time.perf_counter()
    site = tmp_path / "site"
    done = new_target("mynpu", NPU_SPEC, tmp_path / "mynpu")
    _install(done.out, site)
    listed = _pbsdk(site, "targets")
    assert any(ln.startswith("mynpu") and "ready" in ln for ln in listed.stdout.splitlines()), listed.stdout
    report = tmp_path / "report.json"
    proc = _pbsdk(site, "conform", "--target", "mynpu", "--report", str(report))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    import json

    data = json.loads(report.read_text())
    assert data["failed"] == 0 and data["errors"] == 0 and data["passed"] >= 50
    assert all(c["resource_check"] == "ok" for c in data["cases"] if c["status"] == "pass")
    print(f"scaffold+install+conform: {time.perf_counter() - t0:.1f} s, {data['passed']} passed")


def test_a_second_spec_works_with_no_edits(tmp_path: Path) -> None:
    site = tmp_path / "site"
    done = new_target("tinynpu", TINY_SPEC, tmp_path / "tinynpu")
    _install(done.out, site)
    proc = _pbsdk(site, "conform", "--target", "tinynpu", "--ops", "matmul,attention,softmax")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "mac8" in proc.stdout and "tcm" in proc.stdout and "fail=0 error=0" in proc.stdout
    # The plugin's own generated tests pass too (a few of them, to stay fast).
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k",
                            "discovered or unit", str(done.out / "tests")], capture_output=True, text=True,
                           timeout=600, env=env, cwd=tmp_path, check=False)
    assert tests.returncode == 0 and " passed" in tests.stdout, tests.stdout[-3000:]
