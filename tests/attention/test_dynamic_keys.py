"""Fused attention over a key length known only at run time (issue #31 item 2): the planner (pure), the
recogniser on pbsdk graphs with a symbolic key length, and one compiled kernel run at many key lengths
against numpy, plain, GQA and with a runtime additive mask, decode (one query) included. The torch path
(``mark_dynamic`` on SDPA through ``torch.compile(backend="pbsdk")``) is in
tests/frontends/test_torch_dynamic.py."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from pbsdk import ops
from pbsdk.core.dims import Dim
from pbsdk.core.ir.attention import find_attention
from pbsdk.core.ir.graph import TensorType
from pbsdk.core.plan.attention import PLANNING_KEYS, Attention, format_attention_plan, plan_attention
from pbsdk.core.spec import load_spec
from pbsdk.targets.cpu.pack_contractions import lowers_unit
from pbsdk.testing import assert_close, tolerance
from pbsdk.testing import reference as ref

S0 = Dim.parse("s0")
#: Key lengths: one key, a partial register tile, around a tile of 16, a partial key block, several blocks.
KEYS = (1, 2, 15, 16, 17, 100, 513)


def _rand(rng: np.random.Generator, *shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


# ----------------------------------------------------------------------------------------- planner (pure)

@pytest.mark.parametrize("sq", [1, 32])  # keys along the lanes (a decode step), a block of queries
def test_a_dynamic_key_length_is_planned_for_a_size_range(sq: int) -> None:
    spec = load_spec("zen4")
    dynamic = plan_attention(spec, Attention(8, sq, S0, 64, 64), {"threads": 1})
    large = plan_attention(spec, Attention(8, sq, PLANNING_KEYS, 64, 64), {"threads": 1})
    assert dynamic.fused and dynamic.op.sk == S0
    assert dynamic.along == large.along == ("keys" if sq == 1 else "queries")
    # The key block comes from the cache budget alone (as for a long static sequence), not from the unknown sk.
    assert (dynamic.block_k, dynamic.q_vectors, dynamic.qk_keys, dynamic.pv_cols) == \
        (large.block_k, large.q_vectors, large.qk_keys, large.pv_cols)
    assert "known only at run time" in dynamic.reasons[0] and f"{PLANNING_KEYS} keys" in dynamic.reasons[0]
    if sq > 1:  # a short static sequence clamps its block to the keys it has; the dynamic plan cannot
        assert plan_attention(spec, Attention(8, sq, 5, 64, 64), {"threads": 1}).block_k < dynamic.block_k
    assert dynamic.estimate is not None and large.estimate is not None
    assert dynamic.estimate.seconds == pytest.approx(large.estimate.seconds)
    text = format_attention_plan("attention #0", dynamic)
    assert "[s0x64]" in text and "key length s0 read at run time" in text and f"at {PLANNING_KEYS} keys" in text


def test_forms_and_patterns_refused_over_a_dynamic_key_length() -> None:
    causal = plan_attention(load_spec("zen4"), Attention(8, 4, S0 + 3, 64, 64, causal_offset=3))
    assert not causal.fused and "causal pattern" in causal.reasons[0]
    scratch = plan_attention(load_spec("npu"), Attention(8, 1, S0, 64, 64))
    assert not scratch.fused and "scratchpad kernel is planned and emitted for static sizes" in scratch.reasons[0]


# ----------------------------------------------------------------------------------------- recogniser

def _graph(fn: Any, *shapes: tuple[int | Dim, ...], dtype: str = "f32") -> Any:
    from pbsdk.frontends.jit import trace

    graph, _ = trace(fn, tuple(TensorType(s, dtype) for s in shapes))
    return graph


def test_the_recogniser_reads_strides_of_the_key_length() -> None:
    # GQA: 8 query heads over 2 K/V heads of a (2, 2, s0, 16) cache; a (2, 1, 1, s0) additive mask.
    graph = _graph(lambda q, k, v, m: ops.attention(q, k, v, mask=m),
                   (2, 8, 1, 16), (2, 2, S0, 16), (2, 2, S0, 16), (2, 1, 1, S0))
    why: list[str] = []
    (m,) = find_attention(graph, why)
    assert not why and m.op.sk == S0 and m.op.kv_groups == 4 and m.op.mask and m.op.sq == 1
    assert m.k.batch == ((2, 32 * S0, 8), (2, 16 * S0, 4), (4, 0, 1)) and m.k.row_stride == 16
    assert m.mask is not None and m.mask.batch == ((2, S0, 8), (8, 0, 1)) and m.mask.row_stride == 0


def test_the_recogniser_refuses_other_dynamic_sizes_with_a_reason() -> None:
    why: list[str] = []
    graph = _graph(lambda q, k, v: ops.attention(q, k, v), (1, 2, S0, 16), (1, 2, S0, 16), (1, 2, S0, 16))
    assert find_attention(graph, why) == [] and any("only the key length" in w for w in why), why
    why.clear()
    graph = _graph(lambda q, k, v: ops.attention(q, k, v), (1, 2, 1, 16), (1, 2, 2 * S0, 16), (1, 2, 2 * S0, 16))
    assert find_attention(graph, why) == [] and any("not one symbol plus a constant" in w for w in why), why


# ----------------------------------------------------------------------------------------- numerics

def _compile(fn: Any, *shapes: tuple[int | Dim, ...], dtype: str = "f32", threads: int = 1) -> tuple[Any, str]:
    """``fn`` traced on ``dtype`` inputs of ``shapes`` and compiled once for the host at ``threads``; the
    kernel and the emitted module's text."""
    from pbsdk.core.compiler import compile_text, resolve
    from pbsdk.core.ir.emit import emit_program
    from pbsdk.core.runtime.kernel import Kernel

    request = resolve("cpu", None, {"threads": threads})
    program = emit_program(_graph(fn, *shapes, dtype=dtype), spec=request.spec, options=request.options,
                           forms=request.target.attention_forms)
    artifact = compile_text(program.text, request, constants=program.constants)
    return Kernel(artifact, request.target.load(artifact, request.spec), name=artifact.entry), program.text


def _check(out: np.ndarray, expected: np.ndarray, sk: int, d: int) -> None:
    assert_close(out, expected, op="attention", dtype="float32", reduction_size=sk + d)


@pytest.mark.parametrize("sq", [1, 5])
def test_one_kernel_for_every_key_length(sq: int) -> None:
    kernel, text = _compile(lambda q, k, v: ops.attention(q, k, v), (1, 8, sq, 64), (1, 8, S0, 64), (1, 8, S0, 64))
    assert "func.func private @__pbsdk_attn0(memref<1x8x" + str(sq) + "x64xf32>, memref<1x8x?x64xf32>" in text
    rng = np.random.default_rng(sq)
    for sk in KEYS:
        q, k, v = _rand(rng, 1, 8, sq, 64), _rand(rng, 1, 8, sk, 64), _rand(rng, 1, 8, sk, 64)
        _check(kernel(q, k, v), ref.attention(q, k, v, dtype=np.float32), sk, 64)


def test_a_full_mask_read_at_a_row_stride_of_the_key_length() -> None:
    # 5 queries and a (1, 2, 5, s0) mask: its rows are s0 apart, gathered across the query lanes at offsets
    # computed from the key length at run time.
    kernel, text = _compile(lambda q, k, v, m: ops.attention(q, k, v, mask=m), (1, 2, 5, 64), (1, 2, S0, 64),
                            (1, 2, S0, 64), (1, 2, 5, S0))
    assert "@__pbsdk_attn0(" in text and 'row_stride = "s0"' in text
    rng = np.random.default_rng(3)
    for sk in KEYS:
        q, k, v, m = _rand(rng, 1, 2, 5, 64), _rand(rng, 1, 2, sk, 64), _rand(rng, 1, 2, sk, 64), _rand(rng, 1, 2, 5, sk)
        _check(kernel(q, k, v, m), ref.attention(q, k, v, mask=m, dtype=np.float32), sk, 64)


@pytest.mark.parametrize("threads", [1, 2])
def test_grouped_query_decode_with_a_runtime_mask(threads: int) -> None:
    # A decode step: 1 query, 8 heads over 2 K/V heads of a cache s0 + 1 long (the cache and the new key
    # concatenated in the graph), a padding mask added at run time; the same kernel for every length.
    def step(q: Any, kc: Any, vc: Any, kn: Any, vn: Any, m: Any) -> Any:
        k, v = ops.concatenate([kc, kn], axis=2), ops.concatenate([vc, vn], axis=2)
        return ops.attention(q, k, v, mask=m)

    kernel, text = _compile(step, (2, 8, 1, 32), (2, 2, S0, 32), (2, 2, S0, 32), (2, 2, 1, 32), (2, 2, 1, 32),
                            (2, 1, 1, S0 + 1), threads=threads)  # 2: the work items forked over two cores
    assert "@__pbsdk_attn0(memref<2x8x1x32xf32>, memref<2x2x?x32xf32>" in text
    rng = np.random.default_rng(7)
    for sk in KEYS:
        n = sk - 1 if sk > 1 else 1
        q = _rand(rng, 2, 8, 1, 32)
        kc, vc, kn, vn = _rand(rng, 2, 2, n, 32), _rand(rng, 2, 2, n, 32), _rand(rng, 2, 2, 1, 32), _rand(rng, 2, 2, 1, 32)
        mask = np.zeros((2, 1, 1, n + 1), np.float32)
        mask[1, ..., : (n + 1) // 3] = -np.inf  # left padding of sequence 1
        k, v = np.concatenate([kc, kn], 2), np.concatenate([vc, vn], 2)
        _check(kernel(q, kc, vc, kn, vn, mask), ref.attention(q, k, v, mask=mask, dtype=np.float32), n + 1, 32)



@pytest.mark.skipif(not lowers_unit(load_spec("host"), "vdpbf16ps"), reason="the host has no AVX512-BF16 (vdpbf16ps)")
def test_bf16_operands_on_the_unit_over_a_dynamic_key_length() -> None:
    # GQA, 3 queries, bf16 Q, K and V read narrow: Q·Kᵀ and P·V on vdpbf16ps, V packed in key pairs per block
    # (an odd key count leaves a lone last pair).
    import ml_dtypes

    kernel, text = _compile(lambda q, k, v: ops.attention(q, k, v), (1, 8, 3, 64), (1, 2, S0, 64), (1, 2, S0, 64),
                            dtype="bf16")
    assert "@__pbsdk_attn0(memref<1x8x3x64xbf16>, memref<1x2x?x64xbf16>" in text
    rng = np.random.default_rng(11)
    for sk in KEYS:
        q, k, v = (rng.standard_normal(s).astype(ml_dtypes.bfloat16) for s in ((1, 8, 3, 64), (1, 2, sk, 64),
                                                                               (1, 2, sk, 64)))
        expected = ref.attention(*(x.astype(np.float64) for x in (q, k, v)), dtype=np.float64)
        assert_close(np.asarray(kernel(q, k, v)).astype(np.float64), expected, op="attention",
                     tol=tolerance("attention", "bfloat16"))
