"""`OutputPool` (pbsdk.core.runtime.kernel, no MLIR): an output buffer comes back only once nothing refers to
it — not the caller, not a view, not a torch tensor over it — and at most ``keep`` are held per output."""

from __future__ import annotations

import threading
import time

import numpy as np

from pbsdk.core.runtime.kernel import OutputPool

BIG = ((512, 1024), np.dtype(np.float32))    # 2 MiB
SMALL = ((16,), np.dtype(np.float32))


def test_dropped_outputs_are_reused_and_held_ones_are_not() -> None:
    pool = OutputPool([BIG])
    (a,) = pool.take()
    a_ptr = a.ctypes.data
    (b,) = pool.take()                  # a still held by the caller: a second buffer
    assert b.ctypes.data != a_ptr
    a[...] = 1.0
    del b
    (c,) = pool.take()                  # b was dropped: it comes back, a is untouched
    assert c.ctypes.data != a_ptr and (a == 1.0).all()
    del a, c
    ptrs = {pool.take()[0].ctypes.data for _ in range(4)}   # each dropped at once: one buffer again and again
    assert len(ptrs) == 1


def test_a_view_keeps_the_buffer_taken() -> None:
    pool = OutputPool([BIG])
    (a,) = pool.take()
    view = a[3:5]
    ptr = a.ctypes.data
    del a
    assert pool.take()[0].ctypes.data != ptr, "a view of it is alive"
    del view
    assert ptr in {pool.take()[0].ctypes.data for _ in range(2)}


def test_keep_bounds_what_is_held() -> None:
    pool = OutputPool([BIG], keep=2)
    kept = [pool.take()[0] for _ in range(5)]       # the caller keeps all five: all distinct
    assert len({k.ctypes.data for k in kept}) == 5
    assert len(pool._held[0]) == 2


def test_small_outputs_are_always_fresh() -> None:
    pool = OutputPool([SMALL, BIG])
    s1, b1 = pool.take()
    s1_ptr = s1.ctypes.data
    del s1, b1
    pool.take()
    assert len(pool._held[0]) == 0 and len(pool._held[1]) == 1, "the 64-byte output is never held"
    del s1_ptr


def test_threads_never_share_a_buffer() -> None:
    pool = OutputPool([BIG], keep=2)
    seen: list[list[int]] = [[] for _ in range(4)]
    clash = []

    def work(k: int) -> None:
        for _ in range(200):
            (a,) = pool.take()
            a[0] = k
            time.sleep(0)          # let another thread take one meanwhile
            if (a[0] != k).any():
                clash.append(k)
            seen[k].append(a.ctypes.data)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not clash
