"""Cache-only chips (issue #36, item 1): `pbsdk new-target` on a spec whose levels besides main memory are
all caches renders a plugin whose vector unit is emulated at the spec's width (the register-tile
micro-kernel, instructions counted per kind), conformance passes with no edits and every case has a
modelled time: on the two example specs and on one made up here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
import yaml

from pbsdk.core.errors import TargetError
from pbsdk.core.plan.packing import is_cache_only, packing_view
from pbsdk.core.spec import ChipSpec, load_spec
from pbsdk.targets.template import TemplateTarget, register_tile
from pbsdk.targets.template.newtarget import new_target

ROOT = Path(__file__).resolve().parents[2]
RVV_EDGE = ROOT / "chip_specs" / "example" / "rvv-edge.yaml"
RVV_MX = ROOT / "chip_specs" / "example" / "rvv-mx.yaml"


def _unseen(path: Path) -> Path:
    """A cache-only spec none of the code was written against: 3 cores, 128-bit vectors, 16 registers,
    three caches of odd sizes, an f16 matrix extension of 4x4x4."""
    spec = {
        "name": "example/unseen-cache", "vendor": "example", "kind": "accelerator", "dtypes": ["f32", "f16", "i32", "i8"],
        "compute": [{"name": "hart", "count": 3}, {"name": "lane", "count": 4}],
        "memory": [
            {"name": "ddr", "scope": "device", "size_bytes": 1 << 30, "bandwidth_gbps": 8, "alignment_bytes": 32,
             "managed": "software"},
            {"name": "llc", "scope": "device", "size_bytes": 393216, "bandwidth_gbps": 40, "alignment_bytes": 32,
             "managed": "cache"},
            {"name": "l2", "scope": "hart", "size_bytes": 98304, "bandwidth_gbps": 60, "alignment_bytes": 32,
             "managed": "cache"},
            {"name": "l1", "scope": "hart", "size_bytes": 12288, "bandwidth_gbps": 90, "alignment_bytes": 32,
             "managed": "cache"}],
        "matrix_units": [{"name": "mx4", "scope": "hart", "m": 4, "n": 4, "k": 4, "operand_dtype": "f16",
                          "accumulator_dtype": "f32"}],
        "vector": {"width_bits": 128, "dtypes": ["f32", "i32", "i8"], "registers": 16, "fma": True},
        "peak_tflops": {"f32": 0.02, "f16": 0.1}, "clock_ghz": 0.8}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def test_packing_view_reads_caches_as_half_sized_packing_levels() -> None:
    spec = load_spec(RVV_EDGE)
    assert is_cache_only(spec) and not spec.scratchpads()
    view = packing_view(spec)
    assert [(m.name, m.managed, m.size_bytes) for m in view.memory] == [
        ("dram", "software", spec.memory[0].size_bytes), ("l2", "software", 524288), ("l1d", "software", 32768)]
    assert view.vector == spec.vector and view.matrix_units == spec.matrix_units
    with pytest.raises(TargetError, match="packing view"):
        packing_view(load_spec("example/npu"))


def test_template_accepts_cache_only_and_still_refuses_gpus() -> None:
    TemplateTarget().check_spec(load_spec(RVV_EDGE))
    with pytest.raises(TargetError, match="gpu"):
        TemplateTarget().check_spec(load_spec("nvidia/h100"))


def test_new_target_renders_the_cache_variant(tmp_path: Path) -> None:
    done = new_target("rvvedge", RVV_EDGE, tmp_path / "rvvedge")
    hooks = (done.out / "pbsdk_rvvedge" / "hooks.py").read_text()
    assert "register_tile.vector_tile_op(op, operands, spec)" in hooks
    for hook in ("matrix_unit_op", "vector_tile_op", "scratchpad_alloc", "dma_copy", "parallel_loop", "vector_ops",
                 "final_emission"):
        assert f"def {hook}(" in hooks
    npu = new_target("npu2", ROOT / "chip_specs" / "example" / "npu.yaml", tmp_path / "npu2")
    assert "register_tile" not in (npu.out / "pbsdk_npu2" / "hooks.py").read_text()  # scratchpad chips unchanged
    for f in done.files:
        if f.suffix == ".py":
            compile(f.read_text(), str(f), "exec")


class _RegisterTileTarget(TemplateTarget):
    name = "register_tile_test"
    hooks: ClassVar[Any] = types.SimpleNamespace(vector_tile_op=register_tile.vector_tile_op)


def test_micro_kernel_at_the_spec_width_counts_every_instruction() -> None:
    """A 14x32x1 f32 matmul on rvv-edge: one 14x2 register tile of 16-lane vectors (the planner's, 30 of
    32 registers): 28 FMAs, 14 broadcasts, 2 B loads and 28 C loads, 28 stores; vector<16xf32> code."""
    import pbsdk

    spec = load_spec(RVV_EDGE)
    a, b = np.random.default_rng(0).standard_normal((2, 14, 32)).astype(np.float32)
    f = pbsdk.jit(lambda x, y: x @ y, target=_RegisterTileTarget(), spec=spec)
    np.testing.assert_allclose(f(a[:, :1], b[:1]), a[:, :1] @ b[:1], rtol=1e-6)
    kernel = f.kernel(f.signatures[0])[0]
    counters = kernel.executable.last_counters
    assert {k: v for k, v in counters.items() if k.startswith("vector_op:")} == {
        "vector_op:fma": 28, "vector_op:broadcast": 14, "vector_op:load": 30, "vector_op:store": 28}
    assert counters["vector:l1d"] == 14 * 32 and counters["bytes:l2->l1d"] > 0
    assert kernel.executable.last_time is not None and kernel.executable.last_time.seconds > 0
    assert "<16 x float>" in kernel.artifact.payload


def test_elementwise_and_reductions_are_vector_loops_at_the_spec_width() -> None:
    """exp(x) * y + x and a sum of rows on 37x53 f32 tiles on rvv-edge: 4 vectors of 16 a row (3 full, one
    masked of 5), every instruction counted, the host runs <16 x float> code, numbers as numpy's."""
    import pbsdk
    from pbsdk import ops

    spec = load_spec(RVV_EDGE)
    x, y = np.random.default_rng(2).standard_normal((2, 37, 53)).astype(np.float32)
    f = pbsdk.jit(lambda a, b: ops.exp(a) * b + a, target=_RegisterTileTarget(), spec=spec)
    np.testing.assert_allclose(f(x, y), np.exp(x) * y + x, rtol=1e-5, atol=1e-6)
    kernel = f.kernel(f.signatures[0])[0]
    ops_counted = {k: v for k, v in kernel.executable.last_counters.items() if k.startswith("vector_op:")}
    steps = 37 * 4
    assert ops_counted == {"vector_op:load": 2 * steps, "vector_op:store": steps, "vector_op:exp": steps,
                           "vector_op:mulf": steps, "vector_op:addf": steps}
    assert "<16 x float>" in kernel.artifact.payload
    g = pbsdk.jit(lambda a: ops.sum(a, axis=-1), target=_RegisterTileTarget(), spec=spec)
    np.testing.assert_allclose(g(x), x.sum(-1), rtol=1e-5, atol=1e-5)
    counted = g.kernel(g.signatures[0])[0].executable.last_counters
    # The fill of the 37 sums (3 stores), then per row 4 loads and adds, one select (the masked rest), one
    # reduction of the accumulator's lanes.
    assert {k: v for k, v in counted.items() if k.startswith("vector_op:")} == {
        "vector_op:store": 3, "vector_op:load": steps, "vector_op:addf": steps, "vector_op:select": 37,
        "vector_op:reduction": 37}


def _vector_width(spec: ChipSpec, bits: int) -> ChipSpec:
    data = spec.model_dump()
    data["vector"]["width_bits"] = bits
    return ChipSpec.model_validate(data)


def test_modelled_time_of_a_compiled_matmul_comes_from_the_instruction_counters() -> None:
    """A 64x64x64 f32 matmul on rvv-edge at 512 and at 256 bits: the compute side is the vector unit's
    per-instruction terms (FMAs at 1 a cycle on 1.5 GHz), not the points; halving the width doubles the FMAs
    (and more, with the padding of the narrower plan) and so the modelled compute time."""
    import pbsdk

    a, b = np.random.default_rng(1).standard_normal((2, 64, 64)).astype(np.float32)
    times = {}
    for bits in (512, 256):
        spec = _vector_width(load_spec(RVV_EDGE), bits)
        f = pbsdk.jit(lambda x, y: x @ y, target=_RegisterTileTarget(), spec=spec)
        np.testing.assert_allclose(f(a, b), a @ b, rtol=1e-4, atol=1e-4)
        ex = f.kernel(f.signatures[0])[0].executable
        t = ex.last_time
        assert t is not None
        terms = dict(t.terms)
        fmas = ex.last_counters["vector_op:fma"]
        # One FMA per vector of C per k step (more where the plan pads a tile: 65 rows at 512 bits).
        assert 64 * 64 * 64 // (bits // 32) <= fmas <= 1.25 * 64 * 64 * 64 // (bits // 32)
        assert not any(name.startswith("vector:") for name in terms)  # the points are not read
        arith = sum(v for k, v in ex.last_counters.items() if k.startswith("vector_op:")
                    and k.split(":")[1] not in ("load", "broadcast", "store"))
        assert terms["vector_op:arith"] == pytest.approx(arith / (1.5e9 * t.cores))
        assert t.compute_seconds == pytest.approx(max(v for k, v in terms.items()
                                                      if k.startswith(("vector_op:", "cache:l1d:vector"))))
        times[bits] = t
    assert times[256].compute_seconds > 1.5 * times[512].compute_seconds


def _install(src: Path, site: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--no-index", "--target", str(site), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _scaffold_and_conform(tmp_path: Path, name: str, spec_file: Path, ops: str | None) -> dict[str, Any]:
    """new-target + pip install + ``pbsdk conform`` (only ``ops`` when given): the JSON report, after
    checking that nothing failed, every case passed its resource check with a modelled time, and every
    dtype of the spec the suite knows was exercised (i32 as operands: every spec here lists it)."""
    site = tmp_path / "site"
    done = new_target(name, spec_file, tmp_path / name)
    _install(done.out, site)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    args = ["conform", "--target", name, "--report", str(report)] + (["--ops", ops] if ops else [])
    proc = subprocess.run([sys.executable, "-m", "pbsdk.cli", *args], capture_output=True, text=True, timeout=900,
                          env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    data = json.loads(report.read_text())
    assert data["failed"] == 0 and data["errors"] == 0 and data["passed"] > 0
    ran = [c for c in data["cases"] if c["status"] == "pass"]
    assert all(c["resource_check"] == "ok" and c["resources"]["modelled"]["seconds"] > 0 for c in ran)
    spec: ChipSpec = load_spec(spec_file)
    wanted = {d for d in spec.dtypes if d.startswith(("f", "b")) or d in ("i8", "i32")}
    assert {c["name"].split("/")[1] for c in ran} == wanted
    return data


@pytest.mark.parametrize(("name", "spec_file", "ops"), [
    ("rvvedge", RVV_EDGE, "matmul"),
    ("rvvmx", RVV_MX, "matmul,softmax"),
])
def test_example_specs_scaffold_install_and_conform(tmp_path: Path, name: str, spec_file: Path, ops: str) -> None:
    t0 = time.perf_counter()
    data = _scaffold_and_conform(tmp_path, name, spec_file, ops)
    counters = [c["resources"]["counters"] for c in data["cases"] if c["status"] == "pass"]
    if spec_file == RVV_MX:  # the matrix extension is the matrix-unit hook's, as on any chip
        assert any(c.get("matrix_unit:mxe", 0) > 0 for c in counters)
    else:
        assert all(c.get("vector_op:fma", 0) > 0 for c in counters)
    print(f"{name}: {data['passed']} passed in {time.perf_counter() - t0:.1f} s")


def test_an_unseen_cache_only_spec_scaffolds_and_conforms(tmp_path: Path) -> None:
    data = _scaffold_and_conform(tmp_path, "unseen", _unseen(tmp_path / "unseen.yaml"), "matmul,layernorm")
    assert any(c["resources"]["counters"].get("matrix_unit:mx4", 0) > 0 for c in data["cases"] if c["status"] == "pass")


@pytest.mark.slow
@pytest.mark.parametrize("which", ["rvv-edge", "rvv-mx", "unseen"])
def test_every_case_conforms(tmp_path: Path, which: str) -> None:
    """The whole generated suite, every family (about 75 cases a spec, a minute each on 2 cores)."""
    spec_file = {"rvv-edge": RVV_EDGE, "rvv-mx": RVV_MX}.get(which) or _unseen(tmp_path / "unseen.yaml")
    _scaffold_and_conform(tmp_path, which.replace("-", ""), spec_file, None)
