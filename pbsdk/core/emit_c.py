"""Print a kernel module as portable C (C11), for chips whose own toolchain is a C compiler.

Not a general MLIR-to-C translator: it prints the few ops that remain once the tiled form
(docs/architecture.md) has been lowered to loops by a target's hooks (``Target.emit_after``) —

- ``func.func`` (a public one takes bare pointers for its memrefs, as the LLVM path's entries do; a
  declaration is an external C function: a chip's intrinsic, declared in the target's header), ``func.call``,
  ``func.return``;
- ``scf.for`` (with loop-carried values), ``scf.if``, ``scf.yield``;
- ``memref``: ``global``, ``get_global``, ``alloc``, ``alloca``, ``dealloc``, ``load``, ``store``, ``copy``,
  ``cast``, ``view``, ``dim``, ``reinterpret_cast``, ``extract_strided_metadata``,
  ``extract_aligned_pointer_as_index`` (views are expanded first: ``expand-strided-metadata``);
- ``arith`` and ``math`` on scalars.

It walks the bindings' op objects (no text is parsed) and refuses any other op with a `CEmitError` naming
it. Memory holds f16 and bf16 as ``uint16_t``; their scalars are ``float`` values rounded to the type after
every operation (``pb_round_f16``/``pb_round_bf16``), so the arithmetic is the type's. A memref value is
tracked here as (pointer, offset, sizes, strides) C expressions, so a view costs no C code; a load is
``p[offset + i0 * s0 + ...]``. Definitions of values the C never reads are dropped (the output compiles
warning-free with ``-Wall -Wextra``).
"""

from __future__ import annotations

import dataclasses
import math
import re
import struct
from collections.abc import Callable, Sequence
from typing import Any

from mlir import ir

from pbsdk.core.errors import UnsupportedError

__all__ = ["PREPARE", "PROLOGUE", "CEmitError", "c_symbol", "c_type", "prepare", "print_c"]


class CEmitError(UnsupportedError):
    """An op (or type) the C printer does not know; ``op`` names it."""


#: What every printed file starts with: the C headers it needs and pbsdk's small runtime (16-bit floats
#: kept as ``uint16_t``, rounding, NaN-propagating max/min, aligned allocation). ``static inline``, so an
#: unused helper costs nothing and draws no warning.
PROLOGUE = r"""#include <math.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static inline float pb_bf16_to_f32(uint16_t h) { uint32_t u = (uint32_t)h << 16; float f; memcpy(&f, &u, 4); return f; }
static inline uint16_t pb_f32_to_bf16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return (uint16_t)(u >> 16);
}
static inline float pb_f16_to_f32(uint16_t h) {
  uint32_t s = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, u;
  if (e == 0) { float f = (float)m * 5.9604644775390625e-08f; return s ? -f : f; }
  u = e == 31 ? (s | 0x7f800000u | (m << 13)) : (s | ((e + 112u) << 23) | (m << 13));
  float f; memcpy(&f, &u, 4); return f;
}
static inline uint16_t pb_f32_to_f16(float f) {
  uint32_t u; memcpy(&u, &f, 4);
  uint32_t s = (u >> 16) & 0x8000u, a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return (uint16_t)(s | 0x7e00u);
  if (a >= 0x477ff000u) return (uint16_t)(s | 0x7c00u);
  if (a < 0x38800000u) { float x; memcpy(&x, &a, 4); return (uint16_t)(s | (uint32_t)nearbyintf(x * 16777216.0f)); }
  return (uint16_t)(s | ((a + 0xfffu + ((a >> 13) & 1u) - 0x38000000u) >> 13));
}
static inline float pb_round_bf16(float f) { return pb_bf16_to_f32(pb_f32_to_bf16(f)); }
static inline float pb_round_f16(float f) { return pb_f16_to_f32(pb_f32_to_f16(f)); }
static inline float pb_maximumf(float a, float b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
static inline float pb_minimumf(float a, float b) { return (a != a || b != b) ? a + b : (a < b ? a : b); }
static inline double pb_maximum(double a, double b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }
static inline double pb_minimum(double a, double b) { return (a != a || b != b) ? a + b : (a < b ? a : b); }
static inline intptr_t pb_floordiv(intptr_t a, intptr_t b) { intptr_t q = a / b; return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q; }
static inline intptr_t pb_ceildiv(intptr_t a, intptr_t b) { intptr_t q = a / b; return (a % b != 0 && ((a < 0) == (b < 0))) ? q + 1 : q; }
static inline void *pb_alloc(size_t bytes, size_t align) {
  size_t a = align < sizeof(void *) ? sizeof(void *) : align;
  return aligned_alloc(a, bytes == 0 ? a : (bytes + a - 1) / a * a);
}
"""

_DYNAMIC = ir.ShapedType.get_dynamic_size()  # a dynamic size, stride or offset in static_* attributes
_VAR = re.compile(r"\bv\d+\b")
_CMPF = {0: "0", 1: "({a} == {b})", 2: "({a} > {b})", 3: "({a} >= {b})", 4: "({a} < {b})", 5: "({a} <= {b})",
         6: "({a} < {b} || {a} > {b})", 7: "({a} == {a} && {b} == {b})", 8: "!({a} < {b} || {a} > {b})",
         9: "!({a} <= {b})", 10: "!({a} < {b})", 11: "!({a} >= {b})", 12: "!({a} > {b})", 13: "({a} != {b})",
         14: "({a} != {a} || {b} != {b})", 15: "1"}
_CMPI = {0: "==", 1: "!=", 2: "<", 3: "<=", 4: ">", 5: ">=", 6: "<", 7: "<=", 8: ">", 9: ">="}
#: math op -> (f32 function, f64 function)
_MATH = {"exp": ("expf", "exp"), "log": ("logf", "log"), "sqrt": ("sqrtf", "sqrt"), "tanh": ("tanhf", "tanh"),
         "erf": ("erff", "erf"), "roundeven": ("nearbyintf", "nearbyint"), "absf": ("fabsf", "fabs"),
         "floor": ("floorf", "floor"), "ceil": ("ceilf", "ceil"), "round": ("roundf", "round"),
         "trunc": ("truncf", "trunc"), "sin": ("sinf", "sin"), "cos": ("cosf", "cos"), "log1p": ("log1pf", "log1p"),
         "expm1": ("expm1f", "expm1"), "log2": ("log2f", "log2"), "exp2": ("exp2f", "exp2"),
         "powf": ("powf", "pow"), "atan": ("atanf", "atan"), "atan2": ("atan2f", "atan2"),
         "copysign": ("copysignf", "copysign"), "fma": ("fmaf", "fma"), "erfc": ("erfcf", "erfc"),
         "log10": ("log10f", "log10"), "tan": ("tanf", "tan")}
#: arith ops that are one C expression of their operands ({0}, {1}, ...), signed where it matters.
_PLAIN = {"arith.negf": "-{0}", "arith.select": "{0} ? {1} : {2}", "arith.divsi": "{0} / {1}", "arith.remsi": "{0} % {1}",
          "arith.maxsi": "{0} > {1} ? {0} : {1}", "arith.minsi": "{0} < {1} ? {0} : {1}", "arith.shli": "{0} << {1}",
          "arith.shrsi": "{0} >> {1}"}
_FBIN = {"arith.addf": "+", "arith.subf": "-", "arith.mulf": "*", "arith.divf": "/"}
_IBIN = {"arith.addi": "+", "arith.subi": "-", "arith.muli": "*", "arith.andi": "&", "arith.ori": "|",
         "arith.xori": "^"}


def _is_16bit_float(t: ir.Type) -> str | None:
    if isinstance(t, ir.BF16Type):
        return "bf16"
    if isinstance(t, ir.F16Type):
        return "f16"
    return None


def c_type(t: ir.Type, *, storage: bool = False) -> str:
    """The C type of a scalar of MLIR type ``t`` (``storage``: as held in memory, where f16 and bf16 are
    ``uint16_t``). Raises `CEmitError` for another type."""
    if isinstance(t, ir.IndexType):
        return "intptr_t"
    if isinstance(t, ir.IntegerType):
        if t.width == 1:
            return "bool"
        if t.width in (8, 16, 32, 64):
            return f"int{t.width}_t"
    if isinstance(t, ir.F32Type):
        return "float"
    if isinstance(t, ir.F64Type):
        return "double"
    if _is_16bit_float(t):
        return "uint16_t" if storage else "float"
    raise CEmitError(f"the C printer has no C type for {t}")


def _unsigned(t: ir.Type) -> str:
    ct = c_type(t)
    return {"intptr_t": "uintptr_t", "bool": "bool"}.get(ct, "u" + ct)


def _float_literal(value: float, t: ir.Type) -> str:
    if math.isnan(value):
        return "NAN"
    if value in (float("inf"), float("-inf")):
        return "INFINITY" if value > 0 else "(-INFINITY)"
    text = repr(float(value))
    if "e" not in text and "." not in text:
        text += ".0"
    return text if isinstance(t, ir.F64Type) else text + "f"


def _storage_bits(value: float, kind: str) -> int:
    """The 16-bit pattern of an f16 or bf16 value (exactly representable: it came from such an attribute)."""
    if kind == "f16":
        return int(struct.unpack("<H", struct.pack("<e", value))[0])
    return int(struct.unpack("<I", struct.pack("<f", value))[0]) >> 16


@dataclasses.dataclass(frozen=True)
class _View:
    """A memref value as C expressions: the pointer (to the allocation's first element), the offset, sizes
    and strides in elements."""

    element: ir.Type
    pointer: str
    offset: str
    sizes: tuple[str, ...]
    strides: tuple[str, ...]

    def at(self, indices: Sequence[str]) -> str:
        terms = [] if self.offset == "0" else [self.offset]
        for i, s in zip(indices, self.strides):
            if i == "0":
                continue
            terms.append(i if s == "1" else f"{i} * {s}")
        return f"{self.pointer}[{' + '.join(terms) or '0'}]"


@dataclasses.dataclass
class _Line:
    text: str
    defines: str | None = None  # a pure definition of this variable, dropped when nothing reads it


def _static_view(t: ir.MemRefType, pointer: str, what: str) -> _View:
    strides, offset = t.get_strides_and_offset()
    if _DYNAMIC in (*strides, offset) or any(t.is_dynamic_dim(i) for i in range(t.rank)):
        raise CEmitError(f"{what} of type {t} has a dynamic layout or shape; the C printer takes static ones")
    return _View(t.element_type, pointer, str(offset), tuple(map(str, t.shape)), tuple(map(str, strides)))


class _FunctionPrinter:
    """Prints one ``func.func``'s body; ``values`` maps each SSA value to its C expression (scalars) or
    `_View` (memrefs)."""

    def __init__(self, functions: dict[str, str]) -> None:
        self.functions = functions  # MLIR symbol -> C name
        self.values: dict[ir.Value, str | _View] = {}
        self.types: dict[str, str] = {}  # C type of each variable an scf op carries
        self.lines: list[_Line] = []
        self.depth = 1
        self.counter = 0

    # ------------------------------------------------------------------ helpers
    def fresh(self) -> str:
        self.counter += 1
        return f"v{self.counter}"

    def emit(self, text: str, defines: str | None = None) -> None:
        self.lines.append(_Line("  " * self.depth + text, defines))

    def expr(self, v: ir.Value) -> str:
        got = self.values.get(v)
        if not isinstance(got, str):
            raise CEmitError(f"a value of type {v.type} is used before the C printer defined it")
        return got

    def view(self, v: ir.Value) -> _View:
        got = self.values.get(v)
        if not isinstance(got, _View):
            raise CEmitError(f"a memref of type {v.type} is used before the C printer defined it")
        return got

    def define(self, result: ir.Value, text: str, *, exact: bool = False) -> None:
        """``T vN = text;``, a pure definition; rounded to f16/bf16 where ``result`` is one, unless ``text``
        is ``exact`` (already of the type: a load, a select)."""
        kind = _is_16bit_float(result.type)
        if kind and not exact:
            text = f"pb_round_{kind}({text})"
        name = self.fresh()
        self.emit(f"{c_type(result.type)} {name} = {text};", defines=name)
        self.values[result] = name

    # ------------------------------------------------------------------ walking
    def block(self, block: ir.Block) -> None:
        for op in block.operations:
            self.op(op.operation)

    def op(self, op: ir.Operation) -> None:
        name = op.name
        handler = _HANDLERS.get(name)
        if handler is None:
            dialect = name.split(".", 1)[0]
            if name in _FBIN or name in _IBIN or (dialect in ("arith", "math")):
                handler = _scalar
            else:
                raise CEmitError(f"the C printer does not know op '{name}' (it prints func, scf, memref, arith and "
                                 "math ops of the tiled form lowered to loops)", op=name)
        handler(self, op)


def _scalar(p: _FunctionPrinter, op: ir.Operation) -> None:
    """arith and math ops on scalars."""
    name = op.name
    args = [p.expr(v) for v in op.operands]
    result = op.results[0]
    t = result.type
    if name in _FBIN:
        p.define(result, f"{args[0]} {_FBIN[name]} {args[1]}")
    elif name in _IBIN:
        if isinstance(t, ir.IndexType) or c_type(t) == "bool":
            p.define(result, f"{args[0]} {_IBIN[name]} {args[1]}")
        else:  # wrapping, as MLIR's integers
            u = _unsigned(t)
            p.define(result, f"({c_type(t)})(({u}){args[0]} {_IBIN[name]} ({u}){args[1]})")
    elif name.startswith("math."):
        _math(p, op, args)
    elif name == "arith.constant":  # a literal where it is used, no variable
        text = _arith(op, args)
        assert text is not None
        p.values[result] = f"({text})" if text.startswith("-") else text
    else:
        text = _arith(op, args)
        if text is None:
            raise CEmitError(f"the C printer does not know op '{name}'", op=name)
        p.define(result, text, exact=name in ("arith.select", "arith.extf", "arith.maximumf", "arith.minimumf",
                                              "arith.maxnumf", "arith.minnumf", "arith.negf"))


def _math(p: _FunctionPrinter, op: ir.Operation, args: list[str]) -> None:
    base = op.name.split(".", 1)[1]
    t = op.results[0].type
    double = isinstance(t, ir.F64Type)
    if base == "rsqrt":
        p.define(op.results[0], f"1.0 / sqrt({args[0]})" if double else f"1.0f / sqrtf({args[0]})")
        return
    if base not in _MATH:
        raise CEmitError(f"the C printer does not know op '{op.name}'", op=op.name)
    p.define(op.results[0], f"{_MATH[base][1 if double else 0]}({', '.join(args)})")


def _arith(op: ir.Operation, a: list[str]) -> str | None:
    name, t = op.name, op.results[0].type
    ct = c_type(t)
    src = op.operands[0].type if len(op.operands) else None
    if name == "arith.constant":
        attr = op.attributes["value"]
        if isinstance(attr, ir.FloatAttr):
            return _float_literal(ir.FloatAttr(attr).value, t)
        if isinstance(attr, ir.IntegerAttr):
            v = ir.IntegerAttr(attr).value
            if ct == "bool":
                return "true" if v & 1 else "false"
            return f"({ct})INT64_C({v})" if ct in ("int64_t", "intptr_t") and abs(v) > 2**31 - 1 else str(v)
        raise CEmitError(f"the C printer does not know constant {attr}", op=name)
    if name == "arith.cmpf":
        return _CMPF[ir.IntegerAttr(op.attributes["predicate"]).value].format(a=a[0], b=a[1])
    if name == "arith.cmpi":
        pred = ir.IntegerAttr(op.attributes["predicate"]).value
        if pred >= 6:
            u = _unsigned(op.operands[0].type)
            return f"({u}){a[0]} {_CMPI[pred]} ({u}){a[1]}"
        return f"{a[0]} {_CMPI[pred]} {a[1]}"
    if name in _PLAIN:
        return _PLAIN[name].format(*a)
    if name in ("arith.divui", "arith.remui", "arith.maxui", "arith.minui", "arith.shrui"):
        u = _unsigned(t)
        x, y = f"({u}){a[0]}", f"({u}){a[1]}"
        body = {"arith.divui": f"{x} / {y}", "arith.remui": f"{x} % {y}", "arith.shrui": f"{x} >> {y}",
                "arith.maxui": f"{x} > {y} ? {x} : {y}", "arith.minui": f"{x} < {y} ? {x} : {y}"}[name]
        return f"({ct})({body})"
    if name in ("arith.floordivsi", "arith.ceildivsi"):
        return f"({ct})pb_{name[6:-2]}({a[0]}, {a[1]})"
    double = isinstance(t, ir.F64Type)
    if name in ("arith.maximumf", "arith.minimumf"):
        return f"pb_{name[6:13]}{'' if double else 'f'}({a[0]}, {a[1]})"
    if name in ("arith.maxnumf", "arith.minnumf"):
        return f"f{name[6:9]}{'' if double else 'f'}({a[0]}, {a[1]})"
    if name == "arith.remf":
        return f"fmod{'' if double else 'f'}({a[0]}, {a[1]})"
    if name in ("arith.index_cast", "arith.extsi", "arith.sitofp", "arith.fptosi", "arith.extf", "arith.truncf",
                "arith.index_castui", "arith.extui", "arith.uitofp", "arith.fptoui", "arith.trunci"):
        return _cast(name, a[0], src, t)
    if name == "arith.bitcast":
        return None
    return None


def _cast(name: str, x: str, src: ir.Type | None, t: ir.Type) -> str:
    ct = c_type(t)
    assert src is not None
    if name in ("arith.index_castui", "arith.extui", "arith.uitofp"):
        if c_type(src) == "bool":
            return f"({ct}){x}"
        return f"({ct})({_unsigned(src)}){x}"
    if name == "arith.extsi" and c_type(src) == "bool":
        return f"-({ct}){x}"
    if name == "arith.fptoui":
        return f"({ct})({_unsigned(t)}){x}"
    if name == "arith.trunci" and ct != "bool":
        return f"({ct})({_unsigned(t)}){x}"
    if name == "arith.trunci":
        return f"({x} & 1) != 0"
    return f"({ct}){x}"


# ---------------------------------------------------------------------------------- func and scf

def _call(p: _FunctionPrinter, op: ir.Operation) -> None:
    callee = ir.FlatSymbolRefAttr(op.attributes["callee"]).value
    args = []
    for v in op.operands:
        if isinstance(v.type, ir.MemRefType):
            view = p.view(v)
            args.append(view.pointer if view.offset == "0" else f"{view.pointer} + {view.offset}")
        else:
            args.append(p.expr(v))
    call = f"{p.functions.get(callee, callee)}({', '.join(args)})"
    if len(op.results) > 1:
        raise CEmitError("a call with several results has no C form", op=op.name)
    if len(op.results) == 1 and list(op.results[0].uses):
        name = p.fresh()
        p.emit(f"{c_type(op.results[0].type)} {name} = {call};")
        p.values[op.results[0]] = name
    else:
        p.emit(f"{call};")


def _return(p: _FunctionPrinter, op: ir.Operation) -> None:
    if len(op.operands) > 1:
        raise CEmitError("a function returning several values has no C form", op=op.name)
    p.emit(f"return {p.expr(op.operands[0])};" if len(op.operands) else "return;")


def _carried(p: _FunctionPrinter, results: Sequence[ir.Value], inits: Sequence[str | None],
             args: Sequence[ir.Value] = ()) -> list[str | None]:
    """Variables for the values an scf op carries or returns (None where neither the result nor the
    block argument is read: nothing to keep)."""
    names: list[str | None] = []
    for i, r in enumerate(results):
        arg = args[i] if i < len(args) else None
        if not list(r.uses) and (arg is None or not list(arg.uses)):
            names.append(None)
            continue
        name = p.fresh()
        init = inits[i]
        p.types[name] = c_type(r.type)
        p.emit(f"{p.types[name]} {name}{'' if init is None else f' = {init}'};")
        p.values[r] = name
        if arg is not None:
            p.values[arg] = name
        names.append(name)
    return names


def _yield(p: _FunctionPrinter, block: ir.Block, names: Sequence[str | None]) -> None:
    """Print ``block`` but its ``scf.yield``, then assign the yielded values to ``names`` (through
    temporaries when there are several, as the assignment is simultaneous)."""
    ops = list(block.operations)
    for op in ops[:-1]:
        p.op(op.operation)
    yielded = [p.expr(v) for v in ops[-1].operation.operands] if names else []
    pairs = [(n, y) for n, y in zip(names, yielded) if n is not None and n != y]
    if len(pairs) > 1:
        temps = []
        for n, y in pairs:
            t = p.fresh()
            p.emit(f"{p.types[n]} {t} = {y};")
            temps.append((n, t))
        pairs = temps
    for n, y in pairs:
        p.emit(f"{n} = {y};")


def _for(p: _FunctionPrinter, op: ir.Operation) -> None:
    lb, ub, step, *inits = op.operands
    body = op.regions[0].blocks[0]
    iv, *args = list(body.arguments)
    names = _carried(p, op.results, [p.expr(v) for v in inits], args)
    v = p.fresh()
    p.values[iv] = v
    p.emit(f"for ({c_type(iv.type)} {v} = {p.expr(lb)}; {v} < {p.expr(ub)}; {v} += {p.expr(step)}) {{")
    p.depth += 1
    _yield(p, body, names)
    p.depth -= 1
    p.emit("}")


def _if(p: _FunctionPrinter, op: ir.Operation) -> None:
    names = _carried(p, op.results, [None] * len(op.results))
    p.emit(f"if ({p.expr(op.operands[0])}) {{")
    for i, region in enumerate(op.regions):
        if not region.blocks:
            continue
        if i == 1:
            p.emit("} else {")
        p.depth += 1
        _yield(p, region.blocks[0], names)
        p.depth -= 1
    p.emit("}")


# ---------------------------------------------------------------------------------- memref

def _dense_layout(p: _FunctionPrinter, t: ir.MemRefType,
                  dynamic: Any) -> tuple[tuple[str, ...], tuple[str, ...], str]:
    """The C expressions of a row-major buffer's sizes (``dynamic``: the values of its ``?`` sizes, in
    order), strides and element count."""
    dyn = iter(p.expr(v) for v in dynamic)
    sizes = tuple(next(dyn) if t.is_dynamic_dim(i) else str(t.shape[i]) for i in range(t.rank))
    strides: list[str] = []
    running = "1"
    for s in reversed(sizes):
        strides.insert(0, running)
        running = s if running == "1" else f"{running} * {s}"
    return sizes, tuple(strides), running


def _alloc(p: _FunctionPrinter, op: ir.Operation) -> None:
    t = ir.MemRefType(op.results[0].type)
    storage = c_type(t.element_type, storage=True)
    sizes, strides, running = _dense_layout(p, t, op.operands)
    name = p.fresh()
    align = ir.IntegerAttr(op.attributes["alignment"]).value if "alignment" in op.attributes else 16
    if op.name == "memref.alloca":
        if op.operands:
            raise CEmitError("a dynamically sized memref.alloca has no portable C form", op=op.name)
        p.emit(f"_Alignas({align}) {storage} {name}[{running}];")
    else:
        p.emit(f"{storage} *{name} = ({storage} *)pb_alloc(sizeof({storage}) * (size_t)({running}), {align});")
    p.values[op.results[0]] = _View(t.element_type, name, "0", sizes, strides)


def _dealloc(p: _FunctionPrinter, op: ir.Operation) -> None:
    p.emit(f"free({p.view(op.operands[0]).pointer});")


def _load(p: _FunctionPrinter, op: ir.Operation) -> None:
    view = p.view(op.operands[0])
    element = view.at([p.expr(v) for v in op.operands[1:]])
    kind = _is_16bit_float(view.element)
    p.define(op.results[0], f"pb_{kind}_to_f32({element})" if kind else element, exact=True)


def _store(p: _FunctionPrinter, op: ir.Operation) -> None:
    value, target, *indices = op.operands
    view = p.view(target)
    kind = _is_16bit_float(view.element)
    v = p.expr(value)
    p.emit(f"{view.at([p.expr(i) for i in indices])} = {f'pb_f32_to_{kind}({v})' if kind else v};")


def _copy(p: _FunctionPrinter, op: ir.Operation) -> None:
    src, dst = (p.view(v) for v in op.operands)
    indices = []
    for size in dst.sizes:
        i = p.fresh()
        p.emit(f"for (intptr_t {i} = 0; {i} < {size}; {i}++) {{")
        p.depth += 1
        indices.append(i)
    p.emit(f"{dst.at(indices)} = {src.at(indices)};")
    for _ in dst.sizes:
        p.depth -= 1
        p.emit("}")


def _get_global(p: _FunctionPrinter, op: ir.Operation) -> None:
    t = ir.MemRefType(op.results[0].type)
    name = _c_name(ir.FlatSymbolRefAttr(op.attributes["name"]).value)
    p.values[op.results[0]] = _static_view(t, name, f"global @{name}")


def _reinterpret_cast(p: _FunctionPrinter, op: ir.Operation) -> None:
    src = p.view(op.operands[0])
    rest = iter(p.expr(v) for v in op.operands[1:])

    def take(attr: str) -> tuple[str, ...]:
        return tuple(next(rest) if v == _DYNAMIC else str(v) for v in ir.DenseI64ArrayAttr(op.attributes[attr]))

    offsets, sizes, strides = take("static_offsets"), take("static_sizes"), take("static_strides")
    p.values[op.results[0]] = _View(src.element, src.pointer, offsets[0], sizes, strides)


def _metadata(p: _FunctionPrinter, op: ir.Operation) -> None:
    src = p.view(op.operands[0])
    base, offset, *rest = op.results
    p.values[base] = _View(src.element, src.pointer, "0", (), ())
    p.values[offset] = src.offset
    for r, e in zip(rest, (*src.sizes, *src.strides)):
        p.values[r] = e


def _pointer_as_index(p: _FunctionPrinter, op: ir.Operation) -> None:
    p.define(op.results[0], f"(intptr_t){p.view(op.operands[0]).pointer}")


def _cast_view(p: _FunctionPrinter, op: ir.Operation) -> None:
    p.values[op.results[0]] = p.view(op.operands[0])


def _view(p: _FunctionPrinter, op: ir.Operation) -> None:
    src = p.view(op.operands[0])
    t = ir.MemRefType(op.results[0].type)
    storage = c_type(t.element_type, storage=True)
    name = p.fresh()
    shift = p.expr(op.operands[1])
    p.emit(f"{storage} *{name} = ({storage} *)(void *)((char *){src.pointer} + {src.offset} + {shift});",
           defines=name)
    sizes, strides, _ = _dense_layout(p, t, list(op.operands)[2:])
    p.values[op.results[0]] = _View(t.element_type, name, "0", sizes, strides)


def _dim(p: _FunctionPrinter, op: ir.Operation) -> None:
    owner = op.operands[1].owner
    index_op = getattr(owner, "operation", owner)
    if getattr(index_op, "name", None) != "arith.constant":
        raise CEmitError("memref.dim of a dynamic dimension index has no C form here", op=op.name)
    p.values[op.results[0]] = p.view(op.operands[0]).sizes[ir.IntegerAttr(index_op.attributes["value"]).value]


_HANDLERS: dict[str, Callable[[_FunctionPrinter, ir.Operation], None]] = {
    "func.call": _call, "func.return": _return, "scf.for": _for, "scf.if": _if,
    "memref.alloc": _alloc, "memref.alloca": _alloc, "memref.dealloc": _dealloc, "memref.load": _load,
    "memref.store": _store, "memref.copy": _copy, "memref.get_global": _get_global,
    "memref.reinterpret_cast": _reinterpret_cast, "memref.extract_strided_metadata": _metadata,
    "memref.extract_aligned_pointer_as_index": _pointer_as_index, "memref.cast": _cast_view, "memref.view": _view,
    "memref.dim": _dim,
}


# ---------------------------------------------------------------------------------- module level

#: Names a C function cannot take (C11 keywords and ``main``); `c_symbol` prefixes them.
_RESERVED = frozenset(("auto", "break", "case", "char", "const", "continue", "default", "do", "double", "else", "enum",
                       "extern", "float", "for", "goto", "if", "inline", "int", "long", "main", "register", "restrict",
                       "return", "short", "signed", "sizeof", "static", "struct", "switch", "typedef", "union",
                       "unsigned", "void", "volatile", "while", "_Alignas", "_Alignof", "_Atomic", "_Bool", "_Complex",
                       "_Generic", "_Imaginary", "_Noreturn", "_Static_assert", "_Thread_local"))


def c_symbol(symbol: str) -> str:
    """The C name of MLIR symbol ``symbol``: characters C does not allow become ``_``, and a keyword or
    ``main`` (a kernel's usual entry name) gets the prefix ``pbsdk_``. A loader looks the entry up by it."""
    name = re.sub(r"[^A-Za-z0-9_]", "_", symbol)
    return f"pbsdk_{name}" if name in _RESERVED or name[:1].isdigit() else name


_c_name = c_symbol


def _public(op: ir.Operation) -> bool:
    if "sym_visibility" not in op.attributes:
        return True
    return ir.StringAttr(op.attributes["sym_visibility"]).value == "public"


def _global(op: ir.Operation) -> str:
    name = _c_name(ir.StringAttr(op.attributes["sym_name"]).value)
    t = ir.MemRefType(ir.TypeAttr(op.attributes["type"]).value)
    storage = c_type(t.element_type, storage=True)
    count = 1
    for d in t.shape:
        count *= d
    align = f"_Alignas({ir.IntegerAttr(op.attributes['alignment']).value}) " if "alignment" in op.attributes else ""
    init = ""
    if "initial_value" in op.attributes and isinstance(op.attributes["initial_value"], ir.DenseElementsAttr):
        init = " = " + _initializer(ir.DenseElementsAttr(op.attributes["initial_value"]), t.element_type, count)
    return f"{'' if _public(op) else 'static '}{align}{storage} {name}[{count}]{init};"


def _initializer(attr: ir.DenseElementsAttr, element: ir.Type, count: int) -> str:
    kind = _is_16bit_float(element)
    values: list[object]
    if attr.is_splat:
        values = [attr.get_splat_value()] * count
    elif isinstance(element, (ir.IntegerType, ir.IndexType)):
        ints = ir.DenseIntElementsAttr(attr)
        values = [ints[i] for i in range(count)]
    else:
        floats = ir.DenseFPElementsAttr(attr)
        values = [floats[i] for i in range(count)]
    out = []
    for v in values:
        if hasattr(v, "value"):
            v = v.value
        if kind:
            out.append(hex(_storage_bits(float(v), kind)))  # type: ignore[arg-type]
        elif isinstance(element, ir.IntegerType) and element.width == 1:
            out.append("true" if v else "false")
        elif isinstance(v, float):  # a float attribute's value
            out.append(_float_literal(v, element))
        else:
            out.append(str(int(v)))  # type: ignore[call-overload]
    if all(x in ("0", "0.0f", "0.0", "0x0", "false") for x in out):
        return "{0}"
    return "{" + ", ".join(out) + "}"


def _signature(fn: ir.Operation, c_name: str, names: Sequence[str] | None) -> str:
    ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
    if len(ftype.results) > 1:
        raise CEmitError(f"function @{c_name} returns several values, which has no C form", op="func.func")
    result = c_type(ftype.results[0]) if ftype.results else "void"
    params = []
    for i, t in enumerate(ftype.inputs):
        ct = f"{c_type(ir.MemRefType(t).element_type, storage=True)} *" if isinstance(t, ir.MemRefType) else c_type(t) + " "
        params.append(ct + (names[i] if names else f"p{i}"))
    return f"{result} {c_name}({', '.join(params) or 'void'})"


def _function(fn: ir.Operation, functions: dict[str, str]) -> list[str]:
    symbol = ir.StringAttr(fn.attributes["sym_name"]).value
    c_name = functions[symbol]
    block = fn.regions[0].blocks[0]
    if len(fn.regions[0].blocks) != 1:
        raise CEmitError(f"function @{symbol} has unstructured control flow (several blocks); the C printer "
                         "prints scf loops and conditionals", op="cf.br")
    p = _FunctionPrinter(functions)
    names = [f"arg{i}" for i in range(len(block.arguments))]
    for arg, name in zip(block.arguments, names):
        if isinstance(arg.type, ir.MemRefType):
            p.values[arg] = _static_view(ir.MemRefType(arg.type), name, f"argument {name} of @{symbol}")
        else:
            p.values[arg] = name
    for name in names:
        p.emit(f"(void){name};")
    p.block(block)
    _drop_unread(p.lines)
    head = ("" if _public(fn) else "static ") + _signature(fn, c_name, names)
    return [head + " {", *(line.text for line in p.lines), "}"]


def _drop_unread(lines: list[_Line]) -> None:
    """Remove pure definitions whose variable no other line reads, until none is left."""
    while True:
        reads: dict[str, int] = {}
        for line in lines:
            for var in _VAR.findall(line.text):
                reads[var] = reads.get(var, 0) + 1
        dead = [i for i, line in enumerate(lines) if line.defines is not None and reads.get(line.defines, 0) <= 1]
        if not dead:
            return
        for i in reversed(dead):
            del lines[i]


def print_c(module: ir.Module, *, includes: Sequence[str] = ()) -> str:
    """The C translation unit of ``module`` (see the module docstring). ``includes``: headers declaring
    the external functions the module calls (the chip's intrinsics), included after pbsdk's prologue;
    without them, the printer declares each external function itself from its MLIR type. Raises
    `CEmitError` naming the first op it does not know."""
    functions: dict[str, str] = {}
    out = [PROLOGUE]
    out.extend(f'#include "{h}"' for h in includes)
    body: list[str] = []
    with module.context:
        for top in module.body.operations:
            op = top.operation
            if op.name == "memref.global":
                body.append(_global(op))
            elif op.name == "func.func":
                symbol = ir.StringAttr(op.attributes["sym_name"]).value
                c_name = c_symbol(symbol)
                if c_name in functions.values():
                    raise CEmitError(f"two functions are named {c_name} in C (@{symbol})", op="func.func")
                functions[symbol] = c_name
                if not op.regions[0].blocks:  # an external function: the chip's intrinsic
                    if not includes:
                        body.append(_signature(op, c_name, None) + ";")
                    continue
                if not _public(op):
                    out.append(f"static {_signature(op, c_name, None)};")
                body.append("")
                body.extend(_function(op, functions))
            else:
                raise CEmitError(f"the C printer does not know op '{op.name}' at module level", op=op.name)
    return "\n".join([*out, "", *body]) + "\n"


#: What `prepare` runs: views become (pointer, offset, sizes, strides) arithmetic the printer follows.
PREPARE = "expand-strided-metadata, lower-affine, canonicalize, cse"


def prepare(module: ir.Module) -> None:
    """Rewrite ``module`` in place into the printer's input: subviews and reshapes expanded into
    ``memref.reinterpret_cast`` of their base (`PREPARE`), affine maps into arith, dead code removed."""
    from mlir import passmanager

    with module.context:
        passmanager.PassManager.parse(f"builtin.module({PREPARE})").run(module.operation)
