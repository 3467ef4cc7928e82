"""Fused attention against numpy (float64 reference) at f32, through the one comparison helper."""

from __future__ import annotations

import numpy as np
import pytest
from hf_masks import hf_attention
from hf_masks import reference as hf_reference

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref


def _rand(rng, *shape):
    return rng.standard_normal(shape).astype(np.float32)


def _check(out, expected, sk, d):
    assert_close(out, expected, op="attention", dtype="float32", reduction_size=sk + d)


def _fused(fn, *args, **opts):
    """Compile ``fn`` and check the attention really was fused (the kernel is in the emitted MLIR)."""
    jf = pbsdk.jit(fn, options=opts or None)
    text = jf.lower(*args)
    assert "__pbsdk_attn0" in text, "attention was not fused"
    return jf


# seq, head dim, causal: sequences that leave partial query vectors, partial key tiles and partial
# key blocks (1, 7, 1000), exact multiples (128) and both head dims.
CASES = [(1, 64, False), (7, 64, True), (7, 128, False), (128, 64, False), (128, 128, True), (1000, 64, True),
         (1000, 128, False)]


@pytest.mark.parametrize("seq,d,causal", CASES, ids=[f"s{s}-d{d}{'-causal' if c else ''}" for s, d, c in CASES])
def test_attention_matches_numpy(seq, d, causal):
    rng = np.random.default_rng(seq + d)
    q, k, v = (_rand(rng, 1, 2, seq, d) for _ in range(3))
    fn = _fused(lambda q, k, v: ops.attention(q, k, v, causal=causal), q, k, v)
    _check(fn(q, k, v), ref.attention(q, k, v, causal=causal, dtype=np.float32), seq, d)


def test_grouped_query_attention():
    rng = np.random.default_rng(1)
    q = _rand(rng, 2, 8, 33, 64)
    k, v = _rand(rng, 2, 2, 40, 64), _rand(rng, 2, 2, 40, 64)
    fn = _fused(lambda q, k, v: ops.attention(q, k, v), q, k, v)
    _check(fn(q, k, v), ref.attention(q, k, v, dtype=np.float32), 40, 64)


def test_additive_masks_full_and_padding():
    rng = np.random.default_rng(2)
    q, k, v = _rand(rng, 2, 3, 21, 64), _rand(rng, 2, 3, 45, 64), _rand(rng, 2, 3, 45, 64)
    full = _rand(rng, 2, 3, 21, 45)  # read with a gather across query lanes
    pad = np.zeros((2, 1, 1, 45), np.float32)
    pad[0, ..., 40:] = -np.inf  # padding keys of sequence 0
    pad[1, ..., :20] = -1e9  # left padding: a whole first key block masked for every query
    fn = _fused(lambda q, k, v, m, p: ops.attention(q, k, v, mask=m + p), q, k, v, full, pad)
    _check(fn(q, k, v, full, pad), ref.attention(q, k, v, mask=full + pad, dtype=np.float32), 45, 64)
    fp = _fused(lambda q, k, v, p: ops.attention(q, k, v, mask=p), q, k, v, pad)
    _check(fp(q, k, v, pad), ref.attention(q, k, v, mask=pad, dtype=np.float32), 45, 64)


def test_mask_contiguous_along_queries_and_causal_together():
    rng = np.random.default_rng(3)
    q, k, v = _rand(rng, 37, 64), _rand(rng, 37, 64), _rand(rng, 37, 64)
    mt = _rand(rng, 37, 37)  # given as (keys, queries): the mask operand is its transpose

    def f(q, k, v, mt):
        return ops.attention(q, k, v, causal=True, mask=ops.transpose(mt))
    fn = _fused(f, q, k, v, mt)
    _check(fn(q, k, v, mt), ref.attention(q, k, v, causal=True, mask=mt.T, dtype=np.float32), 37, 64)


def test_hand_written_attention_with_strided_operands():
    # (B, S, H, D) activations transposed to heads, K given as (B, H, D, S), V of another head dim.
    rng = np.random.default_rng(4)
    x, kt, v = _rand(rng, 2, 19, 4, 32), _rand(rng, 2, 4, 32, 23), _rand(rng, 2, 4, 23, 48)

    def f(x, kt, v):
        q = ops.transpose(x, (0, 2, 1, 3))
        s = ops.matmul(q, kt) / np.float32(np.sqrt(32.0))
        return ops.softmax(s, axis=-1) @ v
    fn = _fused(f, x, kt, v)
    expected = ref.attention(np.transpose(x, (0, 2, 1, 3)), np.swapaxes(kt, -1, -2), v, dtype=np.float32)
    _check(fn(x, kt, v), expected, 23, 32)


def test_unfused_option_gives_the_same_result():
    rng = np.random.default_rng(5)
    q, k, v = (_rand(rng, 1, 2, 50, 64) for _ in range(3))
    fused = _fused(lambda q, k, v: ops.attention(q, k, v, causal=True), q, k, v)
    plain = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v, causal=True), options={"fuse_attention": False})
    assert "__pbsdk_attn" not in plain.lower(q, k, v)
    assert_close(fused(q, k, v), plain(q, k, v), op="attention", dtype="float32", reduction_size=50 + 64)


def test_large_scores_do_not_overflow():
    rng = np.random.default_rng(6)
    q, k, v = (_rand(rng, 1, 30, 64) * 6 for _ in range(3))
    fn = _fused(lambda q, k, v: ops.attention(q, k, v, scale=1.0), q, k, v)
    _check(fn(q, k, v), ref.attention(q, k, v, scale=1.0, dtype=np.float32), 30, 64)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True])
def test_attention_4096(causal):
    rng = np.random.default_rng(7)
    q, k, v = (_rand(rng, 1, 2, 4096, 64) for _ in range(3))
    fn = _fused(lambda q, k, v: ops.attention(q, k, v, causal=causal), q, k, v)
    _check(fn(q, k, v), ref.attention(q, k, v, causal=causal, dtype=np.float32), 4096, 64)


# transformers' masks (tests/attention/hf_masks.py): proven causal, read as a mask, or a causal offset whose
# empty first row torch's safe softmax zeroes; the packed-sequence mask is read and zeroes nothing.
HF_CASES = {"causal": ({}, False), "off-by-one": ({"offset": -1}, False), "window": ({"window": 5}, False),
            "packed": ({}, True)}


@pytest.mark.parametrize("case", list(HF_CASES))
def test_transformers_masks_match_their_definition(case):
    mask, packed = HF_CASES[case]
    s = 21
    positions = [*range(9), *range(s - 9)] if packed else list(range(s))
    rng = np.random.default_rng(5)
    q, k, v = (_rand(rng, 1, 2, s, 32) for _ in range(3))
    fn = _fused(hf_attention(s, positions, **mask), q, k, v)
    out = fn(q, k, v)
    _check(out, hf_reference(q, k, v, positions, **mask).astype(np.float32), s, 32)
    if mask.get("offset", 0) < 0:
        assert (out[..., 0, :] == 0).all()  # row 0 sees no key


def test_a_padding_mask_of_finite_lowest_values_is_uniform_where_every_key_is_masked():
    """BERT adds finfo(f32).min at padded keys: a row whose keys are all padded is a uniform average (as in
    torch and numpy), not NaN; a row with any unpadded key ignores the padded ones."""
    rng = np.random.default_rng(6)
    q, k, v = (_rand(rng, 3, 2, 19, 64) for _ in range(3))
    pad = np.zeros((3, 1, 1, 19), np.float32)
    pad[0, ..., 11:] = np.finfo(np.float32).min
    pad[1] = np.finfo(np.float32).min  # every key padded
    pad[2, ..., :5] = -np.inf
    fn = _fused(lambda q, k, v, m: ops.attention(q, k, v, mask=m), q, k, v, pad)
    out = fn(q, k, v, pad)
    _check(out, ref.attention(q, k, v, mask=pad, dtype=np.float32), 19, 64)
    np.testing.assert_allclose(out[1], np.broadcast_to(v[1].mean(axis=-2, keepdims=True), out[1].shape), rtol=1e-5,
                               atol=1e-6)


def test_a_padding_mask_materialised_over_the_queries_is_read_one_row_per_key():
    """BERT's mask computed on (B, 1, S, S) from a (B, 1, 1, S) row (recognised as repeating rows, so read
    at row stride 0) gives the same result as the full mask."""
    rng = np.random.default_rng(7)
    s = 23
    q, k, v = (_rand(rng, 2, 2, s, 64) for _ in range(3))
    pad = np.ones((2, 1, 1, s), np.float32)
    pad[0, ..., 15:] = 0
    lowest = float(np.finfo(np.float32).min)

    def f(q, k, v, pad):
        inv = 1.0 - ops.broadcast_to(pad, (2, 1, s, s))
        return ops.attention(q, k, v, mask=ops.where(ops.not_equal(inv, 0.0), ops._const(lowest, "f32"), inv))
    fn = _fused(f, q, k, v, pad)
    mask = np.where(1 - pad != 0, lowest, 1 - pad).astype(np.float32)
    _check(fn(q, k, v, pad), ref.attention(q, k, v, mask=mask, dtype=np.float32), s, 64)


# ----------------------------------------------------------------------------- keys along the lanes (few queries)

def _keys_form(fn, *args):
    """Compile ``fn`` and check its attention is fused in the ``along="keys"`` form (`keys_along_lanes`)."""
    jf = _fused(fn, *args)
    assert 'along = "keys"' in jf.lower(*args), "attention was not planned with keys along the lanes"
    return jf


# queries, keys: one key, less than / exactly / more than one vector of keys, several vectors with a partial last
# (queries: at most half a vector of 8 lanes, so that even AVX2 plans keys along the lanes)
DECODE = [(1, 1), (1, 15), (1, 16), (1, 17), (3, 100), (4, 33)]


@pytest.mark.parametrize("sq,sk", DECODE, ids=[f"q{q}-k{k}" for q, k in DECODE])
def test_few_queries_with_keys_along_the_lanes(sq, sk):
    rng = np.random.default_rng(sq * 100 + sk)
    q, k, v = _rand(rng, 2, 3, sq, 64), _rand(rng, 2, 3, sk, 64), _rand(rng, 2, 3, sk, 64)
    fn = _keys_form(lambda q, k, v: ops.attention(q, k, v), q, k, v)
    _check(fn(q, k, v), ref.attention(q, k, v, dtype=np.float32), sk, 64)


def test_keys_along_the_lanes_causal_grouped_and_masked():
    rng = np.random.default_rng(11)
    q = _rand(rng, 2, 8, 3, 64)  # three queries at the end of 37 keys: causal offset 34
    k, v = _rand(rng, 2, 2, 37, 64), _rand(rng, 2, 2, 37, 64)
    pad = np.zeros((2, 1, 1, 37), np.float32)
    pad[0, ..., 30:] = -np.inf  # the last keys of sequence 0 are padding
    pad[1, ..., :17] = -1e9  # left padding past one vector of keys
    per_query = _rand(rng, 2, 8, 3, 37)
    fc = _keys_form(lambda q, k, v: ops.attention(q, k, v, causal=True), q, k, v)
    _check(fc(q, k, v), ref.attention(q, k, v, causal=True, dtype=np.float32), 37, 64)
    fm = _keys_form(lambda q, k, v, m, p: ops.attention(q, k, v, mask=m + p), q, k, v, per_query, pad)
    _check(fm(q, k, v, per_query, pad), ref.attention(q, k, v, mask=per_query + pad, dtype=np.float32), 37, 64)


def test_keys_along_the_lanes_strided_operands_and_odd_head_sizes():
    # K given as (B, H, D, S) (a gather along d), V of another head size, neither a multiple of the lanes, and a
    # mask given as (keys, queries) (a gather along the keys).
    rng = np.random.default_rng(12)
    q, kt, v = _rand(rng, 2, 4, 2, 40), _rand(rng, 2, 4, 40, 29), _rand(rng, 2, 4, 29, 24)
    mt = _rand(rng, 29, 2)

    def f(q, kt, v, mt):
        s = ops.matmul(q, kt) / np.float32(np.sqrt(40.0)) + ops.transpose(mt)
        return ops.softmax(s, axis=-1) @ v
    fn = _keys_form(f, q, kt, v, mt)
    expected = ref.attention(q, np.swapaxes(kt, -1, -2), v, mask=mt.T, dtype=np.float32)
    _check(fn(q, kt, v, mt), expected, 29, 40)


def test_keys_along_the_lanes_large_scores_do_not_overflow():
    rng = np.random.default_rng(13)
    q, k, v = _rand(rng, 1, 2, 1, 64) * 30, _rand(rng, 1, 2, 70, 64) * 30, _rand(rng, 1, 2, 70, 64)
    fn = _keys_form(lambda q, k, v: ops.attention(q, k, v), q, k, v)
    out = fn(q, k, v)
    assert np.isfinite(out).all()
    _check(out, ref.attention(q, k, v, dtype=np.float32), 70, 64)
