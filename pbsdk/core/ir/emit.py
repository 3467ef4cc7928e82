"""Emit a `Graph` as MLIR at the linalg-on-tensors level.

Every graph op becomes one linalg op (``linalg.generic`` with explicit indexing maps for elementwise ops
with broadcasting, reductions, contractions with transposed or broadcast operands, and convolutions;
named ops where they say the same thing: ``linalg.matmul``, ``linalg.batch_matmul``, ``linalg.transpose``),
so the rest of the pipeline — fusion, tiling, bufferization — is upstream MLIR working on upstream ops.
Half-precision elementwise math is computed in f32 inside the op body and rounded once on the way out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pbsdk.core.errors import UnsupportedError
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY, Graph, Node, TensorType, Value
from pbsdk.core.options import Options, as_options


def mlir_type(t: TensorType) -> str:
    return f"tensor<{''.join(f'{d}x' for d in t.shape)}{t.dtype}>"


def _compute_dtype(dtype: str) -> str:
    return "f32" if dtype in ("f16", "bf16") else dtype


def _dims(n: int, offset: int = 0) -> list[str]:
    return [f"d{i + offset}" for i in range(n)]


def _map(n_loops: int, results: Sequence[str]) -> str:
    return f"affine_map<({', '.join(_dims(n_loops))}) -> ({', '.join(results)})>"


def _broadcast_results(in_shape: tuple[int, ...], out_shape: tuple[int, ...], loops: Sequence[str]) -> list[str]:
    """Index expressions reading an operand broadcast (numpy rules) against ``out_shape``."""
    offset = len(out_shape) - len(in_shape)
    return ["0" if d == 1 and out_shape[offset + i] != 1 else loops[offset + i] for i, d in enumerate(in_shape)]


def _float_hex(array: np.ndarray, dtype: str) -> str:
    data = np.ascontiguousarray(array.astype(DTYPE_TO_NUMPY[dtype])).tobytes()
    return '"0x' + data.hex().upper() + '"'


class _Emitter:
    def __init__(self, graph: Graph, func_name: str, fused: Sequence[Any] = ()) -> None:
        self.graph = graph
        self.func_name = func_name
        self.lines: list[str] = []
        self.names: dict[int, str] = {}
        self.counter = 0
        # Fused attention (pbsdk.core.ir.attention): (match, plan) pairs; their nodes are not emitted
        # one by one, the kernel functions go before the entry function.
        self.fused = {m.out.id: (m, p) for m, p in fused}
        self.skipped = {i for m, _ in fused for i in m.covered}
        self.kernels: list[str] = []

    # -- helpers --------------------------------------------------------------------------------------
    def fresh(self, hint: str = "v") -> str:
        self.counter += 1
        return f"%{hint}{self.counter}"

    def name(self, v: Value) -> str:
        return self.names[v.id]

    def emit(self, line: str) -> None:
        self.lines.append("    " + line)

    def empty(self, t: TensorType) -> str:
        name = self.fresh("init")
        self.emit(f"{name} = tensor.empty() : {mlir_type(t)}")
        return name

    def filled(self, t: TensorType, value: float) -> str:
        init = self.empty(t)
        cst = self.fresh("c")
        self.emit(f"{cst} = arith.constant {self.scalar_literal(value, t.dtype)} : {t.dtype}")
        name = self.fresh("fill")
        self.emit(f"{name} = linalg.fill ins({cst} : {t.dtype}) outs({init} : {mlir_type(t)}) -> {mlir_type(t)}")
        return name

    @staticmethod
    def scalar_literal(value: float, dtype: str) -> str:
        if math.isfinite(value):
            return f"{float(value):.17e}"  # always has a '.', which MLIR's float literals need
        bits = np.array([value], dtype=DTYPE_TO_NUMPY[dtype]).view(f"u{np.dtype(DTYPE_TO_NUMPY[dtype]).itemsize}")
        return hex(int(bits[0]))

    def generic(self, *, out: Value, ins: Sequence[tuple[str, TensorType, list[str]]], init: str,
                out_results: list[str], n_loops: int, iterators: Sequence[str], body: list[str],
                result: str = "%r") -> None:
        """Emit a linalg.generic; ``body`` lines use %in0.., %acc; ``result`` is the value yielded."""
        maps = [_map(n_loops, r) for _, _, r in ins] + [_map(n_loops, out_results)]
        ins_txt = ", ".join(n for n, _, _ in ins)
        ins_types = ", ".join(mlir_type(t) for _, t, _ in ins)
        out_t = mlir_type(out.type)
        name = self.fresh("v")
        its = ", ".join(f'"{i}"' for i in iterators)
        head = f"{name} = linalg.generic {{indexing_maps = [{', '.join(maps)}], iterator_types = [{its}]}}"
        head += f" ins({ins_txt} : {ins_types})" if ins else ""
        head += f" outs({init} : {out_t}) {{"
        self.emit(head)
        args = ", ".join([f"%in{i}: {t.dtype}" for i, (_, t, _) in enumerate(ins)] + [f"%acc: {out.dtype}"])
        self.emit(f"^bb0({args}):")
        for line in body:
            self.emit("  " + line)
        self.emit(f"  linalg.yield {result} : {out.dtype}")
        self.emit(f"}} -> {out_t}")
        self.names[out.id] = name

    # -- ops ------------------------------------------------------------------------------------------
    def run(self) -> str:
        g = self.graph
        args = ", ".join(f"%arg{i}: {mlir_type(v.type)}" for i, v in enumerate(g.inputs))
        for i, v in enumerate(g.inputs):
            self.names[v.id] = f"%arg{i}"
        results = ", ".join(mlir_type(v.type) for v in g.outputs)
        for node in g.live_nodes():
            if node.out.id in self.fused:
                self.op_attention(*self.fused[node.out.id])
            elif node.op != "input" and node.out.id not in self.skipped:
                getattr(self, "op_" + _method(node.op))(node)
        rets = ", ".join(self.name(v) for v in g.outputs)
        types = ", ".join(mlir_type(v.type) for v in g.outputs)
        header = f"  func.func @{self.func_name}({args}) -> ({results}) attributes {{llvm.emit_c_interface}} {{"
        return "\n".join(["module {", *self.kernels, header, *self.lines, f"    return {rets} : {types}", "  }",
                          "}", ""])

    def op_attention(self, match: Any, plan: Any) -> None:
        """A fused attention: the kernel of `pbsdk.core.ir.attention_kernel` (``"lanes"`` plans) or
        `pbsdk.core.ir.attention_tiles` (``"scratchpad"`` plans) on the operands' buffers."""
        from pbsdk.core.ir.attention_kernel import KernelOperands, kernel_text, memref_type

        name = f"__pbsdk_attn{len(self.kernels)}"
        bases = [match.q.base, match.k.base, match.v.base] + ([match.mask.base] if match.mask else [])
        ops = KernelOperands(q=match.q, k=match.k, v=match.v, mask=match.mask, q_shape=bases[0].shape,
                             k_shape=bases[1].shape, v_shape=bases[2].shape,
                             mask_shape=bases[3].shape if match.mask else None, out_shape=match.out.shape,
                             scale=match.scale, mask_scale=match.mask_scale, dtype=match.out.dtype)
        if plan.schedule == "scratchpad":
            from pbsdk.core.ir.attention_tiles import tiles_kernel_text

            self.kernels.append(tiles_kernel_text(name, plan, ops))
        else:
            self.kernels.append(kernel_text(name, plan, ops))
        buffers, types = [], []
        for b in bases:
            buf, ty = self.fresh("buf"), memref_type(b.shape, b.dtype)
            self.emit(f"{buf} = bufferization.to_buffer {self.name(b)} read_only : {mlir_type(b.type)} to {ty}")
            buffers.append(buf)
            types.append(ty)
        out_ty = memref_type(match.out.shape, match.out.dtype)
        ob, res = self.fresh("attnbuf"), self.fresh("attn")
        self.emit(f"{ob} = memref.alloc() {{alignment = 64 : i64}} : {out_ty}")
        self.emit(f"func.call @{name}({', '.join(buffers + [ob])}) : ({', '.join(types + [out_ty])}) -> ()")
        self.emit(f"{res} = bufferization.to_tensor {ob} restrict writable : {out_ty} to {mlir_type(match.out.type)}")
        self.names[match.out.id] = res

    def op_const(self, node: Node) -> None:
        value = np.asarray(node.attrs["value"])
        name = self.fresh("cst")
        t = node.out.type
        if value.size == 1:
            literal = self.scalar_literal(float(value.reshape(())), t.dtype)
            self.emit(f"{name} = arith.constant dense<{literal}> : {mlir_type(t)}")
        else:
            self.emit(f"{name} = arith.constant dense<{_float_hex(value, t.dtype)}> : {mlir_type(t)}")
        self.names[node.out.id] = name

    def op_elementwise(self, node: Node) -> None:
        out = node.out
        rank = len(out.shape)
        loops = _dims(rank)
        cdt = _compute_dtype(out.dtype)
        ins = [(self.name(v), v.type, _broadcast_results(v.shape, out.shape, loops)) for v in node.inputs]
        body: list[str] = []
        operands = []
        for i, v in enumerate(node.inputs):
            body += _convert(f"%in{i}", v.dtype, cdt, f"%x{i}")
            operands.append(f"%x{i}" if v.dtype != cdt else f"%in{i}")
        scalar = _scalar_body(node, operands, cdt)  # defines %y last; empty for cast/broadcast
        body += scalar
        value = "%y" if scalar else operands[0]
        if cdt != out.dtype:
            body += _convert(value, cdt, out.dtype, "%r")
            value = "%r"
        self.generic(out=out, ins=ins, init=self.empty(out.type), out_results=loops, n_loops=rank,
                     iterators=["parallel"] * rank, body=body, result=value)

    op_cast = op_elementwise
    op_broadcast = op_elementwise

    def op_reduce(self, node: Node) -> None:
        (x,) = node.inputs
        axes = node.attrs["axes"]
        out = node.out
        rank = len(x.shape)
        loops = _dims(rank)
        kind = node.op.removeprefix("reduce_")
        init_value = {"sum": 0.0, "max": -math.inf, "min": math.inf}[kind]
        init = self.filled(out.type, init_value)
        body = []
        operand = "%in0"
        if x.dtype != out.dtype:
            body.append(f"%x0 = arith.extf %in0 : {x.dtype} to {out.dtype}")
            operand = "%x0"
        op = {"sum": "arith.addf", "max": "arith.maximumf", "min": "arith.minimumf"}[kind]
        # reassoc: the order of a reduction is not part of its meaning (tolerances scale with its length), and
        # without it LLVM cannot vectorise the loop.
        body.append(f"%r = {op} {operand}, %acc fastmath<reassoc> : {out.dtype}")
        self.generic(out=out, ins=[(self.name(x), x.type, loops)], init=init,
                     out_results=[d for i, d in enumerate(loops) if i not in axes], n_loops=rank,
                     iterators=["reduction" if i in axes else "parallel" for i in range(rank)], body=body)

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
            name = self.fresh("mm")
            opname = "linalg.matmul" if nb == 0 else "linalg.batch_matmul"
            self.emit(f"{name} = {opname} ins({an}, {bn} : {mlir_type(at)}, "
                      f"{mlir_type(bt)}) outs({init} : {mlir_type(ot)}) -> {mlir_type(ot)}")
            if nb > 1:
                name = self.expand(name, ot, out.type, [list(range(nb))] + [[nb], [nb + 1]])
            self.names[out.id] = name
            return
        if nb >= 1 and not ta and len(b.shape) == 2 and a.shape[:-2] == out.shape[:-2]:
            # (batch..., m, k) @ (k, n): one (batch*m, k) @ (k, n) matmul on views (x @ W in a model).
            rows = math.prod(a.shape[:-1])
            groups = [list(range(nb + 1)), [nb + 1]]
            at = TensorType((rows, a.shape[-1]), a.dtype)
            an = self.collapse(self.name(a), a.type, at, groups)
            bn, bt = self.row_major(b, tb)
            ot = TensorType((rows, out.shape[-1]), out.dtype)
            init = self.filled(ot, 0.0)
            name = self.fresh("mm")
            self.emit(f"{name} = linalg.matmul ins({an}, {bn} : {mlir_type(at)}, {mlir_type(bt)}) "
                      f"outs({init} : {mlir_type(ot)}) -> {mlir_type(ot)}")
            self.names[out.id] = self.expand(name, ot, out.type, groups)
            return
        # General case: loops (batch..., m, n, k); operands broadcast over batch and read transposed.
        loops = _dims(nb + 3)
        batch, m, n, k = loops[:nb], loops[nb], loops[nb + 1], loops[nb + 2]

        def operand_map(v: Value, rows: str, cols: str, transposed: bool) -> list[str]:
            vb = v.shape[:-2]
            lead = _broadcast_results(vb, out.shape[:-2], batch) if vb else []
            return lead + ([cols, rows] if transposed else [rows, cols])

        ins = [(self.name(a), a.type, operand_map(a, m, k, ta)), (self.name(b), b.type, operand_map(b, k, n, tb))]
        body = _mac_body(a.dtype, b.dtype, out.dtype)
        self.generic(out=out, ins=ins, init=self.filled(out.type, 0.0), out_results=batch + [m, n],
                     n_loops=nb + 3, iterators=["parallel"] * (nb + 2) + ["reduction"], body=body)

    def producer(self, v: Value) -> Node | None:
        if not hasattr(self, "_producers"):
            self._producers = {n.out.id: n for n in self.graph.nodes}
        return self._producers.get(v.id)

    def row_major(self, v: Value, transposed: bool) -> tuple[str, TensorType]:
        """``v``, or its last two axes swapped when ``transposed``: a folded constant where ``v`` is one."""
        if not transposed:
            return self.name(v), v.type
        shape = (*v.shape[:-2], v.shape[-1], v.shape[-2])
        t = TensorType(shape, v.dtype)
        src = self.producer(v)
        name = self.fresh("tr")
        if src is not None and src.op == "const" and np.asarray(src.attrs["value"]).shape == v.shape:
            value = np.ascontiguousarray(np.swapaxes(np.asarray(src.attrs["value"]), -1, -2))
            self.emit(f"{name} = arith.constant dense<{_float_hex(value, v.dtype)}> : {mlir_type(t)}")
            return name, t
        perm = ", ".join(map(str, [*range(len(shape) - 2), len(shape) - 1, len(shape) - 2]))
        self.emit(f"{name} = linalg.transpose ins({self.name(v)} : {mlir_type(v.type)}) "
                  f"outs({self.empty(t)} : {mlir_type(t)}) permutation = [{perm}]")
        return name, t

    def op_conv2d(self, node: Node) -> None:
        x, w = node.inputs
        out = node.out
        (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
        (pt, pb), (pl, pr) = node.attrs["padding"]
        groups, nhwc = node.attrs["groups"], node.attrs["layout"] == "NHWC"
        xname = self.name(x)
        xt = x.type
        if pt or pb or pl or pr:
            # Zero padding as a tensor.pad on the spatial dims.
            lo = [0, 0, pt, pl] if not nhwc else [0, pt, pl, 0]
            hi = [0, 0, pb, pr] if not nhwc else [0, pb, pr, 0]
            shape = tuple(d + lo[i] + hi[i] for i, d in enumerate(xt.shape))
            padded = TensorType(shape, xt.dtype)
            zero, name = self.fresh("zero"), self.fresh("pad")
            self.emit(f"{zero} = arith.constant 0.0 : {xt.dtype}")
            self.emit(f"{name} = tensor.pad {xname} low[{', '.join(map(str, lo))}] high[{', '.join(map(str, hi))}] {{")
            self.emit("^bb0(" + ", ".join(f"%p{i}: index" for i in range(4)) + "):")
            self.emit(f"  tensor.yield {zero} : {xt.dtype}")
            self.emit(f"}} : {mlir_type(xt)} to {mlir_type(padded)}")
            xname, xt = name, padded
        if groups == 1 and x.dtype == w.dtype == out.dtype and out.dtype in ("f32", "f64"):
            self._conv2d_as_matmul(node, xname, xt)
            return
        # Split channels into (groups, channels per group) so every map is a plain affine sum.
        if nhwc:
            n_, h_, w_, _ = xt.shape
            kh, kw, cg, o = w.shape
            og = o // groups
            xg = TensorType((n_, h_, w_, groups, cg), xt.dtype)
            wg = TensorType((kh, kw, cg, groups, og), w.dtype)
            og_t = TensorType((n_, out.shape[1], out.shape[2], groups, og), out.dtype)
            xname = self.expand(xname, xt, xg, [[0], [1], [2], [3, 4]])
            wname = self.expand(self.name(w), w.type, wg, [[0], [1], [2], [3, 4]])
            # loops: n oh ow g og kh kw c
            ins = [(xname, xg, ["d0", f"d1 * {sh} + d5 * {dh}", f"d2 * {sw} + d6 * {dw}", "d3", "d7"]),
                   (wname, wg, ["d5", "d6", "d7", "d3", "d4"])]
            out_results = ["d0", "d1", "d2", "d3", "d4"]
            reassoc = [[0], [1], [2], [3, 4]]
        else:
            n_, _, h_, w_ = xt.shape
            o, cg, kh, kw = w.shape
            og = o // groups
            xg = TensorType((n_, groups, cg, h_, w_), xt.dtype)
            wg = TensorType((groups, og, cg, kh, kw), w.dtype)
            og_t = TensorType((n_, groups, og, out.shape[2], out.shape[3]), out.dtype)
            xname = self.expand(xname, xt, xg, [[0], [1, 2], [3], [4]])
            wname = self.expand(self.name(w), w.type, wg, [[0, 1], [2], [3], [4]])
            # loops: n g og oh ow c kh kw
            ins = [(xname, xg, ["d0", "d1", "d5", f"d3 * {sh} + d6 * {dh}", f"d4 * {sw} + d7 * {dw}"]),
                   (wname, wg, ["d1", "d2", "d5", "d6", "d7"])]
            out_results = ["d0", "d1", "d2", "d3", "d4"]
            reassoc = [[0], [1, 2], [3], [4]]
        grouped = Value(og_t)
        self.generic(out=grouped, ins=ins, init=self.filled(og_t, 0.0), out_results=out_results, n_loops=8,
                     iterators=["parallel"] * 5 + ["reduction"] * 3, body=_mac_body(x.dtype, w.dtype, out.dtype))
        name = self.fresh("conv")
        self.emit(f"{name} = tensor.collapse_shape {self.name(grouped)} {_reassoc(reassoc)} : "
                  f"{mlir_type(og_t)} into {mlir_type(out.type)}")
        self.names[out.id] = name

    def _conv2d_as_matmul(self, node: Node, xname: str, xt: TensorType) -> None:
        """An ungrouped conv2d as one contraction: the (padded) input's patches gathered into a column
        matrix (im2col; skipped for 1x1 stride-1 kernels, where the input already is that matrix), times
        the weights viewed as a matrix. The contraction then gets the planner's packed kernel."""
        _, w = node.inputs
        out = node.out
        (sh, sw), (dh, dw) = node.attrs["stride"], node.attrs["dilation"]
        nhwc = node.attrs["layout"] == "NHWC"
        dt = out.dtype
        pointwise = sh == sw == 1
        if nhwc:
            n_, _hp, _wp, c_ = xt.shape
            kh, kw, _, o = w.shape
            _, oh, ow, _ = out.shape
            pointwise = pointwise and kh == kw == 1
            rows, depth = n_ * oh * ow, kh * kw * c_
            cols_t = TensorType((rows, depth), dt)
            if pointwise:
                cols = self.collapse(xname, xt, cols_t, [[0, 1, 2], [3]])
            else:
                patches_t = TensorType((n_, oh, ow, kh, kw, c_), dt)
                patches = self.patches(xname, xt, patches_t, kh, kw, lambda i, j: (
                    [0, i * dh, j * dw, 0], [n_, oh, ow, c_], [1, sh, sw, 1],
                    [0, 0, 0, i, j, 0], [n_, oh, ow, 1, 1, c_]))
                cols = self.collapse(patches, patches_t, cols_t, [[0, 1, 2], [3, 4, 5]])
            wmat_t = TensorType((depth, o), dt)
            wmat = self.collapse(self.name(w), w.type, wmat_t, [[0, 1, 2], [3]])
            mm_t = TensorType((rows, o), dt)
            init = self.filled(mm_t, 0.0)
            mm = self.fresh("mm")
            self.emit(f"{mm} = linalg.matmul ins({cols}, {wmat} : {mlir_type(cols_t)}, {mlir_type(wmat_t)}) "
                      f"outs({init} : {mlir_type(mm_t)}) -> {mlir_type(mm_t)}")
            self.names[out.id] = self.expand(mm, mm_t, out.type, [[0, 1, 2], [3]])
            return
        n_, c_, _hp, _wp = xt.shape
        o, _, kh, kw = w.shape
        _, _, oh, ow = out.shape
        pointwise = pointwise and kh == kw == 1
        depth, pixels = c_ * kh * kw, oh * ow
        cols_t = TensorType((n_, depth, pixels), dt)
        if pointwise:
            cols = self.collapse(xname, xt, cols_t, [[0], [1], [2, 3]])
        else:
            patches_t = TensorType((n_, c_, kh, kw, oh, ow), dt)
            patches = self.patches(xname, xt, patches_t, kh, kw, lambda i, j: (
                [0, 0, i * dh, j * dw], [n_, c_, oh, ow], [1, 1, sh, sw],
                [0, 0, i, j, 0, 0], [n_, c_, 1, 1, oh, ow]))
            cols = self.collapse(patches, patches_t, cols_t, [[0], [1, 2, 3], [4, 5]])
        wmat_t = TensorType((o, depth), dt)
        wmat = self.collapse(self.name(w), w.type, wmat_t, [[0], [1, 2, 3]])
        if n_ == 1:
            c2_t = TensorType((depth, pixels), dt)
            cols2 = self.collapse(cols, cols_t, c2_t, [[0, 1], [2]])
            mm_t = TensorType((o, pixels), dt)
            init = self.filled(mm_t, 0.0)
            mm = self.fresh("mm")
            self.emit(f"{mm} = linalg.matmul ins({wmat}, {cols2} : {mlir_type(wmat_t)}, {mlir_type(c2_t)}) "
                      f"outs({init} : {mlir_type(mm_t)}) -> {mlir_type(mm_t)}")
            self.names[out.id] = self.expand(mm, mm_t, out.type, [[0, 1], [2, 3]])
            return
        wb_t = TensorType((n_, o, depth), dt)
        wb = self.fresh("wb")
        self.emit(f"{wb} = linalg.broadcast ins({wmat} : {mlir_type(wmat_t)}) outs({self.empty(wb_t)} : "
                  f"{mlir_type(wb_t)}) dimensions = [0]")
        mm_t = TensorType((n_, o, pixels), dt)
        init = self.filled(mm_t, 0.0)
        mm = self.fresh("mm")
        self.emit(f"{mm} = linalg.batch_matmul ins({wb}, {cols} : {mlir_type(wb_t)}, {mlir_type(cols_t)}) "
                  f"outs({init} : {mlir_type(mm_t)}) -> {mlir_type(mm_t)}")
        self.names[out.id] = self.expand(mm, mm_t, out.type, [[0], [1], [2, 3]])

    def patches(self, xname: str, xt: TensorType, patches_t: TensorType, kh: int, kw: int, where: Any) -> str:
        """im2col as one strided slice of the input per kernel tap, inserted into the patch tensor.

        Slices rather than a gather-like ``linalg.generic``: elementwise fusion would fold such a
        generic into the contraction that consumes it, turning the matmul back into a conv loop nest."""
        acc = self.empty(patches_t)
        for i in range(kh):
            for j in range(kw):
                off, size, stride, ins_off, ins_size = where(i, j)
                tap_t = TensorType(tuple(size), xt.dtype)
                tap = self.fresh("tap")
                self.emit(f"{tap} = tensor.extract_slice {xname}[{', '.join(map(str, off))}] "
                          f"[{', '.join(map(str, size))}] [{', '.join(map(str, stride))}] : "
                          f"{mlir_type(xt)} to {mlir_type(tap_t)}")
                nxt = self.fresh("im2col")
                self.emit(f"{nxt} = tensor.insert_slice {tap} into {acc}[{', '.join(map(str, ins_off))}] "
                          f"[{', '.join(map(str, ins_size))}] [{', '.join('1' * len(ins_size))}] : "
                          f"{mlir_type(tap_t)} into {mlir_type(patches_t)}")
                acc = nxt
        return acc

    def collapse(self, src: str, src_t: TensorType, dst_t: TensorType, reassoc: list[list[int]]) -> str:
        if src_t.shape == dst_t.shape:
            return src
        name = self.fresh("cl")
        self.emit(f"{name} = tensor.collapse_shape {src} {_reassoc(reassoc)} : {mlir_type(src_t)} into "
                  f"{mlir_type(dst_t)}")
        return name

    def expand(self, src: str, src_t: TensorType, dst_t: TensorType, reassoc: list[list[int]]) -> str:
        if src_t.shape == dst_t.shape:
            return src
        name = self.fresh("e")
        self.emit(f"{name} = tensor.expand_shape {src} {_reassoc(reassoc)} output_shape "
                  f"[{', '.join(map(str, dst_t.shape))}] : {mlir_type(src_t)} into {mlir_type(dst_t)}")
        return name

    def op_transpose(self, node: Node) -> None:
        (x,) = node.inputs
        init = self.empty(node.out.type)
        name = self.fresh("t")
        perm = ", ".join(map(str, node.attrs["perm"]))
        self.emit(f"{name} = linalg.transpose ins({self.name(x)} : {mlir_type(x.type)}) "
                  f"outs({init} : {mlir_type(node.out.type)}) permutation = [{perm}]")
        self.names[node.out.id] = name

    def op_reshape(self, node: Node) -> None:
        # Any static reshape is a collapse to 1-D followed by an expand; both are views after bufferization.
        (x,) = node.inputs
        src, t = self.name(x), x.type
        flat = TensorType((t.size,), t.dtype)
        if t.rank == 0:
            src = self.expand(src, t, flat, [])
        elif t.rank > 1:
            name = self.fresh("flat")
            self.emit(f"{name} = tensor.collapse_shape {src} {_reassoc([list(range(t.rank))])} : "
                      f"{mlir_type(t)} into {mlir_type(flat)}")
            src = name
        o = node.out.type
        if o.rank == 0:
            name = self.fresh("r")
            self.emit(f"{name} = tensor.collapse_shape {src} [] : {mlir_type(flat)} into {mlir_type(o)}")
            src = name
        elif o.rank > 1:
            src = self.expand(src, flat, o, [list(range(o.rank))])
        self.names[node.out.id] = src

    def op_slice(self, node: Node) -> None:
        # A strided tensor.extract_slice: a view after bufferization, copied only where a result needs it.
        (x,) = node.inputs
        out = node.out
        name = self.fresh("sl")
        self.emit(f"{name} = tensor.extract_slice {self.name(x)}[{', '.join(map(str, node.attrs['starts']))}] "
                  f"[{', '.join(map(str, out.shape))}] [{', '.join(map(str, node.attrs['steps']))}] : "
                  f"{mlir_type(x.type)} to {mlir_type(out.type)}")
        self.names[out.id] = name

    def op_concat(self, node: Node) -> None:
        # Each operand inserted at its offset along the axis into one destination tensor.
        axis = node.attrs["axis"]
        out_t = node.out.type
        dest = self.empty(out_t)
        offset = 0
        for v in node.inputs:
            offsets = ", ".join(str(offset) if i == axis else "0" for i in range(out_t.rank))
            sizes = ", ".join(map(str, v.shape))
            name = self.fresh("cat")
            self.emit(f"{name} = tensor.insert_slice {self.name(v)} into {dest}[{offsets}] [{sizes}] "
                      f"[{', '.join(['1'] * out_t.rank)}] : {mlir_type(v.type)} into {mlir_type(out_t)}")
            dest = name
            offset += v.shape[axis]
        self.names[node.out.id] = dest

    def op_take(self, node: Node) -> None:
        # Loops over the output; the index operand is read elementwise, clipped to [0, n-1] in floating
        # point (maxnumf turns NaN into 0), converted, and used to extract from the table.
        table, idx = node.inputs
        axis = node.attrs["axis"]
        out = node.out
        rank, k = len(out.shape), len(idx.shape)
        loops = _dims(rank)
        it = idx.dtype
        body = [f"%i{d} = linalg.index {d} : index" for d in range(rank) if not axis <= d < axis + k]
        body += [f"%lo = arith.constant 0.0 : {it}",
                 f"%hi = arith.constant {self.scalar_literal(float(table.shape[axis] - 1), it)} : {it}",
                 f"%c0 = arith.maxnumf %in0, %lo : {it}", f"%c1 = arith.minnumf %c0, %hi : {it}",
                 f"%n = arith.fptosi %c1 : {it} to i64", "%ix = arith.index_cast %n : i64 to index"]
        coords = [f"%i{d}" for d in range(axis)] + ["%ix"] + [f"%i{d + k - 1}" for d in range(axis + 1, table.type.rank)]
        body.append(f"%r = tensor.extract {self.name(table)}[{', '.join(coords)}] : {mlir_type(table.type)}")
        self.generic(out=out, ins=[(self.name(idx), idx.type, loops[axis:axis + k])], init=self.empty(out.type),
                     out_results=loops, n_loops=rank, iterators=["parallel"] * rank, body=body)


def _reassoc(groups: list[list[int]]) -> str:
    return "[" + ", ".join("[" + ", ".join(map(str, g)) + "]" for g in groups) + "]"


def _method(op: str) -> str:
    if op.startswith("reduce_"):
        return "reduce"
    if op in ("const", "cast", "broadcast", "matmul", "conv2d", "transpose", "reshape", "slice", "concat", "take"):
        return op
    return "elementwise"


_BITS = {"f64": 64, "f32": 32, "f16": 16, "bf16": 16}


def _convert(src: str, src_dtype: str, dst_dtype: str, dst: str) -> list[str]:
    """Float conversion ``dst = src`` from one float dtype to another (nothing when they are equal)."""
    if src_dtype == dst_dtype:
        return []
    op = "arith.extf" if _BITS[src_dtype] < _BITS[dst_dtype] else "arith.truncf"
    return [f"{dst} = {op} {src} : {src_dtype} to {dst_dtype}"]


def _mac_body(a_dtype: str, b_dtype: str, acc: str) -> list[str]:
    body, ops = [], []
    for i, dt in enumerate((a_dtype, b_dtype)):
        if dt != acc:
            body.append(f"%x{i} = arith.extf %in{i} : {dt} to {acc}")
            ops.append(f"%x{i}")
        else:
            ops.append(f"%in{i}")
    body += [f"%p = arith.mulf {ops[0]}, {ops[1]} : {acc}", f"%r = arith.addf %acc, %p : {acc}"]
    return body


def _scalar_body(node: Node, x: list[str], t: str) -> list[str]:
    """Scalar code of an elementwise node in dtype ``t``; defines %y last."""
    op = node.op
    simple = {"add": "arith.addf", "sub": "arith.subf", "mul": "arith.mulf", "div": "arith.divf",
              "maximum": "arith.maximumf", "minimum": "arith.minimumf", "pow": "math.powf"}
    if op in simple:
        return [f"%y = {simple[op]} {x[0]}, {x[1]} : {t}"]
    unary = {"neg": "arith.negf", "exp": "math.exp", "log": "math.log", "tanh": "math.tanh",
             "erf": "math.erf", "sqrt": "math.sqrt", "rsqrt": "math.rsqrt", "abs": "math.absf"}
    if op in unary:
        return [f"%y = {unary[op]} {x[0]} : {t}"]
    if op in ("cast", "broadcast"):  # the (converted) operand itself
        return []
    if op == "relu":
        return [f"%zero = arith.constant 0.0 : {t}", f"%y = arith.maximumf {x[0]}, %zero : {t}"]
    if op == "sigmoid":
        return [f"%one = arith.constant 1.0 : {t}", f"%n = arith.negf {x[0]} : {t}", f"%e = math.exp %n : {t}",
                f"%d = arith.addf %one, %e : {t}", f"%y = arith.divf %one, %d : {t}"]
    if op == "gelu":  # 0.5 * x * (1 + erf(x / sqrt(2)))
        return [f"%half = arith.constant 0.5 : {t}", f"%one = arith.constant 1.0 : {t}",
                f"%is2 = arith.constant {1 / math.sqrt(2):.17e} : {t}", f"%s = arith.mulf {x[0]}, %is2 : {t}",
                f"%e = math.erf %s : {t}", f"%p = arith.addf %one, %e : {t}", f"%h = arith.mulf {x[0]}, %half : {t}",
                f"%y = arith.mulf %h, %p : {t}"]
    if op == "gelu_tanh":  # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))
        return [f"%half = arith.constant 0.5 : {t}", f"%one = arith.constant 1.0 : {t}",
                f"%c = arith.constant {math.sqrt(2 / math.pi):.17e} : {t}", f"%k = arith.constant 0.044715 : {t}",
                f"%x2 = arith.mulf {x[0]}, {x[0]} : {t}", f"%x3 = arith.mulf %x2, {x[0]} : {t}",
                f"%kx3 = arith.mulf %k, %x3 : {t}", f"%in = arith.addf {x[0]}, %kx3 : {t}",
                f"%s = arith.mulf %c, %in : {t}", f"%th = math.tanh %s : {t}", f"%p = arith.addf %one, %th : {t}",
                f"%h = arith.mulf {x[0]}, %half : {t}", f"%y = arith.mulf %h, %p : {t}"]
    compare = {"equal": "oeq", "not_equal": "une", "less": "olt", "less_equal": "ole", "greater": "ogt",
               "greater_equal": "oge"}
    if op in compare:  # a 0/1 mask; "not_equal" is true for NaN, the others false (IEEE, as numpy)
        return [f"%c = arith.cmpf {compare[op]}, {x[0]}, {x[1]} : {t}", f"%one = arith.constant 1.0 : {t}",
                f"%zero = arith.constant 0.0 : {t}", f"%y = arith.select %c, %one, %zero : {t}"]
    if op == "select":  # where(x0 != 0, x1, x2)
        return [f"%zero = arith.constant 0.0 : {t}", f"%c = arith.cmpf une, {x[0]}, %zero : {t}",
                f"%y = arith.select %c, {x[1]}, {x[2]} : {t}"]
    raise UnsupportedError(f"no scalar lowering for '{op}'", op=op)


def emit_graph(graph: Graph, *, func_name: str = "main", spec: Any = None,
               options: Options | Mapping[str, Any] | None = None, forms: Sequence[str] | None = None) -> str:
    """The graph as MLIR text: one public ``func.func`` taking and returning static-shaped tensors.

    With a ``spec``, attention patterns the planner fuses (`pbsdk.core.ir.attention`,
    option ``fuse_attention``, default True) become one fused kernel each, in one of ``forms``
    (the target's `attention_forms`; None: any)."""
    if not graph.outputs:
        raise UnsupportedError("the traced function returns no tensors")
    fused: list[Any] = []
    if spec is not None and as_options(options).fuse_attention:
        from pbsdk.core.ir.attention import planned_attention
        from pbsdk.core.plan.attention import FORMS

        fused = [(m, p) for m, p in planned_attention(graph, spec, options, forms=FORMS if forms is None else forms)
                 if p.fused]
    return _Emitter(graph, func_name, fused).run()
