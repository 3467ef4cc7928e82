"""The planner's choice to compute a packed matmul transposed (`orientation`, `Blocking.transposed`),
checked without IR."""

from __future__ import annotations

import numpy as np
import pytest

from pbsdk.core.plan.contraction import (
    A_KM_IN_PLACE_PANELS,
    TRANSPOSE_MARGIN,
    TRANSPOSE_PACK_FMAS,
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
    # B^T (the given A) is packed through transposes, A^T (the given B) read in place unless very many
    # column tiles reuse it, C not prefetched.
    assert blk.pack_b and blk.pack_a == (m > A_KM_IN_PLACE_PANELS * blk.nr) and not blk.prefetch_c
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
        lat = vec.fma_latency
        mr, nv, _ = register_tile(vec.registers, 16, vec.fma_per_cycle, vec.loads_per_cycle, m, n, latency=lat)
        tmr, tnv, _ = register_tile(vec.registers, 16, vec.fma_per_cycle, vec.loads_per_cycle, n, m, latency=lat)
        assert turn.given_cycles == issue_cycles(vec.fma_per_cycle, vec.loads_per_cycle, 16, m, n, mr, nv, lat)
        tiles = issue_cycles(vec.fma_per_cycle, vec.loads_per_cycle, 16, n, m, tmr, tnv, lat)
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


# ------------------------------------------------------------------ operands stored transposed (x @ w.T)

def test_layouts_are_checked_and_the_transposed_product_swaps_them() -> None:
    with pytest.raises(ValueError, match="layouts"):
        Contraction(8, 8, 8, b_layout="kk")  # type: ignore[arg-type]
    op = Contraction(100, 200, 300, 2, a_layout="mk", b_layout="nk", a_prepackable=True)
    t = op.transposed()
    # C^T = B^T A^T: its A is the given B (stored [n, k]: 'mk'), its B the given A (stored [m, k]: 'nk').
    assert (t.m, t.n, t.k, t.batch, t.a_layout, t.b_layout) == (200, 100, 300, 2, "mk", "nk")
    assert not t.a_prepackable and not t.b_prepacked
    t = Contraction(100, 200, 300, a_layout="km").transposed()
    assert (t.a_layout, t.b_layout) == ("km", "kn")


def test_a_b_stored_n_k_is_charged_its_transposing_pack(xeon: ChipSpec) -> None:
    """Given, a B stored [n, k] is packed through transposes (n elements a k step); transposed, an A stored
    [k, m] needs no transposing pack (B^T is a plain copy)."""
    vec = xeon.vector
    for m, n, k in [(512, 3072, 768), (3072, 512, 768), (128, 128, 64), (2048, 196, 512), (49, 512, 2048)]:
        plain = orientation(xeon, Contraction(m, n, k))
        nk = orientation(xeon, Contraction(m, n, k, b_layout="nk"))
        assert nk.given_pack_cycles == pytest.approx(n * TRANSPOSE_PACK_FMAS / vec.fma_per_cycle)
        assert nk.given_cycles == pytest.approx(plain.given_cycles + nk.given_pack_cycles)
        assert nk.transposed == (nk.transposed_cycles <= TRANSPOSE_MARGIN * nk.given_cycles)
        km = orientation(xeon, Contraction(m, n, k, a_layout="km"))
        assert km.pack_cycles == 0 and km.given_pack_cycles == 0
        assert km.transposed_cycles == pytest.approx(plain.transposed_cycles - plain.pack_cycles)
    # Square: the same tiles and the same pack either way, so it stays as given.
    assert not orientation(xeon, Contraction(128, 128, 64, b_layout="nk")).transposed


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layouts", [("mk", "nk"), ("km", "kn"), ("km", "nk")])
def test_stored_layouts_in_the_blocking(xeon: ChipSpec, layouts: tuple[str, str], threads: int) -> None:
    """A B stored [n, k] is always packed (the kernel reads it only through its pack); an A stored [k, m] is
    read in place unless a thread's columns span more than `A_KM_IN_PLACE_PANELS` register tiles."""
    a_layout, b_layout = layouts
    for m, n, k in [(512, 3072, 768), (8, 4096, 512), (4096, 4, 64), (300, 100, 200)]:
        for transpose in (False, True):
            op = Contraction(m, n, k, a_layout=a_layout, b_layout=b_layout)  # type: ignore[arg-type]
            plan = plan_contraction(xeon, op, {"threads": threads, "transpose_gemm": transpose})
            blk = plan.blocking
            assert blk is not None and blk.transposed == transpose
            kernel = op.transposed() if transpose else op
            assert blk.pack_b or kernel.b_layout == "kn", (op, blk)
            if kernel.a_layout == "km":
                columns = -(-kernel.n // blk.threads) if blk.split == "n" else kernel.n
                assert blk.pack_a == (columns > A_KM_IN_PLACE_PANELS * blk.nr), (op, blk)
                assert any("A stored [k, m]" in r for r in plan.reasons), plan.reasons
