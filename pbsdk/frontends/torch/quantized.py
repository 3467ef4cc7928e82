"""Converters of PyTorch's ``quantized_decomposed`` ops — the quantize/dequantize pairs a PT2E-quantized
graph (``convert_pt2e``) puts around each linear and convolution — onto `pbsdk.ops.quantize` and
`pbsdk.ops.dequantize`.

The contraction between them is recognised by `pbsdk.ops.matmul` itself: ``dequantize(xq) @
dequantize(wq)`` runs as the i8 contraction with exact i32 accumulation (an i8 matrix unit where the spec
has one) and one rescale, and the ``quantize`` after it (with the bias add) is the requantize epilogue, an
elementwise chain the core fuses. Integers cross a partition boundary as f64 (`graph_dtype`); a frozen
int8 weight arrives as such a constant and is cast back to i8 (exactly).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pbsdk import ops
from pbsdk.core.errors import UnsupportedError
from pbsdk.frontends.torch.convert import _INT_EXACT, Context, converts
from pbsdk.frontends.tracing import Tensor

# Their integer results are exact (rounded and clamped in f32, then converted).
_INT_EXACT.update({"aten.quantize_per_tensor.default", "aten.quantize_per_channel.default"})


def _decomposed(cx: Context) -> None:
    """These names are shared with ATen's own quantized ops (another convention): only the
    ``quantized_decomposed`` namespace is converted."""
    ns = getattr(cx.target, "namespace", None) or str(getattr(cx.target, "_schema", "")).split("::")[0]
    if ns != "quantized_decomposed":
        raise UnsupportedError(f"{cx.target}: only quantized_decomposed quantize/dequantize ops are converted")


def _check_range(qmin: int, qmax: int, dtype: Any, what: str) -> None:
    if dtype != torch.int8:
        raise UnsupportedError(f"{what}: quantized dtype {dtype}; pbsdk quantizes to int8")
    if (qmin, qmax) != (-128, 127):
        raise UnsupportedError(f"{what}: range [{qmin}, {qmax}]; pbsdk quantizes to int8's full range [-128, 127]")


def _as_i8(q: Tensor) -> Tensor:
    return q if q.dtype == "i8" else ops.astype(q, "i8")  # integers carried as f64: exact


def _channel_values(cx: Context, t: Any) -> np.ndarray | None:
    """Per-channel scales or zero points as values: None when they are not constants (not frozen)."""
    value = cx.const_of(t) if isinstance(t, Tensor) else np.asarray(t)
    return None if value is None else np.asarray(value).reshape(-1)


def _along(t: Any, axis: int, ndim: int) -> Tensor:
    """A per-channel tensor operand reshaped to broadcast along ``axis``, in f32."""
    shape = [1] * ndim
    shape[axis] = -1
    return ops.reshape(ops.astype(t, "f32"), tuple(shape))


@converts("aten.quantize_per_tensor.default")
def _quantize_per_tensor(cx: Context, x: Any, scale: float, zero_point: int, qmin: int, qmax: int,
                         dtype: Any) -> Tensor:
    _decomposed(cx)
    _check_range(qmin, qmax, dtype, "quantize_per_tensor")
    return ops.quantize(ops.astype(x, "f32"), float(scale), int(zero_point))


@converts("aten.dequantize_per_tensor.default")
def _dequantize_per_tensor(cx: Context, q: Any, scale: float, zero_point: int, qmin: int, qmax: int, dtype: Any,
                           *, out_dtype: Any = None) -> Tensor:
    _decomposed(cx)
    if dtype != torch.int8 or out_dtype not in (None, torch.float32):
        raise UnsupportedError(f"dequantize_per_tensor from {dtype} to {out_dtype}; pbsdk dequantizes int8 to f32")
    return ops.dequantize(_as_i8(q), float(scale), int(zero_point))


@converts("aten.quantize_per_channel.default")
def _quantize_per_channel(cx: Context, x: Any, scales: Any, zero_points: Any, axis: int, qmin: int, qmax: int,
                          dtype: Any) -> Tensor:
    _decomposed(cx)
    _check_range(qmin, qmax, dtype, "quantize_per_channel")
    s, z = _channel_values(cx, scales), _channel_values(cx, zero_points)
    if s is None or z is None:
        raise UnsupportedError("quantize_per_channel: scales and zero points must be constants (frozen)")
    return ops.quantize(ops.astype(x, "f32"), s, z.astype(int), axis=axis)


@converts("aten.dequantize_per_channel.default")
def _dequantize_per_channel(cx: Context, q: Any, scales: Any, zero_points: Any, axis: int, qmin: int, qmax: int,
                            dtype: Any, *, out_dtype: Any = None) -> Tensor:
    _decomposed(cx)
    if dtype != torch.int8 or out_dtype not in (None, torch.float32):
        raise UnsupportedError(f"dequantize_per_channel from {dtype} to {out_dtype}; pbsdk dequantizes int8 to f32")
    s, z = _channel_values(cx, scales), _channel_values(cx, zero_points)
    if s is None or z is None:  # not frozen: the same arithmetic on tensor operands (no integer contraction)
        axis %= q.ndim
        f = ops.astype(q, "f32")
        return ops.mul(ops.sub(f, _along(zero_points, axis, q.ndim)), _along(scales, axis, q.ndim))
    return ops.dequantize(_as_i8(q), s, z.astype(int), axis=axis)
