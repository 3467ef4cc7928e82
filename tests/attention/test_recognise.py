"""Recognising attention in traced graphs (no MLIR): what matches, its strides, and what is refused."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hf_masks import hf_attention, safe_softmax

from pbsdk import ops
from pbsdk.core.ir.attention import causal_offset, find_attention
from pbsdk.core.ir.graph import TensorType
from pbsdk.frontends.jit import trace


def _graph(fn, *shapes):
    graph, _ = trace(fn, tuple(TensorType(tuple(s), "f32") for s in shapes))
    return graph


def _one(fn, *shapes):
    why: list[str] = []
    found = find_attention(_graph(fn, *shapes), why)
    assert len(found) == 1, why
    return found[0]


def test_ops_attention_is_recognised_with_its_scale():
    m = _one(lambda q, k, v: ops.attention(q, k, v), (2, 4, 10, 16), (2, 4, 12, 16), (2, 4, 12, 8))
    assert (m.op.batch, m.op.sq, m.op.sk, m.op.d, m.op.dv) == (8, 10, 12, 16, 8)
    assert m.scale == pytest.approx(0.25) and not m.op.causal and m.mask is None
    # Contiguous (B, H, S, D) operands: row stride D, column stride 1, batch factors over B and H.
    assert (m.q.row_stride, m.q.col_stride) == (16, 1)
    assert (m.k.row_stride, m.k.col_stride) == (16, 1)
    assert m.v.row_stride == 8
    assert [(s, st) for s, st, _ in m.q.batch] == [(2, 640), (4, 160)]


def test_hand_written_pattern_with_division_and_transposed_k():
    def f(q, k, v):
        s = ops.matmul(q, ops.transpose(k, (0, 2, 1))) / 8.0
        return ops.softmax(s, axis=-1) @ v
    m = _one(f, (3, 5, 64), (3, 7, 64), (3, 7, 64))
    assert m.scale == pytest.approx(1 / 8) and m.k.row_stride == 64 and m.k.col_stride == 1


def test_k_given_transposed_is_read_with_swapped_strides():
    def f(q, kt, v):  # kt: (B, D, Sk)
        return ops.softmax(ops.matmul(q, kt) * 0.5, -1) @ v
    m = _one(f, (2, 6, 32), (2, 32, 9), (2, 9, 32))
    assert (m.k.row_stride, m.k.col_stride) == (1, 9)


def test_unshifted_softmax_is_recognised():
    def f(q, k, v):
        e = ops.exp(ops.matmul(q, k, transpose_b=True))
        return (e / ops.sum(e, -1, keepdims=True)) @ v
    m = _one(f, (4, 16), (5, 16), (5, 16))
    assert m.op.batch == 1 and m.scale == 1.0


def test_grouped_query_heads_are_zero_strides():
    m = _one(lambda q, k, v: ops.attention(q, k, v), (1, 8, 10, 16), (1, 2, 10, 16), (1, 2, 10, 16))
    assert m.op.kv_groups == 4
    # Heads h = 4 * g + j read K/V head g: the group's factor has stride 0.
    assert [(s, st) for s, st, _ in m.k.batch] == [(2, 160), (4, 0)]
    assert [(s, st) for s, st, _ in m.q.batch] == [(8, 160)]


def test_gqa_by_matmul_broadcasting():
    def f(q, k, v):  # q (B, Hkv, G, S, D), k (B, Hkv, 1, S, D)
        return ops.softmax(ops.matmul(q, k, transpose_b=True), -1) @ v
    m = _one(f, (1, 2, 3, 4, 8), (1, 2, 1, 6, 8), (1, 2, 1, 6, 8))
    assert m.op.batch == 6 and m.op.kv_groups == 3


def test_causal_mask_is_recognised_not_read():
    m = _one(lambda q, k, v: ops.attention(q, k, v, causal=True), (1, 2, 9, 8), (1, 2, 9, 8), (1, 2, 9, 8))
    assert m.op.causal_offset == 0 and m.mask is None


def test_constant_additive_causal_mask_with_offset():
    sq, sk = 4, 7
    bias = np.where(np.arange(sk)[None, :] > np.arange(sq)[:, None] + 3, -np.inf, 0.0).astype(np.float32)
    m = _one(lambda q, k, v: ops.softmax(ops.matmul(q, k, transpose_b=True) + bias, -1) @ v,
             (sq, 8), (sk, 8), (sk, 8))
    assert m.op.causal_offset == 3 and m.mask is None


def test_additive_mask_input_and_its_strides():
    def f(q, k, v, mask):
        return ops.attention(q, k, v, mask=mask)
    m = _one(f, (2, 3, 5, 8), (2, 3, 6, 8), (2, 3, 6, 8), (2, 1, 1, 6))  # a padding mask over keys
    assert m.mask is not None and m.op.mask
    assert (m.mask.row_stride, m.mask.col_stride) == (0, 1)
    assert [(s, st) for s, st, _ in m.mask.batch] == [(2, 6), (3, 0)]


def test_mask_before_scale_is_scaled_too():
    def f(q, k, v, mask):
        return ops.softmax((ops.matmul(q, k, transpose_b=True) + mask) * 0.5, -1) @ v
    m = _one(f, (4, 8), (4, 8), (4, 8), (4, 4))
    assert m.scale == 0.5 and m.mask_scale == 0.5

    def g(q, k, v, mask):  # scale first, then the mask: the mask is not scaled
        return ops.softmax(ops.matmul(q, k, transpose_b=True) * 0.5 + mask, -1) @ v
    m = _one(g, (4, 8), (4, 8), (4, 8), (4, 4))
    assert m.scale == 0.5 and m.mask_scale == 1.0


def test_probabilities_used_elsewhere_are_not_fused():
    def f(q, k, v):
        p = ops.softmax(ops.matmul(q, k, transpose_b=True), -1)
        return p @ v, p
    assert find_attention(_graph(f, (4, 8), (4, 8), (4, 8))) == []


def test_scores_used_elsewhere_are_not_fused():
    def f(q, k, v):
        s = ops.matmul(q, k, transpose_b=True)
        return ops.softmax(s, -1) @ v, s
    why: list[str] = []
    assert find_attention(_graph(f, (4, 8), (4, 8), (4, 8)), why) == [] and why


def test_softmax_over_the_wrong_axis_is_not_attention():
    f = lambda q, k, v: ops.softmax(ops.matmul(q, k, transpose_b=True), 0) @ v
    assert find_attention(_graph(f, (4, 8), (4, 8), (4, 8))) == []


def test_negative_scale_is_not_fused():
    f = lambda q, k, v: ops.softmax(ops.matmul(q, k, transpose_b=True) * -1.0, -1) @ v
    assert find_attention(_graph(f, (4, 8), (4, 8), (4, 8))) == []


def test_covered_nodes_exclude_views_used_outside():
    def f(q, k, v):
        kt = ops.transpose(k, (1, 0))
        return ops.softmax(ops.matmul(q, kt), -1) @ v, kt
    g = _graph(f, (4, 8), (5, 8), (5, 8))
    (m,) = find_attention(g)
    assert g.outputs[1].id not in m.covered and g.outputs[0].id in m.covered


def test_a_view_chain_read_outside_is_kept_whole():
    """A decoder with its cache: the key's reshape and transpose feed the attention and are also the cache's
    output. The transpose read outside is kept, and so is the reshape it reads (else the emitter meets a
    value the fused kernel never makes: KeyError 'value', GPT-2 with use_cache=True)."""
    import pbsdk

    def f(q, k, v):
        heads = ops.transpose(ops.reshape(k, (5, 2, 4)), (1, 0, 2))  # (2, 5, 4): the cache's "present" key
        scores = ops.matmul(q, ops.transpose(heads, (0, 2, 1)))
        return ops.softmax(scores, -1) @ v, heads

    g = _graph(f, (2, 3, 4), (5, 8), (2, 5, 4))
    (m,) = find_attention(g)
    heads = g.outputs[1]
    reshape = next(n for n in g.live_nodes() if n.out.id == next(
        x.id for x in next(n for n in g.live_nodes() if n.out.id == heads.id).inputs))
    assert heads.id not in m.covered and reshape.out.id not in m.covered
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal(s).astype(np.float32) for s in ((2, 3, 4), (5, 8), (2, 5, 4)))
    out, present = pbsdk.jit(f)(q, k, v)
    kh = k.reshape(5, 2, 4).transpose(1, 0, 2)
    sc = q @ kh.transpose(0, 2, 1)
    p = np.exp(sc - sc.max(-1, keepdims=True))
    np.testing.assert_allclose(out, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(present, kh)


@pytest.mark.parametrize("off", [-2, 0, 3, 10])
def test_causal_offset_detection(off):
    sq, sk = 6, 8
    masked = np.arange(sk)[None, :] > np.arange(sq)[:, None] + off
    got = causal_offset(masked)
    if masked.any():
        assert got == off
    else:
        assert got == sk - 1


def test_non_causal_pattern_is_refused():
    masked = np.zeros((4, 4), bool)
    masked[0, 2] = True
    assert causal_offset(masked) is None
    assert not math.isnan(0.0)


@pytest.mark.parametrize("dtype, s", [("f16", 4096), ("bf16", 512)])
def test_causal_positions_past_the_dtypes_exact_integers(dtype, s):
    """ops.attention compares positions in f32, so its causal mask stays exact (and fused) where the scores'
    dtype cannot count that far."""
    graph, _ = trace(lambda q, k, v: ops.attention(q, k, v, causal=True),
                     tuple(TensorType((1, s, 16), dtype) for _ in range(3)))
    why: list[str] = []
    (m,) = find_attention(graph, why)
    assert m.op.causal and m.op.causal_offset == 0


def test_a_mask_rounded_by_its_dtype_is_not_called_causal():
    """Positions built in bf16 collide past 256 (257 rounds to 256): the kernel's mask is not causal there,
    so the recogniser must not fuse it as if it were."""
    def f(q, k, v):
        s = ops.matmul(q, k, transpose_b=True)
        rows = ops._const(np.arange(512.0).reshape(512, 1), "bf16")  # what ops.attention once built
        cols = ops._const(np.arange(512.0).reshape(1, 512), "bf16")
        return ops.softmax(ops.where(ops.greater(cols, rows), -math.inf, s), -1) @ v
    graph, _ = trace(f, tuple(TensorType((512, 16), "bf16") for _ in range(3)))
    why: list[str] = []
    assert find_attention(graph, why) == []


# ------------------------------------------------------------------ masks as transformers builds them

S = 12
QKV = ((1, 2, S, 8),) * 3


def test_transformers_causal_mask_is_proven_causal():
    m = _one(hf_attention(S, range(S)), *QKV)
    assert m.op.causal_offset == 0 and m.mask is None and not m.op.safe_softmax


@pytest.mark.parametrize("offset", [-1, 1])
def test_an_off_by_one_mask_gets_its_own_offset(offset):
    """``kv < q`` masks the diagonal (row 0 sees nothing): causal offset -1, whose empty row the safe softmax
    zeroes; ``kv <= q + 1`` sees one key ahead. Neither is the ordinary causal mask."""
    m = _one(hf_attention(S, range(S), offset=offset), *QKV)
    assert m.op.causal_offset == offset and m.mask is None
    assert m.op.safe_softmax == (offset < 0)


def test_a_sliding_window_is_read_as_a_mask_not_called_causal():
    m = _one(hf_attention(S, range(S), window=4), *QKV)
    assert m.op.causal_offset is None and m.mask is not None and m.op.mask


def test_packed_sequences_are_not_causal():
    """Two sequences packed in one row (position ids restart): the mask is block-diagonal causal, built by the
    very ops of the causal case; only its values tell them apart."""
    m = _one(hf_attention(S, [*range(S // 2), *range(S // 2)]), *QKV)
    assert m.op.causal_offset is None and m.mask is not None and m.op.safe_softmax


def test_a_runtime_padding_mask_under_a_safe_softmax_is_read_and_zeroes_empty_rows():
    def f(q, k, v, pad):  # BERT's extended mask: where(1 - m != 0, finfo.min, 1 - m) over (B, 1, 1, S)
        inv = 1.0 - pad
        mask = ops.where(ops.not_equal(inv, 0.0), ops._const(float(np.finfo(np.float32).min), "f32"), inv)
        x = ops.matmul(q, k, transpose_b=True) * 0.25 + mask
        return ops.matmul(safe_softmax(x), v)
    m = _one(f, (2, 2, S, 8), (2, 2, S, 8), (2, 2, S, 8), (2, 1, 1, S))
    assert m.op.mask and m.op.safe_softmax and m.op.causal_offset is None
    assert (m.mask.row_stride, m.mask.col_stride) == (0, 1)


def test_a_mask_added_after_a_batch_reshape_is_read_through_it():
    """BERT's graph: Q·Kᵀ as a 3-D (B·H, S, S) matmul, reshaped to (B, H, S, S) before the (B, 1, S, S) mask."""
    def f(q, k, v, mask):
        s = ops.reshape(ops.matmul(q, k, transpose_b=True), (2, 3, S, S)) + mask
        return ops.matmul(ops.reshape(ops.softmax(s, -1), (6, S, S)), v)
    m = _one(f, (6, S, 8), (6, S, 8), (6, S, 8), (2, 1, S, S))
    assert m.op.batch == 6 and m.mask is not None
    assert [(s, st) for s, st, _ in m.mask.batch] == [(2, S * S), (3, 0)] and m.mask.row_stride == S


def _bert_mask(pad):
    """BERT's extended mask: ``m`` expanded over the queries, then ``where(1 - m != 0, finfo.min, 1 - m)``."""
    inv = 1.0 - ops.broadcast_to(pad, pad.shape[:-2] + (S, S))
    return ops.where(ops.not_equal(inv, 0.0), ops._const(float(np.finfo(np.float32).min), "f32"), inv)


def test_a_mask_computed_on_rows_that_repeat_is_read_one_row_per_key():
    """The mask is materialised as (B, 1, S, S), but every query row is the same elementwise function of one
    broadcast row: the kernel reads one value per key (row stride 0) instead of gathering across queries."""
    def f(q, k, v, pad):
        return ops.attention(q, k, v, mask=_bert_mask(pad))
    m = _one(f, (2, 2, S, 8), (2, 2, S, 8), (2, 2, S, 8), (2, 1, 1, S))
    assert (m.mask.row_stride, m.mask.col_stride) == (0, 1)
    assert [(s, st) for s, st, _ in m.mask.batch] == [(2, S * S), (2, 0)]


def test_a_mask_whose_rows_differ_keeps_its_row_stride():
    def f(q, k, v, pad, noise):  # one input varies along the queries: no row may stand for the others
        return ops.attention(q, k, v, mask=_bert_mask(pad) + noise)
    m = _one(f, (2, 2, S, 8), (2, 2, S, 8), (2, 2, S, 8), (2, 1, 1, S), (2, 1, S, 1))
    assert m.mask.row_stride == S

    def g(q, k, v, pad):  # a constant that differs between rows
        return ops.attention(q, k, v, mask=_bert_mask(pad) + np.arange(S, dtype=np.float32).reshape(S, 1))
    m = _one(g, (2, 2, S, 8), (2, 2, S, 8), (2, 2, S, 8), (2, 1, 1, S))
    assert m.mask.row_stride == S
