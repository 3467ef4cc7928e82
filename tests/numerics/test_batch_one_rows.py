"""Batch-1 ops between kernels split over the cores (`expose-rows`, `fuse-rows` slicing transposed inputs)
and padded buffers filled only around the image (`fill-borders`), against numpy: padded convolutions in both
layouts, explicit pads with other values and asymmetric widths, transposes with and without a unit batch,
each at 1 and 2 threads and with the passes off (the same numbers)."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(5)
OFF = {"expose_rows": False, "fill_borders": False}


def _ir(f, *args, stop_after: str = "fuse-rows") -> str:
    return str(compile_text(f.lower(*args), f.request, stop_after=stop_after))


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("extra", [{}, OFF])
def test_padded_conv_relu(layout: str, threads: int, extra: dict) -> None:
    # 34x34 so that the image's copy (34*34*24 values) is worth two threads.
    x = RNG.standard_normal((1, 24, 34, 34) if layout == "NCHW" else (1, 34, 34, 24)).astype(np.float32)
    w = RNG.standard_normal((16, 24, 3, 3) if layout == "NCHW" else (3, 3, 24, 16)).astype(np.float32) / 8

    def f(a, b):
        return ops.relu(ops.conv2d(a, b, padding=1, layout=layout))

    got = pbsdk.jit(f, options={"threads": threads, **extra})(x, w)
    assert_close(got, ref.relu(ref.conv2d(x, w, padding=1, layout=layout)), op="conv2d", reduction_size=216)


@pytest.mark.parametrize("threads", [1, 2])
def test_pad_values_and_widths(threads: int) -> None:
    """A pad with a non-zero value and uneven widths, its result then overwritten nowhere: the frame has
    every width, and the copy of the interior runs by rows."""
    x = RNG.standard_normal((1, 40, 37, 32)).astype(np.float32)
    widths = ((0, 0), (2, 1), (0, 3), (0, 0))

    def f(a):
        return ops.add(ops.pad(a, widths, constant_values=-1.5), 1.0)

    fn = pbsdk.jit(f, options={"threads": threads})
    assert_close(fn(x), np.pad(x, widths, constant_values=-1.5) + 1.0, op="add")


def test_transpose_at_batch_one_splits_over_cores() -> None:
    x = RNG.standard_normal((1, 64, 48, 40)).astype(np.float32)

    def f(a):
        return ops.transpose(a, (0, 2, 3, 1))

    fn = pbsdk.jit(f, options={"threads": 2})
    text = _ir(fn, x)
    main = text.split("func.func @__pbsdk_rows")[0]
    assert "scf.forall" in main and "__pbsdk_rows" in text, "the transpose runs on both cores"
    assert_close(fn(x), x.transpose(0, 2, 3, 1), op="add")
    off = pbsdk.jit(f, options={"threads": 2, **OFF})
    assert "__pbsdk_rows" not in _ir(off, x)
    assert_close(off(x), x.transpose(0, 2, 3, 1), op="add")


def test_fill_only_around_the_image() -> None:
    """The padded input of a 3x3 convolution: zero only its frame (two rows, two columns), never the
    interior the image is copied into."""
    x = RNG.standard_normal((1, 20, 20, 8)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 8, 8)).astype(np.float32)

    def f(a, b):
        return ops.conv2d(a, b, padding=1, layout="NHWC")

    fn = pbsdk.jit(f)
    main = _ir(fn, x, w, stop_after="fill-borders").split("func.func @__pbsdk")[0]
    assert main.count("linalg.fill") == 4 and "linalg.map" not in main, main
    assert_close(fn(x, w), ref.conv2d(x, w, padding=1, layout="NHWC"), op="conv2d", reduction_size=72)
