"""torch's OpInfo samples for the ops the torch backend covers, compiled with ``backend="pbsdk"`` and
compared with eager torch. The default run takes the first samples of each op; ``--runslow`` takes all.

Whatever a sample needs that pbsdk does not support (integer dtypes, empty tensors, ...) must fall back
to torch and still give eager's result; a sample whose eager call raises is skipped."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("expecttest")

from torch.testing._internal.common_methods_invocations import op_db
from torch.utils import _pytree as pytree

from pbsdk.testing import Tolerance, assert_close, tolerance

#: OpInfo name (and variant) -> the pbsdk tolerance entry its result is held to.
COVERED = {
    ("nn.functional.linear", ""): "matmul", ("addmm", ""): "matmul", ("mm", ""): "matmul",
    ("bmm", ""): "matmul", ("matmul", ""): "matmul", ("nn.functional.conv2d", ""): "conv2d",
    ("nn.functional.relu", ""): "relu", ("nn.functional.gelu", ""): "gelu", ("nn.functional.silu", ""): "sigmoid",
    ("tanh", ""): "tanh", ("sigmoid", ""): "sigmoid", ("add", ""): "add", ("mul", ""): "mul", ("sub", ""): "sub",
    ("div", "no_rounding_mode"): "div", ("softmax", ""): "softmax", ("log_softmax", ""): "log_softmax",
    ("nn.functional.layer_norm", ""): "layernorm", ("nn.functional.rms_norm", ""): "layernorm",
    ("nn.functional.batch_norm", ""): "layernorm", ("sum", ""): "sum", ("mean", ""): "mean",
    ("amax", ""): "max", ("reshape", ""): "reshape", ("view", ""): "reshape", ("permute", ""): "transpose",
    ("transpose", ""): "transpose", ("expand", ""): "broadcast_to", ("cat", ""): "reshape",
    ("narrow", ""): "reshape", ("nn.functional.scaled_dot_product_attention", ""): "softmax",
    ("nn.functional.embedding", ""): "reshape",
}
OPS = {(o.name, o.variant_test_name): o for o in op_db if (o.name, o.variant_test_name) in COVERED}
DEFAULT_SAMPLES = 1


def _cases(limit: int | None) -> list[Any]:
    out = []
    for key in sorted(COVERED):
        n = sum(1 for _ in OPS[key].sample_inputs("cpu", torch.float32)) if key in OPS else 0
        for i in range(n if limit is None else min(n, limit)):
            out.append(pytest.param(key, i, id=f"{key[0]}{'.' + key[1] if key[1] else ''}-{i}"))
    return out


def _check_sample(key: tuple[str, str], index: int) -> None:
    op = OPS[key]
    torch.manual_seed(index)
    sample = list(op.sample_inputs("cpu", torch.float32))[index]
    leaves, spec = pytree.tree_flatten((sample.input, sample.args, sample.kwargs))
    positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

    def fn(*tensors: Any) -> Any:
        filled = list(leaves)
        for i, t in zip(positions, tensors):
            filled[i] = t
        x, args, kwargs = pytree.tree_unflatten(filled, spec)
        return op(x, *args, **kwargs)

    tensors = [leaves[i] for i in positions]
    with torch.no_grad():
        try:
            expected = fn(*tensors)
        except Exception as exc:  # noqa: BLE001 - the sample is invalid for eager torch too
            pytest.skip(f"eager torch raises on this sample: {type(exc).__name__}")
        torch._dynamo.reset()
        actual = torch.compile(fn, backend="pbsdk")(*tensors)
    exp_leaves = pytree.tree_leaves(expected)
    act_leaves = pytree.tree_leaves(actual)
    assert len(exp_leaves) == len(act_leaves)
    reduction = max([math.prod(t.shape) for t in tensors] + [1])
    for a, e in zip(act_leaves, exp_leaves):
        if not isinstance(e, torch.Tensor):
            assert a == e
            continue
        assert a.dtype == e.dtype and a.shape == e.shape
        if e.dtype.is_floating_point:
            assert_close(a.numpy(), e.numpy(), op=COVERED[key],
                         tol=tolerance(COVERED[key], "float32", reduction_size=reduction).scaled(2.0))
        else:
            assert_close(a.numpy().astype(np.float64), e.numpy().astype(np.float64), op="reshape",
                         tol=Tolerance(0.0, 0.0))


@pytest.mark.parametrize("key,index", _cases(DEFAULT_SAMPLES))
def test_opinfo_samples(key: tuple[str, str], index: int) -> None:
    _check_sample(key, index)


@pytest.mark.slow
@pytest.mark.parametrize("key,index", [c for c in _cases(None) if c.values[1] >= DEFAULT_SAMPLES])
def test_opinfo_samples_all(key: tuple[str, str], index: int) -> None:
    _check_sample(key, index)
