"""The C API: libpbsdk_runtime.so built by ``make runtime-c``, and the test program tests/deploy/c/run_model.c
built against it, run an exported file (outputs equal to the JIT's, two threads at once, a wrong shape
refused) and refuse damaged files with the status the Python runtime's error corresponds to."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from damage import DAMAGE

REPO = Path(__file__).resolve().parents[2]
CC = shutil.which("cc") or shutil.which("gcc")

pytestmark = pytest.mark.skipif(CC is None or shutil.which("make") is None,
                                reason="the C API needs a C compiler (cc/gcc) and make")


@pytest.fixture(scope="module")
def run_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    build = tmp_path_factory.mktemp("runtime-c")
    subprocess.run(["make", "-s", "-C", str(REPO), "runtime-c", f"RUNTIME_BUILD={build}"], check=True,
                   capture_output=True)
    assert (build / "libpbsdk_runtime.so").exists() and (build / "pbsdk_runtime.h").exists()
    exe = build / "run_model"
    assert CC is not None
    subprocess.run([CC, "-O2", "-Wall", "-Werror", f"-I{build}", "-o", str(exe),
                    str(REPO / "tests/deploy/c/run_model.c"), f"-L{build}", "-lpbsdk_runtime",
                    f"-Wl,-rpath,{build}", "-lpthread"], check=True, capture_output=True)
    return exe


def test_c_program_matches_the_jit(run_model, exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    x = tmp_path / "x.bin"
    exported_mlp.inputs[0].tofile(x)
    outs = [tmp_path / f"out{i}.bin" for i in range(len(exported_mlp.expected))]
    done = subprocess.run([str(run_model), str(exported_mlp.path), str(x), *map(str, outs)], check=False, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "wrong-shape input" in done.stdout
    for out, want in zip(outs, exported_mlp.expected):
        np.testing.assert_array_equal(np.fromfile(out, want.dtype).reshape(want.shape), want)


@pytest.mark.parametrize("kind", sorted(k for k, (_, _, status) in DAMAGE.items() if status is not None))
def test_c_refuses_damage(kind: str, run_model, exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    damage, _, status = DAMAGE[kind]
    path = tmp_path / "damaged.pbsdk"
    shutil.copy(exported_mlp.path, path)
    damage(path)
    done = subprocess.run([str(run_model), str(path)], check=False, capture_output=True, text=True, timeout=60)
    assert done.stdout.splitlines()[0] == f"status {status}", done.stdout + done.stderr
    assert done.returncode not in (0, -11, -6, -7)  # an error code, not success or a signal


def test_c_program_many_weights(run_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """More index records than the index's first token is long (the C reader once bounded counts by that)."""
    import pbsdk
    import pbsdk.runtime
    from pbsdk import ops

    rng = np.random.default_rng(5)
    weights = [rng.standard_normal((48, 48)).astype(np.float32) / 7 for _ in range(16)]

    def deep(x):  # type: ignore[no-untyped-def]
        for w in weights:
            x = ops.tanh(x @ w)
        return x

    x = rng.standard_normal((4, 48)).astype(np.float32)
    path = pbsdk.export(deep, (x,), tmp_path / "deep.pbsdk")
    assert len(pbsdk.runtime.load(path).manifest.entries[0].constants) >= 12
    x.tofile(tmp_path / "x.bin")
    done = subprocess.run([str(run_model), str(path), str(tmp_path / "x.bin"), str(tmp_path / "y.bin")], check=False,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    want = pbsdk.jit(deep)(x)
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y.bin", np.float32).reshape(want.shape), want)


def test_c_program_converts_integer_inputs(run_model, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """int64 token ids given, floats taken: the C runtime converts them as the Python runtime does."""
    torch = pytest.importorskip("torch")
    import pbsdk
    import pbsdk.runtime

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Embedding(40, 6), torch.nn.Tanh()).eval()
    ids = torch.randint(0, 40, (3, 7))
    path = pbsdk.export(module, (ids,), tmp_path / "embed.pbsdk")
    want = pbsdk.runtime.load(path)(ids.numpy())
    ids.numpy().tofile(tmp_path / "ids.bin")
    done = subprocess.run([str(run_model), str(path), str(tmp_path / "ids.bin"), str(tmp_path / "y.bin")], check=False,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y.bin", want.dtype).reshape(want.shape), want)


def test_c_program_runs_a_template_export(run_model, exported_template, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The template's emulation is host code like the cpu target's: the C runtime runs it (identical)."""
    exported_template.inputs[0].tofile(tmp_path / "x.bin")
    want = exported_template.expected[0]
    done = subprocess.run([str(run_model), str(exported_template.path), str(tmp_path / "x.bin"),
                           str(tmp_path / "y.bin")], check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    np.testing.assert_array_equal(np.fromfile(tmp_path / "y.bin", want.dtype).reshape(want.shape), want)


def test_c_refuses_an_nvgpu_export(run_model, exported_nvgpu) -> None:  # type: ignore[no-untyped-def]
    """GPU code is the Python runtime's (CUDA driver): the C runtime says so with PBSDK_ERR_TARGET."""
    done = subprocess.run([str(run_model), str(exported_nvgpu.path)], check=False, capture_output=True, text=True,
                          timeout=60)
    assert done.stdout.splitlines()[0] == "status target", done.stdout + done.stderr
    assert "GPU code" in done.stdout + done.stderr and done.returncode not in (0, -11, -6, -7)
