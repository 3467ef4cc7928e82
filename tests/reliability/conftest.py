"""Reliability tests use a private compilation cache each, so they neither see nor leave entries."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "pbsdk-cache"
    monkeypatch.setenv("PBSDK_CACHE_DIR", str(directory))
    monkeypatch.delenv("PBSDK_CACHE", raising=False)
    monkeypatch.delenv("PBSDK_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("PBSDK_DUMP_DIR", raising=False)
    return directory
