"""Pass ``pack-contractions``: replace each planned ``linalg.matmul`` / ``linalg.batch_matmul`` on
buffers by a call to a packed, register-tiled kernel generated from its plan.

For every contraction the planner (`pbsdk.core.plan.contraction`) is asked for a plan on the stage's
chip spec; where the plan has a `Blocking` (a vector-FMA register tile on a cache hierarchy) the op is
replaced by ``func.call @__pbsdk_mm<N>(A, B, C)`` and the kernel from
`pbsdk.targets.cpu.matmul_kernel` is added to the module. Work split across the outermost compute
level is an ``scf.forall`` around per-part calls, which the cpu target's ``lower-parallel`` stage turns
into a fork onto the cores.

A B operand that is a frozen weight (an entry argument marked ``pbsdk.constant``) read by nothing else is
packed at compile time (`pbsdk.targets.cpu.prepack`, option ``prepack_b``): the kernel reads its panels in
place and never packs B at run time.

Contractions this pass cannot take (integer types, a non-unit innermost stride, no blocking in the plan)
are left for the target's generic lowering and recorded in ``ctx.notes["pack-contractions"]`` with the
reason, so ``--emit`` and the tests can see what happened.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Literal

import numpy as np
from mlir import ir
from mlir.dialects import arith, func, memref

from pbsdk.core.errors import CompileError
from pbsdk.core.hooks import UnitStep
from pbsdk.core.ir import attributes
from pbsdk.core.ir.builder import element_type, if_then
from pbsdk.core.passes import defining_op, identity_layout, ops_named, row_major, user_op
from pbsdk.core.passes.dedupe_functions import merge_identical
from pbsdk.core.passes.isolate_contractions import PREFIX as CONTRACTION_PREFIX
from pbsdk.core.plan.contraction import (
    WIDENABLE,
    Blocking,
    Contraction,
    plan_contraction,
    units_for,
    widened_dtype,
)
from pbsdk.core.plan.dynamic import DYNAMIC_EXTENT, plan_dynamic_contraction
from pbsdk.core.plan.window import ConvGeometry, pad_runs, padded_k, window_k_block, window_run
from pbsdk.core.spec import ChipSpec, MatrixUnit
from pbsdk.targets.cpu.hooks import lowerable
from pbsdk.targets.cpu.hooks import unit_step as default_unit_step
from pbsdk.targets.cpu.implicit_conv import Im2col, copy_by_rows, find_im2col
from pbsdk.targets.cpu.matmul_kernel import (
    DYNAMIC,
    EPILOGUE_OPS,
    Epilogue,
    EpilogueOp,
    MatmulShape,
    Window,
    build_matmul_kernel,
    kernel_dtype,
    pack_b_panels,
)
from pbsdk.targets.cpu.options import cpu_options
from pbsdk.targets.cpu.prepack import (
    ConstantB,
    Packing,
    find_constant,
    function_of,
    packed_type,
    rebind,
    set_argument_type,
)
from pbsdk.targets.cpu.transposed_reads import TransposedFeed, read_source, source_type, transposed_operand
from pbsdk.targets.cpu.unit_kernel import OPERANDS as UNIT_OPERANDS
from pbsdk.targets.cpu.unit_kernel import (
    UnitShape,
    build_unit_kernel,
    find_epilogue,
    group_size,
    pack_unit_panels,
    unit_packed_shape,
)

_FLOATS = {"f32", "f64"}
# DYNAMIC_EXTENT (core.plan.dynamic): the size a contraction's dynamic n or k is planned at (its blocks are
# clamped to the actual size at run time): a decoder's cache length is hundreds to thousands.

#: The batch a contraction with a batch known only at run time is planned at (attention heads times a batch).
DYNAMIC_BATCH = 8


def _unit_inner_stride(t: ir.MemRefType) -> bool:
    strides, _ = t.get_strides_and_offset()
    return strides[-1] == 1


def _epilogue(mm: ir.Operation, dtype: str) -> tuple[ir.Operation, Epilogue, list[ir.Value]] | None:
    """The elementwise ``linalg.generic`` right after ``mm`` that reads its output once at the identity
    map (as `isolate-contractions` leaves it), described as an `Epilogue`; None if there is none or its
    body has an op the kernel cannot vectorise. ``dtype``: the product's (C's); the inputs, the body and the
    output may be of other float types (a bf16 product's rounding, bias and store: `EpilogueOp.dtype`)."""
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
    if maps[n_in] != ident or not _same_layout(ir.MemRefType(out.type), ir.MemRefType(c.type)) \
            or not _is_float(ir.MemRefType(out.type).element_type):
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
        if not isinstance(t, ir.MemRefType) or not _is_float(ir.MemRefType(t).element_type):
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
            if isinstance(attr, ir.FloatAttr):
                name = f"k{len(ops)}"
                ops.append(EpilogueOp(name, "arith.constant", (), value=ir.FloatAttr(attr).value,
                                      dtype=_other(attr.type, dtype)))
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
            if not isinstance(attr, ir.FloatAttr):
                return None
            ops.append(EpilogueOp(rname, op.name, (), value=ir.FloatAttr(attr).value, dtype=_other(attr.type, dtype)))
        else:
            refs = [ref(v) for v in op.operands]
            if any(r is None for r in refs):
                return None  # a value from outside the body: not vectorisable here
            if op.name == "arith.cmpf":
                pred = ir.IntegerAttr(op.attributes["predicate"]).value
                ops.append(EpilogueOp(rname, op.name, tuple(refs), predicate=pred))  # type: ignore[arg-type]
            else:
                if op.name != "arith.select" and not _is_float(op.results[0].type):
                    return None
                ops.append(EpilogueOp(rname, op.name, tuple(refs),  # type: ignore[arg-type]
                                      dtype="" if op.name == "arith.select" else _other(op.results[0].type, dtype)))
        env.append((op.results[0], rname))
    if result is None or str(_result_type(result, ops, inputs, dtype)) != str(ir.MemRefType(out.type).element_type):
        return None
    return gen, Epilogue(tuple(inputs), tuple(ops), result, ir.MemRefType(out.type)), extra + [out]


def _is_float(t: ir.Type) -> bool:
    return str(t) in ("f16", "bf16", "f32", "f64")


def _other(t: ir.Type, dtype: str) -> str:
    """`EpilogueOp.dtype` for a result of type ``t`` in an epilogue of a ``dtype`` product."""
    return "" if str(t) == dtype else str(t)


def _same_layout(a: ir.MemRefType, b: ir.MemRefType) -> bool:
    """Same shape, strides and offset (the element types may differ)."""
    return list(a.shape) == list(b.shape) and a.get_strides_and_offset() == b.get_strides_and_offset()


def _result_type(name: str, ops: list[EpilogueOp], inputs: list[tuple[str, ir.MemRefType]], dtype: str) -> str:
    """The element type of the epilogue value ``name`` (the accumulator, an input, or a body op's result;
    a select's is its operands')."""
    if name.startswith("in"):
        return str(inputs[int(name[2:])][1].element_type)
    op = next((o for o in ops if o.result == name), None)
    if op is None:
        return dtype
    if op.op == "arith.select":
        return _result_type(op.operands[1], ops, inputs, dtype)
    return op.dtype or dtype


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
    if isinstance(attr, ir.IntegerAttr) and ir.IntegerAttr(attr).value == 0:
        return fill
    if not isinstance(attr, ir.FloatAttr) or ir.FloatAttr(attr).value != 0.0:
        return None
    return fill


#: ``ctx.notes`` key: one record per contraction the stage saw, ``{"op", "dtype", "batch", "m", "n", "k",
#: "compute", "unit"}`` — ``compute`` is "matrix-unit" (``unit`` names it), "vector-fma" or "generic" (left
#: for the generic lowering). The cpu artifact carries them as its compile-time ``resources``, which the
#: conformance suite checks a case's matrix unit against.
CONTRACTIONS = "contractions"


def record_contraction(ctx: Any, op: str, dtype: str, batch: int, m: int, n: int, k: int, compute: str,
            unit: str | None = None) -> None:
    ctx.notes.setdefault(CONTRACTIONS, []).append({"op": op, "dtype": dtype, "batch": max(batch, 1), "m": m,
                                                    "n": n, "k": k, "compute": compute, "unit": unit})


def unit_spec(spec: ChipSpec, tiles: str = "auto") -> tuple[ChipSpec, list[str]]:
    """``spec`` with only the matrix units the cpu target can lower for its machine code (`hooks.lowerable`;
    ``tiles``: the cpu option ``amx``), and why each other unit was left out."""
    from pbsdk.targets.cpu import machine

    features = machine(spec)[2]
    width = spec.vector.width_bits if spec.vector is not None else 0
    keep, why = [], []
    for u in spec.matrix_units:
        reason = lowerable(u, width, features, tiles)
        if reason is None:
            keep.append(u)
        else:
            why.append(reason)
    if len(keep) == len(spec.matrix_units):
        return spec, why
    return spec.model_copy(update={"matrix_units": keep}), why


def _tile_mode(unit: MatrixUnit, ctx: Any) -> str | None:
    """How a unit kernel on ``unit`` builds its micro-kernel (`build_unit_kernel`'s ``tiles``): None for a
    unit in the vector registers; for a tile unit its instructions ("amx"), or their arithmetic on host
    buffers ("emulate") under the cpu option ``amx="emulate"``."""
    if unit.registers != "tile":
        return None
    return "emulate" if cpu_options(ctx).amx == "emulate" else "amx"


def lowers_unit(spec: ChipSpec, name: str, tiles: str = "auto") -> bool:
    """Whether the cpu target lowers ``spec``'s matrix unit ``name`` (`unit_spec`; ``tiles``: option ``amx``)."""
    return any(u.name == name for u in unit_spec(spec, tiles)[0].matrix_units)


def _unit_contraction(self: PackContractions, module: ir.Module, op: ir.Operation, name: str, ctx: Any,
                      notes: list[str], calls: dict[str, list[ir.Operation]]) -> int:
    """Replace the bf16 or i8 ``op`` by a call of a unit kernel (`build_unit_kernel`) where the spec has a
    unit in the vector registers the cpu target lowers; else record why it takes the generic lowering.
    Returns how many kernels were built (0 or 1)."""
    a, b, c = (ir.MemRefType(v.type) for v in op.operands)
    dtype, acc = str(a.element_type), str(c.element_type)
    batched = op.name == "linalg.batch_matmul"
    m, k = a.shape[-2:]
    n = b.shape[-1]
    bsz = a.shape[0] if batched else 0
    amx = cpu_options(ctx).amx
    spec, dropped = unit_spec(ctx.spec, amx)
    sources = (_constant_operand(op, 1, calls, len(ctx.constants))
               if cpu_options(ctx).prepack_b and not batched and _unit_inner_stride(b) else None)
    plan = plan_contraction(spec, Contraction(m, n, k, max(bsz, 1), dtype, b_prepacked=bool(sources)), ctx.options)
    blk = plan.blocking
    where = f"{op.name} {f'{bsz}x' if batched else ''}{m}x{n}x{k} {dtype}->{acc}"
    if acc != UNIT_OPERANDS[dtype] or blk is None or not blk.unit or not all(_unit_inner_stride(t) for t in (a, b, c)):
        reason = (f"accumulates in {acc}" if acc != UNIT_OPERANDS[dtype] else
                  "an operand's innermost stride is not 1" if blk is not None and blk.unit else
                  f"no matrix unit in the vector registers ({plan.compute.kind} {plan.compute.name})"
                  + (f"; {'; '.join(dropped)}" if dropped else ""))
        notes.append(f"{where}: {reason}: generic lowering")
        record_contraction(ctx, op.name, dtype, bsz, m, n, k, "generic")
        return 0
    unit = next(u for u in spec.matrix_units if u.name == blk.unit)
    tiles = _tile_mode(unit, ctx)
    k_multiple = blk.kc if tiles else 1
    fill = _zero_fill_before(op)
    fused = find_epilogue(op) if cpu_options(ctx).fuse_epilogues else None
    b_operand = op.operands[1]
    with op.location:
        reads = _unit_reads(unit)
        packing = _unit_packing(b, k, n, blk, k_multiple, reads=reads) if sources else None
        step = unit_step_builder(unit, module, ctx, self.unit_step)
        # With the epilogue storing D from one k block that starts at zero, the product's own buffer C is
        # never read or written: the kernel takes a one-element stand-in, and C's allocation goes (a
        # 128 x 50257 f32 product, GPT-2's logits, was 26 MB mapped and faulted in on every call).
        c_unused = fused is not None and fill is not None and blk.kc >= k
        c_type = ir.MemRefType.get([1] * c.rank, c.element_type) if c_unused else c
        kernel = build_unit_kernel(module, name, UnitShape(m, n, k, bsz, a, packing[1] if packing else b, c_type,
                                                           reads),
                                   blk, step, zero_init=fill is not None, epilogue=fused[0] if fused else None,
                                   prepacked_b=packing is not None, tiles=tiles)
        operands = list(op.operands)
        if c_unused:
            operands[2] = memref.alloca(c_type, [], [], ip=ir.InsertionPoint(op))
        new = func.CallOp(kernel, operands + (fused[1] if fused else []), ip=ir.InsertionPoint(op))
    c_value = op.operands[2]
    if tiles == "amx":
        ctx.notes["amx"] = True  # the executable asks Linux for the tile state
    fused_ops = len(list(fused[0].generic.regions[0].blocks[0].operations)) - 1 if fused else 0
    if fused:
        fused[0].generic.erase()
    op.erase()
    if fill is not None:
        fill.erase()
    if sources and packing:
        _prepack(b_operand, new.operation, sources, blk.nr, ctx, packing=packing)
    if c_unused:
        _drop_unused_alloc(c_value)
    record_contraction(ctx, "linalg.batch_matmul" if batched else "linalg.matmul", dtype, bsz, m, n, k, "matrix-unit",
            unit.name)
    notes.append(f"{where}: {'tile' if tiles else 'unit'} kernel @{name} on {unit.name} ({unit.m}x{unit.n}x{unit.k}"
                 f"{', emulated' if tiles == 'emulate' else ''}), register tile "
                 f"{blk.mr}x{blk.nr}, mc/nc/kc {blk.mc}/{blk.nc}/{blk.kc}, {blk.threads} part(s) along {blk.split}"
                 + ("" if blk.pack_a else ", A read in place")
                 + (f", B packed at compile time ({len(sources)} constant(s))" if sources else "")
                 + (f", epilogue of {fused_ops} ops fused "
                    f"(stores {fused[0].out_type.element_type})" if fused else ""))
    return 1


def _widens(op: ir.Operation, ctx: Any) -> bool:
    """Whether the planner widens the narrow ``op``'s operands for the FMA kernel (`widened_dtype`) on the
    units the target lowers: no unit for its dtype there."""
    dtype = str(ir.MemRefType(op.operands[0].type).element_type)
    spec = unit_spec(ctx.spec, cpu_options(ctx).amx)[0]
    return widened_dtype(spec, Contraction(1, 1, 1, dtype=dtype), ctx.options) is not None


def _narrow(a: ir.MemRefType, b: ir.MemRefType, c: ir.MemRefType) -> bool:
    """A product of narrow operands (bf16 or f16 into f32, i8 into i32) the FMA kernel can compute on widened
    copies (`widened_dtype` decides whether it does)."""
    dtype = str(a.element_type)
    return str(b.element_type) == dtype and dtype in WIDENABLE and \
        str(c.element_type) == ("i32" if dtype == "i8" else WIDENABLE[dtype])


def _packed_as(t: ir.MemRefType, nr: int, c: ir.MemRefType, *, transposed: bool = False) -> ir.MemRefType:
    """`packed_type` of a constant ``t`` in the kernel's element type (widened if narrower) for ``c``."""
    p = packed_type(t, nr, transposed=transposed)
    return ir.MemRefType.get(p.shape, kernel_dtype(c), loc=ir.Location.unknown(t.context))


def _widening(t: ir.MemRefType, nr: int, c: ir.MemRefType, *, transposed: bool = False) -> Packing:
    """The compile-time packing of a narrow constant ``t`` for a kernel computing for ``c``: its values
    widened (exactly), then `pack_b_panels`."""
    wide = np.dtype(np.float64 if str(kernel_dtype(c)) == "f64" else np.float32)
    return (lambda matrix: pack_b_panels(np.asarray(matrix).astype(wide), nr),
            _packed_as(t, nr, c, transposed=transposed))


def _unit_reads(unit: MatrixUnit) -> ir.Type | None:
    """The wider type ``unit`` reads its operands in (`MatrixUnit.register_dtype`), None for their own."""
    return element_type(unit.register_dtype) if unit.register_dtype else None


def _unit_packing(b: ir.MemRefType, k: int, n: int, blk: Blocking, k_multiple: int = 1,
                  runs: tuple[int, int] | None = None, reads: ir.Type | None = None) -> Packing:
    """How a constant B (``k`` x ``n``) is packed at compile time for a unit kernel of ``blk``: into the unit's
    interleaved panels (`pack_unit_panels`), k rounded up to ``k_multiple`` (a tile kernel's k block), its
    values widened to ``reads`` (an integer type) where the unit reads them so;
    ``runs`` ``(run, k_run)``: first each run of ``run`` rows padded with zero rows to ``k_run`` (`pad_runs`)."""
    u = group_size(str(reads or b.element_type))
    k_read = k if runs is None else padded_k(k, *runs)
    packed_t = ir.MemRefType.get(list(unit_packed_shape(k_read, n, blk.nr, u, k_multiple)), reads or b.element_type)
    wide = None if reads is None else np.dtype(f"int{ir.IntegerType(reads).width}")

    def pack(matrix: np.ndarray) -> np.ndarray:
        laid = matrix if runs is None else pad_runs(matrix, *runs)
        return pack_unit_panels(laid if wide is None else np.asarray(laid).astype(wide), blk.nr, u, blk.lanes,
                                k_multiple)

    return (pack, packed_t)


def _unit_window_runs(g: ConvGeometry, x_type: ir.MemRefType, dtype: str, u: int, b_constant: bool) -> Window | None:
    """How a unit kernel reads a convolution's input in place: runs of a tap's channels when they come in whole
    groups of the unit's ``u``; for few channels (a 3-channel image stem), runs of a whole kernel row
    (`window_run`) read in groups that go on past each row's end — i8 only, whose products with B's zero rows
    there are exact zeros (a float read past the row could meet an infinity), and B constant, packed with
    those rows (`pad_runs`); None when neither holds or the last group would read past the input."""
    channels = int(x_type.shape[3])
    run = window_run(channels, g.kw, g.dw)
    if run is None:
        return None
    if not run[1]:
        return Window(g, x_type) if channels % u == 0 else None
    if dtype != "i8" or not b_constant:
        return None
    window = Window(g, x_type, row_runs=True, group=u)
    return window if window.last_read() <= math.prod(x_type.shape) else None


def _drop_unused_alloc(value: ir.Value) -> None:
    """Erase ``value``'s ``memref.alloc`` and its deallocs when nothing else uses it."""
    alloc = defining_op(value)
    if alloc is None or alloc.name != "memref.alloc":
        return
    users = [user_op(u) for u in value.uses]
    if all(u.name == "memref.dealloc" for u in users):
        for u in users:
            u.erase()
        alloc.erase()


def unit_step_builder(unit: MatrixUnit, module: ir.Module, ctx: Any, hook: UnitStepHook
                      ) -> Callable[[ir.Value, ir.Value, ir.Value], ir.Value]:
    """``step(acc, a, b)``: the target's ``unit_step`` ``hook`` for ``unit`` on vectors of ``unit.n``
    accumulators; a hook that returns anything but a value of the accumulator's type is a `CompileError`
    naming it."""
    lanes = unit.n
    acc_t = ir.VectorType.get([lanes], element_type(unit.accumulator_dtype))
    op_t = ir.VectorType.get([lanes * unit.k], element_type(unit.reads))
    desc = UnitStep(module=module, unit=unit, acc_type=acc_t, a_type=op_t, b_type=op_t)

    def step(acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
        out = hook(desc, acc, a, b, ctx.spec)
        if not isinstance(out, ir.Value) or out.type != acc_t:
            raise CompileError(f"hook unit_step ({getattr(hook, '__module__', '?')}) returned {out!r} for "
                               f"{unit.name}, not a value of {acc_t}", op="matmul")
        return out

    return step


#: The signature of the contract's ``unit_step`` hook (`pbsdk.core.hook_contract.HOOKS`).
UnitStepHook = Callable[[UnitStep, ir.Value, ir.Value, ir.Value, ChipSpec], ir.Value]


#: The name every kernel this stage builds starts with (``__pbsdk_mm<N>``, its buckets and parts).
KERNEL_PREFIX = "__pbsdk_mm"


def _fma_contraction(module: ir.Module, op: ir.Operation, name: str, ctx: Any, notes: list[str],
                     calls: dict[str, list[ir.Operation]], narrow: bool) -> int:
    """Replace the static f32/f64 ``op`` (or a ``narrow`` one: bf16, f16 or i8 operands the plan widens,
    `widened_dtype`) by a call of the packed FMA kernel ``@name`` (`build_matmul_kernel`): its orientation,
    operands read from a transpose's source, constants packed at compile time, a fused epilogue; else
    record why it takes the generic lowering. Returns how many kernels were built (0 or 1)."""
    a, b, c = (ir.MemRefType(v.type) for v in op.operands)
    dtype = str(a.element_type)
    opname = op.name
    batched = opname == "linalg.batch_matmul"
    bsz = a.shape[0] if batched else 0
    m, k = a.shape[-2:]
    n = b.shape[-1]
    # An operand a transpose fills just for this op is read from the transpose's source instead.
    reads = cpu_options(ctx).transposed_reads
    a_feeds = transposed_operand(op, 0, calls) if reads else None
    b_feeds = transposed_operand(op, 1, calls) if reads else None
    a_layout: Literal["mk", "km"] = "km" if a_feeds else "mk"
    b_layout: Literal["kn", "nk"] = "nk" if b_feeds else "kn"
    a_stored = source_type(a_feeds) if a_feeds else a
    b_stored = source_type(b_feeds) if b_feeds else b
    prepack = cpu_options(ctx).prepack_b and not batched
    sources = _constant_operand(op, 1, calls, len(ctx.constants)) if prepack and not b_feeds else None
    # A constant A is packed at compile time where the product is computed transposed (as B^T).
    a_sources = (_constant_operand(op, 0, calls, len(ctx.constants))
                 if prepack and not sources and not a_feeds else None)
    # narrow operands are planned on the units the target lowers (as `_unit_contraction` plans them)
    pspec = unit_spec(ctx.spec, cpu_options(ctx).amx)[0] if narrow else ctx.spec
    plan = plan_contraction(pspec, Contraction(m, n, k, max(bsz, 1), dtype, b_prepacked=bool(sources),
                                               a_prepackable=bool(a_sources), a_layout=a_layout,
                                               b_layout=b_layout), ctx.options)
    blk = plan.blocking
    if narrow and plan.widened_to is None:
        record_contraction(ctx, op.name, dtype, bsz, m, n, k, "generic")
        notes.append(f"{op.name} {m}x{n}x{k} {dtype}: not widened ({plan.reasons[0]}): generic lowering")
        return 0
    if blk is None:
        record_contraction(ctx, op.name, dtype, bsz, m, n, k, "generic")
        notes.append(f"{op.name} {m}x{n}x{k}: plan has no packed blocking "
                     f"({plan.compute.kind}): generic lowering")
        return 0
    if not blk.transposed:
        a_sources = None  # given orientation: A is packed per call as it is
    operands = list(op.operands)
    if blk.transposed:  # C^T = B^T A^T: the kernel's A is B, its B is A (see MatmulShape.transposed)
        assert not sources, "a prepacked B is never transposed (orientation)"
        shape = MatmulShape.transposed(m, n, k, bsz, a_stored, b_stored, c, a_layout, b_layout)
        if a_sources:  # its B is the given A packed at compile time: panels, not a [n, k] matrix
            shape = dataclasses.replace(shape, b_type=_packed_as(a, blk.nr, c, transposed=True),
                                        b_layout="kn")
        operands[:2] = operands[1::-1]
    else:
        shape = MatmulShape(m, n, k, bsz, a_stored, _packed_as(b, blk.nr, c) if sources else b_stored, c,
                            a_layout, b_layout)
    fused = _epilogue(op, str(c.element_type)) if cpu_options(ctx).fuse_epilogues else None
    fill = _zero_fill_before(op)
    with op.location:
        kernel = build_matmul_kernel(module, name, shape, blk, epilogue=fused[1] if fused else None,
                                     zero_init=fill is not None, prepacked_b=bool(sources or a_sources))
        new = func.CallOp(kernel, operands + (fused[2] if fused else []), ip=ir.InsertionPoint(op))
    a_operand, b_operand = op.operands[0], op.operands[1]
    if fused:
        fused[0].erase()
    op.erase()
    if fill is not None:
        fill.erase()
    if sources:
        _prepack(b_operand, new.operation, sources, blk.nr, ctx,
                 packing=_widening(b, blk.nr, c) if narrow else None)
    if a_sources:  # the kernel's B operand (1) is the given A
        _prepack(a_operand, new.operation, a_sources, blk.nr, ctx, transposed=True,
                 packing=_widening(a, blk.nr, c, transposed=True) if narrow else None)
    for feeds, operand in ((a_feeds, a_operand), (b_feeds, b_operand)):
        if feeds:
            _read_source(operand, feeds)
    prefix = f"{bsz}x" if batched else ""
    record_contraction(ctx, opname, dtype, bsz, m, n, k, "vector-fma")
    notes.append(f"{opname} {prefix}{m}x{n}x{k} {dtype}: packed kernel @{name}, "
                 + (f"A and B widened to {kernel_dtype(c)} as packed, " if narrow else "")
                 + 
                 f"register tile {blk.mr}x{blk.nr}, mc/nc/kc {blk.mc}/{blk.nc}/{blk.kc}, "
                 f"{blk.threads} part(s) along {blk.split}"
                 + (", computed transposed (C^T = B^T A^T)" if blk.transposed else "")
                 + (f", epilogue of {len(fused[1].body)} ops fused" if fused else "")
                 + ("" if blk.pack_a or blk.transposed else ", A read in place")
                 + (f", B packed at compile time ({len(sources)} constant(s))" if sources else "")
                 + (f", A packed at compile time as B^T ({len(a_sources)} constant(s))" if a_sources else "")
                 + (f", A read from its transpose's source ({len(a_feeds)} site(s))" if a_feeds else "")
                 + (f", B read from its transpose's source ({len(b_feeds)} site(s))" if b_feeds else ""))
    return 1


def _kernel_functions(module: ir.Module) -> list[ir.Operation]:
    return [op for op in ops_named(module, "func.func")
            if ir.StringAttr(op.attributes["sym_name"]).value.startswith(KERNEL_PREFIX)]

@dataclasses.dataclass(frozen=True)
class PackContractions:
    """The pass; ``unit_step`` is the target's hook that builds one instruction of a matrix unit kept in
    the vector registers (`pbsdk.targets.cpu.hooks.unit_step` unless a plugin replaces it)."""

    name = "pack-contractions"
    unit_step: UnitStepHook = default_unit_step

    def apply(self, module: ir.Module, ctx: Any) -> None:
        if not cpu_options(ctx).pack:
            ctx.notes.setdefault(self.name, []).append("disabled by option pack=False")
            return
        notes = ctx.notes.setdefault(self.name, [])
        count = self._implicit_convolutions(module, ctx, notes) if cpu_options(ctx).implicit_conv else 0
        calls: dict[str, list[ir.Operation]] = {}
        for call in ops_named(module, "func.call"):
            calls.setdefault(ir.FlatSymbolRefAttr(call.attributes["callee"]).value, []).append(call)
        dynamic_built: dict[tuple[str, ...], func.FuncOp] = {}  # dynamic kernels by operand types (no epilogue)
        for op in ops_named(module, "linalg.matmul") + ops_named(module, "linalg.batch_matmul"):
            if len(op.operands) != 3 or not all(isinstance(v.type, ir.MemRefType) for v in op.operands):
                notes.append(f"{op.name}: not on buffers; left as is")
                continue
            a, b, c = (ir.MemRefType(v.type) for v in op.operands)
            dtype = str(a.element_type)
            if not all(t.has_static_shape for t in (a, b, c)):
                count += _dynamic_contraction(module, op, f"{KERNEL_PREFIX}{count}", ctx, notes, dynamic_built)
                continue
            narrow = _narrow(a, b, c)
            if dtype in UNIT_OPERANDS and str(b.element_type) == dtype and not (narrow and _widens(op, ctx)):
                count += _unit_contraction(self, module, op, f"{KERNEL_PREFIX}{count}", ctx, notes, calls)
                continue
            if not (narrow or (str(b.element_type) == str(c.element_type) == dtype and dtype in _FLOATS)):
                record_contraction(ctx, op.name, dtype, 0, 0, 0, 0, "generic")
                notes.append(f"{op.name}: element types {a.element_type}/{b.element_type}/{c.element_type}: "
                             "generic lowering")
                continue
            if not all(_unit_inner_stride(t) for t in (a, b, c)):
                notes.append(f"{op.name}: an operand's innermost stride is not 1: generic lowering")
                continue
            count += _fma_contraction(module, op, f"{KERNEL_PREFIX}{count}", ctx, notes, calls, narrow)
        self._merge_kernels(module, notes)

    @staticmethod
    def _merge_kernels(module: ir.Module, notes: list[str]) -> None:
        """Kernels that came out the same (the products of one shape with different constant weights: a
        mixture of experts' per-expert matmuls, a decoder's layers) become one: merged leaves first, so the
        functions calling them print the same in the next round, until nothing merges."""
        before = len(_kernel_functions(module))
        def kernel(op: ir.Operation) -> bool:
            return ir.StringAttr(op.attributes["sym_name"]).value.startswith(KERNEL_PREFIX)

        while merge_identical(module, kernel):
            pass
        after = len(_kernel_functions(module))
        if after < before:
            notes.append(f"{before - after} kernel function(s) identical to another merged ({after} left)")

    def _implicit_convolutions(self, module: ir.Module, ctx: Any, notes: list[str]) -> int:
        """Calls of an isolated contraction whose A is the core's im2col of an NHWC convolution
        (`find_im2col`) become calls of a packed kernel that reads the input in place (a `Window`): no
        patch matrix, no packing of A. The patch copies go, and so does the contraction function once
        nothing calls it. Returns how many kernels were built (they are named like the others)."""
        table = ir.SymbolTable(module.operation)
        count = rows = 0
        rewritten: dict[str, ir.Operation] = {}  # contraction functions a rewritten call called
        for call in ops_named(module, "func.call"):
            callee_name = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
            if not callee_name.startswith(CONTRACTION_PREFIX):
                continue
            found = find_im2col(call)
            if found is None:
                continue
            callee = table[callee_name]
            if str(ir.MemRefType(call.operands[0].type).element_type) in UNIT_OPERANDS:
                built = _unit_window(self, module, ctx, call, found, callee, f"{KERNEL_PREFIX}{count}", notes)
                if built:
                    count += 1
                    rewritten[callee_name] = callee
                elif found.geometry.dw == 1 and identity_layout(ir.MemRefType(found.x.type)):
                    copy_by_rows(module, found, f"__pbsdk_im2col_rows{rows}")
                    rows += 1
                    notes.append(f"@{callee_name}: its im2col copies a kernel row ({found.geometry.kw} taps) at "
                                 "a time (copy_by_rows)")
                continue
            body = _contraction_body(callee, cpu_options(ctx).fuse_epilogues)
            if body is None:
                notes.append(f"@{callee_name}: im2col found but the function is not one matmul on its "
                             "arguments: im2col kept")
                continue
            mm, fill, fused = body
            a, b, c = (ir.MemRefType(v.type) for v in mm.operands)
            dtype = str(a.element_type)
            if not (str(b.element_type) == str(c.element_type) == dtype and dtype in _FLOATS):
                continue
            m, k = a.shape
            n = b.shape[-1]
            g = found.geometry

            x_type = ir.MemRefType(found.x.type)
            channels = int(x_type.shape[3])
            operands = [found.x, _at_call(mm.operands[1], callee, call), _at_call(mm.operands[2], callee, call)]
            operands += [_at_call(v, callee, call) for v in fused[2]] if fused else []
            weights = find_constant(operands[1], call, len(ctx.constants)) if cpu_options(ctx).prepack_b else None
            # The window reads the input in place as A: never transposed.
            plan = plan_contraction(ctx.spec, Contraction(m, n, k, 1, dtype, b_prepacked=weights is not None),
                                    ctx.options.replace(transpose_gemm=False))
            blk = plan.blocking
            run = window_run(channels, g.kw, g.dw)
            kc = None
            if blk is not None and run is not None:
                length, row_runs = run
                kc = window_k_block(length, g.kh if row_runs else g.kh * g.kw, blk.kc)
            if blk is None or run is None or kc is None:
                notes.append(f"@{callee_name}: im2col of {channels} channel(s) kept "
                             + ("(no packed blocking)" if blk is None else "(too few channels to read in place)"))
                continue
            blk = dataclasses.replace(blk, kc=kc)
            window = Window(g, x_type, row_runs=row_runs)
            name = f"{KERNEL_PREFIX}{count}"
            count += 1
            with call.location:
                kernel = build_matmul_kernel(module, name,
                                             MatmulShape(m, n, k, 0, a, packed_type(b, blk.nr) if weights else b, c),
                                             blk, epilogue=fused[1] if fused else None, zero_init=fill is not None,
                                             window=window, prepacked_b=weights is not None)
                new = func.CallOp(kernel, operands, ip=ir.InsertionPoint(call))
            call.erase()
            found.erase()
            if weights is not None:
                rebind(weights, new.operation, 1, blk.nr, ctx)
            rewritten[callee_name] = callee
            record_contraction(ctx, "conv2d", dtype, 1, m, n, k, "vector-fma")
            notes.append(f"conv2d {g.oh}x{g.ow} {g.kh}x{g.kw} s{g.sh}x{g.sw} d{g.dh}x{g.dw} {channels}->{n} "
                         f"{dtype}: implicit GEMM, packed kernel @{name} reads the input in place (no im2col), "
                         f"register tile {blk.mr}x{blk.nr}, mc/nc/kc {blk.mc}/{blk.nc}/{blk.kc}, "
                         f"{blk.threads} part(s) along {blk.split}"
                         + (f", epilogue of {len(fused[1].body)} ops fused" if fused else "")
                         + (", B packed at compile time" if weights is not None else ""))
        if rewritten:  # a contraction function nothing calls any more goes
            called = {ir.FlatSymbolRefAttr(o.attributes["callee"]).value for o in ops_named(module, "func.call")}
            for name, fn in rewritten.items():
                if name not in called:
                    fn.erase()
        return count


def _dynamic_contraction(module: ir.Module, op: ir.Operation, name: str, ctx: Any, notes: list[str],
                         built: dict[tuple[str, ...], func.FuncOp] | None = None) -> int:
    """A float contraction with dynamic sizes (any of m, n, k; the batch static; identity layouts) becomes
    a call of ``@name``, which picks by the row count one kernel per size bucket of
    `plan_dynamic_contraction` (each `build_matmul_kernel` with the dynamic sizes `DYNAMIC`, read from the
    buffers at run time; a dynamic n or k is planned at `DYNAMIC_EXTENT`). Returns 1 when it built one; 0
    when it called one already in ``built`` (the same operand types, no epilogue: a mixture of experts'
    per-group products) or left the op to the generic lowering, with a note saying why."""
    a, b, c = (ir.MemRefType(v.type) for v in op.operands)
    dtype = str(a.element_type)
    dyn = ir.ShapedType.get_dynamic_size()
    batched = op.name == "linalg.batch_matmul"
    lead = 1 if batched else 0
    # a batch known at run time: every operand's (one batch, not broadcast), the kernel loops over C's
    dyn_batch = batched and all(t.shape[0] == dyn for t in (a, b, c))
    narrow = _narrow(a, b, c)
    if not (narrow or (str(b.element_type) == str(c.element_type) == dtype and dtype in _FLOATS)) \
            or (batched and not dyn_batch and any(t.shape[0] == dyn for t in (a, b, c))) \
            or not all(row_major(t) for t in (a, b, c)):
        record_contraction(ctx, op.name, dtype, 0, 0, 0, 0, "generic")
        notes.append(f"{op.name} {a} x {b}: a batch of unequal dynamic sizes, a strided operand or not a float "
                     "product: generic lowering")
        return 0
    bsz = (DYNAMIC if dyn_batch else a.shape[0]) if batched else 0
    m, k, n = c.shape[lead], a.shape[-1], b.shape[-1]
    # narrow operands: widened where no unit the target lowers takes them (a unit's plan has no buckets here)
    pspec = unit_spec(ctx.spec, cpu_options(ctx).amx)[0] if narrow else ctx.spec
    plan = plan_dynamic_contraction(pspec, n=n if n != dyn else DYNAMIC_EXTENT,
                                    k=k if k != dyn else DYNAMIC_EXTENT,
                                    batch=DYNAMIC_BATCH if dyn_batch else max(bsz, 1), dtype=dtype,
                                    options=ctx.options, m=None if m == dyn else m)
    n_text, k_text = (str(v) if v != dyn else "?" for v in (n, k))
    if plan is None:
        record_contraction(ctx, op.name, dtype, bsz, 0, 0, 0, "generic")
        notes.append(f"{op.name} ?x{n_text}x{k_text}: a size bucket has no packed blocking: generic lowering")
        return 0
    opname = op.name
    fused = _epilogue(op, str(c.element_type)) if cpu_options(ctx).fuse_epilogues else None
    fill = _zero_fill_before(op)
    operands = list(op.operands) + (fused[2] if fused else [])
    key = (opname, str(a), str(b), str(c), str(fill is not None))
    same = built.get(key) if built is not None and not fused else None
    if same is not None:
        with op.location:
            func.CallOp(same, operands, ip=ir.InsertionPoint(op))
        op.erase()
        if fill is not None:
            fill.erase()
        record_contraction(ctx, opname, dtype, bsz, -1 if m == dyn else m, -1 if n == dyn else n,
                           -1 if k == dyn else k, "vector-fma")
        notes.append(f"{opname} ?x{n_text}x{k_text} {dtype}: dynamic sizes, the packed kernel "
                     f"@{ir.StringAttr(same.attributes['sym_name']).value} built for the same operands")
        return 0
    with op.location:
        kernels = []
        for i, bucket in enumerate(plan.buckets):
            shape = MatmulShape(DYNAMIC if m == dyn else m, DYNAMIC if n == dyn else n, DYNAMIC if k == dyn else k,
                                bsz, a, b, c)
            kernels.append(build_matmul_kernel(module, f"{name}_m{i}", shape, bucket.blocking,
                                               epilogue=fused[1] if fused else None, zero_init=fill is not None))
        with ir.InsertionPoint(module.body):
            dispatch = func.FuncOp(name, ([v.type for v in operands], []), visibility="private")
            entry = dispatch.add_entry_block()
            with ir.InsertionPoint(entry):
                args = list(entry.arguments)
                index = ir.IndexType.get()
                rows = memref.dim(args[2], arith.ConstantOp(index, c.rank - 2).result) if len(plan.buckets) > 1 \
                    else None

                def pick(i: int) -> None:
                    bucket = plan.buckets[i]
                    if bucket.hi is None or i == len(plan.buckets) - 1:
                        func.CallOp(kernels[i], args)
                        return
                    fits = arith.cmpi(arith.CmpIPredicate.sle, rows, arith.ConstantOp(index, bucket.hi).result)
                    if_then(fits, lambda: func.CallOp(kernels[i], args), lambda: pick(i + 1))

                pick(0)
                func.ReturnOp([])
        func.CallOp(dispatch, operands, ip=ir.InsertionPoint(op))
    if built is not None and not fused:
        built[key] = dispatch
    if fused:
        fused[0].erase()
    op.erase()
    if fill is not None:
        fill.erase()
    record_contraction(ctx, opname, dtype, bsz, -1 if m == dyn else m, -1 if n == dyn else n, -1 if k == dyn else k,
                       "vector-fma")
    notes.append(f"{opname} {('?x' if dyn_batch else f'{bsz}x') if batched else ''}{m if m != dyn else '?'}x{n_text}x{k_text} "
                 f"{dtype}: dynamic sizes, packed kernel @{name} over {len(plan.buckets)} size bucket(s) ("
                 f"{plan.describe()})" + (f", epilogue of {len(fused[1].body)} ops fused" if fused else "")
                 + (f", A and B widened to {kernel_dtype(c)} as packed" if narrow else ""))
    return 1


def _at_call(v: ir.Value, callee: ir.Operation, call: ir.Operation) -> ir.Value:
    """The caller's value for ``callee``'s ``v``: the call's operand for an argument; a constant the function
    reads (an epilogue's, `_contraction_body`) is read again at the call."""
    args = list(callee.regions[0].blocks[0].arguments)
    if any(arg == v for arg in args):
        return call.operands[next(i for i, arg in enumerate(args) if arg == v)]
    src = defining_op(v)
    assert src is not None and src.name == "memref.get_global"
    return src.clone(ip=ir.InsertionPoint(call)).results[0]


def _unit_window(self: PackContractions, module: ir.Module, ctx: Any, call: ir.Operation, found: Im2col,
                 callee: ir.Operation, name: str, notes: list[str]) -> bool:
    """Replace the ``call`` of a bf16 or i8 contraction whose A is an im2col (``found``) by a call of a unit
    kernel that reads the convolution's input in place (`build_unit_kernel` with a `Window`: implicit GEMM on
    the matrix unit), where the spec has a unit in the vector registers and the channels come in whole groups
    of the unit's k. i8 offsets each group by 128 at its broadcast (a GEMM packs A to do that once; here no
    patch matrix is copied: PT2E ResNet-18 at batch 1 0.68x -> 0.82x Inductor on Zen 4). Returns whether it
    did; else the im2col stays (the call is packed as a plain contraction later) and the reason is noted."""
    g, x_type = found.geometry, ir.MemRefType(found.x.type)
    channels = int(x_type.shape[3])
    where = f"conv2d {g.oh}x{g.ow} {g.kh}x{g.kw} s{g.sh}x{g.sw} {channels} channel(s)"
    body = _contraction_body(callee, cpu_options(ctx).fuse_epilogues, unit=True)
    if body is None:
        notes.append(f"{where}: the contraction is not one matmul on its arguments: im2col kept")
        return False
    mm, fill, fused = body
    a, b, c = (ir.MemRefType(v.type) for v in mm.operands)
    dtype = str(a.element_type)
    acc = UNIT_OPERANDS[dtype]
    if str(b.element_type) != dtype or str(c.element_type) != acc:
        notes.append(f"{where}: {a.element_type}/{b.element_type}/{c.element_type} is read by packing: im2col kept")
        return False
    spec, _ = unit_spec(ctx.spec, cpu_options(ctx).amx)
    first = units_for(spec, dtype, acc)
    u = group_size(first[0].reads if first else dtype)  # values of k in a 32-bit group as the unit reads them
    (m, k), n = a.shape, b.shape[-1]
    b_value = _at_call(mm.operands[1], callee, call)  # an argument (`_contraction_body`): the call's operand
    weights = find_constant(b_value, call, len(ctx.constants)) if cpu_options(ctx).prepack_b else None
    window = _unit_window_runs(g, x_type, dtype, u, weights is not None)
    k_read = k if window is None else padded_k(k, window.run, window.k_run)  # with B's zero rows past each run
    blk = plan_contraction(spec, Contraction(m, n, k_read, 1, dtype, b_prepacked=weights is not None),
                           ctx.options).blocking
    unit = next((x for x in spec.matrix_units if blk is not None and x.name == blk.unit), None)
    tiles = unit is not None and unit.registers == "tile"
    if tiles:  # the tile kernel packs A from the window: a step's k values within one tap's channels
        assert blk is not None and unit is not None
        fits = window is not None and not window.row_runs and window.channels % blk.unit_k == 0
        kc = blk.kc if fits else None
    else:
        kc = window_k_block(window.k_run, k // window.run, blk.kc) if blk is not None and window is not None else None
    if blk is None or unit is None or window is None or kc is None or kc % u:
        notes.append(f"{where}: no in-place read (a unit in the vector registers: channels in groups of {u}, or "
                     "i8 kernel rows of a constant weight; whole runs per k block; no read past the input; a tile "
                     "unit: channels in whole steps of its k): im2col kept")
        return False
    blk = dataclasses.replace(blk, kc=kc, pack_a=tiles)
    mode = _tile_mode(unit, ctx)
    runs = (window.run, window.k_run) if window.k_run != window.run else None
    c_unused = fused is not None and fill is not None and kc >= k_read
    with call.location:
        c_type = ir.MemRefType.get([1] * c.rank, c.element_type) if c_unused else c
        if c_unused:
            c_value = memref.alloca(c_type, [], [], ip=ir.InsertionPoint(call))
        elif any(arg == mm.operands[2] for arg in callee.regions[0].blocks[0].arguments):
            c_value = _at_call(mm.operands[2], callee, call)
        else:  # the function's own accumulator: one of the caller's, for the call
            c_value = memref.alloc(c_type, [], [], alignment=64, ip=ir.InsertionPoint(call))
            memref.dealloc(c_value, ip=ir.InsertionPoint.after(call))
        reads = _unit_reads(unit)
        packing = (_unit_packing(b, k, n, blk, blk.kc if tiles else 1, runs=runs, reads=reads)
                   if weights is not None else None)
        kernel = build_unit_kernel(module, name, UnitShape(m, n, k_read, 0, a, packing[1] if packing else b, c_type,
                                                           reads),
                                   blk, unit_step_builder(unit, module, ctx, self.unit_step),
                                   zero_init=fill is not None, epilogue=fused[1] if fused else None,
                                   prepacked_b=packing is not None, window=window, tiles=mode)
        operands = [found.x, b_value, c_value]
        operands += [_at_call(v, callee, call) for v in fused[2]] if fused else []
        new = func.CallOp(kernel, operands, ip=ir.InsertionPoint(call))
    call.erase()
    found.erase()
    if weights is not None:
        rebind(weights, new.operation, 1, blk.nr, ctx, packing=packing)
    if mode == "amx":
        ctx.notes["amx"] = True  # the executable asks Linux for the tile state
    record_contraction(ctx, "conv2d", dtype, 1, m, n, k, "matrix-unit", unit.name)
    notes.append(f"{where}->{n} {dtype}: implicit GEMM on {unit.name}, {'tile' if tiles else 'unit'} kernel "
                 f"@{name} {'packs A from the input' if tiles else 'reads the input in place'} (no im2col)"
                 + (f", kernel rows of {runs[0]} values as {runs[1] // u} groups of {u} (B's rows past each "
                    "row zero)" if runs else "")
                 + f", register tile {blk.mr}x{blk.nr}, mc/nc/kc {blk.mc}/{blk.nc}/{blk.kc}, "
                 f"{blk.threads} part(s) along {blk.split}"
                 + (f", epilogue fused (stores {fused[1].out_type.element_type})" if fused else "")
                 + (", B packed at compile time" if weights is not None else ""))
    return True


def _constant_operand(mm: ir.Operation, operand: int, calls: dict[str, list[ir.Operation]], available: int,
                      ) -> list[tuple[ir.Operation | None, ConstantB]] | None:
    """Where operand ``operand`` of ``mm`` (1: B, 0: A) comes from when it is a constant that can be packed
    at compile time: ``[(None, c)]`` when ``mm`` reads constant ``c`` itself; ``[(call, c), ...]`` when
    ``mm`` reads a parameter of its function (read by nothing else) and every call of the function passes a
    constant there. None otherwise."""
    b = mm.operands[operand]
    fn = function_of(b)
    if fn is None or attributes.arg_i64(fn, ir.BlockArgument(b).arg_number, attributes.CONSTANT) is not None:
        found = find_constant(b, mm, available)
        return [(None, found)] if found is not None else None
    if len(list(b.uses)) != 1:
        return None
    position = ir.BlockArgument(b).arg_number
    sites = calls.get(ir.StringAttr(fn.attributes["sym_name"]).value, [])
    out: list[tuple[ir.Operation | None, ConstantB]] = []
    for call in sites:
        found = find_constant(call.operands[position], call, available)
        if found is None:
            return None
        out.append((call, found))
    return out or None


def _read_source(operand: ir.Value, feeds: list[TransposedFeed]) -> None:
    """The replaced matmul's ``operand`` read the transposed buffers of ``feeds``: the kernel call now
    reads their source; a function argument takes the source's type."""
    fn = function_of(operand)
    if fn is not None and feeds[0].user.name == "func.call":
        set_argument_type(fn, ir.BlockArgument(operand).arg_number, source_type(feeds))
    read_source(feeds)


def _prepack(b: ir.Value, kernel_call: ir.Operation, sources: list[tuple[ir.Operation | None, ConstantB]],
             nr: int, ctx: Any, *, transposed: bool = False, packing: Packing | None = None) -> None:
    """Pack the constants `_constant_operand` found for the operand ``b`` that becomes the kernel's B (the
    matmul now replaced by ``kernel_call``, whose operand 1 it is; with ``transposed`` the given A, packed
    as B^T) and pass them packed: to the kernel call itself, or to every call of the matmul's function
    (whose parameter takes the packed type)."""
    b_type = ir.MemRefType(b.type)
    if sources[0][0] is None:
        rebind(sources[0][1], kernel_call, 1, nr, ctx, transposed=transposed, packing=packing)
        return
    fn = function_of(b)
    assert fn is not None
    position = ir.BlockArgument(b).arg_number
    set_argument_type(fn, position, packing[1] if packing else packed_type(b_type, nr, transposed=transposed))
    for call, found in sources:
        assert call is not None
        rebind(found, call, position, nr, ctx, transposed=transposed, packing=packing)


def _contraction_body(fn: ir.Operation, fuse_epilogues: bool, unit: bool = False,
                      ) -> tuple[ir.Operation, ir.Operation | None, tuple[ir.Operation, Any, list[ir.Value]] | None] | None:
    """An isolated contraction function as (its one ``linalg.matmul`` on its arguments, the zero fill before
    it or None, its fusable epilogue or None: (the generic, its `Epilogue` — a `UnitEpilogue` for a
    ``unit`` kernel — and its operands)), or None if it holds anything else. A ``unit`` contraction's C may
    be the function's own buffer (the wide accumulator of a bf16 product whose epilogue rounds it into an
    argument): `_local_c`."""
    entry = fn.regions[0].blocks[0]
    args = list(entry.arguments)
    ops = [o.operation for o in entry.operations]
    mms = [o for o in ops if o.name == "linalg.matmul"]
    if len(mms) != 1 or len(mms[0].operands) != 3:
        return None
    mm = mms[0]
    local = _local_c(mm) if unit else None
    if not all(v in args for v in mm.operands[:2]) or (mm.operands[2] not in args and local is None):
        return None
    if not all(isinstance(v.type, ir.MemRefType) and _unit_inner_stride(ir.MemRefType(v.type)) for v in mm.operands):
        return None
    fill = _zero_fill_before(mm)
    fused: tuple[ir.Operation, Any, list[ir.Value]] | None = None
    if fuse_epilogues and unit:
        found = find_epilogue(mm)
        fused = (found[0].generic, found[0], found[1]) if found else None
    elif fuse_epilogues:
        fused = _epilogue(mm, str(ir.MemRefType(mm.operands[0].type).element_type))
    # An epilogue reads arguments, or constants of the module (a batch norm's, read in by isolate-contractions).
    if fused is not None and not all(v in args or _global(v) for v in fused[2]):
        fused = None
    allowed = {mm, fill, fused[0] if fused else None, *(local or ())}
    for o in ops:
        if o in allowed or o.name in ("arith.constant", "func.return", "memref.get_global"):
            continue
        return None
    return mm, fill, fused


def _local_c(mm: ir.Operation) -> tuple[ir.Operation, ...] | None:
    """The ``memref.alloc`` of ``mm``'s C and its deallocs, if C is a buffer of the function that nothing but
    ``mm``, its zero fill and its epilogue use (so a kernel may take a buffer of the caller's instead)."""
    alloc = defining_op(mm.operands[2])
    if alloc is None or alloc.name != "memref.alloc" or alloc.operands:
        return None
    users = [user_op(u) for u in alloc.results[0].uses]
    deallocs = tuple(u for u in users if u.name == "memref.dealloc")
    if len(users) - len(deallocs) > 3:
        return None
    return (alloc, *deallocs)


def _global(v: ir.Value) -> bool:
    src = defining_op(v)
    return src is not None and src.name == "memref.get_global"
