"""`MlirText`/`IndexText`: MLIR written as indented text lines with fresh SSA names, memoised index
constants and folding index arithmetic — what nvgpu's attention kernel (`attention_kernel.py`) is still
built with (moved here from the core, whose kernels are built with the bindings' builders)."""

from __future__ import annotations

from typing import Any

from pbsdk.core.ir.attention import Operand


class MlirText:
    """Indented MLIR lines; ``open``/``close`` a region; ``fresh`` SSA names (``%hint<N>``)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.depth = 1
        self.n = 0

    def fresh(self, hint: str = "v") -> str:
        self.n += 1
        return f"%{hint}{self.n}"

    def __call__(self, line: str) -> None:
        self.lines.append("  " * self.depth + line)

    def open(self, line: str) -> None:
        self(line)
        self.depth += 1

    def close(self, line: str = "}") -> None:
        self.depth -= 1
        self(line)


class IndexText(MlirText):
    """`MlirText` with memoised index constants (``consts``: value -> SSA name, emitted by the caller at
    the top of the function) and folding index arithmetic; the attention kernels' builder."""

    def __init__(self) -> None:
        super().__init__()
        self.consts: dict[int, str] = {}

    def c(self, v: int) -> str:
        if v not in self.consts:
            self.consts[v] = f"%c{v}".replace("-", "m")
        return self.consts[v]

    def op(self, hint: str, text: str) -> str:
        r = self.fresh(hint)
        self(f"{r} = {text}")
        return r

    # index arithmetic, folding constants
    def add(self, a: str, b: str) -> str:
        if b == self.c(0):
            return a
        if a == self.c(0):
            return b
        return self.op("a", f"arith.addi {a}, {b} : index")

    def mul(self, a: str, k: int) -> str:
        if k == 0:
            return self.c(0)
        if k == 1:
            return a
        return self.op("m", f"arith.muli {a}, {self.c(k)} : index")

    def sub(self, a: str, b: str) -> str:
        return self.op("s", f"arith.subi {a}, {b} : index")

    def min(self, a: str, b: str) -> str:
        return self.op("mn", f"arith.minsi {a}, {b} : index")

    def max(self, a: str, b: str) -> str:
        return self.op("mx", f"arith.maxsi {a}, {b} : index")

    def lt(self, a: str, b: str) -> str:
        return self.op("lt", f"arith.cmpi ult, {a}, {b} : index")


def batch_offset(e: IndexText, beta: str, opnd: Operand | Any) -> str:
    """Σ_f ((β / inner_f) % size_f) * stride_f: where flat batch index ``beta`` starts in an operand
    (anything with `Operand`'s ``batch`` factors)."""
    total = e.c(0)
    for size, stride, inner in opnd.batch:
        if stride == 0 or size == 1:
            continue
        idx = beta if inner == 1 else e.op("dv", f"arith.divui {beta}, {e.c(inner)} : index")
        idx = e.op("rm", f"arith.remui {idx}, {e.c(size)} : index")
        total = e.add(total, e.mul(idx, stride))
    return total
