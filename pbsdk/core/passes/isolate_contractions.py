"""Pass ``isolate-contractions``: move each named contraction on tensors into its own private function.

Upstream's elementwise fusion also folds ``tensor.collapse_shape``/``expand_shape`` and gather-like
producers into the ops that consume them, generalising a named ``linalg.matmul`` into an opaque
``linalg.generic`` (e.g. a matmul on a reshaped activation becomes a 4-loop generic). The planner and
``pack-contractions`` recognise the named ops, so before fusion each ``linalg.matmul`` /
``linalg.batch_matmul`` is replaced by a call to ``@__pbsdk_contraction<N>`` holding just that op;
fusion does not cross calls, bufferization rewrites the function with the rest of the module
(identity-layout arguments: a strided view passed in is copied), and the op arrives at the packing
stage intact.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import func

from pbsdk.core.passes import ops_named

CONTRACTIONS = ("linalg.matmul", "linalg.batch_matmul")


@dataclasses.dataclass(frozen=True)
class IsolateContractions:
    name = "isolate-contractions"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        if not ctx.options.get("pack", True):
            return
        count = 0
        for opname in CONTRACTIONS:
            for op in ops_named(module, opname):
                if not all(isinstance(v.type, ir.RankedTensorType) for v in op.operands) or len(op.results) != 1:
                    continue
                name = f"__pbsdk_contraction{count}"
                count += 1
                ins = [v.type for v in op.operands]
                outs = [r.type for r in op.results]
                with module.context, op.location:
                    with ir.InsertionPoint(module.body):
                        fn = func.FuncOp(name, ir.FunctionType.get(ins, outs))
                        fn.attributes["sym_visibility"] = ir.StringAttr.get("private")
                        block = fn.add_entry_block()
                    with ir.InsertionPoint(block):
                        inner = op.clone()
                        for i, arg in enumerate(block.arguments):
                            inner.operands[i] = arg
                        func.ReturnOp(list(inner.results))
                    with ir.InsertionPoint(op):
                        call = func.CallOp(outs, ir.FlatSymbolRefAttr.get(name), list(op.operands))
                op.results[0].replace_all_uses_with(call.results[0])
                op.erase()
