"""Loading chip specs: YAML files, presets from ``chip_specs/`` and the special name ``host``.

Every failure is a `SpecError` whose message is ``"{file}: {field.path}: {problem}"`` (one line per
problem), with ``.source`` (the file) and ``.field`` (the first offending field path) set.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from pbsdk.core.errors import SpecError
from pbsdk.core.spec.models import RESERVED_NAMES, ChipSpec

#: Largest spec file we read.
MAX_FILE_BYTES = 1 << 20
#: Deepest nesting and most nodes (counting each visit of a shared YAML alias) we accept in a document.
MAX_DEPTH = 32
MAX_NODES = 100_000


# --------------------------------------------------------------------------- YAML


class _SpecLoader(yaml.SafeLoader):
    """`yaml.SafeLoader` (no arbitrary tags) that also rejects duplicate mapping keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r}", key_node.start_mark
                    )
                seen.add(key)
            except TypeError:  # unhashable key: let the base class report it
                pass
        return super().construct_mapping(node, deep=deep)


def _check_shape(data: Any, source: str) -> None:
    """Reject documents that are too deep or too large (alias bombs, recursive aliases)."""
    stack: list[tuple[Any, int]] = [(data, 0)]
    nodes = 0
    while stack:
        obj, depth = stack.pop()
        nodes += 1
        if nodes > MAX_NODES:
            raise SpecError(
                f"{source}: document has more than {MAX_NODES} nodes (alias bomb?)", source=source
            )
        if depth > MAX_DEPTH:
            raise SpecError(f"{source}: document is nested more than {MAX_DEPTH} levels deep", source=source)
        if isinstance(obj, dict):
            for k, v in obj.items():
                stack.append((k, depth + 1))
                stack.append((v, depth + 1))
        elif isinstance(obj, (list, tuple)):
            stack.extend((v, depth + 1) for v in obj)


def _parse_yaml(text: str, source: str) -> dict[str, Any]:
    try:
        data = yaml.load(text, Loader=_SpecLoader)  # _SpecLoader is a SafeLoader
    except RecursionError:
        raise SpecError(f"{source}: document is nested too deeply", source=source) from None
    except ValueError as exc:  # e.g. an integer literal longer than Python's int-conversion limit
        raise SpecError(f"{source}: unreadable value: {exc}", source=source) from None
    except yaml.YAMLError as exc:
        where, problem = "", " ".join(str(exc).split())
        if isinstance(exc, yaml.MarkedYAMLError) and exc.problem:
            problem = " ".join(filter(None, [exc.context, exc.problem]))
            mark = exc.problem_mark or exc.context_mark
            if mark is not None:
                where = f"line {mark.line + 1}, column {mark.column + 1}: "
        raise SpecError(f"{source}: {where}invalid YAML: {problem}", source=source) from None
    _check_shape(data, source)
    if not isinstance(data, dict):
        what = "empty" if data is None else f"a {type(data).__name__}"
        raise SpecError(
            f"{source}: the top level must be a mapping of fields, but the document is {what}", source=source
        )
    return data


def _read_file(path: Path, source: str) -> str:
    try:
        if not path.is_file():
            if path.exists():
                raise SpecError(f"{source}: not a file", source=source)
            raise SpecError(f"{source}: no such chip spec file", source=source)
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SpecError(
                f"{source}: file is {size} bytes; chip specs are limited to {MAX_FILE_BYTES}", source=source
            )
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise SpecError(f"{source}: cannot read: {exc.strerror or exc}", source=source) from None
    if len(raw) > MAX_FILE_BYTES:
        raise SpecError(f"{source}: file exceeds {MAX_FILE_BYTES} bytes", source=source)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError(f"{source}: not UTF-8 text: {exc}", source=source) from None


# --------------------------------------------------------------------------- validation


def _loc_path(loc: tuple[Any, ...]) -> str:
    """("memory", 1, "size_bytes") -> "memory[1].size_bytes"."""
    out = ""
    for part in loc:
        if part == "[key]":  # pydantic marks an invalid dict key this way; _problem says so
            continue
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(top level)"


def _problem(err: Mapping[str, Any]) -> str:
    msg = str(err.get("msg", "invalid"))
    for prefix in ("Value error, ", "Assertion failed, "):
        msg = msg.removeprefix(prefix)
    loc = tuple(err.get("loc", ()))
    if loc and loc[-1] == "[key]":
        msg = f"invalid key {loc[-2]!r}: {msg}" if len(loc) > 1 else f"invalid key: {msg}"
    return msg


def validate_data(data: Any, source: str = "<data>") -> ChipSpec:
    """Validate an already-parsed mapping as a `ChipSpec`; errors are `SpecError`s naming ``source``."""
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: the top level must be a mapping of fields, not a {type(data).__name__}", source=source
        )
    try:
        return ChipSpec.model_validate(data)
    except ValidationError as exc:
        problems = [(_loc_path(tuple(e.get("loc", ()))), _problem(e)) for e in exc.errors()]
    except SpecError as exc:
        problems = list(getattr(exc, "problems", None) or [(exc.field or "(top level)", str(exc))])
    except RecursionError:
        raise SpecError(f"{source}: document is nested too deeply", source=source) from None
    err = SpecError(
        "\n".join(f"{source}: {path}: {msg}" for path, msg in problems), source=source, field=problems[0][0]
    )
    err.problems = problems  # type: ignore[attr-defined]
    raise err


def parse_spec(text: str, source: str = "<string>") -> ChipSpec:
    """Parse and validate YAML ``text``. ``source`` names it in error messages."""
    if len(text.encode("utf-8", "surrogatepass")) > MAX_FILE_BYTES:
        raise SpecError(f"{source}: document exceeds {MAX_FILE_BYTES} bytes", source=source)
    return validate_data(_parse_yaml(text, source), source)


def load_file(path: str | os.PathLike[str]) -> ChipSpec:
    """Load and validate one YAML chip-spec file."""
    source = os.fspath(path)
    return parse_spec(_read_file(Path(path), source), source)


# --------------------------------------------------------------------------- presets


def preset_dir() -> Path:
    """The directory holding the preset YAML files.

    ``<checkout>/chip_specs`` when running from a source or editable checkout, else
    ``sys.prefix/share/pbsdk/chip_specs`` (installed by the wheel's data files). Tests monkeypatch this.
    """
    # pbsdk/core/spec/loader.py -> parents[3] is the directory that holds the `pbsdk` package
    # (the same as Path(pbsdk.__file__).resolve().parent.parent).
    local = Path(__file__).resolve().parents[3] / "chip_specs"
    if local.is_dir():
        return local
    return Path(sys.prefix) / "share" / "pbsdk" / "chip_specs"


def _names_of(path: Path) -> tuple[str, list[str]]:
    source = str(path)
    data = _parse_yaml(_read_file(path, source), source)
    name = data.get("name")
    if not isinstance(name, str) or not name:
        raise SpecError(
            f"{source}: name: a preset needs a non-empty string name", source=source, field="name"
        )
    aliases = data.get("aliases", []) or []
    if not isinstance(aliases, list) or not all(isinstance(a, str) for a in aliases):
        raise SpecError(f"{source}: aliases: must be a list of strings", source=source, field="aliases")
    return name, aliases


@functools.lru_cache(maxsize=8)
def _scan(directory: str, stamp: tuple[tuple[str, int], ...]) -> tuple[dict[str, Path], dict[str, str]]:
    """(canonical name -> file, name-or-alias -> canonical name) for ``directory``.

    ``stamp`` (each file with its mtime) is the cache key, so edited or added files are seen."""
    by_name: dict[str, Path] = {}
    owner: dict[str, tuple[str, Path]] = {}  # name or alias -> (canonical name, file)
    for file, _ in stamp:
        path = Path(file)
        name, aliases = _names_of(path)
        for key in [name, *aliases]:
            if key in RESERVED_NAMES:
                raise SpecError(
                    f"{path}: {'name' if key == name else 'aliases'}: {key!r} is reserved for the "
                    f"detected machine",
                    source=str(path),
                    field="name",
                )
            if key in owner and owner[key][1] != path:
                other = owner[key][1]
                raise SpecError(
                    f"{path}: name: preset name or alias {key!r} is also used by {other}",
                    source=str(path),
                    field="name" if key == name else "aliases",
                )
            owner[key] = (name, path)
        by_name[name] = path
    return by_name, {k: v[0] for k, v in owner.items()}


def _index() -> tuple[dict[str, Path], dict[str, str]]:
    directory = preset_dir()
    if not directory.is_dir():
        return {}, {}
    files = sorted(p for p in directory.rglob("*.yaml") if p.is_file())
    stamp = tuple((str(p), p.stat().st_mtime_ns) for p in files)
    return _scan(str(directory), stamp)


def list_presets() -> dict[str, Path]:
    """Preset files keyed by canonical name (``host`` is not listed; it is detected, not a file)."""
    return dict(_index()[0])


def preset_names() -> dict[str, str]:
    """Every name and alias a preset answers to, mapped to its canonical name."""
    return dict(_index()[1])


@functools.lru_cache(maxsize=64)
def _load_cached(path: str, mtime_ns: int) -> ChipSpec:
    return load_file(path)


def get_preset(name_or_alias: str) -> ChipSpec:
    """The preset called ``name_or_alias`` (canonical name or alias), or the detected host for ``"host"``."""
    if name_or_alias == "host":
        from pbsdk.core.spec.host import detect_host

        return detect_host()
    by_name, names = _index()
    canonical = names.get(name_or_alias)
    if canonical is None:
        known = sorted(names) + ["host"]
        raise SpecError(
            f"unknown chip spec {name_or_alias!r}; known presets and aliases: {', '.join(known)}",
            source=name_or_alias,
        )
    path = by_name[canonical]
    return _load_cached(str(path), path.stat().st_mtime_ns)


def load_spec(source: str | os.PathLike[str] | ChipSpec) -> ChipSpec:
    """A `ChipSpec` from a spec (returned as is), a preset name/alias, ``"host"``, or a YAML file path."""
    if isinstance(source, ChipSpec):
        return source
    if isinstance(source, str):
        if source == "host":
            return get_preset("host")
        try:
            names = _index()[1]
        except SpecError:  # a broken preset directory must not stop loading an explicit file
            if Path(source).is_file():
                return load_file(source)
            raise
        if source in names:
            return get_preset(source)
        path = Path(source)
        if not path.exists() and path.suffix not in (".yaml", ".yml"):
            known = sorted(names) + ["host"]
            raise SpecError(
                f"{source}: not a chip-spec preset (known: {', '.join(known)}) nor a YAML file", source=source
            )
        return load_file(path)
    if isinstance(source, os.PathLike):
        return load_file(source)
    raise SpecError(
        f"cannot load a chip spec from a {type(source).__name__}; pass a preset name, a path or a ChipSpec"
    )


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of chip-spec files (for editors and external validators)."""
    schema = ChipSpec.model_json_schema()
    schema.setdefault("$schema", "https://json-schema.org/draft/2020-12/schema")
    return schema


def clear_caches() -> None:
    """Forget cached presets and the detected host (they are otherwise cached for the process)."""
    _scan.cache_clear()
    _load_cached.cache_clear()
    from pbsdk.core.spec.host import detect_host

    detect_host.cache_clear()
