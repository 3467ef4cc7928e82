"""Stage ``schedule``: the bufferized entry function tiled onto blocks/warps/threads as ``scf.forall`` nests.

This IR is target-neutral in form (loops, subviews, buffers in the workgroup address space, one private
function per matrix-unit instruction shape), so the same module is both lowered to the GPU (`lower.py`)
and, with the parallel loops serialised, executed on the host (`emulate.py`).

- Every ``memref.copy`` becomes a ``linalg.copy`` and every named op except the matmuls is generalised,
  so one mechanism maps them all: `mapping.loop_mapping` picks the parallel loops and the upstream
  ``transform.structured.tile_using_forall`` tiles them twice — block tiles (``#gpu.block``) and one point
  per thread (``#gpu.thread``).
- ``linalg.matmul``/``linalg.batch_matmul`` are replaced by the kernel `mapping.matmul_mapping`
  describes, written out as MLIR text: per block, the f32 accumulator tile is loaded into shared memory,
  the k loop copies zero-padded operand tiles into shared memory (all threads, ``#gpu.thread<linear_dim_0>``),
  then the compute step runs per warp (``#gpu.warp``) as calls to ``@__pbsdk_mma_*`` — a private function
  holding one 16x8x16 ``linalg.matmul`` marked ``pbsdk.matrix_unit`` that the GPU lowering replaces by
  ``mma.sync`` — or per thread as a small ``linalg.matmul``; finally the tile is stored back, guarded at
  the edges. Barriers between these steps come from the upstream thread mapping (one after each forall).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mlir import ir, passmanager
from mlir.dialects.transform import interpreter

from pbsdk.core.errors import CompileError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.passes import ops_named
from pbsdk.core.passes.copies_to_linalg import CopiesToLinalg
from pbsdk.core.pipeline import StageContext
from pbsdk.targets.nvgpu.mapping import LoopMapping, MatmulMapping, loop_mapping, matmul_mapping, warp_width

WS = "#gpu.address_space<workgroup>"
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


def _mapping_attr(kind: str, n: int) -> str:
    axes = ["z", "y", "x"][3 - n:]
    return ", ".join(f"#gpu.{kind}<{a}>" for a in axes)


def _tile_loops(module: ir.Module, mappings: list[tuple[int, LoopMapping]]) -> None:
    """One transform script: block tiles then one point per thread, for every tagged op."""
    lines = []
    for tag, lm in mappings:
        n = len(lm.extents)
        block = [0] * n
        for d, t in zip(lm.dims, lm.tile):
            block[d] = t
        lines.append(f"%op{tag} = transform.structured.match attributes {{{attrs.KERNEL} = {tag} : i64}} in %root "
                     ": (!transform.any_op) -> !transform.any_op")
        lines.append(f"%t{tag}, %f{tag} = transform.structured.tile_using_forall %op{tag} tile_sizes {block} "
                     f"(mapping = [{_mapping_attr('block', len(lm.dims))}]) "
                     ": (!transform.any_op) -> (!transform.any_op, !transform.any_op)")
        lines.append(f"%u{tag}, %g{tag} = transform.structured.tile_using_forall %t{tag} num_threads {block} "
                     f"(mapping = [{_mapping_attr('thread', len(lm.dims))}]) "
                     ": (!transform.any_op) -> (!transform.any_op, !transform.any_op)")
    if not lines:
        return
    script = ("module attributes {transform.with_named_sequence} {\n"
              "transform.named_sequence @__transform_main(%root: !transform.any_op {transform.readonly}) {\n"
              + "\n".join(lines) + "\ntransform.yield\n}\n}")
    with module.context:
        seq = ir.Module.parse(script)
        try:
            interpreter.apply_named_sequence(module.operation, seq.body.operations[0], seq)
        except Exception as exc:
            raise CompileError(f"tiling onto blocks/threads failed: {str(exc).strip()[:2000]}",
                               op="linalg.generic") from exc


# ------------------------------------------------------------------------------------------ matmul kernels

def _memref(shape: tuple[int, ...], dtype: str, space: bool = True) -> str:
    return f"memref<{'x'.join(map(str, shape))}x{dtype}{', ' + WS if space else ''}>"


def mma_types(mm: MatmulMapping) -> tuple[str, str, str]:
    """The subview types the matrix-unit function takes (views into the shared-memory tiles)."""
    return (f"memref<16x16x{mm.dtype}, strided<[{mm.bk}, 1], offset: ?>, {WS}>",
            f"memref<16x8x{mm.dtype}, strided<[{mm.bn}, 1], offset: ?>, {WS}>",
            f"memref<16x8x{mm.acc_dtype}, strided<[{mm.bn}, 1], offset: ?>, {WS}>")


def mma_function_name(mm: MatmulMapping) -> str:
    return f"__pbsdk_mma_m16n8k16_{mm.dtype}_{mm.acc_dtype}_k{mm.bk}_n{mm.bn}"


def mma_function(mm: MatmulMapping) -> str:
    """The matrix-unit step as a linalg op (what the host emulation runs; the GPU lowering swaps it)."""
    ta, tb, tc = mma_types(mm)
    return (f"func.func private @{mma_function_name(mm)}(%a: {ta}, %b: {tb}, %c: {tc}) "
            f"attributes {{{attrs.MATRIX_UNIT} = \"{mm.unit}\"}} {{\n"
            f"  linalg.matmul ins(%a, %b : {ta}, {tb}) outs(%c : {tc})\n  return\n}}")


def matmul_kernel(mm: MatmulMapping, types: tuple[str, str, str], name: str) -> str:
    """The blocked matmul as a function of (A, B, C) — see the module docstring."""
    T, ACC = mm.dtype, mm.acc_dtype
    bt = mm.batch > 1 or types[0].count("x") == 3
    b = "%bz, " if bt else ""
    nt = mm.threads
    zero = "0.0"
    L: list[str] = []
    e = L.append
    e(f"func.func private @{name}(%A: {types[0]}, %B: {types[1]}, %C: {types[2]}) {{")
    for v in sorted({0, 1, mm.m, mm.n, mm.k, mm.bm, mm.bn, mm.bk, nt, mm.k_tiles, mm.bm * mm.bn, mm.bm * mm.bk,
                     mm.bk * mm.bn, 16, 8}):
        e(f"  %c{v} = arith.constant {v} : index")
    e(f"  %zt = arith.constant {zero} : {T}")
    e(f"  %za = arith.constant {zero} : {ACC}")
    gz, gy, gx = mm.grid
    e(f"  scf.forall (%bz, %by, %bx) in ({gz}, {gy}, {gx}) {{")
    e(f"    %i0 = arith.muli %by, %c{mm.bm} : index")
    e(f"    %j0 = arith.muli %bx, %c{mm.bn} : index")
    sa, sb, sc = _memref((mm.bm, mm.bk), T), _memref((mm.bk, mm.bn), T), _memref((mm.bm, mm.bn), ACC)
    e(f"    %sa = memref.alloc() {{alignment = 16 : i64}} : {sa}")
    e(f"    %sb = memref.alloc() {{alignment = 16 : i64}} : {sb}")
    e(f"    %sc = memref.alloc() {{alignment = 16 : i64}} : {sc}")

    def guarded_copy(tag: str, rows: int, cols: int, src: str, src_t: str, dst: str, dst_t: str,
                     r0: str, c0: str, rmax: int, cmax: int, etype: str, zero_v: str, store_back: bool = False) -> None:
        """Each thread moves elements t, t+NT, ... of a rows x cols tile; out-of-range reads are zero."""
        e(f"      scf.for %e{tag} = %t to %c{rows * cols} step %c{nt} {{")
        e(f"        %r{tag} = arith.divui %e{tag}, %c{cols} : index")
        e(f"        %q{tag} = arith.remui %e{tag}, %c{cols} : index")
        e(f"        %gi{tag} = arith.addi {r0}, %r{tag} : index")
        e(f"        %gj{tag} = arith.addi {c0}, %q{tag} : index")
        e(f"        %ii{tag} = arith.cmpi ult, %gi{tag}, %c{rmax} : index")
        e(f"        %ij{tag} = arith.cmpi ult, %gj{tag}, %c{cmax} : index")
        e(f"        %in{tag} = arith.andi %ii{tag}, %ij{tag} : i1")
        if store_back:
            e(f"        scf.if %in{tag} {{")
            e(f"          %v{tag} = memref.load {src}[%r{tag}, %q{tag}] : {src_t}")
            e(f"          memref.store %v{tag}, {dst}[{b}%gi{tag}, %gj{tag}] : {dst_t}")
            e("        }")
        else:
            e(f"        %v{tag} = scf.if %in{tag} -> ({etype}) {{")
            e(f"          %x{tag} = memref.load {src}[{b}%gi{tag}, %gj{tag}] : {src_t}")
            e(f"          scf.yield %x{tag} : {etype}")
            e(f"        }} else {{\n          scf.yield {zero_v} : {etype}\n        }}")
            e(f"        memref.store %v{tag}, {dst}[%r{tag}, %q{tag}] : {dst_t}")
        e("      }")

    linear = "[#gpu.thread<linear_dim_0>]"
    # 1. the accumulator tile (C holds the initial value, e.g. the fill) into shared memory
    e(f"    scf.forall (%t) in ({nt}) {{")
    guarded_copy("c", mm.bm, mm.bn, "%C", types[2], "%sc", sc, "%i0", "%j0", mm.m, mm.n, ACC, "%za")
    e(f"    }} {{mapping = {linear}}}")
    # 2. the k loop: operand tiles into shared memory, then the compute step
    e(f"    scf.for %kt = %c0 to %c{mm.k_tiles} step %c1 {{")
    e(f"      %k0 = arith.muli %kt, %c{mm.bk} : index")
    e(f"      scf.forall (%t) in ({nt}) {{")
    guarded_copy("a", mm.bm, mm.bk, "%A", types[0], "%sa", sa, "%i0", "%k0", mm.m, mm.k, T, "%zt")
    guarded_copy("b", mm.bk, mm.bn, "%B", types[1], "%sb", sb, "%k0", "%j0", mm.k, mm.n, T, "%zt")
    e(f"      }} {{mapping = {linear}}}")
    if mm.compute == "mma":
        wtm, wtn = mm.bm // mm.warps_m, mm.bn // mm.warps_n
        ta, tb, tc = mma_types(mm)
        e(f"      scf.forall (%wy, %wx) in ({mm.warps_m}, {mm.warps_n}) {{")
        e(f"        %cwm = arith.constant {wtm} : index")
        e(f"        %cwn = arith.constant {wtn} : index")
        e("        %wm0 = arith.muli %wy, %cwm : index")
        e("        %wn0 = arith.muli %wx, %cwn : index")
        e("        scf.for %mi = %c0 to %cwm step %c16 {")
        e("          scf.for %ni = %c0 to %cwn step %c8 {")
        e(f"            scf.for %ki = %c0 to %c{mm.bk} step %c16 {{")
        e("              %r = arith.addi %wm0, %mi : index")
        e("              %q = arith.addi %wn0, %ni : index")
        e(f"              %as = memref.subview %sa[%r, %ki] [16, 16] [1, 1] : {sa} to {ta}")
        e(f"              %bs = memref.subview %sb[%ki, %q] [16, 8] [1, 1] : {sb} to {tb}")
        e(f"              %cs = memref.subview %sc[%r, %q] [16, 8] [1, 1] : {sc} to {tc}")
        e(f"              func.call @{mma_function_name(mm)}(%as, %bs, %cs) : ({ta}, {tb}, {tc}) -> ()")
        e("            }\n          }\n        }")
        e("      } {mapping = [#gpu.warp<linear_dim_1>, #gpu.warp<linear_dim_0>]}")
    else:
        ty, tx = mm.bm // mm.tm, mm.bn // mm.tn
        va = f"memref<{mm.tm}x{mm.bk}x{T}, strided<[{mm.bk}, 1], offset: ?>, {WS}>"
        vb = f"memref<{mm.bk}x{mm.tn}x{T}, strided<[{mm.bn}, 1], offset: ?>, {WS}>"
        vc = f"memref<{mm.tm}x{mm.tn}x{ACC}, strided<[{mm.bn}, 1], offset: ?>, {WS}>"
        e(f"      scf.forall (%ty, %tx) in ({ty}, {tx}) {{")
        e(f"        %ctm = arith.constant {mm.tm} : index")
        e(f"        %ctn = arith.constant {mm.tn} : index")
        e("        %r = arith.muli %ty, %ctm : index")
        e("        %q = arith.muli %tx, %ctn : index")
        e(f"        %as = memref.subview %sa[%r, 0] [{mm.tm}, {mm.bk}] [1, 1] : {sa} to {va}")
        e(f"        %bs = memref.subview %sb[0, %q] [{mm.bk}, {mm.tn}] [1, 1] : {sb} to {vb}")
        e(f"        %cs = memref.subview %sc[%r, %q] [{mm.tm}, {mm.tn}] [1, 1] : {sc} to {vc}")
        e(f"        linalg.matmul ins(%as, %bs : {va}, {vb}) outs(%cs : {vc})")
        e("      } {mapping = [#gpu.thread<linear_dim_1>, #gpu.thread<linear_dim_0>]}")
    e("    }")
    # 3. the accumulator tile back to C, inside the bounds only
    e(f"    scf.forall (%t) in ({nt}) {{")
    guarded_copy("s", mm.bm, mm.bn, "%sc", sc, "%C", types[2], "%i0", "%j0", mm.m, mm.n, ACC, "%za",
                 store_back=True)
    e(f"    }} {{mapping = {linear}}}")
    e(f"    memref.dealloc %sa : {sa}")
    e(f"    memref.dealloc %sb : {sb}")
    e(f"    memref.dealloc %sc : {sc}")
    e("  } {mapping = [#gpu.block<z>, #gpu.block<y>, #gpu.block<x>]}")
    e("  return\n}")
    return "\n".join(L)


def _matmul_shape(op: ir.Operation) -> tuple[int, int, int, int, str, str] | None:
    types = [ir.MemRefType(v.type) for v in op.operands]
    a, _, c = types
    if not all(t.has_static_shape for t in types):
        return None
    batch = a.shape[0] if op.name == "linalg.batch_matmul" else 1
    return batch, c.shape[-2], c.shape[-1], a.shape[-1], str(a.element_type), str(c.element_type)


def _inline_kernel(module: ir.Module, op: ir.Operation, text: str, callees: str = "", what: str = "matmul") -> None:
    """Parse ``text`` (one function of op's operands; ``callees`` are the functions it calls) and splice
    its body in place of ``op``."""
    try:
        parsed = ir.Module.parse(text + "\n" + callees, module.context)
    except Exception as exc:  # a bug in the template, not the user's input: say which op
        raise CompileError(f"generated {what} kernel does not parse: {exc}", op=op.name) from exc
    _splice(parsed.body.operations[0].operation, op)


def _splice(fn: ir.Operation, op: ir.Operation) -> None:
    """Move the body of ``fn`` (a function of op's operands) in place of ``op``, which is erased."""
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
        # matrix-unit functions by name: text (the matmul kernels) or a builder (the attention kernels)
        mma_funcs: dict[str, str | Callable[[], Any]] = {}
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
                mma_funcs.setdefault(mma_function_name(mm), mma_function(mm))
            types = tuple(str(v.type) for v in op.operands)
            _inline_kernel(module, op, matmul_kernel(mm, types, "__pbsdk_matmul"),  # type: ignore[arg-type]
                           mma_function(mm) if mm.compute == "mma" else "")
        if attention_calls:
            records += _fuse_attention_calls(module, ctx, mma_funcs)
        for step in mma_funcs.values():
            if isinstance(step, str):
                parsed = ir.Module.parse(step, module.context)
                module.body.append(parsed.body.operations[0].operation)
            else:
                with module.context, ir.Location.unknown(), ir.InsertionPoint(module.body):
                    step()
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
                          mma_funcs: dict[str, str | Callable[[], Any]]) -> list[dict[str, Any]]:
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
            with ir.Location.unknown():
                built = ir.Module.create()
                with ir.InsertionPoint(built.body):
                    kernel = build_kernel(am, "__pbsdk_attention", types)
                _splice(kernel.operation, call)
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
