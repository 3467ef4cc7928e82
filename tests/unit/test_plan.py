"""The analytical planner on plans alone: no IR."""

from __future__ import annotations

import dataclasses

import pytest

from pbsdk.core.plan import Contraction, plan_contraction
from pbsdk.core.plan.contraction import LONG_K_SHARE, _MicroTile, long_k_stream_share, packing_seconds
from pbsdk.core.spec import ChipSpec, load_spec


def _with(spec: ChipSpec, **changes) -> ChipSpec:
    """A validated copy of ``spec`` with some fields replaced (dict form, re-validated)."""
    data = spec.model_dump()
    data.update(changes)
    return ChipSpec.model_validate(data)


def _resize(spec: ChipSpec, level: str, factor: float) -> ChipSpec:
    memory = [dict(m) for m in spec.model_dump()["memory"]]
    for m in memory:
        if m["name"] == level:
            m["size_bytes"] = int(m["size_bytes"] * factor)
            if m.get("max_size_bytes"):
                m["max_size_bytes"] = int(m["max_size_bytes"] * factor)
    return _with(spec, memory=memory)


BIG = Contraction(2048, 2048, 2048)


def test_plans_are_frozen_and_deterministic() -> None:
    spec = load_spec("avx512")
    a, b = plan_contraction(spec, BIG), plan_contraction(spec, BIG)
    assert a == b
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.parallel_ways = 3  # type: ignore[misc]


def test_cpu_without_matrix_unit_uses_a_vector_register_tile() -> None:
    spec = load_spec("avx512")
    plan = plan_contraction(spec, BIG)
    u = plan.compute
    assert u.kind == "vector-fma"
    assert u.n % spec.vector.lanes("f32") == 0
    assert u.registers <= spec.vector.registers
    # With 32 registers of 16 lanes the best tile by intensity uses most of the register file.
    assert u.registers >= spec.vector.registers - 2


def test_fewer_vector_registers_shrink_the_register_tile() -> None:
    spec = load_spec("avx512")
    vec = spec.model_dump()["vector"]
    small = _with(spec, vector={**vec, "registers": 16})
    assert plan_contraction(small, BIG).compute.registers <= 16
    assert plan_contraction(small, BIG).compute.m * plan_contraction(small, BIG).compute.n < \
        plan_contraction(spec, BIG).compute.m * plan_contraction(spec, BIG).compute.n


def test_halving_l1_shrinks_the_l1_tile() -> None:
    spec = load_spec("avx512")
    full = plan_contraction(spec, BIG).tile("l1d")
    half = plan_contraction(_resize(spec, "l1d", 0.5), BIG).tile("l1d")
    assert half.m * half.n * half.k < full.m * full.n * full.k
    assert half.footprint_bytes <= half.budget_bytes < full.budget_bytes


def test_halving_a_scratchpad_shrinks_its_tile() -> None:
    spec = load_spec("npu")
    op = Contraction(1024, 1024, 1024, dtype="bf16")
    full = plan_contraction(spec, op).tile("spm")
    half = plan_contraction(_resize(spec, "spm", 0.5), op).tile("spm")
    assert half.m * half.n * half.k < full.m * full.n * full.k
    assert half.double_buffered and half.footprint_bytes <= half.budget_bytes


def test_matrix_unit_chosen_in_the_spec_order_and_tiles_are_multiples() -> None:
    spec = load_spec("npu")
    plan = plan_contraction(spec, Contraction(1000, 777, 513, dtype="bf16"))
    assert plan.compute.kind == "matrix-unit" and (plan.compute.m, plan.compute.n, plan.compute.k) == (32, 32, 32)
    inner = (32, 32, 32)
    for t in plan.levels:
        assert t.m % inner[0] == 0 and t.n % inner[1] == 0 and t.k % inner[2] == 0, t
        inner = (t.m, t.n, t.k)


def test_removing_matrix_units_falls_back_to_the_vector_unit() -> None:
    spec = _with(load_spec("npu"), matrix_units=[])
    plan = plan_contraction(spec, Contraction(512, 512, 512, dtype="bf16"))
    assert plan.compute.kind == "vector-fma"
    assert plan_contraction(load_spec("npu"), Contraction(512, 512, 512, dtype="bf16"),
                            {"matrix_units": False}).compute.kind == "vector-fma"


def test_gpu_prefers_wgmma_on_hopper_and_mma_sync_on_ampere() -> None:
    op = Contraction(4096, 4096, 4096, dtype="f16")
    assert plan_contraction(load_spec("h100"), op).compute.name.startswith("wgmma")
    assert plan_contraction(load_spec("a100"), op).compute.name.startswith("mma.sync")


def test_precision_policy_lets_f32_use_tf32_units() -> None:
    op = Contraction(2048, 2048, 2048, dtype="f32")
    spec = load_spec("a100")
    assert plan_contraction(spec, op).compute.kind != "matrix-unit"
    tf32 = plan_contraction(spec, op, {"matmul_precision": "tf32"}).compute
    assert tf32.kind == "matrix-unit" and tf32.operand_dtype == "tf32"


def test_gpu_shared_memory_uses_the_opt_in_maximum_only_when_allowed() -> None:
    spec = load_spec("h100")
    op = Contraction(8192, 8192, 8192, dtype="f16")
    optin = plan_contraction(spec, op).tile("smem")
    default = plan_contraction(spec, op, {"optin_scratchpad": False}).tile("smem")
    assert optin.budget_bytes == spec.memory_level("smem").max_size_bytes
    assert default.budget_bytes == spec.memory_level("smem").size_bytes
    assert default.footprint_bytes <= default.budget_bytes < optin.budget_bytes


def test_every_core_gets_work_and_small_problems_do_not_overclaim() -> None:
    spec = load_spec("h100")
    big = plan_contraction(spec, Contraction(8192, 8192, 8192, dtype="f16"))
    assert big.parallel_ways == spec.compute[0].count
    tiny = plan_contraction(load_spec("avx512"), Contraction(8, 8, 8))
    assert tiny.parallel_ways <= 2


def test_estimate_names_the_bound_and_follows_bandwidth() -> None:
    spec = load_spec("avx512")
    plan = plan_contraction(spec, BIG)
    assert plan.estimate.bound == "compute"
    memory = [dict(m) for m in spec.model_dump()["memory"]]
    memory[0]["bandwidth_gbps"] = 0.01  # a starved main memory
    starved = plan_contraction(_with(spec, memory=memory), BIG)
    assert starved.estimate.bound == memory[0]["name"]
    assert starved.estimate.seconds > plan.estimate.seconds


def test_memory_bound_matrix_vector_product() -> None:
    plan = plan_contraction(load_spec("avx512"), Contraction(4096, 1, 4096))
    assert plan.estimate.bound != "compute"


def test_cli_explain_shows_decisions_change_with_the_spec(capsys: pytest.CaptureFixture[str]) -> None:
    from pbsdk.cli import main

    assert main(["explain", "--matmul", "1024", "1024", "1024", "--dtype", "bf16", "--spec", "npu"]) == 0
    npu = capsys.readouterr().out
    assert "matrix-unit mxu: 32x32x32" in npu and "tile @spm" in npu and "4-way over 'core'" in npu
    assert main(["explain", "--matmul", "1024", "1024", "1024", "--spec", "avx512"]) == 0
    cpu = capsys.readouterr().out
    assert "vector-fma" in cpu and "tile @l1d" in cpu and "bound by" in cpu


def test_cli_explain_says_how_a_stored_transposed_operand_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    from pbsdk.cli import main

    assert main(["explain", "--matmul", "512", "3072", "768", "--transpose-b", "--spec", "avx512"]) == 0
    out = capsys.readouterr().out
    assert "(B^T stored)" in out and "packing B stored [n, k]" in out
    assert main(["explain", "--matmul", "512", "3072", "768", "--transpose-a", "--spec", "avx512"]) == 0
    out = capsys.readouterr().out
    assert "(A^T stored)" in out and "A stored [k, m]:" in out


# ------------------------------------------------------------------ register tile and packed blocking
def test_register_tile_balances_fma_and_load_issue() -> None:
    from pbsdk.core.plan.contraction import register_tile
    # Two FMA and two load ports, 32 registers of 16 lanes: a 14x2-vector tile issues 28 FMAs per 16
    # loads (FMA-bound), where a 30x1 tile would be load-bound (31 loads per 30 FMAs).
    mr, nv, _ = register_tile(32, 16, 2, 2, 2048, 2048)
    assert (mr, nv) == (14, 2)
    # With one load port per cycle, tiles need more FMAs per load: never a single column of vectors.
    mr1, nv1, _ = register_tile(32, 16, 2, 1, 2048, 2048)
    assert mr1 * nv1 / (mr1 + nv1) >= 2 - 1e-9
    # Narrow problems are not padded out to a wide tile.
    _mr2, nv2, _ = register_tile(32, 16, 2, 2, 2048, 16)
    assert nv2 == 1


def test_register_tile_keeps_enough_accumulators_for_the_fma_latency() -> None:
    """A k step of a tile cannot take fewer cycles than the FMA latency (each accumulator waits for its
    previous FMA). 22 rows on 16 AVX2 registers, 2 FMAs a cycle: without the latency the model takes a
    2x2-vector tile (4 accumulators, no edge); with a 4-cycle latency such a tile issues at half rate, so
    the tile holds latency x rate = 8 accumulators at least (measured on Zen 3, 1 thread: 22x768x768
    797 -> 587 us, 22x768x3072 4.8 -> 2.7 ms)."""
    from pbsdk.core.plan.contraction import issue_cycles, register_tile

    assert register_tile(16, 8, 2, 2, 22, 768) == (2, 2, "100% of FMA issue at this shape")
    mr, nv, why = register_tile(16, 8, 2, 2, 22, 768, latency=4)
    assert mr * nv >= 8 and mr * nv + nv + 1 <= 16 and why == "100% of FMA issue at this shape"
    assert issue_cycles(2, 2, 8, 22, 768, 2, 2, latency=4) == 2 * issue_cycles(2, 2, 8, 22, 768, 2, 2)
    assert issue_cycles(2, 2, 8, 2, 768, 2, 2, latency=4) == issue_cycles(2, 2, 8, 2, 768, 2, 2)  # as tall
    # Tiles that already hold enough accumulators do not change (the 6x2-vector AVX2 tile of big GEMMs).
    assert register_tile(16, 8, 2, 2, 1024, 1024, latency=4) == register_tile(16, 8, 2, 2, 1024, 1024)
    # A tile as tall as the product streams B past its rows once: its tile does not widen for the latency.
    for m in (1, 2, 3):
        assert register_tile(16, 8, 2, 2, m, 768, latency=4) == register_tile(16, 8, 2, 2, m, 768)
    assert register_tile(16, 8, 2, 2, 1, 64, latency=4)[:2] == (1, 4)  # never a tile of rows it does not have


def test_blocking_follows_the_cache_sizes() -> None:
    """Few rows (a 10-tile A block): kc fills L1 with the B micro-panel (many rows:
    `test_long_k_blocks_where_l2_feeds_the_b_stream`)."""
    spec = load_spec("avx512")
    few_rows = Contraction(128, 2048, 2048)
    full = plan_contraction(spec, few_rows).blocking
    assert full is not None
    assert full.kc * full.nr * 4 <= spec.memory_level("l1d").size_bytes
    assert full.mc * full.kc * 4 <= spec.memory_level("l2").size_bytes // 2
    half_l1 = plan_contraction(_resize(spec, "l1d", 0.5), few_rows).blocking
    assert half_l1 is not None and half_l1.kc < full.kc



def test_long_k_blocks_where_l2_feeds_the_b_stream() -> None:
    """Many rows: equal k blocks as long as an eighth of L2 holds the B micro-panel, where streaming it from
    there takes at most an eighth of L2's bandwidth (Zen 4's 30x16 tile: 3 %). Where it would take more
    (Zen 3's 6x16 tile, 34 %; the AVX-512 Xeon's 14x32, 14 %; an L2 of half the bandwidth), kc fills L1."""
    spec = load_spec("zen4")
    big = plan_contraction(spec, BIG, {"threads": 1}).blocking
    assert big.kc * big.nr * 4 <= spec.memory_level("l2").size_bytes // LONG_K_SHARE
    assert big.kc * big.nr * 4 > spec.memory_level("l1d").size_bytes and BIG.k % big.kc == 0  # equal blocks
    assert big.mc * big.kc * 4 <= spec.memory_level("l2").size_bytes // 2
    half_l2 = plan_contraction(_resize(spec, "l2", 0.5), BIG, {"threads": 1}).blocking
    assert half_l2 is not None and half_l2.kc < big.kc and half_l2.mc <= big.mc
    short_k = plan_contraction(spec, Contraction(25088, 64, 576), {"threads": 1}).blocking
    assert short_k.kc == 576  # a convolution's whole reduction: C updated once
    for name in ("zen3", "avx512"):
        other = load_spec(name)
        plan = plan_contraction(other, BIG, {"threads": 1})
        assert plan.blocking is not None
        assert plan.blocking.kc * plan.blocking.nr * 4 <= other.memory_level("l1d").size_bytes, name
        assert any("of its bandwidth (at most 1/8)" in w for w in plan.reasons), plan.reasons
    slow_l2 = _with(spec, memory=[lv.model_copy(update={"bandwidth_gbps": lv.bandwidth_gbps / 8})
                                  if lv.name == "l2" else lv for lv in spec.memory])
    slow = plan_contraction(slow_l2, BIG, {"threads": 1}).blocking
    assert slow is not None and slow.kc * slow.nr * 4 <= spec.memory_level("l1d").size_bytes


def test_long_k_stream_share_is_the_tiles_b_bytes_over_the_levels_bytes_a_cycle() -> None:
    spec = load_spec("zen3")  # 6x16 tile: 12 FMAs a k step on 2 pipes, 6 cycles; 64 B of B a step
    tile = _MicroTile(6, 2, 16, 8, 4.0)
    l2 = spec.memory_level("l2")
    share = long_k_stream_share(spec, tile, l2)
    assert share == pytest.approx(64 / 6 / (l2.bandwidth_gbps / spec.clock_ghz))
    assert long_k_stream_share(spec.model_copy(update={"clock_ghz": None}), tile, l2) is None


def test_blocking_threads_only_when_there_is_work() -> None:
    spec = load_spec("avx512")
    assert plan_contraction(spec, BIG).blocking.threads == spec.compute[0].count
    assert plan_contraction(spec, Contraction(16, 16, 16)).blocking.threads == 1
    assert plan_contraction(spec, BIG, {"threads": 1}).blocking.threads == 1
    batched = plan_contraction(spec, Contraction(256, 256, 256, batch=8)).blocking
    assert batched.split == "batch"
    wide = plan_contraction(spec, Contraction(14, 4096, 4096)).blocking
    assert wide.split == "n" and wide.threads == 2


def test_threads_split_the_operand_that_would_be_packed_more() -> None:
    """Split along m, each thread packs all of B; along n, all of A: the planner splits the dimension
    whose other operand is the smaller copy — and a B packed ahead of time (a frozen weight) costs nothing."""
    spec = load_spec("avx512")
    tall_b = plan_contraction(spec, Contraction(128, 4096, 4096)).blocking  # B 16 M values, A 0.5 M
    assert tall_b.split == "n" and tall_b.threads == 2
    assert any("packs all of the operand" in r for r in plan_contraction(spec, Contraction(128, 4096, 4096)).reasons)
    weights = plan_contraction(spec, Contraction(128, 4096, 4096, b_prepacked=True)).blocking
    assert weights.split == "m" and weights.threads == 2
    assert plan_contraction(spec, Contraction(1024, 1024, 1024)).blocking.split == "m"  # equal: rows
    assert plan_contraction(spec, Contraction(3136, 64, 576)).blocking.split == "m"  # a convolution's shape


def test_no_blocking_for_matrix_units_or_scratchpads() -> None:
    assert plan_contraction(load_spec("example/npu"), Contraction(512, 512, 512, dtype="bf16")).blocking is None
    assert plan_contraction(load_spec("nvidia/h100"), BIG).blocking is None


def test_b_is_packed_only_when_its_panels_are_reused() -> None:
    spec = load_spec("avx512")
    gemv = plan_contraction(spec, Contraction(1, 4096, 4096)).blocking
    assert gemv is not None and not gemv.pack_b  # one row: every B element is used once
    assert plan_contraction(spec, Contraction(64, 512, 512)).blocking.pack_b
    assert plan_contraction(spec, Contraction(1, 4096, 4096), {"pack_b": True}).blocking.pack_b


def test_matrix_vector_products_fork_by_their_memory_time() -> None:
    """A GEMV has little arithmetic but streams its whole matrix: the fork decision uses the one-core
    roofline (memory included), so a 1x512x512 product is split across the cores along n, while one whose
    memory time is small stays on one core."""
    spec = load_spec("avx512")
    gemv = plan_contraction(spec, Contraction(1, 512, 512))
    assert gemv.estimate.bound != "compute"
    assert gemv.blocking.threads == spec.compute[0].count and gemv.blocking.split == "n"
    assert plan_contraction(spec, Contraction(1, 64, 64)).blocking.threads == 1


def test_estimate_is_for_the_threads_the_code_runs_on() -> None:
    host = load_spec("avx512")
    one = plan_contraction(host, Contraction(1024, 1024, 1024), {"threads": 1})
    two = plan_contraction(host, Contraction(1024, 1024, 1024), {"threads": 2})
    assert one.blocking is not None and one.blocking.threads == 1 and two.blocking.threads == 2
    assert one.estimate.seconds == pytest.approx(2 * two.estimate.seconds, rel=0.05)


def test_packing_is_a_phase_of_the_estimate() -> None:
    """A thread packs B (all its columns, once) and A (its rows, once per nc panel) before the micro-kernels
    that read them: the estimate adds that time to the roofline's, from the levels the operands come from."""
    spec = load_spec("zen3")
    op = Contraction(128, 4096, 4096)  # B: 64 MiB, from main memory
    plan = plan_contraction(spec, op, {"threads": 1})
    blk = plan.blocking
    assert blk is not None and blk.pack_b and blk.threads == 1
    pack = dict(plan.estimate.terms)["packing"]
    roofline = max(s for name, s in plan.estimate.terms if name != "packing")
    assert plan.estimate.seconds == pytest.approx(roofline + pack)
    dram, kept = spec.memory_level("dram"), spec.memory_level(blk.nc_level)
    b_bytes = 4096 * 4096 * 4
    assert pack >= b_bytes / (dram.shared_bandwidth(1) * 1e9) + b_bytes / (kept.bandwidth_gbps * 1e9)
    # B packed ahead of time: only A's packing remains
    ahead = plan_contraction(spec, dataclasses.replace(op, b_prepacked=True), {"threads": 1})
    assert 0 < dict(ahead.estimate.terms).get("packing", 0.0) < pack / 10
    assert packing_seconds(spec, op, dataclasses.replace(blk, pack_a=False, pack_b=False)) == 0.0
