"""The target hook contract: what a target's lowering hooks receive, how they are called, and the check.

After the core's stages every kernel is in the tiled form (docs/architecture.md): tiles staged in
memory levels, copies between them, and on the innermost level a few abstract ops — one matrix-unit
instruction, a vector-unit operation on tiles. A target lowers exactly these through *hooks*: functions
that get a frozen description of one thing to lower (`UnitOp`, `DmaCopy`, `ScratchpadAlloc`,
`VectorTileOp`, `UnitStep`) and its operands as ``ir.Value``s, and build IR with the MLIR Python bindings
at the insertion point the target set up — never text, never SSA names.

Every hook is declared once, in `pbsdk.core.hook_contract` (MLIR-free, re-exported here: `HOOKS`, each
a `HookSpec` of name, positional parameters, what it returns and its contract; `check_hooks`).
A target names the object holding its hooks in ``Target.hooks`` (a module, a class of static methods, or
any object, e.g. ``types.SimpleNamespace``); `check_hooks` is run on it when the plugin is discovered:
a public function in it that is not a hook (a misspelt ``matrix_unit_opp``) or a hook that does not take
the declared parameters makes the plugin unusable with a `TargetError` naming it. A hooks module's
public helper functions are declared in ``__pbsdk_helpers__ = ("name", ...)`` (or named with a leading
``_``, which the check never reads). Classes and imported names are not checked.

The template target (`pbsdk.targets.template.hooks`) implements every hook but ``unit_step`` as an
emulation on the host and uses a plugin's hook exactly where the plugin implements it.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Protocol

from mlir import ir
from mlir.dialects import arith, func, memref

from pbsdk.core.hook_contract import HOOKS, HookSpec, check_hooks
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.spec import MatrixUnit, MemoryLevel

__all__ = ["HOOKS", "Counter", "DmaCopy", "HookSpec", "Lowering", "Pipeline", "ScratchpadAlloc", "UnitOp",
           "UnitStep", "VectorTileOp", "address", "bytes_per_element", "check_hooks", "convert", "element_type",
           "strides"]

#: A pass pipeline as ``PassManager.parse`` reads it, without the ``builtin.module(...)`` wrapper.
Pipeline = str


class Counter(Protocol):
    """A counter of the emulated chip a hook keeps (``op.count``, ``copy.count_bytes``, ...): calling it
    builds, at the insertion point, the IR that adds ``value`` — a Python ``int`` or an ``index``/integer
    ``ir.Value`` — to it. Each call builds fresh values, so a hook may count any number of times, inside
    loops too. A target that keeps no counters passes a callable that builds nothing."""

    def __call__(self, value: ir.Value | int = 1, /) -> None: ...


# ------------------------------------------------------------------------------------- IR helpers

_FLOATS = {"f64": ir.F64Type, "f32": ir.F32Type, "tf32": ir.FloatTF32Type, "f16": ir.F16Type, "bf16": ir.BF16Type,
           "f8e4m3": ir.Float8E4M3FNType, "f8e5m2": ir.Float8E5M2Type}


def element_type(dtype: str) -> ir.Type:
    """The MLIR element type of a spec dtype name (``"bf16"`` -> ``bf16``, ``"i8"`` -> ``i8``)."""
    if dtype in _FLOATS:
        return _FLOATS[dtype].get()
    if dtype.startswith("i") and dtype[1:].isdigit():
        return ir.IntegerType.get_signless(int(dtype[1:]))
    raise ValueError(f"unknown dtype {dtype!r}")


def convert(value: ir.Value, to: ir.Type) -> ir.Value:
    """``value`` as a scalar of type ``to``, built at the insertion point: floats are extended or rounded
    (between two 16-bit formats through f32), integers sign-extended or truncated, and between the two
    kinds converted as signed. Returns ``value`` itself when the type is already ``to``."""
    src = value.type
    if src == to:
        return value
    if isinstance(src, ir.FloatType) and isinstance(to, ir.FloatType):
        if src.width == to.width:
            return arith.truncf(to, arith.extf(ir.F32Type.get(), value))
        return arith.extf(to, value) if src.width < to.width else arith.truncf(to, value)
    if isinstance(src, ir.IntegerType) and isinstance(to, ir.IntegerType):
        return arith.extsi(to, value) if src.width < to.width else arith.trunci(to, value)
    if isinstance(src, ir.IntegerType) and isinstance(to, ir.FloatType):
        return arith.sitofp(to, value)
    if isinstance(src, ir.FloatType) and isinstance(to, ir.IntegerType):
        return arith.fptosi(to, value)
    raise TypeError(f"cannot convert a value of type {src} to {to}")


def bytes_per_element(t: ir.Type) -> int:
    """Bytes one element of type ``t`` occupies in memory (``index``: the host's word)."""
    width = t.width if isinstance(t, ir.FloatType | ir.IntegerType) else 64  # index: the host's word
    return max(1, (width + 7) // 8)


def address(buffer: ir.Value) -> ir.Value:
    """Build the byte address (``index``) of the first element of ``buffer`` (a memref view, any layout):
    what an intrinsic wrapper or a DMA descriptor takes instead of a memref."""
    t = ir.MemRefType(buffer.type)
    index = ir.IndexType.get()
    offset = memref.ExtractStridedMetadataOp(buffer).offset
    element_bytes = arith.constant(index, bytes_per_element(t.element_type))
    return arith.addi(memref.extract_aligned_pointer_as_index(buffer), arith.muli(offset, element_bytes))


def strides(buffer: ir.Value) -> list[ir.Value]:
    """Build the strides (``index``, in elements) of ``buffer``, one per dimension."""
    return list(memref.ExtractStridedMetadataOp(buffer).strides)


# ------------------------------------------------------------------------------ what the hooks get

@dataclasses.dataclass(frozen=True, kw_only=True)
class Lowering:
    """What every IR-building hook's description has: the module being lowered, to declare symbols in."""

    module: ir.Module = dataclasses.field(repr=False, compare=False)

    def declare(self, name: str, inputs: Sequence[ir.Type], results: Sequence[ir.Type] = ()) -> func.FuncOp:
        """The module's ``func.func private @name`` of type ``(inputs) -> results``: a declaration (an
        external symbol: the chip's intrinsic wrapper, resolved when the code is linked or loaded) the
        first time, the same op afterwards. Call it with ``func.CallOp(fn, args)``; to define it in IR
        instead, give it a body when ``not fn.body.blocks`` (``fn.add_entry_block()``). The same name
        with another type is an error."""
        ftype = ir.FunctionType.get(list(inputs), list(results))
        table = ir.SymbolTable(self.module.operation)
        if name in table:
            found = table[name]
            if not isinstance(found, func.FuncOp) or ir.TypeAttr(found.attributes["function_type"]).value != ftype:
                raise ValueError(f"symbol @{name} already exists and is not a func.func of type {ftype}")
            return found
        with ir.InsertionPoint(self.module.body):
            return func.FuncOp(name, ftype, visibility="private")

    def at_module_level(self) -> ir.InsertionPoint:
        """An insertion point at the top of the module, for globals a hook needs (``memref.GlobalOp``)."""
        return ir.InsertionPoint.at_block_begin(self.module.body)


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnitOp(Lowering):
    """One matrix-unit instruction to implement: ``C[m, n] += A[m, k] * B[k, n]`` at the unit's shape.

    The hook gets A, B, C as ``memref`` values: views into the innermost scratchpad, exactly the unit's
    shape, in the level's memory space (``a_type``, ``b_type``, ``c_type``; their element types are
    ``a_dtype``, ``b_dtype``, ``c_dtype``). ``indexing_maps`` (A, B, C) and ``iterator_types``
    (``"parallel"``/``"reduction"`` per loop) are the contraction's: they say which operand dimension is
    m, n, k or batch, and whether B is read transposed. ``operand_dtype``/``accumulator_dtype`` are the
    unit's (``unit`` has them as spec names, and m, n, k). ``count(n=1)`` adds to the
    ``matrix_unit:<unit>`` counter."""

    unit: MatrixUnit
    a_type: ir.MemRefType
    b_type: ir.MemRefType
    c_type: ir.MemRefType
    a_dtype: ir.Type
    b_dtype: ir.Type
    c_dtype: ir.Type
    operand_dtype: ir.Type
    accumulator_dtype: ir.Type
    indexing_maps: tuple[ir.AffineMap, ir.AffineMap, ir.AffineMap]
    iterator_types: tuple[str, ...]
    count: Counter

    def multiply_accumulate(self, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
        """Build the unit's arithmetic on one element, at the insertion point: ``x`` (of A) and ``y`` (of
        B) rounded to ``operand_dtype``, their product added to ``z`` (of C) in ``accumulator_dtype``;
        the result in C's dtype."""
        acc = self.accumulator_dtype
        xa = convert(convert(x, self.operand_dtype), acc)
        ya = convert(convert(y, self.operand_dtype), acc)
        if isinstance(acc, ir.FloatType):
            s = arith.addf(convert(z, acc), arith.mulf(xa, ya))
        else:
            s = arith.addi(convert(z, acc), arith.muli(xa, ya))
        return convert(s, self.c_dtype)


@dataclasses.dataclass(frozen=True, kw_only=True)
class UnitStep(Lowering):
    """One matrix-unit instruction on register values (a cache-hierarchy chip's micro-kernel step):
    acc' = acc + A x B at the unit's shape, operands as the unit holds them (vectors for a dot-product
    unit such as AVX512-BF16's vdpbf16ps, tiles for AMX).

    ``unit`` is the spec's `MatrixUnit` (m, n, k, operand and accumulator dtypes); ``acc_type``,
    ``a_type`` and ``b_type`` are the types of the values the hook receives (e.g. ``vector<16xf32>``,
    ``vector<32xbf16>``). The hook returns the new accumulator, a value of ``acc_type``."""

    unit: MatrixUnit
    acc_type: ir.Type
    a_type: ir.Type
    b_type: ir.Type


@dataclasses.dataclass(frozen=True, kw_only=True)
class DmaCopy(Lowering):
    """One copy between memory levels: a tile of ``src_type`` (level ``src_level``) into one of
    ``dst_type`` (level ``dst_level``), same shape, element type ``element_type``. ``shape`` has None
    for a dynamic size (a partial tile at the problem's edge). Nothing says what the copy is for: the
    tiles of contractions, attention and elementwise chains all move this way.

    ``count_bytes(v)`` adds ``v`` (an int or an index value) to the ``bytes:<src>-><dst>`` counter;
    ``byte_count()`` builds the number of bytes the copy moves as an ``index`` value (``memref.dim`` of
    ``source`` for the dynamic sizes)."""

    src_level: MemoryLevel
    dst_level: MemoryLevel
    src_type: ir.MemRefType
    dst_type: ir.MemRefType
    element_type: ir.Type
    shape: tuple[int | None, ...]
    count_bytes: Counter
    #: The copy's source as the hook receives it: what ``byte_count`` measures.
    source: ir.Value = dataclasses.field(repr=False, compare=False)

    def byte_count(self) -> ir.Value:
        """Build the copy's size in bytes (``index``) at the insertion point."""
        index = ir.IndexType.get()
        static = bytes_per_element(self.element_type) * math.prod(d for d in self.shape if d is not None)
        total = arith.constant(index, static)
        for i, d in enumerate(self.shape):
            if d is None:
                total = arith.muli(total, memref.dim(self.source, arith.constant(index, i)))
        return total


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScratchpadAlloc(Lowering):
    """One scratchpad buffer of the promoted code: its level, memory space, type, alignment and size in
    bytes, and a byte ``offset`` in the level at which it overlaps no other buffer of that level live at
    the same time (first fit in program order within its function; the core checked that the buffers
    live together fit the level)."""

    level: MemoryLevel
    space: int
    type: ir.MemRefType
    alignment: int
    size: int
    offset: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class VectorTileOp(Lowering):
    """One operation of the vector unit on scratchpad tiles: elementwise work with broadcasts, a
    reduction, a fill (ops the core marked ``pbsdk.compute = "vector"``), or, where no matrix unit serves a
    contraction's dtype, its innermost tile (``kind = "vector-fma"``).

    It is lowered *in place*: the hook is called with the insertion point just before the op and the
    op's location active, receives the op's operands (tiles of ``level``, of types ``operand_types``; the
    first ``inputs`` are read, the rest written), and builds the computation there; the target then
    erases the op. ``op_name`` (``linalg.generic``, ``linalg.fill``, ...), ``indexing_maps`` and
    ``iterator_types`` (empty for a fill) describe what it computes; ``emulate(operands)`` builds the same
    op on ``operands`` (the host's version), ``iterations()`` the number of points of its iteration domain
    (an ``index`` value), and ``count_elements(n)`` adds to the ``vector:<level>`` counter."""

    kind: str
    level: MemoryLevel
    op_name: str
    operand_types: tuple[ir.Type, ...]
    inputs: int
    indexing_maps: tuple[ir.AffineMap, ...]
    iterator_types: tuple[str, ...]
    count_elements: Counter
    #: The marked op itself (what ``emulate`` clones); a hook that builds its own code need not read it.
    original: ir.Operation = dataclasses.field(repr=False, compare=False)
    #: ``count_instructions(name)`` is the ``vector_op:<name>`` counter: vector instructions of one kind
    #: (``fma``, ``load``, ``store``, ``broadcast``, an arithmetic op's name) the hook built, for a chip whose
    #: vector unit is modelled per instruction (cache-only chips); None where the target keeps no such counters.
    count_instructions: Callable[[str], Counter] | None = dataclasses.field(default=None, repr=False, compare=False)

    def emulate(self, operands: Sequence[ir.Value]) -> ir.Operation:
        """Build the marked op again at the insertion point, on ``operands``, without its mark."""
        clone = self.original.clone()
        for i, v in enumerate(operands):
            clone.operands[i] = v
        op = clone.operation if hasattr(clone, "operation") else clone
        if attrs.has(op, attrs.COMPUTE):
            del op.attributes[attrs.COMPUTE]
        return op

    def iterations(self) -> ir.Value:
        """Build the number of points the op iterates over (``index``): each loop's extent is read off the
        first operand dimension indexed by exactly that loop (``memref.dim`` when it is dynamic); a fill
        iterates over its output."""
        index = ir.IndexType.get()
        operands = list(self.original.operands)
        if not self.indexing_maps:  # a fill: its output's elements
            out = operands[-1]
            dims = [(out, d) for d in range(ir.MemRefType(out.type).rank)]
        else:
            dims = []
            for loop in range(len(self.iterator_types)):
                found = next(((v, j) for v, m in zip(operands, self.indexing_maps)
                              for j, e in enumerate(m.results)
                              if isinstance(e, ir.AffineDimExpr) and e.position == loop), None)
                if found is not None:
                    dims.append(found)
        dynamic: ir.Value | None = None
        static = 1
        for v, j in dims:
            t = ir.MemRefType(v.type)
            if t.is_dynamic_dim(j):
                size = memref.dim(v, arith.constant(index, j))
                dynamic = size if dynamic is None else arith.muli(dynamic, size)
            else:
                static *= t.shape[j]
        if dynamic is None:
            return arith.constant(index, static)
        return arith.muli(dynamic, arith.constant(index, static)) if static != 1 else dynamic
