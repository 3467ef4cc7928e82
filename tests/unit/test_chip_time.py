"""The modelled time on the chip (pbsdk.core.plan.chip_time) and the DSE sweep's planning (pbsdk.dse): no IR."""

from __future__ import annotations

import itertools

import pytest
from pydantic import ValidationError

from pbsdk.core.errors import PbsdkError, SpecError
from pbsdk.core.plan.chip_time import clock_hz, model_time, modelled_time, unit_rate
from pbsdk.core.spec import load_spec
from pbsdk.dse import Vary, merge_reports, parse_vary, run_order, variants

NPU = load_spec("example/npu")  # 4 cores at 1 GHz; mxu 32x32x32 bf16 at 16.384 TFLOP/s chip-wide; dram 100 GB/s


def test_one_matrix_unit_instruction_takes_the_cycles_the_peak_implies():
    mxu = NPU.matrix_units[0]
    # 16.384 TFLOP/s over 4 cores, 65536 FLOP per instruction: one instruction per 16 cycles per core.
    assert unit_rate(NPU, mxu) == pytest.approx(1e9 / 16)
    t = model_time(NPU, {"matrix_unit:mxu": 4000}, cores=4)
    assert t.seconds == pytest.approx(1000 * 16e-9) and t.bound == "matrix_unit:mxu"
    assert t.matrix_unit_utilisation == pytest.approx(1.0)
    # On one core the same work takes four times as long.
    assert model_time(NPU, {"matrix_unit:mxu": 4000}, cores=1).seconds == pytest.approx(4 * t.seconds)


def test_i8_instructions_of_a_unit_sharing_its_name_use_the_i8_peak():
    i8 = model_time(NPU, {"matrix_unit:mxu": 100}, cores=1, unit_dtypes={"mxu": "i8"})
    bf16 = model_time(NPU, {"matrix_unit:mxu": 100}, cores=1, unit_dtypes={"mxu": "bf16"})
    # The i8 instruction does twice the MACs (k 64) at twice the peak: the same time per instruction.
    assert i8.seconds == pytest.approx(bf16.seconds)


def test_vector_elements_at_lanes_per_cycle():
    # 512-bit vector unit: 16 f32 lanes, one per cycle, 1 GHz.
    t = model_time(NPU, {"vector:spm": 16_000}, cores=1)
    assert t.seconds == pytest.approx(1e-6) and t.bound == "vector:spm"


def test_dma_with_several_channels_is_paced_by_the_busiest_port():
    # 4 dma channels per core: dram (100 GB/s, device-wide) serves 1 MB; spm (256 GB/s per core) 1 MB.
    t = model_time(NPU, {"bytes:dram->spm": 1_000_000}, cores=1)
    assert dict(t.terms)["dma:dram"] == pytest.approx(1e-5)
    assert dict(t.terms)["dma:spm"] == pytest.approx(1e6 / 256e9)
    assert t.dma_seconds == pytest.approx(1e-5) and t.bound == "dma:dram"


def test_one_dma_channel_serialises_transfers():
    one = NPU.model_copy(update={"compute": [NPU.compute[0].model_copy(update={"limits": {"dma_channels": 1}}),
                                             *NPU.compute[1:]]})
    t = model_time(one, {"bytes:dram->sram": 1_000_000, "bytes:sram->spm": 4_000_000}, cores=1)
    # dram->sram at dram's 100 GB/s, then sram->spm at the slower of sram (400) and spm (256 per core).
    assert t.dma_seconds == pytest.approx(1e6 / 100e9 + 4e6 / 256e9)
    assert {name for name, _ in t.terms} == {"dma:dram->sram", "dma:sram->spm"}


def test_double_buffering_overlaps_copies_with_compute():
    counters = {"matrix_unit:mxu": 4000, "bytes:dram->spm": 1_000_000}
    serial = model_time(NPU, counters, cores=4)
    overlapped = model_time(NPU, counters, cores=4, double_buffered=True)
    assert serial.seconds == pytest.approx(serial.compute_seconds + serial.dma_seconds)
    assert overlapped.seconds == pytest.approx(max(serial.compute_seconds, serial.dma_seconds))
    assert overlapped.seconds < serial.seconds


def test_more_bandwidth_is_faster_and_a_faster_clock_speeds_vector_work():
    counters = {"vector:spm": 100_000, "bytes:dram->spm": 1_000_000}
    base = model_time(NPU, counters, cores=4).seconds
    data = NPU.model_dump()
    data["memory"][0]["bandwidth_gbps"] = 200
    data["clock_ghz"] = 2.0
    faster = NPU.model_validate(data)
    assert model_time(faster, counters, cores=4).seconds < base


def test_a_spec_without_clock_takes_the_one_its_f32_peak_implies():
    no_clock = NPU.model_copy(update={"clock_ghz": None})
    assert clock_hz(no_clock) == pytest.approx(1e9)  # 0.128 TFLOP/s = 4 cores x 16 lanes x 2 x 1 GHz


def test_unknown_unit_counter_is_an_error_naming_it():
    with pytest.raises(ValueError, match="no matrix unit 'tpu'"):
        model_time(NPU, {"matrix_unit:tpu": 1})


def test_modelled_time_reads_cores_and_double_buffering_from_resources():
    resources = {"cores": 2, "double_buffered": True, "contractions": [{"unit": "mxu", "dtype": "f16"}]}
    t = modelled_time(NPU, {"matrix_unit:mxu": 10, "bytes:dram->spm": 10}, resources)
    assert t.cores == 2 and t.overlapped


def test_nothing_counted_is_zero_time():
    t = model_time(NPU, {})
    assert t.seconds == 0 and t.bound == "nothing" and t.matrix_unit_utilisation == 0


RVV_EDGE = load_spec("example/rvv-edge")  # cache-only: 4 cores at 1.5 GHz, 512-bit vectors, l1d 256 GB/s per core


def test_vector_instructions_issue_per_pipe_and_the_busiest_sets_the_time():
    counters = {"vector_op:fma": 3_000_000, "vector_op:addf": 600_000, "vector_op:broadcast": 500_000,
                "vector_op:load": 1_000_000, "vector_op:store": 200_000, "vector:l1d": 10**9}
    t = model_time(RVV_EDGE, counters, cores=2)
    terms = dict(t.terms)
    # FMAs and adds share the arithmetic pipe: 3.6 M at 1 per cycle on 2 cores of 1.5 GHz.
    assert terms["vector_op:arith"] == pytest.approx(3.6e6 / 3e9)
    assert terms["vector_op:load"] == pytest.approx(1.5e6 / 3e9)  # loads and broadcasts
    assert terms["vector_op:store"] == pytest.approx(0.2e6 / 3e9)
    # 1.2 M loads and stores of 64 bytes through l1d (256 GB/s a core, 2 cores); broadcasts not counted.
    assert terms["cache:l1d:vector"] == pytest.approx(1.2e6 * 64 / 512e9)
    # The elements counter counts the same work: it is not read when instructions are counted.
    assert "vector:l1d" not in terms
    assert t.compute_seconds == pytest.approx(3.6e6 / 3e9) and t.seconds == t.compute_seconds
    assert t.bound == "vector_op:arith"


def test_issue_rates_come_from_the_spec():
    counters = {"vector_op:fma": 4_000_000, "vector_op:load": 3_000_000, "vector_op:store": 2_000_000}
    base = model_time(RVV_EDGE, counters, cores=1)
    assert base.bound == "vector_op:arith" and base.seconds == pytest.approx(4e6 / 1.5e9)
    two_fma = RVV_EDGE.model_copy(update={"vector": RVV_EDGE.vector.model_copy(update={"fma_per_cycle": 2})})
    t = model_time(two_fma, counters, cores=1)  # now the load pipe is the busiest
    assert t.bound == "vector_op:load" and t.seconds == pytest.approx(3e6 / 1.5e9)
    narrow_store = RVV_EDGE.model_copy(update={"vector": RVV_EDGE.vector.model_copy(
        update={"fma_per_cycle": 4, "loads_per_cycle": 4})})
    assert model_time(narrow_store, counters, cores=1).bound == "vector_op:store"  # default 1 store a cycle
    with pytest.raises(ValidationError, match="store_per_cycle"):  # unknown keys stay errors
        RVV_EDGE.vector.model_validate({**RVV_EDGE.vector.model_dump(), "store_per_cycle": 2})
    assert RVV_EDGE.vector.model_validate({**RVV_EDGE.vector.model_dump(), "stores_per_cycle": 2}).stores_per_cycle == 2


def test_a_slow_innermost_cache_bounds_the_vector_loads():
    data = RVV_EDGE.model_dump()
    data["memory"][2]["bandwidth_gbps"] = 16  # l1d: 16 GB/s, a quarter of 64 B a cycle at 1.5 GHz
    slow = type(RVV_EDGE).model_validate(data)
    t = model_time(slow, {"vector_op:fma": 1000, "vector_op:load": 1000}, cores=1)
    assert t.bound == "cache:l1d:vector" and t.seconds == pytest.approx(64_000 / 16e9)


def test_cache_only_copies_stream_through_every_level_at_once():
    # Packing copies dram -> l1d and back: dram (25.6 GB/s, device-wide) serves both, l1d (256 per core) too.
    t = model_time(RVV_EDGE, {"bytes:dram->l1d": 2_560_000, "bytes:l1d->dram": 1_280_000}, cores=2)
    terms = dict(t.terms)
    assert terms["cache:dram"] == pytest.approx(3.84e6 / 25.6e9)
    assert terms["cache:l1d"] == pytest.approx(3.84e6 / 512e9)
    assert t.dma_seconds == pytest.approx(3.84e6 / 25.6e9) and t.bound == "cache:dram"
    assert not any(name.startswith("dma:") for name in terms)
    # Copies and vector work alternate unless double-buffered.
    both = model_time(RVV_EDGE, {"bytes:dram->l1d": 2_560_000, "vector_op:fma": 3_000_000}, cores=2)
    assert both.seconds == pytest.approx(2.56e6 / 25.6e9 + 3e6 / 3e9)


def test_elements_are_read_where_no_instruction_is_counted():
    t = model_time(RVV_EDGE, {"vector:l1d": 16 * 1_500_000}, cores=1)
    assert t.bound == "vector:l1d" and t.seconds == pytest.approx(1e-3)  # 16 lanes, 1 FMA a cycle, 1.5 GHz


# --------------------------------------------------------------------------------------------- dse

def test_parse_vary_reads_yaml_scalars():
    assert parse_vary("memory.spm.size_bytes=131072, 262144") == Vary("memory.spm.size_bytes", (131072, 262144))
    assert parse_vary("clock_ghz=1.5,2").values == (1.5, 2)
    for bad in ("clock_ghz", "=1,2", "clock_ghz=", "clock_ghz=1,1"):
        with pytest.raises(PbsdkError):
            parse_vary(bad)


def test_variants_are_every_combination_validated():
    vs = variants(NPU, [parse_vary("memory.spm.size_bytes=131072,262144"), parse_vary("clock_ghz=1,2")])
    assert [v.values for v in vs] == [
        (("memory.spm.size_bytes", 131072), ("clock_ghz", 1)), (("memory.spm.size_bytes", 131072), ("clock_ghz", 2)),
        (("memory.spm.size_bytes", 262144), ("clock_ghz", 1)), (("memory.spm.size_bytes", 262144), ("clock_ghz", 2))]
    assert [v.spec.memory_level("spm").size_bytes for v in vs] == [131072, 131072, 262144, 262144]
    assert vs[1].spec.clock_ghz == 2


@pytest.mark.parametrize("sizes", [(4, 4), (2, 8), (8, 2), (3,), (2, 3, 4), (1, 5), (5, 1, 3)])
def test_variants_start_so_that_those_in_flight_differ_in_every_field(sizes):
    order = run_order(sizes)
    assert sorted(order) == list(range(len(order)))            # every variant once
    grid = list(itertools.product(*(range(n) for n in sizes)))   # `variants`' order: index -> values
    # Within a turn of the field with the most values, neighbours differ in every field that has more than
    # one value (what matters when a field only prices the run: its variants share code, and started side
    # by side each would compile it).
    biggest = max(sizes)
    for r in range(len(order) - 1):
        if (r + 1) % biggest:
            a, b = grid[order[r]], grid[order[r + 1]]
            assert all(x != y for x, y, n in zip(a, b, sizes) if n > 1), (r, a, b)
    assert run_order([4, 4])[:4] == [0, 5, 10, 15]              # the diagonal first: 4 distinct values each
    with pytest.raises(PbsdkError, match="at least one value"):
        run_order([3, 0])


def test_a_named_matrix_unit_field_changes_every_form_of_the_unit():
    (v,) = variants(NPU, [parse_vary("matrix_units.mxu.m=16")])
    assert {u.m for u in v.spec.matrix_units} == {16}
    (v,) = variants(NPU, [parse_vary("compute.core.limits.dma_channels=1")])
    assert v.spec.compute[0].limits["dma_channels"] == 1


def test_an_invalid_variant_is_reported_not_raised():
    (v,) = variants(NPU, [parse_vary("memory.spm.size_bytes=-4")])
    assert v.spec is None and "size_bytes" in v.error


def test_a_field_that_does_not_exist_is_the_users_error():
    with pytest.raises(SpecError, match="no memory entry named 'l9'"):
        variants(NPU, [parse_vary("memory.l9.size_bytes=1")])
    with pytest.raises(SpecError, match="no field"):
        variants(NPU, [parse_vary("memory.spm.size=1")])
    with pytest.raises(PbsdkError, match="twice"):
        variants(NPU, [parse_vary("clock_ghz=1"), parse_vary("clock_ghz=2")])


def test_shard_reports_merge_in_variant_order():
    a = {"spec": "s", "model": "m", "vary": {"f": [1, 2, 3]}, "seconds": 1.0,
         "variants": [{"index": 0}, {"index": 2}]}
    b = {**a, "seconds": 2.0, "variants": [{"index": 1}]}
    merged = merge_reports([b, a])
    assert [r["index"] for r in merged["variants"]] == [0, 1, 2] and merged["seconds"] == 3.0
    with pytest.raises(PbsdkError, match="different sweeps"):
        merge_reports([a, {**b, "model": "other"}])


# ------------------------------------------------------------------------------- the program prediction

def test_program_prediction_adds_contractions_and_the_fused_loops():
    from pbsdk import ops
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.core.plan import Contraction, plan_contraction
    from pbsdk.core.plan.predict import predict_graph
    from pbsdk.frontends.jit import trace

    host = load_spec("avx512")
    graph, _ = trace(lambda a, b: ops.softmax(ops.matmul(a, b)),
                     (TensorType((512, 256), "f32"), TensorType((256, 1024), "f32")))
    p = predict_graph(graph, host, {"threads": 2})
    names = [n for n, _ in p.terms]
    assert names[0].endswith("matmul") and names[-1] == "fused loops"
    mm = plan_contraction(host, Contraction(512, 1024, 256), {"threads": 2}).estimate.seconds
    assert dict(p.terms)[names[0]] == pytest.approx(mm)
    assert p.seconds == pytest.approx(sum(s for _, s in p.terms))
    # Four times the rows: the fused loops predict more time, the matmul too.
    big, _ = trace(lambda a, b: ops.softmax(ops.matmul(a, b)),
                   (TensorType((2048, 256), "f32"), TensorType((256, 1024), "f32")))
    assert predict_graph(big, host, {"threads": 2}).seconds > p.seconds


def test_spearman_of_ranks():
    from pbsdk.bench import spearman

    assert spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
    assert spearman([1, 2, 3], [1, 1, 1]) is None and spearman([1, 2], [1, 2]) is None
    assert spearman([1, 2, 2, 3], [1, 2, 3, 4]) == pytest.approx(0.9486833, rel=1e-6)  # ties share ranks
