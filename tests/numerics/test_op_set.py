"""The op set real models use (convolutions of every rank and transposed, pooling, norms, activations,
argmin/argmax, scans, gathers, ...) in ``pbsdk.ops``, against torch's CPU kernels computed in float64,
through `pbsdk.testing.assert_close` with the tolerance stated per case. One case per op family also runs
on the template target, where it must move its data through the scratchpad (``bytes:dram->...`` > 0)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import torch.nn.functional as F

import pbsdk
from pbsdk import ops
from pbsdk.testing import Tolerance, assert_close

EXACT = Tolerance(0.0, 0.0)
ROUNDED = Tolerance(1e-6, 1e-6)
SUMMED = Tolerance(1e-5, 1e-5)  # contractions and reductions of up to a few hundred f32 terms


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed + 7 * len(shape)).standard_normal(shape).astype(np.float32)


def reference(tfn: Callable[..., Any], *args: np.ndarray) -> Any:
    """torch's result in float64, rounded to float32 (or the integer/bool result itself)."""
    out = tfn(*[torch.from_numpy(a).double() if a.dtype.kind == "f" else torch.from_numpy(a) for a in args])
    def done(o: Any) -> Any:
        if isinstance(o, (tuple, list)):
            return tuple(done(v) for v in o)
        return o.float().numpy() if o.dtype.is_floating_point else o.numpy()
    return done(out)


POOL_INPUT = rand(2, 3, 9, 8)
POOL_INPUT[0, 0, 1, 1] = np.nan      # propagates, and is the index of its windows
POOL_INPUT[0, 1, 2, 2] = -np.inf
POOL_INPUT[1, 2, :3, :3] = 5.0       # ties: the first one is the index


ARG_INPUT = np.round(rand(5, 7) * 2)  # ties
ARG_INPUT[1, 3] = ARG_INPUT[1, 5] = np.nan  # the first NaN is the extreme
ARG_INPUT[4, 0] = -np.inf


NORMS = [(2, None, False), (2, 1, True), (1, (0, 2), False), (np.inf, -1, False), (-np.inf, 0, False),
         (0, 1, False), (3.5, 2, True)]


def flat(*parts: Any) -> tuple[Any, ...]:
    """Nested tuples of results as one flat tuple."""
    return tuple(v for p in parts for v in (flat(*p) if isinstance(p, tuple) else (p,)))


#: name -> (pbsdk.ops function, torch reference, inputs, tolerance).
CASES: dict[str, tuple[Callable[..., Any], Callable[..., Any], tuple[np.ndarray, ...], Tolerance]] = {
    "conv1d": (lambda x, w: ops.conv1d(x, w, stride=2, padding=1, dilation=2, groups=2),
               lambda x, w: F.conv1d(x, w, stride=2, padding=1, dilation=2, groups=2),
               (rand(2, 4, 9), rand(6, 2, 3, seed=1)), SUMMED),
    "conv3d": (lambda x, w: ops.conv3d(x, w, stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), groups=2),
               lambda x, w: F.conv3d(x, w, stride=(2, 1, 2), padding=(1, 0, 1), dilation=(1, 2, 1), groups=2),
               (rand(2, 4, 5, 6, 7), rand(6, 2, 3, 2, 3, seed=1)), SUMMED),
    "conv_transpose1d": (lambda x, w: ops.conv_transpose(x, w, stride=2, padding=2),
                         lambda x, w: F.conv_transpose1d(x, w, stride=2, padding=2),
                         (rand(1, 4, 5), rand(4, 2, 3, seed=1)), SUMMED),
    "conv_transpose2d": (lambda x, w: ops.conv_transpose(x, w, stride=(2, 3), padding=(1, 0), output_padding=(1, 0),
                                                         dilation=(1, 2), groups=2),
                         lambda x, w: F.conv_transpose2d(x, w, stride=(2, 3), padding=(1, 0), output_padding=(1, 0),
                                                         dilation=(1, 2), groups=2),
                         (rand(2, 4, 5, 6), rand(4, 3, 3, 2, seed=1)), SUMMED),
    "conv_transpose3d": (lambda x, w: ops.conv_transpose(x, w, stride=2, padding=1),
                         lambda x, w: F.conv_transpose3d(x, w, stride=2, padding=1),
                         (rand(1, 4, 3, 4, 3), rand(4, 2, 3, 3, 2, seed=1)), SUMMED),
    "flip_pad": (lambda x: ops.pad(ops.flip(x, (0, 2)), ((0, 0), (1, 2), (3, 0)), constant_values=2.0),
                 lambda x: F.pad(torch.flip(x, (0, 2)), (3, 0, 1, 2), value=2.0), (rand(3, 4, 5),), EXACT),
    "log1p_expm1": (lambda x: (ops.log1p(ops.abs(x)), ops.log1p(ops.mul(x, 1e-7)), ops.expm1(x),
                               ops.expm1(ops.mul(x, 1e-7))),
                    lambda x: (torch.log1p(x.abs()), torch.log1p(x * 1e-7), torch.expm1(x), torch.expm1(x * 1e-7)),
                    (np.concatenate([rand(64) * 30, [0.0, -1.0, np.inf, -np.inf, np.nan, 89.0, -104.0]]).astype(np.float32),),
                    Tolerance(1e-30, 4e-6)),  # relative accuracy near 0 is the point of these two
    "sin_cos_tan": (lambda x: (ops.sin(x), ops.cos(x), ops.tan(ops.mul(x, 0.5))),
                    lambda x: (torch.sin(x), torch.cos(x), torch.tan(x * 0.5)), (rand(4, 16) * 4,), Tolerance(1e-6, 1e-5)),
    "rounding_sign_isnan": (lambda x: (ops.floor(x), ops.ceil(x), ops.round(x), ops.trunc(x), ops.sign(x),
                                       ops.isnan(x), ops.isinf(x), ops.isfinite(x)),
                            lambda x: (torch.floor(x), torch.ceil(x), torch.round(x), torch.trunc(x), torch.sign(x).where(~x.isnan(), x),
                                       torch.isnan(x).double(), torch.isinf(x).double(), torch.isfinite(x).double()),
                            (np.array([-2.5, -1.5, -0.5, 0.5, 1.5, 2.5, 0.0, -0.0, 3.7, -3.7, np.nan, np.inf, -np.inf],
                                      np.float32),), EXACT),
    "activations": (lambda x: (ops.silu(x), ops.leaky_relu(x, 0.2), ops.elu(x, 0.7), ops.celu(x, 1.3), ops.selu(x),
                               ops.hardtanh(x, -0.5, 2.0), ops.relu6(x), ops.hardsigmoid(x), ops.hardswish(x),
                               ops.softplus(x, 2.0, 10.0), ops.logsigmoid(x), ops.softsign(x), ops.mish(x),
                               ops.glu(x, 0)),
                    lambda x: (F.silu(x), F.leaky_relu(x, 0.2), F.elu(x, 0.7), F.celu(x, 1.3), F.selu(x),
                               F.hardtanh(x, -0.5, 2.0), F.relu6(x), F.hardsigmoid(x), F.hardswish(x),
                               F.softplus(x, 2.0, 10.0), F.logsigmoid(x), F.softsign(x), F.mish(x), F.glu(x, 0)),
                    (rand(6, 40) * 8,), Tolerance(1e-6, 1e-5)),
    "norms_tile": (lambda x, w, b: (ops.group_norm(x, 2, w, b, eps=1e-3), ops.instance_norm(x, w, b),
                                    ops.batch_norm(x, None, None, w, b), ops.tile(w, (2, 1, 2))),
                   lambda x, w, b: (F.group_norm(x, 2, w, b, eps=1e-3), F.instance_norm(x, weight=w, bias=b),
                                    F.batch_norm(x, None, None, w, b, training=True), w.repeat(2, 1, 2)),
                   (rand(3, 4, 5, 6) * 3 + 1, rand(4, seed=1), rand(4, seed=2)), SUMMED),
    "max_pool_indices": (lambda x: (ops.max_pool(x, (3, 3), (2, 2), 1, return_indices=True),
                                    ops.max_pool(x, (2, 3), (2, 1), (1, 1), (2, 2), ceil_mode=True, return_indices=True),
                                    ops.max_pool(ops.reshape(x, (2, 3, 72)), (4,), 3, 2, return_indices=True),
                                    ops.max_pool(ops.slice(x, 2, 0, 8), (2, 2))),
                         lambda x: (F.max_pool2d(x, 3, 2, 1, return_indices=True),
                                    F.max_pool2d(x, (2, 3), (2, 1), (1, 1), (2, 2), ceil_mode=True, return_indices=True),
                                    F.max_pool1d(x.reshape(2, 3, 72), 4, 3, 2, return_indices=True),
                                    F.max_pool2d(x[:, :, :8], 2)),
                         (POOL_INPUT,), EXACT),
    "max_pool2d": (lambda x: ops.max_pool(x, (3, 3), (2, 2), 1, return_indices=True),
                   lambda x: F.max_pool2d(x, 3, 2, 1, return_indices=True), (POOL_INPUT[:1],), EXACT),
    "max_pool3d": (lambda y: ops.max_pool(y, (3, 2, 3), (2, 2, 2), (1, 0, 1), return_indices=True),
                   lambda y: F.max_pool3d(y, (3, 2, 3), (2, 2, 2), (1, 0, 1), return_indices=True),
                   (rand(1, 2, 5, 6, 7),), EXACT),
    "avg_pool": (lambda x: (ops.avg_pool(x, (3, 3), (2, 2), 1),
                            ops.avg_pool(x, (3, 2), (2, 2), (1, 1), ceil_mode=True, count_include_pad=False),
                            ops.avg_pool(x, (3, 2), (2, 2), (1, 1), ceil_mode=True),
                            ops.avg_pool(x, (3, 3), 1, 1, divisor_override=4), ops.avg_pool(x, 2),
                            ops.sum_pool(x, (2, 2), (1, 3), (2, 1))),
                 lambda x: (F.avg_pool2d(x, 3, 2, 1), F.avg_pool2d(x, (3, 2), 2, 1, ceil_mode=True, count_include_pad=False),
                            F.avg_pool2d(x, (3, 2), 2, 1, ceil_mode=True), F.avg_pool2d(x, 3, 1, 1, divisor_override=4),
                            F.avg_pool2d(x, 2), sum(x[..., 2 * a:2 * a + 7, b:b + 7:3] for a in (0, 1) for b in (0, 1))),
                 (rand(2, 3, 9, 8),), ROUNDED),
    "adaptive_pool": (lambda x: (ops.adaptive_avg_pool(x, (4, 3)), ops.adaptive_max_pool(x, (3, 5)),
                                 ops.adaptive_max_pool(x, (3, 4), return_indices=True)),
                      lambda x: (F.adaptive_avg_pool2d(x, (4, 3)), F.adaptive_max_pool2d(x, (3, 5)),
                                 F.adaptive_max_pool2d(x, (3, 4), return_indices=True)),
                      (rand(2, 3, 9, 8),), ROUNDED),
    "argmax_argmin": (lambda x: (ops.argmax(x, 1), ops.argmin(x, 0, keepdims=True), ops.argmax(x),
                                 ops.max_with_index(x, 1), ops.min_with_index(x, -1, keepdims=True)),
                      lambda x: (torch.argmax(x, 1), torch.argmin(x, 0, keepdim=True), torch.argmax(x),
                                 torch.max(x, 1), torch.min(x, -1, keepdim=True)),
                      (ARG_INPUT,), EXACT),
    "cumsum_prod": (lambda x: (ops.cumsum(x, 1), ops.cumsum(x), ops.cumsum(x, 0, reverse=True), ops.cumprod(x, -1),
                               ops.cummax(x, 1), ops.cummin(x, 0), ops.prod(x, 1), ops.prod(x, keepdims=True)),
                    lambda x: (torch.cumsum(x, 1), torch.cumsum(x.flatten(), 0), torch.cumsum(x.flip(0), 0).flip(0),
                               torch.cumprod(x, -1), torch.cummax(x, 1).values, torch.cummin(x, 0).values,
                               torch.prod(x, 1), torch.prod(x).reshape(1, 1)),
                    (rand(6, 37) * 0.3 + 1,), Tolerance(1e-5, 1e-5)),
    "cumsum": (lambda x: ops.cumsum(x, 1), lambda x: torch.cumsum(x, 1), (rand(4, 9),), Tolerance(1e-6, 1e-6)),
    "vector_norm": (lambda x: tuple(ops.vector_norm(x, o, a, k) for o, a, k in NORMS),
                    lambda x: tuple(torch.linalg.vector_norm(x, o, a, k) for o, a, k in NORMS),
                    (rand(4, 5, 6),), Tolerance(1e-6, 1e-5)),
    "gather_scatter": (lambda x, i: (ops.take_along_axis(x, i, 1), ops.put_along_axis(x, i, 2.5, 1),
                                     ops.put_along_axis(x, i, ops.mul(x, 3.0), 1, reduce="add"),
                                     ops.put_along_axis(ops.slice(x, 1, 0, 4), i, ops.slice(x, 1, 2, 4), 0)),
                       lambda x, i: (torch.gather(x, 1, i.long()), x.scatter(1, i.long(), 2.5),
                                     x.scatter_add(1, i.long(), x * 3), x[:, :4].scatter(0, i.long(), x[:, 2:4])),
                       (rand(4, 6), np.array([[0, 3], [1, 1], [2, 0], [3, 3]], np.float32)), ROUNDED),
    "flip_roll_stack": (lambda x: (ops.roll(x, (1, -2), (0, 2)), ops.roll(x, 7), ops.stack([x, ops.flip(x, 1)], 1)),
                        lambda x: (torch.roll(x, (1, -2), (0, 2)), torch.roll(x, 7), torch.stack([x, x.flip(1)], 1)),
                        (rand(3, 4, 5),), EXACT),
    "integer_ops": (lambda a, b: (ops.fmod(a, b), ops.remainder(a, b), ops.floor_divide(a, b), ops.bitwise_and(a, b),
                                  ops.bitwise_or(a, b), ops.bitwise_xor(a, b), ops.bitwise_not(a)),
                    lambda a, b: (torch.fmod(a, b), torch.remainder(a, b), a // b, *(
                        f(a.long(), b.long()).double() for f in (torch.bitwise_and, torch.bitwise_or, torch.bitwise_xor)),
                        (~a.long()).double()),
                    (np.array([7, -7, 9, 0, -3, 12, 5, -1, 1e6 + 3], np.float32),
                     np.array([2, 2, -4, 3, 5, -5, 3, 7, 10], np.float32)), EXACT),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_torch(name: str) -> None:
    fn, tfn, args, tol = CASES[name]
    got = flat(pbsdk.jit(lambda *a: flat(fn(*a)))(*args))
    expected = flat(reference(tfn, *args))
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert_close(g, e.astype(g.dtype), op=name, tol=tol)


#: One case per op family on the template target: name -> (case, what promote-vector or promote staged).
TEMPLATE: dict[str, str] = {
    "conv3d": "contractions",  # grouped: one batched contraction over its groups (emit.grouped_as_batch)
    "conv_transpose2d": "contractions",  # grouped: a batched contraction over its groups, as conv3d
    "conv_transpose1d": "contractions",  # ungrouped: a matmul on the matrix unit's tiles
    "log1p_expm1": "elementwise",
    "activations": "elementwise",
    "norms_tile": "reduction",
    "max_pool2d": "elementwise",
    "argmax_argmin": "reduction",
    "cumsum": "elementwise",
    "vector_norm": "reduction",
    "integer_ops": "elementwise",
    "gather_scatter": "reduction",  # put_along_axis's compares and sums; the gathers themselves stay in dram
}


@pytest.mark.parametrize("name", sorted(TEMPLATE))
def test_op_runs_through_the_scratchpad_on_template(name: str) -> None:
    fn, tfn, args, tol = CASES[name]
    jf = pbsdk.jit(lambda *a: flat(fn(*a)), target="template")
    got = flat(jf(*args))
    expected = flat(reference(tfn, *args))
    for g, e in zip(got, expected):
        assert_close(g, e.astype(g.dtype), op=name, tol=tol)
    exe = jf.kernel(jf._signature(args))[0].executable
    moved_in = sum(n for k, n in exe.last_counters.items() if k.startswith("bytes:dram->"))
    assert moved_in > 0, exe.last_counters
    staged = exe.resources["contractions"] if TEMPLATE[name] == "contractions" else \
        exe.resources["vector_ops"].get(TEMPLATE[name], 0)
    assert staged, exe.resources
