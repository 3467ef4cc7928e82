"""The C toolchain of the emulation: a kernel's C source (artifact kind ``"c"``, `pbsdk.core.emit_c`) and the
target's intrinsics (``TemplateTarget.c_sources``) compiled by the host's C compiler into a shared library,
loaded with ctypes and called like the LLVM path's kernels (`pbsdk.targets.cpu.EntryCall`: bare pointers,
inputs, constants, outputs), with the same counters (the library's ``__pbsdk_counters``).

The compiler is ``$CC`` (default ``cc``) with `FLAGS` and then ``$PBSDK_CFLAGS`` (split on spaces: e.g.
``-Werror``, or ``-O0 -g`` to debug); libraries are kept under the compile cache's directory
(``PBSDK_CACHE_DIR``), keyed by the kernel's source, the intrinsics' files, the compiler and the flags.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from pbsdk.core.errors import CompileError, DeviceUnavailableError
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Artifact
from pbsdk.targets.template.counters import COUNTERS_GLOBAL, MAX_COUNTERS
from pbsdk.targets.template.emulation import TemplateExecutable

__all__ = ["FLAGS", "WARNINGS", "CExecutable", "build_library", "compiler", "flags"]

#: Warnings every generated kernel must compile without (the tests add ``-Werror``).
WARNINGS = ("-Wall", "-Wextra")
#: How kernels are compiled for the emulation.
FLAGS = ("-std=c11", "-O2", "-fPIC", "-shared", *WARNINGS)

#: Each library loaded once per process, never unloaded (kernels point into it), with the lock its runs take:
#: two executables of one library (the same C) share its counters and scratchpad arrays.
_libraries: dict[Path, tuple[ctypes.CDLL, threading.Lock]] = {}
_lock = threading.Lock()


def compiler() -> str:
    """The host's C compiler (``$CC``, else ``cc``); `DeviceUnavailableError` when there is none."""
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise DeviceUnavailableError(f"no C compiler '{cc}' on this host: the C-toolchain emulation compiles each "
                                     "kernel with it (set CC)")
    return cc


def flags() -> tuple[str, ...]:
    """`FLAGS`, then the words of ``$PBSDK_CFLAGS``."""
    return (*FLAGS, *os.environ.get("PBSDK_CFLAGS", "").split())


def _key(source: str, sources: Sequence[Path], cc: str) -> str:
    h = hashlib.sha256()
    for part in (source, cc, *flags()):
        h.update(part.encode() + b"\0")
    for path in sources:  # the intrinsics and the headers beside them
        for f in sorted([path, *path.parent.glob("*.h")]):
            h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def build_library(source: str, sources: Sequence[Path] = (), *, directory: Path | None = None) -> Path:
    """Compile ``source`` (a kernel's C) with the intrinsics ``sources`` into a shared library; return its
    path (reused when it exists). A compiler failure is a `CompileError` with the compiler's messages."""
    from pbsdk.core.runtime.cache import cache_dir

    cc = compiler()
    out_dir = directory if directory is not None else cache_dir() / "c-toolchain"
    out_dir.mkdir(parents=True, exist_ok=True)
    library = out_dir / f"{_key(source, sources, cc)}.so"
    if library.exists():
        return library
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        kernel = Path(tmp) / "kernel.c"
        kernel.write_text(source)
        includes = [f"-I{d}" for d in dict.fromkeys(str(p.parent) for p in sources)]
        built = Path(tmp) / "kernel.so"
        cmd = [cc, *flags(), *includes, str(kernel), *map(str, sources), "-o", str(built), "-lm"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False, timeout=600)
        if proc.returncode != 0:
            raise CompileError(f"the C compiler failed ({' '.join([cc, *flags()])}):\n{proc.stderr[-4000:]}",
                               stage="emit")
        os.replace(built, library)  # atomic: another process may build the same library
    return library


class CExecutable(TemplateExecutable):
    """The emulated chip running a kernel compiled from C: `TemplateExecutable`'s runs, counters and
    modelled time, on the kernel's shared library instead of the LLVM JIT (so its own ``__init__`` sets the
    attributes those read, without a JIT)."""

    def __init__(self, artifact: Artifact, spec: ChipSpec, *, sources: Sequence[str] = ()) -> None:
        from pbsdk.targets.cpu import EntryCall

        self.names = list(artifact.metadata.get("counters", []))
        self.resources = artifact.metadata.get("resources", {})
        self.last_counters = {}
        self.spec = spec
        payload = artifact.payload if isinstance(artifact.payload, str) else artifact.payload.decode()
        path = build_library(payload, [Path(s) for s in sources])
        with _lock:
            if path not in _libraries:
                _libraries[path] = (ctypes.CDLL(str(path), mode=os.RTLD_LOCAL), threading.Lock())
            self.library, self._run_lock = _libraries[path]
        address = ctypes.cast(getattr(self.library, artifact.entry), ctypes.c_void_p).value
        assert address is not None
        self._counters = ((ctypes.c_int64 * MAX_COUNTERS).in_dll(self.library, COUNTERS_GLOBAL)
                          if self.names else None)
        self._fn = EntryCall(artifact, address)
