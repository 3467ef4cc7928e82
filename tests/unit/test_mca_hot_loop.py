"""`pbsdk.testing.mca.hot_loop`: which basic block of an assembly listing is the loop the static issue-rate
check measures. Pure text; no llvm-mca."""

from __future__ import annotations

import pytest

from pbsdk.testing.mca import hot_loop

ASM = """\
\t.p2align\t4
.LBB2_22:
\tvmovups\t(%r11,%r8), %ymm12
\tvbroadcastss\t-20(%rdi), %ymm14
\tvfmadd231ps\t%ymm12, %ymm14, %ymm11
\tvfmadd231ps\t%ymm12, %ymm14, %ymm10
\tvfmadd231ps\t%ymm12, %ymm14, %ymm9
\tcmpq\t%r14, %r9
\tjl\t.LBB2_22
\tjmp\t.LBB2_219
.LBB2_388:
\tvmovups\t(%r11,%r8), %ymm0
\tvfmadd231ps\t%ymm0, %ymm14, %ymm1
\tcmpq\t%r14, %r9
\tjl\t.LBB2_388
.LBB2_219:
\tvfmadd231ps\t%ymm0, %ymm14, %ymm1   # not a loop: falls through
\tretq
"""


def test_a_loop_whose_exit_jump_follows_its_back_edge_is_found() -> None:
    """LLVM lays out some loops as ``jl .self; jmp .exit``: the block is still the loop (up to its back edge),
    and with 3 FMAs it is hotter than the 1-FMA loop after it."""
    body = hot_loop(ASM, "vfmadd231ps")
    assert sum(i.startswith("vfmadd231ps") for i in body) == 3
    assert body[-1] == "jl\t.LBB2_22" and not any(i.startswith("jmp") for i in body)


def test_a_block_that_does_not_loop_is_not_a_loop() -> None:
    with pytest.raises(ValueError, match="no loop in the assembly holds vpdpbusd"):
        hot_loop(ASM, "vpdpbusd")
    only = ASM.split(".LBB2_388:")[0].replace("\tjl\t.LBB2_22\n", "")  # the back edge gone
    with pytest.raises(ValueError, match="no loop"):
        hot_loop(only, "vfmadd231ps")
