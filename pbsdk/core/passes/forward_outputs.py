"""Pass ``forward-outputs``: write results straight into the caller's output buffers.

After ``buffer-results-to-out-params`` a result computed into a local buffer often ends in

    %tmp = memref.alloc() : T            ... ops writing %tmp ...
    memref.copy %tmp, %out : T to T      (%out: an output argument)
    memref.dealloc %tmp : T

(for instance when the result comes back from a call, which the upstream pass cannot hoist). When
``%tmp`` and ``%out`` have the same identity-layout type, ``%out`` is not touched before the copy, and
``%tmp`` is not used after it (but for its dealloc), ``%tmp`` is replaced by ``%out`` (of dynamic sizes too:
the copy says they are equal) and the copy, the
alloc and the dealloc go. The copy may also read a reshape of ``%tmp`` (``memref.expand_shape`` of a
matmul's 2-D result into a convolution's 4-D output): ``%tmp`` is then replaced by the inverse reshape of
``%out``, and the reshape goes too: one pass over the output less. Output buffers are distinct from each other and
from the inputs (the runtime allocates them; ``distinct-results`` keeps them apart), so no aliasing arises.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import memref

from pbsdk.core.passes import ancestor_in, defining_op, identity_layout, ops_named, row_major

_RESHAPES = ("memref.expand_shape", "memref.collapse_shape")


@dataclasses.dataclass(frozen=True)
class ForwardOutputs:
    name = "forward-outputs"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        for fn in ops_named(module, "func.func"):
            if len(fn.regions[0].blocks):
                while self._forward_one(fn):
                    pass

    @staticmethod
    def _forward_one(fn: ir.Operation) -> bool:
        """Forward the first eligible copy in ``fn``'s entry block; whether one was found."""
        entry = fn.regions[0].blocks[0]
        args = list(entry.arguments)
        ops = [o.operation for o in entry.operations]
        for pos, copy in enumerate(ops):
            if copy.name != "memref.copy":
                continue
            src, dst = copy.operands[0], copy.operands[1]
            if not any(dst == a for a in args) or src.type != dst.type or not row_major(src.type):
                continue
            alloc = defining_op(src)
            view = None
            if alloc is not None and alloc.name in _RESHAPES and len(list(src.uses)) == 1 \
                    and identity_layout(src.type):
                # The copy reads a reshaped view of the local buffer (a matmul's 2-D result as the 4-D output).
                view, alloc = alloc, defining_op(alloc.operands[0])
            if alloc is None or alloc.name != "memref.alloc" or alloc.parent != fn:
                continue
            if not row_major(alloc.results[0].type) or len(list(dst.uses)) != 1:
                continue  # (the output is read or written elsewhere)
            later = ops[pos + 1:]
            dealloc, bad = None, False
            for use in alloc.results[0].uses:
                user = use.owner if isinstance(use.owner, ir.Operation) else use.owner.operation
                if user == copy or (view is not None and user == view):
                    continue
                top = ancestor_in(user, fn)
                if any(top == o for o in later):
                    if user.name == "memref.dealloc" and dealloc is None:
                        dealloc = user
                    else:
                        bad = True
            if bad:
                continue
            target = dst
            if view is not None:  # the buffer becomes the inverse view of the output
                with ir.InsertionPoint(alloc), alloc.location:
                    groups = view.attributes["reassociation"]
                    t = alloc.results[0].type
                    if view.name == "memref.expand_shape":
                        target = memref.CollapseShapeOp(t, dst, groups).result
                    else:
                        target = memref.ExpandShapeOp(t, dst, groups, [], ir.MemRefType(t).shape).result
            copy.erase()
            if view is not None:
                view.erase()
            alloc.results[0].replace_all_uses_with(target)
            if dealloc is not None:
                dealloc.erase()
            alloc.erase()
            return True
        return False
