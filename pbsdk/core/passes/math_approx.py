"""Pass ``math-approx``: rewrite ``math.exp``/``log``/``tanh``/``erf`` (and ``powf``) into straight-line ``arith``.

Upstream lowers these ops to libm calls (``expf``, ``logf``, ``erff``) or to LLVM intrinsics that become
libm calls, and LLVM's loop vectoriser cannot vectorise a loop that calls them: GELU over 4M floats ran one
``erff`` call per element. This pass replaces each op by a branch-free sequence of ``arith`` ops (float
arithmetic, compares and selects, ``arith.bitcast`` and integer shifts for the exponent field), which
vectorises like any other arithmetic. It works on scalars, vectors and statically shaped tensors alike
(constants are splats of the operand's shape).

Types: f32 is computed directly; f16 and bf16 are extended to f32, computed, and truncated back (one
rounding, so the result is as good as f32 then rounded). f64 ops are left alone on purpose: these
polynomials are sized for f32 accuracy, and f64 keeps the correctly rounded-ish libm route.

``math.powf`` is first expanded by upstream's ``math-expand-ops{ops=powf}`` (``exp(b * log(a))``, what the
cpu target's lowering did anyway); the ``exp``/``log`` it produces are then approximated here. ``sqrt``,
``rsqrt`` and ``absf`` (the other math ops pbsdk emits) already lower to vectorisable LLVM intrinsics and
are not touched.

Methods (coefficients fitted offline, see ``_fit`` notes next to each table; errors are measured on the
compiled code, f32, against float64 references, by ``tests/numerics/test_math_approx.py``):

* ``exp``: clamp to [-104, 89]; ``n = round(x / ln2)`` by the 1.5*2^23 "magic number" addition;
  ``r = x - n*ln2`` with a Cody–Waite two-constant split of ln2; ``exp(r) = 1 + r + r^2 P(r)``; scale by
  ``2^n`` built from exponent bits as ``2^(n//2) * 2^(n - n//2)`` so that results near overflow and in the
  subnormal range come out right (inf above ~88.72, subnormals down to 0 below ~-103.9). NaN propagates.
* ``log``: subnormal inputs are scaled by 2^23 first; ``x = 2^k * m`` with ``m`` in [sqrt(1/2), sqrt(2))
  taken from the bits; ``log(x) = k*ln2 + f - f^2/2 + f^3 P(f)`` with ``f = m - 1``. ``log(0) = -inf``,
  ``log(x<0) = NaN``, ``log(inf) = inf``, NaN propagates.
* ``tanh`` and ``erf``: ``y = 2s / (1 + s^2)`` with ``2s`` one odd rational ``|x| P(x^2) / Q(x^2)``
  (``|x|`` clamped to where the function rounds to 1: 9.2 and 4), evaluated as ``4NQ / (4Q^2 + N^2)``: about
  15 FMAs, multiplies, compares and selects and one division per vector, no ``exp``. Near saturation the
  half-angle form damps the rounding errors of P and Q, which a plain ``x P/Q`` passes on in full (~3e-7
  absolute, twice the error measured here). ±inf give ±1, NaN propagates, ±0 keeps its sign. Measured:
  tanh 4.4 ulp (1.7e-7 absolute), erf 3.9 ulp (1.9e-7); the exp-based forms this replaced had 1.2 and
  1.0 ulp at about 1.6x the cost, and upstream MLIR's tanh (Eigen's [13/6] rational,
  ``populateMathPolynomialApproximationPatterns``) has 4.3 ulp, 2.6e-7 absolute near ±1, and ran ~10 %
  slower in an elementwise tanh-GELU.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from mlir import ir, passmanager
from mlir.dialects import arith

from pbsdk.core.ir.builder import element_of
from pbsdk.core.passes import ops_named

# --------------------------------------------------------------------------------------------- constants
# All coefficients below were fitted in float64 with numpy: Lawson's iteratively reweighted least squares
# (which converges to the minimax fit) on 4000 Chebyshev nodes of the range, weighted by 1/|f| so that it
# minimises the relative error, then rounded to the nearest f32. "fit" is the max relative error of the
# fit in float64; the measured errors of the compiled f32 code are in the test file.

_LOG2E = 1.4426950216293335          # f32(1/ln 2)
_LN2_HI = 0.693115234375             # ln 2 with its low 12 mantissa bits cleared: n*_LN2_HI is exact, |n|<=150
_LN2_LO = 3.194618329871446e-05      # f32(ln 2 - _LN2_HI)
_MAGIC = 12582912.0                  # 1.5 * 2^23: adding it rounds to an integer kept in the low mantissa bits

# exp(r) = 1 + r + r^2 * (c2 + c3 r + c4 r^2 + c5 r^3 + c6 r^4), r in [-ln2/2, ln2/2]; fit 3.1e-9.
_EXP_P = (0.4999999403953552, 0.1666652113199234, 0.04166838899254799, 0.008368710055947304,
          0.0013814610429108143)

# log(1 + f) = f - f^2/2 + f^3 * (c3 + c4 f + ... + c10 f^7), f in [sqrt(1/2) - 1, sqrt(2) - 1]; fit 5.8e-9.
_LOG_P = (0.3333333134651184, -0.250008225440979, 0.20001226663589478, -0.16623356938362122,
          0.14201761782169342, -0.131601944565773, 0.12761549651622772, -0.07634429633617401)

# tanh and erf: y = f(x) is written as y = 2s / (1 + s^2) (the tangent half-angle map), and the odd
# function s(x) = y / (1 + sqrt(1 - y^2)) is approximated by a rational 2s = x P(x^2) / Q(x^2). Near
# saturation s -> 1 and dy/ds = 2(1 - s^2)/(1 + s^2)^2 -> 0, so the rounding errors of P and Q (a few
# half-ulps each) barely reach y; written directly as y = x P/Q they would cost ~3e-7 absolute error there,
# which GELU's 1 + tanh / 1 + erf turns into most of its f32 tolerance. The fits minimise the relative error
# of 2s weighted by the relative sensitivity of y, (1 - s^2)/(1 + s^2) (Loeb's linearisation iterated with
# Lawson's weights on 6000 Chebyshev nodes in t = x^2 over [0, c^2], Q(0) = 1), where c is past the point at
# which f rounds to 1 in f32 and x is clamped to [-c, c].
# tanh: 2s = 2 tanh(x/2); P of degree 2 with P(0) = 1 (tiny x come back exactly), Q of degree 3, c = 9.2
# (tanh rounds to 1 from 9.011 on); weighted fit 7.5e-9.
_TANH_BIG = 9.2
_TANH_P = (1.0, 0.02976103127002716, 0.00011398519563954324)
_TANH_Q = (1.0, 0.11309431493282318, 0.0012052220990881324, 1.2235311714903219e-06)
# erf: P and Q of degree 4, P(0) = 2/sqrt(pi), c = 4 (erf rounds to 1 from 3.919 on); weighted fit 2.5e-8.
_ERF_BIG = 4.0
_ERF_P = (1.128379225730896, 0.21764026582241058, 0.024914752691984177, 0.0014037633081898093,
          -5.096388576930622e-06)
_ERF_Q = (1.0, 0.2079029232263565, 0.04086665064096451, 0.003816667478531599, 3.658427522168495e-05)

_FLT_MIN = 1.1754943508222875e-38    # smallest normal f32
_SQRT_HALF_BITS = 0x3F3504F3         # bits of f32(sqrt(1/2))

_CONTRACT = "#arith.fastmath<contract>"  # lets LLVM fuse a multiply and an add into one FMA


# ---------------------------------------------------------------------------------------------- builder

class _Builder:
    """Emits f32 arithmetic on values of one shape (scalar, vector or static tensor) at the insertion point."""

    def __init__(self, like: ir.Type) -> None:
        self.f32 = ir.F32Type.get()
        self.i32 = ir.IntegerType.get_signless(32)
        self.ft = _with_element(like, self.f32)
        self.it = _with_element(like, self.i32)
        self.contract = ir.Attribute.parse(_CONTRACT)

    # Constants are splats of the operand's shape; duplicates are merged later by canonicalize.
    def f(self, value: float) -> ir.Value:
        return self._const(self.ft, ir.FloatAttr.get(self.f32, value))

    def i(self, value: int) -> ir.Value:
        return self._const(self.it, ir.IntegerAttr.get(self.i32, value))

    @staticmethod
    def _const(t: ir.Type, scalar: ir.Attribute) -> ir.Value:
        attr = ir.DenseElementsAttr.get_splat(t, scalar) if isinstance(t, ir.ShapedType) else scalar
        return arith.ConstantOp(t, attr).result

    def add(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.addf(a, b, fastmath=self.contract)

    def sub(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.subf(a, b, fastmath=self.contract)

    def mul(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.mulf(a, b, fastmath=self.contract)

    def fma(self, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
        """a*b + c (fused where the chip has FMA)."""
        return self.add(self.mul(a, b), c)

    def horner(self, x: ir.Value, coeffs: Sequence[float]) -> ir.Value:
        """coeffs[0] + coeffs[1] x + ... (Horner's scheme from the highest degree)."""
        acc = self.f(coeffs[-1])
        for c in reversed(coeffs[:-1]):
            acc = self.fma(acc, x, self.f(c))
        return acc

    def cmp(self, pred: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.cmpf(getattr(arith.CmpFPredicate, pred), a, b)

    def select(self, cond: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.select(cond, a, b)

    def bits(self, x: ir.Value) -> ir.Value:
        return arith.bitcast(self.it, x)

    def float(self, n: ir.Value) -> ir.Value:
        return arith.bitcast(self.ft, n)

    def abs(self, x: ir.Value) -> ir.Value:
        return self.float(arith.andi(self.bits(x), self.i(0x7FFFFFFF)))

    def with_sign_of(self, mag: ir.Value, x: ir.Value) -> ir.Value:
        """``mag`` (non-negative or NaN) with the sign bit of ``x``."""
        sign = arith.andi(self.bits(x), self.i(-0x80000000))
        return self.float(arith.ori(self.bits(mag), sign))

    def pow2(self, n: ir.Value) -> ir.Value:
        """2^n for an i32 n in [-126, 127], by writing n + 127 into the exponent field."""
        return self.float(arith.shli(arith.addi(n, self.i(127)), self.i(23)))


def _with_element(like: ir.Type, element: ir.Type) -> ir.Type:
    if isinstance(like, ir.VectorType):
        return ir.VectorType.get(like.shape, element, scalable=like.scalable_dims)
    if isinstance(like, ir.RankedTensorType):
        return ir.RankedTensorType.get(like.shape, element)
    return element


# ---------------------------------------------------------------------------------------------- methods

def _exp(b: _Builder, x: ir.Value) -> ir.Value:
    # Clamp: above 89 the result is inf, below -104 it is 0 (the smallest subnormal is 2^-149 = e^-103.3).
    # Ordered compares are false for NaN, so NaN passes through and poisons the result.
    x = b.select(b.cmp("OGT", x, b.f(89.0)), b.f(89.0), x)
    x = b.select(b.cmp("OLT", x, b.f(-104.0)), b.f(-104.0), x)
    # n = round(x / ln2): adding 1.5*2^23 leaves the integer in the low mantissa bits.
    k = b.fma(x, b.f(_LOG2E), b.f(_MAGIC))
    nf = b.sub(k, b.f(_MAGIC))
    # r = x - n ln2 in two steps (Cody–Waite): n*_LN2_HI is exact, so the first subtraction is exact.
    r = b.fma(nf, b.f(-_LN2_HI), x)
    r = b.fma(nf, b.f(-_LN2_LO), r)
    # exp(r) = 1 + (r + r^2 P(r)); adding the 1 last keeps the small terms' bits.
    p = b.add(b.f(1.0), b.fma(b.mul(r, r), b.horner(r, _EXP_P), r))
    # 2^n in two factors, each a normal number for n in [-150, 128]: p * 2^n1 is exact, the second
    # product rounds once (to inf above the overflow threshold, to a subnormal or 0 below -87.3).
    n = arith.subi(b.bits(k), b.bits(b.f(_MAGIC)))
    n1 = arith.shrsi(n, b.i(1))
    n2 = arith.subi(n, n1)
    return b.mul(b.mul(p, b.pow2(n1)), b.pow2(n2))


def _log(b: _Builder, x: ir.Value) -> ir.Value:
    # Subnormal inputs: scale by 2^23 into the normal range and take 23 off the exponent.
    tiny = b.cmp("OLT", x, b.f(_FLT_MIN))
    xs = b.select(tiny, b.mul(x, b.f(8388608.0)), x)
    bias = arith.select(tiny, b.i(23), b.i(0))
    # x = 2^k * m with m in [sqrt(1/2), sqrt(2)): subtracting the bits of sqrt(1/2) makes the exponent field
    # of the difference floor(log2(x / sqrt(1/2))); removing that exponent from x's bits leaves m.
    ix = b.bits(xs)
    k = arith.shrsi(arith.subi(ix, b.i(_SQRT_HALF_BITS)), b.i(23))
    m = b.float(arith.subi(ix, arith.shli(k, b.i(23))))
    kf = arith.sitofp(b.ft, arith.subi(k, bias))
    # log(1 + f) = f + f^2 (-1/2 + f P(f)); k ln2 added as an exact high part and a low part.
    f = b.sub(m, b.f(1.0))
    tail = b.mul(b.mul(f, f), b.fma(f, b.horner(f, _LOG_P), b.f(-0.5)))
    lo = b.fma(kf, b.f(_LN2_LO), tail)
    y = b.fma(kf, b.f(_LN2_HI), b.add(f, lo))
    # Special values: +inf -> +inf, ±0 -> -inf, x < 0 or NaN -> NaN (ULT is true for unordered).
    y = b.select(b.cmp("OEQ", x, b.f(math.inf)), b.f(math.inf), y)
    y = b.select(b.cmp("OEQ", x, b.f(0.0)), b.f(-math.inf), y)
    return b.select(b.cmp("ULT", x, b.f(0.0)), b.f(math.nan), y)


def _half_angle(b: _Builder, x: ir.Value, c: float, p: Sequence[float], q: Sequence[float]) -> ir.Value:
    """An odd function with values in [-1, 1] (tanh, erf) as ``2s / (1 + s^2)`` with ``2s = x P(t) / Q(t)``,
    ``t = x^2``: with ``N = |x| P(t)``, ``y = 4 N Q / (4 Q^2 + N^2)``, one division.

    |x| is clamped to ``c``, so ±inf saturate to ±1; NaN passes the ordered compares and propagates; the
    sign of x (±0 included) is put back at the end."""
    ax = b.abs(x)
    ax = b.select(b.cmp("OGT", ax, b.f(c)), b.f(c), ax)
    t = b.mul(ax, ax)
    n = b.mul(ax, b.horner(t, p))
    q_ = b.horner(t, q)
    q4 = b.mul(q_, b.f(4.0))
    y = arith.divf(b.mul(q4, n), b.fma(n, n, b.mul(q4, q_)))
    # 2s / (1 + s^2) <= 1 exactly; rounding can leave one ulp above it.
    y = b.select(b.cmp("OGT", y, b.f(1.0)), b.f(1.0), y)
    return b.with_sign_of(y, x)


def _tanh(b: _Builder, x: ir.Value) -> ir.Value:
    return _half_angle(b, x, _TANH_BIG, _TANH_P, _TANH_Q)


def _erf(b: _Builder, x: ir.Value) -> ir.Value:
    return _half_angle(b, x, _ERF_BIG, _ERF_P, _ERF_Q)


_METHODS: dict[str, Callable[[_Builder, ir.Value], ir.Value]] = {
    "math.exp": _exp, "math.log": _log, "math.tanh": _tanh, "math.erf": _erf,
}

_HALF_TYPES = (ir.F16Type, ir.BF16Type)


def _rewritable(t: ir.Type) -> bool:
    """f32/f16/bf16 scalars, fixed-size vectors and static tensors of them (f64 stays with libm)."""
    if isinstance(t, ir.VectorType) and any(t.scalable_dims):
        return False
    if isinstance(t, ir.ShapedType) and not (isinstance(t, (ir.VectorType, ir.RankedTensorType))
                                             and t.has_static_shape):
        return False
    return isinstance(element_of(t), (ir.F32Type, *_HALF_TYPES))


@dataclasses.dataclass(frozen=True)
class MathApprox:
    """Replace f32/f16/bf16 ``math.exp``, ``math.log``, ``math.tanh``, ``math.erf`` (and ``math.powf``, by
    way of upstream's expansion to exp/log) by branch-free, vectorisable ``arith`` code.

    Contract: after the pass no such op on those element types remains; f64 ops and ops on scalable
    vectors or dynamically shaped tensors are left as they were. ``ops`` chooses which ops to rewrite.
    """

    name = "math-approx"
    ops: tuple[str, ...] = ("exp", "log", "tanh", "erf", "powf")

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        with module.context:
            if "powf" in self.ops and any(_rewritable(op.results[0].type)
                                          for op in ops_named(module, "math.powf")):
                passmanager.PassManager.parse(
                    "builtin.module(func.func(math-expand-ops{ops=powf}))").run(module.operation)
            wanted = {f"math.{name}" for name in self.ops if f"math.{name}" in _METHODS}
            found = [op for name in sorted(wanted) for op in ops_named(module, name)]
            for op in found:
                result = op.results[0]
                if not _rewritable(result.type):
                    continue
                with ir.InsertionPoint(op), op.location:
                    b = _Builder(result.type)
                    x = op.operands[0]
                    half = isinstance(element_of(result.type), _HALF_TYPES)
                    if half:
                        x = arith.extf(b.ft, x)
                    y = _METHODS[op.name](b, x)
                    if half:
                        y = arith.truncf(result.type, y)
                result.replace_all_uses_with(y)
                op.erase()
