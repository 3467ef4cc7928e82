"""`fuse-rows`: chains of row-local ops run row by row (and rows over the cores) — same numbers."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(11)


def _ir(f, *args) -> str:
    return str(compile_text(f.lower(*args), f.request, stop_after="fuse-rows"))


@pytest.mark.parametrize("shape", [(1, 7), (3, 4096), (257, 33), (64, 1000)])
@pytest.mark.parametrize("threads", [1, 2])
def test_softmax_and_layernorm_fused_by_rows(shape: tuple[int, int], threads: int) -> None:
    x = RNG.standard_normal(shape).astype(np.float32) * 3
    w, b = RNG.standard_normal(shape[-1:]).astype(np.float32), RNG.standard_normal(shape[-1:]).astype(np.float32)
    opts = {"threads": threads}
    sm = pbsdk.jit(lambda a: ops.softmax(a), options=opts)
    assert_close(sm(x), ref.softmax(x), op="softmax", reduction_size=shape[-1])
    ln = pbsdk.jit(lambda a, g, h: ops.layernorm(a, g, h), options=opts)
    assert_close(ln(x, w, b), ref.layernorm(x, w, b), op="layernorm", reduction_size=shape[-1])


def test_softmax_is_one_row_loop() -> None:
    x = RNG.standard_normal((64, 4096)).astype(np.float32)
    text = _ir(pbsdk.jit(lambda a: ops.softmax(a)), x)
    main = text.split("func.func @__pbsdk_rows")[0]
    assert main.count("linalg.") == 0, "every op of the softmax runs inside the row loop"
    assert text.count("func.func @__pbsdk_rows") == 1
    assert "scf.forall" in main  # 64 x 4096 is worth both cores


def test_ops_reading_across_rows_are_not_fused() -> None:
    """A transpose reads other rows: the chain must stop there, and the numbers stay right."""
    x = RNG.standard_normal((48, 48)).astype(np.float32)

    def f(a):
        e = ops.exp(a)
        return ops.add(ops.transpose(e), e)

    got = pbsdk.jit(f)(x)
    e64 = np.exp(x.astype(np.float64))  # a float64 reference: float32 numpy's exp is itself ~0.5 ulp off
    assert_close(got, (e64.T + e64).astype(np.float32), op="exp")


def test_switch_off() -> None:
    x = RNG.standard_normal((64, 512)).astype(np.float32)
    f = pbsdk.jit(lambda a: ops.softmax(a), options={"fuse_rows": False})
    assert "__pbsdk_rows" not in _ir(f, x)
    assert_close(f(x), ref.softmax(x), op="softmax", reduction_size=512)


def test_a_reduction_read_through_a_reshape_is_not_fused_with_its_writer() -> None:
    """A reduction over non-trailing axes that is a kernel output and is read, reshaped, by the next op: the
    reshape is a view of the buffer the run writes, so the two cannot run row by row together."""
    x = RNG.standard_normal((5, 5, 5)).astype(np.float32)

    def fn(a):  # type: ignore[no-untyped-def]
        m = ops.mean(a, (0, 2))
        return ops.sub(a, ops.reshape(m, (1, 5, 1))), m

    got, mean = pbsdk.jit(fn, options={"cache": False})(x)
    want = x.astype(np.float64).mean((0, 2)).astype(np.float32)
    assert_close(mean, want, op="mean", reduction_size=25)
    assert_close(got, (x - want.reshape(1, 5, 1)).astype(np.float32), op="mean", reduction_size=25)
