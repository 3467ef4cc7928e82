"""pbsdk's passes by name, as `Stage`s: what ``pbsdk opt -p NAME`` runs (mlir-opt style, one pass at a time).

The registry maps a kebab-case name to a factory that gives a `Stage`:

- the core stages (`pbsdk.core.compiler.CORE_STAGES`: ``input``, ``isolate-contractions``, ``fuse``,
  ``bufferize``, ``distinct-results``, ``out-params``, ``forward-outputs``) — the very `Stage` objects the
  compile driver runs, not copies;
- every pass of this package (`pass_classes`: ``copies-to-linalg``, ``fuse-rows``, ``math-approx``,
  ``promote``, ``promote-vector``, ...), which targets put in their pipelines (a target's own stages, e.g. the
  cpu target's ``pack-contractions``, are reached with ``--target``). A pass is found by the
  file naming rule: module ``pbsdk/core/passes/<name>.py`` holds the frozen dataclass whose ``name`` is
  ``<name>`` in kebab-case, so a new pass file is reachable from ``pbsdk opt`` with nothing to register.
  A pass's fields are its options: ``math-approx{ops=exp,tanh}`` or ``copies-to-linalg{only-strided=false}``
  builds the pass with those fields (MLIR's textual option syntax: ``{key=value key2=value}``, list values
  comma-separated, a bare key means true).

`resolve_pass` turns one pipeline element into a `Stage`, looking the name up in this order:

1. the target's pipeline, when one is given (``--target T``: the core stages then ``target.stages(spec,
   options)``, exactly what ``pbsdk compile --target T`` runs, so ``-p promote`` with the template target
   is that target's ``promote`` with its ``tiles`` option); only for a bare name — a name with
   ``{options}`` always means pbsdk's pass class;
2. this registry;
3. upstream MLIR: any element of a textual pass pipeline (``canonicalize``, ``cse``,
   ``func.func(linalg-fuse-elementwise-ops)``), anchored on the module.

A name found nowhere is a `PbsdkError` listing pbsdk's passes (and the target's stages).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import pkgutil
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mlir import ir, passmanager

from pbsdk.core.errors import CompileError, PbsdkError
from pbsdk.core.options import Options
from pbsdk.core.pipeline import Pipeline, Stage, StageContext

#: Textual pass options (``{key=value ...}``) -> the `Stage` that runs the pass so configured.
PassFactory = Callable[[Mapping[str, str]], Stage]


@functools.cache
def pass_classes() -> tuple[type, ...]:
    """The pass of each module of `pbsdk.core.passes`, in module-name order: the frozen dataclass whose
    ``name`` is the module's name in kebab-case (``copies_to_linalg.py`` holds ``copies-to-linalg``).
    Helper modules (``matmul_kernel.py``, this one) hold no such class."""
    import pbsdk.core.passes as package

    found: list[type] = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        wanted = info.name.replace("_", "-")
        found += [obj for obj in vars(module).values()
                  if isinstance(obj, type) and dataclasses.is_dataclass(obj) and obj.__module__ == module.__name__
                  and getattr(obj, "name", None) == wanted and callable(getattr(obj, "apply", None))]
    return tuple(found)

_ELEMENT = re.compile(r"^([A-Za-z][\w.-]*)(?:\{(.*)\})?$", re.DOTALL)


def _summary(cls: type) -> str:
    """The first sentence of a pass module's docstring, without its ``Pass ``name``:`` prefix."""
    doc = (sys.modules[cls.__module__].__doc__ or "").strip().split("\n\n")[0]
    text = " ".join(doc.split())
    text = re.sub(r"^Pass ``[\w-]+``: ", "", text)
    return text.split(". ")[0].rstrip(".").replace("``", "")


def _fixed(stage: Stage, options: Mapping[str, str]) -> Stage:
    if options:
        raise PbsdkError(f"pass '{stage.name}' takes no options (got {', '.join(sorted(options))})")
    return stage


def _coerce(cls: type, field: dataclasses.Field, text: str) -> Any:
    """A textual option value as the type of the field's default (bool, int, float, str, tuple of str)."""
    default = field.default
    where = f"option '{field.name}' of pass '{cls.name}'"  # type: ignore[attr-defined]
    if isinstance(default, bool):
        if text.lower() in ("true", "1", "on"):
            return True
        if text.lower() in ("false", "0", "off"):
            return False
        raise PbsdkError(f"{where} is true or false, not '{text}'")
    if isinstance(default, (int, float)):
        try:
            return type(default)(text)
        except ValueError:
            raise PbsdkError(f"{where} is a number, not '{text}'") from None
    if isinstance(default, str):
        return text
    if isinstance(default, tuple) and default and all(isinstance(v, str) for v in default):
        return tuple(v.strip() for v in text.split(",") if v.strip())
    raise PbsdkError(f"{where} cannot be given in text; compile options (--options) reach it where a "
                     "target's stage sets it")


def _from_class(cls: type, options: Mapping[str, str]) -> Stage:
    """A `Stage` running ``cls(**options)``, each textual option coerced to its field's type."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    values: dict[str, Any] = {}
    for key, text in options.items():
        field = fields.get(key.replace("-", "_"))
        if field is None:
            known = ", ".join(f.replace("_", "-") for f in fields) or "none"
            raise PbsdkError(f"pass '{cls.name}' has no option '{key}' (options: {known})")  # type: ignore[attr-defined]
        values[field.name] = _coerce(cls, field, text)
    instance = cls(**values)
    return Stage(cls.name, fn=instance.apply, description=_summary(cls))  # type: ignore[attr-defined]


def registry() -> dict[str, PassFactory]:
    """Every pbsdk pass by name: the core stages first (in pipeline order), then `pass_classes` (a core
    stage that runs one of them, e.g. ``isolate-contractions``, stays the core stage)."""
    from pbsdk.core.compiler import CORE_STAGES  # the compile driver's own Stage objects

    table: dict[str, PassFactory] = {s.name: functools.partial(_fixed, s) for s in CORE_STAGES}
    for cls in pass_classes():
        table.setdefault(cls.name, functools.partial(_from_class, cls))  # type: ignore[attr-defined]
    return table


def describe_passes() -> list[tuple[str, str]]:
    """(name, one-line description) of every registered pass, in registry order."""
    return [(name, make({}).description) for name, make in registry().items()]


def split_pipeline(text: str) -> list[str]:
    """Split ``a,func.func(b,c),d{x=1,2}`` at its top-level commas."""
    parts: list[str] = []
    start = 0
    closing = {"(": ")", "{": "}"}
    stack: list[str] = []
    for i, ch in enumerate(text):
        if ch in closing:
            stack.append(closing[ch])
        elif ch in ")}":
            if not stack or stack.pop() != ch:
                raise PbsdkError(f"unbalanced '{ch}' at character {i + 1} of pass pipeline '{text}'")
        elif ch == "," and not stack:
            parts.append(text[start:i])
            start = i + 1
    if stack:
        raise PbsdkError(f"unclosed '{'(' if stack[-1] == ')' else '{'}' in pass pipeline '{text}'")
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _parse_options(name: str, body: str) -> dict[str, str]:
    """``key=value key2=v1,v2 flag`` -> {key: value, key2: "v1,v2", flag: "true"}."""
    options: dict[str, str] = {}
    for item in body.split():
        key, eq, value = item.partition("=")
        if not key:
            raise PbsdkError(f"malformed option '{item}' of pass '{name}'")
        options[key] = value if eq else "true"
    return options


def _mlir_reason(exc: Exception) -> str:
    """MLIR's pipeline-parser message, on one line, without its source excerpt."""
    lines = [ln.strip() for ln in str(exc).strip().splitlines() if ln.strip()]
    first = next((ln for ln in lines if "error:" in ln), lines[0] if lines else str(exc))
    return re.sub(r"^.*?error: ", "", first)


def _upstream(element: str) -> Exception | None:
    """None if ``element`` parses as an upstream pass pipeline element, else MLIR's error."""
    with ir.Context():
        try:
            passmanager.PassManager.parse(f"builtin.module({element})")
        except Exception as exc:  # noqa: BLE001 - the bindings raise plain ValueError
            return exc
    return None


def resolve_pass(element: str, *, target_stages: Sequence[Stage] = (), target: str | None = None) -> Stage:
    """The `Stage` for one pipeline element (see the module docstring for the lookup order)."""
    element = element.strip()
    match = _ELEMENT.match(element)
    if match is not None:
        name, body = match.group(1), match.group(2)
        if body is None:
            found = next((s for s in target_stages if s.name == name), None)
            if found is not None:
                return found
        table = registry()
        if name in table:
            return table[name](_parse_options(name, body or ""))
    error = _upstream(element)
    if error is None:
        return Stage(element, passes=element, description="upstream MLIR pass")
    base = match.group(1) if match is not None else element
    if match is not None and match.group(2) is not None and _upstream(base) is None:
        raise PbsdkError(f"upstream pass '{element}': {_mlir_reason(error)}")
    known = ", ".join(registry())
    extra = ""
    if target_stages:
        own = [s.name for s in target_stages if s.name not in registry()]
        extra = f"; target '{target}' adds: {', '.join(own)}" if target else f"; the target adds: {', '.join(own)}"
    raise PbsdkError(f"unknown pass '{element}': not a pbsdk pass (pbsdk passes: {known}{extra}) and not an "
                     f"upstream MLIR pass ({_mlir_reason(error)})")


class Notes(dict):  # type: ignore[type-arg]
    """`StageContext.notes` for passes run alone: a note nobody recorded is a `CompileError` saying which
    stage records it, not a bare KeyError."""

    def __missing__(self, key: str) -> Any:
        if key in ("entry", "inputs", "outputs"):
            raise CompileError(f"needs the entry signature (notes['{key}']) that the 'input' stage reads from "
                               "an entry function on tensors, and this module's entry is not on tensors: run "
                               "the passes from the tensor-level module")
        raise CompileError(f"needs notes['{key}'], which an earlier stage of the full pipeline records")


def context_for(module: ir.Module, spec: Any, options: Options) -> StageContext:
    """A `StageContext` as the stages after ``input`` see it, without running ``input`` as a pass.

    The entry signature is read as ``input`` reads it when the module still takes tensors; otherwise (a
    bufferized module) only the entry's name is noted: the one public function with a body, or
    ``options.entry``. Text carries no constant arrays: each entry argument marked ``pbsdk.constant = i``
    gets zeros of its type as constant i, so passes that rewrite constants run on text too (the arrays
    are not printed)."""
    ctx = StageContext(spec, options, Notes(), constants=_placeholder_constants(module))
    scratch = StageContext(spec, options)
    try:
        registry()["input"]({}).fn(module, scratch)  # type: ignore[misc]
        ctx.notes.update(scratch.notes)
    except PbsdkError:
        names = [ir.StringAttr(op.attributes["sym_name"]).value for op in module.body.operations
                 if op.operation.name == "func.func" and len(op.regions[0].blocks)
                 and ("sym_visibility" not in op.attributes
                      or ir.StringAttr(op.attributes["sym_visibility"]).value == "public")]
        wanted = options.entry
        if wanted is not None:
            ctx.notes["entry"] = wanted
        elif len(names) == 1:
            ctx.notes["entry"] = names[0]
    return ctx


def _placeholder_constants(module: ir.Module) -> tuple[Any, ...]:
    """Zeros of each ``pbsdk.constant`` argument's type, by index, for the functions of ``module`` that have
    them (empty if the indices are not 0, 1, ... or a type has no numpy dtype)."""
    import numpy as np

    from pbsdk.core.ir import attributes
    from pbsdk.core.ir.graph import DTYPE_TO_NUMPY

    found: dict[int, Any] = {}
    for op in module.body.operations:
        if op.operation.name != "func.func" or not len(op.regions[0].blocks):
            continue
        for arg in op.regions[0].blocks[0].arguments:
            index = attributes.arg_i64(op, arg.arg_number, attributes.CONSTANT)
            if index is None:
                continue
            t = ir.ShapedType(arg.type)
            dtype = DTYPE_TO_NUMPY.get(str(t.element_type))
            if dtype is None or dtype == "bfloat16":
                return ()
            found[index] = np.zeros(t.shape, dtype)
    if sorted(found) != list(range(len(found))):
        return ()
    return tuple(found[i] for i in range(len(found)))


def run_passes(module: ir.Module, stages: Sequence[Stage], ctx: StageContext) -> Any:
    """Run ``stages`` in order on ``module`` (each verified after, errors naming it, as in a compile);
    returns what the last one produced. A name may repeat (``canonicalize,cse,canonicalize``)."""
    current: Any = module
    for stage in stages:
        current = Pipeline((stage,)).run(current, ctx, dump_dir="")
    return current
