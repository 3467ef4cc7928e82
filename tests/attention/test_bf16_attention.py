"""bf16 fused attention on the host's bf16 unit (``vdpbf16ps``): the planner's choice from the spec alone (no
IR), the recogniser's narrow match of an attention the graph computes in f32 on widened bf16 operands (torch's
decomposed bf16 SDPA) with the f32 match as its fallback, and the kernel against a float64 reference
through the one comparison helper, at the table's bf16 attention tolerance."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text
from pbsdk.core.ir.attention import find_attention, planned_attention
from pbsdk.core.plan.attention import Attention, format_attention_plan, plan_attention
from pbsdk.core.spec import load_spec
from pbsdk.frontends.jit import trace
from pbsdk.targets.cpu.pack_contractions import lowers_unit
from pbsdk.testing import assert_close, cannot_run, tolerance
from pbsdk.testing import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)
ZEN4 = load_spec("amd/zen4")  # AVX512-BF16: vdpbf16ps, 1 x 16 x 2
NO_UNIT = load_spec("intel/xeon-avx512")  # AVX-512 without a bf16 unit
HOST_UNIT = lowers_unit(load_spec("host"), "vdpbf16ps")
needs_unit = pytest.mark.skipif(not HOST_UNIT, reason="the host has no AVX512-BF16 (vdpbf16ps): the kernel's IR is "
                                "checked by tests/ir/cpu-attention-bf16.mlir")
OP = Attention(12, 256, 256, 64, 64, "bf16", widened=True)


# ------------------------------------------------------------------------------------------- planner

def test_a_bf16_attention_is_planned_on_the_specs_bf16_unit():
    plan = plan_attention(ZEN4, OP)
    assert plan.fused and plan.schedule == "lanes"
    assert plan.unit is not None and (plan.unit.name, plan.unit.m, plan.unit.n, plan.unit.k) == ("vdpbf16ps", 1, 16, 2)
    assert plan.p_dtype == "bf16"  # the result is bf16: P rounded, P·V on the unit too
    regs = ZEN4.vector.registers  # accumulators + Q vectors + two broadcasts in flight
    assert plan.qk_keys * plan.q_vectors + plan.q_vectors + 2 <= regs
    assert plan.pv_cols * plan.q_vectors + plan.q_vectors + 2 <= regs
    assert plan.block_k % 2 == 0 and plan.footprint_bytes <= plan.budget_bytes
    # Cheaper than the f32 kernel on the same spec: both matmuls at twice the flops per instruction.
    f32 = plan_attention(ZEN4, Attention(12, 256, 256, 64, 64))
    assert f32.unit is None and plan.estimate.seconds < 0.75 * f32.estimate.seconds
    text = format_attention_plan("x", plan)
    assert "widened to f32 by the graph" in text and "Q·Kᵀ on vdpbf16ps (1x16x2 bf16->f32)" in text
    assert "P rounded to bf16, P·V on vdpbf16ps" in text


def test_an_f32_result_keeps_p_in_f32():
    plan = plan_attention(ZEN4, Attention(12, 256, 256, 64, 64, "bf16", widened=True, out_dtype="f32"))
    assert plan.fused and plan.unit is not None and plan.p_dtype == "f32"
    assert "P·V as f32 FMAs" in format_attention_plan("x", plan)
    # A graph computing bf16 itself (its P is bf16): rounded even with an f32 output.
    assert plan_attention(ZEN4, Attention(12, 256, 256, 64, 64, "bf16", out_dtype="f32")).p_dtype == "bf16"


@pytest.mark.parametrize("spec,options,why", [
    (NO_UNIT, None, "no bf16 matrix unit in the vector registers of spec 'intel/xeon-avx512'"),
    (ZEN4, {"matrix_units": False}, "matrix units disabled by option matrix_units=False"),
    (load_spec("example/npu"), None, "widened to f32 by the graph: the scratchpad kernel computes in one dtype"),
])
def test_without_a_unit_a_bf16_attention_is_not_fused_and_says_why(spec, options, why):
    plan = plan_attention(spec, OP, options)
    assert not plan.fused and why in plan.reasons[0]


def test_the_query_block_grows_to_share_the_packing_of_v():
    # One query vector would pack V's key pairs for 16 queries only: the planner takes more (measured 1.3x).
    assert plan_attention(ZEN4, OP).q_vectors > 1
    # A short sequence is one vector whatever the packing costs (lanes past it would be wasted).
    assert plan_attention(ZEN4, Attention(2, 7, 9, 63, 63, "bf16")).q_vectors == 1


# ------------------------------------------------------------------------------------------- recogniser

def _widened(causal=False, mask=False, out="bf16"):
    """Attention in f32 on bf16 operands widened by the graph, rounded back to ``out`` (torch's decomposition)."""
    def f(q, k, v, *m):
        y = ops.attention(ops.astype(q, "f32"), ops.astype(k, "f32"), ops.astype(v, "f32"), causal=causal,
                          mask=m[0] if mask else None)
        return ops.astype(y, out) if out != "f32" else y
    return f


def _graph(fn, *args):
    graph, _ = trace(fn, pbsdk.jit(fn)._signature(args))
    return graph


def test_the_narrow_match_reads_bf16_and_keeps_the_f32_one_as_fallback():
    q = np.zeros((1, 2, 40, 64), BF16)
    (m,) = find_attention(_graph(_widened(causal=True), q, q, q))
    assert (m.op.dtype, m.op.out_dtype, m.op.widened, m.op.causal_offset) == ("bf16", "bf16", True, 0)
    assert m.q.base.dtype == m.k.base.dtype == m.v.base.dtype == "bf16" and m.out.dtype == "bf16"
    assert m.widened is not None and m.widened.op.dtype == "f32" and m.widened.q.base.dtype == "f32"
    # Planned where the unit is; on a spec without one the f32 kernel reads the widened copies (as before).
    ((mz, pz),) = planned_attention(_graph(_widened(causal=True), q, q, q), ZEN4)
    assert pz.fused and pz.unit is not None and mz.op.dtype == "bf16"
    ((mx, px),) = planned_attention(_graph(_widened(causal=True), q, q, q), NO_UNIT)
    assert px.fused and px.unit is None and mx.op.dtype == "f32"
    assert px.reasons[0].startswith("bf16 operands widened to f32 by the graph: not read narrow")


def test_the_mask_is_read_narrow_and_an_f32_result_stays_f32():
    q, mk = np.zeros((1, 2, 40, 64), BF16), np.zeros((1, 1, 40, 40), BF16)
    (m,) = find_attention(_graph(lambda q, k, v, m: _widened(mask=True, out="f32")(q, k, v, ops.astype(m, "f32")),
                                 q, q, q, mk))
    assert (m.op.dtype, m.op.out_dtype, m.op.mask_dtype, m.mask.base.dtype) == ("bf16", "f32", "bf16", "bf16")


# ------------------------------------------------------------------------------------------- kernel

def _check(out, q, k, v, **kw):
    expected = ref.attention(*(x.astype(np.float64) for x in (q, k, v)), dtype=np.float64, **kw)
    assert_close(np.asarray(out).astype(np.float64), expected, op="attention", tol=tolerance("attention", "bfloat16"))


def _rand(rng, *shape, dtype=BF16):
    return rng.standard_normal(shape).astype(dtype)


def _fused_bf16(fn, *args, **options):
    """``fn`` compiled; its attention fused on bf16 operands (the declaration takes bf16 Q, K, V) and no f32
    copy of them made (no widening in the entry function)."""
    jf = pbsdk.jit(fn, options=options or None)
    text = jf.lower(*args)
    decl = next(line for line in text.splitlines() if "func.func private @__pbsdk_attn0(" in line)
    assert decl.count("xbf16>") >= 3, decl[:200]
    entry = text[text.index("func.func @main"):]
    assert "arith.extf" not in entry, "an f32 copy of an operand is made"
    return jf


# seq q, seq k, head dim, causal: partial query vectors and blocks, odd keys (a lone last key pair), an odd head dim
# (a lone last d pair), one query, long sequences over several key blocks.
CASES = [(40, 40, 64, False), (37, 37, 64, True), (7, 9, 63, False), (1, 50, 64, False), (300, 300, 128, True),
         (1000, 1000, 64, False)]


@needs_unit
@pytest.mark.parametrize("sq,sk,d,causal", CASES, ids=[f"q{a}-k{b}-d{c}{'-causal' if e else ''}" for a, b, c, e in CASES])
def test_bf16_attention_on_the_unit_matches_float64(sq, sk, d, causal):
    rng = np.random.default_rng(sq + sk + d)
    q, k, v = _rand(rng, 1, 3, sq, d), _rand(rng, 1, 3, sk, d), _rand(rng, 1, 3, sk, d)
    fn = _fused_bf16(_widened(causal=causal), q, k, v)
    out = fn(q, k, v)
    assert out.dtype == BF16
    _check(out, q, k, v, causal=causal)


@needs_unit
def test_grouped_query_masks_and_threads():
    rng = np.random.default_rng(1)
    q, k, v = _rand(rng, 2, 8, 33, 64), _rand(rng, 2, 2, 45, 64), _rand(rng, 2, 2, 45, 64)
    full = _rand(rng, 2, 8, 33, 45)  # bf16, read narrow with a gather across query lanes
    pad = np.zeros((2, 1, 1, 45), np.float32)  # f32, one row per key
    pad[0, ..., 40:] = -np.inf
    pad[1, ..., :20] = np.finfo(np.float32).min

    for threads in (1, 2):
        fn = pbsdk.jit(lambda q, k, v, m: _widened(mask=True)(q, k, v, ops.astype(m, "f32")),
                       options={"threads": threads})
        _check(fn(q, k, v, full), q, k, v, mask=full.astype(np.float64))
    fp = pbsdk.jit(lambda q, k, v, p: _widened(mask=True)(q, k, v, p))
    _check(fp(q, k, v, pad), q, k, v, mask=pad.astype(np.float64))


@needs_unit
def test_an_f32_result_is_as_accurate_as_the_f32_kernel():
    """P stays f32 where the graph keeps an f32 result: the f32 tolerance holds, not only bf16's."""
    rng = np.random.default_rng(2)
    q, k, v = (_rand(rng, 1, 2, 70, 64) for _ in range(3))
    fn = _fused_bf16(_widened(causal=True, out="f32"), q, k, v)
    out = fn(q, k, v)
    assert out.dtype == np.float32
    expected = ref.attention(*(x.astype(np.float64) for x in (q, k, v)), causal=True, dtype=np.float64)
    assert_close(out, expected, op="attention", dtype="float32", reduction_size=70 + 64)


@needs_unit
def test_a_graph_computing_bf16_itself_is_fused_on_the_unit():
    """pbsdk.ops.attention on bf16 arrays (bf16 matmuls accumulated in f32): fused too (it was not before)."""
    rng = np.random.default_rng(3)
    q, k, v = (_rand(rng, 1, 2, 50, 64) for _ in range(3))
    fn = _fused_bf16(lambda q, k, v: ops.attention(q, k, v, causal=True), q, k, v)
    _check(fn(q, k, v), q, k, v, causal=True)


def test_a_spec_whose_code_cannot_issue_the_unit_gets_fma_kernels():
    """The plan names vdpbf16ps but the spec's machine code lacks AVX512-BF16: the cpu target's attention stage
    builds both matmuls on vector FMAs on the widened operands (and the result is still right)."""
    feats = ",".join(f for f in ZEN4.codegen["features"].split(",") if f != "+avx512bf16")
    spec = ZEN4.model_copy(update={"codegen": {**ZEN4.codegen, "features": feats}})
    rng = np.random.default_rng(4)
    q, k, v = (_rand(rng, 1, 2, 37, 64) for _ in range(3))
    jf = pbsdk.jit(_widened(causal=True), spec=spec)
    text = str(compile_text(jf.lower(q, k, v), jf.request, stop_after="attention"))
    part = text[text.index("func.func private @__pbsdk_attn0_part"):]
    assert "llvm.call_intrinsic" not in part and "vector.fma" in part and "arith.extf" in part
    if cannot_run(spec) is None:  # the code runs where the host has the rest of Zen 4's AVX-512
        _check(jf(q, k, v), q, k, v, causal=True)
