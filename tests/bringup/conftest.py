"""Shared helpers of the bring-up kit tests."""

from __future__ import annotations

import pytest
from bringup_helpers import TINY_SPEC

from pbsdk.core.spec import ChipSpec, load_spec


@pytest.fixture(scope="session")
def npu() -> ChipSpec:
    return load_spec("example/npu")


@pytest.fixture(scope="session")
def tiny() -> ChipSpec:
    return load_spec(TINY_SPEC)

