"""The template target's stages: apply the lowering hooks to the promoted IR, count, lower to the host.

Counters live in one public LLVM global, ``__pbsdk_counters`` (``MAX_COUNTERS`` x i64), declared as a
``memref.global``; each counter's index is its position in ``ctx.notes["counters"]`` (names like
``matrix_unit:mxu`` and ``bytes:dram->sram``), which the artifact carries in ``metadata["counters"]``.
The executable zeroes them before each run and reads them back after it (`TemplateExecutable`).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from mlir import ir, passmanager
from mlir.dialects import func

from pbsdk.core.errors import CompileError
from pbsdk.core.passes import ops_named
from pbsdk.core.pipeline import StageContext
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Artifact, Executable
from pbsdk.targets.template import hooks as default_hooks

COUNTERS_GLOBAL = "__pbsdk_counters"
MAX_COUNTERS = 64
_GLOBAL_DECL = f"memref.global @{COUNTERS_GLOBAL} : memref<{MAX_COUNTERS}xi64> = dense<0>"


def counter_lines(ctx: StageContext, name: str, value: str) -> list[str]:
    """MLIR lines adding ``value`` (an ``index`` SSA name, or an integer literal) to counter ``name``."""
    names: list[str] = ctx.notes.setdefault("counters", [])
    if name not in names:
        if len(names) >= MAX_COUNTERS:
            raise CompileError(f"more than {MAX_COUNTERS} counters (adding '{name}')")
        names.append(name)
    idx = names.index(name)
    lines = [f"%ctr_g = memref.get_global @{COUNTERS_GLOBAL} : memref<{MAX_COUNTERS}xi64>",
             f"%ctr_i = arith.constant {idx} : index",
             f"%ctr_old = memref.load %ctr_g[%ctr_i] : memref<{MAX_COUNTERS}xi64>"]
    if value.lstrip("-").isdigit():
        lines.append(f"%ctr_v = arith.constant {value} : i64")
    else:
        lines.append(f"%ctr_v = arith.index_cast {value} : index to i64")
    lines += ["%ctr_new = arith.addi %ctr_old, %ctr_v : i64",
              f"memref.store %ctr_new, %ctr_g[%ctr_i] : memref<{MAX_COUNTERS}xi64>"]
    return lines


def _counting(ctx: StageContext, name: str) -> Callable[[str], list[str]]:
    """A hook's ``count(value)``: MLIR lines adding ``value`` to counter ``name``."""
    return lambda value: counter_lines(ctx, name, value)


def _ensure_counters(module: ir.Module) -> None:
    for op in module.body.operations:
        if op.operation.name == "memref.global" and ir.StringAttr(op.attributes["sym_name"]).value == COUNTERS_GLOBAL:
            return
    parsed = ir.Module.parse(f"module {{ {_GLOBAL_DECL} }}", module.context)
    parsed.body.operations[0].operation.move_before(module.body.operations[0].operation)


def _install(module: ir.Module, text: str, hook: str, name: str) -> None:
    """Parse a hook's function text (with the counters global in scope) and add the function to the module."""
    try:
        parsed = ir.Module.parse(f"module {{\n{_GLOBAL_DECL}\n{text}\n}}", module.context)
    except Exception as exc:
        raise CompileError(f"hook {hook} returned MLIR that does not parse or verify: {str(exc).strip()}\n{text}",
                           op=name) from exc
    fns = [op for op in parsed.body.operations if op.operation.name == "func.func"]
    if len(fns) != 1 or ir.StringAttr(fns[0].attributes["sym_name"]).value != name:
        raise CompileError(f"hook {hook} must return exactly one func.func named @{name}")
    module.body.append(fns[0].operation)


def _call(op: ir.Operation, name: str, operands: Sequence[ir.Value]) -> None:
    with ir.InsertionPoint(op), op.location:
        func.CallOp([], ir.FlatSymbolRefAttr.get(name), list(operands))
    op.erase()


def _maps_and_iterators(op: ir.Operation) -> tuple[tuple[str, str, str], tuple[str, ...]]:
    maps = tuple(str(a) for a in ir.ArrayAttr(op.attributes["indexing_maps"]))
    its = tuple("reduction" if "reduction" in str(a) else "parallel" for a in ir.ArrayAttr(op.attributes["iterator_types"]))
    return maps, its  # type: ignore[return-value]


def lower_matrix_units(module: ir.Module, ctx: StageContext, hooks: Any) -> None:
    """Replace every ``pbsdk.matrix_unit`` op by a call to the ``matrix_unit_op`` hook's function."""
    spec: ChipSpec = ctx.spec
    _ensure_counters(module)
    made: dict[tuple[str, ...], str] = {}
    for op in ops_named(module, "linalg.generic"):
        if "pbsdk.matrix_unit" not in op.attributes:
            continue
        unit_name = ir.StringAttr(op.attributes["pbsdk.matrix_unit"]).value
        operand = ir.StringAttr(op.attributes["pbsdk.unit_operand"]).value
        accumulator = ir.StringAttr(op.attributes["pbsdk.unit_accumulator"]).value
        unit = next((u for u in spec.matrix_units if (u.name, u.operand_dtype, u.accumulator_dtype)
                     == (unit_name, operand, accumulator)), None)
        if unit is None:
            raise CompileError(f"spec '{spec.name}' has no matrix unit {unit_name} {operand}->{accumulator}",
                               op="linalg.generic")
        types = [ir.MemRefType(v.type) for v in op.operands]
        maps, its = _maps_and_iterators(op)
        key = (unit_name, operand, accumulator, *map(str, types), *maps)
        if key not in made:
            name = f"__pbsdk_{unit_name.replace('.', '_')}_{len(made)}"
            a_t, b_t, c_t = types
            uop = default_hooks.UnitOp(name, unit, str(a_t), str(b_t), str(c_t), str(a_t.element_type),
                                       str(b_t.element_type), str(c_t.element_type), maps, its,
                                       _counting(ctx, f"matrix_unit:{unit.name}"))
            _install(module, getattr(hooks, "matrix_unit_op", default_hooks.matrix_unit_op)(uop, spec),
                     "matrix_unit_op", name)
            made[key] = name
        _call(op, made[key], list(op.operands))


def _space(t: ir.MemRefType) -> int:
    ms = t.memory_space
    return 0 if ms is None else ir.IntegerAttr(ms).value


def lower_dma(module: ir.Module, ctx: StageContext, hooks: Any) -> None:
    """Replace every ``pbsdk.dma`` copy by a call to the ``dma_copy`` hook's function."""
    spec: ChipSpec = ctx.spec
    _ensure_counters(module)
    made: dict[tuple[str, str], str] = {}
    for op in ops_named(module, "linalg.copy"):
        if "pbsdk.dma" not in op.attributes:
            continue
        src_t, dst_t = (ir.MemRefType(v.type) for v in op.operands)
        key = (str(src_t), str(dst_t))
        if key not in made:
            src_level, dst_level = spec.memory[_space(src_t)], spec.memory[_space(dst_t)]
            name = f"__pbsdk_dma_{len(made)}"
            shape = tuple(None if src_t.is_dynamic_dim(i) else src_t.shape[i] for i in range(src_t.rank))
            pair = f"bytes:{src_level.name}->{dst_level.name}"
            copy = default_hooks.DmaCopy(name, src_level, dst_level, str(src_t), str(dst_t), str(src_t.element_type),
                                         shape, _counting(ctx, pair))
            _install(module, getattr(hooks, "dma_copy", default_hooks.dma_copy)(copy, spec), "dma_copy", name)
            made[key] = name
        _call(op, made[key], list(op.operands))


def lower_scratchpads(module: ir.Module, ctx: StageContext, hooks: Any) -> None:
    """Ask the ``scratchpad_alloc`` hook about every scratchpad buffer; inline the hooks' functions; then,
    on the host, every level is host memory: drop the memory spaces."""
    spec: ChipSpec = ctx.spec
    hook = getattr(hooks, "scratchpad_alloc", default_hooks.scratchpad_alloc)
    for i, op in enumerate(ops_named(module, "memref.alloc")):
        t = ir.MemRefType(op.result.type)
        space = _space(t)
        if space == 0:
            continue
        align = ir.IntegerAttr(op.attributes["alignment"]).value if "alignment" in op.attributes else 1
        text = hook(default_hooks.ScratchpadAlloc(spec.memory[space], space, str(t), align), spec)
        if text is None:
            continue
        name = f"__pbsdk_scratchpad_{i}"
        _install(module, text.replace("@scratchpad", f"@{name}", 1), "scratchpad_alloc", name)
        with ir.InsertionPoint(op), op.location:
            call = func.CallOp([t], ir.FlatSymbolRefAttr.get(name), [])
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
            raise CompileError(f"function {f.attributes['sym_name']} still takes scratchpad memrefs after inlining")


LOWER_LLVM = ("func.func(math-expand-ops), convert-math-to-llvm, convert-math-to-libm, expand-strided-metadata, "
              "lower-affine, finalize-memref-to-llvm, convert-arith-to-llvm, convert-cf-to-llvm, "
              "convert-func-to-llvm{use-bare-ptr-memref-call-conv=1}, reconcile-unrealized-casts")


def resources(ctx: StageContext) -> dict[str, Any]:
    """What the promotion used, as plain data: peak scratchpad bytes per level and each contraction's
    compute (what the conformance suite's resource checks read)."""
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
                             "tiles": {lv: list(t) for lv, t in p.levels}, "notes": list(p.notes)})
    caps = {m.name: capacity(m, ctx.options) for m in spec.scratchpads()}
    return {"scratchpad_bytes": peak, "capacity_bytes": caps, "contractions": contractions}


def emit(module: ir.Module, ctx: StageContext, hooks: Any) -> Artifact:
    payload = getattr(hooks, "final_emission", default_hooks.final_emission)(module, ctx.spec)
    return Artifact(kind="llvm-ir", payload=payload, entry=ctx.notes["entry"], inputs=ctx.notes["inputs"],
                    outputs=ctx.notes["outputs"],
                    metadata={"counters": list(ctx.notes.get("counters", [])), "resources": resources(ctx)})


# ------------------------------------------------------------------------------------------- loading

class TemplateExecutable(Executable):
    """The emulated chip: JIT-compiled host code plus its counters.

    After every `run`, ``last_counters`` maps each counter name (``matrix_unit:<unit>``,
    ``bytes:<from>-><to>``) to its value for that run; ``resources`` is the compile-time record
    (scratchpad bytes per level, each contraction's compute)."""

    def __init__(self, artifact: Artifact, spec: ChipSpec) -> None:
        # The emulation runs on the host: the cpu target's JIT, for the host's own CPU (the spec is the
        # emulated chip's).
        from pbsdk.targets.cpu import _llvm, jit_in_process, parse_llvm_ir

        llvm = _llvm()
        self.names: list[str] = list(artifact.metadata.get("counters", []))
        self.resources: Mapping[str, Any] = artifact.metadata.get("resources", {})
        self.last_counters: dict[str, int] = {}
        mod = parse_llvm_ir(artifact.payload)
        target = llvm.Target.from_triple(llvm.get_process_triple())
        tm = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(),
                                          opt=3, codemodel="jitdefault")
        self._engine, address, globals_ = jit_in_process(mod, tm, artifact.entry,
                                                          [COUNTERS_GLOBAL] if self.names else [])
        counters = globals_[0] if globals_ else 0
        self._counters = (ctypes.c_int64 * MAX_COUNTERS).from_address(counters) if counters else None
        n_args = len(artifact.inputs) + len(artifact.outputs)
        self._fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_args))(address)
        self._run_lock = threading.Lock()  # the counters are per kernel, so runs of one kernel serialise

    def run(self, buffers: Sequence[np.ndarray]) -> None:
        self.run_pointers([b.ctypes.data for b in buffers])

    def run_pointers(self, pointers: Sequence[int]) -> None:  # type: ignore[override]
        with self._run_lock:
            if self._counters is not None:
                ctypes.memset(self._counters, 0, ctypes.sizeof(self._counters))
            self._fn(*pointers)
            if self._counters is not None:
                self.last_counters = {n: int(self._counters[i]) for i, n in enumerate(self.names)}
