"""The GPU half of the nvgpu pipeline: scheduled IR -> gpu.launch -> one gpu.module -> NVVM -> PTX.

Stages (each a function of the module and the `StageContext`):

- ``map-gpu``: the matrix-unit functions get their GPU bodies (`mma.py`, each instruction built by the
  target's ``unit_step`` hook), everything is inlined, each
  top-level ``scf.forall`` (and each op left for a single thread) is wrapped in a ``gpu.launch``, and the
  upstream ``transform.gpu.map_forall_to_blocks`` / ``map_nested_forall_to_threads`` (a transform script
  built with `mlir.dialects.transform` builders, run by the interpreter) turn the mapped loops into block
  and thread ids (inserting a barrier after each thread-level loop).
- ``outline``: ``gpu-kernel-outlining``; all kernels are merged into one ``gpu.module @pbsdk_kernels``,
  each marked ``nvvm.minctasm = 1`` (PTX ``.minnctapersm 1``: ptxas need not squeeze registers for
  more resident blocks than the plan has);
  shared-memory buffers (``memref.alloc`` in the workgroup address space) become module-level
  ``memref.global``s, i.e. static ``.shared`` arrays.
- ``nvvm``: ``nvvm-attach-target`` with the spec's ``codegen.arch``/``ptx_features`` (and libdevice when
  a kernel calls a math function) at LLVM ``O=2`` (O3's extra runtime unrolling turned a loop of f64
  divisions into straight-line slow paths that ptxas spilled), loops and memrefs lowered,
  ``convert-gpu-to-nvvm`` with bare-pointer kernel arguments and 32-bit indices where every buffer has
  fewer than 2**31 elements (`index_bits`).
- ``ptx``: ``gpu-module-to-binary{format=isa}`` (LLVM's NVPTX back end); the PTX text is returned and the
  host function is read into the launch plan (`LaunchPlan`): buffers (arguments and temporaries) and, per
  launch, kernel name, grid, block and which buffer each kernel argument is.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from mlir import ir
from mlir.dialects import arith, gpu, transform
from mlir.dialects.transform import gpu as transform_gpu

from pbsdk.core.errors import CompileError, UnsupportedError
from pbsdk.core.hooks import UnitStep
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.passes import ops_named
from pbsdk.core.pipeline import StageContext
from pbsdk.targets.nvgpu.build import apply_transform, match_tagged, workgroup
from pbsdk.targets.nvgpu.mma import mma_gpu_function
from pbsdk.targets.nvgpu.schedule import entry_function, run_passes

KERNEL_MODULE = "pbsdk_kernels"


def _ub(op: ir.Operation) -> list[int]:
    ubs = list(ir.DenseI64ArrayAttr(op.attributes["staticUpperBound"]))
    if any(u < 0 for u in ubs):
        raise UnsupportedError("a parallel loop with a dynamic trip count cannot be mapped", op="scf.forall")
    return ubs


def _mapping(op: ir.Operation) -> list[tuple[str, str]]:
    """[(kind, axis)] of a forall's mapping, e.g. [("block", "y"), ("block", "x")]."""
    if "mapping" not in op.attributes:
        return []
    return [(k, a) for k, a in re.findall(r"#gpu\.(\w+)<(\w+)>", str(op.attributes["mapping"]))]


def launch_dims(forall: ir.Operation) -> tuple[list[int], list[int]]:
    """(grid xyz, block xyz) of a block-mapped forall nest, from its static trip counts and mappings."""
    grid = [1, 1, 1]
    for (kind, axis), n in zip(_mapping(forall), _ub(forall)):
        if kind != "block" or axis not in "xyz":
            raise UnsupportedError(f"top-level loop mapped to #gpu.{kind}<{axis}>", op="scf.forall")
        grid["xyz".index(axis)] = n
    block = [1, 1, 1]
    linear = 1
    for inner in ops_named(forall, "scf.forall"):
        if inner == forall:
            continue
        maps, ubs = _mapping(inner), _ub(inner)
        if not maps:
            continue
        if all(a in "xyz" for _, a in maps) and maps[0][0] == "thread":
            for (_, axis), n in zip(maps, ubs):
                i = "xyz".index(axis)
                block[i] = max(block[i], n)
        elif maps[0][0] == "thread":
            linear = max(linear, math.prod(ubs))
        elif maps[0][0] == "warp":
            linear = max(linear, 32 * math.prod(ubs))
    if linear > 1:
        if block[1] > 1 or block[2] > 1:
            raise UnsupportedError("mixing linear and 3-d thread mappings in one kernel", op="scf.forall")
        block[0] = max(block[0], linear)
    return grid, block


def _unit_step(module: ir.Module, ctx: StageContext, unit: str, operand: ir.Type,
               hook: Callable[..., ir.Value]) -> Callable[[ir.Value, ir.Value, ir.Value], ir.Value]:
    """``step(acc, a, b)``: the ``unit_step`` hook for the spec's matrix unit ``unit`` on ``operand``s, on
    a lane's fragments (`pbsdk.targets.nvgpu.hooks`)."""
    found = next((u for u in ctx.spec.matrix_units if u.name == unit and str(operand) == u.operand_dtype), None)
    if found is None:  # `promote` picks units from the spec, so this is a spec edited between stages
        raise CompileError(f"spec '{ctx.spec.name}' has no matrix unit {unit} for {operand} operands", op="func.func")
    frag = {n: ir.VectorType.get([n], operand) for n in (4, 8)}
    step = UnitStep(module=module, unit=found, acc_type=ir.VectorType.get([4], ir.F32Type.get()), a_type=frag[8],
                    b_type=frag[4])
    return lambda acc, a, b: hook(step, acc, a, b, ctx.spec)


def map_gpu(module: ir.Module, ctx: StageContext, unit_step: Callable[..., ir.Value] | None = None) -> None:
    """Stage ``map-gpu`` (see the module docstring); ``unit_step``: the target's hook (default nvgpu's)."""
    from pbsdk.targets.nvgpu import hooks

    hook = unit_step or hooks.unit_step
    with module.context:
        # matrix-unit steps: the GPU body replaces the emulation body
        for fn in [op for op in module.body.operations if op.operation.name == "func.func"
                   and attrs.has(op, attrs.MATRIX_UNIT)]:
            types = list(ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).inputs)
            name = ir.StringAttr(fn.attributes["sym_name"]).value
            unit = attrs.string(fn, attrs.MATRIX_UNIT) or ""
            with ir.InsertionPoint(module.body), ir.Location.unknown():
                step = _unit_step(module, ctx, unit, ir.MemRefType(types[0]).element_type, hook)
                mma_gpu_function(name, types, unit, step, a_transposed=attrs.has(fn, attrs.A_TRANSPOSED),
                                 b_transposed=attrs.has(fn, attrs.B_TRANSPOSED),
                                 c_transposed=attrs.has(fn, attrs.C_TRANSPOSED))
            fn.operation.erase()
        for call in ops_named(module, "func.call"):  # `schedule` kept the unit steps calls until now
            if "no_inline" in call.attributes:
                del call.attributes["no_inline"]
    run_passes(module, "inline, symbol-dce, canonicalize")
    entry = entry_function(module, ctx.notes["entry"])
    launches: list[tuple[ir.Operation, list[int], list[int]]] = []
    with module.context, ir.Location.unknown():
        for op in list(entry.regions[0].blocks[0].operations):
            op = op.operation
            if op.name == "scf.forall":
                grid, block = launch_dims(op)
            elif op.name.startswith("linalg."):
                grid, block = [1, 1, 1], [1, 1, 1]
            else:
                continue
            with ir.InsertionPoint(op):
                c1 = arith.ConstantOp(ir.IndexType.get(), 1)
                launch = gpu.LaunchOp((c1, c1, c1), (c1, c1, c1))
                body = launch.body.blocks[0]
                with ir.InsertionPoint(body):
                    term = gpu.TerminatorOp()
                op.move_before(term)
            tag = len(launches)
            attrs.set_i64(launch.operation, attrs.LAUNCH, tag)
            launches.append((launch.operation, grid, block))
            threads = math.prod(block)
            limit = int(ctx.spec.compute[0].limits.get("max_threads_per_block", 1024))
            if threads > limit:
                raise CompileError(f"kernel {tag} needs {threads} threads per block; the spec allows {limit}",
                                   op="gpu.launch")
        mapped = [(tag, grid, block) for tag, (launch_op, grid, block) in enumerate(launches)
                  if ops_named(launch_op, "scf.forall")]  # a single-thread kernel: nothing to map

        def script(root: ir.Value) -> None:
            any_op = transform.AnyOpType.get()
            for tag, grid, block in mapped:
                launch = match_tagged(root, attrs.LAUNCH, tag)
                blocks = transform_gpu.MapForallToBlocks(any_op, launch, grid_dims=grid).result
                transform_gpu.MapNestedForallToThreads(any_op, blocks, block_dims=block)

        if mapped:
            try:
                apply_transform(module, script)
            except Exception as exc:
                raise CompileError(f"mapping loops to blocks/threads failed: {str(exc).strip()[:2000]}",
                                   op="scf.forall") from exc
    run_passes(module, "canonicalize, cse")


def _globalise_shared(module: ir.Module, kmod: ir.Operation) -> None:
    """Workgroup-space ``memref.alloc`` in kernels -> ``memref.global`` + ``memref.get_global``."""
    from mlir.dialects import memref

    body = kmod.regions[0].blocks[0]
    for count, alloc in enumerate(ops_named(kmod, "memref.alloc")):
        t = ir.MemRefType(alloc.results[0].type)
        if t.memory_space is None or t.memory_space != workgroup():
            raise UnsupportedError(f"a kernel allocates {t} in global memory (only shared-memory buffers "
                                   "may be allocated inside kernels)", op="memref.alloc")
        name = f"__pbsdk_smem_{count}"
        align = alloc.attributes["alignment"] if "alignment" in alloc.attributes else \
            ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 16)
        with ir.InsertionPoint.at_block_begin(body), alloc.location:
            memref.GlobalOp(name, ir.TypeAttr.get(t), sym_visibility="private", alignment=align)
        with ir.InsertionPoint(alloc), alloc.location:
            get = memref.GetGlobalOp(t, name)
        alloc.results[0].replace_all_uses_with(get.result)
        alloc.erase()
    for dealloc in ops_named(kmod, "memref.dealloc"):
        dealloc.erase()


def outline(module: ir.Module, ctx: StageContext) -> None:
    """Stage ``outline`` (see the module docstring)."""
    run_passes(module, "gpu-launch-sink-index-computations, gpu-kernel-outlining, canonicalize")
    with module.context:
        kmods = [op.operation for op in module.body.operations if op.operation.name == "gpu.module"]
        if not kmods:
            raise CompileError("no kernels were produced", op="func.func")
        # Each outlined module holds one kernel; the kernel takes its module's (unique) name.
        for kmod in kmods:
            mod_name = ir.StringAttr(kmod.attributes["sym_name"]).value
            for op in kmod.regions[0].blocks[0].operations:
                if op.operation.name == "gpu.func":
                    op.attributes["sym_name"] = ir.StringAttr.get(mod_name)
                    # One resident block per SM is all a kernel is planned for (the core splits work into
                    # at most one part per SM): ptxas may then give a thread every register it needs
                    # rather than spill to fit blocks the grid does not have.
                    op.attributes["nvvm.minctasm"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), 1)
        for launch in ops_named(module, "gpu.launch_func"):
            mod_name = str(launch.attributes["kernel"]).split("::")[0].lstrip("@")
            launch.attributes["kernel"] = ir.SymbolRefAttr.get([KERNEL_MODULE, mod_name])
        first = kmods[0]
        first.attributes["sym_name"] = ir.StringAttr.get(KERNEL_MODULE)
        dest = first.regions[0].blocks[0]
        for other in kmods[1:]:
            for op in list(other.regions[0].blocks[0].operations):
                dest.append(op.operation)
            other.erase()
        _globalise_shared(module, first)


def libdevice() -> str | None:
    """libdevice.10.bc: ``PBSDK_LIBDEVICE``, else next to ``ptxas`` or under ``CUDA_HOME``/``CUDA_PATH``."""
    env = os.environ.get("PBSDK_LIBDEVICE")
    if env:
        return env if Path(env).is_file() else None
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    ptxas = shutil.which("ptxas")
    if ptxas:
        roots.append(str(Path(ptxas).resolve().parent.parent))
    roots.append("/usr/local/cuda")
    for root in roots:
        if root:
            p = Path(root) / "nvvm" / "libdevice" / "libdevice.10.bc"
            if p.is_file():
                return str(p)
    return None


def arch_of(spec: Any) -> tuple[str, str]:
    """(sm, ptx features) from the spec's codegen; the spec must name them."""
    arch = spec.codegen.get("arch")
    if not arch:
        raise CompileError(f"chip spec '{spec.name}' has no codegen.arch (e.g. sm_90)")
    return arch, spec.codegen.get("ptx_features", "")


def to_nvvm(module: ir.Module, ctx: StageContext) -> None:
    """Stage ``nvvm`` (see the module docstring)."""
    arch, features = arch_of(ctx.spec)
    run_passes(module, "gpu.module(convert-linalg-to-loops, math-expand-ops, expand-strided-metadata, lower-affine, "
                 "convert-scf-to-cf, canonicalize)")
    needs_libdevice = bool(re.search(r"\bmath\.", str(module)))
    link = ""
    if needs_libdevice:
        lib = libdevice()
        if lib is None:
            raise CompileError("a kernel calls math functions that need CUDA's libdevice.10.bc, which was not "
                               "found (set PBSDK_LIBDEVICE or CUDA_HOME)", op="math")
        link = f" l={lib}"
        ctx.notes["nvgpu.libdevice"] = lib
    feats = f" features={features}" if features else ""
    bits = index_bits(module)
    ctx.notes["nvgpu.index_bits"] = bits
    run_passes(module, f"nvvm-attach-target{{chip={arch}{feats}{link} O=2}}, "
                 f"gpu.module(convert-gpu-to-nvvm{{use-bare-ptr-memref-call-conv=1 index-bitwidth={bits}}}), "
                 "reconcile-unrealized-casts")


def index_bits(module: ir.Module) -> int:
    """32 when every buffer the program has — the host function's arguments and every allocation or
    global; a view (a kernel argument, a subview) never exceeds the buffer it views — has fewer than
    2**31 elements: every index and offset then fits, and 32-bit address arithmetic needs half the
    registers. Else 64."""
    largest = 0

    def count(v: ir.Value) -> None:
        nonlocal largest
        if isinstance(v.type, ir.MemRefType):
            t = ir.MemRefType(v.type)
            largest = max(largest, math.prod(t.shape) if t.has_static_shape else 1 << 62)

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name == "func.func":
            for region in op.regions:
                for block in region.blocks:
                    for a in block.arguments:
                        count(a)
        elif op.name in ("memref.alloc", "memref.alloca", "memref.get_global"):
            count(op.results[0])
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    return 32 if largest < 2**31 else 64


#: Host-side view ops a kernel argument may come through. A view's static offset is part of its type, which
#: the kernel's bare-pointer convention applies itself, so the runtime passes the root buffer's base.
VIEW_OPS = ("memref.expand_shape", "memref.collapse_shape", "memref.cast", "memref.reinterpret_cast",
            "memref.subview")


def _global_bytes(module: ir.Module, symbol: str) -> bytes:
    """The initial value of the constant ``memref.global @symbol``, as the bytes of a C-order array."""
    for op in module.body.operations:
        op = op.operation
        if op.name == "memref.global" and ir.StringAttr(op.attributes["sym_name"]).value == symbol:
            if "initial_value" not in op.attributes or "constant" not in op.attributes:
                raise UnsupportedError(f"memref.global @{symbol} is not a constant with a value",
                                       op="memref.get_global")
            t = ir.MemRefType(ir.TypeAttr(op.attributes["type"]).value)
            dtype = str(t.element_type)
            if dtype not in _NUMPY:
                raise UnsupportedError(f"constant @{symbol} of element type {dtype}", op="memref.get_global")
            attr = ir.DenseElementsAttr(op.attributes["initial_value"])
            if attr.is_splat:
                value = np.full(t.shape, ir.FloatAttr(attr.get_splat_value()).value
                                if dtype.startswith("f") else ir.IntegerAttr(attr.get_splat_value()).value,
                                _NUMPY[dtype])
            else:
                value = np.array(attr, copy=True).astype(_NUMPY[dtype]).reshape(t.shape)
            return np.ascontiguousarray(value).tobytes()
    raise UnsupportedError(f"memref.global @{symbol} not found", op="memref.get_global")


_NUMPY = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "i32": np.int32, "i64": np.int64,
          "i8": np.int8, "i1": np.bool_}


def _root(value: ir.Value, args: dict[Any, int], temps: dict[Any, int]) -> tuple[int, int]:
    """(buffer index, byte offset) of a launch argument, through host-side view ops."""
    v = value
    while True:
        if isinstance(v, ir.BlockArgument):
            if v in args:
                return args[v], 0
            raise UnsupportedError("a kernel argument is not a function argument or a buffer", op="gpu.launch_func")
        owner = v.owner.operation
        name = owner.name
        if name in ("memref.alloc", "memref.get_global"):
            return temps[owner], 0
        if name in VIEW_OPS:
            _, offset = ir.MemRefType(v.type).get_strides_and_offset()
            if offset < 0 or offset > 2**62:
                raise UnsupportedError(f"a kernel argument is a view with a dynamic offset ({v.type})", op=name)
            v = owner.operands[0]
            continue
        raise UnsupportedError(f"a kernel argument comes from {name} on the host, which the runtime cannot "
                               "replay", op=name)


def launch_plan(module: ir.Module, entry_name: str) -> dict[str, Any]:
    """The host function read as data: buffers (args first, then temporaries) and launches in order."""
    entry = entry_function(module, entry_name)
    block = entry.regions[0].blocks[0]
    args = {a: i for i, a in enumerate(block.arguments)}
    buffers: list[dict[str, Any]] = []
    for a in block.arguments:
        t = ir.MemRefType(a.type)
        buffers.append({"shape": list(t.shape), "dtype": str(t.element_type), "role": "arg"})
    temps: dict[Any, int] = {}
    consts: dict[str, bytes] = {}
    launches: list[dict[str, Any]] = []

    def const(v: ir.Value) -> int:
        op = v.owner
        if getattr(op, "name", None) != "arith.constant":
            raise UnsupportedError("a launch size is not a constant", op="gpu.launch_func")
        return int(ir.IntegerAttr(op.attributes["value"]).value)

    for op in block.operations:
        op = op.operation
        name = op.name
        if name == "memref.alloc":
            t = ir.MemRefType(op.results[0].type)
            if not t.has_static_shape:
                raise UnsupportedError(f"dynamic temporary {t}", op=name)
            temps[op] = len(buffers)
            buffers.append({"shape": list(t.shape), "dtype": str(t.element_type), "role": "temp"})
        elif name == "memref.get_global":
            # A constant tensor the kernels read (a mask, an index table, frozen weights): its bytes go
            # into the artifact as a blob, which the runtime uploads once at load time.
            t = ir.MemRefType(op.results[0].type)
            symbol = ir.FlatSymbolRefAttr(op.attributes["name"]).value
            blob = f"const:{symbol}"
            if blob not in consts:
                consts[blob] = _global_bytes(module, symbol)
            temps[op] = len(buffers)
            buffers.append({"shape": list(t.shape), "dtype": str(t.element_type), "role": "const", "blob": blob})
        elif name == "gpu.launch_func":
            operands = list(op.operands)
            # operands: grid x y z, block x y z, [dynamic smem], kernel args (no async tokens, no clusters)
            grid = [const(v) for v in operands[0:3]]
            blk = [const(v) for v in operands[3:6]]
            kargs = operands[6:]
            if "operandSegmentSizes" in op.attributes:
                seg = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))
                # [asyncDeps, gx, gy, gz, bx, by, bz, cx, cy, cz, dynSmem, kernelOperands, asyncObject]
                base = seg[0]
                grid = [const(v) for v in operands[base:base + 3]]
                blk = [const(v) for v in operands[base + 3:base + 6]]
                start = base + 6 + seg[7] + seg[8] + seg[9] + seg[10]
                kargs = operands[start:start + seg[11]]
            arglist = []
            for v in kargs:
                if isinstance(v.type, ir.MemRefType):
                    index, offset = _root(v, args, temps)
                    arglist.append({"buffer": index, "offset": offset})
                else:
                    raise UnsupportedError(f"scalar kernel argument of type {v.type}", op=name)
            kernel = str(op.attributes["kernel"]).split("::")[-1].lstrip("@")
            launches.append({"kernel": kernel, "grid": grid, "block": blk, "shared_bytes": 0, "args": arglist})
        elif name in ("memref.dealloc", "func.return", "arith.constant") or name in VIEW_OPS:
            continue
        else:
            raise UnsupportedError(f"host-side op {name} left outside every kernel", op=name)
    return {"buffers": buffers, "launches": launches, "consts": consts}


def to_ptx(module: ir.Module, ctx: StageContext) -> str:
    """Stage ``ptx``: PTX text; the launch plan goes to ``ctx.notes["nvgpu.plan"]``."""
    run_passes(module, "gpu-module-to-binary{format=isa}")
    ptx: str | None = None
    with module.context:
        for op in module.body.operations:
            if op.operation.name == "gpu.binary":
                objects = ir.ArrayAttr(op.attributes["objects"])
                obj = gpu.ObjectAttr(objects[0])
                ptx = obj.object.decode() if isinstance(obj.object, bytes) else str(obj.object)
        if ptx is None:
            raise CompileError("gpu-module-to-binary produced no PTX", op="gpu.module")
        ctx.notes["nvgpu.plan"] = launch_plan(module, ctx.notes["entry"])
    return ptx
