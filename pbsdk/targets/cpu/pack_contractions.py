"""Pass ``pack-contractions``: replace each planned ``linalg.matmul`` / ``linalg.batch_matmul`` on
buffers by a call to a packed, register-tiled kernel generated from its plan.

For every contraction the planner (`pbsdk.core.plan.contraction`) is asked for a plan on the stage's
chip spec; where the plan has a `Blocking` (a vector-FMA register tile on a cache hierarchy) the op is
replaced by ``func.call @__pbsdk_mm<N>(A, B, C)`` and the kernel from
`pbsdk.targets.cpu.matmul_kernel` is added to the module. Work split across the outermost compute
level is an ``scf.forall`` around per-part calls, which the cpu target's ``lower-parallel`` stage turns
into a fork onto the cores.

Contractions this pass cannot take (integer types, a non-unit innermost stride, no blocking in the plan)
are left for the target's generic lowering and recorded in ``ctx.notes["pack-contractions"]`` with the
reason, so ``--emit`` and the tests can see what happened.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import func

from pbsdk.core.passes import ops_named
from pbsdk.core.plan.contraction import Contraction, plan_contraction
from pbsdk.targets.cpu.matmul_kernel import (
    EPILOGUE_OPS,
    Epilogue,
    EpilogueOp,
    MatmulShape,
    build_matmul_kernel,
)

_FLOATS = {"f32", "f64"}


def _unit_inner_stride(t: ir.MemRefType) -> bool:
    strides, _ = t.get_strides_and_offset()
    return strides[-1] == 1


def _epilogue(mm: ir.Operation, dtype: str) -> tuple[ir.Operation, Epilogue, list[ir.Value]] | None:
    """The elementwise ``linalg.generic`` right after ``mm`` that reads its output once at the identity
    map (as `isolate-contractions` leaves it), described as an `Epilogue`; None if there is none or its
    body has an op the kernel cannot vectorise."""
    ops_after = [o.operation for o in mm.block.operations]
    at = next(i for i, o in enumerate(ops_after) if o == mm)
    if at + 1 >= len(ops_after):
        return None
    gen = ops_after[at + 1]
    if gen.name != "linalg.generic" or gen.results:
        return None
    c = mm.operands[2]
    its = [str(a) for a in ir.ArrayAttr(gen.attributes["iterator_types"])]
    if any("parallel" not in i for i in its):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(gen.attributes["indexing_maps"])]
    operands = list(gen.operands)
    n_in = len(operands) - 1
    out = operands[n_in]
    rank = len(its)
    ident = ir.AffineMap.get_identity(rank, context=c.type.context)
    if maps[n_in] != ident or out.type != c.type or str(ir.MemRefType(out.type).element_type) != dtype:
        return None
    c_reads = [i for i in range(n_in) if operands[i] == c]
    if len(c_reads) != 1 or maps[c_reads[0]] != ident:
        return None
    inputs: list[tuple[str, ir.MemRefType]] = []
    extra: list[ir.Value] = []
    names: dict[int, str] = {}
    for i in range(n_in):
        if i == c_reads[0]:
            continue
        t = operands[i].type
        if not isinstance(t, ir.MemRefType) or str(ir.MemRefType(t).element_type) != dtype:
            return None
        mt = ir.MemRefType(t)
        strides, _ = mt.get_strides_and_offset()
        results = [str(r) for r in maps[i].results]
        last, row = f"d{rank - 1}", f"d{rank - 2}"
        if maps[i] == ident and strides[-1] == 1:
            kind = "full"
        elif results == [last] and strides[-1] == 1:
            kind = "col"
        elif results == [row]:
            kind = "row"
        elif results == []:
            kind = "scalar"
        else:
            return None
        names[i] = f"in{len(inputs)}"
        inputs.append((kind, mt))
        extra.append(operands[i])
    body = gen.regions[0].blocks[0]
    env: list[tuple[ir.Value, str]] = []
    args = list(body.arguments)
    if list(args[n_in].uses):
        return None
    arg_name = {i: ("acc" if i == c_reads[0] else names[i]) for i in range(n_in)}
    ops: list[EpilogueOp] = []
    result = None

    def ref(v: ir.Value) -> str | None:
        for i, a in enumerate(args[:n_in]):
            if v == a:
                return arg_name[i]
        found = next((name for value, name in env if value == v), None)
        if found is not None:
            return found
        owner = v.owner
        owner = owner if isinstance(owner, ir.Operation) else getattr(owner, "operation", None)
        if owner is not None and owner.name == "arith.constant":  # hoisted out of the body by canonicalize
            attr = owner.attributes["value"]
            if isinstance(attr, ir.FloatAttr) and str(attr.type) == dtype:
                name = f"k{len(ops)}"
                ops.append(EpilogueOp(name, "arith.constant", (), value=ir.FloatAttr(attr).value))
                env.append((v, name))
                return name
        return None

    for k, bop in enumerate(body.operations):
        op = bop.operation
        if op.name == "linalg.yield":
            result = ref(op.operands[0])
            break
        if op.name not in EPILOGUE_OPS or len(op.results) != 1:
            return None
        rname = f"t{k}"
        if op.name == "arith.constant":
            attr = op.attributes["value"]
            if not isinstance(attr, ir.FloatAttr) or str(attr.type) != dtype:
                return None
            ops.append(EpilogueOp(rname, op.name, (), value=ir.FloatAttr(attr).value))
        else:
            refs = [ref(v) for v in op.operands]
            if any(r is None for r in refs):
                return None  # a value from outside the body: not vectorisable here
            if op.name == "arith.cmpf":
                pred = ir.IntegerAttr(op.attributes["predicate"]).value
                ops.append(EpilogueOp(rname, op.name, tuple(refs), predicate=pred))  # type: ignore[arg-type]
            else:
                if op.name != "arith.select" and str(op.results[0].type) != dtype:
                    return None
                ops.append(EpilogueOp(rname, op.name, tuple(refs)))  # type: ignore[arg-type]
        env.append((op.results[0], rname))
    if result is None:
        return None
    return gen, Epilogue(tuple(inputs), tuple(ops), result, ir.MemRefType(out.type)), extra + [out]


def _zero_fill_before(mm: ir.Operation) -> ir.Operation | None:
    """The ``linalg.fill`` of 0.0 into the contraction's output right before it (which the kernel can
    replace by storing its first k block instead of adding it), or None."""
    ops = [o.operation for o in mm.block.operations]
    at = next(i for i, o in enumerate(ops) if o == mm)
    if at == 0:
        return None
    fill = ops[at - 1]
    if fill.name != "linalg.fill" or fill.operands[1] != mm.operands[2]:
        return None
    value = fill.operands[0].owner
    value = value if isinstance(value, ir.Operation) else getattr(value, "operation", None)
    if value is None or value.name != "arith.constant":
        return None
    attr = value.attributes["value"]
    if not isinstance(attr, ir.FloatAttr) or ir.FloatAttr(attr).value != 0.0:
        return None
    return fill


@dataclasses.dataclass(frozen=True)
class PackContractions:
    name = "pack-contractions"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        if not ctx.options.pack:
            ctx.notes.setdefault(self.name, []).append("disabled by option pack=False")
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
            shape = MatmulShape(m, n, k, bsz, a, b, c)
            fused = _epilogue(op, dtype) if ctx.options.fuse_epilogues else None
            fill = _zero_fill_before(op)
            with op.location:
                kernel = build_matmul_kernel(module, name, shape, blk, epilogue=fused[1] if fused else None,
                                             zero_init=fill is not None)
                func.CallOp(kernel, list(op.operands) + (fused[2] if fused else []), ip=ir.InsertionPoint(op))
            if fused:
                fused[0].erase()
            op.erase()
            if fill is not None:
                fill.erase()
            prefix = f"{bsz}x" if batched else ""
            notes.append(f"{opname} {prefix}{m}x{n}x{k} {dtype}: packed kernel @{name}, "
                         f"register tile {blk.mr}x{blk.nr}, mc/nc/kc {blk.mc}/{blk.nc}/{blk.kc}, "
                         f"{blk.threads} part(s) along {blk.split}"
                         + (f", epilogue of {len(fused[1].body)} ops fused" if fused else ""))
