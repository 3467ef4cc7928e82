"""Helpers of the bring-up kit tests (imported by name: tests/ has no packages)."""

from __future__ import annotations

from pathlib import Path

from pbsdk.core.spec import ChipSpec

DATA = Path(__file__).with_name("data")
TINY_SPEC = DATA / "tiny_npu.yaml"


def with_scratchpad(spec: ChipSpec, level: str, size: int) -> ChipSpec:
    """``spec`` with level ``level`` shrunk to ``size`` bytes (outer levels untouched)."""
    data = spec.model_dump()
    for m in data["memory"]:
        if m["name"] == level:
            m["size_bytes"], m["max_size_bytes"] = size, None
    return type(spec).model_validate(data)
