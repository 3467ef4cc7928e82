"""``pbsdk new-target NAME --spec FILE``: render an installable target plugin from ``scaffold/``.

The plugin subclasses `TemplateTarget` with its own ``hooks.py`` implementing the hook contract of
`pbsdk.core.hooks` (each hook calling the emulation), so it works end to end before any edit. A spec whose
levels besides main memory are all caches gets the files of ``scaffold_cache/`` in place of those of
``scaffold/`` (its ``hooks.py``: the vector unit at the spec's width, packing copies into cache levels). Everything is checked before anything is written: the name (a
lower-case Python identifier, not a keyword, not the name of an installed target), the spec (validated,
and one the template target can emulate), and the output directory (refused if it exists and is not
empty, unless ``force``).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from pathlib import Path

from pbsdk.core.errors import PbsdkError

SCAFFOLD = Path(__file__).with_name("scaffold")
#: Files that differ for a chip whose levels besides main memory are all caches (found here first).
SCAFFOLD_CACHE = Path(__file__).with_name("scaffold_cache")
#: Target names: lower-case identifiers, so that one string is the entry-point name, part of the
#: package name (``pbsdk_NAME``) and of the distribution name (``pbsdk-NAME``), with nothing to escape.
NAME_PATTERN = re.compile(r"[a-z][a-z0-9_]{0,39}")
#: Names never allowed whether or not a target of that name is installed right now.
RESERVED = frozenset({"cpu", "nvgpu", "template", "host", "pbsdk", "test", "tests"})

#: template file -> output path (``{package}`` is the plugin's import name)
FILES = {
    "pyproject.toml.j2": "pyproject.toml",
    "README.md.j2": "README.md",
    "package/__init__.py.j2": "{package}/__init__.py",
    "package/hooks.py.j2": "{package}/hooks.py",
    "tests/test_conformance.py.j2": "tests/test_conformance.py",
}


@dataclasses.dataclass(frozen=True)
class Scaffolded:
    """What `new_target` wrote."""

    name: str
    package: str
    out: Path
    files: tuple[Path, ...]

    def next_commands(self) -> tuple[str, str, str]:
        return (f"pip install -e {self.out}", f"pbsdk conform --target {self.name}", f"pytest {self.out / 'tests'}")


def check_name(name: str) -> None:
    """Raise `PbsdkError` unless ``name`` can be a new target's name."""
    if not isinstance(name, str) or not NAME_PATTERN.fullmatch(name):
        raise PbsdkError(f"invalid target name {name!r}: use a lower-case Python identifier "
                         "(a letter, then letters, digits or '_', at most 40 characters)")
    if keyword.iskeyword(name) or keyword.issoftkeyword(name):
        raise PbsdkError(f"invalid target name {name!r}: it is a Python keyword")
    if name in RESERVED:
        raise PbsdkError(f"invalid target name {name!r}: reserved by pbsdk")
    from pbsdk.core.target import discover

    installed = {i.name for i in discover()}
    if name in installed:
        raise PbsdkError(f"a target named {name!r} is already installed (installed targets: "
                         f"{', '.join(sorted(installed))}); choose another name")


def _class_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part) + "Target"


def new_target(name: str, spec_file: str | Path, out: str | Path | None = None, *, force: bool = False) -> Scaffolded:
    """Render the plugin for ``name`` and ``spec_file`` into ``out`` (default ``./pbsdk-NAME``)."""
    import jinja2

    from pbsdk.core.spec import load_spec
    from pbsdk.targets.template import TemplateTarget

    check_name(name)
    path = Path(spec_file)
    if not path.is_file():
        raise PbsdkError(f"spec file {str(path)!r} does not exist (give a YAML chip spec, e.g. chip_specs/example/npu.yaml)")
    spec = load_spec(path)  # SpecError (a PbsdkError) names the field
    TemplateTarget().check_spec(spec)  # TargetError when the emulation cannot run this chip
    out_dir = Path(out) if out is not None else Path.cwd() / f"pbsdk-{name}"
    if out_dir.exists() and not out_dir.is_dir():
        raise PbsdkError(f"{out_dir} exists and is not a directory")
    if out_dir.exists() and any(out_dir.iterdir()) and not force:
        raise PbsdkError(f"{out_dir} exists and is not empty; pass --force to overwrite the generated files in it")
    package = f"pbsdk_{name}"
    units = ", ".join(f"{u.name} {u.m}x{u.n}x{u.k} {u.operand_dtype}->{u.accumulator_dtype}" for u in spec.matrix_units)
    levels = ", ".join(f"{m.name} {m.size_bytes} B ({m.managed})" for m in spec.memory)
    values = {"name": name, "package": package, "dist": f"pbsdk-{name.replace('_', '-')}",
              "class_name": _class_name(name), "spec_name": spec.name,
              "summary": f"{spec.kind}; memory: {levels}; matrix units: {units or 'none'}; dtypes: "
                         f"{', '.join(spec.dtypes)}"}
    from pbsdk.core.plan.packing import is_cache_only

    search = [str(SCAFFOLD_CACHE), str(SCAFFOLD)] if is_cache_only(spec) else [str(SCAFFOLD)]
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(search), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, autoescape=False)
    written: list[Path] = []
    try:
        for template, target in FILES.items():
            dest = out_dir / target.format(package=package)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(env.get_template(template).render(**values))
            written.append(dest)
        spec_copy = out_dir / package / "spec.yaml"
        spec_copy.write_text(path.read_text())
        written.append(spec_copy)
    except OSError as exc:
        raise PbsdkError(f"cannot write the plugin into {out_dir}: {exc.strerror or exc}") from None
    return Scaffolded(name, package, out_dir, tuple(written))
