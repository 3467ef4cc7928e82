"""The ``.pbsdk`` artifact file: one compiled nvgpu kernel set with everything needed to launch it.

Imports only the standard library, so a machine without MLIR (or without pbsdk's compiler) can read it.

Layout (version 1)::

    PBSDK-ARTIFACT 1 <header length in bytes>\\n
    <header: UTF-8 JSON, exactly that many bytes>
    <blob 0><blob 1>...                       (concatenated; offsets are relative to the first blob)

Header fields:

- ``format``: ``"pbsdk-artifact"``; ``version``: 1; ``target``: ``"nvgpu"``; ``spec``: the chip spec's
  name; ``arch``: e.g. ``"sm_90"``; ``pbsdk``: the compiler's version.
- ``entry``: the compiled function's name; ``inputs``/``outputs``: ``[[shape], dtype]`` in call order.
- ``buffers``: every device buffer the launches touch, in order: first one per function argument
  (inputs, then outputs), then temporaries and constants — ``{"shape", "dtype", "role": "arg"|"temp"|"const"}``;
  a constant also names its ``"blob"`` (its bytes, C order), which a loader uploads once.
- ``launches``: in order, ``{"kernel", "grid": [x, y, z], "block": [x, y, z], "shared_bytes"`` (dynamic
  shared memory; static shared memory is in the binary) ``, "args": [{"buffer": i, "offset": bytes}]}``;
  every kernel argument is a bare device pointer (``buffers[i]`` plus ``offset``).
- ``kernels``: per kernel name, what ``ptxas -v`` reported (registers, shared_bytes, spills), when it ran.
- ``blobs``: ``[{"name": "ptx"|"cubin", "offset", "size", "sha256"}]``; a loader prefers the cubin and
  JIT-compiles the PTX through the driver otherwise.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

MAGIC = b"PBSDK-ARTIFACT"
VERSION = 1
_MAX_HEADER_LINE = 64


class BundleError(ValueError):
    """The bytes are not a readable pbsdk artifact (bad magic, version, checksum or header)."""


def pack(header: Mapping[str, Any], blobs: Mapping[str, bytes]) -> bytes:
    """Serialise ``header`` (without ``blobs``) and the named blobs into the file's bytes."""
    entries, offset = [], 0
    for name, data in blobs.items():
        entries.append({"name": name, "offset": offset, "size": len(data),
                        "sha256": hashlib.sha256(data).hexdigest()})
        offset += len(data)
    head = dict(header, format="pbsdk-artifact", version=VERSION, blobs=entries)
    text = json.dumps(head, sort_keys=True, separators=(",", ":")).encode()
    return b"%s %d %d\n" % (MAGIC, VERSION, len(text)) + text + b"".join(blobs.values())


def unpack(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """(header, blobs by name); raises `BundleError` on anything malformed."""
    if not isinstance(data, (bytes, bytearray)):
        raise BundleError(f"an artifact is bytes, not {type(data).__name__}")
    end = data.find(b"\n", 0, _MAX_HEADER_LINE)
    if end < 0:
        raise BundleError("not a pbsdk artifact (no header line)")
    fields = bytes(data[:end]).split(b" ")
    if len(fields) != 3 or fields[0] != MAGIC:
        raise BundleError("not a pbsdk artifact (bad magic)")
    try:
        version, length = int(fields[1]), int(fields[2])
    except ValueError:
        raise BundleError("not a pbsdk artifact (bad header line)") from None
    if version != VERSION:
        raise BundleError(f"artifact format version {version}; this runtime reads version {VERSION}")
    start = end + 1
    if start + length > len(data):
        raise BundleError("truncated artifact header")
    try:
        header = json.loads(bytes(data[start:start + length]))
    except ValueError as exc:
        raise BundleError(f"unreadable artifact header: {exc}") from None
    body = start + length
    blobs: dict[str, bytes] = {}
    for b in header.get("blobs", []):
        lo, hi = body + int(b["offset"]), body + int(b["offset"]) + int(b["size"])
        if hi > len(data):
            raise BundleError(f"truncated artifact: blob '{b['name']}' ends past the file")
        blob = bytes(data[lo:hi])
        if hashlib.sha256(blob).hexdigest() != b["sha256"]:
            raise BundleError(f"artifact blob '{b['name']}' fails its checksum")
        blobs[str(b["name"])] = blob
    for key in ("entry", "inputs", "outputs", "buffers", "launches"):
        if key not in header:
            raise BundleError(f"artifact header lacks '{key}'")
    return header, blobs
