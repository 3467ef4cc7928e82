"""pbsdk's discardable attributes: every ``pbsdk.*`` name, what it means, its value kind, and a verifier.

This module is the one place these names are spelled. Core passes set them to hand decisions to the
target stages (the tiled form), targets read them; `verify` checks that every ``pbsdk.*`` attribute in a
module is one of these, of the right kind, with a well-formed value. Build and read them through the
helpers (``set_string``, ``string``, ...) or compare with the constants, never with literals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mlir import ir

from pbsdk.core.errors import CompileError

PREFIX = "pbsdk."


@dataclasses.dataclass(frozen=True)
class AttributeDef:
    """One pbsdk attribute: its full ``name``, the ``kind`` of value (``"string"``, ``"unit"``, ``"i64"``,
    ``"dict"``: plain data as a builtin dictionary attribute, see `to_attribute`),
    the ops it may sit on (empty: any), and an optional check of a string value (returns an error or
    None)."""

    name: str
    kind: str
    doc: str
    on: tuple[str, ...] = ()
    check: Callable[[str], str | None] | None = None


def _level_pair(value: str) -> str | None:
    parts = value.split("->")
    if len(parts) != 2 or not all(parts):
        return f"expected 'outer->inner' (two memory level names), got {value!r}"
    return None


def _one_of(*allowed: str) -> Callable[[str], str | None]:
    def check(value: str) -> str | None:
        return None if value in allowed else f"expected one of {', '.join(allowed)}, got {value!r}"
    return check


#: A unit-sized contraction op that one matrix-unit instruction computes; the value is the unit's name
#: in the spec (with `UNIT_OPERAND` and `UNIT_ACCUMULATOR`, which name the unit's dtypes).
MATRIX_UNIT = "pbsdk.matrix_unit"
UNIT_OPERAND = "pbsdk.unit_operand"
UNIT_ACCUMULATOR = "pbsdk.unit_accumulator"
#: An innermost compute op that no matrix unit serves: ``"vector-fma"`` (a contraction on the vector
#: unit's register tile), ``"scalar"`` (a contraction on a chip with neither a matrix unit for its dtype
#: nor a vector unit, e.g. f32 on a GPU spec) or ``"vector"`` (elementwise work on scratchpad tiles).
COMPUTE = "pbsdk.compute"
#: A copy between two memory levels (``"outer->inner"`` by level name).
DMA = "pbsdk.dma"
#: An ``scf.forall`` whose iterations run on the units of the named compute level (``spec.compute[i]``'s
#: name, e.g. ``"core"``): one iteration per unit; buffers allocated in its body are per unit.
COMPUTE_LEVEL = "pbsdk.compute_level"
#: A private function that is a fused attention kernel; the value is its descriptor as a dictionary
#: attribute (`pbsdk.core.ir.attention_tiles.descriptor`, ``version = 1``; `set_data`/`data`). A ``"scratchpad"`` one has the core's
#: tiled body (a target may replace it); a ``"lanes"`` one (``"form": "lanes"``) is a declaration whose
#: body the target builds from the descriptor (cpu: its ``attention`` stage), which then drops the mark.
ATTENTION = "pbsdk.attention"
#: A matrix-unit step whose A (m x k), B (k x n) or C (m x n) operand is stored transposed (nvgpu's
#: ``mma.sync`` functions: A as (k, m), B as (n, k), C as (n, m)).
A_TRANSPOSED = "pbsdk.a_transposed"
B_TRANSPOSED = "pbsdk.b_transposed"
C_TRANSPOSED = "pbsdk.c_transposed"
#: nvgpu scheduling tags: the index of a kernel's root op, of its launch, and ops one thread runs.
KERNEL = "pbsdk.kernel"
LAUNCH = "pbsdk.launch"
SINGLE_THREAD = "pbsdk.single_thread"
#: An argument of the entry function that is a constant operand, not a user input: the value is its
#: index among the constants handed to the driver next to the module (`pbsdk.core.compiler.compile_text`),
#: whose bytes never become IR (an argument attribute: `set_arg_i64`, `arg_i64`).
CONSTANT = "pbsdk.constant"
#: The entry function's workspace argument (`pbsdk.core.passes.plan_workspace`): the value is its size in
#: bytes; the loader allocates it once and passes it to every call (an argument attribute).
WORKSPACE = "pbsdk.workspace"

_DEFS = (
    AttributeDef(MATRIX_UNIT, "string", "one matrix-unit instruction of the named unit"),
    AttributeDef(UNIT_OPERAND, "string", "the matrix unit's operand dtype"),
    AttributeDef(UNIT_ACCUMULATOR, "string", "the matrix unit's accumulator dtype"),
    AttributeDef(COMPUTE, "string", "innermost compute without a matrix unit",
                 check=_one_of("vector-fma", "scalar", "vector")),
    AttributeDef(DMA, "string", "a copy between memory levels", on=("linalg.copy", "memref.copy"),
                 check=_level_pair),
    AttributeDef(COMPUTE_LEVEL, "string", "a parallel loop over the units of a compute level", on=("scf.forall",),
                 check=lambda v: None if v else "expected a compute level's name, got ''"),
    AttributeDef(ATTENTION, "dict", "a fused attention kernel's descriptor (\"lanes\": a declaration)",
                 on=("func.func",)),
    AttributeDef(A_TRANSPOSED, "unit", "A is stored transposed"),
    AttributeDef(B_TRANSPOSED, "unit", "B is read transposed"),
    AttributeDef(C_TRANSPOSED, "unit", "C is stored transposed"),
    AttributeDef(KERNEL, "i64", "nvgpu: a kernel root's index"),
    AttributeDef(LAUNCH, "i64", "nvgpu: a launch's index"),
    AttributeDef(SINGLE_THREAD, "unit", "nvgpu: run by one thread"),
    AttributeDef(CONSTANT, "i64", "an entry function argument that is constant operand i (argument attribute)"),
    AttributeDef(WORKSPACE, "i64", "the entry function's workspace argument, of this many bytes (argument attribute)"),
)

#: Every pbsdk attribute by name.
DEFINITIONS: dict[str, AttributeDef] = {d.name: d for d in _DEFS}


def set_string(op: ir.Operation | ir.OpView, name: str, value: str) -> None:
    """Set string attribute ``name`` (one of this module's constants) on ``op``."""
    _known(name, "string")
    with op.context:
        op.attributes[name] = ir.StringAttr.get(value)


def set_unit(op: ir.Operation | ir.OpView, name: str) -> None:
    _known(name, "unit")
    with op.context:
        op.attributes[name] = ir.UnitAttr.get()


def set_i64(op: ir.Operation | ir.OpView, name: str, value: int) -> None:
    _known(name, "i64")
    with op.context:
        op.attributes[name] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def to_attribute(value: Any) -> ir.Attribute:
    """Plain data (dicts with string keys, lists, str, bool, int, float, None) as builtin attributes:
    a dictionary, an array, a string, a bool, an i64, an f64 and a unit attribute (for None)."""
    if isinstance(value, dict):
        for k in value:
            if not isinstance(k, str):
                raise TypeError(f"dictionary keys must be strings, got {k!r}")
        return ir.DictAttr.get({k: to_attribute(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return ir.ArrayAttr.get([to_attribute(v) for v in value])
    if isinstance(value, bool):
        return ir.BoolAttr.get(value)
    if isinstance(value, int):
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    if isinstance(value, float):
        return ir.FloatAttr.get_f64(value)
    if isinstance(value, str):
        return ir.StringAttr.get(value)
    if value is None:
        return ir.UnitAttr.get()
    raise TypeError(f"no attribute for {type(value).__name__} {value!r}")


def from_attribute(attr: ir.Attribute) -> Any:
    """The plain data of a `to_attribute` attribute (its inverse); `TypeError` for any other attribute."""
    if isinstance(attr, ir.DictAttr):
        d = ir.DictAttr(attr)
        return {d[i].name: from_attribute(d[i].attr) for i in range(len(d))}
    if isinstance(attr, ir.ArrayAttr):
        return [from_attribute(a) for a in ir.ArrayAttr(attr)]
    if isinstance(attr, ir.BoolAttr):
        return ir.BoolAttr(attr).value
    if isinstance(attr, ir.IntegerAttr):
        return ir.IntegerAttr(attr).value
    if isinstance(attr, ir.FloatAttr):
        return ir.FloatAttr(attr).value
    if isinstance(attr, ir.StringAttr):
        return ir.StringAttr(attr).value
    if isinstance(attr, ir.UnitAttr):
        return None
    raise TypeError(f"not a plain-data attribute: {attr}")


def set_data(op: ir.Operation | ir.OpView, name: str, value: dict[str, Any]) -> None:
    """Set dictionary attribute ``name`` to plain data ``value`` (`to_attribute`)."""
    _known(name, "dict")
    with op.context:
        op.attributes[name] = to_attribute(value)


def data(op: ir.Operation | ir.OpView, name: str) -> dict[str, Any] | None:
    """The plain data of dictionary attribute ``name`` on ``op``, or None when it is absent; `TypeError`
    when the attribute is not a dictionary of plain data."""
    _known(name, "dict")
    if name not in op.attributes:
        return None
    attr = op.attributes[name]
    if not isinstance(attr, ir.DictAttr):
        raise TypeError(f"{name} must be a dictionary, got {attr}")
    return from_attribute(attr)  # type: ignore[no-any-return]


def string(op: ir.Operation | ir.OpView, name: str) -> str | None:
    """The value of string attribute ``name`` on ``op``, or None when it is absent."""
    _known(name, "string")
    if name not in op.attributes:
        return None
    return ir.StringAttr(op.attributes[name]).value


def has(op: ir.Operation | ir.OpView, name: str) -> bool:
    if name not in DEFINITIONS:
        raise KeyError(f"unknown pbsdk attribute {name!r}")
    return name in op.attributes


def i64(op: ir.Operation | ir.OpView, name: str) -> int | None:
    _known(name, "i64")
    if name not in op.attributes:
        return None
    return ir.IntegerAttr(op.attributes[name]).value


def set_arg_i64(fn: ir.Operation | ir.OpView, index: int, name: str, value: int, *,
                also: dict[str, ir.Attribute] | None = None) -> None:
    """Set i64 argument attribute ``name`` on argument ``index`` of function ``fn`` (with the other
    attributes in ``also``, e.g. upstream ``bufferization.writable``), keeping its other attributes."""
    _known(name, "i64")
    with fn.context:
        n = len(ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).inputs)
        old = ir.ArrayAttr(fn.attributes["arg_attrs"]) if "arg_attrs" in fn.attributes else None
        dicts = []
        for i in range(n):
            entries = {} if old is None or i >= len(old) else _entries(ir.DictAttr(old[i]))
            if i == index:
                entries.update(also or {})
                entries[name] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
            dicts.append(ir.DictAttr.get(entries))
        fn.attributes["arg_attrs"] = ir.ArrayAttr.get(dicts)


def arg_i64(fn: ir.Operation | ir.OpView, index: int, name: str) -> int | None:
    """The i64 argument attribute ``name`` of argument ``index`` of ``fn``, or None when it is absent."""
    _known(name, "i64")
    if "arg_attrs" not in fn.attributes:
        return None
    dicts = ir.ArrayAttr(fn.attributes["arg_attrs"])
    if index >= len(dicts):
        return None
    d = ir.DictAttr(dicts[index])
    return ir.IntegerAttr(d[name]).value if name in d else None


def _entries(d: ir.DictAttr) -> dict[str, ir.Attribute]:
    return {d[i].name: d[i].attr for i in range(len(d))}


def _known(name: str, kind: str) -> None:
    d = DEFINITIONS.get(name)
    if d is None:
        raise KeyError(f"unknown pbsdk attribute {name!r}; known: {', '.join(DEFINITIONS)}")
    if d.kind != kind:
        raise TypeError(f"pbsdk attribute {name} holds a {d.kind}, not a {kind}")


def problems(op: ir.Operation) -> list[str]:
    """What is wrong with ``op``'s pbsdk attributes (empty when nothing is)."""
    out: list[str] = []
    for i in range(len(op.attributes)):
        named = op.attributes[i]
        name = named.name
        if not name.startswith(PREFIX):
            continue
        d = DEFINITIONS.get(name)
        if d is None:
            out.append(f"unknown attribute {name} (known: {', '.join(DEFINITIONS)})")
            continue
        attr = named.attr
        if d.on and op.name not in d.on:
            out.append(f"{name} may only be set on {', '.join(d.on)}")
        if d.kind == "string":
            if not isinstance(attr, ir.StringAttr):
                out.append(f"{name} must be a string, got {attr}")
            elif d.check is not None:
                why = d.check(ir.StringAttr(attr).value)
                if why:
                    out.append(f"{name}: {why}")
        elif d.kind == "unit" and not isinstance(attr, ir.UnitAttr):
            out.append(f"{name} must be a unit attribute, got {attr}")
        elif d.kind == "i64" and not isinstance(attr, ir.IntegerAttr):
            out.append(f"{name} must be an integer, got {attr}")
        elif d.kind == "dict" and not isinstance(attr, ir.DictAttr):
            out.append(f"{name} must be a dictionary, got {str(attr)[:80]}")
    return out


def verify(module: ir.Module | ir.Operation) -> None:
    """Raise `CompileError` naming the op and the attribute at the first malformed pbsdk attribute."""
    root = module.operation if isinstance(module, ir.Module) else module
    found: list[tuple[str, str]] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        bad = problems(op)
        if bad:
            found.append((op.name, bad[0]))
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    if found:
        op_name, why = found[0]
        raise CompileError(f"malformed pbsdk attribute: {why}", op=op_name)
