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
  where ``multiplier = in_scale * weight_scale / out_scale`` per output channel (`plan_requantize`);
* the graph holds quantized tensors in i8 whatever the framework's dtype: a u8 value ``q`` with zero point
  ``z`` is held as the i8 value ``q - 128`` with zero point ``z - 128`` (`quant_storage`). Every quantity the
  arithmetic uses is a difference ``q - z``, so this is bit-exact, and u8 activations (what PT2E's x86
  quantizer emits, asymmetric, any zero point) run on an i8 matrix unit;
* ``dequantize(x) @ dequantize(w)`` runs as the i8 contraction when `plan_integer_contraction` says so, and
  otherwise as the float contraction (still correct), with the reason.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from pbsdk.core.errors import PbsdkError, UnsupportedError

#: Integer dtypes the graph carries, with their ranges.
INT_RANGES = {"i8": (-128, 127), "i32": (-(2 ** 31), 2 ** 31 - 1)}
#: Framework dtypes of quantized tensors and their full ranges; the graph holds both in i8 (`quant_storage`).
QUANT_DTYPES = {"i8": (-128, 127), "u8": (0, 255)}
#: What an integer contraction accumulates in.
INT_ACCUMULATOR = {"i8": "i32", "i32": "i32"}
#: Ops integer tensors support (anything else: dequantize, or astype to a float, first).
INT_OPS = frozenset({"input", "const", "cast", "matmul", "conv2d", "add", "sub", "mul", "maximum", "minimum",
                     "transpose", "reshape", "broadcast", "slice", "concat", "flip", "interleave"})


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
    #: The clamp range of quantize, when narrower than the dtype's (e.g. [-127, 127] for symmetric weights).
    qrange: tuple[int, int] | None = None

    @property
    def qmin(self) -> int:
        return self.qrange[0] if self.qrange is not None else INT_RANGES[self.dtype][0]

    @property
    def qmax(self) -> int:
        return self.qrange[1] if self.qrange is not None else INT_RANGES[self.dtype][1]

    @property
    def per_channel(self) -> bool:
        return self.axis is not None


def quant_params(scale: float | Sequence[float], zero_point: int | Sequence[int] = 0, *, axis: int | None = None,
                 dtype: str = "i8", shape: Sequence[int] | None = None, qmin: int | None = None,
                 qmax: int | None = None) -> QuantParams:
    """Checked `QuantParams`: positive finite scales, integer zero points inside the dtype's range, one per
    channel of ``shape[axis]`` when ``axis`` is given (a single zero point is repeated); ``qmin``/``qmax``
    (default: the dtype's range) a range inside the dtype's."""
    if dtype != "i8":
        raise UnsupportedError(f"quantized dtype {dtype}: the graph holds quantized tensors in i8 (u8 through "
                               "quant_storage)", op="quantize")
    lo, hi = INT_RANGES[dtype]
    qrange = None
    if qmin is not None or qmax is not None:
        qrange = (lo if qmin is None else int(qmin), hi if qmax is None else int(qmax))
        if not lo <= qrange[0] < qrange[1] <= hi:
            raise PbsdkError(f"quantization range [{qrange[0]}, {qrange[1]}] is not a range inside {dtype}'s "
                             f"[{lo}, {hi}]")
        if qrange == (lo, hi):
            qrange = None
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
    for z in zps:
        if not lo <= z <= hi:
            raise PbsdkError(f"zero point {z} is outside {dtype}'s range [{lo}, {hi}]")
    return QuantParams(scales, zps, axis, dtype, qrange)


@dataclasses.dataclass(frozen=True)
class QuantStorage:
    """How a quantized tensor of the framework dtype ``dtype`` (``QUANT_DTYPES``) is held in the graph's i8:
    the value ``q`` as ``q - offset``, its zero point ``z`` as ``z - offset`` and its clamp range
    ``[qmin, qmax]`` (here already shifted) likewise. Exact: quantize's rounding happens before the zero point
    is added, and dequantize and the integer contractions only use differences ``q - z``."""

    dtype: str
    offset: int
    qmin: int
    qmax: int

    def zero_points(self, zero_point: Sequence[int]) -> tuple[int, ...]:
        """The stored zero points of the framework's ``zero_point`` values."""
        return tuple(int(z) - self.offset for z in zero_point)


def quant_storage(dtype: str, qmin: int, qmax: int, *, op: str = "quantize") -> QuantStorage:
    """The i8 storage of a framework quantized tensor of ``dtype`` (``"i8"`` or ``"u8"``) quantized to
    ``[qmin, qmax]``: u8 is shifted by 128 onto i8 (``[0, 255]`` -> ``[-128, 127]``), i8 held as is. Any other
    dtype (int16, int32, 4-bit, ...) or a range outside the dtype's is an `UnsupportedError` naming ``op``
    (the caller keeps that op in float)."""
    if dtype not in QUANT_DTYPES:
        raise UnsupportedError(f"{op}: quantized dtype {dtype}; pbsdk holds i8 and u8 quantized tensors (in i8)",
                               op=op)
    lo, hi = QUANT_DTYPES[dtype]
    if not lo <= qmin < qmax <= hi:
        raise UnsupportedError(f"{op}: range [{qmin}, {qmax}] is not a range inside {dtype}'s [{lo}, {hi}]", op=op)
    offset = lo - INT_RANGES["i8"][0]
    return QuantStorage(dtype, offset, qmin - offset, qmax - offset)


@dataclasses.dataclass(frozen=True)
class IntegerContraction:
    """Whether a contraction of two dequantized tensors runs as the i8 contraction with exact i32
    accumulation (``reason`` empty), or in float, and why (``reason``)."""

    reason: str = ""

    @property
    def integer(self) -> bool:
        return not self.reason


def plan_integer_contraction(x: QuantParams, w: QuantParams, *, channel_axis: int) -> IntegerContraction:
    """``dequantize(x) (*) dequantize(w)`` (a matmul or convolution, ``w`` the weight whose output channels lie
    along ``channel_axis``) as an integer contraction: both i8 (u8 held as i8: `quant_storage`), ``x`` per
    tensor with any zero point (folded in as ``zx * (1 (*) w)``), ``w`` symmetric (zero point 0, so no
    ``zw * sum(x)`` term) per tensor or per output channel. Anything else: the float contraction."""
    if x.dtype != "i8" or w.dtype != "i8":
        return IntegerContraction(f"operands are {x.dtype} and {w.dtype}, not i8")
    if x.per_channel:
        return IntegerContraction(f"the input is quantized per channel (axis {x.axis}), not per tensor")
    if any(z != 0 for z in w.zero_point):
        return IntegerContraction("the weight is asymmetric (a nonzero zero point)")
    if w.per_channel and w.axis != channel_axis:
        return IntegerContraction(f"the weight is quantized per channel along axis {w.axis}, not along its "
                                  f"output channels (axis {channel_axis})")
    return IntegerContraction()


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
