"""Attention masks as transformers 4.57 builds them, written with pbsdk.ops (for tests/attention): what its
ATen graphs convert to after Dynamo and AOTAutograd, so the recogniser is tested on the same op shapes
without importing transformers."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from pbsdk import ops


def hf_logits(q: Any, k: Any, s: int, positions: Iterable[int], *, offset: int = 0, window: int | None = None) -> Any:
    """Scores plus the mask transformers 4.57 builds for SDPA (masking_utils: vmap'd mask functions), in the
    ops its ATen graph converts to: the packed-sequence index (``diff`` of the position ids, ``!= 1``,
    ``cumsum``) gathered per query and key with ``take``, the causal compare ``kv <= q + offset`` (and a
    sliding window ``kv > q - window``), and'ed with an all-ones padding row and the same-sequence test,
    added as ``where(allowed, 0, -inf)``."""
    pos = ops._const(np.asarray(list(positions), np.float64).reshape(1, s), "f64")
    cat = ops.concatenate([ops.slice(pos, 1, 0, 1) - 1.0, pos], axis=1)
    diff = ops.slice(cat, 1, 1, s + 1) - ops.slice(cat, 1, 0, s)
    packed = ops.reshape(ops.cumsum(ops.not_equal(diff, 1.0), axis=-1), (s,))
    idx = ops._const(np.arange(s, dtype=np.float64), "f64")
    same = ops.equal(ops.reshape(ops.take(packed, idx), (s, 1)), ops.reshape(ops.take(packed, idx), (1, s)))
    qi = ops._const(np.arange(s, dtype=np.float64).reshape(s, 1), "f64")
    kj = ops._const(np.arange(s, dtype=np.float64).reshape(1, s), "f64")
    allowed = ops.astype(ops.less_equal(kj, qi + float(offset)), "f32")
    if window is not None:
        allowed = ops.bitwise_and(allowed, ops.astype(ops.greater(kj, qi - float(window)), "f32"))
    padding = ops._const(np.ones((s, 1)), "f32")
    allowed = ops.bitwise_and(ops.bitwise_and(padding, allowed), ops.astype(same, "f32"))
    bias = ops.where(allowed, ops._const(0.0, "f32"), ops._const(-np.inf, "f32"))
    return ops.matmul(q, k, transpose_b=True) * 0.25 + ops.reshape(bias, (1, 1, s, s))


def safe_softmax(x: Any) -> Any:
    """torch's ``_safe_softmax`` as AOT decomposes it: rows whose logits are all -inf give 0."""
    empty = ops.equal(ops.max(ops.not_equal(x, -np.inf), axis=-1, keepdims=True), 0.0)
    return ops.where(empty, ops._const(0.0, "f32"), ops.softmax(x, -1))


def hf_attention(s: int, positions: Iterable[int], **mask: Any) -> Callable[..., Any]:
    """``safe_softmax(hf_logits(q, k)) @ v``."""
    return lambda q, k, v: ops.matmul(safe_softmax(hf_logits(q, k, s, positions, **mask)), v)


def reference(q: np.ndarray, k: np.ndarray, v: np.ndarray, positions: Iterable[int], *, offset: int = 0,
              window: int | None = None) -> np.ndarray:
    """`hf_attention` in float64 numpy, from the mask's definition (not its ops): key j is seen by query i when
    both are in one packed sequence, ``j <= i + offset`` and ``j > i - window``; rows that see no key give 0."""
    pos = np.asarray(list(positions))
    seq = np.cumsum(np.diff(pos, prepend=pos[0] - 1) != 1)
    i, j = np.arange(len(pos))[:, None], np.arange(len(pos))[None, :]
    allowed = (seq[:, None] == seq[None, :]) & (j <= i + offset) & ((j > i - window) if window is not None else True)
    x = np.where(allowed, np.matmul(q.astype(np.float64), np.swapaxes(k, -1, -2)) * 0.25, -np.inf)
    with np.errstate(invalid="ignore"):
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        p = np.where(allowed.any(axis=-1)[:, None], e / e.sum(axis=-1, keepdims=True), 0.0)
    return np.matmul(p, v.astype(np.float64))
