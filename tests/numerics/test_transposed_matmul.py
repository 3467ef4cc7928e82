"""Packed matmuls computed transposed (``C^T = B^T A^T``, `Blocking.transposed`) against numpy.

The transposed kernel reads the given B in place as its A (``mr`` adjacent values a k step), packs the given
A through L x L register transposes (a short head block first, so the rest load whole cache lines), and
updates C a transposed micro-tile at a time, through the epilogue in C's own frame. Shapes cross the
register tile, the transpose block and the k block; the given A sits at every alignment; epilogues read
inputs of the kinds that fuse (per column, full) and constants."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(11)
FORCED = {"transpose_gemm": True, "cache": False}


def _operands(*shapes: tuple[int, ...], dtype: str = "float32") -> list[np.ndarray]:
    return [RNG.standard_normal(s).astype(dtype) for s in shapes]


def _at(offset: int, a: np.ndarray) -> np.ndarray:
    """A copy of ``a`` whose first element sits ``offset`` elements past a 64-byte boundary."""
    buf = np.empty(a.size + 64, a.dtype)
    start = (-buf.ctypes.data // a.itemsize) % (64 // a.itemsize) + offset
    out = buf[start:start + a.size].reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mkn", [(1, 1, 1), (16, 16, 16), (17, 15, 3), (37, 19, 5), (100, 70, 33),
                                 (50, 300, 17), (129, 1, 31), (512, 2048, 49), (3, 9, 64)])
def test_transposed_matmul_matches_numpy(mkn: tuple[int, int, int], threads: int, pack_notes) -> None:
    m, k, n = mkn
    a, b = _operands((m, k), (k, n))
    fn = lambda x, y: ops.matmul(x, y)
    notes = pack_notes(fn, {"threads": threads, "transpose_gemm": True}, a, b)
    assert any("computed transposed" in s for s in notes), notes
    got = pbsdk.jit(fn, options={"threads": threads, **FORCED})(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=k)


@pytest.mark.parametrize("offset", [0, 1, 5, 8, 15])
def test_every_alignment_of_the_transposed_operand(offset: int) -> None:
    """The head block runs up to the first aligned address of each panel's first column; rows whose stride
    is not a multiple of the lanes (k = 333) start at other alignments than that column."""
    for m, k, n in [(200, 333, 20), (64, 512, 49)]:
        a, b = _operands((m, k), (k, n))
        got = pbsdk.jit(lambda x, y: ops.matmul(x, y), options={"threads": 2, **FORCED})(_at(offset, a), b)
        assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=k)


def test_f64_transposes_eight_lane_blocks() -> None:
    a, b = _operands((70, 45), (45, 13), dtype="float64")
    got = pbsdk.jit(lambda x, y: ops.matmul(x, y), options=FORCED)(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=45)


@pytest.mark.parametrize("threads", [1, 2])
def test_epilogues_run_in_the_stored_frame(threads: int, pack_notes) -> None:
    """Per-column bias, a full residual and a scalar, then GELU: the epilogue sees C's rows and columns,
    not the kernel's."""
    m, k, n = 75, 130, 41
    a, b, col, res = _operands((m, k), (k, n), (n,), (m, n))

    def layer(x, y, c, s):
        return ops.gelu(ops.add(ops.add(ops.matmul(x, y), c), ops.mul(s, 0.5)))

    notes = pack_notes(layer, {"threads": threads, "transpose_gemm": True}, a, b, col, res)
    assert any("computed transposed" in s and "epilogue" in s for s in notes), notes
    got = pbsdk.jit(layer, options={"threads": threads, **FORCED})(a, b, col, res)
    want = ref.gelu(ref.matmul(a, b) + col + res * 0.5)
    assert_close(got, want, op="matmul", reduction_size=k)


def test_batched_matmul_transposed(pack_notes) -> None:
    a, b = _operands((3, 40, 70), (3, 70, 21))
    fn = lambda x, y: ops.matmul(x, y)
    notes = pack_notes(fn, {"threads": 2, "transpose_gemm": True}, a, b)
    assert any("batch_matmul" in s and "computed transposed" in s for s in notes), notes
    got = pbsdk.jit(fn, options={"threads": 2, **FORCED})(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=70)


@pytest.mark.parametrize("threads", [1, 2])
def test_nchw_pointwise_convolution_is_computed_transposed(threads: int, pack_notes) -> None:
    """The ResNet-50 conv5_x reduction at batch 1: 512 x 49 x 2048, 49 columns, chosen by the planner."""
    x = RNG.standard_normal((1, 2048, 7, 7)).astype(np.float32)
    w = (RNG.standard_normal((512, 2048, 1, 1)) * 0.02).astype(np.float32)
    fn = lambda p, q: ops.conv2d(p, q, layout="NCHW")
    notes = pack_notes(fn, {"threads": threads}, x, w)
    assert any("computed transposed" in s for s in notes), notes
    got = pbsdk.jit(fn, options={"threads": threads, "cache": False})(x, w)
    assert_close(got, ref.conv2d(x, w, layout="NCHW"), op="conv2d", reduction_size=2048)


def test_the_option_turns_it_off(pack_notes) -> None:
    a, b = _operands((512, 256), (256, 49))
    fn = lambda x, y: ops.matmul(x, y)
    assert any("computed transposed" in s for s in pack_notes(fn, {"threads": 1}, a, b))
    notes = pack_notes(fn, {"threads": 1, "transpose_gemm": False}, a, b)
    assert notes and not any("computed transposed" in s for s in notes), notes
    got = pbsdk.jit(fn, options={"threads": 1, "transpose_gemm": False, "cache": False})(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=256)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mkn", [(512, 256, 49), (100, 70, 33), (33, 300, 5), (1024, 64, 196)])
def test_a_constant_is_packed_at_compile_time(mkn: tuple[int, int, int], threads: int, pack_notes) -> None:
    """A frozen A (a 1x1 NCHW convolution's weights) of a product computed transposed: the kernel's B is A^T
    packed into panels at compile time (rows of A past a whole panel are zeros there), not on every call."""
    m, k, n = mkn
    a, x = _operands((m, k), (k, n))
    fn = lambda y: ops.matmul(a, y)  # a is captured: a constant
    notes = pack_notes(fn, {"threads": threads, "transpose_gemm": True}, x)
    assert any("computed transposed" in s and "A packed at compile time as B^T" in s for s in notes), notes
    got = pbsdk.jit(fn, options={"threads": threads, **FORCED})(x)
    assert_close(got, ref.matmul(a, x), op="matmul", reduction_size=k)


def test_a_constant_conv_with_bias_and_relu() -> None:
    """The same through ops.conv2d (NCHW, 1x1, frozen weights viewed as O x C) with a fused epilogue."""
    x, w, b = _operands((1, 256, 14, 14), (1024, 256, 1, 1), (1, 1024, 1, 1))
    got = pbsdk.jit(lambda y: ops.relu(ops.conv2d(y, w) + b), options={"threads": 2, "cache": False})(x)
    want = np.maximum(np.einsum("oc,nchw->nohw", w[:, :, 0, 0].astype(np.float64), x) + b, 0.0).astype(np.float32)
    assert_close(got, want, op="conv2d", reduction_size=256)
