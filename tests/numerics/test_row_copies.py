"""Strided copies copied row by row (`copies-to-linalg`'s ``row_copies``, the cpu target's ``lower-copies``):
a memcpy per row contiguous on both sides, against numpy exactly; short runs stay element loops."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(17)


def _copies(f, *args) -> list[str]:  # type: ignore[no-untyped-def]
    """The copy ops of ``f``'s IR after ``lower-copies``."""
    text = str(compile_text(f.lower(*args), f.request, stop_after="lower-copies"))
    return [line.strip() for line in text.splitlines() if "memref.copy" in line or "linalg.copy" in line]


@pytest.mark.parametrize("threads", [1, 2])
def test_padded_i8_activation_is_copied_by_rows(threads: int) -> None:
    x = RNG.integers(-128, 128, (3, 14, 14, 64)).astype(np.int8)
    widths = ((0, 0), (1, 1), (1, 1), (0, 0))
    f = pbsdk.jit(lambda a: ops.pad(a, widths), options={"threads": threads, "cache": False})
    copies = _copies(f, x)
    interior = "memref<14x64xi8, strided<[64, 1], offset: ?>> to memref<14x64xi8, strided<[64, 1], offset: ?>>"
    assert any(interior in c for c in copies), copies
    assert not any(c.startswith("linalg.copy") for c in copies), copies  # the borders' rows are 64 B too
    assert np.array_equal(f(x), np.pad(x, widths))


def test_channel_concat_splits_long_runs_and_keeps_short_ones() -> None:
    a = RNG.standard_normal((2, 5, 7, 8)).astype(np.float32)
    b = RNG.standard_normal((2, 5, 7, 3)).astype(np.float32)
    f = pbsdk.jit(lambda u, v: ops.concatenate([u, v], axis=3), options={"cache": False})
    copies = _copies(f, a, b)
    assert any("memref<8xf32, strided<[1], offset: ?>> to memref<8xf32" in c for c in copies), copies  # 32 B
    assert any(c.startswith("linalg.copy") and "memref<2x5x7x3xf32>" in c for c in copies), copies  # 12 B
    assert np.array_equal(f(a, b), np.concatenate([a, b], axis=3))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_padded_f32_and_f64_rows_and_ragged_unit_dims(dtype: type) -> None:
    x = RNG.standard_normal((1, 5, 1, 9, 6)).astype(dtype)
    widths = ((0, 0), (2, 1), (0, 0), (0, 3), (0, 0))
    f = pbsdk.jit(lambda a: ops.pad(a, widths, constant_values=1.5), options={"cache": False})
    assert np.array_equal(f(x), np.pad(x, widths, constant_values=1.5))


def test_nhwc_conv_with_padding() -> None:
    x = RNG.standard_normal((4, 9, 11, 16)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 16, 8)).astype(np.float32)
    f = pbsdk.jit(lambda a, b: ops.conv2d(a, b, padding=1, layout="NHWC"), options={"cache": False})
    want = ref.conv2d(x, w, padding=1, layout="NHWC")
    assert_close(f(x, w), want, op="conv2d", reduction_size=3 * 3 * 16)
