"""The planner's choice to compute a packed matmul transposed (`orientation`, `Blocking.transposed`),
checked without IR."""

from __future__ import annotations

import numpy as np
import pytest

from pbsdk.core.plan.contraction import (
    TRANSPOSE_MARGIN,
    Contraction,
    issue_cycles,
    orientation,
    plan_contraction,
    register_tile,
)
from pbsdk.core.spec import ChipSpec, load_spec


@pytest.fixture(scope="module")
def xeon() -> ChipSpec:
    return load_spec("intel/xeon-avx512")  # 32 zmm registers, 16 f32 lanes, 2 cores


@pytest.mark.parametrize("mnk", [(512, 49, 2048), (64, 49, 576), (512, 33, 512), (4096, 8, 4096), (2048, 49, 512),
                                 (512, 196, 512), (256, 196, 1024), (1024, 196, 256)])
def test_few_columns_and_many_rows_are_computed_transposed(xeon: ChipSpec, mnk: tuple[int, int, int]) -> None:
    m, n, k = mnk
    plan = plan_contraction(xeon, Contraction(m, n, k), {"threads": 1})
    blk = plan.blocking
    assert blk is not None and blk.transposed
    # The blocking is that of the (n, m, k) product: its register tile is the one for n rows, m columns.
    mr, nv, _ = register_tile(32, 16, xeon.vector.fma_per_cycle, xeon.vector.loads_per_cycle, n, m)
    assert (blk.mr, blk.nv) == (mr, nv)
    # B^T (the given A) is packed through transposes, A^T (the given B) read in place, C not prefetched.
    assert blk.pack_b and not blk.pack_a and not blk.prefetch_c
    assert any(r.startswith("computed transposed") for r in plan.reasons), plan.reasons


@pytest.mark.parametrize("mnk", [(1024, 1024, 1024), (512, 3072, 768), (128, 4096, 4096), (3136, 64, 64),
                                 (49, 512, 2048), (1000, 10, 1000), (1024, 100, 1024), (1, 4096, 4096)])
def test_columns_that_fill_the_vectors_stay_as_given(xeon: ChipSpec, mnk: tuple[int, int, int]) -> None:
    m, n, k = mnk
    for threads in (1, 2):
        blk = plan_contraction(xeon, Contraction(m, n, k), {"threads": threads}).blocking
        assert blk is not None and not blk.transposed, (mnk, threads)


def test_the_decision_is_the_issue_cycles_against_the_margin(xeon: ChipSpec) -> None:
    """For every shape: transposed exactly when the transposed tiles plus the transposing pack take at most
    the margin of the given tiles' issue cycles, and those are the register tiles' cycles."""
    vec = xeon.vector
    rng = np.random.default_rng(3)
    seen = set()
    for _ in range(300):
        m, n = (int(v) for v in rng.integers(1, 600, 2))
        turn = orientation(xeon, Contraction(m, n, 64))
        mr, nv, _ = register_tile(vec.registers, 16, vec.fma_per_cycle, vec.loads_per_cycle, m, n)
        tmr, tnv, _ = register_tile(vec.registers, 16, vec.fma_per_cycle, vec.loads_per_cycle, n, m)
        assert turn.given_cycles == issue_cycles(vec.fma_per_cycle, vec.loads_per_cycle, 16, m, n, mr, nv)
        tiles = issue_cycles(vec.fma_per_cycle, vec.loads_per_cycle, 16, n, m, tmr, tnv)
        assert turn.transposed_cycles == pytest.approx(tiles + turn.pack_cycles) and turn.pack_cycles > 0
        assert turn.transposed == (turn.transposed_cycles <= TRANSPOSE_MARGIN * turn.given_cycles)
        assert turn.transposed == turn.why.startswith("computed transposed")
        seen.add(turn.transposed)
    assert seen == {True, False}


def test_options_force_either_way_and_a_prepacked_b_stays(xeon: ChipSpec) -> None:
    square = Contraction(256, 256, 256)
    assert plan_contraction(xeon, square, {"transpose_gemm": True}).blocking.transposed
    narrow = Contraction(512, 49, 2048)
    assert not plan_contraction(xeon, narrow, {"transpose_gemm": False}).blocking.transposed
    prepacked = Contraction(512, 49, 2048, b_prepacked=True)
    turn = orientation(xeon, prepacked, {"transpose_gemm": True})
    assert not turn.transposed and "packed ahead of time" in turn.why


def test_two_threads_split_the_transposed_columns(xeon: ChipSpec) -> None:
    """512 x 49 at two threads: the transposed product's 512 columns are split, so each thread packs half
    of the given A (not all of it, as splitting rows would)."""
    blk = plan_contraction(xeon, Contraction(512, 49, 2048), {"threads": 2}).blocking
    assert blk.transposed and blk.threads == 2 and blk.split == "n"


def test_explain_says_the_product_is_transposed(xeon: ChipSpec) -> None:
    from pbsdk.core.plan.explain import format_plan

    text = format_plan("matmul", plan_contraction(xeon, Contraction(512, 49, 2048), {"threads": 2}))
    packing = next(line for line in text.splitlines() if line.strip().startswith("packing"))
    assert "computed transposed, C^T = B^T A^T" in packing and "register transposes" in packing
    assert "the blocking below is the transposed product's (49x512x2048)" in text
    given = format_plan("matmul", plan_contraction(xeon, Contraction(512, 512, 512), {"threads": 2}))
    assert "transposed" not in given


def test_a_constant_makes_the_transposing_pack_free_and_keeps_the_split(xeon: ChipSpec) -> None:
    """A constant A is packed as B^T at compile time: the model charges no pack for it, so the transposed
    way wins by the tiles alone; the split over threads stays that of a B^T packed per call."""
    for m, n, k in [(1024, 196, 256), (512, 49, 2048), (300, 40, 64)]:
        per_call = orientation(xeon, Contraction(m, n, k))
        constant = orientation(xeon, Contraction(m, n, k, a_prepackable=True))
        assert constant.pack_cycles == 0 and per_call.pack_cycles > 0
        assert constant.transposed_cycles == pytest.approx(per_call.transposed_cycles - per_call.pack_cycles)
        assert "compile time" in constant.why or not constant.transposed
        plans = [plan_contraction(xeon, Contraction(m, n, k, a_prepackable=c), {"threads": 2, "transpose_gemm": True})
                 for c in (False, True)]
        assert plans[0].blocking.split == plans[1].blocking.split
        assert any("at compile time (a constant)" in r for r in plans[1].reasons), plans[1].reasons
