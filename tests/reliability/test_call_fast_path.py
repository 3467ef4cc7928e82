"""The per-call fast path (an already-compiled (shape, dtype) skips the signature checks) never changes
what a call means: other dtypes, non-contiguous views and bad arguments still take the checked path."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk.core.errors import ArgumentError


def test_fast_path_keeps_the_checks() -> None:
    f = pbsdk.jit(lambda a, b: a * 2.0 + b)
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    b = np.ones((3, 4), np.float32)
    assert np.array_equal(f(a, b), a * 2 + b)
    assert np.array_equal(f(a, b), a * 2 + b)  # fast path
    view = np.arange(12, dtype=np.float32).reshape(4, 3).T  # same shape, not contiguous
    assert np.array_equal(f(view, b), view * 2 + b)
    d = a.astype(np.float64)
    assert f(d, d).dtype == np.float64 and len(f.signatures) == 2
    with pytest.raises(ArgumentError):
        f(a)
    kernel, _ = f.kernel(f.signatures[0])
    with pytest.raises(ArgumentError, match="shape"):
        kernel(np.ones((4, 3), np.float32), b)
    with pytest.raises(ArgumentError, match="dtype"):
        kernel(d, b)
    assert np.array_equal(kernel(view, b), view * 2 + b)
