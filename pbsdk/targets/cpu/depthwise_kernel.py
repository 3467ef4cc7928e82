"""Stage ``depthwise``: channels-last depthwise convolutions to register-tiled vector FMA loops.

`pbsdk.core.ir.emit` builds a depthwise convolution that runs channels last as one ``linalg.generic`` with
loops (n, oh, ow, kh, kw, c). Lowered as it is, the innermost loop is one vector of channels that loads,
multiplies and stores the output at every tap. This stage recognises that op on buffers
(`pbsdk.core.plan.window.depthwise_geometry`, from the loop nest `pbsdk.core.passes.promote_vector.analyse`
reads) and replaces it by a call of ``@__pbsdk_dw<N>(x, w, out, part)`` that, per output row of its part,
per vector of channels and per register tile of adjacent output pixels (`depthwise_tile`):

- starts the tile's accumulators at zero where the output's zero fill comes right before (and drops the
  fill; `pbsdk.targets.cpu.direct_conv_kernel.zero_fill_before`), else loads them from the output,
- per kernel row (a loop) and kernel column (unrolled): loads one weight vector and, per pixel of the tile,
  one input vector, and multiply-adds them into that pixel's accumulator,
- stores the accumulators once.

The last ``c % lanes`` channels go through masked loads and stores; a row's last pixels that do not fill a
tile through a narrower one. The output rows (n, oh) are split over the cores like the other kernels'
parts (``scf.forall`` of calls, lowered by ``lower-parallel``) when there is enough work. Only f32 with a
vector FMA unit; anything else stays for the generic lowering.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import arith, func, scf, vector

from pbsdk.core.ir.builder import zero_vector
from pbsdk.core.passes import identity_layout
from pbsdk.core.passes.promote import is_mac
from pbsdk.core.passes.promote_vector import analyse
from pbsdk.core.plan.window import DepthwiseGeometry, DepthwiseTile, depthwise_geometry, depthwise_tile
from pbsdk.targets.cpu.direct_conv_kernel import replace_mac_nests

#: Least multiply-adds worth a thread of their own.
MIN_MACS_PER_THREAD = 1 << 16
PREFIX = "__pbsdk_dw"


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


@dataclasses.dataclass(frozen=True)
class _Kernel:
    """Builds one depthwise kernel function's body (the geometry and tile are fixed; all sizes static)."""

    g: DepthwiseGeometry
    tile: DepthwiseTile
    vtype: ir.Type
    mask: ir.Value | None  # the channel tail's mask, built at the function's entry
    zero: ir.Value | None  # the masked loads' pass-through
    start: ir.Value | None  # the accumulators' start (zeros) when the output's zero fill was dropped

    def load(self, buf: ir.Value, indices: list[ir.Value], masked: bool) -> ir.Value:
        if masked:
            return vector.MaskedLoadOp(self.vtype, buf, indices, self.mask, self.zero).result
        return vector.LoadOp(self.vtype, buf, indices).result

    def store(self, value: ir.Value, buf: ir.Value, indices: list[ir.Value], masked: bool) -> None:
        if masked:
            vector.MaskedStoreOp(buf, indices, self.mask, value)
        else:
            vector.StoreOp(value, buf, indices)

    def pixels(self, x: ir.Value, w: ir.Value, out: ir.Value, n: ir.Value, oh: ir.Value, c0: ir.Value,
               ow0: ir.Value, width: int, masked: bool) -> None:
        """One register tile: output pixels ``ow0 .. ow0 + width - 1`` of row (n, oh), channels from ``c0``."""
        g = self.g
        outs = [[n, oh, _add(ow0, r), c0] for r in range(width)]
        accs = [self.start if self.start is not None else self.load(out, ix, masked) for ix in outs]
        ih0 = _mul(oh, g.sh)
        iw0 = _mul(ow0, g.sw)
        rows = scf.ForOp(_index(0), _index(g.kh), _index(1), accs)
        with ir.InsertionPoint(rows.body):
            kh = rows.induction_variable
            ih = _add(ih0, _mul(kh, g.dh))
            acc = list(rows.inner_iter_args)
            for kw in range(g.kw):
                wv = self.load(w, [kh, _index(kw), c0], masked)
                for r in range(width):
                    xv = self.load(x, [n, ih, _add(iw0, r * g.sw + kw * g.dw), c0], masked)
                    acc[r] = vector.FMAOp(xv, wv, acc[r]).result
            scf.YieldOp(acc)
        for r, ix in enumerate(outs):
            self.store(rows.results[r], out, ix, masked)

    def channels(self, x: ir.Value, w: ir.Value, out: ir.Value, n: ir.Value, oh: ir.Value, c0: ir.Value,
                 masked: bool) -> None:
        """Every tile of row (n, oh) for the channel vector at ``c0``."""
        g, t = self.g, self.tile
        main = g.ow - t.tail
        if main:
            loop = scf.ForOp(_index(0), _index(main), _index(t.width))
            with ir.InsertionPoint(loop.body):
                self.pixels(x, w, out, n, oh, c0, loop.induction_variable, t.width, masked)
                scf.YieldOp([])
        if t.tail:
            self.pixels(x, w, out, n, oh, c0, _index(main), t.tail, masked)


def _threads(g: DepthwiseGeometry, cores: int, threads_opt: int) -> int:
    macs = g.n * g.oh * g.ow * g.kh * g.kw * g.c
    return max(1, min(threads_opt or cores, g.n * g.oh, macs // MIN_MACS_PER_THREAD))


def _build(module: ir.Module, name: str, op: ir.Operation, g: DepthwiseGeometry, tile: DepthwiseTile,
           parts: int, zero_start: bool) -> None:
    """Define ``@name(x, w, out, part)`` at the end of ``module``: part ``p`` of ``parts`` computes output
    rows ``[p * per, min((p + 1) * per, n * oh))`` of the flattened (n, oh)."""
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
        if tile.masked_channels:
            mask = vector.ConstantMaskOp(ir.VectorType.get([tile.lanes], ir.IntegerType.get_signless(1)),
                                         [tile.masked_channels]).result
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
            full = g.c - tile.masked_channels
            if full:
                cl = scf.ForOp(_index(0), _index(full), _index(tile.lanes))
                with ir.InsertionPoint(cl.body):
                    k.channels(xa, wa, oa, n, oh, cl.induction_variable, False)
                    scf.YieldOp([])
            if tile.masked_channels:
                k.channels(xa, wa, oa, n, oh, _index(full), True)
            scf.YieldOp([])
        func.ReturnOp([])


@dataclasses.dataclass(frozen=True)
class DepthwiseKernels:
    """Replace every channels-last depthwise convolution (f32, identity-layout buffers) by a call of a
    register-tiled vector FMA kernel (module docstring), its rows split over the cores."""

    name = "depthwise"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        replace_mac_nests(module, ctx, PREFIX, self._match, depthwise_tile, _threads, _build)

    @staticmethod
    def _match(op: ir.Operation) -> DepthwiseGeometry | None:
        if len(op.operands) != 3 or not all(identity_layout(v.type) for v in op.operands):
            return None
        vop = analyse(op)
        if vop is None or any(a.dtype != "f32" for a in vop.operands) or not is_mac(op.regions[0].blocks[0]):
            return None
        return depthwise_geometry(vop.extents, vop.iterators, [a.dims for a in vop.operands])
