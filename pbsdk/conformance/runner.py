"""Running conformance cases on a target and reporting (JSON, JUnit XML)."""

from __future__ import annotations

import dataclasses
import time
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from typing import Any, Literal

import numpy as np

from pbsdk.conformance.cases import Case
from pbsdk.core.errors import DeviceUnavailableError
from pbsdk.core.plan.chip_time import modelled_time, planner_estimate
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
    #: Resource use as the target reported it: {"scratchpad_bytes": {level: bytes}, "matrix_unit_ops":
    #: {unit: count}, "counters": {...}}; None when the target does not report resources.
    resources: dict[str, Any] | None = None
    #: "ok", "not reported" (the target cannot say), or the reason the resource check failed.
    resource_check: str = "not reported"


def _reported(kernel: Any) -> dict[str, Any] | None:
    """The resources a loaded kernel reports: the executable's compile-time ``resources`` (scratchpad
    bytes per level, contractions) and its ``last_counters`` from the run just made. None if neither."""
    executable = getattr(kernel, "executable", None)
    static = getattr(executable, "resources", None)
    counters = getattr(executable, "last_counters", None)
    if static is None and counters is None:
        return None
    out: dict[str, Any] = {"scratchpad_bytes": dict((static or {}).get("scratchpad_bytes", {}))}
    if counters is not None:
        out["counters"] = dict(counters)
        out["matrix_unit_ops"] = {k.split(":", 1)[1]: v for k, v in counters.items() if k.startswith("matrix_unit:")}
    if static is not None:
        out["contractions"] = [{"compute": c.get("compute"), "unit": c.get("unit")}
                               for c in static.get("contractions", [])]
        if "cores" in static:
            out["cores"] = static["cores"]
        estimate = planner_estimate(static)
        if estimate is not None:  # the planner's prediction, next to the modelled time below
            out["planner_estimate_seconds"] = estimate
    return out


def _with_modelled_time(resources: dict[str, Any] | None, executable: Any, spec: ChipSpec) -> None:
    """Add ``modelled``: the run's time on ``spec`` from its counters (`pbsdk.core.plan.chip_time`)."""
    if resources is None or not resources.get("counters"):
        return
    counters = resources["counters"]
    static = getattr(executable, "resources", None) or {}
    try:
        resources["modelled"] = modelled_time(spec, counters, static).as_dict()
    except ValueError as exc:  # a counter the spec cannot price (e.g. a unit it does not list)
        resources["modelled"] = {"error": str(exc)}


def check_resources(case: Case, spec: ChipSpec, resources: dict[str, Any] | None) -> str:
    """'ok', 'not reported', or why the case's resource use is wrong: a scratchpad level over capacity,
    no byte moved from main memory into any scratchpad (on a spec that has one, where the target
    reports run-time counters: a chip with scratchpads computes on them, never on main memory), or a
    contraction in a matrix-unit dtype that issued no matrix-unit op, or a parallel loop over more units
    of the outermost compute level than the chip has (``cores``)."""
    if resources is None:
        return "not reported"
    counters = resources.get("counters")
    pads = [m.name for m in spec.scratchpads()]
    if counters is not None and pads:
        main = spec.main_memory.name
        moved = sum(counters.get(f"bytes:{main}->{lv}", 0) for lv in pads)
        if moved == 0:
            return (f"no bytes moved from {main} into a scratchpad ({', '.join(pads)}): the case computed on "
                    f"main memory (counters {counters})")
    units = spec.compute[0]
    if resources.get("cores", 1) > units.count:
        return (f"a parallel loop runs on {resources['cores']} {units.name}s; the chip has {units.count}")
    for level, used in resources.get("scratchpad_bytes", {}).items():
        lvl = next((m for m in spec.memory if m.name == level), None)
        cap = (lvl.max_size_bytes or lvl.size_bytes) if lvl is not None else None
        if cap is not None and used > cap:
            return f"scratchpad '{level}' holds {used} B, more than its capacity {cap} B"
    if case.matrix_unit:
        # The planner's unit, or another of the spec's units for the dtype: a target may lower a kernel on a
        # different unit of the chip (the cpu target's fused attention on the vector-register units of a
        # host whose first bf16 unit is AMX's tiles).
        accepted = {case.matrix_unit} | {u.name for u in spec.matrix_units if u.operand_dtype == case.dtype}
        ops = resources.get("matrix_unit_ops")
        if ops is None:  # no run-time counters: the compile-time record must say a unit was used
            contractions = resources.get("contractions")
            if contractions is None:
                return "not reported"
            used = any(c.get("unit") in accepted for c in contractions)
        else:
            used = any(ops.get(name, 0) > 0 for name in accepted)
        if not used:
            return (f"contraction in {case.dtype} should have used matrix unit {case.matrix_unit} but the target "
                    f"issued no {case.matrix_unit} ops ({resources.get('matrix_unit_ops') or resources.get('contractions')})")
    return "ok"


#: How a result checked on the target's host emulation (no device) says so in its message.
EMULATED = "compiled; run on the host emulation of the target's schedule (no device)"


def run_case(case: Case, *, target: str, spec: ChipSpec, seed: int = 0, emulate: bool = True) -> CaseResult:
    """Compile and run ``case``; without the device, on the target's host emulation when it has one
    (`Target.emulate`, unless ``emulate`` is False), else a compile-only "skip"."""
    import pbsdk

    note = ""

    if case.skip:
        return CaseResult(case.name, "skip", case.why, 0.0, message=case.skip)
    t0 = time.perf_counter()
    inputs = case.inputs(seed)
    exact = case.compare == "exact"  # integer arithmetic: bit for bit against numpy
    tol = (None if exact else
           tolerance(case.op, case.dtype, reduction_size=case.reduction_size, accumulator=case.accumulator))
    try:
        fn = pbsdk.jit(case.fn, target=target, spec=spec)
        got = fn(*inputs)
        kernel = fn.kernel(fn.signatures[0])[0] if len(fn.signatures) == 1 else None
    except DeviceUnavailableError as exc:
        # Compilation succeeded (loading is what needs the device). Where the target can run its own
        # schedule on the host, the numbers are checked on that; else a compile-only check, said as such.
        emulated = None
        if emulate:
            try:
                request = fn.request
                run = request.target.emulate(fn.lower(*inputs), request.spec, request.options)
                emulated = None if run is None else run(*inputs)
            except Exception as emu_exc:  # noqa: BLE001
                return CaseResult(case.name, "error", case.why, time.perf_counter() - t0,
                                  message=f"compiled; emulation failed: {type(emu_exc).__name__}: {emu_exc}"[:2000])
        if emulated is None:
            return CaseResult(case.name, "skip", case.why, time.perf_counter() - t0,
                              message=f"compiled, not run: {exc}"[:2000])
        got, kernel, note = emulated, None, f"{EMULATED}: {exc}"
    except Exception as exc:  # noqa: BLE001 -- a target's failure is a result, not a crash of the suite
        return CaseResult(case.name, "error", case.why, time.perf_counter() - t0,
                          message=f"{type(exc).__name__}: {exc}"[:2000])
    resources = _reported(kernel)
    _with_modelled_time(resources, getattr(kernel, "executable", None), spec)
    check = check_resources(case, spec, resources)
    expected = case.reference(*inputs)
    elapsed = time.perf_counter() - t0
    got_a, exp_a = np.asarray(got), np.asarray(expected)
    abs_err = rel_err = None
    if got_a.shape == exp_a.shape:
        abs_err, rel_err = max_error(got_a, exp_a)
    atol, rtol = (0.0, 0.0) if tol is None else (tol.atol, tol.rtol)
    try:
        if exact:
            _assert_equal(got_a, exp_a)
        else:
            assert_close(got_a, exp_a, op=case.op, dtype=case.dtype, reduction_size=case.reduction_size,
                         accumulator=case.accumulator)
    except AssertionError as exc:
        return CaseResult(case.name, "fail", case.why, elapsed, abs_err, rel_err, atol, rtol,
                          f"{note + '; ' if note else ''}{exc}"[:2000], resources, check)
    if check not in ("ok", "not reported"):
        return CaseResult(case.name, "fail", case.why, elapsed, abs_err, rel_err, atol, rtol,
                          f"resource check: {check}", resources, check)
    return CaseResult(case.name, "pass", case.why, elapsed, abs_err, rel_err, atol, rtol, note[:2000],
                      resources, check)


def _assert_equal(got: np.ndarray, expected: np.ndarray) -> None:
    """Bit-for-bit equality of integer results (same dtype and shape)."""
    if got.dtype != expected.dtype or got.shape != expected.shape:
        raise AssertionError(f"expected {expected.dtype}{list(expected.shape)}, got {got.dtype}{list(got.shape)}")
    bad = got != expected
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{int(bad.sum())} of {got.size} elements differ (exact integer comparison); first at "
                             f"{first}: got {got[first]}, expected {expected[first]}")


def run_cases(cases: Sequence[Case], *, target: str, spec: ChipSpec, seed: int = 0,
              emulate: bool = True) -> list[CaseResult]:
    return [run_case(c, target=target, spec=spec, seed=seed, emulate=emulate) for c in cases]


def run_named_case(args: tuple[str, dict[str, Any], list[str] | None, bool, str, bool]) -> CaseResult:
    """One case of a suite run where its generator cannot be sent (an engine's worker, `pbsdk.engines`):
    ``(target, spec data, families, full, case name, emulate)``; the suite is generated again here (it is
    deterministic) and the named case run."""
    from pbsdk.conformance.cases import generate_cases
    from pbsdk.core.spec import validate_data

    target, spec_data, families, full, name, emulate = args
    spec = validate_data(spec_data, "conformance")
    (case,) = [c for c in generate_cases(spec, ops_filter=families, full=full) if c.name == name]
    return run_case(case, target=target, spec=spec, emulate=emulate)


def summary(results: Sequence[CaseResult]) -> dict[str, int]:
    counts = {"pass": 0, "fail": 0, "error": 0, "skip": 0}
    for r in results:
        counts[r.status] += 1
    return counts


def report(results: Sequence[CaseResult], *, target: str, spec: ChipSpec) -> dict[str, Any]:
    counts = summary(results)
    return {"target": target, "spec": spec.name, "summary": counts,
            "passed": counts["pass"], "failed": counts["fail"], "skipped": counts["skip"], "errors": counts["error"],
            "resources_reported": sum(r.resource_check != "not reported" for r in results if r.status != "skip"),
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


def _contraction_summary(contractions: list[dict[str, Any]]) -> list[str]:
    """Where a target without run-time counters compiled a case's contractions, from its compile-time record:
    e.g. ``vpdpbusd 1/1 contractions`` (each unit's share), ``vector-fma 2/2 contractions``."""
    total = len(contractions)
    where = Counter(c.get("unit") or c.get("compute") or "?" for c in contractions)
    return [f"{name} {n}/{total} contractions" for name, n in sorted(where.items())]


def resource_summary(result: CaseResult) -> str:
    """One short line of a case's reported resource use, e.g. ``spm 20480 B, sram 57344 B, mxu 16 ops``."""
    if result.resources is None:
        return "resources not reported" if result.status != "skip" else ""
    parts = [f"{lv} {b} B" for lv, b in result.resources.get("scratchpad_bytes", {}).items()]
    parts += [f"{u} {n} ops" for u, n in (result.resources.get("matrix_unit_ops") or {}).items()]
    if result.resources.get("matrix_unit_ops") is None:  # no run-time counters: the compile-time record
        parts += _contraction_summary(result.resources.get("contractions") or [])
    counters = result.resources.get("counters") or {}
    parts += [f"vector@{k.split(':', 1)[1]} {n} pts" for k, n in counters.items() if k.startswith("vector:")]
    if result.resources.get("cores", 1) > 1:
        parts.append(f"{result.resources['cores']} cores")
    modelled = result.resources.get("modelled") or {}
    if "seconds" in modelled:
        parts.append(f"modelled {modelled['seconds'] * 1e6:.2f} us ({modelled['bound']})")
    return ", ".join(parts) or "no scratchpad, no matrix unit"
