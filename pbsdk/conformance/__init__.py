"""The spec-driven conformance suite: cases generated from a ChipSpec, numpy as the oracle.

`generate_cases(spec)` derives the cases from what the chip says it has — the planner's compute tile
(matrix-unit shape or vector register tile) and its per-level tiles, the capacity of every cache and
scratchpad, the vector width and the dtypes — and `run_cases(target, spec, cases)` runs each through
``pbsdk.jit`` on the target and compares it with `pbsdk.testing.reference` at the tolerances declared
in `pbsdk.testing.tolerances`. Reports are JSON and JUnit XML (`pbsdk conform`).
"""

from pbsdk.conformance.cases import Case, generate_cases
from pbsdk.conformance.runner import CaseResult, junit_xml, run_cases, summary

__all__ = ["Case", "CaseResult", "generate_cases", "junit_xml", "run_cases", "summary"]
