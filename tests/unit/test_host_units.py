"""The host's matrix units without IR: detection from CPUID features, their validation in a spec, the plans
of a register tile of a unit's instructions, and which units the cpu target can lower."""

from __future__ import annotations

import pytest

from pbsdk.core.errors import SpecError
from pbsdk.core.plan.contraction import Contraction, plan_contraction, rows_per_set
from pbsdk.core.spec import load_spec, parse_spec
from pbsdk.core.spec.host import host_units, unit_peaks
from pbsdk.core.spec.loader import validate_data

ZEN4 = {"avx512f": True, "avx512bf16": True, "avx512vnni": True, "amx-tile": False}
SPR = {**ZEN4, "amx-tile": True, "amx-bf16": True, "amx-int8": True}


def test_zen4_features_give_the_dot_product_units() -> None:
    units = host_units(ZEN4, 512, 2)
    assert [(u["name"], u["m"], u["n"], u["k"], u["operand_dtype"], u["accumulator_dtype"], u["registers"])
            for u in units] == [("vdpbf16ps", 1, 16, 2, "bf16", "f32", "vector"),
                                ("vpdpbusd", 1, 16, 4, "i8", "i32", "vector")]


def test_amx_comes_first_and_keeps_tile_registers() -> None:
    units = host_units(SPR, 512, 2)
    assert [u["name"] for u in units] == ["tdpbf16ps", "tdpbssd", "vdpbf16ps", "vpdpbusd"]
    amx = units[0]
    assert (amx["m"], amx["n"], amx["k"], amx["registers"], amx["tile_registers"]) == (16, 16, 32, "tile", 8)
    assert units[1]["k"] == 64
    # AMX without the tile feature (the OS did not enable its state) is no unit.
    assert [u["name"] for u in host_units({**SPR, "amx-tile": False}, 512, 2)] == ["vdpbf16ps", "vpdpbusd"]


def test_vnni_keeps_a_quarter_of_the_vector_registers_for_broadcasts() -> None:
    """vpdpbusd's unsigned operand comes only from a register; vdpbf16ps reads its broadcast from memory."""
    assert {u["name"]: u.get("broadcast_registers", 1) for u in host_units(ZEN4, 512, 2)} == {"vdpbf16ps": 1,
                                                                                             "vpdpbusd": 8}
    assert host_units({"avxvnni": True}, 256, 2)[0]["broadcast_registers"] == 4  # 16 ymm registers
    for preset in ("zen4", "intel/xeon-amx"):
        assert {u.name: u.broadcast_registers for u in load_spec(preset).matrix_units}["vpdpbusd"] == 8


def test_avx_vnni_on_256_bit_vectors_and_none_without_features() -> None:
    units = host_units({"avxvnni": True}, 256, 2)
    assert [(u["name"], u["n"]) for u in units] == [("vpdpbusd", 8)]
    assert host_units({}, 512, 2) == []
    assert host_units({"avx512vnni": True}, 256, 2) == []  # AVX512-VNNI needs the 512-bit registers


def test_unit_peaks_take_the_best_unit_per_dtype() -> None:
    peaks = unit_peaks(host_units(SPR, 512, 2), cores=2, clock_ghz=2.0)
    assert peaks["bf16"] == pytest.approx(2 * 2.0 * 16 * 16 * 32 * 2 / 16 / 1000)  # AMX beats vdpbf16ps
    assert peaks["i8"] == pytest.approx(2 * 2.0 * 16 * 16 * 64 * 2 / 16 / 1000)
    zen = unit_peaks(host_units(ZEN4, 512, 2), cores=2, clock_ghz=2.0)
    assert zen["bf16"] == pytest.approx(2 * 2.0 * 2 * (16 * 2 * 2) / 1000)


def _zen4_data() -> dict:
    return load_spec("amd/zen4").model_dump(mode="json")


@pytest.mark.parametrize("change, field", [
    ({"m": 2}, "matrix_units[0].m"),
    ({"n": 8}, "matrix_units[0].n"),
    ({"registers": "tile"}, "matrix_units[0].tile_registers"),
    ({"tile_registers": 8}, "matrix_units[0].tile_registers"),
    ({"broadcast_registers": 31}, "matrix_units[0].broadcast_registers"),  # no room for an accumulator
    ({"registers": None, "broadcast_registers": 2}, "matrix_units[0].broadcast_registers"),
])
def test_register_units_are_validated_with_their_field(change: dict, field: str) -> None:
    data = _zen4_data()
    data["matrix_units"][0].update(change)
    with pytest.raises(SpecError, match=field.replace("[", r"\[").replace("]", r"\]")):
        validate_data(data, source="zen4-edited")


def test_presets_list_their_units() -> None:
    assert [u.name for u in load_spec("zen4").matrix_units] == ["vdpbf16ps", "vpdpbusd"]
    amx = load_spec("intel/xeon-amx")
    assert [u.name for u in amx.matrix_units] == ["tdpbf16ps", "tdpbssd", "vdpbf16ps", "vpdpbusd"]
    assert "+amx-tile" in amx.codegen["features"]
    assert load_spec("intel/xeon-avx512").matrix_units == []


def test_bf16_plans_a_register_tile_of_vdpbf16ps() -> None:
    plan = plan_contraction(load_spec("zen4"), Contraction(1024, 1024, 1024, dtype="bf16"), {"threads": 1})
    tile, blk = plan.compute, plan.blocking
    assert (tile.kind, tile.name, tile.instruction, tile.k) == ("matrix-unit", "vdpbf16ps", (1, 16, 2), 2)
    assert tile.n % 16 == 0 and tile.registers <= 32
    assert blk is not None and (blk.unit, blk.unit_k, blk.mr, blk.nr) == ("vdpbf16ps", 2, tile.m, tile.n)
    assert blk.kc % 2 == 0 and not blk.transposed
    assert any("vdpbf16ps: each micro-kernel step consumes 2 k" in r for r in plan.reasons)


def test_i8_k_block_is_whole_groups_of_four() -> None:
    plan = plan_contraction(load_spec("zen4"), Contraction(37, 45, 29, dtype="i8"), {"threads": 1})
    assert plan.blocking is not None and plan.blocking.unit == "vpdpbusd"
    assert plan.blocking.kc % 4 == 0 and plan.blocking.kc >= 29
    assert plan.compute.accumulator_dtype == "i32"


def test_i8_register_tile_leaves_the_broadcast_registers_free() -> None:
    """The tile that spilled on Zen 4 (12x2 with 6 registers left) is not planned; bf16's keeps one."""
    for m, n in ((392, 512), (25088, 64), (512, 3072)):
        tile = plan_contraction(load_spec("zen4"), Contraction(m, n, 2304, dtype="i8"), {"threads": 1}).compute
        nv = tile.n // 16
        assert tile.name == "vpdpbusd" and tile.m * nv + nv + 8 <= 32 and tile.registers == tile.m * nv + nv + 8
        assert (tile.m, nv) != (12, 2)
    plan = plan_contraction(load_spec("zen4"), Contraction(392, 512, 2304, dtype="i8"), {"threads": 1})
    assert any("and 8 for A's broadcasts of 32 registers" in r for r in plan.reasons)
    bf16 = plan_contraction(load_spec("zen4"), Contraction(392, 512, 2304, dtype="bf16"), {"threads": 1}).compute
    assert bf16.registers == bf16.m * (bf16.n // 16) + bf16.n // 16 + 1


def test_f32_keeps_the_fma_tile() -> None:
    plan = plan_contraction(load_spec("zen4"), Contraction(512, 512, 512), {"threads": 1})
    assert plan.compute.kind == "vector-fma" and plan.compute.instruction is None
    assert plan.blocking is not None and plan.blocking.unit == "" and plan.blocking.unit_k == 1


def test_unit_tile_packs_a_only_when_rows_share_a_set() -> None:
    spec = load_spec("zen4")  # 32 KiB, 8 ways, 64 B lines: rows 4 KiB apart share a set
    l1 = spec.memory_level("l1d")
    seen = set()
    for k in (1000, 1024, 2048, 3072, 4096):
        blk = plan_contraction(spec, Contraction(512, 768, k, dtype="bf16"), {"threads": 1}).blocking
        assert blk is not None
        assert blk.pack_a is (rows_per_set(l1, 2 * k, blk.mr) > 8), k
        seen.add(blk.pack_a)
    assert seen == {True, False}  # both decisions occur
    blk = plan_contraction(spec, Contraction(512, 768, 1024, dtype="bf16"), {"threads": 1, "pack_a": True}).blocking
    assert blk is not None and blk.pack_a


def test_units_are_not_planned_for_operands_stored_transposed() -> None:
    plan = plan_contraction(load_spec("zen4"), Contraction(64, 64, 64, dtype="bf16", b_layout="nk"), {"threads": 1})
    assert plan.blocking is None
    assert any("stored transposed" in r for r in plan.reasons)


def test_amx_plans_2x2_accumulator_tiles_with_a_k_loop() -> None:

    plan = plan_contraction(load_spec("intel/xeon-amx"), Contraction(1024, 1024, 1024, dtype="bf16"), {"threads": 1})
    tile, blk = plan.compute, plan.blocking
    assert (tile.name, tile.m, tile.n, tile.k, tile.instruction, tile.registers) == ("tdpbf16ps", 32, 32, 32,
                                                                                    (16, 16, 32), 8)
    assert blk is not None and (blk.mr, blk.nr, blk.unit, blk.unit_k) == (32, 32, "tdpbf16ps", 32)
    assert blk.kc % 32 == 0 and blk.pack_a  # whole steps; tile loads read a packed A
    i8 = plan_contraction(load_spec("intel/xeon-amx"), Contraction(100, 70, 300, dtype="i8"), {"threads": 1})
    assert i8.blocking is not None and (i8.compute.name, i8.blocking.kc) == ("tdpbssd", 320)


def test_cpu_lowers_units_by_their_registers_features_and_the_amx_option() -> None:
    from pbsdk.targets.cpu.hooks import lowerable

    amx = load_spec("intel/xeon-amx")
    features = amx.codegen["features"]
    tile, dot = amx.matrix_units[0], amx.matrix_units[2]
    assert "AMX kernels are off" in (lowerable(tile, 512, features, "off") or "")
    assert lowerable(tile, 512, features, "on") is None
    # the default, "auto": the tiles where the code's features have them (and Linux grants the state on an
    # AMX host; on another host the code is for another machine)
    assert lowerable(tile, 512, features) in (None, ("tdpbf16ps: Linux did not grant this process AMX's tile state "
                                              "(arch_prctl ARCH_REQ_XCOMP_PERM)"))
    assert "+amx-bf16,+amx-tile" in (lowerable(tile, 512, "+avx512f") or "")
    assert "+amx-bf16,+amx-tile" in (lowerable(tile, 512, "+avx512f", "on") or "")
    assert lowerable(tile, 512, "+avx512f", "emulate") is None  # the arithmetic on host buffers: any machine
    assert lowerable(dot, 512, features) is None
    assert "+avx512bf16" in (lowerable(dot, 512, "+avx512f,+avx2") or "")
    assert "no 128-bit instruction" in (lowerable(dot, 128, features) or "")


def test_a_spec_file_with_a_unit_in_registers_parses() -> None:
    text = load_spec("zen4").model_dump_json()
    assert parse_spec(text, source="zen4.json").matrix_units[0].registers == "vector"


def test_b_is_packed_several_panels_a_pass() -> None:
    """A unit kernel packing B per call reads PASS_LINES lines of each row a pass (256 bytes of 64-byte
    lines), no more than a block's columns, and for int8 with the panels'
    column sums (one register a vector) in at most half the registers."""
    from pbsdk.core.plan.contraction import PASS_LINES

    spec = load_spec("zen4")  # 64-byte lines, 32 registers
    for dtype, eb in (("i8", 1), ("bf16", 2)):
        plan = plan_contraction(spec, Contraction(256, 4096, 4096, dtype=dtype), {"threads": 1})
        blk = plan.blocking
        assert blk is not None and blk.unit and blk.pass_panels > 1, (dtype, blk)
        assert blk.pass_panels * blk.nr * eb == PASS_LINES * 64
        assert any(f"B packed {blk.pass_panels} micro-panel(s) a pass" in r for r in plan.reasons)
    narrow = plan_contraction(spec, Contraction(256, 40, 4096, dtype="i8"), {"threads": 1}).blocking
    assert narrow is not None and narrow.pass_panels == -(-40 // narrow.nr)  # no pass past the columns
    assert spec.vector is not None
    few = spec.model_copy(update={"vector": spec.vector.model_copy(update={"registers": 16})})
    i8 = plan_contraction(few, Contraction(256, 4096, 4096, dtype="i8"), {"threads": 1}).blocking
    assert i8 is not None and 1 <= i8.pass_panels * i8.nv <= 8
    f32 = plan_contraction(spec, Contraction(256, 4096, 4096), {"threads": 1}).blocking
    assert f32 is not None and f32.pass_panels == 1  # the FMA kernel packs its own way


# ------------------------------------------------------------------- vpmaddwd: i8 read as i16 pairs

AVX2 = {"avx2": True, "fma": True}


def test_avx2_without_vnni_gives_vpmaddwd_reading_i8_as_i16() -> None:
    (unit,) = host_units(AVX2, 256, 2)
    assert (unit["name"], unit["n"], unit["k"], unit["operand_dtype"], unit["register_dtype"],
            unit["accumulator_dtype"], unit["registers"], unit["broadcast_registers"]) == (
        "vpmaddwd", 8, 2, "i8", "i16", "i32", "vector", 4)
    # AVX512-BW without VNNI (a Skylake-X): 16 lanes; any i8 dot product (VNNI, AVX-VNNI, AMX) comes first
    assert [(u["name"], u["n"]) for u in host_units({"avx512f": True, "avx512bw": True}, 512, 2)] == [("vpmaddwd", 16)]
    assert [u["name"] for u in host_units({**AVX2, "avxvnni": True}, 256, 2)] == ["vpdpbusd"]
    assert [u["name"] for u in host_units({**ZEN4, "avx512bw": True}, 512, 2)] == ["vdpbf16ps", "vpdpbusd"]
    assert host_units({"avx": True}, 256, 2) == []  # AVX without AVX2 has no 256-bit integer multiply


def test_zen3_preset_plans_i8_on_vpmaddwd_with_a_packed_a() -> None:
    spec = load_spec("amd/zen3")
    plan = plan_contraction(spec, Contraction(3136, 64, 576, dtype="i8"), {"threads": 1})
    tile, blk = plan.compute, plan.blocking
    assert (tile.name, tile.instruction, tile.reads) == ("vpmaddwd", (1, 8, 2), "i16")
    assert blk is not None and (blk.unit, blk.unit_k, blk.lanes) == ("vpmaddwd", 2, 8) and blk.kc % 2 == 0
    assert tile.m * blk.nv + blk.nv + 4 <= 16  # accumulators, B vectors and the broadcast registers
    # widened in place each broadcast would extend every value: A is packed whatever its reuse
    assert blk.pack_a and any("reads A widened to i16" in r for r in plan.reasons)
    # the B micro-panel is held in l1 as i16: twice the bytes of the stored i8
    big = plan_contraction(spec, Contraction(64, 64, 4608, dtype="i8"), {"threads": 1}).blocking  # kc in l1
    assert big is not None and big.kc * big.nr * 2 <= spec.memory_level("l1d").size_bytes < 2 * big.kc * big.nr * 2


def test_a_widening_unit_slower_than_widening_to_f32_is_not_used() -> None:
    """A unit that widens its operands is skipped where its multiply-adds a cycle fall short of the f32 FMAs'
    the operands could be widened to instead (Zen 3: 2 FMAs of 8 lanes, 16 a cycle; vpmaddwd's 16 products a
    step tie them at 1 step a cycle): i8 then runs on the f32 FMAs, widened."""
    from pbsdk.core.plan.contraction import units_for, widened_dtype

    spec = load_spec("amd/zen3")
    unit = spec.matrix_units[0]
    slow = spec.model_copy(update={"matrix_units": [unit.model_copy(update={"per_cycle": 0.9})]})
    tie = spec.model_copy(update={"matrix_units": [unit.model_copy(update={"per_cycle": 1.0})]})
    assert [u.name for u in units_for(spec, "i8", "i32")] == ["vpmaddwd"]
    assert [u.name for u in units_for(tie, "i8", "i32")] == ["vpmaddwd"]  # a tie: exact i32, half the bytes
    assert units_for(slow, "i8", "i32") == []
    op = Contraction(256, 256, 256, dtype="i8")
    assert widened_dtype(slow, op) == "f32" and widened_dtype(spec, op) is None
    assert plan_contraction(slow, op, {"threads": 1}).compute.kind == "vector-fma"


@pytest.mark.parametrize("change, field, message", [
    ({"register_dtype": "i8", "operand_dtype": "i16", "k": 2}, "matrix_units[0].register_dtype", "narrower"),
    ({"register_dtype": "i32"}, "matrix_units[0].k", "32-bit group"),
    ({"registers": None, "broadcast_registers": 1}, "matrix_units[0].register_dtype", "registers: vector"),
])
def test_register_dtype_is_validated(change: dict, field: str, message: str) -> None:
    data = load_spec("amd/zen3").model_dump(mode="json")
    data["matrix_units"][0].update(change)
    with pytest.raises(SpecError, match=field.replace("[", r"\[").replace("]", r"\]")) as err:
        validate_data(data, source="zen3-edited")
    assert message in str(err.value)


def test_cpu_lowers_vpmaddwd_with_avx2_or_avx512bw() -> None:
    from pbsdk.targets.cpu.hooks import lowerable

    unit = load_spec("amd/zen3").matrix_units[0]
    assert lowerable(unit, 256, "+avx2,+fma") is None
    assert "+avx2" in (lowerable(unit, 256, "+avx,+fma") or "")
    assert lowerable(unit, 512, "+avx512f,+avx512bw") is None
    assert "no 128-bit instruction" in (lowerable(unit, 128, "+avx2") or "")


def test_widening_unit_estimate_counts_the_broadcasts_beside_the_steps() -> None:
    """The compute term of a vpmaddwd tile is the steps at the unit's rate, times 1 + 1/(2 nv): a broadcast a
    row and group beside mr x nv steps of two instructions each. Other tiles keep the steps alone."""
    spec = load_spec("amd/zen3")
    op = Contraction(3136, 64, 576, dtype="i8")
    plan = plan_contraction(spec, op, {"threads": 1})
    nv = plan.compute.n // 8
    steps_alone = op.flops / (spec.peak_tflops["i8"] * 1e12 / spec.compute[0].count)
    assert dict(plan.estimate.terms)["compute"] == pytest.approx(steps_alone * (1 + 1 / (2 * nv)))
    f32 = plan_contraction(spec, Contraction(3136, 64, 576), {"threads": 1})
    assert dict(f32.estimate.terms)["compute"] == pytest.approx(op.flops / (spec.peak_tflops["f32"] * 1e12 / 2))
