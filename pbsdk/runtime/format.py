"""The deploy artifact's file format (``.pbsdk``), written by `pbsdk.deploy` and read by the runtimes.

Layout (little-endian)::

    header      128 bytes: magic, format version, file size, where the manifest and the index are,
                their CRC-32s, and the header's own CRC-32 (of its first 64 bytes)
    sections    the payloads, each starting at a 64-byte boundary: per entry its code (a shared
                library; for nvgpu its cubin and PTX) and its weights (raw C-order arrays, mapped by the
                loader, never copied)
    manifest    JSON: format version, target, platform, spec (name and hash), CPU features the code
                needs, compiler versions, entries with their inputs/outputs (shape, dtype), constants
                and workspace (nvgpu: and a launch plan, `DevicePlan`), and every section's offset, size
                and CRC-32
    index       the same facts as whitespace-separated lines, for the C runtime (no JSON parser there)

A reader checks, in order: the magic, the version, the header's CRC, the file's size, the manifest's
and index's CRCs, that every section lies inside the file, then (unless told not to) every section's
CRC. Each failure is a typed error of `pbsdk.runtime.errors`. Only numpy-free stdlib is used here.
"""

from __future__ import annotations

import dataclasses
import json
import struct
import zlib
from collections.abc import Iterable, Mapping, Sequence
from typing import IO, Any

from pbsdk.runtime.errors import ChecksumError, FormatError, TruncatedError, VersionError

MAGIC = b"PBSDKDPL"
FORMAT_VERSION = 1
HEADER_SIZE = 128
#: Sections (weights above all) start at this alignment in the file, so a mapped weight is aligned too.
ALIGNMENT = 64
_HEADER = struct.Struct("<8sIIQQQIQQI")  # magic, version, flags, file size, manifest off/len/crc, index off/len/crc
_HEADER_CRC = struct.Struct("<I")  # at offset _HEADER.size: CRC-32 of the bytes before it


def crc32(data: Any, value: int = 0) -> int:
    """CRC-32 (zlib's, the C runtime's ``pbsdk_crc32``) of a bytes-like object."""
    return zlib.crc32(data, value) & 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class TensorDesc:
    """An input or output of an entry: its name, static shape and numpy dtype name.

    ``given``, when set (inputs only), is the dtype callers pass while the code takes ``dtype``: integers the
    model computes with as floats (token ids as float64: exact below 2**53), which the runtime converts."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    given: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                **({"given": self.given} if self.given else {})}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> TensorDesc:
        return TensorDesc(str(d["name"]), tuple(int(x) for x in d["shape"]), str(d["dtype"]), str(d.get("given", "")))

    def index_line(self, kind: str) -> str:
        return f"{kind} {self.dtype} {self.given or '-'} {len(self.shape)} {' '.join(map(str, self.shape))}".rstrip()


@dataclasses.dataclass(frozen=True)
class Section:
    """A payload of the file: its name, where it is, how long, and its CRC-32."""

    name: str
    offset: int
    size: int
    crc32: int


@dataclasses.dataclass(frozen=True)
class DeviceBuffer:
    """A device buffer a GPU entry's kernels use. ``role``: ``"arg"`` (the entry's inputs then outputs, in
    order: the first buffers), ``"weight"`` (uploaded once at load from section ``section``) or ``"temp"``
    (allocated once per loaded entry)."""

    shape: tuple[int, ...]
    dtype: str
    role: str
    section: int = -1

    def to_json(self) -> dict[str, Any]:
        return {"shape": list(self.shape), "dtype": self.dtype, "role": self.role,
                **({"section": self.section} if self.role == "weight" else {})}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DeviceBuffer:
        role = str(d["role"])
        if role not in ("arg", "weight", "temp"):
            raise ValueError(f"device buffer role {role!r}")
        return DeviceBuffer(tuple(int(x) for x in d["shape"]), str(d["dtype"]), role, int(d.get("section", -1)))


@dataclasses.dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch of a GPU entry, in order: the kernel's name in the module, grid and block sizes,
    dynamic shared memory, and its arguments: each a bare device pointer, ``(buffer index, byte offset)``."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    args: tuple[tuple[int, int], ...]

    def to_json(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "grid": list(self.grid), "block": list(self.block),
                "shared_bytes": self.shared_bytes, "args": [list(a) for a in self.args]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> KernelLaunch:
        grid, block = (tuple(int(x) for x in d[k]) for k in ("grid", "block"))
        if len(grid) != 3 or len(block) != 3:
            raise ValueError("grid and block have three sizes")
        return KernelLaunch(str(d["kernel"]), grid, block, int(d["shared_bytes"]),  # type: ignore[arg-type]
                            tuple((int(b), int(o)) for b, o in d["args"]))


@dataclasses.dataclass(frozen=True)
class DevicePlan:
    """How a GPU entry runs (target nvgpu): the module images (``("cubin", section)`` for ``arch`` exactly,
    ``("ptx", section)`` JIT-compiled by the driver for ``arch`` or newer), its buffers and its launches."""

    arch: str
    images: tuple[tuple[str, int], ...]
    buffers: tuple[DeviceBuffer, ...]
    launches: tuple[KernelLaunch, ...]

    def sections(self) -> tuple[int, ...]:
        """Every section the plan refers to: images, then weights."""
        return tuple(i for _, i in self.images) + tuple(b.section for b in self.buffers if b.role == "weight")

    def to_json(self) -> dict[str, Any]:
        return {"arch": self.arch, "images": [list(i) for i in self.images],
                "buffers": [b.to_json() for b in self.buffers], "launches": [k.to_json() for k in self.launches]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> DevicePlan:
        plan = DevicePlan(str(d["arch"]), tuple((str(k), int(i)) for k, i in d["images"]),
                          tuple(DeviceBuffer.from_json(b) for b in d["buffers"]),
                          tuple(KernelLaunch.from_json(k) for k in d["launches"]))
        if not plan.images or any(k not in ("cubin", "ptx") for k, _ in plan.images):
            raise ValueError(f"device images {plan.images}")
        for k in plan.launches:
            if any(not 0 <= b < len(plan.buffers) or o < 0 for b, o in k.args):
                raise ValueError(f"launch {k.kernel} uses a buffer the plan lacks")
        return plan


@dataclasses.dataclass(frozen=True)
class EntryDesc:
    """A callable entry point: its code section (a shared library exporting ``symbol``, which takes one
    ``void **``: the inputs' addresses, then the constants', then the outputs', then the workspace's when
    ``workspace`` > 0), its inputs, its constants (section indices) and its outputs. A GPU entry (target
    nvgpu) has a ``device`` plan instead of a library: ``code`` is its first image, ``constants`` its
    weights, and ``symbol`` the entry's name."""

    name: str
    symbol: str
    code: int
    inputs: tuple[TensorDesc, ...]
    constants: tuple[int, ...]
    outputs: tuple[TensorDesc, ...]
    workspace: int = 0
    device: DevicePlan | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "symbol": self.symbol, "code": self.code,
                "inputs": [t.to_json() for t in self.inputs], "constants": list(self.constants),
                "outputs": [t.to_json() for t in self.outputs], "workspace": self.workspace,
                **({"device": self.device.to_json()} if self.device is not None else {})}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> EntryDesc:
        return EntryDesc(str(d["name"]), str(d["symbol"]), int(d["code"]),
                         tuple(TensorDesc.from_json(t) for t in d["inputs"]),
                         tuple(int(c) for c in d["constants"]),
                         tuple(TensorDesc.from_json(t) for t in d["outputs"]), int(d.get("workspace", 0)),
                         DevicePlan.from_json(d["device"]) if "device" in d else None)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """What a file holds and what running it needs (see the module docstring)."""

    target: str
    machine: str
    system: str
    spec_name: str
    spec_hash: str
    cpu_features: tuple[str, ...]
    entries: tuple[EntryDesc, ...]
    sections: tuple[Section, ...] = ()
    compiler: Mapping[str, str] = dataclasses.field(default_factory=dict)
    amx: bool = False
    format: int = FORMAT_VERSION
    #: The compiling target's own name where it is not ``target`` but runs like it (a target scaffolded from
    #: the template by ``pbsdk new-target``: ``target`` is "template", this its name); "" otherwise.
    target_name: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"format": self.format, "target": self.target,
                **({"target_name": self.target_name} if self.target_name else {}),
                "machine": self.machine, "system": self.system,
                "spec": {"name": self.spec_name, "hash": self.spec_hash},
                "cpu_features": list(self.cpu_features), "amx": self.amx, "compiler": dict(self.compiler),
                "entries": [e.to_json() for e in self.entries],
                "sections": [{"name": s.name, "offset": s.offset, "size": s.size, "crc32": s.crc32}
                             for s in self.sections]}

    @staticmethod
    def from_json(d: Mapping[str, Any]) -> Manifest:
        try:
            return Manifest(
                target=str(d["target"]), machine=str(d["machine"]), system=str(d["system"]),
                spec_name=str(d["spec"]["name"]), spec_hash=str(d["spec"]["hash"]),
                cpu_features=tuple(str(f) for f in d["cpu_features"]),
                entries=tuple(EntryDesc.from_json(e) for e in d["entries"]),
                sections=tuple(Section(str(s["name"]), int(s["offset"]), int(s["size"]), int(s["crc32"]))
                               for s in d["sections"]),
                compiler={str(k): str(v) for k, v in dict(d.get("compiler", {})).items()},
                amx=bool(d.get("amx", False)), format=int(d["format"]), target_name=str(d.get("target_name", "")))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise FormatError(f"the manifest is malformed: {type(exc).__name__}: {exc}") from None

    def index_text(self) -> str:
        """The manifest as the C runtime reads it: one record per line, fields separated by spaces."""
        lines = [f"pbsdk-index {self.format}", f"target {self.target}", f"machine {self.machine}",
                 f"amx {int(self.amx)}", f"features {len(self.cpu_features)} {' '.join(self.cpu_features)}".rstrip(),
                 f"sections {len(self.sections)}"]
        lines += [f"s {s.offset} {s.size} {s.crc32}" for s in self.sections]
        lines.append(f"entries {len(self.entries)}")
        for e in self.entries:
            lines.append(f"e {e.name} {e.symbol} {e.code} {len(e.inputs)} {len(e.constants)} {len(e.outputs)} "
                         f"{e.workspace}")
            lines += [t.index_line("i") for t in e.inputs]
            lines += [f"c {c}" for c in e.constants]
            lines += [t.index_line("o") for t in e.outputs]
        return "\n".join(lines) + "\nend\n"


def _pad(f: IO[bytes], pos: int) -> int:
    gap = -pos % ALIGNMENT
    f.write(b"\0" * gap)
    return pos + gap


def write(path: str, manifest: Manifest, payloads: Sequence[tuple[str, Iterable[Any]]]) -> Manifest:
    """Write the file: ``payloads`` are (section name, chunks of bytes-like objects) in section order
    (the manifest's entries refer to them by index). Returns the manifest with its sections filled in."""
    sections = []
    with open(path, "wb") as f:
        f.write(b"\0" * HEADER_SIZE)
        pos = HEADER_SIZE
        for name, chunks in payloads:
            start, crc = pos, 0
            for chunk in chunks:
                view = memoryview(chunk).cast("B")
                f.write(view)
                crc = crc32(view, crc)
                pos += len(view)
            sections.append(Section(name, start, pos - start, crc))
            pos = _pad(f, pos)
        done = dataclasses.replace(manifest, sections=tuple(sections))
        meta = json.dumps(done.to_json(), indent=1).encode()
        index = done.index_text().encode()
        meta_off, pos = pos, pos + f.write(meta)
        pos = _pad(f, pos)
        index_off, pos = pos, pos + f.write(index)
        f.seek(0)
        f.write(header(pos, meta_off, meta, index_off, index))
    return done


def header(size: int, meta_off: int, meta: bytes, index_off: int, index: bytes, *,
           version: int = FORMAT_VERSION) -> bytes:
    """The 128-byte header of a file of ``size`` bytes whose manifest and index are at those offsets."""
    head = _HEADER.pack(MAGIC, version, 0, size, meta_off, len(meta), crc32(meta), index_off, len(index),
                        crc32(index))
    head += _HEADER_CRC.pack(crc32(head))
    return head + b"\0" * (HEADER_SIZE - len(head))


@dataclasses.dataclass(frozen=True)
class Layout:
    """A header's fields, checked."""

    version: int
    size: int
    manifest: tuple[int, int, int]  # offset, length, crc
    index: tuple[int, int, int]


def read_header(data: Any) -> Layout:
    """Parse and check the header of ``data`` (the whole file, e.g. a memory map)."""
    n = len(data)
    if n < 12:
        raise TruncatedError(f"the file is {n} bytes long: too short to be a pbsdk deploy artifact")
    magic, version = bytes(data[:8]), struct.unpack("<I", data[8:12])[0]
    if magic == b"PBSDK-AR":
        raise FormatError("this is an nvgpu kernel bundle (`pbsdk compile --target nvgpu -o k.pbsdk`), not a deploy "
                          "artifact: load it with pbsdk.targets.nvgpu.runtime, or export the model with "
                          "pbsdk.export(..., target='nvgpu')")
    if magic != MAGIC:
        raise FormatError(f"not a pbsdk deploy artifact (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise VersionError(f"format version {version}; this runtime reads version {FORMAT_VERSION} "
                           "(re-export the model with this pbsdk, or use a matching runtime)")
    if n < HEADER_SIZE:
        raise TruncatedError(f"the file is {n} bytes long, shorter than its {HEADER_SIZE}-byte header")
    fields = _HEADER.unpack(data[:_HEADER.size])
    (stored,) = _HEADER_CRC.unpack(data[_HEADER.size:_HEADER.size + 4])
    if crc32(data[:_HEADER.size]) != stored:
        raise ChecksumError("the header's checksum does not match: the file is damaged", section="header")
    layout = Layout(version, fields[3], tuple(fields[4:7]), tuple(fields[7:10]))  # type: ignore[arg-type]
    if n < layout.size:
        raise TruncatedError(f"the file is {n} bytes long; its header says {layout.size} (truncated copy?)")
    if n > layout.size:
        raise FormatError(f"the file is {n} bytes long; its header says {layout.size} (bytes appended?)")
    return layout


def read_manifest(data: Any, layout: Layout) -> Manifest:
    """The checked manifest of ``data``: CRCs of the manifest and index, JSON, sections inside the file."""
    blobs = {}
    for what, (off, length, crc) in (("manifest", layout.manifest), ("index", layout.index)):
        if off < HEADER_SIZE or off + length > layout.size:
            raise FormatError(f"the {what} lies outside the file ({off}+{length} of {layout.size} bytes)")
        blob = data[off:off + length]
        if crc32(blob) != crc:
            raise ChecksumError(f"the {what}'s checksum does not match: the file is damaged", section=what)
        blobs[what] = bytes(blob)
    try:
        meta = json.loads(blobs["manifest"])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"the manifest is not JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise FormatError("the manifest is not a JSON object")
    manifest = Manifest.from_json(meta)
    if manifest.format != layout.version:
        raise FormatError(f"the manifest says format {manifest.format}, the header {layout.version}")
    for s in manifest.sections:
        if s.offset < HEADER_SIZE or s.size < 0 or s.offset + s.size > layout.size:
            raise FormatError(f"section {s.name!r} lies outside the file ({s.offset}+{s.size} of {layout.size})")
    for e in manifest.entries:
        for i in (e.code, *e.constants, *(e.device.sections() if e.device is not None else ())):
            if not 0 <= i < len(manifest.sections):
                raise FormatError(f"entry {e.name!r} refers to section {i}; the file has {len(manifest.sections)}")
    if blobs["index"] != manifest.index_text().encode():
        raise FormatError("the index does not agree with the manifest")
    return manifest


def verify_sections(data: Any, manifest: Manifest, indices: Iterable[int] | None = None) -> None:
    """Check the CRC-32 of the sections ``indices`` (all by default)."""
    chosen = range(len(manifest.sections)) if indices is None else indices
    for i in chosen:
        s = manifest.sections[i]
        if crc32(memoryview(data)[s.offset:s.offset + s.size]) != s.crc32:
            raise ChecksumError(f"section {s.name!r}'s checksum does not match: the file is damaged",
                                section=s.name)


def rewrite_manifest(path: str, change: Any, *, version: int = FORMAT_VERSION) -> None:
    """Rewrite ``path``'s manifest as ``change(manifest_json)`` returns it, checksums recomputed (for tests
    and tools: a file whose manifest claims something else, still well-formed)."""
    with open(path, "rb") as f:
        data = f.read()
    layout = read_header(data)
    manifest = read_manifest(data, layout)
    meta_json = change(manifest.to_json())
    new = Manifest.from_json(meta_json)
    meta = json.dumps(meta_json, indent=1).encode()
    index = new.index_text().encode()
    body = bytearray(data[:layout.manifest[0]])
    meta_off = len(body)
    body += meta
    body += b"\0" * (-len(body) % ALIGNMENT)
    index_off = len(body)
    body += index
    body[:HEADER_SIZE] = header(len(body), meta_off, meta, index_off, index, version=version)
    with open(path, "wb") as f:
        f.write(body)
