"""Pass ``dedupe-functions``: private functions that are the same function become one.

A model repeats its layers: ResNet-50's 16 bottleneck blocks are 53 convolutions of about 20 distinct
shapes, and GPT-2's 12 blocks are one block twelve times. With the weights passed as operands (never
printed), the kernels the core isolates for repeated layers — ``@__pbsdk_contractionN`` with their
epilogues, fused attention declarations ``@__pbsdk_attnN`` — are identical but for their names, and each
would otherwise be built, optimised and compiled to machine code again. Two private functions are the
same when their printed forms are equal with their own names blanked: functions with a body, and
declarations that carry a ``pbsdk.attention`` descriptor (whose body the target builds from it alone;
other declarations are distinct external symbols). Every call of a duplicate then calls the first one,
and the duplicate is erased. Repeated until nothing merges, so callers of merged functions merge in turn.
Run early (small functions print fast), it also saves the stages after it their work on duplicates.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mlir import ir

from pbsdk.core.ir import attributes


@dataclasses.dataclass(frozen=True)
class DedupeFunctions:
    """No options."""

    name = "dedupe-functions"

    def apply(self, module: ir.Module, _ctx: Any = None) -> None:
        while _merge_once(module):
            pass


def _private_or_attention(op: ir.Operation) -> bool:
    if len(op.regions[0].blocks) == 0 and not attributes.has(op, attributes.ATTENTION):
        return False
    return "sym_visibility" in op.attributes and \
        ir.StringAttr(op.attributes["sym_visibility"]).value == "private"


def _merge_once(module: ir.Module) -> bool:
    return merge_identical(module, _private_or_attention)


def merge_identical(module: ir.Module, select: Callable[[ir.Operation], bool]) -> bool:
    """Merge the ``func.func`` ops ``select`` picks that print the same with their own names blanked: every
    use of a duplicate names the first one, and the duplicate is erased. Whether any merged."""
    groups: dict[str, list[tuple[str, ir.Operation]]] = {}
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or not select(op):
            continue
        name = ir.StringAttr(op.attributes["sym_name"]).value
        text = op.get_asm(assume_verified=True, use_local_scope=True).replace(f"@{name}(", "@(", 1)
        groups.setdefault(text, []).append((name, op))
    merged = False
    for same in groups.values():
        keep = same[0][0]
        for name, op in same[1:]:
            ir.SymbolTable.replace_all_symbol_uses(name, keep, module.operation)
            op.erase()
            merged = True
    return merged
