"""A `pbsdk.jit` function called from many threads at once, with new and already-compiled signatures."""

from __future__ import annotations

import collections
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.frontends import jit as jit_mod
from pbsdk.testing import assert_close, reference


def _program(x, w):  # type: ignore[no-untyped-def]
    return ops.softmax(ops.gelu(x @ w) + 1.0, axis=-1)


def _expected(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    return reference.softmax(reference.add(reference.gelu(reference.matmul(x, w)), 1.0), axis=-1)


SHAPES = [(1, 3, 2), (4, 8, 5), (7, 13, 11), (16, 4, 1), (2, 2, 2), (5, 1, 3)]  # (m, k, n)


@pytest.mark.parametrize("use_cache", [True, False])
def test_eight_threads_mixed_signatures(use_cache: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()
    real = jit_mod.compile_text

    def counting(text, request, **kwargs):  # type: ignore[no-untyped-def]
        with lock:
            compiled[text] += 1
        return real(text, request, **kwargs)

    monkeypatch.setattr(jit_mod, "compile_text", counting)
    fn = pbsdk.jit(_program, options=None if use_cache else {"cache": False})
    rng = np.random.default_rng(1)
    inputs = {s: (rng.standard_normal(s[:2]).astype(np.float32), rng.standard_normal(s[1:]).astype(np.float32))
              for s in SHAPES}
    fn(*inputs[SHAPES[0]])  # one signature is old before the threads start
    start = threading.Barrier(8)

    def worker(i: int) -> list[tuple[tuple[int, int, int], np.ndarray]]:
        start.wait()
        out = []
        for j in range(12):
            s = SHAPES[(i + j) % len(SHAPES)]
            out.append((s, fn(*inputs[s])))
        return out

    with ThreadPoolExecutor(8) as pool:
        results = [r for rs in pool.map(worker, range(8)) for r in rs]
    assert len(results) == 96
    for s, y in results:
        assert_close(y, _expected(*inputs[s]), op="softmax", dtype="float32", reduction_size=s[1] * s[2])
    assert len(fn.signatures) == len(SHAPES)
    assert len(compiled) == len(SHAPES), "each signature traces to its own module"
    assert set(compiled.values()) == {1}, f"a signature was compiled more than once: {compiled}"


def test_threads_share_one_kernel_per_signature() -> None:
    fn = pbsdk.jit(_program)
    x = np.ones((3, 4), np.float32)
    w = np.ones((4, 2), np.float32)
    with ThreadPoolExecutor(8) as pool:
        kernels = list(pool.map(lambda _: fn.kernel(fn._signature((x, w)))[0], range(16)))
    assert len({id(k) for k in kernels}) == 1


def test_a_failing_compile_does_not_poison_the_signature(monkeypatch: pytest.MonkeyPatch) -> None:
    real = jit_mod.compile_text
    calls = [0]

    def flaky(text, request, **kwargs):  # type: ignore[no-untyped-def]
        calls[0] += 1
        if calls[0] == 1:
            raise pbsdk.CompileError("injected", stage="fuse")
        return real(text, request, **kwargs)

    monkeypatch.setattr(jit_mod, "compile_text", flaky)
    fn = pbsdk.jit(_program)
    x, w = np.ones((2, 3), np.float32), np.ones((3, 2), np.float32)
    with pytest.raises(pbsdk.CompileError, match="injected"):
        fn(x, w)
    assert fn.signatures == []
    assert_close(fn(x, w), _expected(x, w), op="softmax", dtype="float32", reduction_size=6)
