"""Pass ``plan-workspace``: the entry function's temporaries become views of one workspace argument.

Every ``memref.alloc`` of at least `MIN_BYTES` directly in the entry function's body — static shape,
identity layout, freed (if at all) by ``memref.dealloc`` ops in that same body and never returned — gets a
byte offset from
`pbsdk.core.plan.workspace.plan_workspace` and becomes ``memref.view %workspace[%offset][]``; its deallocs
go. The workspace is a new last argument of the entry, ``memref<Nxi8>`` marked ``pbsdk.workspace = N``,
recorded as ``notes["workspace"]`` for the artifact: the loader allocates it once and passes it to every
call (`pbsdk.targets.cpu.EntryCall`), so a call allocates nothing and page-faults nothing in.

A buffer is live from its first use to its last, in the order of the entry body's ops (a use nested in a
loop counts at the loop; an op that takes the buffer and yields values — a view, a pointer extraction —
extends the range to every use of what it yields). Buffers allocated inside loops or other functions
(a kernel's per-thread tiles) are left as they are, as is any buffer of a dynamic shape or one that
escapes through the entry's return.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from mlir import ir
from mlir.dialects import arith, memref

from pbsdk.core.ir import attributes
from pbsdk.core.passes import identity_layout, match_signature, ops_named, user_op
from pbsdk.core.plan.workspace import ALIGNMENT, Buffer, plan_workspace

#: Buffers below this size (a core's L2) stay on the heap: there each one keeps its own bytes, and a thread
#: finds in its cache the lines it wrote on the last call. In a shared workspace a small buffer's bytes are
#: another buffer's too, written by the other thread under another split, and cross between the cores'
#: caches on every call: a small CNN at batch 16 on 2 threads (buffers of 256 KiB to 2 MiB) ran 9 % slower
#: with every buffer planned, as fast as before with this threshold. (glibc keeps them on its heap between
#: calls: `pbsdk.targets.cpu.tune_malloc`.)
MIN_BYTES = 1 << 20

#: Bytes of one element of an index-typed buffer on the 64-bit hosts pbsdk compiles for.
_INDEX_BYTES = 8


def _element_bytes(t: ir.Type) -> int | None:
    if isinstance(t, ir.IndexType):
        return _INDEX_BYTES
    width = getattr(t, "width", None)
    if isinstance(width, int) and width % 8 == 0:
        return width // 8
    return None


@dataclasses.dataclass(frozen=True)
class PlanWorkspace:
    name = "plan-workspace"
    #: Buffers smaller than this stay ``memref.alloc``s (see the module docstring).
    min_bytes: int = MIN_BYTES
    #: False: the pass does nothing (the cpu target sets it from its option ``workspace``).
    enabled: bool = True

    def apply(self, module: ir.Module, ctx: Any) -> None:
        if not self.enabled:
            return
        entry = ctx.notes["entry"]
        fns = [op for op in ops_named(module, "func.func")
               if ir.StringAttr(op.attributes["sym_name"]).value == entry and len(op.regions[0].blocks)]
        if not fns:
            return
        fn = fns[0]
        with module.context, ir.Location.unknown():
            size = self._plan(fn, self.min_bytes)
        if size:
            ctx.notes["workspace"] = size

    @staticmethod
    def _plan(fn: ir.Operation, min_bytes: int) -> int:
        """Rewrite ``fn``'s planned allocs as views of a new workspace argument; its size (0: none)."""
        body = fn.regions[0].blocks[0]
        ops = [o.operation for o in body.operations]
        position = {op: i for i, op in enumerate(ops)}

        def top(op: ir.Operation) -> ir.Operation | None:
            while op is not None and op not in position:
                op = op.parent
            return op

        found: list[tuple[ir.Operation, list[ir.Operation], Buffer]] = []
        for alloc in ops:
            if alloc.name != "memref.alloc" or len(alloc.operands) or not identity_layout(alloc.results[0].type):
                continue
            t = ir.MemRefType(alloc.results[0].type)
            if t.memory_space is not None:
                continue
            elt = _element_bytes(t.element_type)
            if elt is None or elt * math.prod(t.shape) < min_bytes:
                continue
            deallocs: list[ir.Operation] = []
            used: list[int] = []
            ok = True
            pending = [alloc.results[0]]
            while pending and ok:
                value = pending.pop()
                for use in value.uses:
                    user = user_op(use)
                    if user.name == "memref.dealloc" and value == alloc.results[0]:
                        if user.parent != fn:
                            ok = False
                        deallocs.append(user)
                        continue
                    anchor = top(user)
                    if anchor is None or user.name in ("func.return", "memref.dealloc"):
                        ok = False
                        break
                    used.append(position[anchor])
                    pending.extend(user.results)
            if not ok:
                continue
            align = ALIGNMENT
            if "alignment" in alloc.attributes:
                align = max(align, ir.IntegerAttr(alloc.attributes["alignment"]).value)
            first = min(used, default=position[alloc])
            found.append((alloc, deallocs, Buffer(elt * math.prod(t.shape), first,
                                                  max(used, default=first), align)))
        if not found:
            return 0
        plan = plan_workspace([b for _, _, b in found])
        i8 = ir.IntegerType.get_signless(8)
        ws = body.add_argument(ir.MemRefType.get([plan.size], i8), ir.Location.unknown())
        match_signature(fn)
        attributes.set_arg_i64(fn, len(body.arguments) - 1, attributes.WORKSPACE, plan.size)
        for (alloc, deallocs, _), offset in zip(found, plan.offsets):
            for d in deallocs:
                d.erase()
            with ir.InsertionPoint(alloc):
                shift = arith.ConstantOp(ir.IndexType.get(), offset).result
                view = memref.ViewOp(alloc.results[0].type, ws, shift, []).result
            alloc.results[0].replace_all_uses_with(view)
            alloc.erase()
        return plan.size
