"""Integer (quantized) arithmetic as pure decisions: which dtype each op computes in, and the parameters of
quantize, dequantize and the requantize epilogue. No MLIR, no spec: `pbsdk.ops` imports it, and
``import pbsdk`` must not pull in the spec loader's dependencies (the nvgpu runtime runs without them).

Conventions (those of PyTorch's ``quantized_decomposed`` ops and of ONNX QuantizeLinear):

* ``quantize(x) = clamp(round_half_even(x / scale) + zero_point, qmin, qmax)`` computed in f32;
* ``dequantize(q) = (q - zero_point) * scale`` in f32;
* an i8 x i8 contraction accumulates exactly in i32 (`compute_dtype`), on an i8 -> i32 matrix unit where the
  spec has one;
* the requantize epilogue of a quantized linear/conv maps the i32 accumulator ``acc`` (with the input's
  zero point folded in) to the output's i8: ``clamp(round_half_even(acc * multiplier) + out_zero_point)``
  where ``multiplier = in_scale * weight_scale / out_scale`` per output channel (`plan_requantize`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pbsdk.core.errors import PbsdkError, UnsupportedError

#: Integer dtypes the graph carries, with their ranges.
INT_RANGES = {"i8": (-128, 127), "i32": (-(2 ** 31), 2 ** 31 - 1)}
#: What an integer contraction accumulates in.
INT_ACCUMULATOR = {"i8": "i32", "i32": "i32"}
#: Ops integer tensors support (anything else: dequantize, or astype to a float, first).
INT_OPS = frozenset({"input", "const", "cast", "matmul", "conv2d", "add", "sub", "mul", "maximum", "minimum",
                     "transpose", "reshape", "broadcast", "slice", "concat", "flip"})


def is_int(dtype: str) -> bool:
    return dtype in INT_RANGES


def compute_dtype(op: str, dtypes: Sequence[str]) -> str:
    """The dtype ``op`` on operands of ``dtypes`` computes (and, for a contraction, accumulates) in.

    Contractions: i8 x i8 -> i32, f16/bf16 -> f32, others their own dtype. Elementwise integer ops compute
    in their (common) integer dtype. Mixing integer and float operands, or an op integers do not support,
    is an `UnsupportedError` that names the op and the way out (dequantize or astype first)."""
    kinds = {is_int(d) for d in dtypes}
    if len(kinds) > 1:
        raise UnsupportedError(f"{op}: operands {', '.join(dtypes)} mix integer and float dtypes; dequantize "
                               "(pbsdk.ops.dequantize) or astype the integer operand first", op=op)
    if True in kinds:
        if op not in INT_OPS:
            raise UnsupportedError(f"{op} on integer tensors (dtype {', '.join(dtypes)}) is not supported; dequantize "
                                   "(pbsdk.ops.dequantize) or astype to a float first", op=op)
        if len(set(dtypes)) > 1:
            raise UnsupportedError(f"{op}: integer operands of different dtypes {', '.join(dtypes)}; astype "
                                   "one first", op=op)
        return INT_ACCUMULATOR[dtypes[0]] if op in ("matmul", "conv2d") else dtypes[0]
    if op in ("matmul", "conv2d"):
        return "f32" if dtypes[0] in ("f16", "bf16") else dtypes[0]
    return dtypes[0]


@dataclasses.dataclass(frozen=True)
class QuantParams:
    """Scales and zero points of a quantized tensor: one pair (per tensor, ``axis`` None) or one per index
    of ``axis`` (per channel)."""

    scale: tuple[float, ...]
    zero_point: tuple[int, ...]
    axis: int | None = None
    dtype: str = "i8"

    @property
    def qmin(self) -> int:
        return INT_RANGES[self.dtype][0]

    @property
    def qmax(self) -> int:
        return INT_RANGES[self.dtype][1]

    @property
    def per_channel(self) -> bool:
        return self.axis is not None


def quant_params(scale: float | Sequence[float], zero_point: int | Sequence[int] = 0, *, axis: int | None = None,
                 dtype: str = "i8", shape: Sequence[int] | None = None) -> QuantParams:
    """Checked `QuantParams`: positive finite scales, integer zero points inside the dtype's range, one per
    channel of ``shape[axis]`` when ``axis`` is given (a single zero point is repeated)."""
    if dtype != "i8":
        raise UnsupportedError(f"quantized dtype {dtype}: only i8 is supported", op="quantize")
    scales = (float(scale),) if isinstance(scale, (int, float)) else tuple(float(s) for s in scale)
    zps = (zero_point,) if isinstance(zero_point, (int,)) or hasattr(zero_point, "__index__") else tuple(zero_point)
    zps = tuple(int(z) for z in zps)  # type: ignore[union-attr]
    if axis is None:
        if len(scales) != 1 or len(zps) != 1:
            raise PbsdkError(f"per-tensor quantization takes one scale and one zero point, got {len(scales)} "
                             f"and {len(zps)} (pass axis= for per-channel)")
    else:
        if shape is not None:
            if not -len(shape) <= axis < len(shape):
                raise PbsdkError(f"quantization axis {axis} out of range for shape {tuple(shape)}")
            axis %= len(shape)
            n = shape[axis]
            if len(zps) == 1:
                zps = zps * n
            if len(scales) != n or len(zps) != n:
                raise PbsdkError(f"per-channel quantization on axis {axis} of shape {tuple(shape)} needs {n} scales "
                                 f"and zero points, got {len(scales)} and {len(zps)}")
    for s in scales:
        if not math.isfinite(s) or s <= 0:
            raise PbsdkError(f"quantization scales must be finite and > 0, got {s}")
    lo, hi = INT_RANGES[dtype]
    for z in zps:
        if not lo <= z <= hi:
            raise PbsdkError(f"zero point {z} is outside {dtype}'s range [{lo}, {hi}]")
    return QuantParams(scales, zps, axis, dtype)


@dataclasses.dataclass(frozen=True)
class Requantize:
    """The epilogue of a quantized contraction: ``clamp(round_half_even(acc * multiplier[c]) + zero_point)``
    on the i32 accumulator ``acc`` (input zero point already folded in), per output channel ``c``."""

    multiplier: tuple[float, ...]
    zero_point: int
    qmin: int
    qmax: int


def plan_requantize(x: QuantParams, w: QuantParams, out: QuantParams) -> Requantize:
    """The requantize epilogue of ``out = quantize(dequantize(x) @ dequantize(w))``-style contractions.

    ``x`` and ``out`` are per tensor; ``w`` per tensor or per output channel, symmetric (zero point 0:
    PT2E's and most int8 engines' weights), so the accumulator needs no weight zero-point term."""
    if x.per_channel or out.per_channel:
        raise UnsupportedError("quantized contraction: the input and output must be quantized per tensor",
                               op="matmul")
    if any(z != 0 for z in w.zero_point):
        raise UnsupportedError("quantized contraction: weights must be symmetric (zero point 0)", op="matmul")
    multiplier = tuple(x.scale[0] * s / out.scale[0] for s in w.scale)
    return Requantize(multiplier, out.zero_point[0], out.qmin, out.qmax)
