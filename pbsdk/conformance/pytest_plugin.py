"""pytest plugin: ``pytest --pbsdk-target NAME [--pbsdk-spec SPEC] [--pbsdk-ops a,b]`` adds one test item per
generated conformance case (registered through the ``pytest11`` entry point, so any project — a
scaffolded target's own tests included — gets it by installing pbsdk)."""

from __future__ import annotations

from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("pbsdk", "pbsdk conformance")
    group.addoption("--pbsdk-target", default=None, help="run the spec-driven conformance suite on this target")
    group.addoption("--pbsdk-spec", default=None, help="chip spec (preset or YAML path; default: the target's)")
    group.addoption("--pbsdk-ops", default=None, help="comma-separated case families")
    group.addoption("--pbsdk-full", action="store_true", help="include large capacity-straddling cases")


class ConformanceItem(pytest.Item):
    def __init__(self, *, case: Any, target: str, spec: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.case, self.target, self.spec = case, target, spec

    def runtest(self) -> None:
        from pbsdk.conformance.runner import run_case

        result = run_case(self.case, target=self.target, spec=self.spec)
        if result.status == "skip":
            pytest.skip(result.message)
        if result.status != "pass":
            raise AssertionError(f"{result.status}: {result.message}")

    def reportinfo(self) -> tuple[str, int, str]:
        return "pbsdk-conformance", 0, f"{self.target}: {self.name}"


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    target = config.getoption("--pbsdk-target")
    if not target:
        return
    from pbsdk.conformance.cases import generate_cases
    from pbsdk.core.compiler import resolve

    request = resolve(target, config.getoption("--pbsdk-spec"), None)
    families = [f for f in (config.getoption("--pbsdk-ops") or "").split(",") if f] or None
    for case in generate_cases(request.spec, ops_filter=families, full=config.getoption("--pbsdk-full")):
        items.append(ConformanceItem.from_parent(session, name=f"conformance[{request.target.name}]::{case.name}",
                                                 case=case, target=request.target.name, spec=request.spec))
