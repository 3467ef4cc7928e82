"""Pass ``dynamic-sizes``: function boundaries of dynamic buffers as pointers plus a buffer of sizes.

A target whose functions take bare pointers (the cpu target's LLVM lowering, `use-bare-ptr-memref-call-conv`,
which the fork onto the cores and the loader rely on) cannot pass a ``memref<?x768xf32>``: a bare pointer
carries no size. This pass rewrites every function that takes such buffers so that it takes

- each dynamic buffer as a carrier ``memref<1xT>`` (its base pointer; identity layouts only), and
- one more argument, ``memref<Nxindex>``, holding the N dynamic sizes of those buffers in argument order,
  inserted after the last buffer argument (so a part function's trailing thread index stays last),

and rebuilds each buffer at the top of the body with ``memref.reinterpret_cast`` from its carrier, the
sizes loaded from the sizes buffer and the row-major strides computed from them. Every call of a rewritten
function passes the carriers (``memref.reinterpret_cast`` of its operands) and a sizes buffer it fills with
``memref.dim`` (a ``memref.alloca`` in the caller's entry block); a call that is the whole body of an
``scf.forall`` gets them before the loop, so the loop still forks (`pbsdk.targets.cpu.parallel`).

The entry function's sizes come from the caller: their expressions (`pbsdk.core.dims`, from the signature
the ``input`` stage recorded) go to ``ctx.notes["dynamic_sizes"]`` and the artifact's metadata
(`pbsdk.core.target.DYNAMIC_SIZES`). A dynamic buffer with a non-identity layout, or a declaration taking
one, is a `DynamicShapeError`.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import arith, memref

from pbsdk.core.errors import DynamicShapeError
from pbsdk.core.passes import layout_at_run_time, match_signature, ops_named, row_major

#: ``ctx.notes`` key: the entry's size expressions, in the order of its sizes buffer.
NOTE = "dynamic_sizes"


def _dynamic(t: ir.Type) -> bool:
    return isinstance(t, ir.MemRefType) and not ir.MemRefType(t).has_static_shape


def _carrier(t: ir.MemRefType) -> ir.MemRefType:
    return ir.MemRefType.get([1], t.element_type, memory_space=t.memory_space)


def _dyn_dims(t: ir.MemRefType) -> list[int]:
    return [d for d, n in enumerate(t.shape) if n == ir.ShapedType.get_dynamic_size()]


def _rebuild(carrier: ir.Value, t: ir.MemRefType, sizes: list[ir.Value]) -> ir.Value:
    """``carrier`` viewed as ``t`` (identity layout) with its dynamic sizes ``sizes``, in order."""
    index = ir.IndexType.get()
    dyn = ir.ShapedType.get_dynamic_size()
    it = iter(sizes)
    shape = [next(it) if n == dyn else n for n in t.shape]
    strides: list[ir.Value | int] = [1]
    running: ir.Value | int = 1
    for n in reversed(shape[1:]):
        if isinstance(n, int) and isinstance(running, int):
            running = running * n
        else:
            a = running if isinstance(running, ir.Value) else arith.constant(index, running)
            b = n if isinstance(n, ir.Value) else arith.constant(index, n)
            running = arith.muli(a, b)
        strides.append(running)
    strides = strides[:len(shape)][::-1]
    dyn_stride = ir.ShapedType.get_dynamic_stride_or_offset()
    return memref.reinterpret_cast(
        t, carrier, [], [n for n in shape if isinstance(n, ir.Value)],
        [s for s in strides if isinstance(s, ir.Value)], [0],
        [dyn if isinstance(n, ir.Value) else n for n in shape],
        [dyn_stride if isinstance(s, ir.Value) else s for s in strides])


@dataclasses.dataclass(frozen=True)
class DynamicSizes:
    """Dynamic buffers at function boundaries as carriers plus a sizes buffer (module docstring)."""

    name = "dynamic-sizes"

    def apply(self, module: ir.Module, ctx: Any = None) -> None:
        notes = ctx.notes if ctx is not None else {}
        entry = notes.get("entry")
        rewritten: dict[str, list[tuple[int, ir.MemRefType]]] = {}  # function -> its dynamic buffer args
        with module.context, ir.Location.unknown():
            for fn in ops_named(module, "func.func"):
                name = ir.StringAttr(fn.attributes["sym_name"]).value
                ftype = ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value)
                dyn = [(i, ir.MemRefType(t)) for i, t in enumerate(ftype.inputs) if _dynamic(t)]
                for i, t in enumerate(ftype.inputs):
                    if not _dynamic(t) and layout_at_run_time(t):
                        raise DynamicShapeError(f"@{name}'s argument {i} is a view whose strides or offset are "
                                                f"known only at run time ({t}); only identity layouts pass as "
                                                "pointers", op="func.func")
                if any(_dynamic(t) for t in ftype.results):
                    raise DynamicShapeError(f"@{name} returns a dynamic buffer; results are output arguments "
                                            "by now", op="func.func")
                if not dyn:
                    continue
                for i, t in dyn:
                    if not row_major(t):
                        raise DynamicShapeError(f"@{name}'s argument {i} is a dynamic buffer with a strided "
                                                f"layout ({t}); only identity layouts pass as pointers",
                                                op="func.func")
                if not fn.regions[0].blocks:
                    raise DynamicShapeError(f"declaration @{name} takes dynamic buffers; its body would need "
                                            "their sizes", op="func.func")
                self._rewrite_function(fn, dyn)
                rewritten[name] = dyn
                if name == entry:
                    notes[NOTE] = self._entry_sizes(dyn, notes, len(ctx.constants) if ctx is not None else 0)
            for call in ops_named(module, "func.call"):
                callee = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
                if callee in rewritten:
                    self._rewrite_call(call, rewritten[callee])

    @staticmethod
    def _entry_sizes(dyn: list[tuple[int, ir.MemRefType]], notes: dict[str, Any], constants: int) -> list[str]:
        """The entry's size expressions: its arguments are the inputs, the constants (static), the outputs.
        Without a recorded signature (a module given at the buffer level) argument i's dimension d is
        ``a<i>d<d>``."""
        inputs, outputs = notes.get("inputs"), notes.get("outputs")
        shapes: list[Any] | None = None
        if inputs is not None and outputs is not None:
            shapes = [s for s, _ in inputs] + [None] * constants + [s for s, _ in outputs]
        out = []
        for i, t in dyn:
            for d in _dyn_dims(t):
                size = shapes[i][d] if shapes is not None and i < len(shapes) and shapes[i] is not None \
                    and len(shapes[i]) == t.rank and isinstance(shapes[i][d], str) else None
                out.append(size if size is not None else f"a{i}d{d}")
        return out

    @staticmethod
    def _rewrite_function(fn: ir.Operation, dyn: list[tuple[int, ir.MemRefType]]) -> None:
        block = fn.regions[0].blocks[0]
        index = ir.IndexType.get()
        count = sum(len(_dyn_dims(t)) for _, t in dyn)
        sizes_type = ir.MemRefType.get([count], index)
        args = list(block.arguments)
        last_buffer = max(i for i, a in enumerate(args) if isinstance(a.type, ir.MemRefType))
        # The sizes argument goes right after the last buffer: arguments after it move behind it.
        tail = args[last_buffer + 1:]
        sizes_arg = block.add_argument(sizes_type, ir.Location.unknown())
        for old in tail:
            new = block.add_argument(old.type, old.location)
            old.replace_all_uses_with(new)
        for _ in tail:
            block.erase_argument(last_buffer + 1)
        with ir.InsertionPoint.at_block_begin(block):
            k = 0
            for i, t in dyn:
                arg = block.arguments[i]
                sizes = []
                for _ in _dyn_dims(t):
                    sizes.append(memref.load(sizes_arg, [arith.constant(index, k)]))
                    k += 1
                arg.set_type(_carrier(t))
                view = _rebuild(arg, t, sizes)
                arg.replace_all_uses_except(view, view.owner.operation)
        match_signature(fn)

    @staticmethod
    def _rewrite_call(call: ir.Operation, dyn: list[tuple[int, ir.MemRefType]]) -> None:
        operands = list(call.operands)
        # A call that is the whole body of a forall (a part of a fork) gets its arguments before the loop.
        at = call
        parent = call.parent
        if parent is not None and parent.name == "scf.forall" and len(parent.regions[0].blocks[0].operations) == 2:
            at = parent  # the call and the terminator: every buffer it passes is defined outside
        fn = at.parent
        while fn is not None and fn.name != "func.func":
            fn = fn.parent
        assert fn is not None
        index = ir.IndexType.get()
        count = sum(len(_dyn_dims(t)) for _, t in dyn)
        with ir.InsertionPoint.at_block_begin(fn.regions[0].blocks[0]):
            sizes = memref.alloca(ir.MemRefType.get([count], index), [], [])
        with ir.InsertionPoint(at):
            k = 0
            for i, t in dyn:
                value = operands[i]
                if not row_major(ir.MemRefType(value.type)):
                    raise DynamicShapeError(f"a call passes a strided dynamic buffer ({value.type}) to a function "
                                            "that takes it as a pointer", op="func.call")
                for d in _dyn_dims(t):
                    memref.store(memref.dim(value, arith.constant(index, d)), sizes, [arith.constant(index, k)])
                    k += 1
                operands[i] = memref.reinterpret_cast(_carrier(t), value, [], [], [], [0], [1], [1])
        buffers = [j for j, o in enumerate(operands) if isinstance(o.type, ir.MemRefType)]
        operands.insert(max(buffers) + 1, sizes)
        with ir.InsertionPoint(call), call.location:
            new = ir.Operation.create("func.call", results=[r.type for r in call.results], operands=operands,
                                      attributes={a.name: a.attr for a in (call.attributes[i] for i in range(len(call.attributes)))})
        for old, fresh in zip(call.results, new.results):
            old.replace_all_uses_with(fresh)
        call.erase()


__all__ = ["NOTE", "DynamicSizes"]
