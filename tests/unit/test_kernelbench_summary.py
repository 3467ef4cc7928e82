"""`benchmarks/kernelbench.py`'s pure logic on fake rows (no KernelBench, no torch): problem selection, the
summary's counts and geomean, the bar, the markdown table."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path
from typing import Any

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "kernelbench.py"


@pytest.fixture(scope="module")
def kb() -> Any:
    spec = importlib.util.spec_from_file_location("kernelbench_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(name: str, speedup: float, *, correct: bool = True, fallbacks: tuple[str, ...] = ()) -> dict[str, Any]:
    return {"name": name, "eager_ms": 1.0, "correct": correct, "graphs": 1, "fallback_ops": list(fallbacks),
            "failed_partitions": 0, "first_s": 0.5, "max_abs_err": 1e-6, "max_rel_err": 1e-7,
            "latency_ms": {"eager": 1.0, "pbsdk": 1.0 / speedup},
            "speedup": {"median": speedup, "min": speedup * 0.9, "max": speedup * 1.1}}


ROWS = [_row("1_Conv", 0.5), _row("2_Gemm", 2.0), _row("3_Gemm", 4.0, fallbacks=("aten.foo",)),
        _row("4_Bad", 8.0, correct=False), {"name": "5_Big", "eager_ms": 400.0, "skipped": True},
        {"name": "6_Crash", "error": "timed out after 900 s"}]


def test_summary_counts_and_geomean(kb: Any) -> None:
    s = kb.summarize(ROWS)
    assert (s["problems"], s["skipped"], s["errors"], s["measured"]) == (6, 1, 1, 4)
    assert s["correct"] == 3 and s["fully_compiled"] == 3
    # the wrong 8x row is not "faster", but its speed-up is in the geomean
    assert s["faster"] == 2 and s["faster_share"] == pytest.approx(0.5)
    assert s["geomean"] == pytest.approx((0.5 * 2.0 * 4.0 * 8.0) ** 0.25)
    assert "geomean_vs_inductor" not in s


def test_geomean_and_bar(kb: Any) -> None:
    assert kb.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert math.isnan(kb.geomean([]))
    good = [_row(f"{i}_P", 1.6) for i in range(9)] + [_row("9_P", 0.9)]
    assert kb.meets_bar(kb.summarize(good))  # 90% faster, geomean 1.53
    assert not kb.meets_bar(kb.summarize(good[1:]))  # 8 of 9 = 89% faster
    assert not kb.meets_bar(kb.summarize([_row("1_P", 1.2)]))  # all faster, geomean below 1.5
    assert not kb.meets_bar(kb.summarize([]))


def test_problem_files_by_number_and_pattern(kb: Any, tmp_path: Path) -> None:
    level = tmp_path / "KernelBench" / "level2"
    level.mkdir(parents=True)
    for name in ("10_B.py", "2_A.py", "1_C.py", "helper.py"):
        (level / name).write_text("")
    assert [p.name for p in kb.problem_files(tmp_path, 2)] == ["1_C.py", "2_A.py", "10_B.py"]
    assert [p.name for p in kb.problem_files(tmp_path, 2, only="^1")] == ["1_C.py", "10_B.py"]
    with pytest.raises(SystemExit):
        kb.problem_files(tmp_path, 3)


def test_markdown_rows(kb: Any) -> None:
    md = kb.markdown(ROWS, {"level": 2, "threads": 2, "max_eager_ms": 150})
    lines = md.splitlines()
    assert "**2 of 4 faster than eager (50%)" in md
    table = [ln for ln in lines if ln.startswith("| ")]
    assert len(table) == 1 + len(ROWS)
    assert table[0].count("|") == lines[lines.index(table[0]) + 1].count("|")
    assert "| 5_Big | 400.0 (skipped) |" in md and "error: timed out" in md
    assert "| 3_Gemm |" in md and "aten.foo" in md and "NO (" in md


def test_markdown_shows_dynamos_floor_when_measured(kb: Any) -> None:
    row = _row("9_Matmul", 0.8) | {"floor_speedup": {"median": 0.9, "min": 0.85, "max": 0.95}}
    row["latency_ms"] = row["latency_ms"] | {"floor": 1.1}
    md = kb.markdown([row], {"level": 2})
    header = next(ln for ln in md.splitlines() if ln.startswith("| problem"))
    assert "floor ms | floor x eager" in header
    assert "| 1.100 | 0.90x (0.85-0.95) |" in md
    assert "floor" not in kb.markdown(ROWS, {"level": 2})
