"""`benchmarks/orientation.py` runs end to end on a small shape: both kernels correct, a table row with the
planner's choice."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "orientation.py"


def test_one_small_shape_gives_a_row(capsys: pytest.CaptureFixture[str]) -> None:
    spec = importlib.util.spec_from_file_location("orientation_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--shapes", "96x20x40", "--rounds", "1"]) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| 96x20x40 |")]
    assert len(rows) == 1 and rows[0].rstrip().endswith(("| transposed |", "| given |")), rows
