"""Stage ``direct-conv``: channels-last convolutions the planner sends to a direct kernel, to register-tiled
vector FMA loops.

Where `pbsdk.core.plan.direct_conv.plan_conv_route` finds a direct kernel cheaper than a contraction (narrow
groups, few input channels), `pbsdk.core.ir.emit` builds the convolution as one ``linalg.generic`` with
loops (n, oh, ow, g, o, kh, kw, c) over the padded NHWC input viewed as (N, Hp, Wp, G, CG), the weights as
(KH, KW, CG, G, OG) and the output as (N, OH, OW, G, OG). This stage recognises that op on buffers
(`pbsdk.core.plan.direct_conv.direct_conv_geometry`, from the loop nest
`pbsdk.core.passes.promote_vector.analyse` reads; the input in any dimension order — an NCHW graph input
whose layout transpose ``fuse`` folded into the kernel's reads is read where it lies, a value at a time) and
replaces it by a call of
``@__pbsdk_conv<N>(x, w, out, part)`` that, per output row of its part, per group and per register tile of
adjacent output pixels (`pbsdk.core.plan.direct_conv.direct_conv_tile`):

- starts the tile's accumulators at zero where the output's zero fill comes right before (and drops the
  fill; `zero_fill_before`), else loads them from the output,
- per kernel row, kernel column and input channel of the group (loops, none unrolled): loads the group's
  weight vectors once and, per pixel of the tile, broadcasts one input value and multiply-adds it into
  that pixel's accumulators,
- stores the accumulators once.

A group narrower than the vector uses a shorter vector (8 channels: 8 lanes); a width that is no multiple
of the vector length, masked loads and stores on its last vector. The output rows (n, oh) are split over
the cores (``scf.forall`` of calls, lowered by ``lower-parallel``) when there is enough work. Only f32 with
a vector FMA unit; anything else stays for the generic lowering.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from mlir import ir
from mlir.dialects import arith, func, memref, scf, vector

from pbsdk.core.ir.builder import call_parts, zero_vector
from pbsdk.core.passes import defining_op, identity_layout, ops_named
from pbsdk.core.passes.promote import is_mac
from pbsdk.core.passes.promote_vector import analyse
from pbsdk.core.plan.direct_conv import DirectConv, DirectConvTile, direct_conv_geometry, direct_conv_tile

#: Least multiply-adds worth a thread of their own.
MIN_MACS_PER_THREAD = 1 << 16
PREFIX = "__pbsdk_conv"


def _index(v: int) -> ir.Value:
    return arith.ConstantOp(ir.IndexType.get(), v).result


def _add(a: ir.Value, b: int | ir.Value) -> ir.Value:
    if isinstance(b, int):
        if b == 0:
            return a
        b = _index(b)
    return arith.AddIOp(a, b).result


def _mul(a: ir.Value, b: int) -> ir.Value:
    return a if b == 1 else arith.MulIOp(a, _index(b)).result


def _loop(lo: int, hi: int, step: int, carried: list[ir.Value],
          body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """An ``scf.for`` from ``lo`` to ``hi`` carrying ``carried`` (the accumulators) through ``body(iv, acc)``."""
    loop = scf.ForOp(_index(lo), _index(hi), _index(step), carried)
    with ir.InsertionPoint(loop.body):
        scf.YieldOp(body(loop.induction_variable, list(loop.inner_iter_args)))
    return list(loop.results)


@dataclasses.dataclass(frozen=True)
class _Kernel:
    """Builds one direct kernel function's body (the geometry and tile are fixed; all sizes static)."""

    g: DirectConv
    tile: DirectConvTile
    vtype: ir.VectorType
    mask: ir.Value | None  # the last vector's mask (a group width that is no multiple of the lanes)
    zero: ir.Value | None  # the masked loads' pass-through
    start: ir.Value | None  # the accumulators' start (zeros) when the output's zero fill was dropped

    def load(self, buf: ir.Value, indices: list[ir.Value], v: int) -> ir.Value:
        if self.mask is not None and v == self.tile.vectors - 1:
            return vector.MaskedLoadOp(self.vtype, buf, indices, self.mask, self.zero).result
        return vector.LoadOp(self.vtype, buf, indices).result

    def store(self, value: ir.Value, buf: ir.Value, indices: list[ir.Value], v: int) -> None:
        if self.mask is not None and v == self.tile.vectors - 1:
            vector.MaskedStoreOp(buf, indices, self.mask, value)
        else:
            vector.StoreOp(value, buf, indices)

    def pixels(self, x: ir.Value, w: ir.Value, out: ir.Value, n: ir.Value, oh: ir.Value, grp: ir.Value,
               ow0: ir.Value, width: int) -> None:
        """One register tile: output pixels ``ow0 .. ow0 + width - 1`` of row (n, oh), group ``grp``."""
        g, t = self.g, self.tile
        vl, nv = t.lanes, t.vectors
        outs = [[n, oh, _add(ow0, r), grp, _index(v * vl)] for r in range(width) for v in range(nv)]
        accs = [self.start if self.start is not None else self.load(out, ix, i % nv) for i, ix in enumerate(outs)]
        ih0 = _mul(oh, g.sh)
        iw0 = _mul(ow0, g.sw)

        def channel(kh: ir.Value, ih: ir.Value, kw: ir.Value, iw: ir.Value, c: ir.Value,
                    acc: list[ir.Value]) -> list[ir.Value]:
            # One input channel: the group's weight vectors, then per pixel one broadcast input value
            # into its accumulators.
            acc = list(acc)
            wv = [self.load(w, [kh, kw, c, grp, _index(v * vl)], v) for v in range(nv)]
            for r in range(width):
                at = {"n": n, "h": ih, "w": _add(iw, r * g.sw), "g": grp, "c": c}
                xs = memref.LoadOp(x, [at[d] for d in g.x_order]).result
                xb = vector.BroadcastOp(self.vtype, xs).result
                for v in range(nv):
                    acc[r * nv + v] = vector.FMAOp(xb, wv[v], acc[r * nv + v]).result
            return acc

        def column(kh: ir.Value, ih: ir.Value, kw: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
            iw = _add(iw0, _mul(kw, g.dw))
            if g.cg == 1:
                return channel(kh, ih, kw, iw, _index(0), acc)
            return _loop(0, g.cg, 1, acc, lambda c, a: channel(kh, ih, kw, iw, c, a))

        def row(kh: ir.Value, acc: list[ir.Value]) -> list[ir.Value]:
            ih = _add(ih0, _mul(kh, g.dh))
            return _loop(0, g.kw, 1, acc, lambda kw, a: column(kh, ih, kw, a))

        result = _loop(0, g.kh, 1, accs, row)
        for i, ix in enumerate(outs):
            self.store(result[i], out, ix, i % nv)

    def row(self, x: ir.Value, w: ir.Value, out: ir.Value, n: ir.Value, oh: ir.Value, grp: ir.Value) -> None:
        """Every tile of row (n, oh) for group ``grp``."""
        g, t = self.g, self.tile
        main = g.ow - t.tail
        if main:
            loop = scf.ForOp(_index(0), _index(main), _index(t.width))
            with ir.InsertionPoint(loop.body):
                self.pixels(x, w, out, n, oh, grp, loop.induction_variable, t.width)
                scf.YieldOp([])
        if t.tail:
            self.pixels(x, w, out, n, oh, grp, _index(main), t.tail)


def zero_fill_before(op: ir.Operation) -> ir.Operation | None:
    """The ``linalg.fill`` of 0.0 into ``op``'s output (its operand 2) right before ``op`` in its block, or
    None. A kernel that stores every output element once can start its accumulators at zero and drop that
    fill: a pass over the whole output (8 MB for 16 channels of 128 32x32 images) less."""
    ops = [o.operation for o in op.block.operations]
    at = ops.index(op)
    if at == 0:
        return None
    fill = ops[at - 1]
    if fill.name != "linalg.fill" or len(fill.operands) != 2 or fill.operands[1] != op.operands[2]:
        return None
    value = defining_op(fill.operands[0])
    if value is None or value.name != "arith.constant":
        return None
    attr = value.attributes["value"]
    return fill if isinstance(attr, ir.FloatAttr) and ir.FloatAttr(attr).value == 0.0 else None


def _rows_contiguous(t: ir.Type) -> bool:
    """A memref with static strides and offset whose innermost stride is 1."""
    if not isinstance(t, ir.MemRefType):
        return False
    m = ir.MemRefType(t)
    if identity_layout(m):
        return True
    strides, offset = m.get_strides_and_offset()
    dynamic = ir.ShapedType.get_dynamic_stride_or_offset()
    return strides[-1] == 1 and dynamic not in strides and offset != dynamic


def _threads(g: DirectConv, cores: int, threads_opt: int) -> int:
    return max(1, min(threads_opt or cores, g.n * g.oh, g.macs // MIN_MACS_PER_THREAD))


def _build(module: ir.Module, name: str, op: ir.Operation, g: DirectConv, tile: DirectConvTile, parts: int,
           zero_start: bool) -> None:
    """Define ``@name(x, w, out, part)`` at the end of ``module``: part ``p`` of ``parts`` computes output
    rows ``[p * per, min((p + 1) * per, n * oh))`` of the flattened (n, oh); its accumulators start at zero
    (``zero_start``) or at the output's values."""
    x, w, out = (op.operands[i] for i in range(3))
    idx = ir.IndexType.get()
    with ir.InsertionPoint(module.body):
        fn = func.FuncOp(name, ir.FunctionType.get([x.type, w.type, out.type, idx], []))
        entry = fn.add_entry_block()
    et = ir.MemRefType(out.type).element_type
    vtype = ir.VectorType.get([tile.lanes], et)
    with ir.InsertionPoint(entry):
        xa, wa, oa, part = entry.arguments
        mask = None
        zero = zero_vector(vtype)
        if tile.masked:
            mask = vector.ConstantMaskOp(ir.VectorType.get([tile.lanes], ir.IntegerType.get_signless(1)),
                                         [tile.masked]).result
        k = _Kernel(g, tile, vtype, mask, zero, zero if zero_start else None)
        rows = g.n * g.oh
        per = -(-rows // parts)
        lo = _mul(part, per)
        hi = arith.MinSIOp(_add(lo, per), _index(rows)).result
        loop = scf.ForOp(lo, hi, _index(1))
        with ir.InsertionPoint(loop.body):
            r = loop.induction_variable
            n = arith.DivUIOp(r, _index(g.oh)).result
            oh = arith.RemUIOp(r, _index(g.oh)).result
            groups = scf.ForOp(_index(0), _index(g.groups), _index(1))
            with ir.InsertionPoint(groups.body):
                k.row(xa, wa, oa, n, oh, groups.induction_variable)
                scf.YieldOp([])
            scf.YieldOp([])
        func.ReturnOp([])


def replace_mac_nests(module: ir.Module, ctx: Any, prefix: str, match: Callable[[ir.Operation], Any],
                      tile_of: Callable[[int, int, Any], Any], parts_of: Callable[[Any, int, int], int],
                      build: Callable[..., None]) -> None:
    """Replace every f32 ``linalg.generic`` that ``match`` turns into a geometry by a call of its own kernel
    function (``build(module, name, op, geometry, tile, parts, zero_start)``, named ``prefix`` and a count),
    its rows split over ``parts_of(geometry, cores, threads)`` cores; a zero fill of the output right before
    it is dropped and the kernel starts from zero. Nothing where the spec has no f32 vector FMA."""
    vec = ctx.spec.vector
    if vec is None or not vec.fma or "f32" not in vec.dtypes:
        return
    cores, threads_opt = ctx.spec.compute[0].count, ctx.options.threads
    count = 0
    with module.context, ir.Location.unknown():
        for op in ops_named(module, "linalg.generic"):
            found = match(op)
            if found is None:
                continue
            tile = tile_of(vec.registers, vec.lanes("f32"), found)
            parts = parts_of(found, cores, threads_opt)
            name = f"{prefix}{count}"
            count += 1
            fill = zero_fill_before(op)
            build(module, name, op, found, tile, parts, fill is not None)
            if fill is not None:
                fill.erase()
            with ir.InsertionPoint(op):
                call_parts(name, [op.operands[i] for i in range(3)], parts)
            op.erase()


@dataclasses.dataclass(frozen=True)
class DirectConvKernels:
    """Replace every channels-last convolution loop nest (n, oh, ow, g, o, kh, kw, c) on f32 buffers with
    static layouts whose innermost dimension is contiguous by a call of a register-tiled vector FMA kernel (module docstring), its rows split over the
    cores."""

    name = "direct-conv"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        replace_mac_nests(module, ctx, PREFIX, self._match, direct_conv_tile, _threads, _build)

    @staticmethod
    def _match(op: ir.Operation) -> DirectConv | None:
        # Any static layout whose innermost dimension is contiguous (the vector loads and stores run along
        # it): a weight sliced per output phase of a transposed convolution is a strided view.
        if len(op.operands) != 3 or not all(_rows_contiguous(v.type) for v in op.operands):
            return None
        vop = analyse(op)
        if vop is None or any(a.dtype != "f32" for a in vop.operands) or not is_mac(op.regions[0].blocks[0]):
            return None
        return direct_conv_geometry(vop.extents, vop.iterators, [a.dims for a in vop.operands])
