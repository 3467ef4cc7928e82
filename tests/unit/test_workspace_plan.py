"""The workspace planner (`pbsdk.core.plan.workspace`): buffers live at the same op never share a byte,
the others may, offsets are aligned, and the workspace stays near the peak of live bytes. No MLIR."""

from __future__ import annotations

import random

import pytest

from pbsdk.core.plan.workspace import ALIGNMENT, Buffer, plan_workspace


def _check(buffers: list[Buffer]) -> None:
    plan = plan_workspace(buffers)
    assert len(plan.offsets) == len(buffers)
    assert plan.size % ALIGNMENT == 0
    assert plan.size >= plan.peak_bytes
    for i, (a, oa) in enumerate(zip(buffers, plan.offsets)):
        assert oa % a.alignment == 0
        assert oa + a.size <= plan.size
        for b, ob in zip(buffers[i + 1:], plan.offsets[i + 1:]):
            if a.overlaps(b) and a.size and b.size:
                assert oa + a.size <= ob or ob + b.size <= oa, (a, oa, b, ob)


def test_a_chain_reuses_bytes() -> None:
    # a -> b -> c -> d, each read only by the next: two buffers live at a time, so two slots.
    chain = [Buffer(1000, i, i + 1) for i in range(4)]
    plan = plan_workspace(chain)
    assert plan.total_bytes == 4000 and plan.peak_bytes == 2000
    assert plan.size == 2 * 1024  # two slots of 1000 bytes, each rounded up to 64
    assert plan.offsets[0] == plan.offsets[2] and plan.offsets[1] == plan.offsets[3]
    assert plan.offsets[0] != plan.offsets[1]
    _check(chain)


def test_buffers_live_together_get_disjoint_bytes() -> None:
    together = [Buffer(100, 0, 5), Buffer(200, 2, 3), Buffer(64, 3, 9)]
    plan = plan_workspace(together)
    assert plan.size >= 364
    _check(together)


def test_alignment_of_the_alloc_is_kept() -> None:
    buffers = [Buffer(10, 0, 1), Buffer(10, 0, 1, alignment=4096)]
    plan = plan_workspace(buffers)
    assert plan.offsets[1] % 4096 == 0
    _check(buffers)


def test_a_small_buffer_fills_a_gap() -> None:
    # big1 and big2 are live apart, so they share bytes; mid (live with big1 only) goes above them, and
    # small (live with all three) above mid.
    buffers = [Buffer(4096, 0, 1), Buffer(4096, 2, 3), Buffer(64, 0, 3), Buffer(1024, 0, 0)]
    plan = plan_workspace(buffers)
    assert plan.offsets == (0, 0, 4096 + 1024, 4096) and plan.size == 4096 + 1024 + 64
    _check(buffers)


def test_empty_and_bad_input() -> None:
    assert plan_workspace([]).size == 0
    with pytest.raises(ValueError, match="first <= last"):
        Buffer(8, 3, 1)
    with pytest.raises(ValueError, match="power-of-two"):
        Buffer(8, 0, 1, alignment=48)


@pytest.mark.parametrize("seed", range(20))
def test_random_lifetimes(seed: int) -> None:
    rng = random.Random(seed)
    buffers = []
    for _ in range(rng.randint(1, 40)):
        first = rng.randint(0, 30)
        buffers.append(Buffer(rng.choice([0, 1, 64, 100, 4096, 100_000]) * rng.randint(1, 4), first,
                              first + rng.randint(0, 10), rng.choice([16, 64, 256])))
    _check(buffers)
    plan = plan_workspace(buffers)
    assert plan.size <= plan.total_bytes + len(buffers) * 256
