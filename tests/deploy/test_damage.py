"""Checked loading: each kind of damage to an exported file is a typed error of pbsdk.runtime, never a crash."""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from damage import DAMAGE

import pbsdk.runtime
from pbsdk.runtime import format as fmt


@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damage_is_a_typed_error(kind: str, exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    damage, error, _ = DAMAGE[kind]
    path = tmp_path / "damaged.pbsdk"
    shutil.copy(exported_mlp.path, path)
    if kind == "malformed-manifest":
        with pytest.raises(pbsdk.runtime.FormatError):  # the rewrite itself reads the manifest back
            damage(path)
        return
    damage(path)
    with pytest.raises(error) as info:
        pbsdk.runtime.load(path)
    assert isinstance(info.value, pbsdk.runtime.DeployError)
    if isinstance(info.value, pbsdk.runtime.ChecksumError):
        assert info.value.section in {"header", "manifest", "index", "mlp.code", "mlp.weight0", "mlp.weight1"}


def test_missing_feature_is_named(exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "m.pbsdk"
    shutil.copy(exported_mlp.path, path)
    DAMAGE["missing-cpu-feature"][0](path)
    with pytest.raises(pbsdk.runtime.CpuFeatureError, match="pbsdk_no_such_feature") as info:
        pbsdk.runtime.load(path)
    assert info.value.missing == ("pbsdk_no_such_feature",)


def test_unverified_load_skips_the_weights_only(exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "w.pbsdk"
    shutil.copy(exported_mlp.path, path)
    DAMAGE["weights-flipped"][0](path)
    model = pbsdk.runtime.load(path, verify=False)  # documented: weights are not checked then
    assert model(*exported_mlp.inputs)[0].shape == exported_mlp.expected[0].shape
    path2 = tmp_path / "c.pbsdk"
    shutil.copy(exported_mlp.path, path2)
    DAMAGE["code-flipped"][0](path2)
    with pytest.raises(pbsdk.runtime.ChecksumError):
        pbsdk.runtime.load(path2, verify=False)


def test_rewritten_manifest_still_loads(exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "r.pbsdk"
    shutil.copy(exported_mlp.path, path)
    fmt.rewrite_manifest(str(path), lambda m: m)
    np.testing.assert_array_equal(pbsdk.runtime.load(path)(*exported_mlp.inputs)[0], exported_mlp.expected[0])
