"""Build a `Graph` as MLIR at the linalg-on-tensors level, with the MLIR Python bindings' builders.

Every graph op becomes one linalg op (``linalg.generic`` with explicit indexing maps for elementwise ops
with broadcasting, reductions, contractions with transposed or broadcast operands, and convolutions;
named ops where they say the same thing: ``linalg.matmul``, ``linalg.batch_matmul``, ``linalg.transpose``),
so the rest of the pipeline — fusion, tiling, bufferization — is upstream MLIR working on upstream ops.
Half-precision elementwise math is computed in f32 inside the op body and rounded once on the way out.

Constants: a graph constant of more than `INLINE_LIMIT` values that are not all equal (a frozen
weight) never becomes IR. With a ``constants`` list (`build_graph`) or through `emit_program`, it becomes
an argument of the entry function after the user inputs, marked ``pbsdk.constant = i`` (its index in the
list) and ``bufferization.writable = false``, and its array goes to the list: the bytes travel next to the
module to the driver, the cache and the loader, which binds them (`pbsdk.core.target.Artifact.constants`).
Small and splat constants stay ``arith.constant``s, so folding still sees them. `emit_graph` (text for
reading and for tools that take text alone) prints every constant inline.

`build_graph` returns the ``ir.Module``; `emit_program` its text and constants (what the frontends hand
to `pbsdk.core.compiler.compile_text`); `emit_graph` the text alone.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from mlir import ir
from mlir.dialects import arith, bufferization, func, linalg, memref, scf, tensor
from mlir.dialects import math as math_d

from pbsdk.core.dims import Dim
from pbsdk.core.errors import CompileError, DynamicShapeError, UnsupportedError
from pbsdk.core.ir import attributes
from pbsdk.core.ir.builder import (
    affine_map,
    dims,
    element_type,
    fill,
    float_constant,
    generic,
    memref_type,
    reassociation,
    scalar_constant,
    static_sizes,
    tensor_type,
)
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY, INLINE_LIMIT, Graph, Node, TensorType, Value
from pbsdk.core.ir.layout import LayoutReport, channels_last
from pbsdk.core.options import Options, as_options
from pbsdk.core.passes import match_signature

_log = logging.getLogger(__name__)


def _compute_dtype(dtype: str) -> str:
    return "f32" if dtype in ("f16", "bf16") else dtype


def _broadcast_results(in_shape: tuple[int, ...], out_shape: tuple[int, ...],
                       loops: Sequence[ir.AffineExpr]) -> list[ir.AffineExpr | int]:
    """Index expressions reading an operand broadcast (numpy rules) against ``out_shape``."""
    offset = len(out_shape) - len(in_shape)
    return [0 if d == 1 and out_shape[offset + i] != 1 else loops[offset + i] for i, d in enumerate(in_shape)]


def constant_data(array: np.ndarray, t: TensorType) -> np.ndarray:
    """``array`` as a read-only C-order array of ``t``'s shape and dtype; no copy when it already is."""
    data = np.ascontiguousarray(np.asarray(array).astype(DTYPE_TO_NUMPY[t.dtype], copy=False).reshape(t.shape))
    if data.flags.writeable:
        data = data.view()
        data.flags.writeable = False
    return data


def _external(array: np.ndarray, t: TensorType) -> bool:
    """Whether a constant becomes an operand: large, of a dtype numpy holds, and not one repeated value."""
    if array.size <= INLINE_LIMIT or t.dtype not in DTYPE_TO_NUMPY:
        return False
    flat = np.asarray(array).reshape(-1)
    return not bool(np.all(flat == flat[0]))


def _dense(array: np.ndarray, t: TensorType) -> ir.Attribute:
    """A dense constant of ``array`` (any shape holding ``t.size`` values) converted to ``t``'s dtype: a
    splat when it holds one value."""
    if array.size == 1 or (array.size > INLINE_LIMIT and t.dtype in DTYPE_TO_NUMPY and not _external(array, t)):
        et = element_type(t.dtype)
        first = array.reshape(-1)[0]
        scalar = (ir.IntegerAttr.get(et, int(first)) if t.dtype in _INT_BITS
                  else ir.FloatAttr.get(et, float(first)))
        return ir.DenseElementsAttr.get_splat(tensor_type(t.shape, t.dtype), scalar)
    data = np.ascontiguousarray(array.astype(DTYPE_TO_NUMPY[t.dtype]).reshape(t.shape))
    return ir.DenseElementsAttr.get(data, type=element_type(t.dtype))


#: (operand dtype, product dtype) of convolutions emitted as contractions besides same-dtype f32/f64: bf16
#: operands accumulated in f32 (`pbsdk.ops.conv2d`'s accumulator) and the i8 x i8 -> i32 convolution of a
#: quantized model (`pbsdk.ops` `_quantized_conv2d`), whose contractions a matrix unit serves.
MIXED_CONTRACTIONS = frozenset({("bf16", "f32"), ("i8", "i32")})

#: An im2col of more taps than this whose patches do not overlap (stride = kernel, no dilation: a patch
#: embedding) is one transpose of the input (`Emitter.patchify`) rather than one copy per tap: bufferizing a
#: chain of one insert per tap grows faster than linearly in the taps (on a loaded 2-core host a 16x16 patch
#: embedding's 256 took 13 s, CLIP's 32x32 one's 1024 over 5 minutes). Up to this many taps the per-tap
#: copies stay: the cpu target reads them in place (implicit GEMM, `find_im2col`), which does not yet
#: recognise the transposed form — ViT-B/16's 16x16 patch embedding ran 35-36 ms a call that way and
#: 43-48 ms patchified (1 thread).
PATCHIFY_TAPS = 256

class _Emitter:
    """Builds the entry function ``func_name`` of one graph into ``module`` (at the context and location in
    effect): one op method per graph op, each building at the current insertion point and recording the
    ``ir.Value`` of its node's result."""

    def __init__(self, graph: Graph, module: ir.Module, func_name: str, fused: Sequence[Any] = (),
                 constants: list[np.ndarray] | None = None, options: Options | None = None,
                 spec: Any = None) -> None:
        self.graph = graph
        self.options = options or Options()
        self.spec = spec
        # Large constants become entry arguments (`constant`) when a list collects their arrays.
        self.constants = constants
        self.constant_values: dict[Any, ir.Value] = {}
        ftype = ir.FunctionType.get([tensor_type(v.shape, v.dtype) for v in graph.inputs],
                                    [tensor_type(v.shape, v.dtype) for v in graph.outputs])
        with ir.InsertionPoint(module.body):
            self.entry = func.FuncOp(func_name, ftype)
        self.entry.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()
        self.values: dict[int, ir.Value] = {}
        self.producers = {n.out.id: n for n in graph.nodes}
        # Fused attention (pbsdk.core.ir.attention): (match, plan) pairs; their nodes are not emitted
        # one by one, the kernel functions go before the entry function.
        self.fused = {m.out.id: (m, p) for m, p in fused}
        self.skipped = {i for m, _ in fused for i in m.covered}
        self.kernels = 0
        self.reassoc_math = ir.Attribute.parse("#arith.fastmath<reassoc>")

    # -- helpers --------------------------------------------------------------------------------------
    def value(self, v: Value) -> ir.Value:
        found = self.values.get(v.id)
        if found is None:
            # A constant is built where it is first used (`op_const`): one only read transposed (a
            # frozen nn.Linear weight, `row_major`) is then never an operand in its original layout.
            node = self.producers[v.id]
            found = self.values[v.id] = self.constant(np.asarray(node.attrs["value"]), v.type, v.id)
        return found

    def size(self, d: int | Dim) -> ir.Value:
        """Size ``d`` as an index value: a constant, or a `Dim` computed from the entry's symbol values."""
        if isinstance(d, int):
            return arith.ConstantOp(ir.IndexType.get(), d).result
        value: ir.Value | None = None
        for product, c in d.coeffs:  # a term: a symbol, or a product of symbols (``b*s``)
            term = None
            for sym in product.split("*"):
                factor = self.symbols.get(sym)
                if factor is None:
                    raise DynamicShapeError(f"size {d}: no input's shape binds {sym}")
                term = factor if term is None else arith.muli(term, factor)
            assert term is not None
            if c != 1:
                term = arith.muli(term, self.size(c))
            value = term if value is None else arith.addi(value, term)
        assert value is not None
        return arith.addi(value, self.size(d.const)) if d.const else value

    def float_size(self, d: int | Dim, t: ir.Type) -> ir.Value:
        """Size ``d`` as a float scalar of type ``t``."""
        i64 = ir.IntegerType.get_signless(64)
        return arith.sitofp(t, arith.index_cast(i64, self.size(d)))

    def op_size(self, node: Node) -> None:
        """A size known at run time as a 0-d tensor (`pbsdk.ops.size_value`)."""
        out = node.out
        value = self.float_size(node.attrs["dim"], element_type(out.dtype))
        self.values[out.id] = tensor.FromElementsOp(tensor_type((), out.dtype), [value]).result

    def op_iota(self, node: Node) -> None:
        """``0 .. n-1`` over a length known at run time (`pbsdk.ops.iota`)."""
        out = node.out
        ft = element_type(out.dtype)
        i64 = ir.IntegerType.get_signless(64)

        def body(args: Sequence[ir.Value]) -> ir.Value:
            return arith.sitofp(ft, arith.index_cast(i64, linalg.IndexOp(0).result))

        self.values[out.id] = self.generic(ins=[], init=self.empty(out.type), out_results=dims(1), n_loops=1,
                                           iterators=["parallel"], body=body)

    def mixed(self, sizes: Sequence[int | Dim]) -> tuple[list[ir.Value], list[int]]:
        """``sizes`` as an op's dynamic operands and static attribute (``?`` where dynamic)."""
        values = [self.size(d) for d in sizes if not isinstance(d, int)]
        return values, static_sizes(sizes)

    def empty(self, t: TensorType) -> ir.Value:
        return tensor.EmptyOp([d if isinstance(d, int) else self.size(d) for d in t.shape],
                              element_type(t.dtype)).result

    def constant(self, array: np.ndarray, t: TensorType, key: Any) -> ir.Value:
        """The constant ``array`` of type ``t`` (one value per ``key``): an ``arith.constant``, or, when it is
        `_external` and constants are collected, a new entry argument marked ``pbsdk.constant``."""
        found = self.constant_values.get(key)
        if found is not None:
            return found
        if self.constants is not None and _external(array, t):
            index = len(self.constants)
            self.constants.append(constant_data(array, t))
            value: ir.Value = self.entry.entry_block.add_argument(tensor_type(t.shape, t.dtype),
                                                                   ir.Location.unknown())
            self.constant_args.append(index)
        else:
            value = arith.ConstantOp(tensor_type(t.shape, t.dtype), _dense(np.asarray(array), t)).result
        self.constant_values[key] = value
        return value

    def filled(self, t: TensorType, value: float) -> ir.Value:
        init = self.empty(t)
        cst = scalar_constant(value, element_type(t.dtype))
        return fill(cst, init)

    def generic(self, *, ins: Sequence[tuple[ir.Value, list[ir.AffineExpr | int]]],
                init: ir.Value, out_results: Sequence[ir.AffineExpr], n_loops: int, iterators: Sequence[str],
                body: Callable[[Sequence[ir.Value]], ir.Value]) -> ir.Value:
        """A linalg.generic over ``n_loops`` loops; ``body`` gets the block arguments (inputs, then the
        accumulator) and returns the value to yield."""
        return generic([(v, affine_map(n_loops, r)) for v, r in ins], init, affine_map(n_loops, out_results),
                       iterators, body)

    # -- ops ------------------------------------------------------------------------------------------
    def run(self) -> None:
        g = self.graph
        block = self.entry.add_entry_block()
        for v, arg in zip(g.inputs, block.arguments):
            self.values[v.id] = arg
        self.constant_args: list[int] = []
        with ir.InsertionPoint(block):
            self.bind_symbols(block)
            for node in g.live_nodes():
                if node.out.id in self.fused:
                    self.op_attention(*self.fused[node.out.id])
                elif node.op != "input" and node.out.id not in self.skipped:
                    getattr(self, "op_" + _method(node.op))(node)
            func.ReturnOp([self.value(v) for v in g.outputs])
        if self.constant_args:
            # The constant operands were appended to the block as they were met: the function takes them
            # after the inputs, read-only (bufferization copies before writing into one).
            match_signature(self.entry.operation)
            n_inputs = len(g.inputs)
            read_only = {"bufferization.writable": ir.BoolAttr.get(False)}
            for i, index in enumerate(self.constant_args):
                attributes.set_arg_i64(self.entry, n_inputs + i, attributes.CONSTANT, index, also=read_only)

    def bind_symbols(self, block: ir.Block) -> None:
        """``self.symbols``: each size symbol of the inputs' shapes, read (``tensor.dim``) from the first
        input dimension that is that symbol alone, or else solved from one that is the symbol plus a
        constant (a cache of ``s0 + 1`` keys)."""
        self.symbols: dict[str, ir.Value] = {}
        for solve in (False, True):
            for v, arg in zip(self.graph.inputs, block.arguments):
                for i, d in enumerate(v.shape):
                    if not isinstance(d, Dim) or len(d.coeffs) != 1 or d.coeffs[0][1] != 1 or not d.linear:
                        continue
                    sym = d.coeffs[0][0]
                    if sym in self.symbols or (d.const and not solve):
                        continue
                    size = tensor.DimOp(arg, self.size(i)).result
                    self.symbols[sym] = arith.subi(size, self.size(d.const)) if d.const else size

    def op_attention(self, match: Any, plan: Any) -> None:
        """A fused attention: a call of ``@__pbsdk_attnN(Q, K, V[, M], O)`` on the operands' buffers.

        ``"scratchpad"`` plans: the kernel of `pbsdk.core.ir.attention_tiles`, in the target-neutral
        tiled form. ``"lanes"`` plans: a private declaration only, carrying the plan's ``pbsdk.attention``
        descriptor — the kernel of a cache hierarchy is the target's to build (the cpu target's
        ``attention`` stage, `pbsdk.targets.cpu.attention_kernel`), so nothing in the core writes it."""
        from pbsdk.core.ir.attention_tiles import KernelOperands, build_tiles_kernel

        name = f"__pbsdk_attn{self.kernels}"
        self.kernels += 1
        bases = [match.q.base, match.k.base, match.v.base] + ([match.mask.base] if match.mask else [])
        ops = KernelOperands(q=match.q, k=match.k, v=match.v, mask=match.mask, q_shape=bases[0].shape,
                             k_shape=bases[1].shape, v_shape=bases[2].shape,
                             mask_shape=bases[3].shape if match.mask else None, out_shape=match.out.shape,
                             scale=match.scale, mask_scale=match.mask_scale, dtype=match.out.dtype)
        # The kernel (or its declaration) goes in front of the entry function, then is called from it.
        if plan.schedule == "scratchpad":
            build_tiles_kernel(ir.InsertionPoint(self.entry), name, plan, ops)
        else:
            _declare_lanes_kernel(ir.InsertionPoint(self.entry), name, plan, ops)
        buffers = [bufferization.ToBufferOp(_memref(b.type), self.value(b), read_only=True).result for b in bases]
        out_ty = _memref(match.out.type)
        out = memref.AllocOp(out_ty, [], [], alignment=ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 64))
        func.CallOp([], ir.FlatSymbolRefAttr.get(name), [*buffers, out.result])
        self.values[match.out.id] = bufferization.ToTensorOp(tensor_type(match.out.shape, match.out.dtype),
                                                             out.result, restrict=True, writable=True).result

    def op_const(self, node: Node) -> None:
        """Nothing here: `value` builds a constant at its first use."""

    def op_elementwise(self, node: Node) -> None:
        out = node.out
        rank = len(out.shape)
        loops = dims(rank)
        cdt = _compute_dtype(out.dtype)
        ct = element_type(cdt)
        ins = [(self.value(v), _broadcast_results(v.shape, out.shape, loops)) for v in node.inputs]

        def body(args: Sequence[ir.Value]) -> ir.Value:
            operands = [_convert(a, v.dtype, cdt) for a, v in zip(args, node.inputs)]
            if cdt in _INT_BITS and node.op in _INT_SIMPLE:
                return _INT_SIMPLE[node.op](*operands)
            y = _scalar_body(node, operands, ct)  # None for cast/broadcast: the (converted) operand itself
            return _convert(operands[0] if y is None else y, cdt, out.dtype)

        self.values[out.id] = self.generic(ins=ins, init=self.empty(out.type), out_results=loops,
                                           n_loops=rank, iterators=["parallel"] * rank, body=body)

    op_cast = op_elementwise
    op_broadcast = op_elementwise

    def op_reduce(self, node: Node) -> None:
        (x,) = node.inputs
        axes = node.attrs["axes"]
        out = node.out
        rank = len(x.shape)
        loops = dims(rank)
        kind = node.op.removeprefix("reduce_")
        init_value = {"sum": 0.0, "max": -math.inf, "min": math.inf, "prod": 1.0}[kind]
        init = self.filled(out.type, init_value)
        combine = {"sum": arith.addf, "max": arith.maximumf, "min": arith.minimumf, "prod": arith.mulf}[kind]
        if kind == "max" and node.group in ("softmax", "log_softmax"):
            # The shift of a softmax may skip NaN (maxnumf: a plain vmaxps, where maximumf blends NaN back
            # in): a NaN element still makes its row's sum, so the whole row, NaN, as with maximumf.
            combine = arith.maxnumf

        def body(args: Sequence[ir.Value]) -> ir.Value:
            # reassoc: the order of a reduction is not part of its meaning (tolerances scale with its length),
            # and without it LLVM cannot vectorise the loop.
            return combine(_convert(args[0], x.dtype, out.dtype), args[1], fastmath=self.reassoc_math)

        kept = [d for i, d in enumerate(loops) if i not in axes]
        self.values[out.id] = self.generic(
            ins=[(self.value(x), list(loops))], init=init, out_results=kept, n_loops=rank,
            iterators=["reduction" if i in axes else "parallel" for i in range(rank)], body=body)

    def op_grouped_matmul(self, node: Node) -> None:
        # One matmul per group, on the group's rows: ``x[start:end]`` (a row count known at run time, copied
        # whole so the product reads a fresh row-major buffer), times the group's weight, inserted at the
        # group's rows of a zero-filled result. The ends are read from the data and clamped to [start, R].
        x, ends, *weights = node.inputs
        out = node.out
        rows, k = x.shape
        n = out.shape[1]
        index = ir.IndexType.get()
        dyn = ir.ShapedType.get_dynamic_size()
        xv, ev = self.value(x), self.value(ends)
        acc = self.filled(out.type, 0.0)
        start = arith.constant(index, 0)
        last = arith.constant(index, rows)
        for e, w in enumerate(weights):
            raw = tensor.ExtractOp(ev, [arith.constant(index, e)]).result
            end = arith.minsi(arith.maxsi(_clipped_index(raw, float_constant(float(rows), raw.type)), start), last)
            m = arith.subi(end, start)
            part = tensor.ExtractSliceOp(tensor_type((dyn, k), x.dtype), xv, [start], [m], [], [dyn, 0],
                                         [dyn, k], [1, 1]).result
            rows_e = linalg.copy(part, outs=[tensor.EmptyOp([m, k], element_type(x.dtype)).result])
            init = fill(scalar_constant(0.0, element_type(out.dtype)),
                        tensor.EmptyOp([m, n], element_type(out.dtype)).result)
            product = linalg.matmul(rows_e, self.value(w), outs=[init])
            acc = tensor.InsertSliceOp(product, acc, [start], [m], [], [dyn, 0], [dyn, n], [1, 1]).result
            start = end
        self.values[out.id] = acc

    def op_put_slices(self, node: Node) -> None:
        # A loop over the indices carrying the result: slice j of the values, inserted at position idx[j]
        # along the axis where 0 <= idx[j] < n (an scf.if keeps the tensor otherwise).
        x, idx, values = node.inputs
        axis, rank, n = node.attrs["axis"], len(x.shape), x.shape[node.attrs["axis"]]
        index = ir.IndexType.get()
        dyn = ir.ShapedType.get_dynamic_size()
        ft = element_type(idx.dtype)
        row_shape = tuple(1 if d == axis else s for d, s in enumerate(x.shape))
        row_t = tensor_type(row_shape, x.dtype)
        xv, iv, vv = self.value(x), self.value(idx), self.value(values)
        offsets = [dyn if d == axis else 0 for d in range(rank)]
        ones = [1] * rank
        loop_op = scf.ForOp(arith.constant(index, 0), self.size(idx.shape[0]), arith.constant(index, 1), [xv])
        with ir.InsertionPoint(loop_op.body):
            j, acc = loop_op.induction_variable, loop_op.inner_iter_args[0]
            raw = tensor.ExtractOp(iv, [j]).result
            inside = arith.andi(arith.cmpf(arith.CmpFPredicate.OGE, raw, float_constant(0.0, ft)),
                                arith.cmpf(arith.CmpFPredicate.OLT, raw, float_constant(float(n), ft)))
            row = tensor.ExtractSliceOp(row_t, vv, [j], [], [], offsets, list(row_shape), ones).result
            write = scf.IfOp(inside, [acc.type], has_else=True)
            with ir.InsertionPoint(write.then_block):
                pos = _clipped_index(raw, float_constant(float(n - 1), ft))
                scf.YieldOp([tensor.InsertSliceOp(row, acc, [pos], [], [], offsets, list(row_shape), ones).result])
            with ir.InsertionPoint(write.else_block):
                scf.YieldOp([acc])
            scf.YieldOp([write.results[0]])
        self.values[node.out.id] = loop_op.results[0]

    def op_matmul(self, node: Node) -> None:
        a, b = node.inputs
        out = node.out
        ta, tb = node.attrs["transpose_a"], node.attrs["transpose_b"]
        nb = len(out.shape) - 2
        same_batch = a.shape[:-2] == b.shape[:-2] == out.shape[:-2]
        if same_batch:
            # Named ops on row-major operands, which the packed kernels take: a transposed constant
            # (a frozen nn.Linear weight) is transposed here, once; any other transposed operand is
            # materialised by a linalg.transpose (O(size) next to the O(m*n*k) contraction); batch
            # dimensions beyond one are collapsed into one (a view).
            an, at = self.row_major(a, ta)
            bn, bt = self.row_major(b, tb)
            if nb > 1:
                lead = math.prod(out.shape[:-2])
                groups = [list(range(nb))] + [[nb], [nb + 1]]
                an, at = self.collapse(an, at, TensorType((lead, *at.shape[-2:]), at.dtype), groups), \
                    TensorType((lead, *at.shape[-2:]), at.dtype)
                bn, bt = self.collapse(bn, bt, TensorType((lead, *bt.shape[-2:]), bt.dtype), groups), \
                    TensorType((lead, *bt.shape[-2:]), bt.dtype)
            ot = TensorType((math.prod(out.shape[:-2]), *out.shape[-2:]), out.dtype) if nb > 1 else out.type
            init = self.filled(ot, 0.0)
            mm = (linalg.matmul if nb == 0 else linalg.batch_matmul)(an, bn, outs=[init])
            if nb > 1:
                mm = self.expand(mm, ot, out.type, [list(range(nb))] + [[nb], [nb + 1]])
            self.values[out.id] = mm
            return
        if nb >= 1 and not ta and len(b.shape) == 2 and a.shape[:-2] == out.shape[:-2]:
            # (batch..., m, k) @ (k, n): one (batch*m, k) @ (k, n) matmul on views (x @ W in a model).
            rows = math.prod(a.shape[:-1])
            groups = [list(range(nb + 1)), [nb + 1]]
            an = self.collapse(self.value(a), a.type, TensorType((rows, a.shape[-1]), a.dtype), groups)
            bn, _ = self.row_major(b, tb)
            ot = TensorType((rows, out.shape[-1]), out.dtype)
            init = self.filled(ot, 0.0)
            self.values[out.id] = self.expand(linalg.matmul(an, bn, outs=[init]), ot, out.type, groups)
            return
        # General case: loops (batch..., m, n, k); operands broadcast over batch and read transposed.
        loops = dims(nb + 3)
        batch, m, n, k = loops[:nb], loops[nb], loops[nb + 1], loops[nb + 2]

        def operand_map(v: Value, rows: ir.AffineExpr, cols: ir.AffineExpr,
                        transposed: bool) -> list[ir.AffineExpr | int]:
            vb = v.shape[:-2]
            lead = _broadcast_results(vb, out.shape[:-2], batch) if vb else []
            return lead + ([cols, rows] if transposed else [rows, cols])

        ins = [(self.value(a), operand_map(a, m, k, ta)), (self.value(b), operand_map(b, k, n, tb))]
        self.values[out.id] = self.generic(
            ins=ins, init=self.filled(out.type, 0.0), out_results=[*batch, m, n], n_loops=nb + 3,
            iterators=["parallel"] * (nb + 2) + ["reduction"], body=_mac_body(a.dtype, b.dtype, out.dtype))

    def row_major(self, v: Value, transposed: bool) -> tuple[ir.Value, TensorType]:
        """``v``, or its last two axes swapped when ``transposed``: a folded constant where ``v`` is one."""
        if not transposed:
            return self.value(v), v.type
        shape = (*v.shape[:-2], v.shape[-1], v.shape[-2])
        t = TensorType(shape, v.dtype)
        src = self.producers.get(v.id)
        if src is not None and src.op == "const" and np.asarray(src.attrs["value"]).shape == v.shape:
            value = np.swapaxes(np.asarray(src.attrs["value"]), -1, -2)
            return self.constant(value, t, (v.id, "transposed")), t
        perm = [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]
        return linalg.transpose(self.value(v), outs=[self.empty(t)], permutation=perm).results[0], t

    def op_conv2d(self, node: Node) -> None:
        x, w = node.inputs
        out = node.out
        (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
        (pt, pb), (pl, pr) = node.attrs["padding"]
        groups, nhwc = node.attrs["groups"], node.attrs["layout"] == "NHWC"
        xv = self.value(x)
        xt = x.type
        as_matmul = groups == 1 and packed_dtypes(x.dtype, w.dtype, out.dtype)
        depthwise = self._depthwise_channels_last(node)
        direct = not depthwise and direct_conv(node, self.spec, self.options)
        if (depthwise or direct) and not nhwc:
            # Channels last (see _depthwise_channels_last, direct_conv); the transposes fuse with the ops around
            # it. The transpose writes into the interior of the zero-filled padded tensor (in place once
            # bufferized: no second pass copies it there, as a tensor.pad would).
            xt = TensorType((xt.shape[0], xt.shape[2], xt.shape[3], xt.shape[1]), xt.dtype)
            padded = TensorType((xt.shape[0], xt.shape[1] + pt + pb, xt.shape[2] + pl + pr, xt.shape[3]), xt.dtype)
            lo, sizes, ones = [0, pt, pl, 0], list(xt.shape), [1] * 4
            init = self.filled(padded, node.attrs.get("pad_value", 0.0))
            interior = tensor.ExtractSliceOp(tensor_type(xt.shape, xt.dtype), init, [], [], [], lo, sizes,
                                             ones).result
            xv = self.permuted(xv, xt, [0, 3, 1, 2], init=interior)
            xv = tensor.InsertSliceOp(xv, init, [], [], [], lo, sizes, ones).result
            xt, nhwc = padded, True
            pt = pb = pl = pr = 0
        as_matmul = as_matmul and not direct
        grouped = not as_matmul and not depthwise and not direct and grouped_as_batch(node, self.spec, self.options)
        if ((grouped or direct) and not nhwc) or (as_matmul and not nhwc and conv_in_nhwc(
                node, self.spec, self.options, weights_constant=self._is_const(w))):
            # Run in NHWC (see _conv2d_as_matmul): transposed before padding, as a generic, so the transpose
            # fuses with the elementwise ops that produce the input.
            xt = TensorType((xt.shape[0], xt.shape[2], xt.shape[3], xt.shape[1]), xt.dtype)
            xv = self.permuted(xv, xt, [0, 3, 1, 2])
            nhwc = True
        if pt or pb or pl or pr:
            # Padding as a tensor.pad on the spatial dims: zeros, or a quantized input's zero point (attribute
            # ``pad_value``: a real 0 in its integer representation).
            lo = [0, 0, pt, pl] if not nhwc else [0, pt, pl, 0]
            hi = [0, 0, pb, pr] if not nhwc else [0, pb, pr, 0]
            padded = TensorType(tuple(d + lo[i] + hi[i] for i, d in enumerate(xt.shape)), xt.dtype)
            into = self._into_interior(xv, xt, padded, lo, node.attrs.get("pad_value", 0.0)) \
                if depthwise or direct else None
            if into is not None:
                xv = into
            else:
                zero = scalar_constant(node.attrs.get("pad_value", 0), element_type(xt.dtype))
                pad = tensor.PadOp(tensor_type(padded.shape, padded.dtype), xv, [], [], lo, hi)
                with ir.InsertionPoint(pad.regions[0].blocks.append(*[ir.IndexType.get()] * 4)):
                    tensor.YieldOp(zero)
                xv = pad.result
            xt = padded
        if as_matmul:
            self._conv2d_as_matmul(node, xv, xt, transposed=nhwc and node.attrs["layout"] != "NHWC")
            return
        if grouped:
            self._grouped_conv_as_batch(node, xv, xt)
            return
        if depthwise:
            self._depthwise_nhwc(node, xv, xt)
            return
        if direct:
            self._direct_nhwc(node, xv, xt)
            return
        # Split channels into (groups, channels per group) so every map is a plain affine sum.
        d = dims(8)
        if nhwc:
            n_, h_, w_, _ = xt.shape
            kh, kw, cg, o = w.shape
            og = o // groups
            xg = TensorType((n_, h_, w_, groups, cg), xt.dtype)
            wg = TensorType((kh, kw, cg, groups, og), w.dtype)
            og_t = TensorType((n_, out.shape[1], out.shape[2], groups, og), out.dtype)
            xv = self.expand(xv, xt, xg, [[0], [1], [2], [3, 4]])
            wv = self.expand(self.value(w), w.type, wg, [[0], [1], [2], [3, 4]])
            # loops: n oh ow g og kh kw c
            ins: list[tuple[ir.Value, list[ir.AffineExpr | int]]] = [
                (xv, [d[0], d[1] * sh + d[5] * dh, d[2] * sw + d[6] * dw, d[3], d[7]]),
                (wv, [d[5], d[6], d[7], d[3], d[4]])]
            reassoc = [[0], [1], [2], [3, 4]]
        else:
            n_, _, h_, w_ = xt.shape
            o, cg, kh, kw = w.shape
            og = o // groups
            xg = TensorType((n_, groups, cg, h_, w_), xt.dtype)
            wg = TensorType((groups, og, cg, kh, kw), w.dtype)
            og_t = TensorType((n_, groups, og, out.shape[2], out.shape[3]), out.dtype)
            xv = self.expand(xv, xt, xg, [[0], [1, 2], [3], [4]])
            wv = self.expand(self.value(w), w.type, wg, [[0, 1], [2], [3], [4]])
            # loops: n g og oh ow c kh kw
            ins = [(xv, [d[0], d[1], d[5], d[3] * sh + d[6] * dh, d[4] * sw + d[7] * dw]),
                   (wv, [d[1], d[2], d[5], d[6], d[7]])]
            reassoc = [[0], [1, 2], [3], [4]]
        grouped = self.generic(ins=ins, init=self.filled(og_t, 0.0), out_results=d[:5], n_loops=8,
                               iterators=["parallel"] * 5 + ["reduction"] * 3,
                               body=_mac_body(x.dtype, w.dtype, out.dtype))
        self.values[out.id] = tensor.CollapseShapeOp(tensor_type(out.shape, out.dtype), grouped,
                                                     reassociation(reassoc)).result

    def _conv2d_as_matmul(self, node: Node, xv: ir.Value, xt: TensorType, transposed: bool = False) -> None:
        """An ungrouped conv2d as one contraction: the (padded) input's patches gathered into a column
        matrix (im2col; skipped for 1x1 stride-1 kernels, where the input already is that matrix), times
        the weights viewed as a matrix. The contraction then gets the planner's packed kernel.

        An NCHW convolution that needs patches may run in NHWC (``transposed``: op_conv2d has transposed the
        input, see `conv_in_nhwc`): the weights go to (KH, KW, C, O) (at compile time when they are a
        constant), and the result back. Its patches are then runs of contiguous channels, which a target can read in
        place (the cpu target's implicit GEMM) instead of copying, and a batch is one contraction."""
        _, w = node.inputs
        out = node.out
        (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
        dt, odt = w.dtype, out.dtype  # operands, and the product (its accumulator: bf16 -> f32)
        pointwise = sh == sw == 1 and w.shape[-1] == w.shape[-2] == 1
        if node.attrs["layout"] == "NHWC":
            self.values[out.id] = self._nhwc_conv_matmul(xv, xt, self.value(w), w.shape, out.shape, (sh, sw),
                                                         (dh, dw), dt, odt)
            return
        if transposed:
            # op_conv2d transposed the (then padded) input to NHWC: weights to (KH, KW, C, O), at compile
            # time when they are a constant; the result back to NCHW as a generic (it fuses with what follows).
            n_, _, _, c_ = xt.shape
            o, _, kh, kw = w.shape
            _, _, oh, ow = out.shape
            w_hwco = TensorType((kh, kw, c_, o), dt)
            wv = self.folded(w, w_hwco, "hwco", lambda a: a.transpose(2, 3, 1, 0))
            if wv is None:
                wv = self.permuted(self.value(w), w_hwco, [3, 2, 0, 1])
            y = self._nhwc_conv_matmul(xv, xt, wv, w_hwco.shape, (n_, oh, ow, o), (sh, sw), (dh, dw), dt, odt)
            self.values[out.id] = self.permuted(y, out.type, [0, 2, 3, 1])
            return
        n_, c_, _hp, _wp = xt.shape
        o, _, kh, kw = w.shape
        _, _, oh, ow = out.shape
        depth, pixels = c_ * kh * kw, oh * ow
        cols_t = TensorType((n_, depth, pixels), dt)
        if pointwise and pixels == 1:
            # A 1x1 convolution of a 1x1 image (a squeeze-excite's fully connected layers) is a linear layer:
            # (N, C) @ (C, O), the weights transposed once (at compile time when constant), so that the
            # contraction's rows are the batch rather than an image's single pixel.
            xm_t, wt_t, mm_t = TensorType((n_, c_), dt), TensorType((c_, o), dt), TensorType((n_, o), odt)
            xm = self.collapse(xv, xt, xm_t, [[0], [1, 2, 3]])
            wt = self.folded(w, wt_t, "co", lambda a: a.reshape(o, c_).T)
            if wt is None:
                wm = self.collapse(self.value(w), w.type, TensorType((o, c_), dt), [[0], [1, 2, 3]])
                wt = linalg.transpose(wm, outs=[self.empty(wt_t)], permutation=[1, 0]).results[0]
            mm = linalg.matmul(xm, wt, outs=[self.filled(mm_t, 0.0)])
            self.values[out.id] = self.expand(mm, mm_t, out.type, [[0], [1, 2, 3]])
            return
        if pointwise:
            cols = self.collapse(xv, xt, cols_t, [[0], [1], [2, 3]])
        else:
            patches_t = TensorType((n_, c_, kh, kw, oh, ow), dt)
            if kh * kw > PATCHIFY_TAPS and (sh, sw, dh, dw) == (kh, kw, 1, 1):
                patches = self.patchify(xv, xt, patches_t, "NCHW")
            else:
                patches = self.patches(xv, xt, patches_t, kh, kw, lambda i, j: (
                    [0, 0, i * dh, j * dw], [n_, c_, oh, ow], [1, 1, sh, sw],
                    [0, 0, i, j, 0, 0], [n_, c_, 1, 1, oh, ow]))
            cols = self.collapse(patches, patches_t, cols_t, [[0], [1, 2, 3], [4, 5]])
        wmat_t = TensorType((o, depth), dt)
        wmat = self.collapse(self.value(w), w.type, wmat_t, [[0], [1, 2, 3]])
        if n_ == 1:
            cols2 = self.collapse(cols, cols_t, TensorType((depth, pixels), dt), [[0, 1], [2]])
            mm_t = TensorType((o, pixels), odt)
            init = self.filled(mm_t, 0.0)
            mm = linalg.matmul(wmat, cols2, outs=[init])
            self.values[out.id] = self.expand(mm, mm_t, out.type, [[0, 1], [2, 3]])
            return
        wb = linalg.broadcast(wmat, outs=[self.empty(TensorType((n_, o, depth), dt))], dimensions=[0]).results[0]
        mm_t = TensorType((n_, o, pixels), odt)
        init = self.filled(mm_t, 0.0)
        mm = linalg.batch_matmul(wb, cols, outs=[init])
        self.values[out.id] = self.expand(mm, mm_t, out.type, [[0], [1], [2, 3]])

    def _grouped_conv_as_batch(self, node: Node, xv: ir.Value, xt: TensorType) -> None:
        """A grouped convolution over the (padded) NHWC input ``xv`` as one batched contraction, a batch
        entry per group: its patches (one strided slice per tap, as `_nhwc_conv_matmul`) rearranged to
        (groups, pixels, taps x channels of the group), times the weights as (groups, taps x channels,
        outputs of the group) — at compile time when constant —; the (groups, pixels, outputs) result back
        to the node's layout (a generic that fuses with what follows). The target then runs it on its
        packed kernels (a matrix unit's included) instead of an eight-loop nest."""
        _, w = node.inputs
        out = node.out
        (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
        groups, given_nhwc = node.attrs["groups"], node.attrs["layout"] == "NHWC"
        dt, odt = w.dtype, out.dtype
        n_, _, _, c_ = xt.shape
        kh, kw, cg, o = w.shape if given_nhwc else (w.shape[2], w.shape[3], w.shape[1], w.shape[0])
        oh, ow = out.shape[1:3] if given_nhwc else out.shape[2:4]
        og, rows, depth = o // groups, n_ * oh * ow, kh * kw * cg
        patches_t = TensorType((n_, oh, ow, kh, kw, c_), dt)
        patches = self.patches(xv, xt, patches_t, kh, kw, lambda i, j: (
            [0, i * dh, j * dw, 0], [n_, oh, ow, c_], [1, sh, sw, 1],
            [0, 0, 0, i, j, 0], [n_, oh, ow, 1, 1, c_]))
        split_t = TensorType((n_, oh, ow, kh, kw, groups, cg), dt)
        split = self.expand(patches, patches_t, split_t, [[0], [1], [2], [3], [4], [5, 6]])
        by_group_t = TensorType((groups, n_, oh, ow, kh, kw, cg), dt)
        by_group = linalg.transpose(split, outs=[self.empty(by_group_t)], permutation=[5, 0, 1, 2, 3, 4, 6]).results[0]
        cols = self.collapse(by_group, by_group_t, TensorType((groups, rows, depth), dt), [[0], [1, 2, 3], [4, 5, 6]])
        wmat_t = TensorType((groups, depth, og), dt)
        if given_nhwc:  # (KH, KW, CG, G*OG) -> (G, KH, KW, CG, OG)
            split_w_t, perm = TensorType((kh, kw, cg, groups, og), dt), [3, 0, 1, 2, 4]
            reassoc = [[0], [1], [2], [3, 4]]
        else:  # (G*OG, CG, KH, KW) -> (G, KH, KW, CG, OG)
            split_w_t, perm = TensorType((groups, og, cg, kh, kw), dt), [0, 3, 4, 2, 1]
            reassoc = [[0, 1], [2], [3], [4]]
        wmat = self.folded(w, wmat_t, "g-hwc-o",
                           lambda a: a.reshape(split_w_t.shape).transpose(perm).reshape(groups, depth, og))
        if wmat is None:
            wg_t = TensorType((groups, kh, kw, cg, og), dt)
            split_w = self.expand(self.value(w), w.type, split_w_t, reassoc)
            wg = linalg.transpose(split_w, outs=[self.empty(wg_t)], permutation=perm).results[0]
            wmat = self.collapse(wg, wg_t, wmat_t, [[0], [1, 2, 3], [4]])
        mm_t = TensorType((groups, rows, og), odt)
        mm = linalg.batch_matmul(cols, wmat, outs=[self.filled(mm_t, 0.0)])
        y_t = TensorType((groups, n_, oh, ow, og), odt)
        y = self.expand(mm, mm_t, y_t, [[0], [1, 2, 3], [4]])
        if given_nhwc:
            t = TensorType((n_, oh, ow, groups, og), odt)
            self.values[out.id] = self.collapse(self.permuted(y, t, [3, 0, 1, 2, 4]), t, out.type, [[0], [1], [2], [3, 4]])
        else:
            t = TensorType((n_, groups, og, oh, ow), odt)
            self.values[out.id] = self.collapse(self.permuted(y, t, [1, 0, 3, 4, 2]), t, out.type, [[0], [1, 2], [3], [4]])

    def _depthwise_channels_last(self, node: Node) -> bool:
        """Whether this convolution is depthwise and runs channels last (`depthwise_channels_last`)."""
        return depthwise_channels_last(node, self.spec, self.options)

    def _depthwise_nhwc(self, node: Node, xv: ir.Value, xt: TensorType) -> None:
        """A depthwise convolution over the (padded) NHWC input ``xv`` as one ``linalg.generic`` whose loops
        are ordered (n, oh, ow, kh, kw, c): the channel loop, parallel, innermost, so that the loops the
        target builds vectorise over channels (input, weights and output are contiguous along it). Weights
        go to (KH, KW, C) — at compile time when they are a constant —; an NCHW result is transposed back
        (a generic that fuses with what follows)."""
        _, w = node.inputs
        out = node.out
        (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
        given_nhwc = node.attrs["layout"] == "NHWC"
        n_, _, _, c_ = xt.shape
        kh, kw = w.shape[:2] if given_nhwc else w.shape[2:4]
        oh, ow = out.shape[1:3] if given_nhwc else out.shape[2:4]
        w_t = TensorType((kh, kw, c_), w.dtype)
        if given_nhwc:  # (KH, KW, 1, C): a view
            wv = self.collapse(self.value(w), w.type, w_t, [[0], [1], [2, 3]])
        elif (folded := self.folded(w, w_t, "hwc", lambda a: a.reshape(c_, kh, kw).transpose(1, 2, 0))) is not None:
            wv = folded
        else:  # (C, 1, KH, KW) -> (KH, KW, 1, C): a named transpose, which elementwise fusion leaves alone
            t4 = TensorType((kh, kw, 1, c_), w.dtype)
            wt = linalg.transpose(self.value(w), outs=[self.empty(t4)], permutation=[2, 3, 1, 0]).results[0]
            wv = self.collapse(wt, t4, w_t, [[0], [1], [2, 3]])
        y_t = TensorType((n_, oh, ow, c_), out.dtype)
        d = dims(6)  # loops: n oh ow kh kw c
        y = self.generic(ins=[(xv, [d[0], d[1] * sh + d[3] * dh, d[2] * sw + d[4] * dw, d[5]]),
                              (wv, [d[3], d[4], d[5]])],
                         init=self.filled(y_t, 0.0), out_results=[d[0], d[1], d[2], d[5]], n_loops=6,
                         iterators=["parallel"] * 3 + ["reduction"] * 2 + ["parallel"],
                         body=_mac_body(xt.dtype, w.dtype, out.dtype))
        self.values[out.id] = y if given_nhwc else self.permuted(y, out.type, [0, 2, 3, 1])

    def _into_interior(self, xv: ir.Value, xt: TensorType, padded: TensorType, lo: Sequence[int],
                       value: float) -> ir.Value | None:
        """``xv`` padded to ``padded`` with ``value`` by having the elementwise op that makes it write straight
        into the interior of a tensor filled with ``value`` (in place once bufferized: no second pass copies
        it there, as a tensor.pad would) — a layout transpose in front of a channels-last convolution, which
        `pbsdk.core.ir.layout` adds; None when ``xv`` is not the one result of a parallel ``linalg.generic``
        writing every element of a fresh ``tensor.empty`` without reading it."""
        from pbsdk.core.passes import defining_op

        op = defining_op(xv)
        if op is None or op.name != "linalg.generic" or len(op.results) != 1:
            return None
        src = defining_op(op.operands[len(op.operands) - 1])
        body = op.regions[0].blocks[0]
        maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
        parallel = all("parallel" in str(i) for i in ir.ArrayAttr(op.attributes["iterator_types"]))
        # Every element written, none read: the result is the same whatever tensor it is written into (other
        # users of it, emitted later, still read the same values).
        if (src is None or src.name != "tensor.empty" or not parallel or not maps[-1].is_permutation
                or list(body.arguments[len(body.arguments) - 1].uses)):
            return None
        sizes, ones = list(xt.shape), [1] * len(xt.shape)
        with ir.InsertionPoint(op):
            filled = self.filled(padded, value)
            interior = tensor.ExtractSliceOp(tensor_type(xt.shape, xt.dtype), filled, [], [], [], list(lo), sizes,
                                             ones).result
        op.operands[len(op.operands) - 1] = interior
        return tensor.InsertSliceOp(xv, filled, [], [], [], list(lo), sizes, ones).result

    def _direct_nhwc(self, node: Node, xv: ir.Value, xt: TensorType) -> None:
        """A convolution the planner runs as a direct kernel (`direct_conv`) over the (padded) NHWC input
        ``xv``: one ``linalg.generic`` with loops (n, oh, ow, g, o, kh, kw, c) over the input viewed as (N, Hp,
        Wp, G, CG), the weights as (KH, KW, CG, G, OG) — from (O, CG, KH, KW) at compile time when they are a
        constant — and the output as (N, OH, OW, G, OG), which the cpu target's ``direct-conv`` stage
        recognises (`pbsdk.core.plan.direct_conv.direct_conv_geometry`); an NCHW result is transposed back (a
        generic that fuses with what follows)."""
        x, w = node.inputs
        out = node.out
        (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
        groups, given_nhwc = node.attrs["groups"], node.attrs["layout"] == "NHWC"
        n_, h_, w_, _ = xt.shape
        kh, kw, cg, o = w.shape if given_nhwc else (w.shape[2], w.shape[3], w.shape[1], w.shape[0])
        oh, ow = out.shape[1:3] if given_nhwc else out.shape[2:4]
        og = o // groups
        w_t = TensorType((kh, kw, cg, o), w.dtype)
        if given_nhwc:
            wv = self.value(w)
        elif (folded := self.folded(w, w_t, "hwco", lambda a: a.transpose(2, 3, 1, 0))) is not None:
            wv = folded
        else:
            wv = self.permuted(self.value(w), w_t, [3, 2, 0, 1])
        xg = TensorType((n_, h_, w_, groups, cg), xt.dtype)
        wg = TensorType((kh, kw, cg, groups, og), w.dtype)
        y5_t = TensorType((n_, oh, ow, groups, og), out.dtype)
        d = dims(8)  # loops: n oh ow g og kh kw c
        y5 = self.generic(ins=[(self.expand(xv, xt, xg, [[0], [1], [2], [3, 4]]),
                                [d[0], d[1] * sh + d[5] * dh, d[2] * sw + d[6] * dw, d[3], d[7]]),
                               (self.expand(wv, w_t, wg, [[0], [1], [2], [3, 4]]), [d[5], d[6], d[7], d[3], d[4]])],
                          init=self.filled(y5_t, 0.0), out_results=d[:5], n_loops=8,
                          iterators=["parallel"] * 5 + ["reduction"] * 3, body=_mac_body(x.dtype, w.dtype, out.dtype))
        y_t = TensorType((n_, oh, ow, o), out.dtype)
        y = self.collapse(y5, y5_t, y_t, [[0], [1], [2], [3, 4]])
        self.values[out.id] = y if given_nhwc else self.permuted(y, out.type, [0, 2, 3, 1])

    def _is_const(self, v: Value) -> bool:
        """Whether ``v`` is a graph constant not yet built (it can still be emitted in another layout)."""
        src = self.producers.get(v.id)
        return src is not None and src.op == "const" and v.id not in self.values

    def folded(self, v: Value, t: TensorType, key: str, layout: Callable[[np.ndarray], np.ndarray]) -> ir.Value | None:
        """``v`` in another layout, type ``t``, made at compile time when `_is_const` (``layout`` rearranges
        its array; one constant per ``key``); None when it has to be rearranged at run time."""
        if not self._is_const(v):
            return None
        return self.constant(np.ascontiguousarray(layout(np.asarray(self.producers[v.id].attrs["value"]))), t,
                             (v.id, key))

    def permuted(self, v: ir.Value, t: TensorType, source: Sequence[int], init: ir.Value | None = None) -> ir.Value:
        """``v`` rearranged into type ``t``: ``out[d0, ..] = v[d[source[0]], d[source[1]], ..]`` (input dimension
        ``j`` is indexed by output loop ``source[j]``), as an elementwise ``linalg.generic`` rather than
        ``linalg.transpose`` so that elementwise fusion merges it with its producer or consumer. ``init``: the
        tensor it is written into (a slice of a larger one), a new one by default."""
        d = dims(t.rank)
        return self.generic(ins=[(v, [d[i] for i in source])], init=self.empty(t) if init is None else init,
                            out_results=d, n_loops=t.rank,
                            iterators=["parallel"] * t.rank, body=lambda args: args[0])

    def _nhwc_conv_matmul(self, xv: ir.Value, xt: TensorType, wv: ir.Value, w_shape: tuple[int, ...],
                          out_shape: tuple[int, ...], stride: tuple[int, int], dilation: tuple[int, int],
                          dt: str, odt: str | None = None) -> ir.Value:
        """The NHWC convolution of the padded input ``xv`` with weights ``wv`` (KH, KW, C, O) as one
        matmul of its patches (rows: output pixels, columns: taps x channels); the (N, OH, OW, O) result, of
        ``odt`` (the accumulator of ``dt`` operands; ``dt`` itself by default)."""
        odt = odt or dt
        (sh, sw), (dh, dw) = stride, dilation
        n_, _hp, _wp, c_ = xt.shape
        kh, kw, _, o = w_shape
        _, oh, ow, _ = out_shape
        rows, depth = n_ * oh * ow, kh * kw * c_
        cols_t = TensorType((rows, depth), dt)
        if sh == sw == 1 and kh == kw == 1:
            cols = self.collapse(xv, xt, cols_t, [[0, 1, 2], [3]])
        else:
            patches_t = TensorType((n_, oh, ow, kh, kw, c_), dt)
            if kh * kw > PATCHIFY_TAPS and (sh, sw, dh, dw) == (kh, kw, 1, 1):
                patches = self.patchify(xv, xt, patches_t, "NHWC")
            else:
                patches = self.patches(xv, xt, patches_t, kh, kw, lambda i, j: (
                    [0, i * dh, j * dw, 0], [n_, oh, ow, c_], [1, sh, sw, 1],
                    [0, 0, 0, i, j, 0], [n_, oh, ow, 1, 1, c_]))
            cols = self.collapse(patches, patches_t, cols_t, [[0, 1, 2], [3, 4, 5]])
        wmat = self.collapse(wv, TensorType(tuple(w_shape), dt), TensorType((depth, o), dt), [[0, 1, 2], [3]])
        mm_t = TensorType((rows, o), odt)
        init = self.filled(mm_t, 0.0)
        mm = linalg.matmul(cols, wmat, outs=[init])
        return self.expand(mm, mm_t, TensorType(tuple(out_shape), odt), [[0, 1, 2], [3]])

    def patches(self, xv: ir.Value, xt: TensorType, patches_t: TensorType, kh: int, kw: int, where: Any) -> ir.Value:
        """im2col as one strided slice of the input per kernel tap, inserted into the patch tensor.

        Slices rather than a gather-like ``linalg.generic``: elementwise fusion would fold such a
        generic into the contraction that consumes it, turning the matmul back into a conv loop nest."""
        acc = self.empty(patches_t)
        for i in range(kh):
            for j in range(kw):
                off, size, stride, ins_off, ins_size = where(i, j)
                tap = tensor.ExtractSliceOp(tensor_type(size, xt.dtype), xv, [], [], [], off, size, stride).result
                acc = tensor.InsertSliceOp(tap, acc, [], [], [], ins_off, ins_size, [1] * len(ins_size)).result
        return acc

    def patchify(self, xv: ir.Value, xt: TensorType, patches_t: TensorType, layout: str) -> ir.Value:
        """The im2col of non-overlapping patches (stride = kernel, no dilation: a patch embedding) without a
        copy per tap: the input's covered extent (a view) split into (patch row, row in patch) and (patch
        column, column in patch), then one transpose into ``patches_t`` — (N, OH, OW, KH, KW, C) for
        ``layout`` NHWC, (N, C, KH, KW, OH, OW) for NCHW."""
        if layout == "NHWC":
            n_, oh, ow, kh, kw, c_ = patches_t.shape
            covered, split = (n_, oh * kh, ow * kw, c_), (n_, oh, kh, ow, kw, c_)
            groups, perm = [[0], [1, 2], [3, 4], [5]], [0, 1, 3, 2, 4, 5]
        else:
            n_, c_, kh, kw, oh, ow = patches_t.shape
            covered, split = (n_, c_, oh * kh, ow * kw), (n_, c_, oh, kh, ow, kw)
            groups, perm = [[0], [1], [2, 3], [4, 5]], [0, 1, 3, 5, 2, 4]
        covered_t = TensorType(covered, xt.dtype)
        x = xv
        if tuple(xt.shape) != covered:
            x = tensor.ExtractSliceOp(tensor_type(covered, xt.dtype), xv, [], [], [], [0] * 4, list(covered),
                                      [1] * 4).result
        split_v = self.expand(x, covered_t, TensorType(split, xt.dtype), groups)
        return linalg.transpose(split_v, outs=[self.empty(patches_t)], permutation=perm).results[0]

    def collapse(self, src: ir.Value, src_t: TensorType, dst_t: TensorType, groups: list[list[int]]) -> ir.Value:
        if src_t.shape == dst_t.shape:
            return src
        return tensor.CollapseShapeOp(tensor_type(dst_t.shape, dst_t.dtype), src, reassociation(groups)).result

    def expand(self, src: ir.Value, src_t: TensorType, dst_t: TensorType, groups: list[list[int]]) -> ir.Value:
        if src_t.shape == dst_t.shape:
            return src
        sizes, static = self.mixed(dst_t.shape)
        return tensor.ExpandShapeOp(tensor_type(dst_t.shape, dst_t.dtype), src, reassociation(groups), sizes,
                                    static).result

    def op_transpose(self, node: Node) -> None:
        (x,) = node.inputs
        perm = list(node.attrs["perm"])
        if node.attrs.get("fuse"):  # a layout change (pbsdk.core.ir.layout): a generic that fusion merges
            self.values[node.out.id] = self.permuted(self.value(x), node.out.type, [perm.index(j) for j in range(len(perm))])
            return
        self.values[node.out.id] = linalg.transpose(self.value(x), outs=[self.empty(node.out.type)],
                                                    permutation=perm).results[0]

    def op_reshape(self, node: Node) -> None:
        # Any static reshape is a collapse to 1-D followed by an expand; both are views after bufferization.
        (x,) = node.inputs
        src, t = self.value(x), x.type
        flat = TensorType((t.size,), t.dtype)
        if t.rank == 0:
            src = self.expand(src, t, flat, [])
        elif t.rank > 1:
            src = self.collapse(src, t, flat, [list(range(t.rank))])
        o = node.out.type
        if o.rank == 0:
            src = tensor.CollapseShapeOp(tensor_type((), o.dtype), src, reassociation([])).result
        elif o.rank > 1:
            src = self.expand(src, flat, o, [list(range(o.rank))])
        self.values[node.out.id] = src

    def op_slice(self, node: Node) -> None:
        # A strided tensor.extract_slice: a view after bufferization, copied only where a result needs it.
        (x,) = node.inputs
        out = node.out
        offsets, static_offsets = self.mixed(node.attrs["starts"])
        sizes, static = self.mixed(out.shape)
        self.values[out.id] = tensor.ExtractSliceOp(
            tensor_type(out.shape, out.dtype), self.value(x), offsets, sizes, [], static_offsets,
            static, list(node.attrs["steps"])).result

    def op_concat(self, node: Node) -> None:
        # Each operand inserted at its offset along the axis into one destination tensor.
        axis = node.attrs["axis"]
        out_t = node.out.type
        dest = self.empty(out_t)
        offset = 0
        for v in node.inputs:
            offsets, static_offsets = self.mixed([offset if i == axis else 0 for i in range(out_t.rank)])
            sizes, static = self.mixed(v.shape)
            dest = tensor.InsertSliceOp(self.value(v), dest, offsets, sizes, [], static_offsets, static,
                                        [1] * out_t.rank).result
            offset = offset + v.shape[axis]
        self.values[node.out.id] = dest

    def op_interleave(self, node: Node) -> None:
        # Each part inserted into one destination at its phases with the strides (a strided insert_slice:
        # after bufferization a copy into a strided view of the destination); a part whose last positions
        # fall past a cropped output is sliced to the positions it has.
        axes, strides = node.attrs["axes"], node.attrs["strides"]
        out_t = node.out.type
        dest = self.empty(out_t)
        step = dict(zip(axes, strides))
        steps = [int(step.get(i, 1)) for i in range(out_t.rank)]
        for q, v in enumerate(node.inputs):
            phase = dict(zip(axes, np.unravel_index(q, strides)))
            counts = [-(-(o - int(phase[i])) // step[i]) if i in phase else d
                      for i, (o, d) in enumerate(zip(out_t.shape, v.shape))]
            if any(counts[i] < 1 for i in axes):
                continue  # a phase with no position in the cropped output
            src = self.value(v)
            sizes, static = self.mixed(counts)
            if any(counts[i] != v.shape[i] for i in axes):
                src = tensor.ExtractSliceOp(tensor_type(tuple(counts), v.dtype), src, [], sizes, [],
                                            [0] * out_t.rank, static, [1] * out_t.rank).result
            offsets = [int(phase.get(i, 0)) for i in range(out_t.rank)]
            dest = tensor.InsertSliceOp(src, dest, [], sizes, [], offsets, static, steps).result
        self.values[node.out.id] = dest

    def op_take(self, node: Node) -> None:
        # Loops over the output; the index operand is read elementwise, clipped to [0, n-1] in floating
        # point (maxnumf turns NaN into 0), converted, and used to extract from the table.
        table, idx = node.inputs
        axis = node.attrs["axis"]
        out = node.out
        rank, k = len(out.shape), len(idx.shape)
        loops = dims(rank)
        it = element_type(idx.dtype)
        table_v = self.value(table)
        last = table.shape[axis] - 1
        hi_value = None if isinstance(last, int) else self.float_size(last, it)

        def body(args: Sequence[ir.Value]) -> ir.Value:
            index = {d: linalg.IndexOp(d).result for d in range(rank) if not axis <= d < axis + k}
            ix = _clipped_index(args[0], float_constant(float(last), it) if hi_value is None else hi_value)
            coords = [index[d] for d in range(axis)] + [ix] + [index[d + k - 1]
                                                               for d in range(axis + 1, table.type.rank)]
            return tensor.ExtractOp(table_v, coords).result

        self.values[out.id] = self.generic(ins=[(self.value(idx), loops[axis:axis + k])],
                                           init=self.empty(out.type), out_results=loops, n_loops=rank,
                                           iterators=["parallel"] * rank, body=body)

    def op_take_along(self, node: Node) -> None:
        # Loops over the output (the index operand's shape); each index, clipped to [0, n-1] as in
        # op_take, replaces the output's coordinate along the axis to extract from the source.
        src, idx = node.inputs
        axis = node.attrs["axis"]
        out = node.out
        rank = len(out.shape)
        loops = dims(rank)
        it = element_type(idx.dtype)
        src_v = self.value(src)

        def body(args: Sequence[ir.Value]) -> ir.Value:
            ix = _clipped_index(args[0], float_constant(float(src.shape[axis] - 1), it))
            coords = [ix if d == axis else linalg.IndexOp(d).result for d in range(rank)]
            return tensor.ExtractOp(src_v, coords).result

        self.values[out.id] = self.generic(ins=[(self.value(idx), loops)], init=self.empty(out.type),
                                           out_results=loops, n_loops=rank, iterators=["parallel"] * rank,
                                           body=body)

    def op_flip(self, node: Node) -> None:
        # A copy reading each flipped axis backwards (index n - 1 - d).
        (x,) = node.inputs
        rank = len(x.shape)
        loops = dims(rank)
        src = [loops[i] * -1 + (x.shape[i] - 1) if i in node.attrs["axes"] else loops[i] for i in range(rank)]
        self.values[node.out.id] = self.generic(ins=[(self.value(x), src)], init=self.empty(node.out.type),
                                                out_results=loops, n_loops=rank, iterators=["parallel"] * rank,
                                                body=lambda args: args[0])


def _memref(t: TensorType) -> ir.MemRefType:
    return ir.MemRefType.get(static_sizes(t.shape), element_type(t.dtype))


def packed_dtypes(x: str, w: str, out: str) -> bool:
    """Whether a convolution of ``x`` by ``w`` into ``out`` is a contraction the targets pack: one float type
    throughout, or a mixed contraction (`MIXED_CONTRACTIONS`: bf16 -> f32, i8 -> i32)."""
    return x == w and ((out == x and out in ("f32", "f64")) or (x, out) in MIXED_CONTRACTIONS)


def grouped_as_batch(node: Node, spec: Any, options: Options) -> bool:
    """Whether the grouped (not depthwise) convolution ``node`` runs as one batched contraction over its
    groups (`_Emitter._grouped_conv_as_batch`) rather than a loop nest: option ``conv_nhwc``, operands and
    product a contraction the targets pack (one float type, or a mixed one), and a spec with a vector FMA
    unit for the product's type (without one, as given)."""
    x, w = node.inputs
    acc = node.out.dtype
    vec = getattr(spec, "vector", None)
    return (node.attrs["groups"] > 1 and packed_dtypes(x.dtype, w.dtype, acc) and options.conv_nhwc
            and vec is not None and vec.fma and acc in vec.dtypes)


def direct_conv_route(node: Node, spec: Any, options: Options) -> Any:
    """The planner's route (`pbsdk.core.plan.direct_conv.plan_conv_route`) for the f32 convolution ``node``
    that is not depthwise, on a spec with a vector FMA unit for f32 and options ``conv_nhwc`` and
    ``direct_conv``; None where
    it is not asked (the convolution then goes as before: a contraction, or the generic loop nest)."""
    x, w = node.inputs
    vec = getattr(spec, "vector", None)
    if (not options.conv_nhwc or not options.direct_conv or vec is None or not vec.fma or "f32" not in vec.dtypes
            or (x.dtype, w.dtype, node.out.dtype) != ("f32", "f32", "f32")):
        return None
    from pbsdk.core.plan.direct_conv import DirectConv, plan_conv_route

    groups, nhwc = node.attrs["groups"], node.attrs["layout"] == "NHWC"
    c_ = x.shape[3] if nhwc else x.shape[1]
    kh, kw, cg, o = w.shape if nhwc else (w.shape[2], w.shape[3], w.shape[1], w.shape[0])
    if groups > 1 and groups == c_ and o == c_:
        return None  # depthwise: `depthwise_channels_last`
    n_, oh, ow = (node.out.shape[0], *(node.out.shape[1:3] if nhwc else node.out.shape[2:4]))
    (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
    conv = DirectConv(n_, oh, ow, groups, o // groups, kh, kw, cg, sh, sw, dh, dw)
    clock = getattr(spec, "clock_ghz", None)
    caches = sorted(((m.size_bytes, m.bandwidth_gbps / clock) for m in spec.memory
                     if m.managed == "cache" and m.bandwidth_gbps), key=lambda c: c[0])
    if not clock or not caches:
        return None  # no caches to keep the weights in (a chip's scratchpads): its contractions decide
    return plan_conv_route(vec.registers, vec.lanes("f32"), vec.fma_per_cycle, vec.loads_per_cycle, conv,
                           caches=caches)


def direct_conv(node: Node, spec: Any, options: Options) -> bool:
    """Whether the convolution ``node`` runs as a direct kernel (`direct_conv_route`)."""
    route = direct_conv_route(node, spec, options)
    return route is not None and route.direct


def conv_in_nhwc(node: Node, spec: Any, options: Options, *, weights_constant: bool, input_nhwc: bool = False,
                 output_nhwc: bool = False) -> bool:
    """Whether the ungrouped NCHW convolution ``node`` runs in NHWC: option ``conv_nhwc`` and, on a spec with
    a vector FMA unit for its dtype, the planner's `nchw_conv_layout` (without one, as given).
    ``input_nhwc``/``output_nhwc``: the graph holds its input / takes its result in NHWC (no transpose)."""
    vec = getattr(spec, "vector", None)
    x, w = node.inputs
    acc = node.out.dtype
    if not options.conv_nhwc or vec is None or not vec.fma or acc not in vec.dtypes:
        return False
    from pbsdk.core.plan.window import nchw_conv_layout

    n_, c_, h_, w_ = x.shape
    o, _, kh, kw = w.shape
    _, _, oh, ow = node.out.shape
    (sh, sw) = node.attrs["stride"]
    return nchw_conv_layout(vec.registers, vec.lanes(acc), vec.fma_per_cycle, vec.loads_per_cycle, batch=n_,
                            channels=c_, out_channels=o, in_pixels=h_ * w_,
                            out_pixels=oh * ow, taps=kh * kw, kernel_width=kw, dilation_w=node.attrs["dilation"][1],
                            pointwise=sh == sw == 1 and kh == kw == 1, weights_constant=weights_constant,
                            input_nhwc=input_nhwc, output_nhwc=output_nhwc).nhwc


def depthwise_channels_last(node: Node, spec: Any, options: Options, *, given_nhwc: bool | None = None) -> bool:
    """Whether the convolution ``node`` is depthwise (as many groups as input and output channels) and runs
    channels last with the channel loop innermost: option ``conv_nhwc`` and, on a spec with a vector unit
    for its dtype, the planner's `depthwise_layout`. ``given_nhwc``: whether it pays no transposes (default:
    its input is given in NHWC)."""
    x, w = node.inputs
    groups, nhwc = node.attrs["groups"], node.attrs["layout"] == "NHWC"
    c_, o = (x.shape[3], w.shape[3]) if nhwc else (x.shape[1], w.shape[0])
    vec = getattr(spec, "vector", None)
    acc = node.out.dtype
    if groups == 1 or groups != c_ or o != c_ or not options.conv_nhwc or vec is None or acc not in vec.dtypes:
        return False
    from pbsdk.core.plan.window import depthwise_layout

    n_, oh, ow = (node.out.shape[0], *(node.out.shape[1:3] if nhwc else node.out.shape[2:4]))
    h_, w_ = x.shape[1:3] if nhwc else x.shape[2:4]
    kh, kw = w.shape[:2] if nhwc else w.shape[2:4]
    return depthwise_layout(vec.lanes(acc), batch=n_, channels=c_, in_pixels=h_ * w_, out_pixels=oh * ow,
                            taps=kh * kw, given_nhwc=nhwc if given_nhwc is None else given_nhwc).nhwc


def layout_decision(spec: Any, options: Options, graph: Graph) -> Callable[[Node, bool, bool], bool]:
    """`pbsdk.core.ir.layout.channels_last`'s ``decide`` for ``spec``: one the planner runs as a direct
    kernel, or a grouped one run as a batched contraction over its groups, always (both run channels last:
    given in NCHW they are transposed in and out, which a twin spares); an ungrouped float (or i8 -> i32
    quantized) convolution by `conv_in_nhwc`; a depthwise one by `depthwise_layout` (channels last for free
    once its input and its users are)."""
    producers = {n.out.id: n for n in graph.nodes}

    def decide(node: Node, input_nhwc: bool, output_nhwc: bool) -> bool:
        x, w = node.inputs
        groups = node.attrs["groups"]
        vec = getattr(spec, "vector", None)
        acc = node.out.dtype
        integer = (x.dtype, acc) == ("i8", "i32")  # a quantized convolution (its requantize follows it)
        if x.dtype != w.dtype or (acc not in ("f32", "f64") and not integer) or vec is None \
                or acc not in vec.dtypes:
            return False
        if direct_conv(node, spec, options):
            return True
        if groups == 1:
            const = (src := producers.get(w.id)) is not None and src.op == "const"
            return conv_in_nhwc(node, spec, options, weights_constant=const, input_nhwc=input_nhwc,
                                output_nhwc=output_nhwc)
        nhwc = node.attrs["layout"] == "NHWC"
        c_, o = (x.shape[3], w.shape[3]) if nhwc else (x.shape[1], w.shape[0])
        if groups == c_ == o:  # depthwise: as its planner says (as given where the transposes cost more)
            return depthwise_channels_last(node, spec, options, given_nhwc=input_nhwc and output_nhwc)
        return grouped_as_batch(node, spec, options)

    return decide


def layout_graph(graph: Graph, spec: Any, options: Options) -> tuple[Graph, LayoutReport]:
    """``graph`` kept channels last across layers (`pbsdk.core.ir.layout`) when there is a ``spec`` and option
    ``channels_last`` is on (what `build_graph` emits and ``explain`` explains), and what that did."""
    if spec is None or not options.channels_last:
        return graph, LayoutReport(0, 0, 0)
    return channels_last(graph, layout_decision(spec, options, graph))


def _clipped_index(x: ir.Value, hi: ir.Value) -> ir.Value:
    """A float index ``x`` as an ``index``, clamped to [0, ``hi``] first (``maxnumf`` turns NaN into 0) and
    truncated: how every gather and scatter reads its positions, so none reads or writes outside its tensor."""
    clipped = arith.minnumf(arith.maxnumf(x, float_constant(0.0, x.type)), hi)
    return arith.index_cast(ir.IndexType.get(), arith.fptosi(ir.IntegerType.get_signless(64), clipped))


def _method(op: str) -> str:
    if op.startswith("reduce_"):
        return "reduce"
    if op in ("const", "cast", "broadcast", "matmul", "conv2d", "transpose", "reshape", "slice", "concat", "take",
              "take_along", "flip", "size", "iota", "grouped_matmul", "put_slices", "interleave"):
        return op
    return "elementwise"


_BITS = {"f64": 64, "f32": 32, "f16": 16, "bf16": 16}
_INT_BITS = {"i8": 8, "i32": 32}


def _convert(x: ir.Value, src_dtype: str, dst_dtype: str) -> ir.Value:
    """``x`` converted from one dtype to another (itself when they are equal): floats extended or
    truncated, integers sign-extended or truncated, int -> float ``sitofp``, float -> int ``fptosi``
    (toward zero, as numpy's astype; callers clamp first, out-of-range values are poison)."""
    if src_dtype == dst_dtype:
        return x
    dst = element_type(dst_dtype)
    if src_dtype in _INT_BITS and dst_dtype in _INT_BITS:
        return (arith.extsi if _INT_BITS[src_dtype] < _INT_BITS[dst_dtype] else arith.trunci)(dst, x)
    if src_dtype in _INT_BITS:
        return arith.sitofp(dst, x)
    if dst_dtype in _INT_BITS:
        return arith.fptosi(dst, x)
    op = arith.extf if _BITS[src_dtype] < _BITS[dst_dtype] else arith.truncf
    return op(dst, x)


def _mac_body(a_dtype: str, b_dtype: str, acc: str) -> Callable[[Sequence[ir.Value]], ir.Value]:
    """The body of a contraction: ``acc + a * b`` in the accumulator's dtype (integer: i8 operands
    sign-extended to the i32 accumulator, ``muli``/``addi``)."""
    def body(args: Sequence[ir.Value]) -> ir.Value:
        a, b = _convert(args[0], a_dtype, acc), _convert(args[1], b_dtype, acc)
        if acc in _INT_BITS:
            return arith.addi(args[2], arith.muli(a, b))
        return arith.addf(args[2], arith.mulf(a, b))
    return body


#: Integer elementwise ops (the rest of `pbsdk.core.quant.INT_OPS` move data).
_INT_SIMPLE: dict[str, Callable[..., ir.Value]] = {
    "add": arith.addi, "sub": arith.subi, "mul": arith.muli, "maximum": arith.maxsi, "minimum": arith.minsi}


_SIMPLE: dict[str, Callable[..., ir.Value]] = {
    "add": arith.addf, "sub": arith.subf, "mul": arith.mulf, "div": arith.divf, "maximum": arith.maximumf,
    "minimum": arith.minimumf, "pow": math_d.powf, "fmod": arith.remf}
#: Bitwise ops on whole numbers carried as floats: computed on i64 and converted back.
_BITWISE: dict[str, Callable[..., ir.Value]] = {
    "bitwise_and": arith.andi, "bitwise_or": arith.ori, "bitwise_xor": arith.xori}
_UNARY: dict[str, Callable[..., ir.Value]] = {
    "neg": arith.negf, "exp": math_d.exp, "log": math_d.log, "tanh": math_d.tanh, "erf": math_d.erf,
    "sqrt": math_d.sqrt, "rsqrt": math_d.rsqrt, "abs": math_d.absf, "sin": math_d.sin, "cos": math_d.cos,
    "tan": math_d.tan, "floor": math_d.floor, "ceil": math_d.ceil, "round": math_d.roundeven, "trunc": math_d.trunc}
#: Comparisons produce a 0/1 mask; "not_equal" is true for NaN, the others false (IEEE, as numpy).
_COMPARE = {"equal": "OEQ", "not_equal": "UNE", "less": "OLT", "less_equal": "OLE", "greater": "OGT",
            "greater_equal": "OGE"}


def _row_invariant(operand: tuple[int, ...], out: tuple[int, ...]) -> bool:
    """Whether an operand of shape ``operand`` broadcast to ``out`` is the same along out's last axis (a
    scalar, or size 1 there) while that axis is longer than 1."""
    return bool(out) and (not isinstance(out[-1], int) or out[-1] > 1) and (not operand or operand[-1] == 1)


def _scalar_body(node: Node, x: Sequence[ir.Value], t: ir.Type) -> ir.Value | None:
    """Scalar code of an elementwise node on operands of type ``t``; None for cast/broadcast (the value is
    the operand itself)."""
    op = node.op
    if op == "div" and _row_invariant(node.inputs[1].shape, node.out.shape):
        # ``arcp``: LLVM may divide by a divisor that the innermost loop does not change (a softmax's row
        # sum, a norm, a scalar) as one reciprocal per row and a multiply per element, as XLA rewrites
        # A / const: at most an ulp apart, and a vector division costs several multiplies.
        return arith.divf(x[0], x[1], fastmath=ir.Attribute.parse("#arith.fastmath<arcp>"))
    if op in _SIMPLE:
        return _SIMPLE[op](x[0], x[1])
    if op in _UNARY:
        return _UNARY[op](x[0])
    if op in ("cast", "broadcast"):
        return None
    if op == "relu":
        return arith.maximumf(x[0], float_constant(0.0, t))
    if op == "sigmoid":
        one = float_constant(1.0, t)
        return arith.divf(one, arith.addf(one, math_d.exp(arith.negf(x[0]))))
    if op == "gelu":  # 0.5 * x * (1 + erf(x / sqrt(2)))
        half, one, is2 = (float_constant(c, t) for c in (0.5, 1.0, 1 / math.sqrt(2)))
        p = arith.addf(one, math_d.erf(arith.mulf(x[0], is2)))
        return arith.mulf(arith.mulf(x[0], half), p)
    if op == "gelu_tanh":  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        half, one, c, k = (float_constant(v, t) for v in (0.5, 1.0, math.sqrt(2 / math.pi), 0.044715))
        x3 = arith.mulf(arith.mulf(x[0], x[0]), x[0])
        inner = arith.addf(x[0], arith.mulf(k, x3))
        p = arith.addf(one, math_d.tanh(arith.mulf(c, inner)))
        return arith.mulf(arith.mulf(x[0], half), p)
    if op in _BITWISE:
        i64 = ir.IntegerType.get_signless(64)
        y = _BITWISE[op](arith.fptosi(i64, x[0]), arith.fptosi(i64, x[1]))
        return arith.sitofp(t, y)
    if op == "log1p":  # log(u) * x / (u - 1) with u = 1 + x corrects u's rounding (Goldberg); x where u == 1
        one, inf = float_constant(1.0, t), float_constant(math.inf, t)
        u = arith.addf(one, x[0])
        y = arith.mulf(math_d.log(u), arith.divf(x[0], arith.subf(u, one)))
        y = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, u, inf), u, y)
        return arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, u, one), x[0], y)
    if op == "expm1":  # (u - 1) * x / log(u) with u = exp(x) (Kahan); x where u == 1, -1 and inf at the ends
        one, inf = float_constant(1.0, t), float_constant(math.inf, t)
        u = math_d.exp(x[0])
        um1 = arith.subf(u, one)
        y = arith.divf(arith.mulf(um1, x[0]), math_d.log(u))
        y = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, um1, arith.negf(one)), um1, y)
        y = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, u, inf), u, y)
        return arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, u, one), x[0], y)
    if op == "sign":  # 1, -1, or x itself (0, -0, NaN)
        one, zero = float_constant(1.0, t), float_constant(0.0, t)
        y = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, x[0], zero), arith.negf(one), x[0])
        return arith.select(arith.cmpf(arith.CmpFPredicate.OGT, x[0], zero), one, y)
    if op in _COMPARE:
        cond = arith.cmpf(getattr(arith.CmpFPredicate, _COMPARE[op]), x[0], x[1])
        one, zero = float_constant(1.0, t), float_constant(0.0, t)
        return arith.select(cond, one, zero)
    if op == "select":  # where(x0 != 0, x1, x2)
        cond = arith.cmpf(arith.CmpFPredicate.UNE, x[0], float_constant(0.0, t))
        return arith.select(cond, x[1], x[2])
    raise UnsupportedError(f"no scalar lowering for '{op}'", op=op)


def _declare_lanes_kernel(ip: ir.InsertionPoint, name: str, plan: Any, ops: Any) -> func.FuncOp:
    """``func.func private @{name}(Q, K, V[, M], O)`` on the operands' base buffers, without a body, marked
    with the ``"lanes"`` descriptor (`pbsdk.core.ir.attention_tiles.descriptor`). A declaration passes
    every core stage unchanged (one-shot bufferization and the deallocation pipeline see a call on
    buffers with no results); a target that lists ``"lanes"`` in its ``attention_forms`` gives it its body.
    Q, K and V are of the op's ``dtype``, the mask of its ``mask_dtype``, O of its ``out_dtype``; a base size
    known only at run time (a dynamic key length) is ``?``."""
    from pbsdk.core.ir.attention_tiles import descriptor

    op = plan.op
    shapes = [(ops.q_shape, op.dtype), (ops.k_shape, op.dtype), (ops.v_shape, op.dtype)] \
        + ([(ops.mask_shape, op.mask_dtype)] if ops.mask is not None else []) + [(ops.out_shape, op.out_dtype)]
    with ip:
        fn = func.FuncOp(name, ir.FunctionType.get([memref_type(static_sizes(s), dt) for s, dt in shapes], []),
                         visibility="private")
    attributes.set_data(fn, attributes.ATTENTION, descriptor(plan, ops))
    return fn


def _fused_attention(graph: Graph, spec: Any, options: Options | Mapping[str, Any] | None,
                     forms: Sequence[str] | None) -> list[Any]:
    """The (match, plan) pairs of the attention patterns the planner fuses on ``spec`` (none without one)."""
    if spec is None or not as_options(options).fuse_attention:
        return []
    from pbsdk.core.ir.attention import planned_attention
    from pbsdk.core.plan.attention import FORMS

    return [(m, p) for m, p in planned_attention(graph, spec, options, forms=FORMS if forms is None else forms)
            if p.fused]


def build_graph(graph: Graph, *, func_name: str = "main", spec: Any = None,
                options: Options | Mapping[str, Any] | None = None, forms: Sequence[str] | None = None,
                context: ir.Context | None = None, constants: list[np.ndarray] | None = None) -> ir.Module:
    """The graph as a module holding one public ``func.func`` taking and returning static-shaped tensors,
    built in ``context`` (a new one by default).

    With a ``constants`` list, large constants become entry arguments after the inputs (see the module's
    docstring) and their arrays are appended to it; without one, every constant is inline.

    With a ``spec``, attention patterns the planner fuses (`pbsdk.core.ir.attention`,
    option ``fuse_attention``, default True) become one fused kernel each, in one of ``forms``
    (the target's `attention_forms`; None: any), called from the entry function."""
    if not graph.outputs:
        raise UnsupportedError("the traced function returns no tensors")
    opts = as_options(options)
    graph, report = layout_graph(graph, spec, opts)
    if report.convs_nhwc:
        _log.info("%s", report.summary())
    fused = _fused_attention(graph, spec, opts, forms)
    with context or ir.Context(), ir.Location.unknown():
        module = ir.Module.create()
        _Emitter(graph, module, func_name, fused, constants, opts, spec).run()
        try:
            module.operation.verify()
        except ir.MLIRError as exc:
            raise CompileError(f"the emitted module does not verify: {exc}", stage="emit") from exc
    return module


def emit_graph(graph: Graph, *, func_name: str = "main", spec: Any = None,
               options: Options | Mapping[str, Any] | None = None, forms: Sequence[str] | None = None) -> str:
    """The text of `build_graph`'s module (as the bindings print it: SSA values numbered by the printer,
    affine maps as ``#map`` aliases)."""
    module = build_graph(graph, func_name=func_name, spec=spec, options=options, forms=forms)
    return module.operation.get_asm(assume_verified=True)  # build_graph has verified it


@dataclasses.dataclass(frozen=True, eq=False)
class Program:
    """An emitted graph: the module's text, whose entry takes the inputs then ``constants`` (the arrays
    of its ``pbsdk.constant`` arguments, in order), which `pbsdk.core.compiler.compile_text` takes
    next to it."""

    text: str
    constants: tuple[np.ndarray, ...] = ()


def emit_program(graph: Graph, *, func_name: str = "main", spec: Any = None,
                 options: Options | Mapping[str, Any] | None = None,
                 forms: Sequence[str] | None = None) -> Program:
    """The graph's module text with its large constants as operands (`build_graph` with a list), so the
    text stays small whatever the weights weigh."""
    constants: list[np.ndarray] = []
    module = build_graph(graph, func_name=func_name, spec=spec, options=options, forms=forms,
                         constants=constants)
    return Program(module.operation.get_asm(assume_verified=True), tuple(constants))
