"""The data-movement and mask ops the framework bridges need (``pbsdk.ops``: comparisons, ``where``,
``slice``, ``concatenate``, ``take``), against numpy. No torch needed."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.errors import PbsdkError
from pbsdk.testing import Tolerance, assert_close

EXACT = Tolerance(0.0, 0.0)
rng = np.random.default_rng(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.float16])
def test_compare_and_where(dtype: type) -> None:
    x = rng.standard_normal((3, 5)).astype(dtype)
    y = rng.standard_normal((1, 5)).astype(dtype)
    x[0, 0] = np.nan

    @pbsdk.jit
    def f(a, b):
        return (ops.equal(a, b), ops.not_equal(a, a), ops.less(a, b), ops.less_equal(a, 0.5),
                ops.greater(a, b), ops.greater_equal(a, b), ops.where(ops.less(a, b), a, b * 2.0))

    got = f(x, y)
    with np.errstate(invalid="ignore"):
        want = [x == y, np.not_equal(x, x), x < y, x <= 0.5, x > y, x >= y]
    for g, w in zip(got[:6], want):
        assert_close(g, w.astype(dtype), op="maximum", tol=EXACT)
    assert_close(got[6], np.where(x < y, x, y * dtype(2.0)), op="mul")


def test_where_with_constant_condition_broadcasts() -> None:
    x = rng.standard_normal((4, 4)).astype(np.float32)
    mask = np.tril(np.ones((4, 4), bool))

    @pbsdk.jit
    def f(a):
        return ops.where(mask, a, -np.inf)

    assert_close(f(x), np.where(mask, x, -np.inf).astype(np.float32), op="maximum", tol=EXACT)


def test_slice_concatenate_take() -> None:
    x = rng.standard_normal((4, 6, 5)).astype(np.float32)
    idx = np.array([[3, 0], [1, 9], [-2, 2]], np.float64)  # out of range: clipped like numpy mode="clip"

    @pbsdk.jit
    def f(a, i):
        return (ops.slice(a, 1, 1, None, 2), ops.slice(a, -1, -3, -1), ops.concatenate([a, a * 2.0], axis=1),
                ops.take(a, i, axis=0), ops.take(a, i, axis=2), ops.take(a, np.array([1, 1, 0]), axis=1))

    s1, s2, c, t0, t2, t1 = f(x, idx)
    assert_close(s1, x[:, 1::2], op="reshape", tol=EXACT)
    assert_close(s2, x[..., -3:-1], op="reshape", tol=EXACT)
    assert_close(c, np.concatenate([x, x * 2], axis=1), op="mul")
    assert_close(t0, np.take(x, idx.astype(int), axis=0, mode="clip"), op="reshape", tol=EXACT)
    assert_close(t2, np.take(x, idx.astype(int), axis=2, mode="clip"), op="reshape", tol=EXACT)
    assert_close(t1, x[:, [1, 1, 0]], op="reshape", tol=EXACT)


def test_take_never_reads_outside_for_nan_indices() -> None:
    table = np.arange(6, dtype=np.float32).reshape(3, 2)

    @pbsdk.jit
    def f(t, i):
        return ops.take(t, i)

    got = f(table, np.array([np.nan, 1e30, -1e30], np.float64))
    assert_close(got, table[[0, 2, 0]], op="reshape", tol=EXACT)


def test_errors_name_the_op() -> None:
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(PbsdkError, match="slice: .* is empty"):
        pbsdk.jit(lambda a: ops.slice(a, 1, 2, 2))(x)
    with pytest.raises(PbsdkError, match="slice: step"):
        pbsdk.jit(lambda a: ops.slice(a, 1, 0, 2, -1))(x)
    with pytest.raises(PbsdkError, match="concatenate: shapes"):
        pbsdk.jit(lambda a: ops.concatenate([a, ops.transpose(a)], axis=0))(x)
    with pytest.raises(PbsdkError, match="take: constant indices must be integers"):
        pbsdk.jit(lambda a: ops.take(a, np.array([0.5])))(x)
