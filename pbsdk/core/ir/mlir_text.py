"""`MlirText`: MLIR written as indented text lines with fresh SSA names — what the generated attention
kernel (`pbsdk.core.ir.attention_kernel`) is still built with."""

from __future__ import annotations


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
