"""Pass ``outline`` (cpu): each loop nest of a long function body becomes its own function, built once.

A whole model's fused ops end up in one function: a GPT-2 of 2 layers gives ~100 top-level loop nests and
6,400 lines of LLVM IR in it, 4 layers 10,500. LLVM's optimiser is superlinear in the size of one function
(IndVarSimplify took 75% of ``opt -O3`` on it; 1.6x the lines took 4.3x the time), so compiling 12 layers
took minutes. This pass moves every top-level op that carries a loop nest (an op with regions, or a copy)
of a function with at least `MIN_NESTS` of them into a private function of its own (unless it reads a
buffer whose sizes or strides are known only at run time, which the bare-pointer convention cannot pass), called in its place,
marked ``noinline`` so that LLVM optimises it alone; then identical nests (the same op on the same types,
as in repeated layers) are merged by `DedupeFunctions`, so each is optimised and generated once.

A nest's free values become the new function's arguments, except ``arith.constant`` scalars and vectors,
which are cloned into it (so that identical nests stay identical and LLVM still folds them). Ops with
results are left in place. The analysis (`nests`, `free_values`) only reads the IR.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import func

from pbsdk.core.passes import layout_at_run_time
from pbsdk.core.passes.dedupe_functions import DedupeFunctions

#: Fewest loop nests in one function body for the pass to outline them (small kernels stay as they are).
MIN_NESTS = 8
#: Top-level ops without regions that still become loops.
_COPIES = frozenset({"memref.copy", "linalg.copy"})
_NOT_NESTS = frozenset({"func.call", "func.return", "memref.alloc", "memref.dealloc", "memref.alloca"})


def nests(block: ir.Block) -> list[ir.Operation]:
    """The top-level ops of ``block`` the pass outlines: no results, and a region or a copy."""
    out = []
    for op in block.operations:
        op = op.operation
        if op.name in _NOT_NESTS or len(op.results):
            continue
        if len(op.regions) or op.name in _COPIES:
            out.append(op)
    return out


def _inside(op: ir.Operation) -> tuple[list[ir.Operation], list[ir.Block]]:
    ops: list[ir.Operation] = []
    blocks: list[ir.Block] = []

    def visit(o: Any) -> Any:
        o = o.operation if hasattr(o, "operation") else o
        ops.append(o)
        for region in o.regions:
            blocks.extend(region.blocks)
        return ir.WalkResult.ADVANCE

    op.walk(visit)
    return ops, blocks


def free_values(op: ir.Operation) -> list[ir.Value]:
    """The values ``op`` and the ops nested in it use but do not define, in first-use order."""
    ops, blocks = _inside(op)
    defined = {r for o in ops for r in o.results} | {a for b in blocks for a in b.arguments}
    free: dict[ir.Value, None] = {}  # ordered set (values hash and compare as the SSA value they are)
    for o in ops:
        free.update((v, None) for v in o.operands if v not in defined)
    return list(free)


def _constant(v: ir.Value) -> ir.Operation | None:
    owner = getattr(v.owner, "operation", v.owner)
    if isinstance(owner, ir.Operation) and owner.name == "arith.constant" and \
            not isinstance(v.type, ir.MemRefType):
        return owner
    return None


def passes_bare(t: ir.Type) -> bool:
    """Whether a value of type ``t`` can be a function argument under the cpu target's bare-pointer calling
    convention: not a memref, or one of static sizes, strides and offset. A nest that uses any other
    buffer (a dynamic size read at run time: `pbsdk.core.passes.dynamic_sizes`) stays where it is."""
    if not isinstance(t, ir.MemRefType):
        return True
    return ir.MemRefType(t).has_static_shape and not layout_at_run_time(t)


@dataclasses.dataclass(frozen=True)
class OutlineLoopNests:
    """No options."""

    name = "outline"

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        count = 0
        for f in list(module.body.operations):
            f = f.operation
            if f.name != "func.func" or not len(f.regions[0].blocks):
                continue
            block = f.regions[0].blocks[0]
            found = nests(block)
            if len(found) < MIN_NESTS:
                continue
            for op in found:
                if all(passes_bare(v.type) for v in free_values(op)):
                    self._outline(module, op, f"__pbsdk_nest_{count}")
                    count += 1
        if count:
            DedupeFunctions().apply(module)

    @staticmethod
    def _outline(module: ir.Module, op: ir.Operation, name: str) -> None:
        free = free_values(op)
        args = [v for v in free if _constant(v) is None]
        with op.location:
            with ir.InsertionPoint(op):
                func.CallOp([], ir.FlatSymbolRefAttr.get(name), args)
            with ir.InsertionPoint(module.body):
                fn = func.FuncOp(name, ([v.type for v in args], []), visibility="private")
                fn.attributes["passthrough"] = ir.ArrayAttr.get([ir.StringAttr.get("noinline")])
            entry = fn.add_entry_block()
            mapping: dict[ir.Value, ir.Value] = dict(zip(args, entry.arguments))
            with ir.InsertionPoint(entry):
                for v in free:
                    const = _constant(v)
                    if const is not None:
                        mapping[v] = const.clone().results[0]
                ret = func.ReturnOp([])
        op.detach_from_parent()
        ir.InsertionPoint(ret).insert(op)
        ops, _ = _inside(op)
        for o in ops:
            for i, v in enumerate(o.operands):
                if v in mapping:
                    o.operands[i] = mapping[v]
