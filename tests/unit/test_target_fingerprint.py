"""The compile cache's key covers a target plugin's whole top-level package: editing its ``hooks.py`` (or
any other module of it) gives another key, so no stale kernel is reused. A target may give its own
``Target.fingerprint()`` instead."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from pbsdk.core.runtime import cache

PACKAGE = "pbsdk_fingerprint_test_plugin"

INIT = '''
from pbsdk.targets.template import TemplateTarget

from pbsdk_fingerprint_test_plugin import hooks as _hooks


class FingerprintTarget(TemplateTarget):
    name = "fingerprint_test"
    hooks = _hooks
'''

HOOKS = '''
from pbsdk.targets.template import hooks as emulated


def dma_copy(copy, src, dst, spec):
    emulated.dma_copy(copy, src, dst, spec)
'''


@pytest.fixture
def plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The plugin's package in a temporary directory on sys.path; fingerprints computed afresh."""
    package = tmp_path / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text(INIT)
    (package / "hooks.py").write_text(HOOKS)
    (package / "util.py").write_text("SIZE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(cache, "_fingerprints", {})
    yield package
    for name in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
        del sys.modules[name]


def _fingerprint() -> str:
    """The target's fingerprint in a fresh process's state (the per-process memo cleared)."""
    module = sys.modules.get(PACKAGE) or __import__(PACKAGE)
    cache._fingerprints.clear()
    return cache._target_fingerprint(module.FingerprintTarget)


def test_editing_the_plugins_hooks_changes_its_fingerprint(plugin: Path) -> None:
    before = _fingerprint()
    assert before == _fingerprint()  # stable while nothing changes
    hooks = plugin / "hooks.py"
    hooks.write_text(hooks.read_text().replace("emulated.dma_copy(copy, src, dst, spec)",
                                               "emulated.dma_copy(copy, src, dst, spec)  # edited"))
    after = _fingerprint()
    assert after != before
    (plugin / "util.py").write_text("SIZE = 2\n")  # any module of the package
    assert _fingerprint() != after


def test_the_fingerprint_covers_hooks_from_another_package(plugin: Path, tmp_path: Path) -> None:
    other = tmp_path / "pbsdk_fingerprint_test_hooks.py"
    other.write_text(HOOKS)
    import pbsdk_fingerprint_test_hooks as hooks_module  # type: ignore[import-not-found]

    try:
        module = __import__(PACKAGE)
        target = type("Elsewhere", (module.FingerprintTarget,), {"hooks": hooks_module})
        cache._fingerprints.clear()
        before = cache._target_fingerprint(target)
        other.write_text(HOOKS + "\n# edited\n")
        cache._fingerprints.clear()
        assert cache._target_fingerprint(target) != before
    finally:
        sys.modules.pop("pbsdk_fingerprint_test_hooks", None)


def test_a_targets_own_fingerprint_replaces_the_source_hash(plugin: Path) -> None:
    module = __import__(PACKAGE)
    custom = type("Custom", (module.FingerprintTarget,), {"fingerprint": classmethod(lambda cls: "v7")})
    assert cache._target_fingerprint(custom) == "custom:v7"
    (plugin / "hooks.py").write_text(HOOKS + "\n# edited\n")
    cache._fingerprints.clear()
    assert cache._target_fingerprint(custom) == "custom:v7"  # the target answers for its code
