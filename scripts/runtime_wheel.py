"""Build ``pbsdk-runtime``, the deploy runtime as its own pip distribution (a wheel; `make runtime-wheel`).

The wheel holds exactly `RUNTIME_FILES` (``import pbsdk.runtime`` and the C API's sources) and depends on
numpy alone, so a deployment machine installs it without MLIR, LLVM, pydantic or torch::

    python scripts/runtime_wheel.py -o dist          # dist/pbsdk_runtime-<version>-py3-none-any.whl
    pip install dist/pbsdk_runtime-*.whl

It is written here (a wheel is a zip with three metadata files) rather than by a build backend, so that it
builds offline and byte for byte the same from the same sources. The full ``pbsdk`` distribution holds the
same files; install one or the other in an environment, not both.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
#: The runtime's files, relative to the repository (a directory: its files, caches left out).
RUNTIME_FILES = ("pbsdk/__init__.py", "pbsdk/core/__init__.py", "pbsdk/core/errors.py", "pbsdk/runtime")
NAME = "pbsdk_runtime"
#: What the runtime imports beyond the standard library (checked by tests/deploy/test_runtime_wheel.py).
REQUIRES = ("numpy>=1.24",)
#: Optional dependencies, by extra: bf16 inputs and outputs need ml_dtypes (an InputError says so without it).
EXTRAS = {"bf16": ("ml_dtypes>=0.5",)}
# Zip entries get one fixed time, so the same sources give the same bytes.
_EPOCH = (2020, 1, 1, 0, 0, 0)
_WHEEL = b"Wheel-Version: 1.0\nGenerator: pbsdk scripts/runtime_wheel.py\nRoot-Is-Purelib: true\nTag: py3-none-any\n"


def version(repo: Path = REPO) -> str:
    """The version in ``pyproject.toml`` (the runtime is versioned with the compiler that writes its files)."""
    found = re.search(r'^version\s*=\s*"([^"]+)"', (repo / "pyproject.toml").read_text(), re.MULTILINE)
    if found is None:
        raise SystemExit(f"{repo / 'pyproject.toml'}: no version")
    return found.group(1)


def sources(repo: Path = REPO) -> list[tuple[str, Path]]:
    """``(path in the wheel, file)`` for every runtime file, sorted."""
    out = []
    for rel in RUNTIME_FILES:
        src = repo / rel
        files = [p for p in src.rglob("*") if p.is_file()] if src.is_dir() else [src]
        for path in files:
            if "__pycache__" in path.parts or path.suffix in (".pyc", ".so", ".o"):
                continue
            out.append((path.relative_to(repo).as_posix(), path))
    return sorted(out)


def _metadata(ver: str) -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {NAME.replace('_', '-')}", f"Version: {ver}",
             "Summary: Run models exported by pbsdk (pbsdk.export) without the compiler.",
             "Requires-Python: >=3.10", *[f"Requires-Dist: {r}" for r in REQUIRES]]
    for extra, reqs in EXTRAS.items():
        lines += [f"Provides-Extra: {extra}", *[f'Requires-Dist: {r}; extra == "{extra}"' for r in reqs]]
    return "\n".join(lines) + "\n"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build(dest: Path, repo: Path = REPO) -> Path:
    """Write the wheel into ``dest``; its path."""
    ver = version(repo)
    info = f"{NAME}-{ver}.dist-info"
    entries = [(name, path.read_bytes()) for name, path in sources(repo)]
    entries += [(f"{info}/METADATA", _metadata(ver).encode()),
                (f"{info}/WHEEL", _WHEEL),
                (f"{info}/top_level.txt", b"pbsdk\n")]
    record = [_record_line(name, data) for name, data in entries] + [f"{info}/RECORD,,"]
    entries.append((f"{info}/RECORD", ("\n".join(record) + "\n").encode()))
    dest.mkdir(parents=True, exist_ok=True)
    wheel = dest / f"{NAME}-{ver}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in entries:
            item = zipfile.ZipInfo(name, _EPOCH)
            item.external_attr = 0o644 << 16
            item.compress_type = zipfile.ZIP_DEFLATED
            zf.writestr(item, data)
    return wheel


def make_venv(dest: Path, wheel: Path) -> Path:
    """A fresh virtualenv at ``dest`` (no system site-packages) holding ``wheel``, installed by pip offline,
    and the calling interpreter's numpy, linked into it (the wheel's one dependency; tests and benchmarks run
    where no package index is); its Python."""
    import numpy as np

    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True)
    python = dest / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet", "--no-index",
                    "--no-deps", "--disable-pip-version-check", str(wheel)], check=True, timeout=300)
    site = subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = Path(np.__file__).resolve().parent.parent
    for name in ("numpy", "numpy.libs", f"numpy-{np.__version__}.dist-info"):
        if (ours / name).exists():
            os.symlink(ours / name, Path(site) / name)
    return python


def fresh_venv(dest: Path) -> Path:
    """The wheel built under ``dest`` and installed into a fresh virtualenv there (`make_venv`); its Python."""
    return make_venv(dest / "venv", build(dest / "wheel"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out", type=Path, default=REPO / "dist", help="directory for the wheel")
    print(build(parser.parse_args().out))


if __name__ == "__main__":
    main()
