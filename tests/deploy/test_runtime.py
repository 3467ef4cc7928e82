"""pbsdk.runtime on an exported pbsdk.jit function: same outputs as the JIT, checked arguments, threads."""

from __future__ import annotations

import json
import threading

import numpy as np
import pytest

import pbsdk.runtime
from pbsdk.runtime import format as fmt


def test_outputs_equal_the_jit(exported_mlp) -> None:  # type: ignore[no-untyped-def]
    model = pbsdk.runtime.load(exported_mlp.path)
    got = model(*exported_mlp.inputs)
    assert isinstance(got, tuple) and len(got) == 2
    for a, b in zip(got, exported_mlp.expected):
        np.testing.assert_array_equal(a, b)


def test_manifest_describes_the_entry(exported_mlp) -> None:  # type: ignore[no-untyped-def]
    model = pbsdk.runtime.load(exported_mlp.path)
    m = model.manifest
    assert (m.target, m.format) == ("cpu", fmt.FORMAT_VERSION)
    (entry,) = m.entries
    assert entry.name == "mlp"
    assert [(t.name, t.shape, t.dtype) for t in entry.inputs] == [("x", (8, 96), "float32")]
    assert [(t.shape, t.dtype) for t in entry.outputs] == [((8, 16), "float32"), ((8,), "float32")]
    assert len(entry.constants) >= 1  # the large weights, as sections of their own
    for c in entry.constants:
        assert m.sections[c].offset % fmt.ALIGNMENT == 0
    assert "avx2" in m.cpu_features or "neon" in m.cpu_features or m.cpu_features
    assert {"pbsdk", "llvmlite", "mlir"} <= set(m.compiler)
    assert len(m.spec_hash) == 64
    raw = json.loads(exported_mlp.path.read_bytes()[fmt.read_header(exported_mlp.path.read_bytes()).manifest[0]:]
                     .split(b"\0")[0])
    assert raw["entries"][0]["name"] == "mlp"


def test_weights_are_mapped_not_copied(exported_mlp) -> None:  # type: ignore[no-untyped-def]
    model = pbsdk.runtime.load(exported_mlp.path)
    entry = model.entry("mlp")
    base = model._bytes.ctypes.data
    for c, address in zip(entry.desc.constants, entry._constants):
        assert address == base + model.manifest.sections[c].offset  # inside the file's map


def test_wrong_inputs_are_typed_errors(exported_mlp) -> None:  # type: ignore[no-untyped-def]
    model = pbsdk.runtime.load(exported_mlp.path)
    x = exported_mlp.inputs[0]
    with pytest.raises(pbsdk.runtime.InputError, match="shape"):
        model(x[:4])
    with pytest.raises(pbsdk.runtime.InputError, match="dtype"):
        model(x.astype(np.float64))
    with pytest.raises(pbsdk.runtime.InputError, match="takes 1 input"):
        model(x, x)
    with pytest.raises(pbsdk.runtime.InputError, match="numpy array"):
        model(x.tolist())
    with pytest.raises(pbsdk.runtime.InputError, match="no entry"):
        model.entry("other")


def test_non_contiguous_input_is_copied(exported_mlp) -> None:  # type: ignore[no-untyped-def]
    model = pbsdk.runtime.load(exported_mlp.path)
    x = np.asfortranarray(exported_mlp.inputs[0])
    np.testing.assert_array_equal(model(x)[0], exported_mlp.expected[0])


def test_calls_from_threads(exported_mlp) -> None:  # type: ignore[no-untyped-def]
    model = pbsdk.runtime.load(exported_mlp.path)
    rng = np.random.default_rng(2)
    xs = [rng.standard_normal((8, 96)).astype(np.float32) for _ in range(8)]
    want = [exported_mlp.jit(x)[0] for x in xs]
    got: dict[int, np.ndarray] = {}

    def work(i: int) -> None:
        for _ in range(20):
            got[i] = model(xs[i])[0]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, w in enumerate(want):
        np.testing.assert_array_equal(got[i], w)


def test_unverified_load_still_checks_the_code(exported_mlp) -> None:  # type: ignore[no-untyped-def]
    model = pbsdk.runtime.load(exported_mlp.path, verify=False)
    np.testing.assert_array_equal(model(*exported_mlp.inputs)[1], exported_mlp.expected[1])


def test_several_files_loaded_at_once(exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pbsdk
    from pbsdk import ops

    def double(x):  # type: ignore[no-untyped-def]
        return ops.relu(x) * 2.0

    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    other = pbsdk.runtime.load(pbsdk.export(double, (x,), tmp_path / "double.pbsdk"))
    first = pbsdk.runtime.load(exported_mlp.path)
    models = [other]
    for _ in range(3):  # each file's code, never the other's (both load from /proc/self/fd/N paths)
        np.testing.assert_array_equal(models[-1](x), np.maximum(x, 0) * 2)
        np.testing.assert_array_equal(first(*exported_mlp.inputs)[0], exported_mlp.expected[0])
        models = [pbsdk.runtime.load(tmp_path / "double.pbsdk")]  # the previous one closed


def test_an_entry_outlives_its_model(exported_mlp) -> None:  # type: ignore[no-untyped-def]
    import gc

    entry = pbsdk.runtime.load(exported_mlp.path).entry("mlp")  # the model itself is dropped
    gc.collect()
    np.testing.assert_array_equal(entry(*exported_mlp.inputs)[0], exported_mlp.expected[0])
