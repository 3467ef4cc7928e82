"""Packed matmuls whose last register tile row or column is short (`tile_variants`: those tiles run k loops
of their own with fewer accumulators) against numpy: plain, with a fused epilogue, batched, computed
transposed, split over two threads, and an implicit-GEMM convolution whose pixels end in a short tile."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.plan.contraction import Contraction, plan_contraction
from pbsdk.core.spec import load_spec
from pbsdk.targets.cpu.matmul_kernel import tile_variants
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(5)
NO_CACHE = {"cache": False}


def _variants(m: int, n: int, k: int, options: dict) -> tuple[int, int]:
    blk = plan_contraction(load_spec("host"), Contraction(m, n, k), options).blocking
    assert blk is not None
    return tile_variants(n if blk.transposed else m, m if blk.transposed else n, blk.mr, blk.nv, blk.lanes)


def _ending_short(m: int, n: int, k: int, options: dict) -> int:
    """``m`` or the next row count that ends in a short tile with this host's register tile (its rows and
    lanes follow the host's calibrated issue rate, so a fixed count may divide evenly on one host)."""
    for rows in range(m, m + 32):
        if any(_variants(rows, n, k, options)):
            return rows
    raise AssertionError(f"no row count from {m} ends in a short tile ({n}x{k})")


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mkn", [(31, 64, 59), (10, 64, 267), (512, 96, 200), (1024, 40, 300), (45, 33, 1000)])
def test_short_edge_tiles_match_numpy(mkn: tuple[int, int, int], threads: int) -> None:
    m, k, n = mkn
    m = _ending_short(m, n, k, {"threads": threads})
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    got = pbsdk.jit(lambda x, y: x @ y, options={"threads": threads, **NO_CACHE})(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=k)
    fused = pbsdk.jit(lambda x, y, z: ops.relu(x @ y + z), options={"threads": threads, **NO_CACHE})(a, b, bias)
    want = np.maximum(ref.matmul(a, b, dtype=np.float64) + bias, 0).astype(np.float32)
    assert_close(fused, want, op="matmul", reduction_size=k)


def test_short_edge_tiles_batched_and_transposed() -> None:
    a = RNG.standard_normal((3, 31, 64)).astype(np.float32)
    b = RNG.standard_normal((3, 64, 59)).astype(np.float32)
    got = pbsdk.jit(lambda x, y: ops.matmul(x, y), options={"threads": 2, **NO_CACHE})(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=64)
    # About 300 x 35 computed transposed: the transposed product's 35-odd rows end in a short tile, its 300-odd
    # columns in a vector past the last whole register tile (the first such sizes for this host's tile).
    k, opts = 70, {"threads": 1, "transpose_gemm": True}
    m, n = next((m, n) for m in range(300, 340) for n in range(35, 70) if all(_variants(m, n, k, opts)))
    a2 = RNG.standard_normal((m, k)).astype(np.float32)
    b2 = RNG.standard_normal((k, n)).astype(np.float32)
    got2 = pbsdk.jit(lambda x, y: ops.matmul(x, y), options={"threads": 1, "transpose_gemm": True, **NO_CACHE})(a2, b2)
    assert_close(got2, ref.matmul(a2, b2), op="matmul", reduction_size=k)


def test_implicit_gemm_convolution_with_a_short_last_tile() -> None:
    """NHWC 3x3 over 10x10 (100 pixels in 6-row tiles, the last of 4), read in place by the window kernel."""
    assert _variants(100, 48, 288, {"threads": 2, "transpose_gemm": False})[0] == 4
    x = RNG.standard_normal((1, 10, 10, 32)).astype(np.float32)
    w = RNG.standard_normal((3, 3, 32, 48)).astype(np.float32)
    got = pbsdk.jit(lambda t, f: ops.conv2d(t, f, padding=1, layout="NHWC"), options={"threads": 2, **NO_CACHE})(x, w)
    xp = np.pad(x.astype(np.float64), ((0, 0), (1, 1), (1, 1), (0, 0)))
    want = sum(np.einsum("nhwc,co->nhwo", xp[:, i:i + 10, j:j + 10], w[i, j].astype(np.float64))
               for i in range(3) for j in range(3)).astype(np.float32)
    assert_close(got, want, op="conv2d", reduction_size=9 * 32)


def test_tile_variants() -> None:
    assert tile_variants(512, 3072, 14, 2, 16) == (8, 0)  # 37 tiles of 14 rows, the last of 8
    assert tile_variants(1024, 1024, 14, 2, 16) == (2, 0)
    assert tile_variants(10, 267, 10, 2, 16) == (0, 1)  # 11 columns past the last whole 32: one vector
    assert tile_variants(10, 280, 10, 2, 16) == (0, 0)  # 24 columns: two vectors, a whole tile's
    assert tile_variants(28, 64, 14, 2, 16) == (0, 0)
