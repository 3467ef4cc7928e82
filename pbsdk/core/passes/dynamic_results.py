"""Pass ``dynamic-results``: a private function's dynamically sized result buffer allocated by its callers.

Upstream ``buffer-results-to-out-params`` turns results into output arguments the caller allocates, but
not a result of dynamic size ("cannot create out param for dynamically shaped result"): the caller would
need the size. Here the size is known at the call when the result is a ``memref.alloc`` in the function's
entry block whose every dynamic size is an ``index`` argument of the function or a ``memref.dim`` (at a
constant) of a buffer argument: each call site then allocates the buffer with the same sizes taken from
its own operands, passes it as a new last argument, and reads it where it read the result; the function
writes into that argument instead of allocating. So the kernels of a dynamic graph (`isolate-contractions`'
functions) take their outputs like static ones do. A result whose size is anything else is a
`DynamicShapeError`. Runs on buffers, before ``out-params``; public functions (the entry) are left to it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import arith, memref

from pbsdk.core.errors import DynamicShapeError
from pbsdk.core.passes import defining_op, match_signature, ops_named

# How a call site gets one size: ("arg", i) the call's operand i; ("dim", i, d) the size d of operand i.
_Size = tuple[Any, ...]


def _sizes_at_call(alloc: ir.Operation, args: list[ir.Value], name: str) -> list[_Size]:
    out: list[_Size] = []
    for size in alloc.operands:
        if size in args:
            out.append(("arg", args.index(size)))
            continue
        dim = defining_op(size)
        index = defining_op(dim.operands[1]) if dim is not None and dim.name == "memref.dim" else None
        if (dim is not None and index is not None and index.name == "arith.constant"
                and dim.operands[0] in args):
            out.append(("dim", args.index(dim.operands[0]), ir.IntegerAttr(index.attributes["value"]).value))
            continue
        raise DynamicShapeError(f"@{name} returns a buffer of dynamic size that its callers cannot compute "
                                f"from the arguments ({size})", op="func.func")
    return out


@dataclasses.dataclass(frozen=True)
class DynamicResults:
    """Dynamically sized results of private functions as caller-allocated last arguments (see above)."""

    name = "dynamic-results"

    def apply(self, module: ir.Module, ctx: Any = None) -> None:
        rewritten: dict[str, tuple[list[int], list[list[_Size]]]] = {}
        with module.context, ir.Location.unknown():
            for fn in ops_named(module, "func.func"):
                ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
                dynamic = [i for i, t in enumerate(ftype.results)
                           if isinstance(t, ir.MemRefType) and not ir.MemRefType(t).has_static_shape]
                private = "sym_visibility" in fn.attributes and \
                    ir.StringAttr(fn.attributes["sym_visibility"]).value == "private"
                if not dynamic or not private or not len(fn.regions[0].blocks):
                    continue
                name = ir.StringAttr(fn.attributes["sym_name"]).value
                if len(fn.regions[0].blocks) != 1:
                    raise DynamicShapeError(f"@{name} returns a dynamic buffer from more than one block",
                                            op="func.func")
                block = fn.regions[0].blocks[0]
                ret = list(block.operations)[-1]
                args = list(block.arguments)
                plans = []
                for i in dynamic:
                    alloc = defining_op(ret.operands[i])
                    if alloc is None or alloc.name != "memref.alloc" or alloc.parent != fn:
                        raise DynamicShapeError(f"@{name}'s result {i} is a dynamic buffer it does not allocate "
                                                "itself", op="func.func")
                    plans.append(_sizes_at_call(alloc, args, name))
                    out = block.add_argument(alloc.results[0].type, alloc.location)
                    alloc.results[0].replace_all_uses_with(out)
                    alloc.erase()
                keep = [v for i, v in enumerate(ret.operands) if i not in dynamic]
                with ir.InsertionPoint(ret), ret.location:
                    ir.Operation.create("func.return", operands=keep)
                ret.erase()
                match_signature(fn)
                inputs = list(ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).inputs)
                results = [t for i, t in enumerate(ftype.results) if i not in dynamic]
                fn.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(inputs, results))
                rewritten[name] = (dynamic, plans)
            for call in ops_named(module, "func.call"):
                callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
                if callee in rewritten:
                    self._rewrite_call(call, *rewritten[callee])

    @staticmethod
    def _rewrite_call(call: ir.Operation, dynamic: list[int], plans: list[list[_Size]]) -> None:
        operands = list(call.operands)
        index = ir.IndexType.get()
        outs = []
        with ir.InsertionPoint(call), call.location:
            for i, plan in zip(dynamic, plans):
                sizes = [operands[s[1]] if s[0] == "arg" else memref.dim(operands[s[1]], arith.constant(index, s[2]))
                         for s in plan]
                outs.append(memref.alloc(ir.MemRefType(call.results[i].type), sizes, [], alignment=64))
            new = ir.Operation.create(
                "func.call", results=[r.type for i, r in enumerate(call.results) if i not in dynamic],
                operands=operands + outs,
                attributes={a.name: a.attr for a in (call.attributes[j] for j in range(len(call.attributes)))})
        fresh = iter(new.results)
        taken = iter(outs)
        for i, old in enumerate(call.results):
            old.replace_all_uses_with(next(taken) if i in dynamic else next(fresh))
        call.erase()


__all__ = ["DynamicResults"]
