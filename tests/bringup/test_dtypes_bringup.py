"""Issue 16's "done when" for dtypes: targets scaffolded by ``pbsdk new-target`` from two specs other than the
example NPU run bf16 and i8 conformance cases — no dtype the spec lists is skipped — and all pass, the
matrix unit of each of those dtypes used (the resource check)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bringup_helpers import DATA

from pbsdk.core.spec import load_spec
from pbsdk.targets.template.newtarget import new_target

SPECS = {"tinynpu": DATA / "tiny_npu.yaml", "int8npu": DATA / "int8_npu.yaml"}


def _install(src: Path, site: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--no-index", "--target", str(site), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


@pytest.mark.parametrize("name", list(SPECS))
def test_scaffolded_target_runs_every_listed_dtype(name: str, tmp_path: Path) -> None:
    spec = load_spec(SPECS[name])
    site = tmp_path / "site"
    done = new_target(name, SPECS[name], tmp_path / name)
    _install(done.out, site)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-m", "pbsdk.cli", "conform", "--target", name, "--ops",
                           "matmul,quantized_linear", "--report", str(report)],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads(report.read_text())
    cases = data["cases"]
    assert data["failed"] == 0 and data["errors"] == 0
    ran = {c["name"].split("/")[1] for c in cases if c["status"] == "pass"}
    listed = {d for d in spec.dtypes if d in ("f64", "f32", "f16", "bf16", "i8")}
    if {"i8", "i32"} <= set(spec.dtypes):  # the matmul family's i32 case: an i8 contraction's result in i32 ops
        listed.add("i32")
    assert ran == listed, (ran, listed)
    for unit in spec.matrix_units:
        used = [c for c in cases if c["status"] == "pass" and c["name"].split("/")[1] == unit.operand_dtype
                and ((c["resources"] or {}).get("matrix_unit_ops") or {}).get(unit.name, 0) > 0]
        assert used, f"no {unit.operand_dtype} case used {unit.name}"
    if "i8" in listed:  # integer cases are compared bit for bit
        i8 = [c for c in cases if "/i8/" in c["name"]]
        assert i8 and all(c["atol"] == 0.0 and c["max_abs_error"] == 0.0 for c in i8)
