"""The kernels nvgpu's tests compile: conformance-style cases as (name, function, input types, reference)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from pbsdk import ops
from pbsdk.core.ir.graph import TensorType

F64 = np.float64


@dataclasses.dataclass(frozen=True)
class GpuCase:
    name: str
    fn: Callable[..., Any]
    types: tuple[tuple[tuple[int, ...], str], ...]
    reference: Callable[..., Any]
    op: str  # tolerance family
    reduction: int = 1
    matmul_dtype: str | None = None  # a contraction in this dtype must use mma.sync

    def text(self) -> str:
        from pbsdk.core.ir.emit import emit_graph
        from pbsdk.frontends.jit import trace

        graph, _ = trace(self.fn, tuple(TensorType(s, d) for s, d in self.types))
        return emit_graph(graph)


def _gelu(x: np.ndarray) -> np.ndarray:
    from math import erf, sqrt

    v = np.vectorize(lambda t: 0.5 * t * (1.0 + erf(t / sqrt(2.0))))
    return v(x.astype(F64))


def _softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(F64)
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def _layernorm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    x = x.astype(F64)
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + 1e-5) * w + b


def _conv2d(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    n, _, h, wd = x.shape
    o, _, kh, kw = w.shape
    out = np.zeros((n, o, h - kh + 1, wd - kw + 1))
    for i in range(kh):
        for j in range(kw):
            patch = x[:, :, i:i + h - kh + 1, j:j + wd - kw + 1].astype(F64)
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, i, j].astype(F64))
    return out


def _grouped(x: np.ndarray, w: np.ndarray, groups: int) -> np.ndarray:
    cin, cout = x.shape[1] // groups, w.shape[0] // groups
    return np.concatenate([_conv2d(x[:, g * cin:(g + 1) * cin], w[g * cout:(g + 1) * cout]) for g in range(groups)],
                          axis=1)


def _mm(a: Any, b: Any) -> Any:
    return a @ b


def _mm_ref(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a.astype(F64) @ b.astype(F64)


def matmul_case(m: int, n: int, k: int, dtype: str, batch: int = 0) -> GpuCase:
    lead = (batch,) if batch else ()
    tag = f"{'b' + str(batch) + 'x' if batch else ''}{m}x{n}x{k}"
    return GpuCase(f"{'batch_' if batch else ''}matmul_{dtype}_{tag}", _mm, ((lead + (m, k), dtype), (lead + (k, n), dtype)),
                   _mm_ref, "matmul", k, dtype if dtype in ("f16", "bf16") else None)


CASES: tuple[GpuCase, ...] = (
    matmul_case(128, 128, 64, "f16"),
    matmul_case(100, 70, 50, "f16"),
    matmul_case(64, 64, 64, "bf16"),
    matmul_case(33, 17, 40, "bf16"),
    matmul_case(64, 64, 32, "f32"),
    matmul_case(50, 70, 30, "f32"),
    matmul_case(48, 32, 40, "f16", batch=3),
    GpuCase("softmax_f32_37x100", lambda x: ops.softmax(x), (((37, 100), "f32"),), _softmax, "softmax"),
    GpuCase("layernorm_f32_16x96", lambda x, w, b: ops.layernorm(x, w, b),
            (((16, 96), "f32"), ((96,), "f32"), ((96,), "f32")), _layernorm, "layernorm"),
    GpuCase("matmul_bias_gelu_f16_64x48x32", lambda x, w, b: ops.gelu(x @ w + b),
            (((64, 32), "f16"), ((32, 48), "f16"), ((48,), "f16")),
            lambda x, w, b: _gelu(_mm_ref(x, w).astype(np.float16).astype(F64) + b), "mlp", 32, "f16"),
    GpuCase("conv2d_f32_1x3x10x10_k3", lambda x, w: ops.conv2d(x, w),
            (((1, 3, 10, 10), "f32"), ((4, 3, 3, 3), "f32")), _conv2d, "conv2d", 27),
    GpuCase("conv2d_f16_1x16x12x12_k3", lambda x, w: ops.conv2d(x, w),
            (((1, 16, 12, 12), "f16"), ((32, 16, 3, 3), "f16")), _conv2d, "conv2d", 144, "f16"),
    GpuCase("conv2d_f16_1x32x9x9_k3_g4", lambda x, w: ops.conv2d(x, w, groups=4),
            (((1, 32, 9, 9), "f16"), ((32, 8, 3, 3), "f16")), lambda x, w: _grouped(x, w, 4), "conv2d", 72, "f16"),
    GpuCase("sum_f32_all_30x20", lambda x: ops.sum(x), (((30, 20), "f32"),), lambda x: np.asarray(x.astype(F64).sum()),
            "sum", 600),
)

#: One case per elementwise/layout op in pbsdk.ops (compile-only sweep).
ELEMENTWISE: tuple[tuple[str, Callable[..., Any], int], ...] = tuple(
    (name, fn, arity) for name, fn, arity in (
        ("add", ops.add, 2), ("sub", ops.sub, 2), ("mul", ops.mul, 2), ("div", ops.div, 2),
        ("maximum", ops.maximum, 2), ("minimum", ops.minimum, 2), ("pow", ops.pow, 2), ("neg", ops.neg, 1),
        ("exp", ops.exp, 1), ("log", ops.log, 1), ("tanh", ops.tanh, 1), ("sigmoid", ops.sigmoid, 1),
        ("relu", ops.relu, 1), ("gelu", ops.gelu, 1), ("erf", ops.erf, 1), ("sqrt", ops.sqrt, 1),
        ("rsqrt", ops.rsqrt, 1), ("abs", ops.abs, 1),
        ("transpose", lambda x: ops.transpose(x, (1, 0)), 1), ("reshape", lambda x: ops.reshape(x, (20, 15)), 1),
        ("astype", lambda x: ops.astype(x, "float16"), 1), ("broadcast_to", lambda x: ops.broadcast_to(x, (2, 15, 20)), 1),
        ("max", lambda x: ops.max(x, axis=0), 1), ("min", lambda x: ops.min(x, axis=1), 1),
        ("mean", lambda x: ops.mean(x, axis=-1, keepdims=True), 1), ("log_softmax", lambda x: ops.log_softmax(x), 1),
        # A flip reads n - 1 - d: upstream linalg tiling asserts on that map (it used to abort the process).
        ("flip", lambda x: ops.flip(x, (0, 1)), 1), ("strided_slice", lambda x: ops.slice(x, 1, 1, None, 3), 1),
        ("interleave", lambda a, b: ops.interleave([a, b], (1,), (2,)), 2),
    ))
