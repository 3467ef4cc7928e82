"""The runtime without the compiler: a process that holds only numpy and the runtime's own files.

The runtime's files (`RUNTIME_FILES`) are copied to a fresh directory, numpy is linked beside them, and a
Python started with ``-I -S`` (no site-packages, no PYTHONPATH) loads the exported file from there; a
meta-path blocker also makes importing MLIR, LLVM, torch, onnx, jax or any compiler module of pbsdk an
error. Its outputs must equal the JIT's."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np

import pbsdk

REPO = Path(pbsdk.__file__).resolve().parent.parent
#: What the runtime distribution consists of (relative to the repository).
RUNTIME_FILES = ("pbsdk/__init__.py", "pbsdk/core/__init__.py", "pbsdk/core/errors.py", "pbsdk/runtime")

_SCRIPT = r'''
import importlib.abc, sys
BLOCKED = ("mlir", "llvmlite", "torch", "onnx", "onnxruntime", "jax", "jaxlib", "pydantic", "yaml", "ml_dtypes",
           "pbsdk.core.compiler", "pbsdk.core.ir", "pbsdk.core.spec", "pbsdk.frontends", "pbsdk.targets",
           "pbsdk.deploy", "pbsdk.onnx", "pbsdk.ops")

class Blocker(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if any(name == b or name.startswith(b + ".") for b in BLOCKED):
            raise ImportError("blocked in this test: " + name)
        return None

sys.meta_path.insert(0, Blocker())
sys.path[:0] = sys.argv[1:3]
import numpy as np
import pbsdk.runtime
model = pbsdk.runtime.load(sys.argv[3])
outs = model(*[np.load(p) for p in sys.argv[5:]])
outs = outs if isinstance(outs, tuple) else (outs,)
for i, o in enumerate(outs):
    np.save(sys.argv[4] + str(i) + ".npy", o)
leaked = sorted(m for m in sys.modules if any(m == b or m.startswith(b + ".") for b in BLOCKED))
assert not leaked, leaked
print("modules", len(sys.modules))
'''


def runtime_tree(dest: Path) -> Path:
    """Copy the runtime's files (and nothing else of pbsdk) under ``dest``."""
    for rel in RUNTIME_FILES:
        src, dst = REPO / rel, dest / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy(src, dst)
    return dest


def numpy_only(dest: Path) -> Path:
    """A directory holding numpy (links to this environment's) and nothing else."""
    site = Path(np.__file__).resolve().parent.parent
    dest.mkdir(parents=True, exist_ok=True)
    for name in ("numpy", "numpy.libs"):
        if (site / name).exists():
            os.symlink(site / name, dest / name)
    return dest


def test_runtime_runs_without_the_compiler(exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    code = runtime_tree(tmp_path / "runtime")
    deps = numpy_only(tmp_path / "deps")
    np.save(tmp_path / "x.npy", exported_mlp.inputs[0])
    script = tmp_path / "run.py"
    script.write_text(_SCRIPT)
    done = subprocess.run([sys.executable, "-I", "-S", str(script), str(code), str(deps), str(exported_mlp.path),
                           str(tmp_path / "out"), str(tmp_path / "x.npy")],
                          check=False, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stderr
    for i, want in enumerate(exported_mlp.expected):
        np.testing.assert_array_equal(np.load(tmp_path / f"out{i}.npy"), want)
