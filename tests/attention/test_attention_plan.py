"""The attention planner on specs alone (no IR): decisions follow the spec."""

from __future__ import annotations

import pytest

from pbsdk.core.plan.attention import Attention, format_attention_plan, plan_attention
from pbsdk.core.spec import load_spec

OP = Attention(batch=8, sq=1024, sk=1024, d=64, dv=64)


def _with_l1(spec, size):
    memory = [m.model_copy(update={"size_bytes": size}) if i == len(spec.memory) - 1 else m
              for i, m in enumerate(spec.memory)]
    return spec.model_copy(update={"memory": memory})


def test_host_plan_is_fused_and_fits_registers_and_cache():
    spec = load_spec("intel/xeon-avx512")
    plan = plan_attention(spec, OP)
    assert plan.fused
    assert plan.lanes == 16
    regs = spec.vector.registers
    assert plan.qk_keys * plan.q_vectors + plan.q_vectors + 1 <= regs
    assert plan.pv_cols * plan.q_vectors + plan.q_vectors + 1 <= regs
    assert plan.footprint_bytes <= plan.budget_bytes
    assert plan.block_k % plan.qk_keys == 0
    assert plan.threads == 2 and plan.work_items == 8 * plan.q_blocks
    assert plan.score_bytes_unfused == 8 * 1024 * 1024 * 4


def test_smaller_cache_gives_smaller_tiles():
    spec = load_spec("intel/xeon-avx512")
    big = plan_attention(spec, OP)
    half = plan_attention(_with_l1(spec, spec.memory[-1].size_bytes // 2), OP)
    # Half the L1: Qt and Ot of a 32-query block no longer fit next to scores, the query block halves.
    assert half.fused and half.block_q < big.block_q
    assert half.block_q * half.block_k < big.block_q * big.block_k
    assert half.footprint_bytes <= half.budget_bytes < big.budget_bytes
    # A bit less L1 (same query block): the key block shrinks.
    less = plan_attention(_with_l1(spec, spec.memory[-1].size_bytes * 7 // 8), OP)
    assert less.block_q == big.block_q and less.block_k < big.block_k


def test_fewer_registers_give_smaller_register_tiles():
    spec = load_spec("intel/xeon-avx512")
    vec = spec.vector.model_copy(update={"registers": 16})
    plan = plan_attention(spec.model_copy(update={"vector": vec}), OP)
    assert plan.fused
    assert plan.qk_keys * plan.q_vectors + plan.q_vectors + 1 <= 16
    assert plan.qk_keys < plan_attention(spec, OP).qk_keys


def test_narrower_vectors_change_lanes():
    spec = load_spec("intel/xeon-avx512")
    vec = spec.vector.model_copy(update={"width_bits": 256})
    plan = plan_attention(spec.model_copy(update={"vector": vec}), OP)
    assert plan.lanes == 8 and plan.block_q == plan.q_vectors * 8


def test_causal_skips_masked_tiles():
    spec = load_spec("intel/xeon-avx512")
    full = plan_attention(spec, OP)
    causal = plan_attention(spec, Attention(8, 1024, 1024, 64, 64, causal_offset=0))
    assert full.tiles_computed == full.tiles_total
    assert causal.tiles_total == full.tiles_total
    assert causal.tiles_computed < 0.6 * causal.tiles_total
    assert causal.estimate.seconds < full.estimate.seconds
    assert OP.flops == 2 * 8 * 1024 * 1024 * 128
    assert 0.49 < causal.op.flops / OP.flops < 0.51


def test_option_disables_fusion():
    plan = plan_attention(load_spec("intel/xeon-avx512"), OP, {"fuse_attention": False})
    assert not plan.fused and "fuse_attention" in plan.reasons[0]


def test_gpu_spec_without_vector_unit_is_not_fused():
    plan = plan_attention(load_spec("nvidia/h100"), OP)
    assert not plan.fused and "vector" in plan.reasons[0]


def test_half_precision_is_left_unfused():
    plan = plan_attention(load_spec("intel/xeon-avx512"), Attention(1, 16, 16, 64, 64, dtype="f16"))
    assert not plan.fused and "f16" in plan.reasons[0]


def test_short_sequence_uses_one_query_vector():
    plan = plan_attention(load_spec("intel/xeon-avx512"), Attention(4, 1, 200, 128, 128))
    assert plan.fused and plan.q_vectors == 1 and plan.q_blocks == 1


def test_threads_option_and_work_items():
    spec = load_spec("intel/xeon-avx512")
    assert plan_attention(spec, OP, {"threads": 1}).threads == 1
    assert plan_attention(spec, Attention(1, 16, 16, 64, 64)).threads == 1  # one work item (a block of 16 queries)


def test_explain_text_names_the_decisions():
    text = format_attention_plan("attn", plan_attention(load_spec("intel/xeon-avx512"), OP))
    for word in ("online softmax", "key block", "never stored", "estimate", "l1d"):
        assert word in text


def test_empty_dimension_is_rejected():
    from pbsdk.core.errors import UnsupportedError

    with pytest.raises(UnsupportedError):
        Attention(1, 0, 4, 4, 4)


def test_cli_explain_attention(capsys):
    from pbsdk.cli import main

    assert main(["explain", "--attention", "8", "512", "512", "64", "--causal", "--spec", "intel/xeon-avx512"]) == 0
    out = capsys.readouterr().out
    assert "causal offset 0" in out and "key block" in out
    assert main(["explain", "--attention", "8", "0", "4", "4"]) == 2
    assert "empty dimension" in capsys.readouterr().err


def test_few_queries_run_with_keys_along_the_lanes():
    from pbsdk.core.plan.attention import UnitChoice, keys_along_lanes

    spec = load_spec("zen4")
    decode = plan_attention(spec, Attention(batch=12, sq=1, sk=200, d=64, dv=64))
    assert decode.fused and decode.along == "keys" and decode.work_items == 12
    assert decode.block_k == decode.lanes == 16 and decode.q_vectors == 1 and decode.pv_cols == 4
    assert "keys along 16 f32 lanes" in decode.reasons[0]
    assert "one query a work item" in format_attention_plan("attention #0", decode)
    # A block of queries fills the lanes: queries along them, as before.
    assert plan_attention(spec, OP).along == "queries"
    # The crossing follows the counts: d = dv = 64 on 16 lanes, ~13 ops per key and query against ~144 per
    # vector of queries, so 11 queries still go along the keys and 12 do not; on 8 lanes (AVX2) 6 and not 7.
    op = Attention(batch=1, sq=11, sk=64, d=64, dv=64)
    assert keys_along_lanes(spec, op, 16)[0]
    assert not keys_along_lanes(spec, Attention(batch=1, sq=12, sk=64, d=64, dv=64), 16)[0]
    assert not keys_along_lanes(spec, Attention(1, 7, 64, 64, 64), 8)[0]
    assert keys_along_lanes(spec, Attention(1, 6, 64, 64, 64), 8)[0]
    assert not keys_along_lanes(spec, op, 12)[0]  # not a power of two: no folding by halves
    # A bf16 unit halves the queries form's products (pairs of d per instruction): fewer queries cross over.
    unit = UnitChoice("vdpbf16ps", 1, 16, 2, "bf16", "f32")
    bf16 = Attention(batch=1, sq=7, sk=64, d=64, dv=64, dtype="bf16")
    assert keys_along_lanes(spec, bf16, 16)[0] and not keys_along_lanes(spec, bf16, 16, unit, True)[0]
