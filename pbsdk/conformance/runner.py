"""Running conformance cases on a target and reporting (JSON, JUnit XML)."""

from __future__ import annotations

import dataclasses
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from pbsdk.conformance.cases import Case
from pbsdk.core.spec import ChipSpec
from pbsdk.testing import assert_close, max_error, tolerance

Status = Literal["pass", "fail", "error", "skip"]


@dataclasses.dataclass(frozen=True)
class CaseResult:
    name: str
    status: Status
    why: str
    seconds: float
    max_abs_error: float | None = None
    max_rel_error: float | None = None
    atol: float | None = None
    rtol: float | None = None
    message: str = ""


def run_case(case: Case, *, target: str, spec: ChipSpec, seed: int = 0) -> CaseResult:
    import pbsdk

    if case.skip:
        return CaseResult(case.name, "skip", case.why, 0.0, message=case.skip)
    t0 = time.perf_counter()
    inputs = case.inputs(seed)
    tol = tolerance(case.op, case.dtype, reduction_size=case.reduction_size)
    try:
        got = pbsdk.jit(case.fn, target=target, spec=spec)(*inputs)
    except Exception as exc:  # a target's failure is a result, not a crash of the suite
        return CaseResult(case.name, "error", case.why, time.perf_counter() - t0,
                          message=f"{type(exc).__name__}: {exc}"[:2000])
    expected = case.reference(*inputs)
    elapsed = time.perf_counter() - t0
    got_a, exp_a = np.asarray(got), np.asarray(expected)
    abs_err = rel_err = None
    if got_a.shape == exp_a.shape:
        abs_err, rel_err = max_error(got_a, exp_a)
    try:
        assert_close(got_a, exp_a, op=case.op, dtype=case.dtype, reduction_size=case.reduction_size)
    except AssertionError as exc:
        return CaseResult(case.name, "fail", case.why, elapsed, abs_err, rel_err, tol.atol, tol.rtol, str(exc)[:2000])
    return CaseResult(case.name, "pass", case.why, elapsed, abs_err, rel_err, tol.atol, tol.rtol)


def run_cases(cases: Sequence[Case], *, target: str, spec: ChipSpec, seed: int = 0) -> list[CaseResult]:
    return [run_case(c, target=target, spec=spec, seed=seed) for c in cases]


def summary(results: Sequence[CaseResult]) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "error": 0, "skip": 0}
    for r in results:
        counts[r.status] += 1
    return counts


def report(results: Sequence[CaseResult], *, target: str, spec: ChipSpec) -> dict[str, Any]:
    return {"target": target, "spec": spec.name, "summary": summary(results),
            "cases": [dataclasses.asdict(r) for r in results]}


def junit_xml(results: Sequence[CaseResult], *, target: str, spec: ChipSpec) -> str:
    counts = summary(results)
    suite = ET.Element("testsuite", name=f"pbsdk-conformance-{target}", tests=str(len(results)),
                       failures=str(counts["fail"]), errors=str(counts["error"]), skipped=str(counts["skip"]),
                       time=f"{sum(r.seconds for r in results):.3f}")
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="spec", value=spec.name)
    for r in results:
        family = r.name.split("/")[0]
        tc = ET.SubElement(suite, "testcase", classname=f"{target}.{family}", name=r.name, time=f"{r.seconds:.3f}")
        if r.status == "fail":
            ET.SubElement(tc, "failure", message=r.message.splitlines()[0] if r.message else "").text = r.message
        elif r.status == "error":
            ET.SubElement(tc, "error", message=r.message.splitlines()[0] if r.message else "").text = r.message
        elif r.status == "skip":
            ET.SubElement(tc, "skipped", message=r.message)
    return ET.tostring(suite, encoding="unicode")
