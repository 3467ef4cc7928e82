"""Copies that transpose their innermost dimension, moved as register-transposed blocks
(`transpose-blocks`), against numpy: exact, for every permutation kind, ragged edges, f64, 1 and 2 threads,
and the NCHW convolution that runs in NHWC between two of them."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.spec import load_spec
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(5)
#: The host's vector width: a block is one vector of lanes by as many rows (16 f32 lanes on AVX-512, 8 on AVX2).
WIDTH = load_spec("host").vector.width_bits  # type: ignore[union-attr]


def _notes(fn, options, *args) -> list[str]:  # type: ignore[no-untyped-def]
    from pbsdk.core.compiler import compile_text
    from pbsdk.targets import cpu

    f = pbsdk.jit(fn, options={**options, "cache": False})
    seen: list[str] = []
    real = cpu.TransposeBlocks.apply

    def spy(self, module, ctx):  # type: ignore[no-untyped-def]
        real(self, module, ctx)
        seen.extend(ctx.notes.get(self.name, []))

    cpu.TransposeBlocks.apply = spy  # type: ignore[method-assign]
    try:
        compile_text(f.lower(*args), f.request)
    finally:
        cpu.TransposeBlocks.apply = real  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("shape", "perm"), [((1, 64, 56, 56), (0, 2, 3, 1)), ((1, 56, 56, 64), (0, 3, 1, 2)),
                                             ((37, 50), (1, 0)), ((3, 20, 40), (0, 2, 1)), ((16, 16), (1, 0)),
                                             ((2, 17, 3, 33), (3, 1, 2, 0)), ((5, 7, 40), (2, 0, 1))])
def test_transposes_match_numpy_exactly(shape: tuple[int, ...], perm: tuple[int, ...], threads: int) -> None:
    x = RNG.standard_normal(shape).astype(np.float32)
    got = pbsdk.jit(lambda a: ops.transpose(a, perm), options={"threads": threads, "cache": False})(x)
    assert np.array_equal(got, x.transpose(perm))


def test_f64_blocks_are_a_vector_of_f64() -> None:
    x = RNG.standard_normal((3, 19, 21)).astype(np.float64)
    fn = lambda a: ops.transpose(a, (0, 2, 1))
    notes = _notes(fn, {"threads": 1}, x)
    lanes = WIDTH // 64
    assert any(f"{lanes}x{lanes} register-transposed blocks" in n for n in notes), notes
    assert np.array_equal(pbsdk.jit(fn, options={"threads": 1, "cache": False})(x), x.transpose(0, 2, 1))


def test_one_thread_nchw_image_takes_the_blocks_and_the_option_turns_them_off() -> None:
    x = RNG.standard_normal((1, 64, 56, 56)).astype(np.float32)
    fn = lambda a: ops.transpose(a, (0, 2, 3, 1))
    lanes = WIDTH // 32
    assert any(f"{lanes}x{lanes} register-transposed blocks" in n for n in _notes(fn, {"threads": 1}, x))
    off = _notes(fn, {"threads": 1, "transpose_blocks": False}, x)
    assert off == ["disabled by option transpose_blocks=False"]
    got = pbsdk.jit(fn, options={"threads": 1, "transpose_blocks": False, "cache": False})(x)
    assert np.array_equal(got, x.transpose(0, 2, 3, 1))


@pytest.mark.parametrize("threads", [1, 2])
def test_nchw_convolution_between_blocked_transposes(threads: int) -> None:
    x = RNG.standard_normal((1, 24, 19, 21)).astype(np.float32)
    w = (RNG.standard_normal((40, 24, 3, 3)) * 0.1).astype(np.float32)
    fn = lambda a, b: ops.relu(ops.conv2d(a, b, padding=1, layout="NCHW"))
    got = pbsdk.jit(fn, options={"threads": threads, "cache": False})(x, w)
    assert_close(got, ref.relu(ref.conv2d(x, w, padding=1, layout="NCHW")), op="conv2d", reduction_size=24 * 9)



@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("channels", "size"), [(16, (20, 21)), (20, (9, 9))])
def test_nchw_few_channel_convolution_runs_direct_and_writes_nchw_through_blocks(
        channels: int, size: tuple[int, int], threads: int) -> None:
    # KernelBench's Conv2d(3, 16, 3) over NCHW images with an activation and a residual: the direct kernel
    # reads the NCHW input where it lies (the layout transpose folded into its reads); the epilogue is one
    # map that writes NCHW in register-transposed blocks: the bias a scalar per block row, the residual
    # (already NCHW) a vector along it; 20 channels and 7x7 pixels leave ragged blocks on both loops.
    x = RNG.standard_normal((4, 3, *size)).astype(np.float32)
    w = (RNG.standard_normal((channels, 3, 3, 3)) * 0.3).astype(np.float32)
    b = RNG.standard_normal((1, channels, 1, 1)).astype(np.float32)
    r = RNG.standard_normal((4, channels, size[0] - 2, size[1] - 2)).astype(np.float32)
    fn = lambda a, k, bias, res: ops.add(ops.relu(ops.hardswish(ops.add(ops.conv2d(a, k, layout="NCHW"), bias))),
                                         res)
    notes = _notes(fn, {"threads": threads}, x, w, b, r)
    assert any("register-transposed blocks" in n and "map of 3 input(s)" in n for n in notes), notes
    got = pbsdk.jit(fn, options={"threads": threads, "cache": False})(x, w, b, r)
    y = ref.conv2d(x, w, layout="NCHW") + b
    want = ref.relu(y * np.clip(y + 3, 0, 6) / 6) + r  # hardswish
    assert_close(got, want, op="conv2d", reduction_size=27)
