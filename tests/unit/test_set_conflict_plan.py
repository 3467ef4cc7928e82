"""An A read in place whose rows share one cache set is packed instead (`rows_per_set`,
`SET_CONFLICT_MAX_NV` in `pbsdk.core.plan.contraction`), checked without IR."""

from __future__ import annotations

import pytest

from pbsdk.core.errors import SpecError
from pbsdk.core.plan.contraction import Contraction, plan_contraction, rows_per_set
from pbsdk.core.spec import ChipSpec, MemoryLevel, load_spec, validate_data


def _l1(size: int = 32 * 1024, ways: int | None = 8, line: int | None = 64) -> MemoryLevel:
    return MemoryLevel(name="l1d", scope="core", size_bytes=size, bandwidth_gbps=100.0, alignment_bytes=64,
                       line_bytes=line, managed="cache", ways=ways)


@pytest.mark.parametrize(("stride", "rows", "want"), [
    (4096, 14, 14),      # 64 sets x 64 B: every row in the same set
    (16384, 30, 30),
    (2048, 14, 7),       # two sets, alternating
    (6144, 14, 7),       # 6 KiB = 4 KiB + 2 KiB: the same two sets
    (1024, 14, 4),       # four sets
    (4000, 14, 1),       # 96 B short of 4 KiB: each row a line further on
    (4100, 14, 14),      # 4 B past 4 KiB: all rows in the first row's line slot
    (16400, 14, 4),      # 16 B past 16 KiB: four rows a line slot
    (4096, 1, 1),
])
def test_rows_per_set(stride: int, rows: int, want: int) -> None:
    assert rows_per_set(_l1(), stride, rows) == want


def test_unknown_associativity_or_line_models_no_conflict() -> None:
    assert rows_per_set(_l1(ways=None), 4096, 14) == 1
    assert rows_per_set(_l1(line=None), 4096, 14) == 1
    assert rows_per_set(_l1(size=64, ways=8), 4096, 14) == 1  # fewer bytes than one line per way


def test_ways_is_validated_with_file_and_field() -> None:
    data = load_spec("intel/xeon-avx512").model_dump(mode="json")
    data["memory"][-1]["ways"] = 0
    with pytest.raises(SpecError, match="ways"):
        validate_data(data, source="bad.yaml")


@pytest.fixture(scope="module")
def xeon() -> ChipSpec:
    return load_spec("intel/xeon-avx512")  # l1d 48 KiB, 12 ways, 64 B lines: 64 sets, 4 KiB apart share one


def _spec_without_ways(spec: ChipSpec) -> ChipSpec:
    data = spec.model_dump(mode="json")
    for level in data["memory"]:
        level.pop("ways", None)
    return validate_data(data, source="test")


@pytest.mark.parametrize("mnk", [(1024, 16, 4096), (2048, 16, 2048), (512, 16, 4096), (1024, 16, 512),
                                 (1024, 24, 1024), (1024, 32, 4096)])
def test_rows_sharing_a_set_pack_a(xeon: ChipSpec, mnk: tuple[int, int, int]) -> None:
    m, n, k = mnk
    for threads in (1, 2):
        plan = plan_contraction(xeon, Contraction(m, n, k), {"threads": threads})
        blk = plan.blocking
        assert blk is not None and not blk.transposed and blk.nv <= 2
        assert blk.pack_a, (mnk, threads, plan.reasons)
        assert any(r.startswith("A packed: read in place") and "share one l1d set (12 ways)" in r
                   for r in plan.reasons), plan.reasons
        # Without the associativity in the spec, the same product reads A in place, as before.
        bare = plan_contraction(_spec_without_ways(xeon), Contraction(m, n, k), {"threads": threads}).blocking
        assert bare is not None and not bare.pack_a


@pytest.mark.parametrize("mnk", [(1024, 16, 1000), (1024, 16, 256), (1024, 16, 4100), (1024, 48, 1024),
                                 (1024, 40, 4096)])
def test_rows_in_many_sets_or_wide_tiles_stay_in_place(xeon: ChipSpec, mnk: tuple[int, int, int]) -> None:
    """No conflict (a stride that is not a multiple of the set span, or few rows a set), or a tile with 3
    vector FMAs per A value (the 48-column tile), which hides the refills: A stays in place."""
    m, n, k = mnk
    plan = plan_contraction(xeon, Contraction(m, n, k), {"threads": 1})
    blk = plan.blocking
    assert blk is not None and not blk.transposed and not blk.pack_a, (mnk, plan.reasons)
    assert not any(r.startswith("A packed: read in place") for r in plan.reasons)


def test_option_pack_a_decides(xeon: ChipSpec) -> None:
    op = Contraction(1024, 16, 4096)
    blk = plan_contraction(xeon, op, {"threads": 1, "pack_a": False}).blocking
    assert blk is not None and not blk.pack_a
    blk = plan_contraction(xeon, Contraction(1024, 16, 1000), {"threads": 1, "pack_a": True}).blocking
    assert blk is not None and blk.pack_a


def test_explain_says_why_a_is_packed() -> None:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "pbsdk.cli", "explain", "--matmul", "1024", "16", "4096",
                          "--spec", "intel/xeon-avx512"], check=True, capture_output=True, text=True).stdout
    assert "A packed: read in place" in out and "l1d set (12 ways)" in out
