"""The fused bf16 attention issues its unit steps through the target's ``unit_step`` hook as the matmul kernels
do: with the ``emudot`` plugin (tests/plugins/emulated_dot_target, whose hook emulates the dot-product units in
vector arithmetic) the attention kernel holds no intrinsic, and it computes the same attention."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from test_cpu_hook_plugin import emudot  # noqa: F401  (the plugin installed for discovery)

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text, resolve
from pbsdk.core.spec import load_spec
from pbsdk.targets.cpu.pack_contractions import lowers_unit
from pbsdk.testing import assert_close, tolerance
from pbsdk.testing import reference as ref

BF16 = np.dtype(ml_dtypes.bfloat16)


def _attention(q, k, v):
    """torch's decomposed bf16 SDPA: f32 on widened operands, rounded back to bf16."""
    y = ops.attention(ops.astype(q, "f32"), ops.astype(k, "f32"), ops.astype(v, "f32"), causal=True)
    return ops.astype(y, "bf16")


def _part(target: str, q: np.ndarray) -> str:
    jf = pbsdk.jit(_attention, target=target, spec="amd/zen4", options={"threads": 1})
    text = str(compile_text(jf.lower(q, q, q), resolve(target, load_spec("amd/zen4"), {"threads": 1}),
                            stop_after="attention"))
    return text[text.index("func.func private @__pbsdk_attn0_part"):text.index("func.func private @__pbsdk_attn0(")]


def test_the_attention_kernel_takes_the_plugins_unit_step(emudot: None) -> None:  # noqa: F811
    q = np.zeros((1, 2, 40, 64), BF16)
    assert "llvm.x86.avx512bf16.dpbf16ps.512" in _part("cpu", q)
    ours = _part("emudot", q)
    assert "llvm.call_intrinsic" not in ours and "vector<32xbf16>" in ours
    assert "arith.extf" in ours and "vector<16xbf16> to vector<16xf32>" in ours  # the plugin's step


@pytest.mark.skipif(not lowers_unit(load_spec("host"), "vdpbf16ps"), reason="the host has no AVX512-BF16: the plugin's "
                    "kernel is planned for that unit (its IR is checked above)")
def test_the_plugins_attention_computes_the_same(emudot: None) -> None:  # noqa: F811
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 40, 64)).astype(BF16) for _ in range(3))
    fn = pbsdk.jit(_attention, target="emudot", options={"threads": 2, "cache": False})
    expected = ref.attention(*(x.astype(np.float64) for x in (q, k, v)), causal=True, dtype=np.float64)
    assert_close(fn(q, k, v).astype(np.float64), expected, op="attention", tol=tolerance("attention", "bfloat16"))
