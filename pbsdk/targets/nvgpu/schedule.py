"""Stage ``schedule``: the core's tiled form mapped onto blocks, warps and threads as ``scf.forall`` nests.

nvgpu has no kernels of its own: the core's ``promote`` and ``promote-vector`` stages (run with the units
this target issues, operand *and* accumulator tiles in static shared memory) have already tiled every
op by the plan, staged its tiles in the shared-memory level with copies marked ``pbsdk.dma``, and left
the innermost compute as ops marked ``pbsdk.matrix_unit`` (one ``mma.sync.m16n8k16`` step each) or
``pbsdk.compute`` (fused attention arrives in the same form). This stage only maps that form:

- buffers in the scratchpad's memory space move to the workgroup address space (`to_workgroup`);
- each ``scf.forall`` marked ``pbsdk.compute_level = "<spec.compute[0]>"`` (the parts over the SMs) is
  mapped to ``#gpu.block``; staged code the core left in one part is wrapped in a forall of one block
  (`wrap_unsplit_kernels`);
- inside a block, every matrix-unit op becomes a call of a private function (``@__pbsdk_mma_<i>``, marked
  ``pbsdk.matrix_unit``: its host body is the ``linalg.matmul`` the emulation runs, `lower.py` gives it the
  ``mma.sync`` body) and the loops around it that pick disjoint C tiles are spread over the block's warps
  (``#gpu.warp<linear_dim_0>``, a warp walking every ``warps``-th tile); every other op (copies, fills,
  elementwise and reduction steps) is tiled over the block's threads with the upstream
  ``transform.structured.tile_using_forall`` (``#gpu.thread<linear_dim_*>``, innermost parallel loop
  first, reductions sequential in each thread);
- what the core left on main memory is tiled onto blocks and one point per thread (`mapping.loop_mapping`).

Barriers between the steps come from the upstream thread mapping (one after each thread or warp loop).
The IR is target-neutral in form, so the same module is both lowered to the GPU (`lower.py`) and, with the
parallel loops serialised, executed on the host (`emulate.py`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import Any

from mlir import ir, passmanager
from mlir.dialects import arith, func, linalg, memref, scf, transform
from mlir.dialects.transform import structured

from pbsdk.core.errors import CompileError, UnsupportedError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.passes import match_signature, ops_named
from pbsdk.core.passes.copies_to_linalg import CopiesToLinalg
from pbsdk.core.pipeline import StageContext
from pbsdk.targets.nvgpu.build import (
    apply_transform,
    axis_mapping,
    forall,
    linear_mapping,
    match_tagged,
    workgroup,
)
from pbsdk.targets.nvgpu.mapping import (
    LoopMapping,
    block_thread_limit,
    loop_mapping,
    thread_split,
    warp_share,
    warp_width,
)


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


def _negative_multiplier(expr: ir.AffineExpr) -> bool:
    if isinstance(expr, ir.AffineMulExpr) and isinstance(expr.rhs, ir.AffineConstantExpr) and expr.rhs.value <= 0:
        return True
    return isinstance(expr, ir.AffineBinaryExpr) and (_negative_multiplier(expr.lhs) or _negative_multiplier(expr.rhs))


def tileable(op: ir.Operation) -> bool:
    """Whether upstream linalg tiling takes ``op``: not when an indexing map multiplies a loop index by a
    non-positive constant (a flip reads ``n - 1 - d``), on which its tile check asserts — an abort of the
    process, not an error. Such an op runs on one thread instead."""
    if "indexing_maps" not in op.attributes:
        return True
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    return not any(_negative_multiplier(e) for m in maps for e in m.results)


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
                                                  mapping=axis_mapping("block", len(lm.dims)))
            structured.TileUsingForallOp(any_op, any_op, blocks.tiled_op, num_threads=block,
                                         mapping=axis_mapping("thread", len(lm.dims)))

    try:
        apply_transform(module, script)
    except Exception as exc:
        raise CompileError(f"tiling onto blocks/threads failed: {str(exc).strip()[:2000]}",
                           op="linalg.generic") from exc


# ------------------------------------------------------------------------------------------ the tiled form

def _smem_spaces(spec: Any) -> set[int]:
    """The memory spaces (indices into ``spec.memory``) of the software-managed on-chip levels."""
    pads = {lv.name for lv in spec.scratchpads()}
    return {i for i, lv in enumerate(spec.memory) if lv.name in pads and i > 0}


def _is_memref(t: ir.Type) -> bool:
    return isinstance(t, ir.MemRefType)


def retype_memory_spaces(root: ir.Operation, space: Callable[[ir.Attribute | None], ir.Attribute | None]) -> int:
    """Give every memref value under ``root`` the memory space ``space(old)`` (unchanged where it returns
    the old one), function signatures included; returns how many values changed."""
    changed = 0

    def retype(v: ir.Value) -> None:
        nonlocal changed
        if not _is_memref(v.type):
            return
        mt = ir.MemRefType(v.type)
        old = mt.memory_space
        new = space(old)
        if (new is None and old is None) or (new is not None and old is not None and new == old):
            return
        v.set_type(ir.MemRefType.get(list(mt.shape), mt.element_type, mt.layout, new))
        changed += 1

    def visit(op: ir.Operation) -> ir.WalkResult:
        for r in op.results:
            retype(r)
        for region in op.regions:
            for block in region.blocks:
                for a in block.arguments:
                    retype(a)
        if op.name == "func.func" and op.regions[0].blocks:
            match_signature(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return changed


def to_workgroup(root: ir.Operation, spaces: set[int]) -> int:
    """Retype every memref value under ``root`` in one of the scratchpad ``spaces`` to the workgroup
    address space (what NVVM lowers to ``.shared``); returns how many values changed."""
    ws = workgroup()

    def space(old: ir.Attribute | None) -> ir.Attribute | None:
        return ws if isinstance(old, ir.IntegerAttr) and ir.IntegerAttr(old).value in spaces else old

    return retype_memory_spaces(root, space)


def _in_workgroup(t: ir.Type) -> bool:
    space = ir.MemRefType(t).memory_space if _is_memref(t) else None
    return space is not None and space == workgroup()


def wrap_unsplit_kernels(entry: ir.Operation, level: str) -> int:
    """Staged code the core did not split over the compute level (one part) runs as one block: each run of
    top-level ops from a scratchpad ``memref.alloc`` to the last ``memref.dealloc`` of the buffers opened in
    it moves into an ``scf.forall`` of one iteration, mapped to ``#gpu.block<x>`` and marked with the
    compute level like the core's split loops. Returns how many were wrapped."""
    block = entry.regions[0].blocks[0]
    ops = [op.operation for op in block.operations]
    groups: list[tuple[int, int]] = []
    i = 0
    while i < len(ops):
        op = ops[i]
        if op.name == "memref.alloc" and _in_workgroup(op.results[0].type):
            open_ = {op.results[0]}
            j = i
            while open_ and j + 1 < len(ops):
                j += 1
                nxt = ops[j]
                if nxt.name == "memref.alloc" and _in_workgroup(nxt.results[0].type):
                    open_.add(nxt.results[0])
                elif nxt.name == "memref.dealloc" and nxt.operands[0] in open_:
                    open_.discard(nxt.operands[0])
            if open_:
                raise CompileError("a shared-memory buffer of the staged code is never released", op="memref.alloc")
            groups.append((i, j))
            i = j + 1
        else:
            i += 1
    for lo, hi in groups:
        with ir.InsertionPoint(ops[lo]), ops[lo].location:
            loop_op = forall([1], axis_mapping("block", 1))
            attrs.set_string(loop_op, attrs.COMPUTE_LEVEL, level)
            with ir.InsertionPoint(loop_op.body):
                term = scf.InParallelOp()
        for op in ops[lo:hi + 1]:
            op.move_before(term)
    return len(groups)


def _structured(root: ir.Operation) -> list[ir.Operation]:
    """The linalg ops under ``root`` (not their bodies' ``linalg.yield``/``linalg.index``), in walk order."""
    found: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name.startswith("linalg.") and op.name not in ("linalg.yield", "linalg.index"):
            found.append(op)
        return ir.WalkResult.ADVANCE

    root.walk(visit)
    return found


def _static_index(v: ir.Value) -> int | None:
    owner = v.owner
    if isinstance(owner, ir.Block) or owner.name != "arith.constant":
        return None
    return ir.IntegerAttr(owner.attributes["value"]).value


def _upper_bounds(v: ir.Value) -> list[int | None]:
    """Static sizes of memref ``v``, a dynamic one bounded by the buffer it is a (same-rank) subview of."""
    t = ir.MemRefType(v.type)
    sizes: list[int | None] = [s if s >= 0 else None for s in t.shape]
    owner = v.owner
    if None in sizes and not isinstance(owner, ir.Block) and owner.name == "memref.subview":
        src = owner.operands[0]
        if ir.MemRefType(src.type).rank == t.rank:
            outer = _upper_bounds(src)
            sizes = [s if s is not None else o for s, o in zip(sizes, outer)]
    return sizes


def _loop_dims(op: ir.Operation) -> tuple[list[int | None], list[str]]:
    """Upper bounds of a generic's loops (None where nothing static bounds them) and iterator kinds."""
    maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
    iterators = [str(a).split("<")[-1].rstrip(">") for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    extents: list[int | None] = [None] * len(iterators)
    for value, amap in zip(op.operands, maps):
        if not _is_memref(value.type):
            continue
        for size, expr in zip(_upper_bounds(value), amap.results):
            if isinstance(expr, ir.AffineDimExpr) and size is not None:
                d = ir.AffineDimExpr(expr).position
                extents[d] = size if extents[d] is None else min(extents[d], size)  # type: ignore[type-var]
    return extents, iterators


def _def_chain(v: ir.Value) -> set[ir.Value]:
    """``v`` and the values its view ops (subviews, reshapes, affine index arithmetic) read, transitively."""
    seen: set[ir.Value] = set()
    todo = [v]
    while todo:
        x = todo.pop()
        if x in seen:
            continue
        seen.add(x)
        owner = x.owner
        if isinstance(owner, ir.Block):
            continue
        if owner.name.startswith(("memref.", "affine.", "arith.")):
            todo.extend(owner.operands)
    return seen


class _Mapper:
    """Maps one block's tiled form onto warps and threads (see `Schedule`)."""

    def __init__(self, module: ir.Module, spec: Any, threads: int, warp: int) -> None:
        self.module = module
        self.spec = spec
        self.threads = threads
        self.warp = warp
        self.mma_funcs: dict[tuple[object, ...], str] = {}
        self.tagged: list[tuple[int, list[int]]] = []
        self.index = ir.IndexType.get()

    # ---------------------------------------------------------------- unit ops -> warps

    def unit_form(self, op: ir.Operation) -> tuple[bool, bool, bool] | None:
        """For a matrix-unit op this target issues as ``mma.sync`` (size-1 batch dims aside): whether A is
        stored as (k, m), B as (n, k) and C as (n, m) — the transposed layouts `mma.py` reads; None when its
        form is another (it then runs on the threads)."""
        unit = attrs.string(op, attrs.MATRIX_UNIT) or ""
        if not unit.startswith("mma.sync.m16n8k16"):
            return None
        maps = [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]
        _, iterators = _loop_dims(op)
        if len(maps) != 3 or iterators.count("reduction") != 1:
            return None
        dims = [[ir.AffineDimExpr(e).position if isinstance(e, ir.AffineDimExpr) else -1 for e in m.results]
                for m in maps]
        a, b, c = (set(d) - {-1} for d in dims)
        k = iterators.index("reduction")
        batch = a & b & c
        ms, ns = (a & c) - batch, (b & c) - batch
        if len(ms) != 1 or len(ns) != 1:
            return None
        m, n = ms.pop(), ns.pop()

        def layout(d: list[int], rows: int, cols: int) -> bool | None:
            kept = [x for x in d if x not in batch]
            return False if kept == [rows, cols] else True if kept == [cols, rows] else None

        flags = (layout(dims[0], m, k), layout(dims[1], k, n), layout(dims[2], m, n))
        if None in flags:
            return None
        return flags  # type: ignore[return-value]

    def drop_unit_dims(self, v: ir.Value, rank: int) -> ir.Value:
        """``v`` as a rank-``rank`` view (its size-1 leading dims dropped: the batch dims of one unit step)."""
        t = ir.MemRefType(v.type)
        if t.rank == rank:
            return v
        strides, offset = t.get_strides_and_offset()
        keep = list(range(t.rank - rank, t.rank))
        rtype = ir.MemRefType.get([t.shape[d] for d in keep], t.element_type,
                                  ir.StridedLayoutAttr.get(offset, [strides[d] for d in keep]), t.memory_space)
        return memref.SubViewOp(rtype, v, [], [], [], [0] * t.rank, list(t.shape), [1] * t.rank).result

    def mma_function(self, unit: str, types: Sequence[ir.Type], layout: tuple[bool, bool, bool]) -> str:
        """The private function of one unit step on views of ``types`` (A, B, C, transposed as ``layout``
        says): its host body is the multiply-accumulate; `lower.py` gives it the ``mma.sync`` body."""
        key = (unit, *(str(t) for t in types), *layout)
        if key in self.mma_funcs:
            return self.mma_funcs[key]
        name = f"__pbsdk_mma_{len(self.mma_funcs)}"
        self.mma_funcs[key] = name
        at, bt, ct = layout
        with ir.InsertionPoint(self.module.body), ir.Location.unknown():
            fn = func.FuncOp(name, ir.FunctionType.get(list(types), []), visibility="private")
            attrs.set_string(fn.operation, attrs.MATRIX_UNIT, unit)
            for flag, mark in zip(layout, (attrs.A_TRANSPOSED, attrs.B_TRANSPOSED, attrs.C_TRANSPOSED)):
                if flag:
                    attrs.set_unit(fn.operation, mark)
            with ir.InsertionPoint(fn.add_entry_block()):
                a, b, c = fn.arguments
                m, n, k = (ir.AffineDimExpr.get(i) for i in range(3))
                maps = [ir.AffineMap.get(3, 0, list(p)) for p in
                        ([k, m] if at else [m, k], [n, k] if bt else [k, n], [n, m] if ct else [m, n])]
                mac = linalg.GenericOp_([a, b], [c], maps, [linalg.IteratorType.parallel, linalg.IteratorType.parallel,
                                                            linalg.IteratorType.reduction])
                body = mac.regions[0].blocks[0]
                x, y, acc = body.arguments
                with ir.InsertionPoint(body):
                    xs = [arith.extf(acc.type, v) for v in (x, y)]
                    linalg.YieldOp([arith.addf(acc, arith.mulf(xs[0], xs[1]))])
                func.ReturnOp([])
        return name

    def to_warps(self, op: ir.Operation, block_forall: ir.Operation) -> bool:
        """Replace matrix-unit op ``op`` by a call of its ``mma.sync`` function and spread the loops around
        it that pick disjoint C tiles over the block's warps. False when ``op`` is not in that form."""
        layout = self.unit_form(op)
        if layout is None:
            return False
        unit = attrs.string(op, attrs.MATRIX_UNIT) or ""
        c_values = _def_chain(op.operands[2])
        call = self.k_strip(op, layout, unit)
        if call is None:
            with ir.InsertionPoint(op), op.location:
                views = [self.drop_unit_dims(v, 2) for v in op.operands]
                name = self.mma_function(unit, [v.type for v in views], layout)
                call = func.CallOp([], ir.FlatSymbolRefAttr.get(name), views).operation
            op.erase()
        self.spread_over_warps(call, c_values, block_forall)
        return True

    def k_strip(self, op: ir.Operation, layout: tuple[bool, bool, bool], unit: str) -> ir.Operation | None:
        """When ``op`` is the only work of a static ``scf.for`` over k (its body: ``op`` and the subviews of
        its operands, A's and B's at the loop's k offset), replace the loop's unit steps by calls on strips
        of `MAX_STRIP_K` (or the whole loop, when shorter: the loop goes) — A 16 x S, B S x 8 (or transposed),
        C as it is — so that each call keeps C's fragments in registers across its steps. Returns the call
        (the whole loop's, or inside the loop, whose step becomes S), or None when ``op`` is not so."""
        loop_op = op.parent
        if loop_op is None or loop_op.name != "scf.for":
            return None
        forop = loop_op.opview
        iv = forop.induction_variable
        lo, hi, step = (_static_index(v) for v in (forop.lowerBound, forop.upperBound, forop.step))
        if lo is None or hi is None or step is None or (hi - lo) % step:
            return None
        body = [o.operation for o in loop_op.regions[0].blocks[0].operations][:-1]
        if any(o != op and o.name != "memref.subview" for o in body):
            return None
        total = hi - lo
        strip = total if total <= MAX_STRIP_K else \
            max(w for w in range(step, MAX_STRIP_K + 1, step) if total % w == 0)
        if strip == step:
            return None  # one unit step per call already
        parts: list[Any] = []
        for i, v in enumerate(op.operands):
            owner = v.owner
            inside = not isinstance(owner, ir.Block) and owner in body
            if i == 2:  # C: the same view (made in front of the loop when the loop goes)
                if inside and iv in list(owner.operands):
                    return None
                parts.append(v)
                continue
            kdim = (1, 0)[i] if not layout[i] else (0, 1)[i]
            if not inside or owner.name != "memref.subview":
                return None
            sv = owner.opview
            src_t, t = ir.MemRefType(sv.source.type), ir.MemRefType(v.type)
            if src_t.rank != 2 or t.rank != 2 or t.shape[kdim] != step:
                return None
            offsets = list(sv.offsets)
            static = list(ir.DenseI64ArrayAttr(sv.attributes["static_offsets"]))
            dyn = [j for j, o in enumerate(static) if o == ir.ShapedType.get_dynamic_stride_or_offset()]
            if iv not in offsets or dyn[offsets.index(iv)] != kdim or list(sv.sizes) or list(sv.strides):
                return None
            parts.append((sv, kdim, offsets))
        whole = strip == total

        def view(sv: Any, kdim: int, offsets: list[ir.Value], at: ir.Value) -> ir.Value:
            t = ir.MemRefType(sv.result.type)
            shape = list(t.shape)
            shape[kdim] = strip
            sizes = list(ir.DenseI64ArrayAttr(sv.attributes["static_sizes"]))
            sizes[kdim] = strip
            rtype = ir.MemRefType.get(shape, t.element_type, t.layout, t.memory_space)
            return memref.SubViewOp(rtype, sv.source, [at if o == iv else o for o in offsets], [], [],
                                    list(ir.DenseI64ArrayAttr(sv.attributes["static_offsets"])), sizes,
                                    list(ir.DenseI64ArrayAttr(sv.attributes["static_strides"]))).result

        made: list[ir.Value] = []
        with ir.InsertionPoint(loop_op if whole else op), op.location:
            at = arith.constant(self.index, lo) if whole else iv
            for p in parts:
                if isinstance(p, ir.Value):
                    owner = p.owner
                    if whole and not isinstance(owner, ir.Block) and owner in body:
                        owner.move_before(loop_op)
                    made.append(p)
                else:
                    sv_p, kdim_p, offsets_p = p
                    made.append(view(sv_p, kdim_p, offsets_p, at))
            name = self.mma_function(unit, [v.type for v in made], layout)
            call = func.CallOp([], ir.FlatSymbolRefAttr.get(name), made).operation
        if whole:
            loop_op.erase()
        else:
            with ir.InsertionPoint(loop_op), op.location:
                forop.operation.operands[2] = arith.constant(self.index, strip)
            olds = [p[0] for p in parts if not isinstance(p, ir.Value)]
            op.erase()
            for sv in olds:
                sv.operation.erase()
        return call

    def spread_over_warps(self, call: ir.Operation, c_values: set[ir.Value], block_forall: ir.Operation) -> None:
        # the perfect nest of scf.for around the call, outermost first
        nest: list[ir.Operation] = []
        parent = call.parent
        while parent is not None and parent.name == "scf.for" and parent != block_forall:
            body_ops = [o.operation for o in parent.regions[0].blocks[0].operations]
            if nest and not (len(body_ops) == 2 and body_ops[0] == nest[0]):
                break
            nest.insert(0, parent)
            parent = parent.parent
        prefix: list[tuple[ir.Operation, int, int, int]] = []
        for loop_op in nest:
            forop = loop_op.opview
            iv = forop.induction_variable
            bounds = [_static_index(v) for v in (forop.lowerBound, forop.upperBound, forop.step)]
            if iv not in c_values or any(b is None for b in bounds):
                break
            lo, hi, st = bounds
            prefix.append((loop_op, lo, hi, st))  # type: ignore[arg-type]
        trips = [-(-(hi - lo) // st) for _, lo, hi, st in prefix]
        total = math.prod(trips) if trips else 1
        warps = warp_share(total, self.threads, self.warp)
        anchor = prefix[0][0] if prefix else (nest[0] if nest else None)
        index = self.index
        with (ir.InsertionPoint(anchor) if anchor is not None else ir.InsertionPoint(call)), call.location:
            wl = forall([warps], linear_mapping("warp", 1))
            with ir.InsertionPoint(wl.body):
                (w,) = wl.body.arguments
                lin_loop = scf.ForOp(w, arith.constant(index, total), arith.constant(index, warps))
                with ir.InsertionPoint(lin_loop.body):
                    term = scf.YieldOp([])
                scf.InParallelOp()
            with ir.InsertionPoint(term):
                lin = lin_loop.induction_variable
                stride = total
                ivs = []
                for i, ((_, lo, _, st), t) in enumerate(zip(prefix, trips)):
                    stride //= t
                    q = arith.divui(lin, arith.constant(index, stride)) if stride > 1 else lin
                    idx = arith.remui(q, arith.constant(index, t)) if i > 0 else q
                    ivs.append(arith.addi(arith.muli(idx, arith.constant(index, st)), arith.constant(index, lo)))
        if prefix:
            inner_body = prefix[-1][0].regions[0].blocks[0]
            for op in [o.operation for o in inner_body.operations][:-1]:
                op.move_before(term)
            for (loop_op, *_), iv in zip(prefix, ivs):
                loop_op.opview.induction_variable.replace_all_uses_with(iv)
            prefix[0][0].erase()
        elif anchor is not None:
            anchor.move_before(term)
        else:  # the call alone, its views made just before it
            call.move_before(term)

    # ---------------------------------------------------------------- other ops -> threads

    def to_threads(self, op: ir.Operation, tag: int) -> None:
        """Tag ``op`` to be tiled over the block's threads (`mapping.thread_split`); an op without a
        parallel loop to share runs on one thread."""
        split = list(thread_split(*_loop_dims(op), self.threads)) if tileable(op) else []
        if not any(split):
            with ir.InsertionPoint(op), op.location:
                one = forall([1], linear_mapping("thread", 1))
                with ir.InsertionPoint(one.body):
                    term = scf.InParallelOp()
            op.move_before(term)
            return
        attrs.set_i64(op, attrs.KERNEL, tag)
        self.tagged.append((tag, split))


def _tile_on_threads(module: ir.Module, tagged: list[tuple[int, list[int]]]) -> None:
    """One transform script: each tagged op inside a block tiled over that block's threads."""
    if not tagged:
        return

    def script(root: ir.Value) -> None:
        any_op = transform.AnyOpType.get()
        for tag, split in tagged:
            mapped = sum(1 for t in split if t)
            op = match_tagged(root, attrs.KERNEL, tag)
            structured.TileUsingForallOp(any_op, any_op, op, num_threads=split,
                                         mapping=linear_mapping("thread", mapped))

    try:
        apply_transform(module, script)
    except Exception as exc:
        raise CompileError(f"tiling onto threads failed: {str(exc).strip()[:2000]}", op="linalg.generic") from exc


#: Longest k strip one unit-step call covers (its C fragments stay in registers across the strip; longer
#: strips unroll into more live fragment registers than a thread has without spilling).
MAX_STRIP_K = 64

#: Threads per block for the core's staged kernels: four warps.
BLOCK_THREADS = 128


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Pass ``nvgpu-schedule``: the core's tiled form onto the GPU hierarchy (see the module docstring).

    Records what it decided in ``ctx.notes["nvgpu.kernels"]`` (one dict per kernel, in launch order)."""

    name = "nvgpu-schedule"

    def apply(self, module: ir.Module, ctx: StageContext) -> None:
        spec = ctx.spec
        records: list[dict[str, Any]] = []
        level = spec.compute[0].name
        CopiesToLinalg(only_strided=False).apply(module)
        with module.context, ir.Location.unknown():
            to_workgroup(module.operation, _smem_spaces(spec))
        run_passes(module, "func.func(linalg-generalize-named-ops)")
        warp = warp_width(spec)
        threads = min(BLOCK_THREADS, block_thread_limit(spec))
        tag = 0
        with module.context, ir.Location.unknown():
            mapper = _Mapper(module, spec, threads, warp)
            # Function by function (before inlining: a fused attention is still its own function).
            for fn in [op.operation for op in module.body.operations if op.operation.name == "func.func"]:
                if not fn.regions[0].blocks or attrs.has(fn, attrs.MATRIX_UNIT):
                    continue
                kind = "attention" if attrs.has(fn, attrs.ATTENTION) else "tiled"
                wrap_unsplit_kernels(fn, level)
                for op in [o.operation for o in fn.regions[0].blocks[0].operations]:
                    if op.name != "scf.forall" or attrs.string(op, attrs.COMPUTE_LEVEL) != level:
                        continue
                    grid = list(ir.DenseI64ArrayAttr(op.attributes["staticUpperBound"]))
                    if len(grid) > 3:
                        raise UnsupportedError(f"{len(grid)} parallel loops over the {level}s (blocks take at most "
                                               "3)", op="scf.forall")
                    op.attributes["mapping"] = axis_mapping("block", len(grid))
                    units = thread_ops = 0
                    for inner in _structured(op):
                        if attrs.has(inner, attrs.MATRIX_UNIT) and mapper.to_warps(inner, op):
                            units += 1
                            continue
                        mapper.to_threads(inner, tag)
                        tag += 1
                        thread_ops += 1
                    records.append({"op": "scf.forall", "kind": kind, "level": level, "grid": grid,
                                    "threads": threads, "unit_ops": units, "thread_ops": thread_ops,
                                    "compute": "mma" if units else "thread"})
            for call in ops_named(module, "func.call"):  # the unit steps stay calls (`lower.py` swaps bodies)
                if ir.FlatSymbolRefAttr(call.attributes["callee"]).value in mapper.mma_funcs.values():
                    call.attributes["no_inline"] = ir.UnitAttr.get()
        _tile_on_threads(module, mapper.tagged)
        run_passes(module, "inline, symbol-dce, canonicalize")
        # What the core left on main memory: tiled by its loop mapping onto blocks and threads.
        entry = entry_function(module, ctx.notes["entry"])
        tagged: list[tuple[int, LoopMapping]] = []
        with module.context:
            for op in [o.operation for o in entry.regions[0].blocks[0].operations]:
                if op.name != "linalg.generic":
                    continue
                extents, iterators = loop_extents(op)
                lm = loop_mapping(extents, iterators, threads=min(256, block_thread_limit(spec)),
                                  units=spec.compute[0].count, warp=warp)
                records.append({"op": "linalg.generic", "kind": "loops", "iterators": iterators,
                                "mapping": dataclasses.asdict(lm)})
                if not lm.dims or not tileable(op):
                    attrs.set_unit(op, attrs.SINGLE_THREAD)
                    records[-1]["single_thread"] = "untileable map (a flip)" if lm.dims else "no parallel loop"
                    continue
                attrs.set_i64(op, attrs.KERNEL, tag)
                tagged.append((tag, lm))
                tag += 1
        _tile_loops(module, tagged)
        run_passes(module, "canonicalize, cse")
        ctx.notes["nvgpu.kernels"] = records
