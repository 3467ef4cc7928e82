"""The split of the tiled form's parallel tile loops over ``spec.compute[0]`` (`split_parallel`, the
``parallel`` field of contraction and vector plans): no IR."""

from __future__ import annotations

from pathlib import Path

import pytest

from pbsdk.core.plan import Contraction, format_plan, plan_contraction
from pbsdk.core.plan.contraction import parallel_split, split_parallel
from pbsdk.core.plan.vector_tiles import Access, VectorOp, plan_vector
from pbsdk.core.spec import ChipSpec, load_spec

DATA = Path(__file__).resolve().parents[1] / "bringup" / "data"


@pytest.fixture(scope="module")
def npu() -> ChipSpec:
    return load_spec("npu")  # 4 cores, each with its spm; a shared sram


@pytest.fixture(scope="module")
def tiny() -> ChipSpec:
    return load_spec(DATA / "tiny_npu.yaml")  # 2 cores, one per-core tcm


@pytest.fixture(scope="module")
def edge() -> ChipSpec:
    return load_spec(DATA / "edge_npu.yaml")  # 1 core


def test_one_loop_with_enough_tiles_takes_every_unit() -> None:
    split, why = split_parallel([("n", 8), ("m", 8)], 4)
    assert split == (("n", 4),)  # two loops would not shorten the busiest unit's 16 tiles: the outer one
    assert "busiest unit gets 16 of 64" in why


def test_parts_are_balanced_and_never_idle() -> None:
    # 5 tiles on 4 units: runs of 2 tiles, so 3 parts (2, 2, 1) finish as soon as 4 would.
    assert split_parallel([("m", 5)], 4)[0] == (("m", 3),)
    assert split_parallel([("m", 6)], 4)[0] == (("m", 3),)
    assert split_parallel([("m", 7)], 4)[0] == (("m", 4),)
    assert split_parallel([("m", 3)], 8)[0] == (("m", 3),)  # at most one part per tile


def test_two_loops_when_one_has_too_few_tiles() -> None:
    split, _ = split_parallel([("n", 2), ("m", 2)], 4)
    assert split == (("n", 2), ("m", 2))
    # 3 x 3 tiles on 4 units: 2 x 2 parts leave a unit 4 tiles, one loop in 3 parts only 3.
    assert split_parallel([("n", 3), ("m", 3)], 4)[0] == (("n", 3),)


@pytest.mark.parametrize("loops,units", [([("m", 1), ("n", 1)], 4), ([("m", 9)], 1), ([], 4)])
def test_nothing_to_share(loops: list[tuple[str, int]], units: int) -> None:
    split, why = split_parallel(loops, units)
    assert split == () and why.startswith("no parallel split")


def test_every_split_fits_the_units() -> None:
    for units in range(1, 9):
        for a in range(1, 12):
            for b in range(1, 12):
                split, _ = split_parallel([("n", a), ("m", b)], units)
                total = 1
                for name, parts in split:
                    count = {"n": a, "m": b}[name]
                    assert 2 <= parts <= count
                    # balanced: every part has ceil(count / parts) tiles but the last, which has some
                    run = -(-count // parts)
                    assert (parts - 1) * run < count
                    total *= parts
                assert total <= units


def test_contraction_splits_the_per_core_level_never_k(npu: ChipSpec) -> None:
    plan = plan_contraction(npu, Contraction(256, 256, 256, dtype="bf16"))
    assert plan.parallel and all(loop.split("@")[1] == "spm" for loop, _ in plan.parallel)
    assert all(loop.split("@")[0] in ("m", "n") for loop, _ in plan.parallel)
    parts = 1
    for _, p in plan.parallel:
        parts *= p
    assert 1 < parts <= npu.compute[0].count
    assert any("spm buffers per core" in r for r in plan.reasons)


def test_contraction_runs_counted_inside_the_shared_level_tile(npu: ChipSpec) -> None:
    # 160 rows in spm tiles of 32 within one sram tile: 5 tiles for 4 cores, 3 parts.
    plan = plan_contraction(npu, Contraction(160, 32, 64, dtype="bf16"))
    assert plan.tile("spm").m == 32 and plan.tile("sram").m == 160
    assert plan.parallel == (("m@spm", 3),)
    # The same split from the level tiles alone (what promote recomputes for rounded or forced tiles).
    assert parallel_split(npu, plan.op, [("spm", 32, 32), ("sram", 160, 32)])[0] == (("m@spm", 3),)
    assert parallel_split(npu, plan.op, [("spm", 160, 32), ("sram", 160, 32)])[0] == ()


def test_one_core_or_no_per_core_level_is_not_split(edge: ChipSpec, tiny: ChipSpec) -> None:
    assert plan_contraction(edge, Contraction(512, 512, 64)).parallel == ()
    assert plan_contraction(load_spec("avx512"), Contraction(512, 512, 64)).parallel == ()  # caches only
    assert plan_contraction(tiny, Contraction(512, 512, 64)).parallel in ((("n@tcm", 2),), (("m@tcm", 2),))


def test_explain_prints_the_split(npu: ChipSpec) -> None:
    text = format_plan("mm", plan_contraction(npu, Contraction(160, 32, 64, dtype="bf16")))
    assert "forall         m@spm in 3 parts" in text
    assert "m@spm 3 part(s) on 3 of 4 cores" in text


def _plain(*loops: int, output: bool = False) -> Access:
    return Access(tuple(((d, 1),) if d >= 0 else () for d in loops), "f32", output)


def test_vector_plan_splits_parallel_loops_never_a_reduction(npu: ChipSpec, tiny: ChipSpec, edge: ChipSpec) -> None:
    rows = VectorOp((64, 1 << 16), ("parallel", "reduction"), (_plain(0, 1), _plain(0, output=True)))
    plan = plan_vector(npu, rows)
    assert plan.chunked and plan.tiles > 1
    assert plan.parallel and set(plan.split) == {0}  # the row loop; the chunked reduction stays whole
    bias = VectorOp((64, 256), ("parallel", "parallel"), (_plain(0, 1), _plain(-1, 1), _plain(0, 1, output=True)))
    two = plan_vector(tiny, bias)
    assert two.tile[0] == 11 and two.parallel == (("d0", 2),) and two.split == {0: 2}
    assert plan_vector(edge, bias).parallel == ()
    small = VectorOp((7, 49), ("parallel", "parallel"), (_plain(0, 1), _plain(0, 1, output=True)))
    assert plan_vector(npu, small).parallel == ()  # one tile: nothing to share


def test_vector_plan_in_a_shared_level_is_not_split(npu: ChipSpec) -> None:
    data = npu.model_dump()
    data["memory"] = [m for m in data["memory"] if m["name"] != "spm"]  # the sram (device-wide) stages it
    shared = ChipSpec.model_validate(data)
    op = VectorOp((4096, 1024), ("parallel", "parallel"), (_plain(0, 1), _plain(0, 1, output=True)))
    plan = plan_vector(shared, op)
    assert plan.level == "sram" and plan.tiles > 1 and plan.parallel == ()
    assert any("sram is per 'device'" in r for r in plan.reasons)
