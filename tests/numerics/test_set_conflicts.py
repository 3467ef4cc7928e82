"""Matmuls with few columns whose A rows share cache sets (K a multiple of 512 floats: rows 2 or 4 KiB apart,
or more), which the planner packs instead of reading in place (`rows_per_set`), against numpy: both ways
(the planner's choice and A forced in place), at 1 and 2 threads, with a bias + ReLU epilogue, a batch,
and f64 — on the host spec and on the Xeon preset's planning (its l1d associativity in the spec)."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.plan.contraction import Contraction, plan_contraction
from pbsdk.core.spec import load_spec
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(23)
SHAPES = [(64, 16, 1024), (45, 16, 512), (31, 24, 2048), (100, 32, 1024), (33, 64, 2048), (61, 8, 4096),
          (64, 16, 1000)]


def test_the_xeon_preset_packs_these() -> None:
    """The Xeon preset (48 KiB 12-way l1d) packs those among these whose tile rows outnumber its ways in one
    set (the 22- and 21-row tiles at 4 and 16 KiB strides; not 23 rows at 2 KiB: 12 a set), and none at
    K = 1000 (so the numerics below cover the packed path wherever the host's spec does the same)."""
    xeon = load_spec("intel/xeon-avx512")
    packed = {mkn for mkn in SHAPES
              if (blk := plan_contraction(xeon, Contraction(mkn[0], mkn[1], mkn[2]),
                                          {"threads": 1, "transpose_gemm": False}).blocking) and blk.pack_a}
    assert packed == {(64, 16, 1024), (61, 8, 4096)}


@pytest.mark.parametrize("pack_a", [None, False, True])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mnk", SHAPES)
def test_matmul(mnk: tuple[int, int, int], threads: int, pack_a: bool | None) -> None:
    m, n, k = mnk
    a = RNG.standard_normal((m, k)).astype(np.float32)
    b = RNG.standard_normal((k, n)).astype(np.float32)
    opts = {"threads": threads, "transpose_gemm": False, "cache": False}
    if pack_a is not None:
        opts["pack_a"] = pack_a
    got = pbsdk.jit(lambda x, y: x @ y, options=opts)(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=k)


@pytest.mark.parametrize("threads", [1, 2])
def test_bias_relu_epilogue(threads: int) -> None:
    m, n, k = 50, 16, 2048
    a, b = RNG.standard_normal((m, k)).astype(np.float32), RNG.standard_normal((k, n)).astype(np.float32)
    bias = RNG.standard_normal(n).astype(np.float32)
    got = pbsdk.jit(lambda x, y, z: ops.relu(x @ y + z), options={"threads": threads, "cache": False})(a, b, bias)
    want = np.maximum(a.astype(np.float64) @ b.astype(np.float64) + bias, 0.0).astype(np.float32)
    assert_close(got, want, op="matmul", reduction_size=k)


def test_batched_and_f64() -> None:
    a = RNG.standard_normal((3, 40, 1024)).astype(np.float32)
    b = RNG.standard_normal((3, 1024, 16)).astype(np.float32)
    got = pbsdk.jit(lambda x, y: x @ y, options={"cache": False})(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=1024)
    a64 = RNG.standard_normal((40, 512))
    b64 = RNG.standard_normal((512, 8))
    got = pbsdk.jit(lambda x, y: x @ y, options={"cache": False})(a64, b64)
    assert_close(got, a64 @ b64, op="matmul", reduction_size=512)
