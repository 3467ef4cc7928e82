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
from typing import TYPE_CHECKING, Any

from pbsdk.core.errors import PbsdkError

if TYPE_CHECKING:
    from pbsdk.core.spec import ChipSpec

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

#: ``--toolchain``: the scaffold directories a variant renders from, first match wins (``scaffold_c`` holds
#: only what differs from the LLVM variant), and the files it adds to `FILES`.
TOOLCHAINS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "llvm": (("scaffold",), {}),
    "c": (("scaffold_c", "scaffold"), {"package/csrc/intrinsics.h.j2": "{package}/csrc/{name}_intrinsics.h",
                                       "package/csrc/intrinsics.c.j2": "{package}/csrc/{name}_intrinsics.c"}),
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


def new_target(name: str, spec_file: str | Path, out: str | Path | None = None, *, force: bool = False,
               toolchain: str = "llvm") -> Scaffolded:
    """Render the plugin for ``name`` and ``spec_file`` into ``out`` (default ``./pbsdk-NAME``); ``toolchain``
    ``"c"`` renders the variant of a chip whose toolchain is a C compiler (`TOOLCHAINS`)."""
    import jinja2

    from pbsdk.core.spec import load_spec
    from pbsdk.targets.template import TemplateTarget

    check_name(name)
    if toolchain not in TOOLCHAINS:
        raise PbsdkError(f"unknown toolchain {toolchain!r} (toolchains: {', '.join(TOOLCHAINS)})")
    directories, extra = TOOLCHAINS[toolchain]
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

    if is_cache_only(spec):
        if toolchain == "c":
            raise PbsdkError(f"--toolchain c is for chips with scratchpads; '{spec.name}' has only caches, whose "
                             "register-tile kernels are vector code the C printer does not print yet")
        directories = (SCAFFOLD_CACHE.name, *directories)
    if toolchain == "c":
        values.update(c_values(name, spec))
    env = jinja2.Environment(loader=jinja2.FileSystemLoader([str(SCAFFOLD.with_name(d)) for d in directories]),
                             undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
                             trim_blocks=toolchain == "c")
    written: list[Path] = []
    try:
        for template, target in {**FILES, **extra}.items():
            dest = out_dir / target.format(package=package, name=name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(env.get_template(template).render(**values))
            written.append(dest)
        spec_copy = out_dir / package / "spec.yaml"
        spec_copy.write_text(path.read_text())
        written.append(spec_copy)
    except OSError as exc:
        raise PbsdkError(f"cannot write the plugin into {out_dir}: {exc.strerror or exc}") from None
    return Scaffolded(name, package, out_dir, tuple(written))


#: dtype -> (C storage type, C function reading one element as a number, bytes)
_C_DTYPES = {"f32": ("float", "", 4), "f64": ("double", "", 8), "bf16": ("uint16_t", "{name}_bf16_to_f32", 2),
             "f16": ("uint16_t", "{name}_f16_to_f32", 2), "i8": ("int8_t", "", 1), "i16": ("int16_t", "", 2),
             "i32": ("int32_t", "", 4), "i64": ("int64_t", "", 8)}
#: Accumulator dtypes an intrinsic of the C variant holds C in (its C type).
_C_ACCUMULATORS = {"f32": "float", "f64": "double", "i32": "int32_t", "i64": "int64_t"}


def c_values(name: str, spec: ChipSpec) -> dict[str, Any]:
    """What the C variant's templates need: one intrinsic per matrix unit whose dtypes C holds (its
    function name, C types, shape), the unit keys the hooks call intrinsics for, header guard, padding."""
    units = []
    for u in spec.matrix_units:
        if u.operand_dtype not in _C_DTYPES or u.accumulator_dtype not in _C_ACCUMULATORS:
            continue  # stays emulated in the kernel's C
        storage, load, size = _C_DTYPES[u.operand_dtype]
        fn = f"{name}_mma_{re.sub(r'[^A-Za-z0-9_]', '_', u.name)}_{u.operand_dtype}_{u.accumulator_dtype}"
        units.append({"unit": u.name, "fn": fn, "m": u.m, "n": u.n, "k": u.k, "operand": u.operand_dtype,
                      "accumulator": u.accumulator_dtype, "storage": storage, "load": load.format(name=name),
                      "operand_bytes": size, "acc_type": _C_ACCUMULATORS[u.accumulator_dtype],
                      "integer": u.accumulator_dtype.startswith("i"), "pad": " " * (len(fn) + 6),
                      "key": (u.name, u.operand_dtype, u.accumulator_dtype)})
    keys = ", ".join(repr(u["key"]) for u in units)
    return {"units": units, "unit_keys": "{" + keys + "}" if keys else "()",
            "guard": f"{name.upper()}_INTRINSICS_H", "dma_pad": " " * len(f"void {name}_dma(")}
