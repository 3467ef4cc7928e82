"""The ONNX node suite's target selection and per-operator report.

Targets: ``--pbsdk-target NAME`` (the option of pbsdk's conformance plugin, whose spec-driven cases come
along: add ``-k OnnxNode`` for the node suite alone) or ``PBSDK_ONNX_TARGETS=cpu,template`` (the default);
``--pbsdk-spec`` picks the spec. Report: ``PBSDK_ONNX_REPORT=path.json`` writes passed/failed/skipped counts
per target, operator family and operator, each skip's reason, and the cases excluded from the run with
theirs (`pbsdk.onnx.nodesuite`)."""

from __future__ import annotations

import json
import os
import re
from collections import defaultdict
from typing import Any

import pytest

_NODE = re.compile(r"test_node_suite\.py::TestOnnxNode(?:LongTail)?_(\w+)::(test_\w+)_cpu$")
_outcomes: dict[str, dict[str, tuple[str, str]]] = defaultdict(dict)


def pytest_configure(config: pytest.Config) -> None:
    """Pass the conformance plugin's target and spec options on to tests/onnx/test_node_suite.py, which
    reads them from the environment when it is collected."""
    target = config.getoption("--pbsdk-target", None)
    if target:
        os.environ["PBSDK_ONNX_TARGETS"] = target
    spec = config.getoption("--pbsdk-spec", None)
    if spec:
        os.environ["PBSDK_ONNX_SPEC"] = spec
    if config.getoption("--runslow", False):  # the long tail is generated only when it will run
        os.environ["PBSDK_ONNX_LONG_TAIL"] = "1"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    m = _NODE.search(report.nodeid)
    if not m or (report.when != "call" and not (report.skipped or report.failed)):
        return
    target, case = m.groups()
    outcome = "skipped" if report.skipped else "failed" if report.failed else "passed"
    reason = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    if outcome == "passed" and case in _outcomes[target]:
        return
    if "--runslow" in reason:  # the long tail, not run this session: not an outcome
        return
    _outcomes[target][case] = (outcome, reason)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("PBSDK_ONNX_REPORT")
    if not path or hasattr(session.config, "workerinput") or not _outcomes:
        return
    from pbsdk.onnx.nodesuite import family, official_selection

    SELECTION = official_selection()

    out: dict[str, Any] = {"targets": {}, "excluded": dict(sorted(SELECTION.excluded.items()))}
    for target, cases in sorted(_outcomes.items()):
        per_op: dict[str, dict[str, Any]] = {}
        families: dict[str, dict[str, int]] = {}
        for case, (outcome, reason) in sorted(cases.items()):
            op = SELECTION.op_of.get(case, "?")
            entry = per_op.setdefault(op, {"family": family(op), "passed": 0, "failed": 0, "skipped": 0, "skips": {}})
            entry[outcome] += 1
            if outcome == "skipped":
                entry["skips"][case] = reason
            fam = families.setdefault(family(op), {"passed": 0, "failed": 0, "skipped": 0})
            fam[outcome] += 1
        totals = {k: sum(f[k] for f in families.values()) for k in ("passed", "failed", "skipped")}
        out["targets"][target] = {"totals": totals, "families": dict(sorted(families.items())),
                                  "operators": per_op}
    with open(path, "w") as f:
        json.dump(out, f, indent=1, sort_keys=False)
