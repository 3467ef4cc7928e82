"""Stage ``schedule``: the bufferized entry function tiled onto blocks/warps/threads as ``scf.forall`` nests.

This IR is target-neutral in form (loops, subviews, buffers in the workgroup address space, one private
function per matrix-unit instruction shape), so the same module is both lowered to the GPU (`lower.py`)
and, with the parallel loops serialised, executed on the host (`emulate.py`).

- Every ``memref.copy`` becomes a ``linalg.copy`` and every named op except the matmuls is generalised,
  so one mechanism maps them all: `mapping.loop_mapping` picks the parallel loops and the upstream
  ``transform.structured.tile_using_forall`` (a transform script built with `mlir.dialects.transform`
  builders, run by the interpreter) tiles them twice — block tiles (``#gpu.block``) and one point
  per thread (``#gpu.thread``).
- ``linalg.matmul``/``linalg.batch_matmul`` are replaced by the kernel `mapping.matmul_mapping`
  describes, built with the bindings' builders (`matmul_kernel`): per block, the f32 accumulator tile
  is loaded into shared memory, the k loop copies zero-padded operand tiles into shared memory (all
  threads, ``#gpu.thread<linear_dim_0>``), then the compute step runs per warp (``#gpu.warp``) as calls to ``@__pbsdk_mma_*`` — a private function
  holding one 16x8x16 ``linalg.matmul`` marked ``pbsdk.matrix_unit`` that the GPU lowering replaces by
  ``mma.sync`` — or per thread as a small ``linalg.matmul``; finally the tile is stored back, guarded at
  the edges. Barriers between these steps come from the upstream thread mapping (one after each forall).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

from mlir import ir, passmanager
from mlir.dialects import arith, func, linalg, memref, scf, transform
from mlir.dialects.transform import structured

from pbsdk.core.errors import CompileError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.ir.builder import element_type, float_constant, loop
from pbsdk.core.passes import ops_named
from pbsdk.core.passes.copies_to_linalg import CopiesToLinalg
from pbsdk.core.pipeline import StageContext
from pbsdk.targets.nvgpu.build import (
    LINEAR,
    apply_transform,
    forall,
    if_else,
    in_forall,
    mapping_attr,
    match_tagged,
    smem_type,
    subview,
    view_type,
)
from pbsdk.targets.nvgpu.mapping import LoopMapping, MatmulMapping, loop_mapping, matmul_mapping, warp_width

MATMUL_OPS = ("linalg.matmul", "linalg.batch_matmul")


def run_passes(module: ir.Module, pipeline: str) -> None:
    """Run an upstream pass pipeline (textual, module level) on ``module``."""
    with module.context:
        passmanager.PassManager.parse(f"builtin.module({pipeline})").run(module.operation)


def entry_function(module: ir.Module, name: str) -> ir.Operation:
    """The ``func.func`` called ``name``; a `CompileError` when there is none."""
    for op in module.body.operations:
        if op.operation.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op.operation
    raise CompileError(f"entry function '{name}' not found")


# ------------------------------------------------------------------------------------------ loop kernels

def loop_extents(op: ir.Operation) -> tuple[list[int], list[str]]:
    """Static loop extents and iterator types of a ``linalg.generic`` on memrefs."""
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    iterators = [str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    extents: list[int | None] = [None] * len(iterators)
    for value, amap in zip(op.operands, maps):
        shape = ir.MemRefType(value.type).shape if isinstance(value.type, ir.MemRefType) else []
        for size, expr in zip(shape, amap.results):
            if isinstance(expr, ir.AffineDimExpr):
                extents[ir.AffineDimExpr(expr).position] = size
    if any(e is None or e < 0 for e in extents):
        raise CompileError(f"cannot infer static loop extents ({extents})", op="linalg.generic")
    return [int(e) for e in extents if e is not None], iterators


def _mapping_attr(kind: str, n: int) -> list[str]:
    axes = ["z", "y", "x"][3 - n:]
    return [f"#gpu.{kind}<{a}>" for a in axes]


def _tile_loops(module: ir.Module, mappings: list[tuple[int, LoopMapping]]) -> None:
    """One transform script: block tiles then one point per thread, for every tagged op."""
    if not mappings:
        return

    def script(root: ir.Value) -> None:
        any_op = transform.AnyOpType.get()
        for tag, lm in mappings:
            n = len(lm.extents)
            block = [0] * n
            for d, t in zip(lm.dims, lm.tile):
                block[d] = t
            op = match_tagged(root, attrs.KERNEL, tag)
            blocks = structured.TileUsingForallOp(any_op, any_op, op, tile_sizes=block,
                                                  mapping=mapping_attr(*_mapping_attr("block", len(lm.dims))))
            structured.TileUsingForallOp(any_op, any_op, blocks.tiled_op, num_threads=block,
                                         mapping=mapping_attr(*_mapping_attr("thread", len(lm.dims))))

    try:
        apply_transform(module, script)
    except Exception as exc:
        raise CompileError(f"tiling onto blocks/threads failed: {str(exc).strip()[:2000]}",
                           op="linalg.generic") from exc


# ------------------------------------------------------------------------------------------ matmul kernels

def mma_types(mm: MatmulMapping) -> tuple[ir.MemRefType, ir.MemRefType, ir.MemRefType]:
    """The subview types the matrix-unit function takes (views into the shared-memory tiles)."""
    t, acc = element_type(mm.dtype), element_type(mm.acc_dtype)
    return view_type(16, 16, mm.bk, t), view_type(16, 8, mm.bn, t), view_type(16, 8, mm.bn, acc)


def mma_function_name(mm: MatmulMapping) -> str:
    return f"__pbsdk_mma_m16n8k16_{mm.dtype}_{mm.acc_dtype}_k{mm.bk}_n{mm.bn}"


def mma_function(mm: MatmulMapping) -> func.FuncOp:
    """The matrix-unit step as a linalg op (what the host emulation runs; the GPU lowering swaps it), built
    at the current insertion point."""
    ta, tb, tc = mma_types(mm)
    fn = func.FuncOp(mma_function_name(mm), ir.FunctionType.get([ta, tb, tc], []), visibility="private")
    attrs.set_string(fn.operation, attrs.MATRIX_UNIT, mm.unit or "")
    with ir.InsertionPoint(fn.add_entry_block()):
        a, b, c = fn.arguments
        linalg.matmul(a, b, outs=[c])
        func.ReturnOp([])
    return fn


def matmul_kernel(mm: MatmulMapping, types: Sequence[ir.Type], name: str) -> func.FuncOp:
    """The blocked matmul as a function of (A, B, C) — see the module docstring — built with the bindings'
    builders at the current insertion point."""
    T, ACC = element_type(mm.dtype), element_type(mm.acc_dtype)
    index = ir.IndexType.get()
    batched = mm.batch > 1 or len(ir.MemRefType(types[0]).shape) == 3
    nt = mm.threads
    fn = func.FuncOp(name, ir.FunctionType.get(list(types), []), visibility="private")
    A, B, C = fn.add_entry_block().arguments
    with ir.InsertionPoint(fn.entry_block):
        c = {v: arith.constant(index, v) for v in sorted({0, 1, mm.m, mm.n, mm.k, mm.bm, mm.bn, mm.bk, nt,
                                                          mm.k_tiles, mm.bm * mm.bn, mm.bm * mm.bk,
                                                          mm.bk * mm.bn, 16, 8})}
        zt = float_constant(0.0, T)
        za = float_constant(0.0, ACC)
        blocks = forall(mm.grid, mapping_attr("#gpu.block<z>", "#gpu.block<y>", "#gpu.block<x>"))
        bz, by, bx = blocks.body.arguments
        with ir.InsertionPoint(blocks.body):
            i0 = arith.muli(by, c[mm.bm])
            j0 = arith.muli(bx, c[mm.bn])
            sa_t, sb_t = smem_type((mm.bm, mm.bk), T), smem_type((mm.bk, mm.bn), T)
            sc_t = smem_type((mm.bm, mm.bn), ACC)
            i64 = ir.IntegerType.get_signless(64)
            sa, sb, sc = (memref.alloc(t, [], [], alignment=ir.IntegerAttr.get(i64, 16)) for t in (sa_t, sb_t, sc_t))
            lead = [bz] if batched else []

            def guarded_copy(t: ir.Value, rows: int, cols: int, src: ir.Value, dst: ir.Value, r0: ir.Value,
                             c0: ir.Value, rmax: int, cmax: int, etype: ir.Type, zero: ir.Value,
                             store_back: bool = False) -> None:
                """Each thread moves elements t, t+NT, ... of a rows x cols tile; out-of-range reads are zero."""
                with loop(t, c[rows * cols], c[nt]) as lp:
                    ev = lp.induction_variable
                    r = arith.divui(ev, c[cols])
                    q = arith.remui(ev, c[cols])
                    gi = arith.addi(r0, r)
                    gj = arith.addi(c0, q)
                    ii = arith.cmpi(arith.CmpIPredicate.ult, gi, c[rmax])
                    ij = arith.cmpi(arith.CmpIPredicate.ult, gj, c[cmax])
                    inside = arith.andi(ii, ij)
                    if store_back:
                        guard = scf.IfOp(inside)
                        with ir.InsertionPoint(guard.then_block):
                            memref.store(memref.load(src, [r, q]), dst, [*lead, gi, gj])
                            scf.YieldOp([])
                    else:
                        v = if_else(inside, etype, lambda: memref.load(src, [*lead, gi, gj]), zero)
                        memref.store(v, dst, [r, q])

            # 1. the accumulator tile (C holds the initial value, e.g. the fill) into shared memory
            with in_forall([nt], *LINEAR) as (t,):
                guarded_copy(t, mm.bm, mm.bn, C, sc, i0, j0, mm.m, mm.n, ACC, za)
            # 2. the k loop: operand tiles into shared memory, then the compute step
            with loop(c[0], c[mm.k_tiles], c[1]) as kloop:
                k0 = arith.muli(kloop.induction_variable, c[mm.bk])
                with in_forall([nt], *LINEAR) as (t,):
                    guarded_copy(t, mm.bm, mm.bk, A, sa, i0, k0, mm.m, mm.k, T, zt)
                    guarded_copy(t, mm.bk, mm.bn, B, sb, k0, j0, mm.k, mm.n, T, zt)
                if mm.compute == "mma":
                    wtm, wtn = mm.bm // mm.warps_m, mm.bn // mm.warps_n
                    ta, tb, tc = mma_types(mm)
                    with in_forall([mm.warps_m, mm.warps_n], "#gpu.warp<linear_dim_1>",
                                   "#gpu.warp<linear_dim_0>") as (wy, wx):
                        cwm = arith.constant(index, wtm)
                        cwn = arith.constant(index, wtn)
                        wm0 = arith.muli(wy, cwm)
                        wn0 = arith.muli(wx, cwn)
                        with loop(c[0], cwm, c[16]) as mi, loop(c[0], cwn, c[8]) as ni, \
                                loop(c[0], c[mm.bk], c[16]) as ki:
                            r = arith.addi(wm0, mi.induction_variable)
                            q = arith.addi(wn0, ni.induction_variable)
                            k = ki.induction_variable
                            av = subview(sa, [r, k], [16, 16], ta)
                            bv = subview(sb, [k, q], [16, 8], tb)
                            cv = subview(sc, [r, q], [16, 8], tc)
                            func.CallOp([], mma_function_name(mm), [av, bv, cv])
                else:
                    ty, tx = mm.bm // mm.tm, mm.bn // mm.tn
                    va = view_type(mm.tm, mm.bk, mm.bk, T)
                    vb = view_type(mm.bk, mm.tn, mm.bn, T)
                    vc = view_type(mm.tm, mm.tn, mm.bn, ACC)
                    with in_forall([ty, tx], "#gpu.thread<linear_dim_1>", "#gpu.thread<linear_dim_0>") as (y, x):
                        ctm = arith.constant(index, mm.tm)
                        ctn = arith.constant(index, mm.tn)
                        r = arith.muli(y, ctm)
                        q = arith.muli(x, ctn)
                        av = subview(sa, [r, 0], [mm.tm, mm.bk], va)
                        bv = subview(sb, [0, q], [mm.bk, mm.tn], vb)
                        cv = subview(sc, [r, q], [mm.tm, mm.tn], vc)
                        linalg.matmul(av, bv, outs=[cv])
            # 3. the accumulator tile back to C, inside the bounds only
            with in_forall([nt], *LINEAR) as (t,):
                guarded_copy(t, mm.bm, mm.bn, sc, C, i0, j0, mm.m, mm.n, ACC, za, store_back=True)
            for buf in (sa, sb, sc):
                memref.dealloc(buf)
            scf.InParallelOp()
        func.ReturnOp([])
    return fn


def _matmul_shape(op: ir.Operation) -> tuple[int, int, int, int, str, str] | None:
    types = [ir.MemRefType(v.type) for v in op.operands]
    a, _, c = types
    if not all(t.has_static_shape for t in types):
        return None
    batch = a.shape[0] if op.name == "linalg.batch_matmul" else 1
    return batch, c.shape[-2], c.shape[-1], a.shape[-1], str(a.element_type), str(c.element_type)


def _build_in_place(module: ir.Module, op: ir.Operation, build: Callable[[], func.FuncOp]) -> None:
    """Build a kernel (one function of op's operands: ``build`` at an insertion point of a scratch module)
    and move its body in place of ``op``, which is erased."""
    with module.context, ir.Location.unknown():
        scratch = ir.Module.create()
        with ir.InsertionPoint(scratch.body):
            fn = build().operation
    block = fn.regions[0].blocks[0]
    for arg, value in zip(block.arguments, op.operands):
        arg.replace_all_uses_with(value)
    for inner in list(block.operations):
        if inner.operation.name == "func.return":
            break
        inner.operation.move_before(op)
    op.erase()


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Pass ``nvgpu-schedule``: tile every linalg op of the entry function onto the GPU hierarchy.

    Records what it decided in ``ctx.notes["nvgpu.kernels"]`` (one dict per kernel, in launch order)."""

    name = "nvgpu-schedule"

    def apply(self, module: ir.Module, ctx: StageContext) -> None:
        records: list[dict[str, Any]] = []
        # matrix-unit functions by name, each a builder of its func.func
        mma_funcs: dict[str, Callable[[], Any]] = {}
        # Calls of the functions the core marked ``pbsdk.attention`` (fused attentions) stay calls: each
        # becomes this target's kernel below, generated from the descriptor (the neutral body is dropped).
        attention_calls = _keep_attention_calls(module)
        # The core isolates each contraction in a private function (so fusion leaves it named); bring
        # them back into the entry function, where every kernel is launched from.
        run_passes(module, "inline, symbol-dce, canonicalize")
        CopiesToLinalg(only_strided=False).apply(module)
        entry = entry_function(module, ctx.notes["entry"])
        for op in [o for name in MATMUL_OPS for o in ops_named(module, name)]:
            shape = _matmul_shape(op)
            if shape is None or _in_attention_function(op):
                continue
            mm = matmul_mapping(ctx.spec, *shape, ctx.options)
            records.append({"op": op.name, "kind": "matmul", "mapping": dataclasses.asdict(mm)})
            if mm.compute == "mma":
                mma_funcs.setdefault(mma_function_name(mm), functools.partial(mma_function, mm))
            _build_in_place(module, op, functools.partial(matmul_kernel, mm, [v.type for v in op.operands],
                                                          "__pbsdk_matmul"))
        if attention_calls:
            records += _fuse_attention_calls(module, ctx, mma_funcs)
        with module.context, ir.Location.unknown(), ir.InsertionPoint(module.body):
            for build in mma_funcs.values():
                build()
        # Every other linalg op: generalise, then tile by its loop mapping.
        run_passes(module, "func.func(linalg-generalize-named-ops)")
        entry = entry_function(module, ctx.notes["entry"])
        tagged: list[tuple[int, LoopMapping]] = []
        with module.context:
            for i, op in enumerate(ops_named(entry, "linalg.generic")):
                if _inside_forall(op):
                    continue  # the matmul kernels' own compute steps
                extents, iterators = loop_extents(op)
                lm = loop_mapping(extents, iterators,
                                  threads=min(256, ctx.spec.compute[0].limits.get("max_threads_per_block", 256)),
                                  units=ctx.spec.compute[0].count, warp=warp_width(ctx.spec))
                records.append({"op": "linalg.generic", "kind": "loops", "iterators": iterators,
                                "mapping": dataclasses.asdict(lm)})
                if not lm.dims:
                    attrs.set_unit(op, attrs.SINGLE_THREAD)
                    continue
                attrs.set_i64(op, attrs.KERNEL, i)
                tagged.append((i, lm))
        _tile_loops(module, tagged)
        run_passes(module, "canonicalize, cse")
        ctx.notes["nvgpu.kernels"] = records


def _attention_functions(module: ir.Module) -> dict[str, ir.Operation]:
    return {ir.StringAttr(op.attributes["sym_name"]).value: op.operation for op in module.body.operations
            if op.operation.name == "func.func" and attrs.has(op, attrs.ATTENTION)}


def _keep_attention_calls(module: ir.Module) -> int:
    """Mark the calls of ``pbsdk.attention`` functions ``no_inline``; how many there are."""
    with module.context:
        fused = _attention_functions(module)
        calls = [c for c in ops_named(module, "func.call")
                 if ir.FlatSymbolRefAttr(c.attributes["callee"]).value in fused]
        for c in calls:
            c.attributes["no_inline"] = ir.UnitAttr.get()
    return len(calls)


def _fuse_attention_calls(module: ir.Module, ctx: StageContext,
                          mma_funcs: dict[str, Callable[[], Any]]) -> list[dict[str, Any]]:
    """Replace every ``func.call`` of a ``pbsdk.attention`` function by the kernel of its `AttentionMapping`."""
    from pbsdk.targets.nvgpu.attention import attention_mapping, parse_descriptor
    from pbsdk.targets.nvgpu.attention_kernel import build_kernel, mma_steps

    records: list[dict[str, Any]] = []
    with module.context:
        fused = _attention_functions(module)
        for call in ops_named(module, "func.call"):
            callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
            if callee not in fused:
                continue
            desc = parse_descriptor(attrs.string(fused[callee], attrs.ATTENTION) or "")
            am = attention_mapping(ctx.spec, desc, ctx.options)
            types = tuple(v.type for v in call.operands)
            if len(types) != 4 + desc.mask:
                raise CompileError(f"@{callee} takes {len(types)} operands; its descriptor needs {4 + desc.mask}",
                                   op="func.call")
            steps = mma_steps(am)
            mma_funcs.update(steps)
            record = dataclasses.asdict(am)
            record.pop("desc")
            records.append({"op": "func.call", "kind": "attention", "callee": callee, "mapping": record,
                            "descriptor": dataclasses.asdict(desc), "threads": am.threads, "grid": am.grid,
                            "shared_bytes": am.shared_bytes})
            _build_in_place(module, call, functools.partial(build_kernel, am, "__pbsdk_attention", types))
        for fn in fused.values():
            fn.erase()
    return records


def _in_attention_function(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        parent = parent.parent
    return parent is not None and attrs.has(parent, attrs.ATTENTION)


def _inside_forall(op: ir.Operation) -> bool:
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        if parent.name == "scf.forall":
            return True
        parent = parent.parent
    return False
