"""The cpu target's lowering of a matrix unit with tile registers of its own (``MatrixUnit.registers ==
"tile"``: Intel AMX, ``tdpbf16ps`` bf16 -> f32 and ``tdpbssd`` i8 -> i32, 16 x 16 accumulators, k 32/64).

The loop nest, the thread split, B's packing and the C update with its epilogue are the unit kernel's
(`pbsdk.targets.cpu.unit_kernel`): B packed into panels of ``nr = 32`` columns whose rows are groups of
32 bits of k interleaved (the "VNNI" layout AMX's B tile reads: one tile row is a group of 16 columns), A
packed in tiles (each step's 16 rows x 64 bytes together, `TileKernel.pack_a_panel`), zero past K and
clamped past the part's last row (a tile load reads 16 whole rows). What differs is the micro-kernel: a 32 x 32 register tile is 2 x 2 accumulator tiles; each
step of k loads 2 tiles of A (16 rows x k) and 2 of B (k x 16 columns) and issues 4 tile products; the
steps are a loop that carries the 4 accumulators as values (the lowering converts branches with tile
operands through the ``amx`` dialect's type conversion, so LLVM keeps them in tile registers), and the 4
accumulators go through ``Tp`` to the C update.

The tile operations (`TileOps`) are built by `AmxTiles` (the ``amx`` dialect: ``amx.tile_load``,
``tile_mulf``/``tile_muli``, ``tile_store``, lowered to LLVM's AMX intrinsics with the ``enable-amx``
vector lowering) or, on a machine without AMX, by `EmulatedTiles` (host buffers and loops with the
instructions' arithmetic), which checks everything but the instructions themselves: packing, addressing,
edges and the C update. Linux grants a process AMX's tile state on request (`request_amx`), which the
executable does before its first call.
"""

from __future__ import annotations

import ctypes
import functools
from collections.abc import Callable
from typing import Protocol

from mlir import ir
from mlir.dialects import arith, func, memref, vector

from pbsdk.core.ir.builder import for_each as _for
from pbsdk.core.ir.builder import for_values, if_values, reassociation
from pbsdk.core.ir.builder import if_then as _if
from pbsdk.core.plan.contraction import Blocking
from pbsdk.targets.cpu.matmul_kernel import Window
from pbsdk.targets.cpu.unit_kernel import StepFn, UnitEpilogue, UnitShape, _UnitKernel

#: Rows of a tile and accumulator columns of one instruction (AMX: 16 x 16, 64-byte tile rows).
TILE = 16
#: Slots of the 8 tile registers: 4 accumulators, 2 of A, 2 of B.
ACC, A_TILES, B_TILES = (0, 1, 2, 3), (4, 5), (6, 7)


class TileOps(Protocol):
    """Tile registers addressed by slot (0..7), built at the insertion point."""

    def zero(self, slot: int) -> None: ...

    def load(self, slot: int, source: ir.Value, at: list[ir.Value]) -> None: ...

    def mul(self, acc: int, a: int, b: int) -> None: ...

    def store(self, slot: int, dest: ir.Value, at: list[ir.Value]) -> None: ...

    def carried(self, slots: tuple[int, ...]) -> list[ir.Value]:
        """The values a loop over k carries for ``slots`` (none where the slots are buffers)."""
        ...

    def branch(self, cond: ir.Value, then: Callable[[], list[ir.Value]],
               otherwise: Callable[[], list[ir.Value]]) -> list[ir.Value]:
        """``then`` or ``otherwise`` (each fills the accumulators and returns `carried` of them) by ``cond``;
        the accumulators' values after it."""
        ...

    def restore(self, slots: tuple[int, ...], values: list[ir.Value]) -> None:
        """Take ``values`` (a loop's carried values or results, as `carried` gave them) as the slots'."""
        ...


def _discard(values: list[ir.Value]) -> None:
    """A branch builder's values dropped (`EmulatedTiles.branch`: the slots are buffers, nothing is carried)."""


def _tile_type(rows: int, cols: int, t: ir.Type) -> ir.Type:
    """``!amx.tile<rows x cols x t>`` (the bindings have no class for the amx dialect's type)."""
    return ir.Type.parse(f"!amx.tile<{rows}x{cols}x{t}>")


def _segments(*sizes: int) -> ir.Attribute:
    return ir.DenseI32ArrayAttr.get(list(sizes))


class AmxTiles:
    """`TileOps` as the ``amx`` dialect's ops on tile values (slots hold the current value)."""

    def __init__(self, operand: ir.Type, acc: ir.Type, k: int, u: int) -> None:
        self.acc_t = _tile_type(TILE, TILE, acc)
        self.a_t = _tile_type(TILE, k, operand)
        self.b_t = _tile_type(k // u, TILE * u, operand)
        self.floats = isinstance(acc, ir.FloatType)
        self.values: dict[int, ir.Value] = {}

    def zero(self, slot: int) -> None:
        self.values[slot] = ir.Operation.create("amx.tile_zero", results=[self.acc_t]).result

    def branch(self, cond: ir.Value, then: Callable[[], list[ir.Value]],
               otherwise: Callable[[], list[ir.Value]]) -> list[ir.Value]:
        return if_values(cond, [self.acc_t] * len(ACC), then, otherwise)

    def load(self, slot: int, source: ir.Value, at: list[ir.Value]) -> None:
        t = self.acc_t if slot in ACC else self.a_t if slot in A_TILES else self.b_t
        self.values[slot] = ir.Operation.create("amx.tile_load", results=[t], operands=[source, *at],
                                                attributes={"operandSegmentSizes": _segments(1, len(at), 0)}).result

    def mul(self, acc: int, a: int, b: int) -> None:
        name = "amx.tile_mulf" if self.floats else "amx.tile_muli"  # tile_muli: signed x signed (tdpbssd)
        self.values[acc] = ir.Operation.create(name, results=[self.acc_t], operands=[
            self.values[a], self.values[b], self.values[acc]]).result

    def carried(self, slots: tuple[int, ...]) -> list[ir.Value]:
        return [self.values[s] for s in slots]

    def restore(self, slots: tuple[int, ...], values: list[ir.Value]) -> None:
        self.values.update(zip(slots, values))

    def store(self, slot: int, dest: ir.Value, at: list[ir.Value]) -> None:
        ir.Operation.create("amx.tile_store", results=[], operands=[dest, *at, self.values[slot]],
                            attributes={"operandSegmentSizes": _segments(1, len(at), 1, 0)})


class EmulatedTiles:
    """`TileOps` on host buffers (one per slot, allocated by `buffers`) with the instructions' arithmetic:
    ``acc[m, n] += sum_kk a[m, kk] * b[kk / u, n*u + kk % u]`` in the accumulator's type."""

    def __init__(self, operand: ir.Type, acc: ir.Type, k: int, u: int) -> None:
        self.operand, self.acc, self.k, self.u = operand, acc, k, u
        self.index = ir.IndexType.get()
        self.slots: dict[int, ir.Value] = {}

    def buffers(self) -> list[ir.Value]:
        """Allocate the slots' buffers at the insertion point (the kernel function's entry block)."""
        op = ir.InsertionPoint.current.block.owner
        while op.name != "builtin.module":
            op = op.parent
        self.module = op

        def alloc(rows: int, cols: int, t: ir.Type) -> ir.Value:
            return memref.alloc(ir.MemRefType.get([rows, cols], t), [], [], alignment=64)

        for s in ACC:
            self.slots[s] = alloc(TILE, TILE, self.acc)
        for s in A_TILES:
            self.slots[s] = alloc(TILE, self.k, self.operand)
        for s in B_TILES:
            self.slots[s] = alloc(self.k // self.u, TILE * self.u, self.operand)
        return list(self.slots.values())

    def _c(self, v: int) -> ir.Value:
        return arith.constant(self.index, v)

    def _copy(self, src: ir.Value, src_at: list[ir.Value], dst: ir.Value, dst_at: list[ir.Value],
              rows: int, cols: int) -> None:
        def row(i: ir.Value) -> None:  # the last two indices walk the tile; any before them are fixed
            def col(j: ir.Value) -> None:
                v = memref.load(src, [*src_at[:-2], arith.addi(src_at[-2], i), arith.addi(src_at[-1], j)])
                memref.store(v, dst, [*dst_at[:-2], arith.addi(dst_at[-2], i), arith.addi(dst_at[-1], j)])
            _for(self._c(0), self._c(cols), self._c(1), col)
        _for(self._c(0), self._c(rows), self._c(1), row)

    def carried(self, slots: tuple[int, ...]) -> list[ir.Value]:
        return []

    def branch(self, cond: ir.Value, then: Callable[[], list[ir.Value]],
               otherwise: Callable[[], list[ir.Value]]) -> list[ir.Value]:
        _if(cond, lambda: _discard(then()), lambda: _discard(otherwise()))
        return []

    def restore(self, slots: tuple[int, ...], values: list[ir.Value]) -> None:
        pass

    def zero(self, slot: int) -> None:
        z = arith.constant(self.acc, 0.0 if isinstance(self.acc, ir.FloatType) else 0)
        buf = self.slots[slot]
        _for(self._c(0), self._c(TILE), self._c(1), lambda i: _for(
            self._c(0), self._c(TILE), self._c(1), lambda j: memref.store(z, buf, [i, j])))

    def load(self, slot: int, source: ir.Value, at: list[ir.Value]) -> None:
        shape = ir.MemRefType(self.slots[slot].type).shape
        self._copy(source, at, self.slots[slot], [self._c(0), self._c(0)], shape[0], shape[1])

    def store(self, slot: int, dest: ir.Value, at: list[ir.Value]) -> None:
        self._copy(self.slots[slot], [self._c(0), self._c(0)], dest, at, TILE, TILE)

    def mul(self, acc: int, a: int, b: int) -> None:
        func.CallOp(self._mul_function(), [self.slots[acc], self.slots[a], self.slots[b]])

    def _mul_function(self) -> func.FuncOp:
        """``@__pbsdk_tile_mul_<operand>_<k>(C, A, B)``: one tile product in scalar loops, a ``noinline``
        function of the module built once (64 inlined copies made LLVM take minutes)."""
        module = self.module
        table = ir.SymbolTable(module.operation)
        name = f"__pbsdk_tile_mul_{self.operand}_{self.k}"
        if name in table:
            return table[name]  # type: ignore[no-any-return]
        types = [ir.MemRefType(self.slots[s].type) for s in (ACC[0], A_TILES[0], B_TILES[0])]
        with ir.InsertionPoint.at_block_begin(module.regions[0].blocks[0]):
            fn = func.FuncOp(name, (types, []), visibility="private")
        fn.attributes["passthrough"] = ir.ArrayAttr.get([ir.StringAttr.get("noinline")])
        entry = fn.add_entry_block()
        with ir.InsertionPoint(entry):
            self._mul_loops(*entry.arguments)
            func.ReturnOp([])
        return fn

    def _mul_loops(self, C: ir.Value, A: ir.Value, B: ir.Value) -> None:
        u, floats = self.u, isinstance(self.acc, ir.FloatType)

        def widen(v: ir.Value) -> ir.Value:
            return arith.extf(self.acc, v) if floats else arith.extsi(self.acc, v)

        def point(m: ir.Value, n: ir.Value) -> None:
            def term(kk: ir.Value, total: list[ir.Value]) -> list[ir.Value]:
                x = widen(memref.load(A, [m, kk]))
                y = widen(memref.load(B, [arith.divui(kk, self._c(u)),
                                          arith.addi(arith.muli(n, self._c(u)), arith.remui(kk, self._c(u)))]))
                return [arith.addf(total[0], arith.mulf(x, y)) if floats else arith.addi(total[0], arith.muli(x, y))]
            total = for_values(self._c(0), self._c(self.k), self._c(1), [memref.load(C, [m, n])], term)
            memref.store(total[0], C, [m, n])

        _for(self._c(0), self._c(TILE), self._c(1), lambda m: _for(
            self._c(0), self._c(TILE), self._c(1), lambda n: point(m, n)))


class TileKernel(_UnitKernel):
    """One thread part of the kernel of a tile unit (see the module docstring)."""

    def __init__(self, shape: UnitShape, blk: Blocking, step: StepFn, zero_init: bool,
                 epilogue: UnitEpilogue | None, prepacked: bool = False, emulate: bool = False,
                 window: Window | None = None) -> None:
        super().__init__(shape, blk, step, zero_init, epilogue, prepacked, window)
        self.signed_a = False  # tdpbssd multiplies signed bytes: no offset, no correction
        self.k_step = self.blk.unit_k
        self.emulate = emulate
        if self.blk.mr != 2 * TILE or self.blk.nr != 2 * TILE or self.k_step % self.u:
            raise ValueError(f"tile kernel: a {2 * TILE}x{2 * TILE} register tile of {TILE}x{TILE} tiles, not "
                             f"{self.blk.mr}x{self.blk.nr} (k step {self.k_step})")

    def buffers(self) -> list[ir.Value]:
        blk = self.blk
        self.Bp = None if self.prepacked else self.alloc([self.packed_panels(), blk.kc // self.u, blk.nr * self.u],
                                                         self.et)
        # A in tiles: tile row t's step s is rows (t * steps + s) * 16 .. +16 of k_step values, 1 KiB together
        self.a_steps = -(-blk.kc // self.k_step)
        self.Ap = self.alloc([blk.mc // TILE * self.a_steps * TILE, self.k_step], self.et)
        self.Cr = None
        self.Tp = self.alloc([blk.mr, blk.nr], self.acc_t)
        self.tiles: AmxTiles | EmulatedTiles
        if self.emulate:
            self.tiles = EmulatedTiles(self.et, self.acc_t, self.k_step, self.u)
            emulated = self.tiles.buffers()
        else:
            self.tiles, emulated = AmxTiles(self.et, self.acc_t, self.k_step, self.u), []
        b_rows = self.B if self.Bp is None else self.Bp
        shape = ir.MemRefType(b_rows.type).shape
        # B's panels as rows of 64 bytes: panel p's group g is row p * groups + g.
        self.Brows = memref.CollapseShapeOp(ir.MemRefType.get([shape[0] * shape[1], shape[2]], self.et), b_rows,
                                            reassociation([[0, 1], [2]])).result
        self.b_groups = shape[1]
        return [b for b in (self.Bp, self.Ap, self.Tp) if b is not None] + emulated

    def pack_groups(self, kc: ir.Value) -> ir.Value:
        steps = arith.divui(arith.addi(kc, self.c(self.k_step - 1)), self.c(self.k_step))
        return arith.muli(steps, self.c(self.k_step // self.u))  # whole steps: the last one reads zeros past K

    def pack_a_panel(self, lead: list[ir.Value], ic: ir.Value, pc: ir.Value, ib: ir.Value, groups: ir.Value) -> None:
        """Rows ``ib*mr .. +mr`` of the packed A block: row ``R``'s values ``s*k_step .. +k_step`` of ``A[row, pc
        : pc + groups*u]`` (zero past K) at ``Ap[((R // 16) * steps + s) * 16 + R % 16, :]``: each tile a step
        loads is 16 rows of 64 bytes together (rows of the block a whole k block apart fell into one l1 set
        where that is 4 KiB: kc 2048 of bf16). With a window, A is a convolution's NHWC input: a step's values
        are one tap's channels of the row's pixel (implicit GEMM: no im2col)."""
        c, blk, K = self.c, self.blk, self.shape.k
        vt = ir.VectorType.get([self.k_step], self.et)
        mt = ir.VectorType.get([self.k_step], ir.IntegerType.get_signless(1))

        def row(r: ir.Value) -> None:
            at = self.min(arith.addi(arith.addi(ic, arith.muli(ib, c(blk.mr))), r), arith.subi(self.m1, c(1)))
            tile_row = arith.addi(arith.muli(ib, c(blk.mr // TILE)), arith.divui(r, c(TILE)))
            base = arith.addi(arith.muli(tile_row, c(self.a_steps * TILE)), arith.remui(r, c(TILE)))

            start = memref.load(self.rows, [at]) if self.window is not None else None  # the pixel's window

            def chunk(s: ir.Value) -> None:
                kk = arith.addi(pc, arith.muli(s, c(self.k_step)))
                count = self.min(arith.maxsi(arith.subi(c(K), kk), c(0)), c(self.k_step))
                mask = vector.create_mask(mt, [count])
                if start is not None:  # the tap's channels in the input: the step's values lie in one run
                    flat = arith.addi(start, self.window_offset(self.min(kk, c(K - self.k_step))))
                    v = vector.maskedload(vt, self.X_flat, [flat], mask, self.zero(vt))
                else:
                    v = vector.maskedload(vt, self.A, [*lead, at, self.min(kk, c(K - 1))], mask, self.zero(vt))
                vector.store(v, self.Ap, [arith.addi(base, arith.muli(s, c(TILE))), c(0)])

            _for(c(0), arith.divui(arith.muli(groups, c(self.u)), c(self.k_step)), c(1), chunk)

        _for(c(0), c(blk.mr), c(1), row)

    def window_offset(self, kk: ir.Value) -> ir.Value:
        """Where k value ``kk`` (tap ``(i, j)``'s channel ``ch``: ``kk = (i*kw + j)*C + ch``) lies from a pixel's
        window start in the flat input: ``i*dh*Wp*C + j*dw*C + ch``."""
        assert self.window is not None
        c, g = self.c, self.window.geometry
        _, _, wp, ch = self.window.x_type.shape
        tap, within = arith.divui(kk, c(ch)), arith.remui(kk, c(ch))
        i, j = arith.divui(tap, c(g.kw)), arith.remui(tap, c(g.kw))
        return arith.addi(arith.addi(arith.muli(i, c(g.dh * wp * ch)), arith.muli(j, c(g.dw * ch))), within)

    def micro_tile(self, lead: list[ir.Value], ic: ir.Value, jc: ir.Value, pc: ir.Value, ib: ir.Value,
                   jb: ir.Value, groups: ir.Value, first: ir.Value | None, kc: ir.Value) -> None:
        """One 32 x 32 register tile over this k block. Without an epilogue, a tile inside this thread's rows
        and the block's columns (most of them) keeps C in the accumulators: they start as C's tiles (zero in
        the first block of a zero-filled C) and are stored back to C; an edge tile, or any tile with an
        epilogue, starts at zero and goes through ``Tp`` to the masked C update."""
        c, blk = self.c, self.blk
        panel = arith.addi(arith.divui(jc, c(blk.nr)), jb) if self.prepacked else jb
        g0 = arith.addi(arith.muli(panel, c(self.b_groups)), arith.divui(pc, c(self.u)) if self.prepacked else c(0))
        top = arith.addi(ic, arith.muli(ib, c(blk.mr)))

        def through_tp() -> None:
            for s in ACC:
                self.tiles.zero(s)
            self.steps(ib, g0, kc)
            for r in range(2):
                for h in range(2):
                    self.tiles.store(ACC[2 * r + h], self.Tp, [c(r * TILE), c(h * TILE)])
            self.update_c(lead, [], ic, ib, jc, jb, None, first)

        if self.epilogue is not None:
            through_tp()
            return
        col = arith.addi(jc, arith.muli(jb, c(blk.nr)))
        end = self.min(self.n1, arith.addi(jc, c(blk.nc)))
        inside = arith.andi(arith.cmpi(arith.CmpIPredicate.sle, arith.addi(top, c(blk.mr)), self.m1),
                            arith.cmpi(arith.CmpIPredicate.sle, arith.addi(col, c(blk.nr)), end))
        _if(inside, lambda: self.in_c(lead, top, col, ib, g0, first, kc), through_tp)

    def in_c(self, lead: list[ir.Value], top: ir.Value, col: ir.Value, ib: ir.Value, g0: ir.Value,
             first: ir.Value | None, kc: ir.Value) -> None:
        """The accumulators loaded from C's tiles at (``top``, ``col``) (zero where this is the first k block
        of a zero-filled C), stepped through the block, stored back to C."""
        c, t = self.c, self.tiles
        at = [[*lead, arith.addi(top, c(r * TILE)), arith.addi(col, c(h * TILE))] for r in range(2) for h in range(2)]

        def zero() -> list[ir.Value]:
            for s in ACC:
                t.zero(s)
            return t.carried(ACC)

        def load() -> list[ir.Value]:
            for s, where in zip(ACC, at):
                t.load(s, self.C, where)
            return t.carried(ACC)

        if self.zero_init and self.shape.k <= self.blk.kc:
            zero()
        elif first is None or not self.zero_init:
            load()
        else:
            t.restore(ACC, t.branch(first, zero, load))
        self.steps(ib, g0, kc)
        for s, where in zip(ACC, at):
            t.store(s, self.C, where)

    def steps(self, ib: ir.Value, g0: ir.Value, kc: ir.Value) -> None:
        """The block's steps of k on the accumulators: a loop carrying them; each step loads 2 tiles of A and 2
        of B and issues 4 products. (Prefetching the tiles of the step after next into l1 measured 0.95-0.98x
        for i8 and 0.96-1.08x for bf16 on a Xeon with AMX, 1 and 2 threads: not done.)"""
        c, blk, t = self.c, self.blk, self.tiles
        a_rows = [arith.addi(arith.muli(ib, c(blk.mr // TILE)), c(r)) for r in range(2)]  # tile rows of Ap
        b_step = self.k_step // self.u  # rows of Brows a step

        def a_at(r: int, i: ir.Value) -> ir.Value:
            return arith.muli(arith.addi(arith.muli(a_rows[r], c(self.a_steps)), i), c(TILE))

        def step(i: ir.Value, accs: list[ir.Value]) -> list[ir.Value]:
            t.restore(ACC, accs)
            for r, slot in enumerate(A_TILES):
                t.load(slot, self.Ap, [a_at(r, i), c(0)])
            for h, slot in enumerate(B_TILES):
                t.load(slot, self.Brows, [arith.addi(g0, arith.muli(i, c(b_step))), c(h * TILE * self.u)])
            for r, a in enumerate(A_TILES):
                for h, b in enumerate(B_TILES):
                    t.mul(ACC[2 * r + h], a, b)
            return t.carried(ACC)

        steps = arith.divui(arith.addi(kc, c(self.k_step - 1)), c(self.k_step))  # the last one zero-padded
        t.restore(ACC, for_values(c(0), steps, c(1), t.carried(ACC), step))


@functools.cache
def host_has_amx() -> bool:
    """Whether this host's CPU has AMX tiles (as LLVM reads its features: CPUID, and the OS's XSAVE state);
    read once (`resolve_tiles` asks for every unit of every plan)."""
    from pbsdk.targets.cpu import _llvm

    return bool(_llvm().get_host_cpu_features().get("amx-tile", False))


_XFEATURE_XTILEDATA, _ARCH_REQ_XCOMP_PERM, _SYS_ARCH_PRCTL = 18, 0x1023, 158
_amx_granted: bool | None = None


def request_amx() -> bool:
    """Ask Linux for AMX's tile data state for this process (``arch_prctl(ARCH_REQ_XCOMP_PERM,
    XFEATURE_XTILEDATA)``), once; without it the first tile instruction faults. Returns whether it was
    granted (False off Linux x86-64 or where the kernel refuses)."""
    global _amx_granted
    if _amx_granted is None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            # long arguments: a variadic int would leave the registers' upper halves undefined
            _amx_granted = libc.syscall(ctypes.c_long(_SYS_ARCH_PRCTL), ctypes.c_long(_ARCH_REQ_XCOMP_PERM),
                                        ctypes.c_ulong(_XFEATURE_XTILEDATA)) == 0
        except (OSError, AttributeError):
            _amx_granted = False
    return _amx_granted
