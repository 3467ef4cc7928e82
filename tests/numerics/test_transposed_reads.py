"""Packed matmuls that read an operand from the source of the transpose that fed it (``x @ w.T``, ``a.T @ b``,
``q @ k^T``; `pbsdk.targets.cpu.transposed_reads`) against numpy.

B stored [n, k] is packed through register transposes, one group of L rows at a time; A stored [k, m] is
read in place or packed a row of A at a time (masked vectors). Both orientations are forced (the kernel
layouts differ: given ("mk"/"km", "nk"/"kn", "mn"), transposed the other way round with C "nm"); shapes
cross the register tile, the transpose block and the k block; with epilogues, batches, 2 threads, f64,
sources at odd alignments, and a source that is a strided view."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(17)
SHAPES = [(1, 1, 1), (16, 16, 16), (17, 15, 3), (37, 19, 5), (100, 70, 33), (50, 300, 17), (129, 1, 31),
          (33, 40, 200), (3, 9, 64)]


def _operands(*shapes: tuple[int, ...], dtype: str = "float32") -> list[np.ndarray]:
    return [RNG.standard_normal(s).astype(dtype) for s in shapes]


def _read(notes: list[str], operand: str) -> bool:
    return any(f"{operand} read from its transpose's source" in s for s in notes)


@pytest.mark.parametrize("orient", [False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mkn", SHAPES)
def test_b_read_transposed(mkn: tuple[int, int, int], threads: int, orient: bool, pack_notes) -> None:
    m, k, n = mkn
    x, w = _operands((m, k), (n, k))
    fn = lambda a, b: a @ b.T
    opts = {"threads": threads, "transpose_gemm": orient}
    assert _read(pack_notes(fn, opts, x, w), "B")
    got = pbsdk.jit(fn, options={**opts, "cache": False})(x, w)
    assert_close(got, ref.matmul(x, w, transpose_b=True), op="matmul", reduction_size=k)


@pytest.mark.parametrize("orient", [False, True])
@pytest.mark.parametrize("pack_a", [None, True, False])
@pytest.mark.parametrize("mkn", SHAPES)
def test_a_read_transposed(mkn: tuple[int, int, int], pack_a: bool | None, orient: bool, pack_notes) -> None:
    """A stored [k, m] in place and packed (forced both ways; the planner packs it for many column tiles)."""
    m, k, n = mkn
    a, b = _operands((k, m), (k, n))
    fn = lambda p, q: p.T @ q
    opts = {"threads": 2, "transpose_gemm": orient, "pack_a": pack_a}
    assert _read(pack_notes(fn, opts, a, b), "A")
    got = pbsdk.jit(fn, options={**opts, "cache": False})(a, b)
    assert_close(got, ref.matmul(a, b, transpose_a=True), op="matmul", reduction_size=k)


@pytest.mark.parametrize("orient", [False, True])
def test_both_read_transposed_with_an_epilogue(orient: bool, pack_notes) -> None:
    m, k, n = 45, 77, 70
    a, b, bias = _operands((k, m), (n, k), (n,))
    fn = lambda p, q, c: ops.gelu(ops.matmul(p, q, transpose_a=True, transpose_b=True) + c, approximate="tanh")
    opts = {"threads": 2, "transpose_gemm": orient}
    notes = pack_notes(fn, opts, a, b, bias)
    assert _read(notes, "A") and _read(notes, "B") and any("epilogue" in s for s in notes), notes
    got = pbsdk.jit(fn, options={**opts, "cache": False})(a, b, bias)
    want = ref.gelu_tanh(ref.matmul(a, b, transpose_a=True, transpose_b=True) + bias)
    assert_close(got, want, op="matmul", reduction_size=k)


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_q_at_k_transposed(threads: int, pack_notes) -> None:
    q, kk = _operands((6, 40, 24), (6, 35, 24))
    fn = lambda p, r: ops.matmul(p, r, transpose_b=True)
    assert _read(pack_notes(fn, {"threads": threads}, q, kk), "B")
    got = pbsdk.jit(fn, options={"threads": threads, "cache": False})(q, kk)
    assert_close(got, ref.matmul(q, kk, transpose_b=True), op="matmul", reduction_size=24)


@pytest.mark.parametrize("orient", [False, True])
def test_four_dimensional_q_at_k_transposed(orient: bool, pack_notes) -> None:
    """(b, h, s, d) @ (b, h, s, d)^T: the batch dimensions are collapsed after the transpose; the kernel
    reads the same collapse of the source."""
    q, kk = _operands((2, 3, 33, 24), (2, 3, 20, 24))
    fn = lambda p, r: ops.matmul(p, r, transpose_b=True)
    opts = {"threads": 2, "fuse_attention": False, "transpose_gemm": orient}
    assert _read(pack_notes(fn, opts, q, kk), "B")
    got = pbsdk.jit(fn, options={**opts, "cache": False})(q, kk)
    assert_close(got, ref.matmul(q, kk, transpose_b=True), op="matmul", reduction_size=24)


def test_f64_and_a_source_at_every_alignment() -> None:
    x, w = _operands((30, 45), (21, 45), dtype="float64")
    got = pbsdk.jit(lambda a, b: a @ b.T, options={"cache": False})(x, w)
    assert_close(got, ref.matmul(x, w, transpose_b=True), op="matmul", reduction_size=45)
    for offset in (1, 5, 11):
        x, w = _operands((40, 333), (50, 333))
        buf = np.empty(w.size + 16, np.float32)
        wa = buf[offset:offset + w.size].reshape(w.shape)
        wa[...] = w
        got = pbsdk.jit(lambda a, b: a @ b.T, options={"cache": False, "transpose_gemm": False})(x, wa)
        assert_close(got, ref.matmul(x, w, transpose_b=True), op="matmul", reduction_size=333)


def test_a_transpose_of_a_computed_value_and_a_source_read_again(pack_notes) -> None:
    """The source is the result of another product (a buffer of the program) and is read again after this one."""
    x, w, v = _operands((20, 48), (36, 30), (30, 48))

    def fn(a, b, c):
        h = b @ c
        return ops.matmul(a, h, transpose_b=True) + ops.sum(h)

    assert _read(pack_notes(fn, {}, x, w, v), "B")
    got = pbsdk.jit(fn, options={"cache": False})(x, w, v)
    h = w.astype(np.float64) @ v
    assert_close(got, (x @ h.T + h.sum()).astype(np.float32), op="matmul", reduction_size=48 * 30)


def test_off_by_option_keeps_the_transpose(pack_notes) -> None:
    x, w = _operands((64, 32), (48, 32))
    fn = lambda a, b: a @ b.T
    assert not _read(pack_notes(fn, {"transposed_reads": False}, x, w), "B")
    got = pbsdk.jit(fn, options={"transposed_reads": False, "cache": False})(x, w)
    assert_close(got, ref.matmul(x, w, transpose_b=True), op="matmul", reduction_size=32)
