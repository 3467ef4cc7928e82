"""Loading a deploy artifact and calling its entries from numpy.

Needs numpy, ctypes and the standard library only. The file is memory-mapped once. Host code (targets cpu
and template: a shared library) is copied to an anonymous in-memory file (``memfd_create``) and opened
with ``dlopen``; every weight is a read-only view of the map (nothing is copied; pages are read from the
page cache as the code touches them). Calls are thread-safe: each call in flight gets its own outputs and
workspace. GPU code (target nvgpu) runs through the CUDA driver (`pbsdk.runtime.cuda`).
"""

from __future__ import annotations

import _ctypes
import contextlib
import ctypes
import mmap
import os
import platform
import threading
import weakref
from typing import Any

import numpy as np

from pbsdk.runtime import format as fmt
from pbsdk.runtime.entry import Entry
from pbsdk.runtime.errors import (
    CpuFeatureError,
    FormatError,
    InputError,
    LibraryError,
    TargetMismatchError,
)

#: LLVM's x86 feature names -> the flag Linux lists in /proc/cpuinfo for it (where they differ, or are
#: the same: only features named here are required of the host; the others cannot be checked there).
CPUINFO_FLAGS = {
    "sse": "sse", "sse2": "sse2", "sse3": "pni", "ssse3": "ssse3", "sse4.1": "sse4_1", "sse4.2": "sse4_2",
    "sse4a": "sse4a", "avx": "avx", "avx2": "avx2", "fma": "fma", "f16c": "f16c", "bmi": "bmi1", "bmi2": "bmi2",
    "lzcnt": "abm", "popcnt": "popcnt", "movbe": "movbe", "pclmul": "pclmulqdq", "aes": "aes", "sha": "sha_ni",
    "adx": "adx", "gfni": "gfni", "vaes": "vaes", "vpclmulqdq": "vpclmulqdq",
    "avx512f": "avx512f", "avx512dq": "avx512dq", "avx512cd": "avx512cd", "avx512bw": "avx512bw",
    "avx512vl": "avx512vl", "avx512ifma": "avx512ifma", "avx512vbmi": "avx512vbmi",
    "avx512vbmi2": "avx512_vbmi2", "avx512vnni": "avx512_vnni", "avx512bitalg": "avx512_bitalg",
    "avx512vpopcntdq": "avx512_vpopcntdq", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
    "avxvnni": "avx_vnni", "amx-tile": "amx_tile", "amx-bf16": "amx_bf16", "amx-int8": "amx_int8",
}


def required_flags(features: str) -> tuple[str, ...]:
    """The /proc/cpuinfo flags a host needs to run code generated for LLVM ``features`` ("+avx2,-amx-tile,...")."""
    on = [f.strip()[1:] for f in features.split(",") if f.strip().startswith("+")]
    return tuple(sorted({CPUINFO_FLAGS[f] for f in on if f in CPUINFO_FLAGS}))


def host_cpu_flags() -> frozenset[str] | None:
    """The CPU flags Linux reports (``/proc/cpuinfo``'s ``flags``); None where they cannot be read."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


#: The targets whose code is a host shared library with one ``pbsdk_entry(void **)`` per entry: the cpu
#: target's, and the template's emulation (and every target scaffolded from the template).
HOST_TARGETS = ("cpu", "template")
#: The targets whose code runs on a GPU through the CUDA driver (`pbsdk.runtime.cuda`).
DEVICE_TARGETS = ("nvgpu",)


def check_host(manifest: fmt.Manifest) -> None:
    """Refuse code this host cannot run: a target this runtime does not run, another machine or OS, or
    missing CPU features (GPU code is checked against the device when it is loaded)."""
    if manifest.target in DEVICE_TARGETS:
        return
    if manifest.target not in HOST_TARGETS:
        raise TargetMismatchError(f"the file holds code for target {manifest.target!r}; this runtime runs "
                                  f"{', '.join(map(repr, HOST_TARGETS + DEVICE_TARGETS))} artifacts")
    here = (platform.machine(), platform.system())
    if (manifest.machine, manifest.system) != here:
        raise TargetMismatchError(f"the code was compiled for {manifest.machine} {manifest.system}; this host is "
                                  f"{here[0]} {here[1]}")
    flags = host_cpu_flags()
    if flags is None:
        if manifest.cpu_features:
            raise CpuFeatureError("cannot read this host's CPU features (/proc/cpuinfo) to check the code's "
                                  f"requirements ({', '.join(manifest.cpu_features)})", missing=())
        return
    missing = tuple(f for f in manifest.cpu_features if f not in flags)
    if missing:
        raise CpuFeatureError(f"the code was compiled for CPU features this host lacks: {', '.join(missing)} "
                              f"(spec {manifest.spec_name!r}); re-export for this host", missing=missing)


def _request_amx() -> None:
    """Ask Linux for the AMX tile state (arch_prctl ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(158, 0x1023, 18) != 0:
        raise LibraryError("the code uses AMX tiles and Linux did not grant this process their state")


class _Library:
    """An entry's shared library, dlopened from an in-memory file (``memfd_create``) holding its bytes.

    The file stays open while the library is loaded, and the library is closed (``dlclose``) before the
    file: the loader knows a library by its path, ``/proc/self/fd/N``, so a number reused while an older
    library of that path is still loaded would hand back the older library's code."""

    def __init__(self, data: Any, section: fmt.Section, name: str) -> None:
        self._fd = -1
        self.cdll: ctypes.CDLL | None = None
        blob = memoryview(data)[section.offset:section.offset + section.size]
        try:
            self._fd = os.memfd_create(f"pbsdk-{name}", 0)
        except (AttributeError, OSError):
            import tempfile
            self._fd, tmp = tempfile.mkstemp(suffix=".so")
            os.unlink(tmp)
        os.write(self._fd, blob)
        live = {lib.cdll._handle for lib in list(_LOADED) if lib.cdll is not None}
        try:
            self.cdll = ctypes.CDLL(f"/proc/self/fd/{self._fd}", mode=os.RTLD_LOCAL | os.RTLD_NOW)
        except OSError as exc:
            self.close()
            raise LibraryError(f"the dynamic loader refused entry {name!r}'s code: {exc}") from None
        if self.cdll._handle in live:  # never call another library's code (see the class docstring)
            self.cdll = None
            self.close()
            raise LibraryError(f"the dynamic loader returned an already loaded library for entry {name!r}")
        _LOADED.add(self)

    def close(self) -> None:
        if self.cdll is not None:
            _ctypes.dlclose(self.cdll._handle)  # type: ignore[attr-defined]
            self.cdll = None
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # at interpreter shutdown, modules may already be gone
            self.close()


_LOADED: weakref.WeakSet[_Library] = weakref.WeakSet()


def _aligned_empty(nbytes: int, alignment: int = 64) -> np.ndarray:
    raw = np.empty(nbytes + alignment, np.uint8)
    start = -raw.ctypes.data % alignment
    return raw[start:start + nbytes]


class HostEntry(Entry):
    """An entry whose code is a host shared library (targets cpu and template): called through its
    ``pbsdk_entry(void **args)`` with the inputs', weights' (addresses inside the file's map), outputs' and
    workspace's addresses."""

    def __init__(self, desc: fmt.EntryDesc, library: _Library, weights: np.ndarray, manifest: fmt.Manifest) -> None:
        super().__init__(desc)
        self._library = library  # keeps the code loaded
        try:
            self._fn = getattr(library.cdll, desc.symbol)
        except AttributeError:
            raise LibraryError(f"entry {desc.name!r}: its code has no symbol {desc.symbol!r}") from None
        self._fn.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self._fn.restype = None
        self._weights = weights  # the file's map: keeps the weights mapped while this entry lives
        base = weights.ctypes.data
        self._constants = [base + manifest.sections[c].offset for c in desc.constants]
        self._n = len(self._in) + len(self._constants) + len(self._out) + (1 if desc.workspace else 0)
        self._free: list[np.ndarray] = []
        self._lock = threading.Lock()

    def _run(self, arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
        pointers = [a.ctypes.data for a in arrays] + self._constants + [o.ctypes.data for o in outs]
        workspace = None
        if self.desc.workspace:
            with self._lock:
                workspace = self._free.pop() if self._free else None
            if workspace is None:
                workspace = _aligned_empty(self.desc.workspace)
            pointers.append(workspace.ctypes.data)
        try:
            self._fn((ctypes.c_void_p * self._n)(*pointers))  # ctypes releases the GIL for the call
        finally:
            if workspace is not None:
                with self._lock:
                    self._free.append(workspace)


class Model:
    """A loaded deploy artifact: its `manifest` and its `entries` by name. Calling the model calls its
    only entry (`entry` picks one of several)."""

    def __init__(self, path: str, *, verify: bool = True) -> None:
        self.path = str(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
        layout = fmt.read_header(self._map)
        self.manifest = fmt.read_manifest(self._map, layout)
        # Code is always checked before anything else about it; weights (most of the file) unless verify=False.
        code = {i for e in self.manifest.entries
                for i in ((e.code,) if e.device is None else tuple(s for _, s in e.device.images))}
        fmt.verify_sections(self._map, self.manifest, sorted(code) if not verify else None)
        check_host(self.manifest)
        if self.manifest.amx:
            _request_amx()
        self._bytes = np.frombuffer(self._map, np.uint8)  # a read-only view: the weights' base address
        self.entries = {e.name: self._entry(e) for e in self.manifest.entries}

    def _entry(self, desc: fmt.EntryDesc) -> Entry:
        if self.manifest.target in DEVICE_TARGETS:
            from pbsdk.runtime.cuda import CudaEntry

            if desc.device is None:
                raise FormatError(f"entry {desc.name!r} of an {self.manifest.target} file has no device plan")
            return CudaEntry(desc, self._bytes, self.manifest)
        if desc.device is not None:
            raise FormatError(f"entry {desc.name!r} of a {self.manifest.target} file has a device plan")
        library = _Library(self._map, self.manifest.sections[desc.code], desc.name)
        return HostEntry(desc, library, self._bytes, self.manifest)

    def entry(self, name: str) -> Entry:
        try:
            return self.entries[name]
        except KeyError:
            raise InputError(f"no entry {name!r}; the file has {', '.join(self.entries)}") from None

    def __call__(self, *args: Any) -> Any:
        if len(self.entries) != 1:
            raise InputError(f"the file has {len(self.entries)} entries ({', '.join(self.entries)}); "
                             "call model.entry(name)")
        return next(iter(self.entries.values()))(*args)

    def __repr__(self) -> str:
        return f"<pbsdk.runtime.Model {self.path} ({', '.join(map(repr, self.entries.values()))})>"


def load(path: str | os.PathLike[str], *, verify: bool = True) -> Model:
    """Load a deploy artifact written by ``pbsdk.export`` (or ``pbsdk compile model.onnx -o m.pbsdk``).

    Checks the file (format, version, checksums of the header, manifest, code and — unless
    ``verify=False`` — the weights), that this host can run the code (target, machine, CPU features),
    then maps the weights and loads the code. Every failure is a `pbsdk.runtime.errors.DeployError`."""
    return Model(os.fspath(path), verify=verify)
