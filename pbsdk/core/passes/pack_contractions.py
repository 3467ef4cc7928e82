"""Pass ``pack-contractions``: replace each planned ``linalg.matmul`` / ``linalg.batch_matmul`` on
buffers by a call to a packed, register-tiled kernel generated from its plan.

For every contraction the planner (`pbsdk.core.plan.contraction`) is asked for a plan on the stage's
chip spec; where the plan has a `Blocking` (a vector-FMA register tile on a cache hierarchy) the op is
replaced by ``func.call @__pbsdk_mm<N>(A, B, C)`` and the kernel from
`pbsdk.core.passes.matmul_kernel` is added to the module. Work split across the outermost compute
level is an ``scf.forall`` around per-part calls; the target decides how a forall runs (threads on the
cpu target, serialised elsewhere).

Contractions this pass cannot take (integer types, a non-unit innermost stride, no blocking in the plan)
are left for the target's generic lowering and recorded in ``ctx.notes["pack-contractions"]`` with the
reason, so ``--emit`` and the tests can see what happened.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import func

from pbsdk.core.errors import CompileError
from pbsdk.core.passes import ops_named
from pbsdk.core.passes.matmul_kernel import MatmulShape, kernel_text
from pbsdk.core.plan.contraction import Contraction, plan_contraction

_FLOATS = {"f32", "f64"}


def _unit_inner_stride(t: ir.MemRefType) -> bool:
    strides, _ = t.get_strides_and_offset()
    return strides[-1] == 1


@dataclasses.dataclass(frozen=True)
class PackContractions:
    name = "pack-contractions"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        if not ctx.options.get("pack", True):
            ctx.notes.setdefault(self.name, []).append("disabled by options['pack'] = False")
            return
        notes = ctx.notes.setdefault(self.name, [])
        count = 0
        for op in ops_named(module, "linalg.matmul") + ops_named(module, "linalg.batch_matmul"):
            if len(op.operands) != 3 or not all(isinstance(v.type, ir.MemRefType) for v in op.operands):
                notes.append(f"{op.name}: not on buffers; left as is")
                continue
            a, b, c = (ir.MemRefType(v.type) for v in op.operands)
            dtype = str(a.element_type)
            if not (str(b.element_type) == str(c.element_type) == dtype and dtype in _FLOATS):
                notes.append(f"{op.name}: element types {a.element_type}/{b.element_type}/{c.element_type}: "
                             "generic lowering")
                continue
            if not all(_unit_inner_stride(t) for t in (a, b, c)):
                notes.append(f"{op.name}: an operand's innermost stride is not 1: generic lowering")
                continue
            opname = op.name
            batched = opname == "linalg.batch_matmul"
            bsz = a.shape[0] if batched else 0
            m, k = a.shape[-2:]
            n = b.shape[-1]
            plan = plan_contraction(ctx.spec, Contraction(m, n, k, max(bsz, 1), dtype), ctx.options)
            blk = plan.blocking
            if blk is None:
                notes.append(f"{op.name} {m}x{n}x{k}: plan has no packed blocking "
                             f"({plan.compute.kind}): generic lowering")
                continue
            name = f"__pbsdk_mm{count}"
            count += 1
            shape = MatmulShape(m, n, k, bsz, dtype, str(a), str(b), str(c))
            text = kernel_text(name, shape, blk)
            try:
                kernel = ir.Module.parse("module {\n" + text + "}", module.context)
            except Exception as exc:  # our own generator produced invalid IR: a bug, said plainly
                raise CompileError(f"generated kernel for {m}x{n}x{k} does not parse: {exc}",
                                   stage=self.name, op=op.name) from exc
            for fn in list(kernel.body.operations):
                module.body.append(fn.detach_from_parent())
            with ir.InsertionPoint(op), op.location:
                func.CallOp([], ir.FlatSymbolRefAttr.get(name), list(op.operands))
            op.erase()
            prefix = f"{bsz}x" if batched else ""
            notes.append(f"{opname} {prefix}{m}x{n}x{k} {dtype}: packed kernel @{name}, "
                         f"register tile {blk.mr}x{blk.nr}, mc/nc/kc {blk.mc}/{blk.nc}/{blk.kc}, "
                         f"{blk.threads} part(s) along {blk.split}")
