"""Math ops with no LLVM intrinsic go to libm calls; vectorised ones are unrolled before the vector dialect is
lowered (an unrolled `vector.extract` left behind once crashed translation to LLVM IR)."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vectorised_erf_after_a_matmul(dtype: type) -> None:
    x, w = RNG.standard_normal((13, 64)).astype(dtype), (RNG.standard_normal((64, 31)) * 0.2).astype(dtype)
    got = pbsdk.jit(lambda a, k: ops.gelu(a @ k))(x, w)
    want = ref.gelu(ref.matmul(x, w, dtype=np.float64), dtype=np.float64)
    assert_close(got, want.astype(dtype), op="gelu", reduction_size=64)


def test_an_op_left_outside_the_llvm_dialect_is_named() -> None:
    from mlir import ir

    from pbsdk.core.errors import CompileError
    from pbsdk.targets.cpu import _check_llvm_only

    with ir.Context() as ctx:
        ctx.allow_unregistered_dialects = True
        module = ir.Module.parse('"test.left_over"() : () -> ()')
        with pytest.raises(CompileError, match="test.left_over"):
            _check_llvm_only(module)
