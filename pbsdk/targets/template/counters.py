"""The emulated chip's counters: one public global of ``MAX_COUNTERS`` x i64, and a typed `Counter` per name.

Counters live in ``memref.global @__pbsdk_counters`` (built by `declare_counters`); a counter's index is
its position in the compile's list of names (``ctx.notes["counters"]``: ``matrix_unit:<unit>``,
``bytes:<from>-><to>``), which the artifact carries in ``metadata["counters"]``. A name gets its index the
first time IR counting it is built, so a hook that never counts leaves no counter behind (the
conformance suite then reports the unit as never issued).
"""

from __future__ import annotations

from collections.abc import MutableSequence

from mlir import ir
from mlir.dialects import arith, memref

from pbsdk.core.errors import CompileError

COUNTERS_GLOBAL = "__pbsdk_counters"
MAX_COUNTERS = 64


def _i64() -> ir.IntegerType:
    return ir.IntegerType.get_signless(64)


def counters_type() -> ir.MemRefType:
    """``memref<MAX_COUNTERS x i64>`` (needs an active context)."""
    return ir.MemRefType.get([MAX_COUNTERS], _i64())


def declare_counters(module: ir.Module) -> None:
    """Add the counters global (zero-initialised, public) at the top of ``module`` unless it is there."""
    if COUNTERS_GLOBAL in ir.SymbolTable(module.operation):
        return
    with module.context, ir.Location.unknown(), ir.InsertionPoint.at_block_begin(module.body):
        zeros = ir.DenseElementsAttr.get_splat(ir.RankedTensorType.get([MAX_COUNTERS], _i64()),
                                               ir.IntegerAttr.get(_i64(), 0))
        memref.GlobalOp(sym_name=COUNTERS_GLOBAL, type_=ir.TypeAttr.get(counters_type()), initial_value=zeros)


class Counter:
    """One named counter (what the hook contract's `pbsdk.core.hooks.Counter` fields hold in the emulator). ``counter(value)`` builds, at the current insertion point and location, the IR
    that adds ``value`` to it: a Python ``int`` (a constant) or an ``ir.Value`` of type ``index`` or a
    signless integer (zero-extended to i64). Every call builds fresh values, so a hook may count any
    number of times, in any block (inside a loop it counts once per iteration)."""

    __slots__ = ("_names", "name")

    def __init__(self, name: str, names: MutableSequence[str]) -> None:
        self.name = name
        self._names = names  # the compile's counter names: the position is the index in the global

    def __repr__(self) -> str:
        return f"Counter({self.name!r})"

    def index(self) -> int:
        """This counter's slot in the global (allocated on first use)."""
        if self.name not in self._names:
            if len(self._names) >= MAX_COUNTERS:
                raise CompileError(f"more than {MAX_COUNTERS} counters (adding '{self.name}')")
            self._names.append(self.name)
        return self._names.index(self.name)

    def __call__(self, value: ir.Value | int = 1) -> None:
        increment = _as_i64(value)
        counters = memref.get_global(counters_type(), COUNTERS_GLOBAL)
        slot = arith.constant(ir.IndexType.get(), self.index())
        old = memref.load(counters, [slot])
        memref.store(arith.addi(old, increment), counters, [slot])


def _as_i64(value: ir.Value | int) -> ir.Value:
    if isinstance(value, int):
        return arith.constant(_i64(), value)
    t = value.type
    if isinstance(t, ir.IndexType):
        return arith.index_cast(_i64(), value)
    if isinstance(t, ir.IntegerType) and t.width <= 64:
        return value if t.width == 64 else arith.extui(_i64(), value)
    raise TypeError(f"a counter adds an int, an index or an integer of at most 64 bits, not a value of type {t}")
