"""Runs the lit + FileCheck IR tests under tests/ir as one pytest test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

IR_DIR = Path(__file__).parent / "ir"


@pytest.mark.parametrize("test_file", sorted(p.name for p in IR_DIR.iterdir() if p.suffix in (".mlir", ".py")
                                             and p.name != "lit.cfg.py"))
def test_lit(test_file: str) -> None:
    lit = Path(sys.executable).with_name("lit")
    result = subprocess.run([str(lit), "-v", str(IR_DIR / test_file)], capture_output=True, text=True, timeout=600, check=False)
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
