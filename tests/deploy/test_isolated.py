"""The runtime without the compiler: a fresh virtualenv holding the ``pbsdk-runtime`` wheel and numpy only.

`runtime_venv` builds the wheel (scripts/runtime_wheel.py, `make runtime-wheel`), creates a virtualenv
(``python -m venv``, no system site-packages), installs the wheel into it with pip (offline, no
dependencies resolved) and links this environment's numpy into it (the one dependency; no index to install
it from here). The script below runs in that environment's Python with ``-I`` (PYTHONPATH and the user's
site ignored): it checks that the environment holds exactly those two distributions and that MLIR, LLVM,
torch, onnx, jax, pydantic and the compiler's modules of pbsdk cannot be found, then runs an exported file.
Its outputs must equal the JIT's."""

from __future__ import annotations

import functools
import importlib.util
import subprocess
from pathlib import Path
from typing import Any

import numpy as np

import pbsdk

REPO = Path(pbsdk.__file__).resolve().parent.parent

#: The environment's checks: only numpy and pbsdk-runtime installed, nothing of the compiler to be found.
CHECKS = r'''
import importlib.metadata, importlib.util, sys
ABSENT = ("mlir", "llvmlite", "torch", "onnx", "onnxruntime", "jax", "jaxlib", "pydantic", "yaml", "ml_dtypes",
          "pbsdk.core.compiler", "pbsdk.core.ir", "pbsdk.core.spec", "pbsdk.frontends", "pbsdk.targets",
          "pbsdk.deploy", "pbsdk.onnx", "pbsdk.ops")
dists = sorted(d.metadata["Name"] for d in importlib.metadata.distributions())
assert dists == ["numpy", "pbsdk-runtime"], dists
found = [m for m in ABSENT if importlib.util.find_spec(m) is not None]
assert not found, found
import pbsdk
try:
    pbsdk.jit
    raise AssertionError("pbsdk.jit without the compiler")
except ImportError as exc:
    assert "pip install pbsdk" in str(exc), exc
'''
_SCRIPT = CHECKS + r'''
import numpy as np
import pbsdk.runtime
model = pbsdk.runtime.load(sys.argv[1])
outs = model(*[np.load(p) for p in sys.argv[3:]])
outs = outs if isinstance(outs, tuple) else (outs,)
for i, o in enumerate(outs):
    np.save(sys.argv[2] + str(i) + ".npy", o)
print("modules", len(sys.modules))
'''


@functools.cache
def runtime_wheel() -> Any:
    """scripts/runtime_wheel.py as a module (a build script, not part of the package)."""
    spec = importlib.util.spec_from_file_location("runtime_wheel", REPO / "scripts" / "runtime_wheel.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def runtime_venv(dest: Path) -> Path:
    """A fresh virtualenv under ``dest`` holding the runtime wheel and numpy; its Python."""
    return runtime_wheel().fresh_venv(dest)


def run_in_venv(python: Path, path: Path, inputs: list[np.ndarray], tmp: Path) -> list[np.ndarray]:
    """``path`` run by the runtime in `runtime_venv`'s environment; its outputs."""
    names = []
    for i, x in enumerate(inputs):
        np.save(tmp / f"x{i}.npy", x)
        names.append(str(tmp / f"x{i}.npy"))
    (tmp / "run.py").write_text(_SCRIPT)
    done = subprocess.run([str(python), "-I", str(tmp / "run.py"), str(path), str(tmp / "out"), *names],
                          check=False, capture_output=True, text=True, cwd=tmp, timeout=600)
    assert done.returncode == 0, done.stderr
    return [np.load(p) for p in sorted(tmp.glob("out*.npy"), key=lambda p: int(p.stem[3:]))]


def test_runtime_runs_without_the_compiler(exported_mlp, runtime_python, tmp_path) -> None:  # type: ignore[no-untyped-def]
    outs = run_in_venv(runtime_python, exported_mlp.path, list(exported_mlp.inputs), tmp_path)
    assert len(outs) == len(exported_mlp.expected)
    for got, want in zip(outs, exported_mlp.expected):
        np.testing.assert_array_equal(got, want)
