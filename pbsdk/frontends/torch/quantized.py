"""Converters of PyTorch's ``quantized_decomposed`` ops — the quantize/dequantize pairs a PT2E-quantized
graph (``convert_pt2e``) puts around each linear and convolution — onto `pbsdk.ops.quantize` and
`pbsdk.ops.dequantize`.

The contraction between them is recognised by `pbsdk.ops.matmul` itself: ``dequantize(xq) @
dequantize(wq)`` runs as the i8 contraction with exact i32 accumulation (an i8 matrix unit where the spec
has one) and one rescale, and the ``quantize`` after it (with the bias add) is the requantize epilogue, an
elementwise chain the core fuses. Integers cross a partition boundary as f64 (`graph_dtype`); a frozen
int8 weight arrives as such a constant and becomes an i8 constant at conversion (exactly).

int8 and uint8 (PT2E's x86 quantizer: u8 activations with any zero point) are both held in i8
(`pbsdk.core.quant.quant_storage`: u8 values, zero points and ranges shifted by -128, bit-exact), narrower
ranges (``[-127, 127]`` weights) too; other quantized dtypes are refused with the reason, so the op stays
with torch.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from pbsdk import ops
from pbsdk.core import quant
from pbsdk.core.errors import UnsupportedError
from pbsdk.frontends.torch.convert import _INT_EXACT, Context, converts
from pbsdk.frontends.tracing import Tensor

# Their integer results are exact (rounded and clamped in f32, then converted).
_INT_EXACT.update({"quantized_decomposed.quantize_per_tensor.default", "quantized_decomposed.quantize_per_channel.default"})
#: Torch's quantized dtypes by pbsdk's names for them (`pbsdk.core.quant.QUANT_DTYPES`).
_QUANT_DTYPES = {torch.int8: "i8", torch.uint8: "u8"}


def _decomposed(cx: Context) -> None:
    """Only the ``quantized_decomposed`` namespace is converted (the converter table is keyed by namespace
    too; this guards a converter called for another namespace's op of the same name)."""
    ns = getattr(cx.target, "namespace", None) or str(getattr(cx.target, "_schema", "")).split("::")[0]
    if ns != "quantized_decomposed":
        raise UnsupportedError(f"{cx.target}: only quantized_decomposed quantize/dequantize ops are converted")


def _check_out(out_dtype: Any, what: str) -> None:
    if out_dtype not in (None, torch.float32):
        raise UnsupportedError(f"{what} to {out_dtype}; pbsdk dequantizes to f32")


def _storage(dtype: Any, qmin: int, qmax: int, what: str) -> quant.QuantStorage:
    """How the graph holds a torch quantized tensor of ``dtype`` in ``[qmin, qmax]`` (u8 shifted onto i8)."""
    name = _QUANT_DTYPES.get(dtype, str(dtype).removeprefix("torch."))
    return quant.quant_storage(name, int(qmin), int(qmax), op=what)


def _stored(cx: Context, q: Any, st: quant.QuantStorage) -> Tensor:
    """The i8 the graph holds for the quantized operand ``q`` (torch's values, carried as f64)."""
    held = cx.stored.get(q.value.id)
    if held is not None and held[1] == st.offset:  # our own quantize's result: its i8 directly
        return held[0]
    value = cx.const_of(q)
    if value is not None:  # a frozen weight: its i8 made here, once, not cast on every call
        return cx.const(np.ascontiguousarray(np.asarray(value) - st.offset).astype(np.int8), "i8")
    if st.offset == 0:
        return q if q.dtype == "i8" else ops.astype(q, "i8")  # integers carried as f64: exact
    return ops.astype(ops.sub(q, float(st.offset)), "i8")


def _as_torch(cx: Context, q8: Tensor, st: quant.QuantStorage) -> Tensor:
    """A quantize result as torch's values: the i8 itself, or (u8) ``q8 + 128`` in f64, which is dead code
    unless something other than a dequantize reads it (a dequantize reads ``q8`` through ``cx.stored``)."""
    if st.offset == 0:
        return q8
    value = ops.add(ops.astype(q8, "f64"), float(st.offset))
    cx.stored[value.value.id] = (q8, st.offset)
    return value


def _channel_values(cx: Context, t: Any) -> np.ndarray | None:
    """Per-channel scales or zero points as values: None when they are not constants (not frozen)."""
    value = cx.const_of(t) if isinstance(t, Tensor) else np.asarray(t)
    return None if value is None else np.asarray(value).reshape(-1)


def _along(t: Any, axis: int, ndim: int) -> Tensor:
    """A per-channel tensor operand reshaped to broadcast along ``axis``, in f32."""
    shape = [1] * ndim
    shape[axis] = -1
    return ops.reshape(ops.astype(t, "f32"), tuple(shape))


@converts("quantized_decomposed.quantize_per_tensor.default")
def _quantize_per_tensor(cx: Context, x: Any, scale: float, zero_point: int, qmin: int, qmax: int,
                         dtype: Any) -> Tensor:
    _decomposed(cx)
    st = _storage(dtype, qmin, qmax, "quantize_per_tensor")
    (z,) = st.zero_points([zero_point])
    return _as_torch(cx, ops.quantize(ops.astype(x, "f32"), float(scale), z, qmin=st.qmin, qmax=st.qmax), st)


@converts("quantized_decomposed.dequantize_per_tensor.default")
def _dequantize_per_tensor(cx: Context, q: Any, scale: float, zero_point: int, qmin: int, qmax: int, dtype: Any,
                           *, out_dtype: Any = None) -> Tensor:
    _decomposed(cx)
    _check_out(out_dtype, "dequantize_per_tensor")
    st = _storage(dtype, qmin, qmax, "dequantize_per_tensor")
    (z,) = st.zero_points([zero_point])
    return ops.dequantize(_stored(cx, q, st), float(scale), z)


@converts("quantized_decomposed.quantize_per_channel.default")
def _quantize_per_channel(cx: Context, x: Any, scales: Any, zero_points: Any, axis: int, qmin: int, qmax: int,
                          dtype: Any) -> Tensor:
    _decomposed(cx)
    st = _storage(dtype, qmin, qmax, "quantize_per_channel")
    s, z = _channel_values(cx, scales), _channel_values(cx, zero_points)
    if s is None or z is None:
        raise UnsupportedError("quantize_per_channel: scales and zero points must be constants (frozen)")
    q8 = ops.quantize(ops.astype(x, "f32"), s, st.zero_points(z.astype(int).tolist()), axis=axis, qmin=st.qmin,
                      qmax=st.qmax)
    return _as_torch(cx, q8, st)


@converts("quantized_decomposed.dequantize_per_channel.default")
def _dequantize_per_channel(cx: Context, q: Any, scales: Any, zero_points: Any, axis: int, qmin: int, qmax: int,
                            dtype: Any, *, out_dtype: Any = None) -> Tensor:
    _decomposed(cx)
    _check_out(out_dtype, "dequantize_per_channel")
    st = _storage(dtype, qmin, qmax, "dequantize_per_channel")
    s, z = _channel_values(cx, scales), _channel_values(cx, zero_points)
    if s is None or z is None:  # not frozen: the same arithmetic on torch's values (no integer contraction)
        axis %= q.ndim
        f = ops.astype(q, "f32")
        return ops.mul(ops.sub(f, _along(zero_points, axis, q.ndim)), _along(scales, axis, q.ndim))
    return ops.dequantize(_stored(cx, q, st), s, st.zero_points(z.astype(int).tolist()), axis=axis)
