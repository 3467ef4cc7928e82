"""The on-disk compilation cache: final `Artifact`s keyed by everything that determines them.

A key is the sha256 of: the input MLIR text, a sha256 digest of each constant operand's bytes (with its
shape and dtype; the bytes are hashed in place, never printed; sha256 because OpenSSL's runs on the
CPU's SHA extensions: ~1 GB/s here against ~0.3 GB/s for blake2b, and the constants are hashed on
several threads), the ChipSpec's canonical JSON, the target's name and class
(qualified name plus a hash of the sources of its top-level package, or its ``Target.fingerprint()``), the parsed options (`Options.cache_key`: every
field, the target's too, without ``cache``), pbsdk's
version and a hash of its own sources (an editable install changes code without changing the version),
the MLIR bindings' version and llvmlite's version. A hit skips the whole MLIR pipeline; only loading the
artifact remains (on the host targets, mapping machine code the JIT stored: see below).

One entry is one file ``<key>.pbsdk-artifact``::

    PBSDKCACHE 3 <sha256 of body> <body length>\\n
    <body> = <JSON: kind, entry, inputs, outputs, metadata, payload type, constants>\\n<payload bytes>

The constants (`Artifact.constants`, frozen weights) are not in the entry: each is one content-addressed
file ``weights/<sha256 of its bytes>`` holding its raw bytes, shared by every entry whose artifact has the
same constant (recompiling a model after editing a target's hooks makes new entries, not new copies of
its weights). The entry's JSON describes each by shape, dtype, size and digest. A compilation's hit keeps
the caller's own constants (the key hashed exactly those bytes), so the stored copy is not even read —
unless a stage rewrote them (`pbsdk.core.target.DERIVED_CONSTANTS`, e.g. weights packed for the cpu
kernels): those are read from the store like the constants of a lookup without them. `CompileCache.get`
without them maps each weight file (copy-on-write) and returns read-only arrays over the mappings,
verified against their digests: no parsing, no copy into the process's memory. An entry whose weight is
gone (evicted by another process between the two reads) is a plain miss.

Writes go to a temporary file in the cache directory, are flushed and ``os.replace``-d into place, so a
reader sees a whole entry or none, and processes compiling the same kernel at once are safe (last writer
wins; the entries are identical). An entry whose header, checksum or body does not parse is reported with
a warning naming the file, deleted and rebuilt.

The host JITs (cpu, template) keep the machine code they generate next to the entries, one file
``<hash of the LLVM IR and the machine>.pbsdk-object`` (sha256 of the contents, then the contents: the
object file, or for a kernel the cpu JIT compiled in parts, all the parts' object files in one
container), so a hit maps code instead of running LLVM's optimiser and back end again
(`CompileCache.get_object`).

The cache is bounded (`DEFAULT_MAX_BYTES`, or ``PBSDK_CACHE_MAX_BYTES``): entries, object files and
weights all count. After a store that takes it over the cap, the least recently *used* entries and
object files are removed until it is under 90% of the cap (so the next stores do not each evict again),
and with them every weight no remaining entry names. Recency is the file's mtime, which a store sets and
every hit refreshes (``os.utime``): atime is not used because it is often off (``noatime``) or lazy
(``relatime``), and a side file of recencies would be one more thing to keep consistent across processes.
Eviction runs under an exclusive ``flock`` of ``<dir>/.lock``; stores hold it shared while they write
(never while they compile), so an evictor never takes a weight a store is about to reference. Readers
take no lock: an entry or weight removed under a reader that has it open or mapped stays readable (the
inode lives on); one removed before it is opened is a clean miss. ``pbsdk cache prune`` evicts the same
way down to the cap (or ``--max-bytes``).

Configuration: ``PBSDK_CACHE_DIR`` (default ``~/.cache/pbsdk``); ``PBSDK_CACHE=0`` or
``PBSDK_DISABLE_CACHE=1`` turn the cache off, as does ``options={"cache": False}`` for one compilation.
``PBSDK_DUMP_DIR`` also bypasses it (a dump needs the stages to run). ``PBSDK_CACHE_MAX_BYTES``: the cap,
in bytes or with a binary suffix (``512M``, ``4G``); a value that does not parse is reported with a
warning naming the variable and the default is used.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import importlib.metadata
import inspect
import json
import mmap
import os
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from pbsdk.core.errors import CacheWarning
from pbsdk.core.runtime.remote import RemoteTier, remote_from_env
from pbsdk.core.target import DERIVED_CONSTANTS, Artifact

if TYPE_CHECKING:
    from pbsdk.core.compiler import CompileRequest

FORMAT_VERSION = 3
_MAGIC = b"PBSDKCACHE"
_SUFFIX = ".pbsdk-artifact"
_OBJECT_SUFFIX = ".pbsdk-object"
_MAX_HEADER = 256


# ------------------------------------------------------------------------------------------------ the key

def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


_fingerprints: dict[str, str] = {}
_fp_lock = threading.Lock()


def _tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        if "__pycache__" in path.parts:
            continue
        try:
            data = path.read_bytes()
        except OSError:
            continue
        h.update(str(path.relative_to(root)).encode() + b"\0" + hashlib.sha256(data).digest())
    return h.hexdigest()


def _source_fingerprint(what: str, compute: Any) -> str:
    """A hash of source code, computed once per process."""
    with _fp_lock:
        if what not in _fingerprints:
            try:
                _fingerprints[what] = compute()
            except Exception:  # noqa: BLE001 - no source available (zipapp, frozen): the versions must do
                _fingerprints[what] = "unknown"
        return _fingerprints[what]


def _pbsdk_fingerprint() -> str:
    import pbsdk

    root = Path(pbsdk.__file__).resolve().parent
    return _source_fingerprint(f"source:{root}", lambda: _tree_hash(root))


def _package_root(module_name: str) -> Path | None:
    """The source of the top-level package of ``module_name``: its directory (a package) or its file (a
    plain module); None without source (a built-in, an interactive session)."""
    top = module_name.partition(".")[0]
    module = sys.modules.get(top)
    file = getattr(module, "__file__", None)
    if file is None:
        return None
    path = Path(file).resolve()
    return path.parent if path.name == "__init__.py" else path


def _source_hash(root: Path) -> str:
    return _tree_hash(root) if root.is_dir() else hashlib.sha256(root.read_bytes()).hexdigest()


def _target_fingerprint(cls: type) -> str:
    """What the key holds of a target's code: ``cls.fingerprint()`` where it gives one, else a hash of
    the sources of the top-level package defining the class and of the one defining its ``hooks`` (a
    plugin's every module: editing its ``hooks.py`` changes the key), each hashed once per process."""
    own = getattr(cls, "fingerprint", None)
    custom = own() if callable(own) else None
    if custom is not None:
        return f"custom:{custom}"
    modules = [cls.__module__, *_hooks_modules(getattr(cls, "hooks", None))]
    parts = []
    for root in dict.fromkeys(r for m in modules if m for r in [_package_root(m)] if r is not None):
        parts.append(_source_fingerprint(f"source:{root}", lambda root=root: _source_hash(root)))
    if not parts:  # no package source found (a class made at run time in __main__): the defining file
        parts.append(_source_fingerprint(f"{cls.__module__}.{cls.__qualname__}", lambda: _class_file_hash(cls)))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _hooks_modules(hooks: Any) -> list[str]:
    """The modules a target's ``hooks`` come from: the module itself, or those defining its public
    callables (a class's or a namespace's functions)."""
    if hooks is None:
        return []
    if inspect.ismodule(hooks):
        return [hooks.__name__]
    found = [getattr(getattr(hooks, name, None), "__module__", None) for name in dir(hooks) if not name.startswith("_")]
    return [m for m in found if isinstance(m, str)]


def _class_file_hash(cls: type) -> str:
    file = inspect.getsourcefile(cls)
    return hashlib.sha256(Path(file).read_bytes()).hexdigest() if file else "unknown"


def raw_bytes(array: np.ndarray) -> memoryview:
    """A C-order array's bytes, in place (through a uint8 view: the buffer protocol knows no bfloat16)."""
    return np.ascontiguousarray(array).reshape(-1).view(np.uint8).data


def constant_digest(array: np.ndarray) -> str:
    """A hex sha256 digest of a C-order array's bytes (read in place, never converted to text)."""
    return hashlib.sha256(raw_bytes(array)).hexdigest()


def constant_digests(constants: tuple[np.ndarray, ...]) -> list[str]:
    """`constant_digest` of each array, on several threads (hashlib releases the GIL on large buffers)."""
    if len(constants) < 2 or sum(c.nbytes for c in constants) < 1 << 24:
        return [constant_digest(c) for c in constants]
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=min(len(constants), os.cpu_count() or 1)) as pool:
        return list(pool.map(constant_digest, constants))


def cache_key(text: str, request: CompileRequest, constants: tuple[np.ndarray, ...] = (), *,
              digests: list[str] | None = None) -> str:
    """The hex sha256 naming the artifact that compiling ``text`` (with the entry's ``constants``) under
    ``request`` produces. ``digests``: the constants' `constant_digests`, where the caller has them."""
    if digests is None:
        digests = constant_digests(constants)
    import pbsdk

    cls = type(request.target)
    parts = {
        "format": FORMAT_VERSION,
        "text": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
        "constants": [[list(c.shape), c.dtype.str, d] for c, d in zip(constants, digests)],
        "spec": request.spec.model_dump_json(),
        "target": request.target.name,
        "target_class": f"{cls.__module__}.{cls.__qualname__}",
        "target_source": _target_fingerprint(cls),
        "options": request.options.cache_key(),
        "pbsdk": getattr(pbsdk, "__version__", "?"),
        "pbsdk_source": _pbsdk_fingerprint(),
        "mlir": _version("xtc-mlir-python-bindings"),
        "llvmlite": _version("llvmlite"),
        "python": f"{sys.version_info[0]}.{sys.version_info[1]}",
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


# --------------------------------------------------------------------------------------------- the format

class _Corrupt(Exception):
    pass


class _BadWeight(_Corrupt):
    """A stored weight is not its digest's bytes: it is removed along with the entry that read it."""

    def __init__(self, digest: str, why: str) -> None:
        super().__init__(f"weight {digest}: {why}")
        self.digest = digest


class _Missing(Exception):
    """A weight an entry names is not in the store (evicted under the reader): a plain miss."""


def _tupled(sig: Any) -> tuple[tuple[tuple[Any, ...], str], ...]:
    return tuple((tuple(d if isinstance(d, str) else int(d) for d in shape), str(dtype)) for shape, dtype in sig)


def encode(artifact: Artifact) -> bytes | None:
    """The entry's bytes (its constants described, not included), or None if the artifact cannot be
    stored (metadata that JSON cannot hold)."""
    pieces = encode_pieces(artifact)
    return None if pieces is None else b"".join(pieces)


def encode_pieces(artifact: Artifact, digests: list[str] | None = None) -> list[bytes | memoryview] | None:
    """The entry's bytes as pieces to write in order, or None if the artifact cannot be stored. The
    constants are described by shape, dtype, size and digest; their bytes go to the weight store.
    ``digests``: the constants' `constant_digests`, if known."""
    payload = artifact.payload
    is_bytes = isinstance(payload, (bytes, bytearray))
    data = payload if isinstance(payload, bytes) else payload.encode("utf-8", "surrogatepass")
    arrays = [np.ascontiguousarray(c) for c in artifact.constants]
    if digests is None or len(digests) != len(arrays):
        digests = constant_digests(tuple(arrays))
    try:
        meta = {
            "kind": artifact.kind, "entry": artifact.entry,
            "inputs": [[list(s), d] for s, d in artifact.inputs],
            "outputs": [[list(s), d] for s, d in artifact.outputs],
            "metadata": dict(artifact.metadata), "payload": "bytes" if is_bytes else "str",
            "constants": [{"shape": list(a.shape), "dtype": a.dtype.str, "size": a.nbytes, "sha256": d}
                          for a, d in zip(arrays, digests)],
        }
        text = json.dumps(meta, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError):
        return None
    body = text + b"\n" + bytes(data)
    header = b"%s %d %s %d\n" % (_MAGIC, FORMAT_VERSION, hashlib.sha256(body).hexdigest().encode(), len(body))
    return [header, body]


def decode(blob: bytes | mmap.mmap, constants: tuple[np.ndarray, ...] | None = None,
           weight: Callable[[str, int], bytes | mmap.mmap] | None = None) -> Artifact:
    """The artifact in an entry's bytes. Its constants: ``constants`` when the caller has them (the key
    it looked up hashes their bytes, so the stored ones are equal: they are neither read nor checked),
    else read-only arrays over the bytes ``weight(digest, size)`` gives, checked against their digests."""
    end = blob.find(b"\n", 0, _MAX_HEADER)
    if end < 0:
        raise _Corrupt("no header")
    fields = blob[:end].split(b" ")
    if len(fields) != 4 or fields[0] != _MAGIC:
        raise _Corrupt("bad header")
    try:
        version, digest, length = int(fields[1]), fields[2].decode("ascii"), int(fields[3])
    except (ValueError, UnicodeDecodeError):
        raise _Corrupt("bad header") from None
    if version != FORMAT_VERSION:
        raise _Corrupt(f"format version {version}, expected {FORMAT_VERSION}")
    body = blob[end + 1:end + 1 + length]
    if len(body) != length:
        raise _Corrupt(f"truncated: body is {len(body)} bytes, header says {length}")
    if hashlib.sha256(body).hexdigest() != digest:
        raise _Corrupt("checksum mismatch")
    split = body.find(b"\n")
    try:
        meta = json.loads(body[:split])
        data = body[split + 1:]
        payload: str | bytes = data if meta["payload"] == "bytes" else data.decode("utf-8", "surrogatepass")
        described = meta["constants"]
        if constants is not None and not meta["metadata"].get(DERIVED_CONSTANTS):
            if [(tuple(d["shape"]), np.dtype(d["dtype"])) for d in described] != [(c.shape, c.dtype)
                                                                                 for c in constants]:
                raise _Corrupt("the stored constants' shapes or dtypes differ from the ones looked up")
        else:
            loaded = []
            for d in described:
                if weight is None:
                    raise _Corrupt("the entry's constants are stored apart and no weight store was given")
                size = int(d["size"])
                raw = weight(str(d["sha256"]), size)
                if len(raw) != size:
                    raise _BadWeight(str(d["sha256"]), f"{len(raw)} bytes, the entry says {size}")
                array = np.frombuffer(raw, dtype=np.dtype(d["dtype"])).reshape(d["shape"])
                if constant_digest(array) != d["sha256"]:
                    raise _BadWeight(str(d["sha256"]), "a constant fails its checksum")
                array.flags.writeable = False
                loaded.append(array)
            constants = tuple(loaded)
        return Artifact(kind=str(meta["kind"]), payload=payload, entry=str(meta["entry"]),
                        inputs=_tupled(meta["inputs"]), outputs=_tupled(meta["outputs"]),
                        metadata=dict(meta["metadata"]), constants=constants)
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise _Corrupt(f"unparseable body: {exc}") from None


def _referenced(path: Path) -> list[str]:
    """The weight digests an entry names, read from its JSON line without checking the checksum (what
    eviction needs; an entry that does not parse names none, and will fail its own read)."""
    try:
        with open(path, "rb") as f:
            f.readline()
            meta = json.loads(f.readline())
        return [str(d["sha256"]) for d in meta["constants"]]
    except (OSError, ValueError, KeyError, TypeError):
        return []


# --------------------------------------------------------------------------------------------- the bound

#: The default cap: a few GiB holds hundreds of compiled models with their weights (an afternoon's work
#: filled 1.8 GB unbounded, most of it stale), and is small against any disk that builds LLVM.
DEFAULT_MAX_BYTES = 4 << 30
#: Eviction after a store goes down to this fraction of the cap, so the next stores do not each evict.
EVICT_TO = 0.9
_UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


def parse_size(text: str) -> int:
    """A positive byte count: an integer, optionally with a binary suffix (``512M``, ``4G``, ``4GiB``)."""
    t = text.strip().lower().removesuffix("ib").removesuffix("b")
    unit = t[-1:] if t[-1:] in _UNITS and t[-1:] else ""
    number = t[:-1] if unit else t
    value = int(number) * _UNITS[unit]  # ValueError when it is not an integer
    if value <= 0:
        raise ValueError(f"must be positive, got {text!r}")
    return value


_reported: set[str] = set()


def max_bytes_from_env() -> int:
    """``PBSDK_CACHE_MAX_BYTES`` or `DEFAULT_MAX_BYTES`; a value that does not parse is reported once
    (a `CacheWarning` naming the variable) and the default used: a compilation never fails on it."""
    raw = os.environ.get("PBSDK_CACHE_MAX_BYTES")
    if raw is None or not raw.strip():
        return DEFAULT_MAX_BYTES
    try:
        return parse_size(raw)
    except ValueError:
        if raw not in _reported:
            _reported.add(raw)
            warnings.warn(f"pbsdk cache: PBSDK_CACHE_MAX_BYTES={raw!r} is not a positive byte count (e.g. "
                          f"1073741824, 512M, 4G); using the default {DEFAULT_MAX_BYTES} bytes",
                          CacheWarning, stacklevel=3)
        return DEFAULT_MAX_BYTES


@dataclasses.dataclass
class _File:
    path: Path
    size: int
    mtime: int
    refs: list[str]


# -------------------------------------------------------------------------------------------- the cache

@dataclasses.dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    stores: int = 0
    corrupt: int = 0
    evicted: int = 0
    remote_hits: int = 0


class CompileCache:
    """A directory of artifacts, bounded to ``max_bytes`` (None: ``PBSDK_CACHE_MAX_BYTES`` or
    `DEFAULT_MAX_BYTES`, read at each store). Every method is safe to call from several threads and
    processes."""

    def __init__(self, directory: str | os.PathLike[str], *, max_bytes: int | None = None,
                 remote: RemoteTier | None = None) -> None:
        self.dir = Path(directory).expanduser()
        self.weights = self.dir / "weights"
        self._max_bytes = max_bytes
        self.remote = remote
        self.stats = CacheStats()

    def __repr__(self) -> str:
        return f"CompileCache({str(self.dir)!r})"

    @property
    def max_bytes(self) -> int:
        return self._max_bytes if self._max_bytes is not None else max_bytes_from_env()

    def path(self, key: str) -> Path:
        if not key or any(c not in "0123456789abcdef" for c in key):
            raise ValueError(f"not a cache key: {key!r}")
        return self.dir / f"{key}{_SUFFIX}"

    def get(self, key: str, constants: tuple[np.ndarray, ...] | None = None) -> Artifact | None:
        """The artifact stored under ``key``, or None. ``constants``: the ones whose digests the key was
        made from (`cache_key`), returned in the artifact instead of reading the stored copies."""
        path = self.path(key)
        try:
            blob = _map(path)
            artifact = decode(blob, constants, self._weight)
        except (FileNotFoundError, NotADirectoryError):
            return self._remote_get(key, constants)
        except _Missing:
            self.stats.misses += 1
            return None
        except OSError as exc:
            warnings.warn(f"pbsdk cache: cannot read {path}: {exc}", CacheWarning, stacklevel=2)
            self.stats.misses += 1
            return None
        except _Corrupt as exc:
            self.stats.corrupt += 1
            self.stats.misses += 1
            warnings.warn(f"pbsdk cache: corrupt entry {path} ({exc}); removed, it will be rebuilt",
                          CacheWarning, stacklevel=2)
            _unlink(path)
            if isinstance(exc, _BadWeight):  # it would fail every entry that names it
                _unlink(self.weights / exc.digest)
            return None
        self.stats.hits += 1
        _touch(path)
        return artifact

    def _remote_get(self, key: str, constants: tuple[np.ndarray, ...] | None) -> Artifact | None:
        """A local miss looked up in the remote tier: its entry checked as a local one and stored here.
        Its constants: the caller's ``constants`` (those never travel), or, where the compiler made them
        (packed weights, `DERIVED_CONSTANTS`), the local weight store's, else the remote's by digest."""
        blob = self.remote.get(f"entry:{key}") if self.remote is not None else None
        if blob is None:
            self.stats.misses += 1
            return None
        try:
            artifact = decode(blob, constants, self._weight)
        except _Missing:
            self.stats.misses += 1
            return None
        except _Corrupt as exc:
            self.stats.corrupt += 1
            self.stats.misses += 1
            assert self.remote is not None
            self.remote.delete(f"entry:{key}")
            if isinstance(exc, _BadWeight):  # fetched from there and stored here before it was checked
                self.remote.delete(f"weight:{exc.digest}")
                _unlink(self.weights / exc.digest)
            self.remote.failed(f"returned a damaged entry ({exc}); removed there")
            return None
        self.stats.hits += 1
        self.stats.remote_hits += 1
        with contextlib.suppress(OSError):
            self.dir.mkdir(parents=True, exist_ok=True)
            with self._lock(exclusive=False):
                self._write(key, self.path(key), [blob])
            self._bound()
        return artifact

    def _weight(self, digest: str, size: int) -> bytes | mmap.mmap:
        """The stored bytes of the weight ``digest``, mapped; `_Missing` when it is not stored."""
        if not digest or any(c not in "0123456789abcdef" for c in digest):
            raise _Corrupt(f"not a weight digest: {digest!r}")
        path = self.weights / digest
        try:
            return _map(path)
        except (FileNotFoundError, NotADirectoryError):
            pass
        data = self.remote.get(f"weight:{digest}") if self.remote is not None else None
        if data is None or len(data) != size:
            raise _Missing(digest) from None
        with contextlib.suppress(OSError):  # checked against its digest by the reader (`decode`)
            self.weights.mkdir(parents=True, exist_ok=True)
            self._write(digest, path, [data])
        return data

    def put(self, key: str, artifact: Artifact, digests: list[str] | None = None) -> bool:
        """Store ``artifact`` atomically: its constants into the weight store (each once per content), then
        the entry; then evict down from the cap if the store went over it. Returns False (and stores
        nothing) when it cannot be stored. ``digests``: its constants' `constant_digests`, if known."""
        path = self.path(key)
        arrays = [np.ascontiguousarray(c) for c in artifact.constants]
        if digests is None or len(digests) != len(arrays):
            digests = constant_digests(tuple(arrays))
        blob = encode_pieces(artifact, digests)
        if blob is None:
            return False
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if arrays:
                self.weights.mkdir(exist_ok=True)
        except OSError as exc:
            warnings.warn(f"pbsdk cache: cannot write {path}: {exc}", CacheWarning, stacklevel=2)
            return False
        with self._lock(exclusive=False):  # an evictor waits until the entry names its weights
            for array, digest in zip(arrays, digests):
                stored = self.weights / digest
                try:
                    if stored.stat().st_size == array.nbytes:
                        continue
                except OSError:
                    pass
                if not self._write(digest, stored, [raw_bytes(array)]):
                    return False
            if not self._write(key, path, blob):
                return False
        self.stats.stores += 1
        if self.remote is not None:
            if artifact.metadata.get(DERIVED_CONSTANTS):  # made by the compiler (packed weights), not the caller's
                for array, digest in zip(arrays, digests):
                    self.remote.put(f"weight:{digest}", bytes(raw_bytes(array)))
            self.remote.put(f"entry:{key}", b"".join(blob))
        self._bound()
        return True

    def get_object(self, key: str) -> bytes | None:
        """The machine code a host JIT stored under ``key`` (`put_object`), or None. A file whose checksum
        fails is removed (and reported like a corrupt entry)."""
        path = self.path(key).with_suffix(_OBJECT_SUFFIX)
        try:
            data = path.read_bytes()
        except OSError:
            return self._remote_object(key, path)
        digest, obj = data[:32], data[32:]
        if hashlib.sha256(obj).digest() != digest:
            warnings.warn(f"pbsdk cache: corrupt object file {path}; removed, it will be rebuilt", CacheWarning,
                          stacklevel=2)
            _unlink(path)
            return None
        _touch(path)
        return obj

    def _remote_object(self, key: str, path: Path) -> bytes | None:
        """A local miss of an object file looked up in the remote tier (checked, then stored here)."""
        data = self.remote.get(f"object:{key}") if self.remote is not None else None
        if data is None:
            return None
        digest, obj = data[:32], data[32:]
        if hashlib.sha256(obj).digest() != digest:
            assert self.remote is not None
            self.remote.delete(f"object:{key}")
            self.remote.failed("returned a damaged object file; removed there")
            return None
        self.stats.remote_hits += 1
        with contextlib.suppress(OSError):
            self.dir.mkdir(parents=True, exist_ok=True)
            with self._lock(exclusive=False):
                self._write(key, path, [data])
        return obj

    def put_object(self, key: str, obj: bytes) -> bool:
        """Store a host JIT's object file under ``key`` (a hash of its LLVM IR and machine), atomically."""
        path = self.path(key).with_suffix(_OBJECT_SUFFIX)
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            warnings.warn(f"pbsdk cache: cannot write {path}: {exc}", CacheWarning, stacklevel=2)
            return False
        with self._lock(exclusive=False):
            if not self._write(key, path, [hashlib.sha256(obj).digest(), obj]):
                return False
        if self.remote is not None:
            self.remote.put(f"object:{key}", hashlib.sha256(obj).digest() + obj)
        self._bound()
        return True

    def _write(self, key: str, path: Path, blob: list[bytes | memoryview]) -> bool:
        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=self.dir)
            with os.fdopen(fd, "wb") as f:
                for piece in blob:
                    f.write(piece)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
            tmp = None
        except OSError as exc:
            warnings.warn(f"pbsdk cache: cannot write {path}: {exc}", CacheWarning, stacklevel=3)
            return False
        finally:
            if tmp is not None:
                _unlink(Path(tmp))
        return True

    @contextlib.contextmanager
    def _lock(self, *, exclusive: bool) -> Iterator[None]:
        """``flock`` of ``<dir>/.lock``: shared by stores while they write, exclusive for eviction. Where
        the lock file cannot be made (a read-only directory) nothing is written or evicted anyway."""
        try:
            fd = os.open(self.dir / ".lock", os.O_RDWR | os.O_CREAT, 0o666)
        except OSError:
            yield
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
            yield
        finally:
            os.close(fd)  # releases the lock

    def _scan(self, *, refs: bool = True) -> tuple[list[_File], dict[str, int]]:
        """The entries and object files (with the weights each entry names, where ``refs``), and the
        stored weights' sizes by digest."""
        files: list[_File] = []
        weights: dict[str, int] = {}
        for directory, into_weights in ((self.dir, False), (self.weights, True)):
            try:
                listing = list(os.scandir(directory))
            except OSError:
                continue
            for e in listing:
                is_entry = e.name.endswith(_SUFFIX)
                if not into_weights and not (is_entry or e.name.endswith(_OBJECT_SUFFIX)):
                    continue
                try:
                    st = e.stat(follow_symlinks=False)
                except OSError:
                    continue  # removed meanwhile
                if into_weights:
                    if not e.name.startswith("."):
                        weights[e.name] = st.st_size
                else:
                    path = Path(e.path)
                    files.append(_File(path, st.st_size, st.st_mtime_ns, _referenced(path) if is_entry and refs else []))
        return files, weights

    def usage(self) -> int:
        """The bytes the cache holds: entries, object files and weights."""
        files, weights = self._scan(refs=False)
        return sum(f.size for f in files) + sum(weights.values())

    def _bound(self) -> None:
        """After a store: evict down to `EVICT_TO` of the cap if the cache is over it."""
        cap = self.max_bytes
        try:
            if self.usage() > cap:
                self.prune(int(cap * EVICT_TO))
        except OSError as exc:  # never fail a compilation over the cache's upkeep
            warnings.warn(f"pbsdk cache: cannot evict from {self.dir}: {exc}", CacheWarning, stacklevel=3)

    def prune(self, max_bytes: int | None = None) -> tuple[int, int]:
        """Remove the least recently used entries and object files (a store or a hit makes one recent), and
        the weights no remaining entry names, until the cache holds at most ``max_bytes`` (default: the
        cap). Returns (entries and object files removed, bytes freed). Unreferenced weights go first."""
        limit = self.max_bytes if max_bytes is None else max_bytes
        removed = freed = 0
        if not self.dir.is_dir():
            return 0, 0
        with self._lock(exclusive=True):
            files, weights = self._scan()
            refs: dict[str, int] = {}
            for f in files:
                for d in set(f.refs):
                    refs[d] = refs.get(d, 0) + 1
            total = sum(f.size for f in files) + sum(weights.values())

            def drop_weight(digest: str) -> None:
                nonlocal total, freed
                if _unlink(self.weights / digest):
                    freed += weights[digest]
                total -= weights.pop(digest)

            for digest in [d for d in weights if refs.get(d, 0) == 0]:  # no store is in flight: orphans
                drop_weight(digest)
            for f in sorted(files, key=lambda f: (f.mtime, f.path.name)):
                if total <= limit:
                    break
                total -= f.size
                if _unlink(f.path):
                    removed += 1
                    freed += f.size
                for d in set(f.refs):
                    refs[d] -= 1
                    if refs[d] == 0 and d in weights:
                        drop_weight(d)
        self.stats.evicted += removed
        return removed, freed

    def _entries(self) -> list[Path]:
        try:
            return [p for p in self.dir.iterdir() if p.name.endswith(_SUFFIX)]
        except OSError:
            return []

    def _objects(self) -> list[Path]:
        try:
            return [p for p in self.dir.iterdir() if p.name.endswith(_OBJECT_SUFFIX)]
        except OSError:
            return []

    def info(self) -> dict[str, Any]:
        files, weights = self._scan(refs=False)
        entries = sum(f.path.name.endswith(_SUFFIX) for f in files)
        return {"dir": str(self.dir), "entries": entries, "objects": len(files) - entries,
                "weights": len(weights), "weight_bytes": sum(weights.values()),
                "bytes": sum(f.size for f in files) + sum(weights.values()), "max_bytes": self.max_bytes}

    def clear(self) -> int:
        """Remove every entry, object file, weight and stale temporary file; returns the number of entries
        removed."""
        if not self.dir.is_dir():
            return 0
        with self._lock(exclusive=True):
            removed = sum(_unlink(p) for p in self._entries())
            for p in self._objects():
                _unlink(p)
            for directory in (self.dir, self.weights):
                try:
                    stale = list(directory.glob(".*.tmp"))
                except OSError:
                    stale = []
                for p in stale:
                    _unlink(p)
            try:
                for p in self.weights.iterdir():
                    _unlink(p)
            except OSError:
                pass
        return removed


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
        return True
    except OSError:
        return False


def _touch(path: Path) -> None:
    """Make a hit entry the most recently used (its mtime: see the module's docstring)."""
    try:
        os.utime(path)
    except OSError:  # evicted meanwhile, or a read-only cache: the hit stands
        pass


def _map(path: Path) -> mmap.mmap | bytes:
    """The file's bytes, mapped copy-on-write (its constants are then read straight from the page cache;
    nothing is ever written back); an empty file as ``b""``."""
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            return b""
        return mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY)


def _off(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("0", "false", "no", "off")


def _on(value: str | None) -> bool:
    return value is not None and value.strip().lower() in ("1", "true", "yes", "on")


def cache_dir() -> Path:
    return Path(os.environ.get("PBSDK_CACHE_DIR") or Path("~/.cache/pbsdk")).expanduser()


_caches: dict[tuple[Path, str], CompileCache] = {}
_caches_lock = threading.Lock()


def get_cache() -> CompileCache | None:
    """The cache configured by the environment (``PBSDK_CACHE_DIR``, and ``PBSDK_CACHE_URL``'s remote tier
    behind it: `pbsdk.core.runtime.remote`), or None when it is disabled."""
    if _off(os.environ.get("PBSDK_CACHE")) or _on(os.environ.get("PBSDK_DISABLE_CACHE")):
        return None
    directory = cache_dir()
    url = os.environ.get("PBSDK_CACHE_URL", "").strip()
    with _caches_lock:
        cache = _caches.get((directory, url))
        if cache is None:
            remote = remote_from_env(f"pbsdk:cache{FORMAT_VERSION}") if url else None
            cache = _caches[(directory, url)] = CompileCache(directory, remote=remote)
        return cache


def cache_for(request: CompileRequest) -> CompileCache | None:
    """The cache to use for ``request``: None if disabled by the environment, by ``options["cache"]``
    being false, or because ``PBSDK_DUMP_DIR`` asks for every stage's output."""
    return get_cache() if caching(request.options) else None


def caching(options: Any) -> bool:
    """Whether a compilation with ``options`` may use the cache (``options.cache``, no ``PBSDK_DUMP_DIR``);
    the environment may still disable it (`get_cache`)."""
    return bool(options.cache) and not os.environ.get("PBSDK_DUMP_DIR")
