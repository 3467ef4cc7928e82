"""Temporaries in one planned workspace (`pbsdk.core.passes.plan_workspace`, held by the cpu loader), against
numpy: a chain of layers whose intermediates share bytes, called again with other inputs (nothing of the
last call may leak into the next), from several threads at once (each call in flight gets its own
workspace), and with the option off (no workspace: every temporary allocated per call, same results)."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.target import WORKSPACE
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(11)
W = [RNG.standard_normal((160, 160)).astype(np.float32) / 10 for _ in range(4)]
ROWS = 2048  # each intermediate 2048 x 160 f32: 1.3 MB, over the pass's min_bytes


def mlp(x):
    h = x
    for w in W:  # each layer's result is a temporary the next one reads: two live at a time
        h = ops.relu(ops.matmul(h, w))
    return ops.add(h, x)


def expected(x: np.ndarray) -> np.ndarray:
    h = x
    for w in W:
        h = ref.relu(ref.matmul(h, w))
    return ref.add(h, x)


def _workspace(fn: pbsdk.frontends.jit.JitFunction, x: np.ndarray) -> int:
    kernel, _ = fn.kernel(fn._signature((x,)))
    return int(kernel.artifact.metadata.get(WORKSPACE, 0))


@pytest.mark.parametrize("workspace", [True, False])
def test_chain_repeated_calls(workspace: bool) -> None:
    fn = pbsdk.jit(mlp, options={"cache": False, "threads": 1, "workspace": workspace})
    xs = [RNG.standard_normal((ROWS, 160)).astype(np.float32) for _ in range(3)]
    for x in xs + xs[::-1]:
        assert_close(fn(x), expected(x), op="matmul", reduction_size=160 * 4)
    size = _workspace(fn, xs[0])
    if workspace:
        # Four ROWS x 160 f32 intermediates, at most two live at once: two slots, not four.
        assert 2 * ROWS * 160 * 4 <= size < 4 * ROWS * 160 * 4
    else:
        assert size == 0


def test_calls_from_threads() -> None:
    fn = pbsdk.jit(mlp, options={"cache": False, "threads": 1})
    xs = [RNG.standard_normal((ROWS, 160)).astype(np.float32) for _ in range(4)]
    fn(xs[0])
    assert _workspace(fn, xs[0]) > 0
    errors: list[BaseException] = []

    def work(x: np.ndarray) -> None:
        try:
            for _ in range(20):
                assert_close(fn(x), expected(x), op="matmul", reduction_size=160 * 4)
        except BaseException as exc:  # noqa: BLE001 (reported below)
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(x,)) for x in xs]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
