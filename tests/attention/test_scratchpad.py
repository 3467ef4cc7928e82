"""Fused attention on chips with a software-managed innermost memory (the ``"scratchpad"`` schedule).

Planner checks need no IR; the numerics run on the `template` target, which emulates the scratchpad
and the matrix unit and counts every byte moved between levels: the counters must show that only Q,
K, V (and the mask) came in and only O went out — the score matrix never left the scratchpad."""

from __future__ import annotations

import math

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.plan.attention import Attention, format_attention_plan, plan_attention
from pbsdk.core.spec import load_spec
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

NPU = "example/npu"


def _with_spm(spec, size):
    memory = [m.model_copy(update={"size_bytes": size}) if i == len(spec.memory) - 1 else m
              for i, m in enumerate(spec.memory)]
    return spec.model_copy(update={"memory": memory})


# ------------------------------------------------------------------------------------------ planner

def test_npu_f16_plan_uses_the_matrix_unit_and_fits_the_scratchpad():
    spec = load_spec(NPU)
    plan = plan_attention(spec, Attention(8, 1024, 1024, 64, 64, "f16"))
    t = plan.tiles
    assert plan.fused and plan.schedule == "scratchpad" and t is not None
    assert t.unit is not None and (t.unit.name, t.unit.m, t.unit.n, t.unit.k) == ("mxu", 32, 32, 32)
    assert t.block_q % 32 == 0 and t.block_k % 32 == 0
    assert t.level == "spm" and t.space == 2
    assert t.footprint_bytes <= t.capacity_bytes == 262144
    assert plan.threads == 4 and plan.work_items >= 4
    names = {b[0] for b in t.buffers}
    assert {"Qs", "Ks", "Vs", "S", "P", "O", "Oo"} <= names  # P and the output rounded to f16 in the scratchpad


def test_f32_on_the_npu_runs_both_matmuls_on_the_vector_unit():
    plan = plan_attention(load_spec(NPU), Attention(8, 1024, 1024, 64, 64, "f32"))
    assert plan.fused and plan.tiles.unit is None
    assert plan.block_q % 16 == 0  # 16 f32 lanes
    assert "vector unit" in plan.reasons[0]


def test_smaller_scratchpad_gives_smaller_tiles():
    spec = load_spec(NPU)
    op = Attention(8, 1024, 1024, 64, 64, "f16")
    big, small = plan_attention(spec, op), plan_attention(_with_spm(spec, 65536), op)
    assert small.fused and small.tiles.footprint_bytes <= 65536
    assert small.block_q * small.block_k < big.block_q * big.block_k


def test_too_small_scratchpad_is_refused_with_the_reason():
    plan = plan_attention(_with_spm(load_spec(NPU), 4096), Attention(1, 128, 128, 64, 64, "f16"))
    assert not plan.fused and "spm" in plan.reasons[0] and "cannot hold" in plan.reasons[0]


def test_gpu_plan_skips_units_that_would_pad_the_head_dim():
    plan = plan_attention(load_spec("nvidia/h100"), Attention(8, 1024, 1024, 64, 64, "f16"))
    assert plan.fused and plan.tiles.unit.name.startswith("mma.sync")
    assert "wgmma" in plan.reasons[0]
    assert plan.tiles.footprint_bytes <= 232448  # the opt-in shared memory


def test_query_block_leaves_every_core_work():
    plan = plan_attention(load_spec(NPU), Attention(1, 128, 128, 64, 64, "f16"))
    assert plan.work_items >= 4


def test_target_without_the_form_runs_unfused():
    plan = plan_attention(load_spec(NPU), Attention(1, 128, 128, 64, 64, "f16"), forms=("lanes",))
    assert not plan.fused and "scratchpad" in plan.reasons[0]


def test_explain_names_the_unit_and_the_scratchpad():
    text = format_attention_plan("a", plan_attention(load_spec(NPU), Attention(2, 300, 300, 128, 128, "f16", 0)))
    assert "mxu (32x32x32 f16->f32)" in text and "in spm" in text and "never stored" in text


# ---------------------------------------------------------------------- numerics and counters (template)

def _moves_and_units(counters: dict[str, int]) -> dict[str, int]:
    """The byte and matrix-unit counters (the vector unit's element counts are checked apart)."""
    return {k: v for k, v in counters.items() if not k.startswith("vector:")}


def _expected_counters(plan, mask: bool) -> dict[str, int]:
    """What the kernel must move and issue, recomputed from the plan: Q once per work item, K and V (and
    the mask) once per computed key block, O once; unit ops for the unpadded rows and keys."""
    op, t = plan.op, plan.tiles
    eb = 2 if op.dtype == "f16" else 4
    into = out = units = 0
    for _ in range(op.batch):
        for q0 in range(0, op.sq, t.block_q):
            rows = min(t.block_q, op.sq - q0)
            into += rows * op.d * eb
            out += rows * op.dv * eb
            kend = op.keys_for(q0 + rows)
            for j0 in range(0, kend, t.block_k):
                cols = min(t.block_k, kend - j0)
                into += cols * (op.d + op.dv) * eb + (rows * cols * eb if mask else 0)
                if t.unit is not None:
                    u = t.unit
                    mt = -(-rows // u.m)
                    units += mt * -(-cols // u.n) * (t.d_padded // u.k) + mt * (t.dv_padded // u.n) * -(-cols // u.k)
    counters = {"bytes:dram->spm": into, "bytes:spm->dram": out}
    if t.unit is not None:
        counters[f"matrix_unit:{t.unit.name}"] = units
    return counters


CASES = [  # dtype, seq, head dim, causal
    ("f32", 1, 64, False), ("f32", 7, 128, True), ("f32", 128, 64, True), ("f16", 1, 64, False),
    ("f16", 7, 64, True), ("f16", 128, 128, False), ("f16", 1000, 64, True), ("f32", 1000, 128, False),
]


@pytest.mark.parametrize("dtype,seq,d,causal", CASES,
                         ids=[f"{t}-s{s}-d{d}{'-causal' if c else ''}" for t, s, d, c in CASES])
def test_template_fused_attention_matches_numpy_and_keeps_scores_on_chip(dtype, seq, d, causal):
    npdt = np.float16 if dtype == "f16" else np.float32
    rng = np.random.default_rng(seq + d)
    q, k, v = (rng.standard_normal((1, 2, seq, d)).astype(npdt) for _ in range(3))
    jf = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v, causal=causal), target="template")
    assert "pbsdk.attention" in jf.lower(q, k, v)
    out = jf(q, k, v)
    expected = ref.attention(*(x.astype(np.float32) for x in (q, k, v)), causal=causal, dtype=np.float32)
    assert out.dtype == npdt
    assert_close(out, expected, op="attention", dtype=np.dtype(npdt).name, reduction_size=seq + d)
    plan = plan_attention(load_spec(NPU), Attention(2, seq, seq, d, d, dtype, 0 if causal else None))
    counters = jf.kernel(jf._signature((q, k, v)))[0].executable.last_counters
    assert _moves_and_units(counters) == _expected_counters(plan, mask=False)
    assert counters["vector:spm"] > 0  # the online-softmax update runs on the vector unit
    assert counters["bytes:spm->dram"] == out.nbytes  # only O leaves the scratchpad


def test_template_grouped_query_attention_with_mask():
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 4, 45, 64)).astype(np.float16)
    k, v = (rng.standard_normal((1, 2, 70, 64)).astype(np.float16) for _ in range(2))
    mask = rng.standard_normal((1, 1, 45, 70)).astype(np.float16)
    mask[..., 60:] = -np.inf  # padding keys
    jf = pbsdk.jit(lambda q, k, v, m: ops.attention(q, k, v, mask=m), target="template")
    out = jf(q, k, v, mask)
    f32 = [x.astype(np.float32) for x in (q, k, v, mask)]
    expected = ref.attention(*f32[:3], mask=f32[3], dtype=np.float32)
    assert_close(out, expected, op="attention", dtype="float16", reduction_size=70 + 64)
    plan = plan_attention(load_spec(NPU), Attention(4, 45, 70, 64, 64, "f16", None, True, 2))
    counters = jf.kernel(jf._signature((q, k, v, mask)))[0].executable.last_counters
    assert _moves_and_units(counters) == _expected_counters(plan, mask=True)
    assert counters["vector:spm"] > 0  # the online-softmax update runs on the vector unit


def test_template_fusion_can_be_disabled_and_then_moves_the_scores():
    rng = np.random.default_rng(4)
    q, k, v = (rng.standard_normal((1, 2, 64, 64)).astype(np.float16) for _ in range(3))
    fused = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v), target="template")
    unfused = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v), target="template",
                        options={"fuse_attention": False})
    a, b = fused(q, k, v), unfused(q, k, v)
    np.testing.assert_allclose(a.astype(np.float32), b.astype(np.float32), atol=5e-3)
    out_f = fused.kernel(fused._signature((q, k, v)))[0].executable.last_counters
    out_u = unfused.kernel(unfused._signature((q, k, v)))[0].executable.last_counters
    scores = 2 * 64 * 64 * 2  # the f16 score matrix of both heads
    moved_out = sum(n for name, n in out_u.items() if name.startswith("bytes:") and name.endswith("->dram"))
    assert moved_out >= scores + a.nbytes > out_f["bytes:spm->dram"] == a.nbytes
    assert math.isfinite(float(a.astype(np.float32).sum()))
