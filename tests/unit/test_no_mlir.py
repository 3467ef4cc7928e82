"""Unit-level pieces (spec, planner, testing helpers, op tracing) must not need the MLIR bindings."""

from __future__ import annotations

import subprocess
import sys


def test_spec_planner_and_testing_import_without_mlir() -> None:
    code = ("import sys, pbsdk, pbsdk.core.spec, pbsdk.core.plan, pbsdk.testing, pbsdk.ops; "
            "bad = sorted(m for m in sys.modules if m == 'mlir' or m.startswith('mlir.')); "
            "print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
