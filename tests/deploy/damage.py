"""Kinds of damage done to an exported file, and the typed error each must give (Python and C runtimes)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pbsdk.runtime import errors
from pbsdk.runtime import format as fmt


def _flip(data: bytearray, offset: int) -> None:
    data[offset] ^= 0x40


def _section(data: bytes, name_part: str) -> fmt.Section:
    manifest = fmt.read_manifest(data, fmt.read_header(data))
    return next(s for s in manifest.sections if name_part in s.name)


def _bytes_damage(change: Callable[[bytearray], None]) -> Callable[[Path], None]:
    def apply(path: Path) -> None:
        data = bytearray(path.read_bytes())
        change(data)
        path.write_bytes(bytes(data))
    return apply


def _manifest_damage(change: Callable[[dict[str, Any]], dict[str, Any]], **kw: Any) -> Callable[[Path], None]:
    return lambda path: fmt.rewrite_manifest(str(path), change, **kw)


def _truncate(data: bytearray) -> None:
    del data[len(data) // 2:]


def _version(data: bytearray) -> None:
    data[8:12] = struct.pack("<I", fmt.FORMAT_VERSION + 1)


def _in_manifest(data: bytearray) -> None:
    layout = fmt.read_header(bytes(data))
    _flip(data, layout.manifest[0] + layout.manifest[1] // 2)


def _in_index(data: bytearray) -> None:
    layout = fmt.read_header(bytes(data))
    _flip(data, layout.index[0] + 3)


def _in_code(data: bytearray) -> None:
    s = _section(bytes(data), ".code")
    _flip(data, s.offset + s.size // 2)


def _in_weights(data: bytearray) -> None:
    s = _section(bytes(data), ".weight")
    _flip(data, s.offset + s.size // 3)


def _needs_feature(m: dict[str, Any]) -> dict[str, Any]:
    return {**m, "cpu_features": [*m["cpu_features"], "pbsdk_no_such_feature"]}


def _with(key: str, value: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    return lambda m: {**m, key: value}


def _drop_entries_key(m: dict[str, Any]) -> dict[str, Any]:
    return {**m, "entries": [{k: v for k, v in e.items() if k != "outputs"} | {"outputs": "x"}
                             for e in m["entries"]]}


#: name -> (damage, Python error class, C status name or None where the C runtime reads no JSON).
DAMAGE: dict[str, tuple[Callable[[Path], None], type[errors.DeployError], str | None]] = {
    "empty": (lambda p: p.write_bytes(b""), errors.TruncatedError, "truncated"),
    "truncated": (_bytes_damage(_truncate), errors.TruncatedError, "truncated"),
    "not-an-artifact": (lambda p: p.write_bytes(b"\x7fELF" + b"\0" * 300), errors.FormatError, "format"),
    "appended": (lambda p: p.write_bytes(p.read_bytes() + b"junk"), errors.FormatError, "format"),
    "wrong-version": (_bytes_damage(_version), errors.VersionError, "version"),
    "header-flipped": (_bytes_damage(lambda d: _flip(d, 20)), errors.ChecksumError, "checksum"),
    "manifest-flipped": (_bytes_damage(_in_manifest), errors.ChecksumError, "checksum"),
    "index-flipped": (_bytes_damage(_in_index), errors.ChecksumError, "checksum"),
    "code-flipped": (_bytes_damage(_in_code), errors.ChecksumError, "checksum"),
    "weights-flipped": (_bytes_damage(_in_weights), errors.ChecksumError, "checksum"),
    "missing-cpu-feature": (_manifest_damage(_needs_feature), errors.CpuFeatureError, "cpu-features"),
    "other-target": (_manifest_damage(_with("target", "npu9000")), errors.TargetMismatchError, "target"),
    "other-machine": (_manifest_damage(_with("machine", "riscv64")), errors.TargetMismatchError, "target"),
    "malformed-manifest": (_manifest_damage(_drop_entries_key), errors.FormatError, None),
}

__all__ = ["DAMAGE", "json"]
