"""A third-party plugin replaces one hook of the cpu target through the core contract: ``emudot``
(tests/plugins/emulated_dot_target, installed here as pip would leave it for discovery) subclasses
`CpuTarget` with a ``hooks.py`` whose ``unit_step`` emulates the dot-product units in vector arithmetic.
Discovery checks it like any plugin; the cpu target's other stages and hooks are unchanged."""

from __future__ import annotations

import importlib
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import pbsdk
from pbsdk.core import target as target_mod
from pbsdk.core.compiler import compile_text, resolve
from pbsdk.core.spec import load_spec
from pbsdk.core.target import ENTRY_POINT_GROUP, discover, get_target
from pbsdk.targets.cpu.pack_contractions import lowers_unit
from pbsdk.testing import assert_close

SRC = Path(__file__).resolve().parents[1] / "plugins" / "emulated_dot_target"
MODULES = ("pbsdk_emulated_dot_target", "pbsdk_emulated_dot_target.hooks")
BF16 = np.dtype(ml_dtypes.bfloat16)


@pytest.fixture
def emudot(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The plugin's package on sys.path and its dist-info (entry point ``emudot``) in a site directory."""
    shutil.copytree(SRC / "pbsdk_emulated_dot_target", tmp_path / "src" / "pbsdk_emulated_dot_target",
                    ignore=shutil.ignore_patterns("__pycache__"))
    info = tmp_path / "site" / "pbsdk_emulated_dot_target-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pbsdk-emulated-dot-target\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\nemudot = pbsdk_emulated_dot_target:EmulatedDotTarget\n")
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    target_mod._cache.clear()
    yield
    target_mod._cache.clear()
    for module in MODULES:
        sys.modules.pop(module, None)


_MM = """
func.func @mm(%a: tensor<40x70xbf16>, %b: tensor<70x50xbf16>) -> tensor<40x50xf32> {
  %z = arith.constant 0.0 : f32
  %e = tensor.empty() : tensor<40x50xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<40x50xf32>) -> tensor<40x50xf32>
  %r = linalg.matmul ins(%a, %b : tensor<40x70xbf16>, tensor<70x50xbf16>) outs(%f : tensor<40x50xf32>) -> tensor<40x50xf32>
  return %r : tensor<40x50xf32>
}
"""


def test_the_plugin_is_discovered_with_its_one_hook(emudot: None) -> None:
    info = {i.name: i for i in discover()}["emudot"]
    assert info.error is None and info.cls is not None
    assert info.cls.implemented_hooks() == frozenset({"unit_step"})
    assert get_target("cpu").resolved_hook("unit_step").__module__ == "pbsdk.targets.cpu.hooks"
    assert get_target("emudot").resolved_hook("unit_step").__module__ == "pbsdk_emulated_dot_target.hooks"


def test_its_unit_step_replaces_the_intrinsic(emudot: None) -> None:
    spec = load_spec("amd/zen4")
    ours = str(compile_text(_MM, resolve("emudot", spec, {"threads": 1}), stop_after="pack-contractions"))
    cpu = str(compile_text(_MM, resolve("cpu", spec, {"threads": 1}), stop_after="pack-contractions"))
    assert "llvm.x86.avx512bf16.dpbf16ps" in cpu
    assert "llvm.call_intrinsic" not in ours and "@__pbsdk_mm0_part" in ours  # the same kernel, its own step
    assert "arith.extf" in ours and "vector<16xbf16> to vector<16xf32>" in ours


def test_the_cache_tells_the_plugin_from_the_cpu_target(emudot: None) -> None:
    from pbsdk.core.runtime.cache import _target_fingerprint

    assert _target_fingerprint(type(get_target("emudot"))) != _target_fingerprint(type(get_target("cpu")))


@pytest.mark.skipif(not lowers_unit(load_spec("host"), "vdpbf16ps"), reason="the host has no AVX512-BF16: the plugin's kernels are "
                    "planned for that unit (its IR is checked by test_its_unit_step_replaces_the_intrinsic)")
def test_the_plugin_computes_the_product(emudot: None) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((40, 70)).astype(BF16), rng.standard_normal((70, 50)).astype(BF16)
    fn = pbsdk.jit(lambda x, w: x @ w, target="emudot", options={"threads": 2, "cache": False})
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(BF16)
    assert_close(fn(a, b), want, op="matmul", dtype="bf16", reduction_size=70, accumulator="f32")
