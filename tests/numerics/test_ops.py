"""Numerics of every `pbsdk.ops` op through ``@pbsdk.jit`` on the host CPU, against the float64 numpy
references of `pbsdk.testing.reference`, compared with `pbsdk.testing.assert_close`.

Shapes are chosen to be awkward: 1, primes (7, 13, 31), sizes that are not multiples of the vector width,
and a few medium ones. Each distinct signature compiles a kernel (~0.1-0.5 s), so the generated (hypothesis)
cases are few per property; the larger sweeps are marked ``slow`` (run with ``--runslow``).
"""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pbsdk
from pbsdk import ops
from pbsdk.testing import assert_close, dtype_name
from pbsdk.testing import reference as ref

F32 = np.float32
F16 = np.float16

#: hypothesis: few, reproducible examples (each one is a compile).
FEW = settings(max_examples=12, deadline=None, derandomize=True, database=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
MANY = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])


def jit(fn: Callable[..., Any]) -> Any:
    return pbsdk.jit(fn, target="cpu")


def run(fn: Callable[..., Any], *args: Any) -> Any:
    """Compile ``fn`` for these arguments and run it once."""
    return jit(fn)(*args)


def _seed(*key: Any) -> int:
    """A seed derived from ``key`` that is the same in every process (unlike ``hash`` of a str)."""
    return zlib.crc32(repr(key).encode())


def data(shape: tuple[int, ...], dtype: Any = F32, *, low: float | None = None, high: float | None = None,
         seed: Any = 0) -> np.ndarray:
    """Deterministic test data: standard normal, or uniform in [low, high)."""
    r = np.random.default_rng(_seed(shape, seed))
    x = r.standard_normal(shape) if low is None else r.uniform(low, high, shape)
    return np.asarray(x).astype(dtype)


def away_from_zero(shape: tuple[int, ...], dtype: Any = F32, seed: Any = 0) -> np.ndarray:
    """Values with |x| in [0.5, 2): safe denominators."""
    r = np.random.default_rng(_seed(shape, seed, "nz"))
    return (r.uniform(0.5, 2.0, shape) * r.choice([-1.0, 1.0], shape)).astype(dtype)


# ------------------------------------------------------------------------------------------ elementwise

BINARY = {
    "add": (ops.add, ref.add),
    "sub": (ops.sub, ref.sub),
    "mul": (ops.mul, ref.mul),
    "div": (ops.div, ref.div),
    "maximum": (ops.maximum, ref.maximum),
    "minimum": (ops.minimum, ref.minimum),
    "pow": (ops.pow, ref.pow),
}

BINARY_SHAPES = [
    ((1,), (1,)),
    ((7,), (7,)),
    ((13, 31), (13, 31)),
    ((17,), (1,)),
    ((2, 3, 33), (33,)),
    ((3, 1, 5), (4, 1)),          # rank-expanding broadcast of both operands -> (3, 4, 5)
]


def binary_inputs(op: str, sa: tuple[int, ...], sb: tuple[int, ...], dtype: Any = F32) -> tuple[np.ndarray, ...]:
    if op == "pow":
        return data(sa, dtype, low=0.1, high=3.0, seed=op), data(sb, dtype, low=-2.0, high=2.0, seed=op)
    if op == "div":
        return data(sa, dtype, seed=op), away_from_zero(sb, dtype, seed=op)
    return data(sa, dtype, seed=op), data(sb, dtype, seed=(op, 2))


@pytest.mark.parametrize("shapes", BINARY_SHAPES, ids=lambda s: f"{s[0]}-{s[1]}")
@pytest.mark.parametrize("op", list(BINARY))
def test_binary(op: str, shapes: tuple) -> None:
    fn, reference = BINARY[op]
    a, b = binary_inputs(op, *shapes)

    def binary(x, y):
        return fn(x, y)

    assert_close(run(binary, a, b), reference(a, b), op=op)


def test_binary_operators() -> None:
    a = data((7, 13), seed="opA")
    b = away_from_zero((13,), seed="opB")
    p = data((7, 13), low=0.5, high=2.0, seed="opP")

    def operators(x, y, z):
        return x + y, x - y, x * y, x / y, -x, z ** y, x @ x.T

    got = run(operators, a, b, p)
    assert isinstance(got, tuple) and len(got) == 7
    assert_close(got[0], ref.add(a, b), op="add")
    assert_close(got[1], ref.sub(a, b), op="sub")
    assert_close(got[2], ref.mul(a, b), op="mul")
    assert_close(got[3], ref.div(a, b), op="div")
    assert_close(got[4], ref.neg(a), op="neg")
    assert_close(got[5], ref.pow(p, b), op="pow")
    assert_close(got[6], ref.matmul(a, a.T), op="matmul", reduction_size=13)


SCALARS = [2, 0.5, -3.25, F32(1.5), np.float64(0.25), np.int32(3), True]


@pytest.mark.parametrize("scalar", SCALARS, ids=lambda s: f"{type(s).__name__}({s})")
def test_scalar_operands(scalar: Any) -> None:
    a = away_from_zero((7, 5), seed="scalar")

    def with_scalar(x):
        return x + scalar, scalar - x, x * scalar, scalar / x, ops.maximum(x, scalar), ops.mul(scalar, x)

    got = run(with_scalar, a)
    for g in got:
        assert g.dtype == F32, "scalars must take the tensor's dtype (no promotion to float64)"
    s = float(scalar)
    assert_close(got[0], ref.add(a, s), op="add")
    assert_close(got[1], ref.sub(s, a, dtype=F32), op="sub")
    assert_close(got[2], ref.mul(a, s), op="mul")
    assert_close(got[3], ref.div(s, a, dtype=F32), op="div")
    assert_close(got[4], ref.maximum(a, s), op="maximum")
    assert_close(got[5], ref.mul(a, s), op="mul")


def test_numpy_scalar_on_the_left() -> None:
    a = away_from_zero((13,), seed="npleft")

    def left(x):
        return np.float32(2.0) * x, np.float64(1.0) - x, np.float32(3.0) / x

    got = run(left, a)
    assert_close(got[0], ref.mul(a, 2.0), op="mul")
    assert_close(got[1], ref.sub(1.0, a, dtype=F32), op="sub")
    assert_close(got[2], ref.div(3.0, a, dtype=F32), op="div")


def test_constant_numpy_array_operand() -> None:
    a = data((4, 7), seed="constA")
    c = data((7,), seed="constC")

    def with_const(x):
        return x * c + 1.0

    assert_close(run(with_const, a), ref.add(ref.mul(a, c), 1.0), op="mul")


def test_pow_integer_exponents() -> None:
    a = data((31,), seed="powint")

    def powers(x):
        return x ** 2, x ** 3, ops.pow(ops.relu(x) + 1.0, 0.5)

    got = run(powers, a)
    assert_close(got[0], ref.pow(a, 2.0), op="pow")
    assert_close(got[1], ref.pow(a, 3.0), op="pow")   # negative base, integral exponent: real result
    assert_close(got[2], ref.pow(ref.add(ref.relu(a), 1.0), 0.5), op="pow")


UNARY = {
    "neg": (ops.neg, ref.neg, None),
    "exp": (ops.exp, ref.exp, (-10.0, 10.0)),
    "log": (ops.log, ref.log, (1e-3, 100.0)),
    "tanh": (ops.tanh, ref.tanh, (-12.0, 12.0)),
    "sigmoid": (ops.sigmoid, ref.sigmoid, (-20.0, 20.0)),
    "relu": (ops.relu, ref.relu, None),
    "gelu": (ops.gelu, ref.gelu, (-8.0, 8.0)),
    "gelu_tanh": (lambda x: ops.gelu(x, approximate="tanh"), ref.gelu_tanh, (-8.0, 8.0)),
    "erf": (ops.erf, ref.erf, (-5.0, 5.0)),
    "sqrt": (ops.sqrt, ref.sqrt, (0.0, 100.0)),
    "rsqrt": (ops.rsqrt, ref.rsqrt, (1e-3, 100.0)),
}

UNARY_SHAPES = [(1,), (7, 13), (3, 5, 31)]


@pytest.mark.parametrize("shape", UNARY_SHAPES, ids=str)
@pytest.mark.parametrize("op", list(UNARY))
def test_unary(op: str, shape: tuple[int, ...]) -> None:
    fn, reference, domain = UNARY[op]
    x = data(shape, seed=op) * 3 if domain is None else data(shape, low=domain[0], high=domain[1], seed=op)

    def unary(t):
        return fn(t)

    assert_close(run(unary, x), reference(x), op=op)


def test_unary_special_values() -> None:
    x = np.array([0.0, -0.0, 1.0, -1.0, 30.0, -30.0, 88.0, -100.0, 1e-30, 3.4e38], F32)

    def specials(t):
        return ops.exp(ops.minimum(t, 80.0)), ops.tanh(t), ops.sigmoid(t), ops.relu(t), ops.erf(t), ops.gelu(t)

    got = run(specials, x)
    with np.errstate(all="ignore"):
        assert_close(got[0], ref.exp(np.minimum(x, 80.0)), op="exp")
        assert_close(got[1], ref.tanh(x), op="tanh")
        assert_close(got[2], ref.sigmoid(x), op="sigmoid")
        assert_close(got[3], ref.relu(x), op="relu")
        assert_close(got[4], ref.erf(x), op="erf")
        assert_close(got[5], ref.gelu(x), op="gelu")


def test_log_sqrt_of_edge_values() -> None:
    x = np.array([0.0, 1.0, 4.0, -1.0, np.inf], F32)

    def edges(t):
        return ops.log(t), ops.sqrt(t)

    got = run(edges, x)
    with np.errstate(all="ignore"):
        assert_close(got[0], ref.log(x), op="log")    # -inf, 0, log 4, nan, inf
        assert_close(got[1], ref.sqrt(x), op="sqrt")  # 0, 1, 2, nan, inf


@FEW
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=1, max_dims=4, min_side=1, max_side=9),
       op=st.sampled_from(["add", "sub", "mul", "maximum", "div"]))
def test_broadcast_property(shapes: Any, op: str) -> None:
    sa, sb = shapes.input_shapes
    fn, reference = BINARY[op]
    a, b = binary_inputs(op, sa, sb)

    def bcast(x, y):
        return fn(x, y)

    got = run(bcast, a, b)
    assert got.shape == shapes.result_shape
    assert_close(got, reference(a, b), op=op)


# ------------------------------------------------------------------------------------------- reductions

REDUCTIONS = {
    "sum": (ops.sum, ref.sum),
    "max": (ops.max, ref.max),
    "min": (ops.min, ref.min),
    "mean": (ops.mean, ref.mean),
}

REDUCE_CASES = [
    (None, False), (0, False), (1, False), (-1, False), ((0, 2), False), ((1, 2), False),
    (None, True), (1, True), ((0, 2), True),
]


def reduced_size(shape: tuple[int, ...], axis: Any) -> int:
    if axis is None:
        return math.prod(shape)
    axes = (axis,) if isinstance(axis, int) else axis
    return math.prod(shape[a] for a in axes)


@pytest.mark.parametrize("axis,keepdims", REDUCE_CASES, ids=lambda v: str(v))
@pytest.mark.parametrize("op", list(REDUCTIONS))
def test_reduction(op: str, axis: Any, keepdims: bool) -> None:
    fn, reference = REDUCTIONS[op]
    shape = (7, 13, 5)
    x = data(shape, seed=(op, "red"))

    def reduce(t):
        return fn(t, axis=axis, keepdims=keepdims)

    got = run(reduce, x)
    expect = reference(x, axis=axis, keepdims=keepdims)
    assert got.shape == expect.shape
    assert_close(got, expect, op=op, reduction_size=reduced_size(shape, axis))


@pytest.mark.parametrize("op", list(REDUCTIONS))
def test_reduction_of_length_one_and_long(op: str) -> None:
    fn, reference = REDUCTIONS[op]
    one = data((1,), seed=op)
    long = data((3, 1031), seed=op)

    def reduce(a, b):
        return fn(a), fn(b, axis=1), fn(b, axis=0, keepdims=True)

    got = run(reduce, one, long)
    assert_close(got[0], reference(one), op=op)
    assert_close(got[1], reference(long, axis=1), op=op, reduction_size=1031)
    assert_close(got[2], reference(long, axis=0, keepdims=True), op=op, reduction_size=3)


def test_reduction_of_negative_values_and_positional_axis() -> None:
    x = -np.abs(data((13, 7), seed="neg")) - 1.0   # max of all-negative data: no 0 from an identity value
    y = np.abs(data((13, 7), seed="pos")) + 1.0    # min of all-positive data

    def extremes(a, b):
        return ops.max(a, 1), ops.min(b, 0), ops.max(a), ops.min(b)

    got = run(extremes, x, y)
    assert_close(got[0], ref.max(x, 1), op="max")
    assert_close(got[1], ref.min(y, 0), op="min")
    assert_close(got[2], ref.max(x), op="max")
    assert_close(got[3], ref.min(y), op="min")


@st.composite
def shape_and_axis(draw: Any) -> tuple[tuple[int, ...], Any, bool]:
    shape = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=11))
    rank = len(shape)
    kind = draw(st.sampled_from(["none", "int", "tuple"]))
    if kind == "none":
        axis: Any = None
    elif kind == "int":
        axis = draw(st.integers(-rank, rank - 1))
    else:
        axis = tuple(sorted(draw(st.sets(st.integers(0, rank - 1), min_size=1, max_size=rank))))
    return shape, axis, draw(st.booleans())


@FEW
@given(case=shape_and_axis(), op=st.sampled_from(list(REDUCTIONS)))
def test_reduction_property(case: Any, op: str) -> None:
    shape, axis, keepdims = case
    fn, reference = REDUCTIONS[op]
    x = data(shape, seed=(op, "prop"))

    def reduce(t):
        return fn(t, axis=axis, keepdims=keepdims)

    norm = None if axis is None else tuple(a % len(shape) for a in ((axis,) if isinstance(axis, int) else axis))
    got = run(reduce, x)
    assert_close(got, reference(x, axis=axis, keepdims=keepdims), op=op, reduction_size=reduced_size(shape, norm))


# ------------------------------------------------------------------------------------- softmax, layernorm

@pytest.mark.parametrize("axis", [0, 1, -1, 2])
def test_softmax_3d(axis: int) -> None:
    x = data((3, 7, 13), seed=("softmax", axis)) * 4

    def softmax(t):
        return ops.softmax(t, axis=axis)

    got = run(softmax, x)
    assert_close(got, ref.softmax(x, axis=axis), op="softmax", reduction_size=x.shape[axis])
    np.testing.assert_allclose(got.astype(np.float64).sum(axis=axis), 1.0, rtol=1e-5)


@pytest.mark.parametrize("fn", ["softmax", "log_softmax"])
def test_softmax_rows_with_nan_and_inf_are_as_numpy(fn: str) -> None:
    """The max that shifts a softmax skips NaN (`maxnumf`); a NaN still makes its whole row NaN through
    the sum, as numpy's max-propagating formula does, and infinities shift as there."""
    x = data((4, 37), seed=("nan", fn)) * 3
    x[0, 5] = np.nan
    x[1, 0] = np.nan
    x[1, 36] = np.inf
    x[2, 7] = -np.inf
    with np.errstate(invalid="ignore"):
        shifted = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
        e = np.exp(shifted)
        want = e / e.sum(-1, keepdims=True) if fn == "softmax" else shifted - np.log(e.sum(-1, keepdims=True))
    got = run(lambda t: getattr(ops, fn)(t, axis=-1), x)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    finite = ~np.isnan(want)
    np.testing.assert_allclose(got[finite], want[finite], rtol=1e-5, atol=1e-6)


def test_softmax_default_axis_and_large_logits() -> None:
    x = data((5, 31), seed="bigsoftmax") * 30 + 500   # overflows unless the max is subtracted

    def softmax(t):
        return ops.softmax(t)

    got = run(softmax, x)
    assert np.all(np.isfinite(got))
    assert_close(got, ref.softmax(x), op="softmax", reduction_size=31)


def test_softmax_length_one() -> None:
    x = data((4, 1), seed="sm1")

    def softmax(t):
        return ops.softmax(t, axis=-1)

    assert_close(run(softmax, x), np.ones((4, 1), F32), op="softmax")


@pytest.mark.parametrize("affine", [False, True], ids=["plain", "affine"])
@pytest.mark.parametrize("axis", [-1, (-2, -1), (1, 2)], ids=["last", "last2", "last2pos"])
def test_layernorm(axis: Any, affine: bool) -> None:
    x = data((4, 7, 13), seed=("ln", str(axis))) * 2 + 3
    norm_shape = (13,) if axis == -1 else (7, 13)
    w = data(norm_shape, seed="lnw") if affine else None
    b = data(norm_shape, seed="lnb") if affine else None

    if affine:
        def layernorm(t, weight, bias):
            return ops.layernorm(t, weight, bias, axis=axis)
        got = run(layernorm, x, w, b)
    else:
        def layernorm(t):  # type: ignore[misc]
            return ops.layernorm(t, axis=axis)
        got = run(layernorm, x)
    assert_close(got, ref.layernorm(x, w, b, axis=axis), op="layernorm", reduction_size=math.prod(norm_shape))


def test_layernorm_eps_and_weight_only() -> None:
    x = data((3, 31), seed="lneps") * 1e-2         # variance comparable to eps: eps must be honoured
    w = data((31,), seed="lnw2")

    def layernorm(t, weight):
        return ops.layernorm(t, weight, eps=1e-3), ops.layernorm(t, bias=weight)

    got = run(layernorm, x, w)
    assert_close(got[0], ref.layernorm(x, w, eps=1e-3), op="layernorm", reduction_size=31)
    assert_close(got[1], ref.layernorm(x, None, w), op="layernorm", reduction_size=31)


def test_layernorm_constant_weight_and_bias() -> None:
    x = data((2, 5, 7), seed="lnconst")
    w = data((7,), seed="lncw")
    b = data((7,), seed="lncb")

    def layernorm(t):
        return ops.layernorm(t, w, b)

    assert_close(run(layernorm, x), ref.layernorm(x, w, b), op="layernorm", reduction_size=7)


# ------------------------------------------------------------------------------------- transpose, reshape

def test_transpose_and_reshape() -> None:
    x = data((3, 5, 7), seed="layout")

    def layout(t):
        return (ops.transpose(t), ops.transpose(t, (1, 0, 2)), ops.transpose(t, (2, 0, 1)),
                ops.reshape(t, (15, 7)), ops.reshape(t, (-1,)), ops.reshape(t, (7, -1, 3)), t.T)

    got = run(layout, x)
    assert_close(got[0], ref.transpose(x), op="transpose")
    assert_close(got[1], ref.transpose(x, (1, 0, 2)), op="transpose")
    assert_close(got[2], ref.transpose(x, (2, 0, 1)), op="transpose")
    assert_close(got[3], ref.reshape(x, (15, 7)), op="reshape")
    assert_close(got[4], ref.reshape(x, (-1,)), op="reshape")
    assert_close(got[5], ref.reshape(x, (7, -1, 3)), op="reshape")
    assert_close(got[6], np.ascontiguousarray(x.T), op="transpose")


def test_transpose_then_compute() -> None:
    x = data((13, 7), seed="tc")
    y = data((7, 13), seed="tc2")

    def tc(a, b):
        return ops.transpose(a) + b, ops.exp(ops.reshape(ops.transpose(a), (91,)))

    got = run(tc, x, y)
    assert_close(got[0], ref.add(x.T, y), op="add")
    assert_close(got[1], ref.exp(x.T.reshape(91)), op="exp")


def test_tensor_attributes_inside_trace() -> None:
    seen: dict[str, Any] = {}

    def attrs(t):
        seen["shape"] = tuple(t.shape)
        seen["dtype"] = t.dtype
        seen["T"] = tuple(t.T.shape)
        return t * 1.0

    run(attrs, data((3, 7), seed="attrs"))
    assert seen["shape"] == (3, 7) and seen["T"] == (7, 3)
    assert dtype_name(seen["dtype"]) == "float32"


# -------------------------------------------------------------------------------------------------- matmul

MATMUL_2D = [(1, 1, 1), (1, 13, 1), (7, 13, 31), (17, 33, 5), (31, 1, 7), (64, 96, 80)]


@pytest.mark.parametrize("mkn", MATMUL_2D, ids=lambda s: "x".join(map(str, s)))
def test_matmul_2d(mkn: tuple[int, int, int]) -> None:
    m, k, n = mkn
    a, b = data((m, k), seed="mmA"), data((k, n), seed="mmB")

    def matmul(x, y):
        return ops.matmul(x, y)

    assert_close(run(matmul, a, b), ref.matmul(a, b), op="matmul", reduction_size=k)


@pytest.mark.parametrize("ta,tb", [(False, True), (True, False), (True, True)])
def test_matmul_transposes(ta: bool, tb: bool) -> None:
    m, k, n = 7, 13, 17
    a = data((k, m) if ta else (m, k), seed="tA")
    b = data((n, k) if tb else (k, n), seed="tB")

    def matmul(x, y):
        return ops.matmul(x, y, transpose_a=ta, transpose_b=tb)

    got = run(matmul, a, b)
    assert got.shape == (m, n)
    assert_close(got, ref.matmul(a, b, transpose_a=ta, transpose_b=tb), op="matmul", reduction_size=k)


BATCHED = [
    ((3, 7, 13), (3, 13, 5), False, False),
    ((2, 1, 7, 13), (3, 13, 5), False, False),     # batch dims broadcast to (2, 3)
    ((5, 7, 13), (13, 4), False, False),           # 2-D right operand broadcast over the batch
    ((7, 13), (4, 13, 5), False, False),
    ((2, 1, 13, 7), (1, 3, 5, 13), True, True),    # both transposed, with broadcast
    ((4, 13, 7), (4, 13, 9), True, False),
    ((1, 7, 13), (6, 9, 13), False, True),
]


@pytest.mark.parametrize("sa,sb,ta,tb", BATCHED, ids=lambda v: str(v))
def test_matmul_batched(sa: tuple, sb: tuple, ta: bool, tb: bool) -> None:
    a, b = data(sa, seed="bA"), data(sb, seed="bB")
    k = sa[-2] if ta else sa[-1]

    def matmul(x, y):
        return ops.matmul(x, y, transpose_a=ta, transpose_b=tb)

    got = run(matmul, a, b)
    expect = ref.matmul(a, b, transpose_a=ta, transpose_b=tb)
    assert got.shape == expect.shape
    assert_close(got, expect, op="matmul", reduction_size=k)


ONE_D = [((13,), (13, 5)), ((7, 13), (13,)), ((13,), (13,)), ((3, 7, 13), (13,)), ((13,), (2, 13, 5)),
         ((1,), (1, 3))]


@pytest.mark.parametrize("sa,sb", ONE_D, ids=lambda v: str(v))
def test_matmul_1d(sa: tuple, sb: tuple) -> None:
    a, b = data(sa, seed="1A"), data(sb, seed="1B")

    def matmul(x, y):
        return x @ y

    got = run(matmul, a, b)
    expect = ref.matmul(a, b)
    assert got.shape == expect.shape
    assert_close(got, expect, op="matmul", reduction_size=sa[-1])


@FEW
@given(m=st.integers(1, 40), k=st.integers(1, 40), n=st.integers(1, 40),
       batch=st.sampled_from([(), (2,), (3, 1)]), ta=st.booleans(), tb=st.booleans())
def test_matmul_property(m: int, k: int, n: int, batch: tuple, ta: bool, tb: bool) -> None:
    a = data(batch + ((k, m) if ta else (m, k)), seed="hA")
    b = data(((n, k) if tb else (k, n)), seed="hB")

    def matmul(x, y):
        return ops.matmul(x, y, transpose_a=ta, transpose_b=tb)

    assert_close(run(matmul, a, b), ref.matmul(a, b, transpose_a=ta, transpose_b=tb), op="matmul",
                 reduction_size=k)


# -------------------------------------------------------------------------------------------------- conv2d

CONV = [
    # id, (N, C, H, W), (O, KH, KW), stride, padding, dilation, groups
    ("3x3", (1, 3, 7, 7), (4, 3, 3), 1, 0, 1, 1),
    ("stride2", (2, 3, 13, 11), (5, 3, 3), 2, 0, 1, 1),
    ("pad1", (1, 4, 7, 9), (3, 3, 3), 1, 1, 1, 1),
    ("pad_hw", (1, 2, 9, 7), (3, 3, 2), 1, (2, 1), 1, 1),
    ("pad_asym", (1, 3, 8, 7), (2, 3, 3), (2, 1), ((1, 0), (0, 2)), 1, 1),
    ("dilation2", (1, 3, 13, 13), (4, 3, 3), 1, 2, 2, 1),
    ("groups2", (2, 4, 7, 7), (6, 3, 3), 1, 1, 1, 2),
    ("depthwise", (1, 6, 9, 9), (6, 3, 3), 2, 1, 1, 6),
    ("1x1", (2, 7, 5, 5), (3, 1, 1), 1, 0, 1, 1),
    ("1x1_stride", (1, 5, 9, 9), (4, 1, 1), 3, 0, 1, 1),
    ("rect_kernel", (1, 2, 6, 11), (3, 1, 5), (1, 2), 0, (1, 2), 1),
]


def conv_inputs(case: tuple, layout: str) -> tuple[np.ndarray, np.ndarray]:
    name, (n, c, h, w), (o, kh, kw), _, _, _, groups = case
    x = data((n, c, h, w), seed=("cx", name))
    wt = data((o, c // groups, kh, kw), seed=("cw", name))
    if layout == "NHWC":
        return np.ascontiguousarray(x.transpose(0, 2, 3, 1)), np.ascontiguousarray(wt.transpose(2, 3, 1, 0))
    return x, wt


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("case", CONV, ids=lambda c: c[0])
def test_conv2d(case: tuple, layout: str) -> None:
    _, (_, c, _, _), (_, kh, kw), stride, padding, dilation, groups = case
    x, wt = conv_inputs(case, layout)

    def conv(a, b):
        return ops.conv2d(a, b, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)

    got = run(conv, x, wt)
    expect = ref.conv2d(x, wt, stride=stride, padding=padding, dilation=dilation, groups=groups, layout=layout)
    assert got.shape == expect.shape
    assert_close(got, expect, op="conv2d", reduction_size=(c // groups) * kh * kw)


def test_conv2d_medium() -> None:
    x = data((2, 16, 14, 14), seed="cmed")
    w = data((32, 16, 3, 3), seed="cmedw")
    b = data((32, 1, 1), seed="cmedb")

    def conv_relu(a, k, bias):
        return ops.relu(ops.conv2d(a, k, padding=1) + bias)

    expect = ref.relu(ref.add(ref.conv2d(x, w, padding=1), b))
    assert_close(run(conv_relu, x, w, b), expect, op="conv2d", reduction_size=16 * 9)


# -------------------------------------------------------------------------------------------------- chains

def test_mlp_layer_then_softmax() -> None:
    x, w, b = data((13, 64), seed="mlpx"), data((64, 31), seed="mlpw") * 0.2, data((31,), seed="mlpb")

    def mlp(a, k, bias):
        h = ops.gelu(a @ k + bias)
        return h, ops.softmax(h, axis=-1)

    h, s = run(mlp, x, w, b)
    h_ref = ref.gelu(ref.add(ref.matmul(x, w, dtype=np.float64), b, dtype=np.float64), dtype=np.float64)
    assert_close(h, h_ref.astype(F32), op="mlp", reduction_size=64)
    assert_close(s, ref.softmax(h_ref).astype(F32), op="mlp", reduction_size=64)


def test_two_layer_mlp_with_layernorm() -> None:
    x = data((7, 33), seed="l2x")
    w1, b1 = data((33, 48), seed="l2w1") * 0.2, data((48,), seed="l2b1")
    w2 = data((48, 10), seed="l2w2") * 0.2
    g = data((33,), seed="l2g")

    def net(a, k1, bias1, k2, gamma):
        h = ops.layernorm(a, gamma)
        h = ops.relu(ops.matmul(h, k1) + bias1)
        return ops.softmax(ops.tanh(h @ k2), axis=0)

    f64 = np.float64
    h = ref.layernorm(x, g, dtype=f64)
    h = ref.relu(ref.add(ref.matmul(h, w1, dtype=f64), b1, dtype=f64))
    expect = ref.softmax(ref.tanh(ref.matmul(h, w2)), axis=0, dtype=F32)
    assert_close(run(net, x, w1, b1, w2, g), expect, op="mlp", reduction_size=48)


def test_attention_like_chain() -> None:
    q, k, v = (data((2, 7, 16), seed=s) for s in ("q", "k", "v"))

    def attention(a, b, c):
        scores = ops.matmul(a, b, transpose_b=True) * (1.0 / math.sqrt(16))
        return ops.softmax(scores, axis=-1) @ c

    f64 = np.float64
    scores = ref.mul(ref.matmul(q, k, transpose_b=True, dtype=f64), 1 / math.sqrt(16))
    expect = ref.matmul(ref.softmax(scores, dtype=f64), v, dtype=F32)
    assert_close(run(attention, q, k, v), expect, op="mlp", reduction_size=16)


def test_reduction_chain_mean_of_squares() -> None:
    x = data((5, 13, 7), seed="msq")

    def rms(t):
        return ops.sqrt(ops.mean(t * t, axis=(1, 2), keepdims=True)), ops.sum(ops.exp(t), axis=1) - 1.0

    got = run(rms, x)
    assert_close(got[0], ref.sqrt(ref.mean(ref.mul(x, x, dtype=np.float64), axis=(1, 2), keepdims=True),
                                  dtype=F32), op="mean", reduction_size=91)
    assert_close(got[1], ref.sub(ref.sum(ref.exp(x, dtype=np.float64), axis=1), 1.0, dtype=F32), op="sum",
                 reduction_size=13)


# ------------------------------------------------------------------------------------------------- float16

F16_UNARY = ["exp", "tanh", "sigmoid", "gelu", "relu", "rsqrt"]


@pytest.mark.parametrize("op", F16_UNARY)
def test_f16_unary(op: str) -> None:
    fn, reference, domain = UNARY[op]
    x = data((7, 13), F16, seed=op) if domain is None else data((7, 13), F16, low=domain[0],
                                                                 high=min(domain[1], 8.0), seed=op)

    def unary(t):
        return fn(t)

    got = run(unary, x)
    assert_close(got, reference(x), op=op, dtype="f16")


def test_f16_binary_broadcast_and_scalar() -> None:
    a, b = data((3, 1, 5), F16, seed="h1"), away_from_zero((4, 1), F16, seed="h2")

    def binary(x, y):
        return x + y, x * y - 1.5, x / y, ops.maximum(x, y)

    got = run(binary, a, b)
    for g in got:
        assert g.dtype == F16
    assert_close(got[0], ref.add(a, b), op="add", dtype="f16")
    assert_close(got[1], ref.sub(ref.mul(a, b, dtype=np.float64), 1.5, dtype=F16), op="mul", dtype="f16")
    assert_close(got[2], ref.div(a, b), op="div", dtype="f16")
    assert_close(got[3], ref.maximum(a, b), op="maximum", dtype="f16")


@pytest.mark.parametrize("sa,sb", [((7, 64), (64, 13)), ((2, 7, 31), (31, 5))], ids=str)
def test_f16_matmul(sa: tuple, sb: tuple) -> None:
    a, b = data(sa, F16, seed="hmA"), data(sb, F16, seed="hmB")

    def matmul(x, y):
        return x @ y

    got = run(matmul, a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", dtype="f16", reduction_size=sa[-1])


def test_f16_reductions_softmax_layernorm() -> None:
    x = data((5, 7, 33), F16, seed="hred")

    def many(t):
        return (ops.sum(t, axis=-1), ops.max(t, axis=(0, 2)), ops.mean(t), ops.softmax(t, axis=1),
                ops.layernorm(t))

    got = run(many, x)
    assert_close(got[0], ref.sum(x, axis=-1), op="sum", dtype="f16", reduction_size=33)
    assert_close(got[1], ref.max(x, axis=(0, 2)), op="max", dtype="f16")
    assert_close(got[2], ref.mean(x), op="mean", dtype="f16", reduction_size=x.size)
    assert_close(got[3], ref.softmax(x, axis=1), op="softmax", dtype="f16", reduction_size=7)
    assert_close(got[4], ref.layernorm(x), op="layernorm", dtype="f16", reduction_size=33)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_f16_conv2d(layout: str) -> None:
    case = ("f16conv", (1, 4, 9, 9), (6, 3, 3), 2, 1, 1, 2)
    x, w = conv_inputs(case, layout)
    x, w = x.astype(F16), w.astype(F16)

    def conv(a, k):
        return ops.conv2d(a, k, stride=2, padding=1, groups=2, layout=layout)

    expect = ref.conv2d(x, w, stride=2, padding=1, groups=2, layout=layout)
    assert_close(run(conv, x, w), expect, op="conv2d", dtype="f16", reduction_size=2 * 9)


def test_f16_mlp() -> None:
    x, w, b = data((7, 32), F16, seed="hx"), (data((32, 13), seed="hw") * 0.25).astype(F16), data((13,), F16)

    def mlp(a, k, bias):
        return ops.softmax(ops.gelu(a @ k + bias))

    f64 = np.float64
    # The matmul result is rounded to f16 before the bias (as the program says), then float64 onwards.
    mm = ref.matmul(x, w)
    expect = ref.softmax(ref.gelu(ref.add(mm, b, dtype=f64), dtype=f64), dtype=F16)
    assert_close(run(mlp, x, w, b), expect, op="mlp", dtype="f16", reduction_size=32)


# --------------------------------------------------------------------------------------- calls and results

def test_returns_numpy_arrays_and_tuples() -> None:
    a = data((3, 4), seed="ret")

    @pbsdk.jit
    def single(x):
        return ops.exp(x)

    @pbsdk.jit(target="cpu")
    def pair(x):
        return ops.exp(x), ops.sum(x, axis=0)

    y = single(a)
    assert isinstance(y, np.ndarray) and y.shape == (3, 4) and y.dtype == F32
    p = pair(a)
    assert isinstance(p, tuple) and len(p) == 2
    assert all(isinstance(v, np.ndarray) for v in p)
    assert_close(p[0], ref.exp(a), op="exp")
    assert_close(p[1], ref.sum(a, axis=0), op="sum", reduction_size=3)


def test_same_input_as_two_arguments_and_identity_result() -> None:
    a = data((5, 7), seed="alias")

    def alias(x, y):
        return x + y, x

    got = run(alias, a, a)
    assert_close(got[0], ref.add(a, a), op="add")
    np.testing.assert_array_equal(got[1], a)
    got[1][0, 0] = 123.0   # a result must not alias the caller's input
    assert a[0, 0] != 123.0


def test_non_contiguous_and_fortran_inputs() -> None:
    base = data((13, 7), seed="nc")

    def twice(x):
        return x * 2.0

    f = jit(twice)
    for arr in (base.T, np.asfortranarray(base), base[::2, 1:]):
        assert_close(f(arr), ref.mul(arr, 2.0), op="mul")


def test_inputs_not_modified() -> None:
    a = data((7, 13), seed="inplace")
    before = a.copy()

    def compute(x):
        return ops.relu(x) * 3.0

    run(compute, a)
    np.testing.assert_array_equal(a, before)


def test_second_call_with_same_signature_does_not_retrace() -> None:
    traced = {"n": 0}

    def counted(x, y):
        traced["n"] += 1
        return ops.tanh(x @ y)

    f = jit(counted)
    a, b = data((7, 13), seed="c1"), data((13, 5), seed="c2")
    t0 = time.perf_counter()
    first = f(a, b)
    t_first = time.perf_counter() - t0
    after_first = traced["n"]
    assert after_first >= 1
    t0 = time.perf_counter()
    second = f(a + 1.0, b)
    t_second = time.perf_counter() - t0
    assert traced["n"] == after_first, "calling again with the same shapes and dtypes re-traced the function"
    assert t_second < max(t_first / 3, 0.02), (t_first, t_second)
    assert_close(first, ref.tanh(ref.matmul(a, b, dtype=np.float64), dtype=np.float32), op="tanh")
    assert_close(second, ref.tanh(ref.matmul(a + 1.0, b, dtype=np.float64), dtype=np.float32), op="tanh")
    # A new shape or dtype is a new signature: traced again, and correct.
    c = data((3, 13), seed="c3")
    assert_close(f(c, b), ref.tanh(ref.matmul(c, b, dtype=np.float64), dtype=np.float32), op="tanh")
    assert traced["n"] > after_first
    n = traced["n"]
    f(a.astype(F16), b.astype(F16))
    assert traced["n"] > n
    n = traced["n"]
    f(a, b), f(c, b), f(a.astype(F16), b.astype(F16))   # all seen before: no further traces
    assert traced["n"] == n


# --------------------------------------------------------------------------------------------------- errors

def test_wrong_arity() -> None:
    def two(x, y):
        return x + y

    f = jit(two)
    a = data((3,), seed="ar")
    with pytest.raises(pbsdk.ArgumentError):
        f(a)
    with pytest.raises(pbsdk.ArgumentError):
        f(a, a, a)


@pytest.mark.parametrize("dtype", [np.int64, np.int16, np.complex64, np.bool_])  # i8/i32: tests/numerics/test_int8.py
def test_unsupported_input_dtype(dtype: Any) -> None:
    def ident(x):
        return x * 1.0

    with pytest.raises((pbsdk.ArgumentError, pbsdk.UnsupportedError)) as info:
        run(ident, np.ones((3, 4), dtype=dtype))
    assert isinstance(info.value, pbsdk.PbsdkError)


def test_non_array_argument() -> None:
    def ident(x):
        return x * 1.0

    with pytest.raises(pbsdk.PbsdkError):
        run(ident, "not an array")


@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 5)], ids=str)
def test_empty_dimension(shape: tuple) -> None:
    def ident(x):
        return x + 1.0

    with pytest.raises(pbsdk.PbsdkError, match="empty"):
        run(ident, np.zeros(shape, F32))


def test_matmul_shape_mismatch_names_op_and_shapes() -> None:
    def matmul(x, y):
        return x @ y

    with pytest.raises(pbsdk.PbsdkError) as info:
        run(matmul, data((3, 4)), data((5, 6)))
    msg = str(info.value)
    assert "matmul" in msg and "(3, 4)" in msg and "(5, 6)" in msg


def test_matmul_batch_mismatch() -> None:
    def matmul(x, y):
        return x @ y

    with pytest.raises(pbsdk.PbsdkError, match="matmul"):
        run(matmul, data((2, 3, 4)), data((3, 4, 5)))


def test_broadcast_mismatch_names_op_and_shapes() -> None:
    def add(x, y):
        return x + y

    with pytest.raises(pbsdk.PbsdkError) as info:
        run(add, data((3, 4)), data((5,)))
    msg = str(info.value)
    assert "add" in msg and "(3, 4)" in msg and "(5,)" in msg


@pytest.mark.parametrize("x_shape,w_shape,groups", [
    ((1, 3, 7, 7), (4, 2, 3, 3), 1),     # weight expects 2 input channels, input has 3
    ((1, 3, 7, 7), (4, 1, 3, 3), 2),     # groups do not divide 3 channels
    ((1, 4, 7, 7), (3, 2, 3, 3), 2),     # groups do not divide 3 output channels
    ((1, 3, 2, 2), (4, 3, 3, 3), 1),     # kernel larger than the input
    ((3, 7, 7), (4, 3, 3, 3), 1),        # 3-D input
], ids=["channels", "groups_c", "groups_o", "too_small", "rank"])
def test_conv2d_errors(x_shape: tuple, w_shape: tuple, groups: int) -> None:
    def conv(a, k):
        return ops.conv2d(a, k, groups=groups)

    with pytest.raises(pbsdk.PbsdkError, match="conv2d"):
        run(conv, data(x_shape), data(w_shape))


@pytest.mark.parametrize("build", [
    lambda t: ops.sum(t, axis=2),
    lambda t: ops.max(t, axis=-3),
    lambda t: ops.mean(t, axis=(0, 0)),
    lambda t: ops.softmax(t, axis=5),
    lambda t: ops.layernorm(t, axis=0),
    lambda t: ops.transpose(t, (0, 0)),
    lambda t: ops.reshape(t, (5, -1)),
    lambda t: ops.reshape(t, (-1, -1)),
    lambda t: ops.gelu(t, approximate="fast"),
    lambda t: ops.layernorm(t, np.ones(3, F32)),
], ids=["sum_axis", "max_neg_axis", "repeated_axis", "softmax_axis", "layernorm_leading", "transpose_perm",
        "reshape_size", "reshape_two_minus1", "gelu_mode", "layernorm_weight"])
def test_bad_op_arguments(build: Callable[[Any], Any]) -> None:
    def bad(t):
        return build(t)

    with pytest.raises(pbsdk.PbsdkError):
        run(bad, data((4, 6)))


def test_non_tensor_result_and_ops_outside_jit() -> None:
    def returns_number(t):
        return 3.0

    with pytest.raises(pbsdk.PbsdkError):
        run(returns_number, data((2,)))
    with pytest.raises(pbsdk.PbsdkError):
        ops.exp(np.ones(3, F32))


def test_unknown_target() -> None:
    with pytest.raises(pbsdk.PbsdkError):
        def f(x):
            return x
        pbsdk.jit(f, target="no-such-target")(data((2,)))


# ---------------------------------------------------------------------------------------------- compile_mlir

MLIR_MATMUL_BIAS_RELU = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d1)>
func.func @mm_bias_relu(%a: tensor<7x13xf32>, %b: tensor<13x5xf32>, %bias: tensor<5xf32>) -> tensor<7x5xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<7x5xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<7x5xf32>) -> tensor<7x5xf32>
  %mm = linalg.matmul ins(%a, %b : tensor<7x13xf32>, tensor<13x5xf32>)
                      outs(%acc : tensor<7x5xf32>) -> tensor<7x5xf32>
  %out = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%mm, %bias : tensor<7x5xf32>, tensor<5xf32>) outs(%init : tensor<7x5xf32>) {
    ^bb0(%x: f32, %y: f32, %o: f32):
      %s = arith.addf %x, %y : f32
      %r = arith.maximumf %s, %zero : f32
      linalg.yield %r : f32
  } -> tensor<7x5xf32>
  return %out : tensor<7x5xf32>
}
"""

MLIR_ROW_SUM = """
func.func @row_sum(%x: tensor<4x31xf32>) -> tensor<4xf32> {
  %zero = arith.constant 0.0 : f32
  %init = tensor.empty() : tensor<4xf32>
  %acc = linalg.fill ins(%zero : f32) outs(%init : tensor<4xf32>) -> tensor<4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(i, j) -> (i, j)>, affine_map<(i, j) -> (i)>],
                       iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<4x31xf32>) outs(%acc : tensor<4xf32>) {
    ^bb0(%v: f32, %s: f32):
      %e = math.exp %v : f32
      %t = arith.addf %s, %e : f32
      linalg.yield %t : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


def test_compile_mlir_matmul_and_generic() -> None:
    kernel = pbsdk.compile_mlir(MLIR_MATMUL_BIAS_RELU, target="cpu")
    a, b, bias = data((7, 13), seed="ma"), data((13, 5), seed="mb"), data((5,), seed="mbias")
    got = kernel(a, b, bias)
    if isinstance(got, tuple):
        (got,) = got
    assert isinstance(got, np.ndarray) and got.shape == (7, 5) and got.dtype == F32
    expect = ref.relu(ref.add(ref.matmul(a, b, dtype=np.float64), bias, dtype=F32))
    assert_close(got, expect, op="matmul", reduction_size=13)
    # The kernel is reusable.
    got2 = kernel(a * 2.0, b, bias)
    got2 = got2[0] if isinstance(got2, tuple) else got2
    assert_close(got2, ref.relu(ref.add(ref.matmul(a * 2.0, b, dtype=np.float64), bias, dtype=F32)),
                 op="matmul", reduction_size=13)


def test_compile_mlir_reduction_generic() -> None:
    kernel = pbsdk.compile_mlir(MLIR_ROW_SUM)
    x = data((4, 31), seed="rs")
    got = kernel(x)
    got = got[0] if isinstance(got, tuple) else got
    assert_close(got, ref.sum(ref.exp(x, dtype=np.float64), axis=1, dtype=F32), op="sum", reduction_size=31)


def test_compile_mlir_rejects_bad_text_and_bad_arguments() -> None:
    with pytest.raises(pbsdk.PbsdkError):
        pbsdk.compile_mlir("func.func @broken(%a: tensor<4xf32>) -> tensor<4xf32> { return %b }")
    kernel = pbsdk.compile_mlir(MLIR_ROW_SUM)
    with pytest.raises(pbsdk.ArgumentError):
        kernel(data((4, 30)))
    with pytest.raises(pbsdk.ArgumentError):
        kernel(data((4, 31)), data((4, 31)))


# ------------------------------------------------------------------------------------------------- slow

@pytest.mark.slow
@MANY
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=3, min_dims=0, max_dims=5, min_side=1, max_side=17),
       op=st.sampled_from(list(BINARY)))
def test_slow_broadcast_sweep(shapes: Any, op: str) -> None:
    sa, sb, sc = shapes.input_shapes
    fn, reference = BINARY[op]
    a, b = binary_inputs(op, sa or (1,), sb or (1,))
    c = data(sc or (1,), seed="c")

    def three(x, y, z):
        return fn(x, y) + z

    assert_close(run(three, a, b, c), ref.add(reference(a, b), c), op=op)


@pytest.mark.slow
@MANY
@given(m=st.integers(1, 130), k=st.integers(1, 300), n=st.integers(1, 130), ta=st.booleans(), tb=st.booleans())
def test_slow_matmul_sweep(m: int, k: int, n: int, ta: bool, tb: bool) -> None:
    a = data((k, m) if ta else (m, k), seed="sA")
    b = data((n, k) if tb else (k, n), seed="sB")

    def matmul(x, y):
        return ops.matmul(x, y, transpose_a=ta, transpose_b=tb)

    assert_close(run(matmul, a, b), ref.matmul(a, b, transpose_a=ta, transpose_b=tb), op="matmul",
                 reduction_size=k)


@pytest.mark.slow
@MANY
@given(n=st.integers(1, 2), c=st.integers(1, 8), hw=st.tuples(st.integers(1, 19), st.integers(1, 19)),
       k=st.tuples(st.integers(1, 5), st.integers(1, 5)), stride=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       dil=st.tuples(st.integers(1, 3), st.integers(1, 3)),
       pad=st.tuples(st.tuples(st.integers(0, 2), st.integers(0, 2)), st.tuples(st.integers(0, 2), st.integers(0, 2))),
       g=st.sampled_from([1, 2, "depthwise"]), layout=st.sampled_from(["NCHW", "NHWC"]))
def test_slow_conv2d_sweep(n: int, c: int, hw: tuple, k: tuple, stride: tuple, dil: tuple, pad: tuple, g: Any,
                           layout: str) -> None:
    from hypothesis import assume
    groups = c if g == "depthwise" else g
    assume(c % groups == 0)
    oh, ow = ref.conv2d_output_shape(hw[0], hw[1], k[0], k[1], stride=stride, padding=pad, dilation=dil)
    assume(oh >= 1 and ow >= 1)
    o = groups * 2
    x = data((n, c) + hw, seed="scx")
    w = data((o, c // groups) + k, seed="scw")
    if layout == "NHWC":
        x, w = np.ascontiguousarray(x.transpose(0, 2, 3, 1)), np.ascontiguousarray(w.transpose(2, 3, 1, 0))

    def conv(a, b):
        return ops.conv2d(a, b, stride=stride, padding=pad, dilation=dil, groups=groups, layout=layout)

    expect = ref.conv2d(x, w, stride=stride, padding=pad, dilation=dil, groups=groups, layout=layout)
    assert_close(run(conv, x, w), expect, op="conv2d", reduction_size=(c // groups) * k[0] * k[1])


@pytest.mark.slow
@pytest.mark.parametrize("op", list(UNARY))
def test_slow_unary_dense_sweep(op: str) -> None:
    fn, reference, domain = UNARY[op]
    lo, hi = domain if domain is not None else (-50.0, 50.0)
    x = np.linspace(lo, hi, 100_003).astype(F32)

    def unary(t):
        return fn(t)

    assert_close(run(unary, x), reference(x), op=op)
