"""The one place numerical tolerances are declared, and the one helper every numerics test uses.

A result ``a`` matches an expected ``e`` elementwise when ``|a - e| <= atol + rtol * |e|`` (numpy's
``isclose`` rule, asymmetric in ``e``). Tolerances are looked up by (op name, dtype name):

* ``TABLE`` holds the defaults, one `Tolerance` per op and dtype.
* Ops in ``SCALED_OPS`` (sums, contractions, and composites that contain a sum) widen their tolerance with
  the length of the reduction: ``tolerance("matmul", "float32", reduction_size=K)`` multiplies atol and
  rtol by ``sqrt(K)`` (random rounding errors of a K-term sum grow like ``sqrt(K)``).
* A contraction or sum whose unit accumulates in a wider dtype than its operands (bf16 or f16 operands, f32
  accumulator: every matrix unit and vector path pbsdk emits) passes ``accumulator=``: its tolerance is
  then one rounding of the result to ``dtype`` plus the accumulator's contraction tolerance scaled by
  ``sqrt(K)``, not the operand dtype's tolerance scaled by ``sqrt(K)`` (which at K = 1024 in bf16 would
  allow an error of 50%).
* `override` (a context manager) replaces a tolerance for a block; a conformance suite uses it to let
  users tighten or loosen the defaults. An override is used exactly as given (not scaled).

Pure numpy: nothing here imports MLIR or the rest of pbsdk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator
from typing import Any

import ml_dtypes
import numpy as np

__all__ = [
    "DTYPES", "OPS", "SCALED_OPS", "TABLE", "Tolerance", "assert_close", "dtype_name", "max_error", "override",
    "tolerance",
]


@dataclasses.dataclass(frozen=True)
class Tolerance:
    """``|actual - expected| <= atol + rtol * |expected|``, elementwise."""

    atol: float
    rtol: float

    def __post_init__(self) -> None:
        for name in ("atol", "rtol"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"Tolerance.{name} must be a finite number >= 0, got {value!r}")

    def scaled(self, factor: float) -> Tolerance:
        return Tolerance(self.atol * factor, self.rtol * factor)

    def __add__(self, other: Tolerance) -> Tolerance:
        return Tolerance(self.atol + other.atol, self.rtol + other.rtol)

    def __str__(self) -> str:
        return f"atol={self.atol:.3g}, rtol={self.rtol:.3g}"


# ------------------------------------------------------------------------------------------------ dtypes

#: Canonical dtype names (numpy's spelling; bfloat16 is ``ml_dtypes.bfloat16``).
DTYPES = ("float64", "float32", "float16", "bfloat16")
_BITS = {"float64": 64, "float32": 32, "float16": 16, "bfloat16": 16}
_BF16 = np.dtype(ml_dtypes.bfloat16)

_ALIASES = {
    "f64": "float64", "float64": "float64", "double": "float64",
    "f32": "float32", "float32": "float32", "float": "float32",
    "f16": "float16", "float16": "float16", "half": "float16",
    "bf16": "bfloat16", "bfloat16": "bfloat16",
}


def dtype_name(dtype: Any) -> str:
    """The canonical name (``"float32"``, ...) of a dtype given as a string (``"f32"``, ``"float32"``), a
    numpy dtype or scalar type, or an array."""
    if isinstance(dtype, str):
        name = dtype.lower()
    elif isinstance(dtype, (np.ndarray, np.generic)):
        name = dtype.dtype.name
    else:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            raise ValueError(f"not a dtype: {dtype!r}") from None
    if name not in _ALIASES:
        raise ValueError(f"no tolerances for dtype {dtype!r}; known: {', '.join(DTYPES)}")
    return _ALIASES[name]


# ------------------------------------------------------------------------------------------------- table

#: Op names, by how their error behaves.
_EXACT = ("maximum", "minimum", "max", "min", "relu", "neg", "abs", "transpose", "reshape", "broadcast_to")
_ROUNDED = ("add", "sub", "mul", "div", "sqrt", "astype")      # correctly rounded in IEEE arithmetic
_TRANSCENDENTAL = ("exp", "log", "tanh", "sigmoid", "erf", "rsqrt", "pow", "gelu", "gelu_tanh")
_SUMS = ("sum", "mean")
_CONTRACTIONS = ("matmul", "conv2d")
_COMPOSITES = ("softmax", "log_softmax", "layernorm", "mlp", "attention")

#: Every op with a table entry.
OPS = _EXACT + _ROUNDED + _TRANSCENDENTAL + _SUMS + _CONTRACTIONS + _COMPOSITES

#: Ops whose default tolerance widens with ``reduction_size``.
SCALED_OPS = frozenset(_SUMS + _CONTRACTIONS + _COMPOSITES)

# Per dtype: unit roundoff u (half an ulp at 1.0) is 1.1e-16 (f64), 6e-8 (f32), 4.9e-4 (f16), 3.9e-3 (bf16).
# Results are compared after rounding to the dtype, so half-precision entries allow for one rounding of
# the result plus one of any intermediate; f32 entries allow for a few ulp of a polynomial approximation
# (MLIR's math expansions) and for flushes near zero through atol.
_CATEGORY_DEFAULTS: dict[str, dict[str, Tolerance]] = {
    "float64": {
        "exact": Tolerance(0.0, 0.0),
        "rounded": Tolerance(1e-15, 1e-15),
        "transcendental": Tolerance(1e-13, 1e-13),
        "sum": Tolerance(1e-14, 1e-14),
        "contraction": Tolerance(1e-14, 1e-14),
        "composite": Tolerance(1e-13, 1e-13),
    },
    "float32": {
        "exact": Tolerance(0.0, 0.0),
        "rounded": Tolerance(1e-7, 2e-7),
        "transcendental": Tolerance(1e-6, 1e-5),
        "sum": Tolerance(1e-6, 1e-5),
        "contraction": Tolerance(1e-5, 1e-5),
        "composite": Tolerance(1e-6, 1e-5),
    },
    "float16": {
        "exact": Tolerance(0.0, 0.0),
        "rounded": Tolerance(1e-3, 1e-3),
        "transcendental": Tolerance(2e-3, 2e-3),
        "sum": Tolerance(1e-3, 1e-3),
        "contraction": Tolerance(2e-3, 2e-3),
        "composite": Tolerance(2e-3, 2e-3),
    },
    "bfloat16": {
        "exact": Tolerance(0.0, 0.0),
        "rounded": Tolerance(8e-3, 8e-3),
        "transcendental": Tolerance(1.6e-2, 1.6e-2),
        "sum": Tolerance(8e-3, 8e-3),
        "contraction": Tolerance(1.6e-2, 1.6e-2),
        "composite": Tolerance(1.6e-2, 1.6e-2),
    },
}

_CATEGORY = {
    **{op: "exact" for op in _EXACT}, **{op: "rounded" for op in _ROUNDED},
    **{op: "transcendental" for op in _TRANSCENDENTAL}, **{op: "sum" for op in _SUMS},
    **{op: "contraction" for op in _CONTRACTIONS}, **{op: "composite" for op in _COMPOSITES},
}

#: The defaults: (op name, canonical dtype name) -> Tolerance (before any reduction-size scaling).
TABLE: dict[tuple[str, str], Tolerance] = {
    (op, dt): _CATEGORY_DEFAULTS[dt][_CATEGORY[op]] for op in OPS for dt in DTYPES
}

_overrides: list[tuple[str, str, Tolerance]] = []


def _known_op(op: str) -> str:
    if op not in _CATEGORY:
        raise KeyError(f"no tolerance declared for op {op!r}; known ops: {', '.join(sorted(_CATEGORY))}")
    return op


def tolerance(op: str, dtype: Any, *, reduction_size: int = 1, accumulator: Any = None) -> Tolerance:
    """The tolerance for ``op`` computed in ``dtype``.

    For ops in `SCALED_OPS`, atol and rtol are multiplied by ``sqrt(reduction_size)`` (the number of terms
    summed into one output element: K of a matmul, C/groups*KH*KW of a conv2d, the reduced size of a sum).
    A contraction or sum (matmul, conv2d, sum, mean) given a wider ``accumulator`` than ``dtype`` gets one rounding to
    ``dtype`` (its "astype" entry) plus the accumulator's scaled contraction tolerance.
    An active `override` wins and is returned as given.
    """
    name = dtype_name(dtype)
    if reduction_size < 1:
        raise ValueError(f"reduction_size must be >= 1, got {reduction_size}")
    for o_op, o_dt, tol in reversed(_overrides):
        if o_op in (op, "*") and o_dt in (name, "*"):
            return tol
    base = TABLE[(_known_op(op), name)]
    if accumulator is not None and op in _CONTRACTIONS + _SUMS:
        acc = dtype_name(accumulator)
        if _BITS[acc] > _BITS[name]:
            return TABLE[("astype", name)] + tolerance(op, acc, reduction_size=reduction_size)
    if op in SCALED_OPS and reduction_size > 1:
        return base.scaled(math.sqrt(reduction_size))
    return base


@contextlib.contextmanager
def override(op: str, dtype: Any, tol: Tolerance) -> Iterator[Tolerance]:
    """Use ``tol`` for ``op`` in ``dtype`` inside the block (``"*"`` matches every op or dtype).

    Nested overrides stack; the innermost wins. The overriding tolerance is not scaled by reduction size.
    """
    if not isinstance(tol, Tolerance):
        raise TypeError(f"override needs a Tolerance, got {type(tol).__name__}")
    entry = (op if op == "*" else _known_op(op), "*" if dtype == "*" else dtype_name(dtype), tol)
    _overrides.append(entry)
    try:
        yield tol
    finally:
        # Remove this entry (not simply the last one), so interleaved exits stay correct.
        for i in range(len(_overrides) - 1, -1, -1):
            if _overrides[i] is entry:
                del _overrides[i]
                break


# ---------------------------------------------------------------------------------------------- checking

def _as_array(x: Any, what: str) -> np.ndarray:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, (np.generic, int, float)):
        return np.asarray(x)
    raise AssertionError(f"{what} is a {type(x).__name__}, not a numpy array")


def _errors(a: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Absolute and relative error in float64; entries that agree (equal infinities, NaN at both) are 0."""
    a64 = a.astype(np.float64)
    e64 = e.astype(np.float64)
    same = (a64 == e64) | (np.isnan(a64) & np.isnan(e64))
    with np.errstate(invalid="ignore", over="ignore"):
        abs_err = np.where(same, 0.0, np.abs(a64 - e64))
        abs_err = np.where(np.isnan(abs_err), np.inf, abs_err)
        with np.errstate(divide="ignore"):
            rel_err = np.where(abs_err == 0, 0.0, abs_err / np.abs(e64))
    return abs_err, rel_err


def max_error(actual: Any, expected: Any) -> tuple[float, float]:
    """``(max absolute error, max relative error)`` over all elements, in float64.

    Elements that agree exactly (including equal infinities and NaN at both) count as 0; a relative error
    against an expected 0 is inf. Empty arrays give ``(0.0, 0.0)``.
    """
    a = _as_array(actual, "actual")
    e = _as_array(expected, "expected")
    if a.shape != e.shape:
        raise ValueError(f"max_error: shapes differ: {a.shape} vs {e.shape}")
    if a.size == 0:
        return 0.0, 0.0
    abs_err, rel_err = _errors(a, e)
    return float(abs_err.max()), float(rel_err.max())


def assert_close(actual: Any, expected: Any, *, op: str, dtype: Any = None, reduction_size: int = 1,
                 tol: Tolerance | None = None, accumulator: Any = None) -> None:
    """Assert that ``actual`` matches ``expected`` within the tolerance of ``op`` in ``dtype``.

    Checks, in order: both are arrays of the same shape; ``actual`` has dtype ``dtype`` (when given) and
    otherwise ``expected``'s dtype; NaNs at the same positions; then ``|a - e| <= atol + rtol * |e|``
    elementwise with ``tol`` or else ``tolerance(op, dtype, reduction_size=...)``. The failure message gives
    the max absolute and relative errors, the worst element's index and values, the mismatch count and
    the tolerance used.
    """
    a = _as_array(actual, "actual")
    e = _as_array(expected, "expected")
    where = f"{op}: "
    if a.shape != e.shape:
        raise AssertionError(f"{where}shape mismatch: actual {a.shape}, expected {e.shape}")
    want = dtype_name(dtype) if dtype is not None else None
    if want is None:
        if a.dtype != e.dtype:
            raise AssertionError(f"{where}dtype mismatch: actual {a.dtype}, expected {e.dtype}")
        want = dtype_name(e.dtype)
    elif a.dtype.name != want:
        raise AssertionError(f"{where}dtype mismatch: actual {a.dtype}, expected {want}")
    if a.dtype.kind != "f" and a.dtype != _BF16:
        raise AssertionError(f"{where}assert_close compares floating-point arrays, got {a.dtype}")
    if tol is None:
        tol = tolerance(op, want, reduction_size=reduction_size, accumulator=accumulator)
    if a.size == 0:
        return

    a64 = a.astype(np.float64)
    e64 = e.astype(np.float64)
    nan_a, nan_e = np.isnan(a64), np.isnan(e64)
    if not np.array_equal(nan_a, nan_e):
        where_nan = np.argwhere(nan_a != nan_e)
        first = tuple(int(i) for i in where_nan[0])
        raise AssertionError(
            f"{where}NaN positions differ at {len(where_nan)} of {a.size} elements; first at index {first}: "
            f"actual {a64[first]!r}, expected {e64[first]!r}")

    abs_err, rel_err = _errors(a, e)
    with np.errstate(invalid="ignore", over="ignore"):
        bound = tol.atol + tol.rtol * np.abs(np.where(np.isfinite(e64), e64, 0.0))
        bad = abs_err > bound
    if not bad.any():
        return
    with np.errstate(divide="ignore", invalid="ignore"):
        excess = np.where(bad, abs_err / np.where(bound > 0, bound, np.finfo(np.float64).tiny), 0.0)
    worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), a.shape))
    count = int(bad.sum())
    raise AssertionError(
        f"{where}{count} of {a.size} elements ({100.0 * count / a.size:.3g}%) differ beyond tolerance "
        f"({tol}; dtype {want}, reduction_size {reduction_size}).\n"
        f"  max abs error {abs_err.max():.6g}, max rel error {rel_err.max():.6g}\n"
        f"  worst index {worst}: actual {a64[worst]!r}, expected {e64[worst]!r}, "
        f"abs error {abs_err[worst]:.6g}, allowed {bound[worst]:.6g}")
