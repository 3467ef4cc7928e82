"""The template target's stages: apply the lowering hooks to the promoted IR, count, lower to the host.

Each IR-building hook (the contract: `pbsdk.core.hooks`; the emulation: `pbsdk.targets.template.hooks`) is called once per distinct signature, inside a
private function this module builds for it with the bindings (arguments: the op's operands; insertion
point: its entry block; location: the lowered op's). What the hook built is verified there — an
exception or an op that does not verify is a `CompileError` naming the hook — then every lowered op
becomes a ``func.call`` of that function, and the ``scratchpad`` stage inlines them all. Counters are the
global of `pbsdk.targets.template.counters`; the executable zeroes them before each run and reads them
back after it (`TemplateExecutable`).
"""

from __future__ import annotations

import ctypes
import functools
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from mlir import ir, passmanager
from mlir.dialects import func

from pbsdk.core import hooks as contract
from pbsdk.core.errors import CompileError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.passes import ops_named
from pbsdk.core.pipeline import StageContext
from pbsdk.core.plan.chip_time import ModelledTime, modelled_time
from pbsdk.core.plan.workspace import first_fit
from pbsdk.core.spec import ChipSpec, MemoryLevel
from pbsdk.core.target import Artifact, Executable
from pbsdk.targets.template.counters import COUNTERS_GLOBAL, MAX_COUNTERS, Counter, declare_counters

__all__ = ["COUNTERS_GLOBAL", "MAX_COUNTERS", "TemplateExecutable", "lower_dma", "lower_matrix_units",
           "lower_scratchpads", "lower_vector_tiles", "strip_memory_spaces"]


#: The functions the stages call, one per hook of `hooks.TEMPLATE_HOOKS` (`TemplateTarget.resolved_hooks`).
Hooks = Mapping[str, Callable[..., Any]]


def _counter(ctx: StageContext, name: str) -> Counter:
    return Counter(name, ctx.notes.setdefault("counters", []))


def _build(module: ir.Module, call: Callable[[Sequence[ir.Value]], Any], *, hook: str, name: str,
           inputs: Sequence[ir.Type], result: ir.Type | None, loc: ir.Location, op: str) -> func.FuncOp | None:
    """Build ``func.func private @name(inputs) [-> result]`` at the end of ``module``: ``call(args)`` calls
    the hook with the insertion point in the entry block (for a ``result``, it returns the value to
    return, or None to build nothing: then None is returned), then the function is verified. Every
    failure is a `CompileError` naming ``hook``."""
    with module.context, loc:
        with ir.InsertionPoint(module.body):
            fn = func.FuncOp(name, (list(inputs), [] if result is None else [result]), visibility="private")
        block = fn.add_entry_block()
        try:
            with ir.InsertionPoint(block):
                returned = call(list(block.arguments))
                if result is not None and returned is None:
                    fn.operation.erase()
                    return None
                if result is None and returned is not None:
                    raise CompileError(f"hook {hook} returned a {type(returned).__name__}: it builds IR at the "
                                       "insertion point and returns None (MLIR text is no longer accepted)", op=op)
                func.ReturnOp([] if result is None else [returned])
        except CompileError:
            raise
        except Exception as exc:
            raise CompileError(f"hook {hook} failed: {type(exc).__name__}: {exc}", op=op) from exc
        try:
            fn.operation.verify()
            module.operation.verify()  # symbol uses (calls to functions the hook declared)
        except ir.MLIRError as exc:
            raise CompileError(f"hook {hook} built IR that does not verify: {_diagnostics(exc)}\n{fn}", op=op) from None
    return fn


def _diagnostics(exc: ir.MLIRError) -> str:
    return "; ".join(str(d.message) for d in exc.error_diagnostics) or str(exc)


def _call(op: ir.Operation, fn: func.FuncOp, operands: Sequence[ir.Value]) -> None:
    with ir.InsertionPoint(op), op.location:
        func.CallOp(fn, list(operands))
    op.erase()


def _maps_and_iterators(op: ir.Operation) -> tuple[tuple[ir.AffineMap, ...], tuple[str, ...]]:
    maps = tuple(ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"]))
    its = tuple("reduction" if "reduction" in str(a) else "parallel" for a in ir.ArrayAttr(op.attributes["iterator_types"]))
    return maps, its


def compute_level_parts(module: ir.Module) -> int:
    """The most iterations of any ``scf.forall`` over a compute level (``pbsdk.compute_level``) with static
    bounds: how many units of the chip the widest kernel keeps busy (1 without one)."""
    most = 1
    for op in ops_named(module, "scf.forall"):
        if not attrs.has(op, attrs.COMPUTE_LEVEL):
            continue
        try:
            lbs, ubs, steps = (list(ir.DenseI64ArrayAttr(op.attributes[n]))
                               for n in ("staticLowerBound", "staticUpperBound", "staticStep"))
        except (KeyError, ValueError):
            continue
        if any(v == ir.ShapedType.get_dynamic_size() for v in (*lbs, *ubs, *steps)):
            continue
        most = max(most, math.prod(max(0, -(-(u - lo) // st)) for lo, u, st in zip(lbs, ubs, steps)))
    return most


def lower_matrix_units(module: ir.Module, ctx: StageContext, hooks: Hooks) -> None:
    """Replace every ``pbsdk.matrix_unit`` op by a call to a function the ``matrix_unit_op`` hook built."""
    spec: ChipSpec = ctx.spec
    hook = hooks["matrix_unit_op"]
    ctx.notes["forall_parts"] = compute_level_parts(module)
    declare_counters(module)
    made: dict[tuple[Any, ...], func.FuncOp] = {}
    for op in ops_named(module, "linalg.generic"):
        unit_name = attrs.string(op, attrs.MATRIX_UNIT)
        if unit_name is None:
            continue
        operand = attrs.string(op, attrs.UNIT_OPERAND)
        accumulator = attrs.string(op, attrs.UNIT_ACCUMULATOR)
        if operand is None or accumulator is None:
            raise CompileError(f"op marked {attrs.MATRIX_UNIT} = \"{unit_name}\" lacks {attrs.UNIT_OPERAND} or "
                               f"{attrs.UNIT_ACCUMULATOR} (the unit's operand and accumulator dtypes)", op=op.name)
        unit = next((u for u in spec.matrix_units if (u.name, u.operand_dtype, u.accumulator_dtype)
                     == (unit_name, operand, accumulator)), None)
        if unit is None:
            units = ", ".join(f"{u.name} {u.operand_dtype}->{u.accumulator_dtype}" for u in spec.matrix_units)
            raise CompileError(f"spec '{spec.name}' has no matrix unit {unit_name} {operand}->{accumulator} "
                               f"(its units: {units or 'none'})", op="linalg.generic")
        if len(op.operands) != 3 or not all(isinstance(v.type, ir.MemRefType) for v in op.operands):
            raise CompileError(f"a matrix-unit op ({unit_name}) computes C += A x B on three memrefs; this one has "
                               f"operands {', '.join(str(v.type) for v in op.operands)}", op=op.name)
        types = [ir.MemRefType(v.type) for v in op.operands]
        maps, its = _maps_and_iterators(op)
        key = (unit_name, operand, accumulator, *map(str, types), *map(str, maps))
        if key not in made:
            a_t, b_t, c_t = types
            with module.context:
                uop = contract.UnitOp(
                    module=module, unit=unit, a_type=a_t, b_type=b_t, c_type=c_t, a_dtype=a_t.element_type,
                    b_dtype=b_t.element_type, c_dtype=c_t.element_type,
                    operand_dtype=contract.element_type(unit.operand_dtype),
                    accumulator_dtype=contract.element_type(unit.accumulator_dtype),
                    indexing_maps=(maps[0], maps[1], maps[2]), iterator_types=its,
                    count=_counter(ctx, f"matrix_unit:{unit.name}"))
            fn = _build(module, functools.partial(_unit_body, hook, uop, spec), hook="matrix_unit_op",
                        name=f"__pbsdk_{unit_name.replace('.', '_')}_{len(made)}", inputs=types, result=None,
                        loc=op.location, op=op.name)
            assert fn is not None
            made[key] = fn
        _call(op, made[key], list(op.operands))


#: Ops the core marks as vector-unit work on tiles (`attributes.COMPUTE`).
_VECTOR_OPS = ("linalg.generic", "linalg.fill", "linalg.copy", "linalg.matmul", "linalg.batch_matmul")


def lower_vector_tiles(module: ir.Module, ctx: StageContext, hooks: Hooks) -> None:
    """Lower every op marked ``pbsdk.compute`` in place through the ``vector_tile_op`` hook: called with
    the insertion point before the op, it builds the computation on the op's operands; the op is then
    erased and the function verified (a failure is a `CompileError` naming the hook)."""
    spec: ChipSpec = ctx.spec
    hook = hooks["vector_tile_op"]
    declare_counters(module)
    marked = [op for name in _VECTOR_OPS for op in ops_named(module, name) if attrs.has(op, attrs.COMPUTE)]
    touched: list[ir.Operation] = []
    for op in marked:
        kind = attrs.string(op, attrs.COMPUTE) or "vector"
        memrefs = [ir.MemRefType(v.type) for v in op.operands if isinstance(v.type, ir.MemRefType)]
        if not memrefs:
            raise CompileError(f"an op marked {attrs.COMPUTE} = \"{kind}\" works on tiles in memory; this one has "
                               "no memref operand", op=op.name)
        level = max((_level(spec, t, op) for t in memrefs), key=spec.memory.index)  # its innermost level
        if "indexing_maps" in op.attributes:
            maps, its = _maps_and_iterators(op)
        else:
            maps, its = (), ()
        n_inputs = len(op.operands) - _outputs(op)
        with module.context:
            vop = contract.VectorTileOp(
                module=module, kind=kind, level=level, op_name=op.name,
                operand_types=tuple(v.type for v in op.operands), inputs=n_inputs, indexing_maps=maps,
                iterator_types=its, count_elements=_counter(ctx, f"vector:{level.name}"), original=op,
                count_instructions=lambda name: _counter(ctx, f"vector_op:{name}"))
        try:
            with ir.InsertionPoint(op), op.location:
                returned = hook(vop, list(op.operands), spec)
        except CompileError:
            raise
        except Exception as exc:
            raise CompileError(f"hook vector_tile_op failed: {type(exc).__name__}: {exc}", op=op.name) from exc
        if returned is not None:
            raise CompileError(f"hook vector_tile_op returned a {type(returned).__name__}: it builds IR at the "
                               "insertion point and returns None", op=op.name)
        parent = op.parent
        while parent is not None and parent.name != "func.func":
            parent = parent.parent
        op.erase()
        if parent is not None and parent not in touched:
            touched.append(parent)
    for fn in touched:
        try:
            fn.verify()
        except ir.MLIRError as exc:
            raise CompileError(f"hook vector_tile_op built IR that does not verify: {_diagnostics(exc)}",
                               op="func.func") from None


def _outputs(op: ir.Operation) -> int:
    """How many operands of a linalg op on buffers are outputs (``outs``: its ``operandSegmentSizes``)."""
    if "operandSegmentSizes" not in op.attributes:
        return 1
    return int(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"])[1])


def _unit_body(hook: Callable[..., Any], op: contract.UnitOp, spec: ChipSpec, args: Sequence[ir.Value]) -> Any:
    a, b, c = args
    return hook(op, a, b, c, spec)


def _dma_body(hook: Callable[..., Any], fields: dict[str, Any], spec: ChipSpec, args: Sequence[ir.Value]) -> Any:
    # The description holds the source value (what byte_count measures), so it is made here.
    src, dst = args
    return hook(contract.DmaCopy(**fields, source=src), src, dst, spec)


def _alloc_body(hook: Callable[..., ir.Value | None], alloc: contract.ScratchpadAlloc, spec: ChipSpec,
                args: Sequence[ir.Value]) -> ir.Value | None:
    return hook(alloc, spec)


def _alignment(op: ir.Operation) -> int:
    return ir.IntegerAttr(op.attributes["alignment"]).value if "alignment" in op.attributes else 1


def _size(t: ir.MemRefType) -> int:
    return math.prod(t.shape) * contract.bytes_per_element(t.element_type)


def _scratchpad_offsets(module: ir.Module) -> dict[ir.Operation, int]:
    """A byte offset for every scratchpad ``memref.alloc``: first fit, aligned, among the buffers of its
    level that are live at that point of its function (allocated, not yet deallocated, in program order)."""
    offsets: dict[ir.Operation, int] = {}
    live: dict[int, dict[ir.Operation, tuple[int, int]]] = {}  # space -> alloc -> [start, end)

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "memref.alloc" and _space(ir.MemRefType(op.result.type)):
            t = ir.MemRefType(op.result.type)
            align, size, ranges = _alignment(op), _size(t), live.setdefault(_space(t), {})
            offset = first_fit(sorted(ranges.values()), size, align)
            ranges[op] = (offset, offset + size)
            offsets[op] = offset
        elif op.name == "memref.dealloc":
            owner = op.operands[0].owner
            for ranges in live.values():
                ranges.pop(getattr(owner, "operation", owner), None)
        return ir.WalkResult.ADVANCE

    for fn in ops_named(module, "func.func"):
        live.clear()
        fn.walk(visit)
    return offsets


def _space(t: ir.MemRefType) -> int:
    ms = t.memory_space
    return 0 if ms is None else ir.IntegerAttr(ms).value


def _level(spec: ChipSpec, t: ir.MemRefType, op: ir.Operation) -> MemoryLevel:
    """The memory level of ``t``'s memory space (space ``i`` is ``spec.memory[i]``)."""
    space = _space(t)
    if not 0 <= space < len(spec.memory):
        levels = ", ".join(f"{i} {m.name}" for i, m in enumerate(spec.memory))
        raise CompileError(f"memory space {space} of {t} is not a memory level of spec '{spec.name}' (its levels: "
                           f"{levels})", op=op.name)
    return spec.memory[space]


def lower_dma(module: ir.Module, ctx: StageContext, hooks: Hooks) -> None:
    """Replace every copy marked ``pbsdk.dma`` (``linalg.copy`` or ``memref.copy``) by a call to a function
    the ``dma_copy`` hook built."""
    spec: ChipSpec = ctx.spec
    hook = hooks["dma_copy"]
    declare_counters(module)
    made: dict[tuple[str, str], func.FuncOp] = {}
    copies = [op for name in ("linalg.copy", "memref.copy") for op in ops_named(module, name)
              if attrs.has(op, attrs.DMA)]
    for op in copies:
        src_t, dst_t = (ir.MemRefType(v.type) for v in op.operands)
        key = (str(src_t), str(dst_t))
        if key not in made:
            src_level, dst_level = _level(spec, src_t, op), _level(spec, dst_t, op)
            shape = tuple(None if src_t.is_dynamic_dim(i) else src_t.shape[i] for i in range(src_t.rank))
            pair = _counter(ctx, f"bytes:{src_level.name}->{dst_level.name}")
            fields = {"module": module, "src_level": src_level, "dst_level": dst_level, "src_type": src_t,
                      "dst_type": dst_t, "element_type": src_t.element_type, "shape": shape, "count_bytes": pair}
            fn = _build(module, functools.partial(_dma_body, hook, fields, spec), hook="dma_copy",
                        name=f"__pbsdk_dma_{len(made)}", inputs=[src_t, dst_t], result=None, loc=op.location,
                        op=op.name)
            assert fn is not None
            made[key] = fn
        _call(op, made[key], list(op.operands))


def lower_scratchpads(module: ir.Module, ctx: StageContext, hooks: Hooks) -> None:
    """Ask the ``scratchpad_alloc`` hook about every scratchpad buffer; inline the hooks' functions; then,
    on the host, every level is host memory: drop the memory spaces."""
    spec: ChipSpec = ctx.spec
    hook = hooks["scratchpad_alloc"]
    offsets = _scratchpad_offsets(module)
    for i, op in enumerate(ops_named(module, "memref.alloc")):
        t = ir.MemRefType(op.result.type)
        space = _space(t)
        if space == 0:
            continue
        alloc = contract.ScratchpadAlloc(module=module, level=_level(spec, t, op), space=space, type=t,
                                              alignment=_alignment(op), size=_size(t), offset=offsets[op])
        fn = _build(module, functools.partial(_alloc_body, hook, alloc, spec), hook="scratchpad_alloc",
                    name=f"__pbsdk_scratchpad_{i}", inputs=[], result=t, loc=op.location, op=op.name)
        if fn is None:
            continue
        with ir.InsertionPoint(op), op.location:
            call = func.CallOp(fn, [])
        for use in list(op.result.uses):
            if use.owner.name == "memref.dealloc":
                use.owner.erase()
        op.result.replace_all_uses_with(call.result)
        op.erase()
    with module.context:
        passmanager.PassManager.parse("builtin.module(inline, symbol-dce)").run(module.operation)
    strip_memory_spaces(module)


def strip_memory_spaces(module: ir.Module) -> None:
    """Give every memref value the default memory space (the host has one memory)."""

    def plain(t: ir.Type) -> ir.Type | None:
        if not isinstance(t, ir.MemRefType) or t.memory_space is None:
            return None
        mt = ir.MemRefType(t)
        return ir.MemRefType.get(mt.shape, mt.element_type, mt.layout)

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "memref.global":  # a buffer a scratchpad_alloc hook placed in a global
            new_global = plain(ir.TypeAttr(op.attributes["type"]).value)
            if new_global is not None:
                op.attributes["type"] = ir.TypeAttr.get(new_global)
        for r in op.results:
            new = plain(r.type)
            if new is not None:
                r.set_type(new)
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    new = plain(arg.type)
                    if new is not None:
                        arg.set_type(new)
        return ir.WalkResult.ADVANCE

    with module.context, ir.Location.unknown():
        module.operation.walk(visit)
        for f in ops_named(module, "func.func"):
            ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
            if any(plain(t) is not None for t in list(ftype.inputs) + list(ftype.results)):
                name = ir.StringAttr(f.attributes["sym_name"]).value
                raise CompileError(f"function @{name} still takes scratchpad memrefs after "
                                   "inlining: on the host, a hook's external functions take addresses "
                                   "(hooks.address, hooks.strides), not memrefs in a scratchpad's memory space")


def lower_llvm() -> str:
    """The passes that take the emulation's module to the LLVM dialect for this host's JIT: bf16 computed in
    f32 with its conversions expanded where the host's LLVM back end would otherwise get bf16 arithmetic it
    cannot legalise or conversions it has no instruction for (`pbsdk.targets.cpu.expands_bf16`: AVX512-FP16
    hosts, e.g. Sapphire Rapids, and hosts without AVX512-BF16)."""
    from pbsdk.targets.cpu import bf16_expansion, machine

    return ("func.func(math-expand-ops), convert-math-to-llvm, convert-math-to-libm, expand-strided-metadata, "
            "lower-affine, convert-vector-to-llvm, finalize-memref-to-llvm, "
            f"{bf16_expansion(machine(None)[2])}convert-arith-to-llvm, convert-cf-to-llvm, "
            "convert-func-to-llvm{use-bare-ptr-memref-call-conv=1}, reconcile-unrealized-casts")


def resources(ctx: StageContext) -> dict[str, Any]:
    """What the promotion used, as plain data: peak scratchpad bytes per level (per instance: one core's
    buffers for a per-core level), each contraction's compute, and ``cores``: the most units of
    ``spec.compute[0]`` one kernel's ``scf.forall`` runs on (1 without one) — what the conformance
    suite's resource checks read."""
    from pbsdk.core.passes.promote import capacity

    spec: ChipSpec = ctx.spec
    promos = ctx.notes.get("promote", [])
    peak: dict[str, int] = {}
    contractions = []
    for p in promos:
        for level, used in p.bytes_per_level().items():
            peak[level] = max(peak.get(level, 0), used)
        u = p.plan.compute
        contractions.append({"function": p.function, "batch": p.op.batch, "m": p.op.extent("m"),
                             "n": p.op.extent("n"), "k": p.op.extent("k"), "dtype": p.op.dtypes[0],
                             "compute": u.kind, "unit": u.name if u.kind == "matrix-unit" else None,
                             "tiles": {lv: list(t) for lv, t in p.levels}, "notes": list(p.notes),
                             "parallel": [list(x) for x in p.parallel],
                             "estimate_seconds": p.plan.estimate.seconds, "estimate_bound": p.plan.estimate.bound,
                             "double_buffered": any(t.double_buffered for t in p.plan.levels)})
    # Other ops staged by the core's promote-vector pass (one at a time: their buffers live per op).
    staged: dict[str, int] = {}
    for s in ctx.notes.get("promote_vector", []):
        for level, used in s.bytes_per_level().items():
            peak[level] = max(peak.get(level, 0), used)
        staged[s.kind] = staged.get(s.kind, 0) + 1
    caps = {m.name: capacity(m, ctx.options) for m in spec.scratchpads()}
    cores = max([getattr(r, "parts", 1) for r in [*promos, *ctx.notes.get("promote_vector", [])]]
                + [min(ctx.notes.get("forall_parts", 1), spec.compute[0].count)], default=1)
    return {"scratchpad_bytes": peak, "capacity_bytes": caps, "contractions": contractions, "vector_ops": staged,
            "cores": cores, "double_buffered": any(c["double_buffered"] for c in contractions)}


#: The artifact kind of a kernel handed to the C toolchain (`TemplateTarget.emit_after`): its C source.
C_SOURCE = "c"


def emit(module: ir.Module, ctx: StageContext, hooks: Hooks, *, after: str | None = None) -> Artifact:
    """The artifact: ``final_emission``'s LLVM IR, or, for a target that ends its pipeline after stage
    ``after`` (`pbsdk.core.target.Target.emit_after`), ``toolchain_emission``'s C source of the module."""
    from pbsdk.core.runtime.cache import caching

    entry = ctx.notes["entry"]
    if after is None:
        kind, payload = "llvm-ir", hooks["final_emission"](module, ctx.spec)
    else:
        from pbsdk.core.emit_c import c_symbol

        kind, payload = C_SOURCE, hooks["toolchain_emission"](module, after, ctx.spec)
        entry = c_symbol(entry)  # the C function's name (``main`` is not one)
    return Artifact(kind=kind, payload=payload, entry=entry, inputs=ctx.notes["inputs"],
                    outputs=ctx.notes["outputs"],
                    metadata={"counters": list(ctx.notes.get("counters", [])), "resources": resources(ctx),
                              "object_cache": caching(ctx.options)},
                    constants=ctx.constants)


# ------------------------------------------------------------------------------------------- loading

class TemplateExecutable(Executable):
    """The emulated chip: JIT-compiled host code plus its counters.

    After every `run`, ``last_counters`` maps each counter name (``matrix_unit:<unit>``,
    ``bytes:<from>-><to>``, ``vector:<level>``) to its value for that run and `last_time` is the time
    that run would take on the chip (`pbsdk.core.plan.chip_time`); ``resources`` is the compile-time
    record (scratchpad bytes per level, each contraction's compute and planner estimate)."""

    def __init__(self, artifact: Artifact, spec: ChipSpec) -> None:
        # The emulation runs on the host: the cpu target's JIT, for the host's own CPU (the spec is the
        # emulated chip's).
        from pbsdk.targets.cpu import EntryCall, jit_cached

        self.names: list[str] = list(artifact.metadata.get("counters", []))
        self.resources: Mapping[str, Any] = artifact.metadata.get("resources", {})
        self.last_counters: dict[str, int] = {}
        self.spec = spec
        payload = artifact.payload if isinstance(artifact.payload, str) else artifact.payload.decode()
        self._engine, address, globals_ = jit_cached([payload], None, artifact.entry,
                                                      [COUNTERS_GLOBAL] if self.names else [],
                                                      use_cache=bool(artifact.metadata.get("object_cache", True)))
        counters = globals_[0] if globals_ else 0
        self._counters = (ctypes.c_int64 * MAX_COUNTERS).from_address(counters) if counters else None
        self._fn = EntryCall(artifact, address)
        self._run_lock = threading.Lock()  # the counters are per kernel, so runs of one kernel serialise

    def run(self, buffers: Sequence[np.ndarray]) -> None:
        self.run_pointers([b.ctypes.data for b in buffers])

    def run_pointers(self, pointers: Sequence[int]) -> None:  # type: ignore[override]
        with self._run_lock:
            if self._counters is not None:
                ctypes.memset(self._counters, 0, ctypes.sizeof(self._counters))
            self._fn(pointers)
            if self._counters is not None:
                self.last_counters = {n: int(self._counters[i]) for i, n in enumerate(self.names)}

    @property
    def last_time(self) -> ModelledTime | None:
        """The last run's modelled time on the chip (None before the first run or without counters)."""
        if not self.last_counters:
            return None
        return modelled_time(self.spec, self.last_counters, self.resources)

