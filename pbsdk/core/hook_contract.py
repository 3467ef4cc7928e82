"""The hook contract's declaration: every hook's name, parameters, result and contract (`HOOKS`), and
`check_hooks`, which discovery runs on a target's ``hooks``. MLIR-free (the parameter types are text), so
discovering a target and checking its hooks needs no MLIR bindings; the descriptions the hooks receive and
the IR helpers are in `pbsdk.core.hooks`, which re-exports everything here.

A target names the object holding its hooks in ``Target.hooks`` (a module, a class of static methods, or
any object, e.g. ``types.SimpleNamespace``). A public function in it that is not a hook (a misspelt
``matrix_unit_opp``) or a hook that does not take the declared parameters makes the plugin unusable with a
`TargetError` naming it. A hooks module's public helper functions are declared in
``__pbsdk_helpers__ = ("name", ...)`` (or named with a leading ``_``, which the check never reads).
Classes and imported names are not checked.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pbsdk.core.errors import TargetError

__all__ = ["HOOKS", "HookSpec", "check_hooks"]

#: Modules whose classes declare the contract (a hooks class deriving from one implements nothing by it).
_CONTRACT_MODULES = ("pbsdk.core.hooks", __name__)


@dataclasses.dataclass(frozen=True)
class HookSpec:
    """One hook of the contract: its name, its positional parameters (name and type, as written in
    Python), what it returns and its contract. A hook is always called with exactly these arguments,
    positionally (a hook may name its parameters differently)."""

    name: str
    parameters: tuple[tuple[str, str], ...]
    returns: str
    doc: str

    @property
    def signature(self) -> str:
        """``name(p: T, ...) -> R``, as the docs' reference table shows it."""
        params = ", ".join(f"{p}: {t}" for p, t in self.parameters)
        return f"{self.name}({params}) -> {self.returns}"


def _declare(*specs: HookSpec) -> Mapping[str, HookSpec]:
    return types.MappingProxyType({s.name: s for s in specs})


#: Every hook of the contract, in the order a scratchpad chip's pipeline (the template's) calls them;
#: ``unit_step`` is one instruction on register values (the cpu target's micro-kernels, nvgpu's mma.sync).
HOOKS: Mapping[str, HookSpec] = _declare(
    HookSpec("matrix_unit_op", (("op", "UnitOp"), ("a", "ir.Value"), ("b", "ir.Value"), ("c", "ir.Value"),
                                ("spec", "ChipSpec")), "None",
             "Build one instruction of op.unit at the insertion point: C += A x B on the tiles a, b, c (memrefs "
             "of exactly the unit's shape in the innermost scratchpad); keep op.count()."),
    HookSpec("vector_tile_op", (("op", "VectorTileOp"), ("operands", "Sequence[ir.Value]"), ("spec", "ChipSpec")),
             "None",
             "Build one vector-unit operation on scratchpad tiles in place (the insertion point is before the "
             "marked op, which is erased after); keep op.count_elements(op.iterations())."),
    HookSpec("dma_copy", (("copy", "DmaCopy"), ("src", "ir.Value"), ("dst", "ir.Value"), ("spec", "ChipSpec")),
             "None",
             "Build the move of one tile from src (level copy.src_level) to dst (copy.dst_level); keep "
             "copy.count_bytes(copy.byte_count())."),
    HookSpec("scratchpad_alloc", (("alloc", "ScratchpadAlloc"), ("spec", "ChipSpec")), "ir.Value | None",
             "Build and return the buffer (a value of alloc.type) in the chip's scratchpad, or None to keep the "
             "memref.alloc."),
    HookSpec("parallel_loop", (("spec", "ChipSpec"),), "Pipeline",
             "The pass pipeline mapping each scf.forall over spec.compute[0] (pbsdk.compute_level) onto the "
             "chip's cores."),
    HookSpec("vector_ops", (("spec", "ChipSpec"),), "Pipeline",
             "The pass pipeline lowering what the other hooks left (elementwise ops, reductions, fills)."),
    HookSpec("final_emission", (("module", "ir.Module"), ("spec", "ChipSpec")), "str | bytes",
             "The artifact's payload from the LLVM-dialect module."),
    HookSpec("toolchain_emission", (("module", "ir.Module"), ("stage", "str"), ("spec", "ChipSpec")), "str | bytes",
             "The artifact's payload from the module as stage `stage` left it (Target.emit_after: the tiled form "
             "or a later stage), for a chip whose own toolchain compiles it (e.g. portable C); called instead of "
             "final_emission when the target sets emit_after."),
    HookSpec("unit_step", (("step", "UnitStep"), ("acc", "ir.Value"), ("a", "ir.Value"), ("b", "ir.Value"),
                           ("spec", "ChipSpec")), "ir.Value",
             "Build one matrix-unit instruction on register values at the insertion point and return the new "
             "accumulator (a value of step.acc_type): acc + A x B at step.unit's shape."),
)


def check_hooks(hooks: object, *, target: str) -> frozenset[str]:
    """The names of the hooks of `HOOKS` that ``hooks`` (a module, a class, or an instance) implements.

    Raises `TargetError` naming the name and ``target`` when ``hooks`` defines a public function that is
    not a hook (with the closest hook name), or a hook that is not callable or cannot be called with the
    declared parameters. Checked: for a module, the functions defined in it (imported names are not; a
    hook is a hook wherever it was defined); for a class or an instance, what its classes (not
    ``object``) and the instance define. Not checked: names starting with ``_``, classes, and the names
    listed in ``__pbsdk_helpers__``. A hook set to None is not implemented."""
    where, members = _members(hooks)
    declared = getattr(hooks, "__pbsdk_helpers__", ())
    helpers = {declared} if isinstance(declared, str) else set(declared)
    implemented = set()
    for name, (value, own) in members.items():
        if name.startswith("_") or value is None:
            continue
        if name in HOOKS:
            _check_call(HOOKS[name], value, target=target, where=where)
            implemented.add(name)
        elif own and callable(value) and not isinstance(value, type) and name not in helpers:
            close = difflib.get_close_matches(name, list(HOOKS), n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            raise TargetError(f"target '{target}': {where} defines '{name}', which is not a hook ({hint}hooks: "
                              f"{', '.join(HOOKS)}; list public helpers in __pbsdk_helpers__)")
    return frozenset(implemented)


def _members(hooks: object) -> tuple[str, dict[str, tuple[Any, bool]]]:
    """How to name ``hooks`` in a message, and its attributes: name -> (value, defined there)."""
    if isinstance(hooks, types.ModuleType):
        file = getattr(hooks, "__file__", None)
        where = f"{Path(file).parent.name}/{Path(file).name}" if file else f"module {hooks.__name__}"
        return where, {name: (value, getattr(value, "__module__", None) == hooks.__name__)
                       for name, value in vars(hooks).items()}
    cls = hooks if isinstance(hooks, type) else type(hooks)
    names: list[str] = []
    for base in reversed(cls.__mro__):
        if base is object or base.__module__ in _CONTRACT_MODULES:  # the contract's classes declare
            continue
        names.extend(vars(base))
    if not isinstance(hooks, type):
        names.extend(getattr(hooks, "__dict__", {}))
    where = f"class {cls.__qualname__}" if isinstance(hooks, type) else f"the {cls.__name__} object"
    return where, {name: (getattr(hooks, name, None), True) for name in dict.fromkeys(names)}


def _check_call(hook: HookSpec, value: Any, *, target: str, where: str) -> None:
    """Raise `TargetError` unless ``value`` can be called as ``hook`` declares."""
    if not callable(value):
        raise TargetError(f"target '{target}': {where} sets hook '{hook.name}' to a {type(value).__name__}, "
                          f"not a function: the contract calls {hook.signature}")
    try:
        sig = inspect.signature(value)
    except (TypeError, ValueError):  # a builtin without a signature: it is called and fails there if wrong
        return
    declared = [p for p, _ in hook.parameters]
    try:
        sig.bind(*declared)
    except TypeError as exc:
        raise TargetError(f"target '{target}': {where} defines hook '{hook.name}{sig}', which cannot be called "
                          f"with the contract's {len(declared)} arguments ({exc}): {hook.signature}") from None
    positional = [p.name for p in sig.parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)][:len(declared)]
    if sorted(positional) == sorted(declared) and positional != declared:
        raise TargetError(f"target '{target}': {where} defines hook '{hook.name}{sig}', whose parameters are "
                          f"the contract's in another order: {hook.signature}")
