"""Chip specs: models, validation, loading, presets, host detection. Fast; no MLIR."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pydantic
import pytest
import yaml

from pbsdk.core.errors import PbsdkError, SpecError
from pbsdk.core.spec import (
    ChipSpec,
    ComputeLevel,
    MemoryLevel,
    VectorUnit,
    detect_host,
    dtype_bits,
    get_preset,
    list_presets,
    load_spec,
    spec_json_schema,
)
from pbsdk.core.spec import loader as spec_loader

DATA = Path(__file__).parent / "data" / "specs"
EXPECTED_PRESETS = {"nvidia/a100", "nvidia/h100", "nvidia/h200", "intel/xeon-avx512", "example/npu", "amd/zen3"}


def _npu_data() -> dict:
    return yaml.safe_load(list_presets()["example/npu"].read_text())


def _write(tmp_path: Path, data: dict | str, name: str = "chip.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data, sort_keys=False))
    return path


def _err(source) -> SpecError:
    with pytest.raises(SpecError) as info:
        load_spec(source)
    return info.value


# --------------------------------------------------------------------------- presets


def test_expected_presets_exist():
    assert EXPECTED_PRESETS <= set(list_presets())
    assert "host" not in list_presets()


@pytest.mark.parametrize("name", sorted(EXPECTED_PRESETS))
def test_every_preset_loads(name):
    spec = get_preset(name)
    assert isinstance(spec, ChipSpec)
    assert spec.name == name
    assert load_spec(name) is spec  # cached
    assert load_spec(list_presets()[name]) == spec  # by path too
    assert spec.main_memory.scope == "device"
    for dt in spec.peak_tflops:
        assert spec.supports(dt)


def test_all_preset_files_validate():
    for name, path in list_presets().items():
        assert load_spec(path).name == name


@pytest.mark.parametrize(
    "alias,name",
    [
        ("a100", "nvidia/a100"),
        ("sm_80", "nvidia/a100"),
        ("h100", "nvidia/h100"),
        ("sm_90", "nvidia/h100"),
        ("h200", "nvidia/h200"),
        ("avx512", "intel/xeon-avx512"),
        ("x86-avx512", "intel/xeon-avx512"),
        ("npu", "example/npu"),
    ],
)
def test_aliases_resolve(alias, name):
    assert get_preset(alias).name == name
    assert load_spec(alias) is get_preset(name)


def test_unknown_preset_lists_known_names():
    with pytest.raises(SpecError) as info:
        get_preset("nosuchchip")
    assert "nvidia/h100" in str(info.value) and "host" in str(info.value)
    err = _err("nosuchchip")
    assert "nosuchchip" in str(err) and "nvidia/a100" in str(err)


def test_gpu_preset_facts():
    a100, h100, h200 = get_preset("a100"), get_preset("h100"), get_preset("h200")
    assert a100.compute_level("sm").count == 108 and h100.compute_level("sm").count == 132
    assert [c.name for c in h100.compute] == ["sm", "warpgroup", "warp", "thread"]
    assert h100.total_units("warp") == 132 * 64
    assert a100.total_units("thread") == 108 * 64 * 32
    assert h100.memory_level("smem").max_size_bytes == 232448
    assert a100.memory_level("smem").max_size_bytes == 166912
    assert h100.memory_level("l2").size_bytes == 50 * 2**20
    assert h200.memory_level("hbm").bandwidth_gbps == 4800
    assert [m.name for m in h100.scratchpads()] == ["smem"]
    assert [m.name for m in h100.caches()] == ["l2"]
    assert h100.matrix_units_for("f16")[0].scope == "warpgroup"
    assert a100.matrix_units_for("f16")[0].name == "mma.sync.m16n8k16"
    assert a100.matrix_units_for("f8e4m3") == [] and not a100.supports("f8e4m3")
    assert h100.codegen["arch"] == "sm_90" and a100.codegen["arch"] == "sm_80"
    assert h100.vector is None
    assert h100.instances("smem") == 132 and h100.instances("hbm") == 1


def test_cpu_and_npu_preset_facts():
    xeon, npu = get_preset("avx512"), get_preset("npu")
    assert xeon.kind == "cpu" and xeon.vector is not None and xeon.vector.lanes("f32") == 16
    assert xeon.vector.lanes("f64") == 8 and xeon.vector.registers == 32 and xeon.vector.fma
    assert [m.name for m in xeon.memory] == ["dram", "l3", "l2", "l1d"]
    assert xeon.scratchpads() == [] and len(xeon.caches()) == 3
    assert {"triple", "cpu", "features"} <= set(xeon.codegen)
    assert npu.kind == "accelerator"
    assert [m.name for m in npu.scratchpads()] == ["sram", "spm"]
    assert npu.matrix_units_for("bf16")[0].m == 32
    assert npu.vector.lanes("bf16") == 32


def test_dtype_bits():
    assert dtype_bits("f32") == 32 and dtype_bits("bf16") == 16 and dtype_bits("tf32") == 32
    assert dtype_bits("i4") == 4 and dtype_bits("i1") == 1 and dtype_bits("f8e4m3") == 8
    with pytest.raises(SpecError):
        dtype_bits("f12")


# --------------------------------------------------------------------------- host


def test_host_detection_validates():
    host = detect_host()
    assert isinstance(host, ChipSpec) and host.kind == "cpu" and host.name == "host"
    assert load_spec("host") is host and get_preset("host") is host
    assert host.compute[0].count == (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    )
    assert host.vector is not None and host.vector.width_bits >= 128
    assert {"triple", "cpu", "features"} <= set(host.codegen)
    assert host.peak_tflops["f32"] > 0
    # round-trips through the loader like any other spec
    assert spec_loader.validate_data(host.model_dump(mode="json")) == host


def test_host_without_sys_caches(monkeypatch, tmp_path):
    from pbsdk.core.spec import host as host_mod

    monkeypatch.setattr(host_mod, "_SYS_CACHE", tmp_path / "nope")
    monkeypatch.setattr(host_mod, "_PROC_CPUINFO", tmp_path / "nope" / "cpuinfo")
    spec = spec_loader.validate_data(host_mod.host_spec_data(), "host")
    assert [m.name for m in spec.memory] == ["dram", "l3", "l2", "l1d"]
    assert spec.clock_ghz > 0


def test_host_cache_defaults_when_absent(tmp_path):
    from pbsdk.core.spec import host as host_mod

    caches = host_mod._read_caches(tmp_path / "missing")
    assert [c[0] for c in caches] == [3, 2, 1]


def test_host_cache_parsing(tmp_path):
    from pbsdk.core.spec import host as host_mod

    for i, (level, typ, size, shared, ways) in enumerate(
        [
            (1, "Data", "48K", "0", "12"),
            (1, "Instruction", "32K", "0", "8"),
            (2, "Unified", "2048K", "0", None),
            (3, "Unified", "1M", "0-511", "0"),
        ]
    ):
        d = tmp_path / f"index{i}"
        d.mkdir()
        for key, val in {
            "level": level, "type": typ, "size": size, "shared_cpu_list": shared, "coherency_line_size": 64,
            "ways_of_associativity": ways,
        }.items():
            if val is not None:
                (d / key).write_text(f"{val}\n")
    caches = host_mod._read_caches(tmp_path)
    # the associativity where sysfs has it (0, "fully associative", says nothing of sets: unknown)
    assert (1, 48 * 1024, False, 64, 12) in caches and (2, 2 * 2**20, False, 64, None) in caches
    assert all(c[4] is None for c in caches if c[0] == 3)
    assert all(c[0] != 1 or c[1] == 48 * 1024 for c in caches)  # the instruction cache is skipped
    assert len(caches) == 3


# --------------------------------------------------------------------------- models


def test_models_are_frozen():
    spec = get_preset("npu")
    with pytest.raises(pydantic.ValidationError):
        spec.name = "other"  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        spec.memory[0].size_bytes = 1  # type: ignore[misc]
    with pytest.raises(pydantic.ValidationError):
        spec.compute[0].count = 3  # type: ignore[misc]
    assert hash(spec) == hash(get_preset("npu"))


def test_direct_construction_errors_are_spec_errors():
    with pytest.raises(pydantic.ValidationError):
        ComputeLevel(name="core", count=0)
    with pytest.raises(pydantic.ValidationError):
        VectorUnit(width_bits=48, dtypes=["f32"], registers=16, fma=True)
    with pytest.raises(pydantic.ValidationError):
        MemoryLevel(
            name="x",
            scope="device",
            size_bytes=1024,
            max_size_bytes=512,
            bandwidth_gbps=1,
            managed="software",
        )
    data = _npu_data()
    data["memory"][2]["scope"] = "cluster"
    with pytest.raises(SpecError) as info:
        ChipSpec.model_validate(data)
    assert info.value.field == "memory[2].scope"


def test_total_units_and_lookup_errors():
    npu = get_preset("npu")
    assert npu.total_units("device") == 1 and npu.total_units("core") == 4 and npu.total_units("lane") == 64
    with pytest.raises(SpecError):
        npu.compute_level("sm")
    with pytest.raises(SpecError):
        npu.memory_level("smem")
    with pytest.raises(SpecError):
        npu.total_units("sm")


# --------------------------------------------------------------------------- good and bad files


def test_good_file_loads(tmp_path):
    path = _write(tmp_path, _npu_data() | {"name": "acme/chip", "aliases": ["acme"]})
    spec = load_spec(path)
    assert spec.name == "acme/chip"
    assert load_spec(str(path)) == spec


def test_good_data_file():
    spec = load_spec(DATA / "good_minimal.yaml")
    assert spec.name == "test/minimal" and spec.matrix_units == [] and spec.vector is None


@pytest.mark.parametrize(
    "mutate,field,words",
    [
        (lambda d: d.update(frequency=1), "frequency", "Extra inputs are not permitted"),
        (lambda d: d["memory"][1].update(size_bytes="lots"), "memory[1].size_bytes", "valid integer"),
        (lambda d: d["memory"][1].update(size_bytes=-4), "memory[1].size_bytes", "greater than 0"),
        (lambda d: d["memory"][2].update(size_bytes=8 * 2**20), "memory[2].size_bytes", "larger than"),
        (lambda d: d["memory"][2].update(scope="cluster"), "memory[2].scope", "unknown scope"),
        (
            lambda d: d["matrix_units"][0].update(operand_dtype="f64"),
            "matrix_units[0].operand_dtype",
            "not in the chip's dtypes",
        ),
        (
            lambda d: d["matrix_units"][0].update(scope="warp"),
            "matrix_units[0].scope",
            "unknown compute level",
        ),
        (lambda d: d["vector"].update(dtypes=["f32", "f64"]), "vector.dtypes[1]", "not in the chip's dtypes"),
        (lambda d: d["peak_tflops"].update(f64=1.0), "peak_tflops.f64", "not in the chip's dtypes"),
        (lambda d: d.update(aliases=["example/npu"]), "aliases[0]", "canonical name"),
        (lambda d: d["memory"][0].update(size_bytes=2**51), "memory[0].size_bytes", "less than or equal"),
        (lambda d: d["compute"][0].update(count=2**21), "compute[0].count", "less than or equal"),
        (lambda d: d["memory"][2].update(alignment_bytes=48), "memory[2].alignment_bytes", "power of two"),
        (lambda d: d["memory"][2].update(max_size_bytes=1024), "memory[2].max_size_bytes", "smaller than"),
        (lambda d: d["compute"].append({"name": "core", "count": 2}), "compute[2].name", "duplicate"),
        (lambda d: d["memory"][2].update(name="sram"), "memory[2].name", "duplicate"),
        (lambda d: d["memory"].insert(1, d["memory"].pop(2)), "memory[2].scope", "outer"),
        (lambda d: d.update(kind="fpga"), "kind", "Input should be"),
        (lambda d: d.update(dtypes=["f32", "f17"]), "dtypes[1]", "Input should be"),
        (lambda d: d.pop("vendor"), "vendor", "Field required"),
    ],
)
def test_bad_file_names_file_and_field(tmp_path, mutate, field, words):
    data = _npu_data()
    mutate(data)
    path = _write(tmp_path, data, "bad.yaml")
    err = _err(path)
    assert err.source == str(path)
    assert err.field == field, str(err)
    assert f"{path}: {field}: " in str(err), str(err)
    assert words in str(err), str(err)
    assert isinstance(err, PbsdkError)


def test_multiple_errors_one_per_line(tmp_path):
    data = _npu_data()
    data["memory"][1]["size_bytes"] = 0
    data["compute"][0]["count"] = -1
    path = _write(tmp_path, data)
    lines = str(_err(path)).splitlines()
    assert len(lines) == 2
    assert all(line.startswith(f"{path}: ") for line in lines)
    assert {line.split(": ")[1] for line in lines} == {"compute[0].count", "memory[1].size_bytes"}


def test_data_file_inner_larger_than_outer():
    path = DATA / "bad_inner_larger.yaml"
    err = _err(path)
    assert str(err).startswith(f"{path}: memory[2].size_bytes: ")


def test_python_tag_rejected_without_executing(tmp_path):
    marker = tmp_path / "pwned"
    text = f"!!python/object/apply:os.system ['touch {marker}']\n"
    err = _err(_write(tmp_path, text))
    assert "python/object/apply" in str(err)
    assert not marker.exists()
    nested = f"name: x\nvendor: !!python/object/apply:os.system ['touch {marker}']\n"
    _err(_write(tmp_path, nested, "nested.yaml"))
    assert not marker.exists()


def test_deeply_nested_yaml_rejected(tmp_path):
    err = _err(_write(tmp_path, "a: " + "[" * 50_000 + "]" * 50_000 + "\n"))
    assert "nested" in str(err) or "deep" in str(err)
    err = _err(_write(tmp_path, "a: " + "[" * 100 + "]" * 100 + "\n", "mid.yaml"))
    assert "nested" in str(err)


def test_alias_bomb_rejected(tmp_path):
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 9):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    err = _err(_write(tmp_path, "\n".join(lines) + "\n"))
    assert "nodes" in str(err)


def test_huge_file_rejected(tmp_path):
    path = _write(tmp_path, "# " + "x" * (1 << 20) + "\nname: a\n")
    assert "bytes" in str(_err(path))


@pytest.mark.parametrize("text", ["- a\n- b\n", "42\n", "just a string\n", ""])
def test_non_mapping_top_level(tmp_path, text):
    err = _err(_write(tmp_path, text))
    assert "mapping" in str(err)


def test_invalid_yaml_and_duplicate_keys(tmp_path):
    assert "invalid YAML" in str(_err(_write(tmp_path, "name: [unclosed\n")))
    assert "duplicate key" in str(_err(_write(tmp_path, "name: a\nname: b\n", "dup.yaml")))


def test_missing_file(tmp_path):
    path = tmp_path / "nope.yaml"
    err = _err(path)
    assert str(path) in str(err) and err.source == str(path)
    err = _err(str(path))
    assert "no such" in str(err)


def test_chipspec_passes_through_and_wrong_type():
    npu = get_preset("npu")
    assert load_spec(npu) is npu
    with pytest.raises(SpecError):
        load_spec(42)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- preset directory


def test_duplicate_preset_names(monkeypatch, tmp_path):
    data = _npu_data()
    _write(tmp_path, data, "one.yaml")
    (tmp_path / "sub").mkdir()
    _write(tmp_path / "sub", data | {"aliases": ["other"]}, "two.yaml")
    monkeypatch.setattr(spec_loader, "preset_dir", lambda: tmp_path)
    with pytest.raises(SpecError) as info:
        list_presets()
    msg = str(info.value)
    assert "one.yaml" in msg and "two.yaml" in msg


def test_duplicate_preset_alias(monkeypatch, tmp_path):
    data = _npu_data()
    _write(tmp_path, data, "one.yaml")
    _write(tmp_path, data | {"name": "acme/other", "aliases": ["npu"]}, "two.yaml")
    monkeypatch.setattr(spec_loader, "preset_dir", lambda: tmp_path)
    with pytest.raises(SpecError) as info:
        get_preset("npu")
    assert "one.yaml" in str(info.value) and "two.yaml" in str(info.value)


def test_preset_cannot_claim_host(monkeypatch, tmp_path):
    _write(tmp_path, _npu_data() | {"aliases": ["host"]})
    monkeypatch.setattr(spec_loader, "preset_dir", lambda: tmp_path)
    with pytest.raises(SpecError, match="reserved"):
        list_presets()


def test_custom_preset_dir(monkeypatch, tmp_path):
    _write(tmp_path, _npu_data() | {"name": "acme/x1", "aliases": ["x1"]}, "x1.yaml")
    monkeypatch.setattr(spec_loader, "preset_dir", lambda: tmp_path)
    assert set(list_presets()) == {"acme/x1"}
    assert get_preset("x1").name == "acme/x1"


def test_broken_preset_dir_does_not_block_explicit_file(monkeypatch, tmp_path):
    (tmp_path / "presets").mkdir()
    _write(tmp_path / "presets", "name: [broken\n", "broken.yaml")
    good = _write(tmp_path, _npu_data(), "good.yaml")
    monkeypatch.setattr(spec_loader, "preset_dir", lambda: tmp_path / "presets")
    assert load_spec(str(good)).name == "example/npu"


# --------------------------------------------------------------------------- schema


def test_json_schema():
    schema = spec_json_schema()
    text = json.dumps(schema)
    assert json.loads(text) == schema
    assert {"memory", "matrix_units", "compute", "codegen", "peak_tflops"} <= set(schema["properties"])
    assert "MemoryLevel" in schema.get("$defs", {})
    for field in ChipSpec.model_fields.values():
        assert field.description


def test_generated_docs_are_current():
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    script = root / "scripts" / "gen_spec_docs.py"
    if not script.exists():
        pytest.skip("docs generator not present")
    proc = subprocess.run(
        [sys.executable, str(script), "--check"], check=False, capture_output=True, text=True, cwd=root
    )
    assert proc.returncode == 0, proc.stderr
