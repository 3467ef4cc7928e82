"""The cpu target's lowering of the vector-FMA compute tile: the packed, register-tiled kernel of a
(batched) matmul, built from its plan with the MLIR bindings' op builders.

The loop nest is the BLIS one (Goto's algorithm), with every size taken from a `Blocking`:

    for (batch, rows, cols) of this thread's part           -- parallel over the spec's cores
      for jc in cols step NC                                  -- B panel, packed, lives in the outer cache
        for pc in 0..K step KC
          pack B[pc:+kc, jc:+nc] into nc/nr micro-panels (kc x nr, contiguous)
          for ic in rows step MC                              -- A block, packed, lives in the middle cache
            pack A[ic:+mc, pc:+kc] into mc/mr micro-panels (kc x mr, k-major: one stream of broadcasts)
            for jr in 0..nc step nr
              for ir in 0..mc step mr
                micro-kernel: mr x (nr/lanes) vector accumulators carried through the k loop as
                loop-carried SSA values (so they stay in registers), one broadcast of A and
                nr/lanes vector loads of B per k step, then C += acc (masked at the edges)

Packing B is vector loads/stores (masked at the n tail); packing A (rows along k into k-major panels) goes
through L x L register transposes (`_PartBuilder._transposing_pack`: L vector loads along k,
`transpose_vectors`, L stores of the panel's mr lanes), as does packing a B stored [n, k] (see
`MatmulShape`). Rows and columns of a micro-tile beyond the matrix are computed on whatever the packed
buffer holds and never stored, so the packed buffers need no zero padding. The kernel accumulates into C
(``C += A @ B``), which is what ``linalg.matmul`` means; the preceding ``linalg.fill`` stays separate unless
the caller asks for ``zero_init``.

A constant B (a frozen weight) can come packed already (``prepacked_b``): `pack_b_panels` lays it out at
compile time as the micro-panels of the whole matrix, ``[ceil(n/nr), k, nr]``, zero-padded past column n, and
the kernel then reads its (jc, pc) block of panels in place: no B packing at run time, and threads that
split the rows share one copy instead of each packing all of B.

`build_matmul_kernel` adds the kernel to a module: it checks its arguments once (`KernelConfig`), then
builds one thread's part with a `_PartBuilder`, one method per loop level, packing and step of the C update.
`pbsdk.targets.cpu.pack_contractions` decides where to use it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Literal

import numpy as np
from mlir import ir
from mlir.dialects import arith, func, math, memref, scf, vector

from pbsdk.core.ir.builder import (
    Indices,
    call_parts,
    element_bits,
    element_type,
    reassociation,
    transpose_vectors,
    zero_vector,
)
from pbsdk.core.ir.builder import for_each as _for
from pbsdk.core.ir.builder import if_then as _if
from pbsdk.core.ir.builder import if_values as _if_values
from pbsdk.core.plan.contraction import EXACT_I8_K, Blocking
from pbsdk.core.plan.dynamic import edge_row_variants
from pbsdk.core.plan.window import ConvGeometry
from pbsdk.core.runtime.kernel import aligned_empty


def kernel_dtype(c_type: ir.MemRefType) -> ir.Type:
    """The type a packed kernel storing into ``c_type`` computes in: C's (A's and B's too, unless they are
    widened); f32 for an integer C (an i8 product on widened operands, its k blocks' exact f32 sums added to C
    as i32)."""
    t = c_type.element_type
    return ir.F32Type.get(c_type.context) if isinstance(t, ir.IntegerType) else t


@dataclasses.dataclass(frozen=True)
class MatmulShape:
    """The contraction ``C[b, m, n] += A[b, m, k] * B[b, k, n]`` on buffers of these memref types.

    The layouts say how each operand is stored (its last two dimensions, row-major): A as ``[m, k]`` or
    ``[k, m]`` (``"km"``: read in place, ``mr`` adjacent values per k step), B as ``[k, n]`` or ``[n, k]``
    (``"nk"``: packed through `transpose_vectors` blocks), C as ``[m, n]`` or ``[n, m]`` (``"nm"``: the
    micro-tile is transposed in registers and updated a stored row at a time, the epilogue in C's stored frame). A
    product computed transposed, ``C^T = B^T A^T``, is the kernel for (n, m, k) on the given buffers with
    layouts ``("km", "nk", "nm")``."""

    m: int  # `DYNAMIC` (negative): the rows are C's row dimension, known at call time
    n: int  # `DYNAMIC`: C's (and B's) column dimension
    k: int  # `DYNAMIC`: A's last (and B's row) dimension
    batch: int  # 0: plain matmul (rank-2 operands); >= 1: batched (rank-3 operands); `DYNAMIC`: batched, C's
    #: batch dimension known at call time
    a_type: ir.MemRefType
    b_type: ir.MemRefType
    c_type: ir.MemRefType
    a_layout: Literal["mk", "km"] = "mk"
    b_layout: Literal["kn", "nk"] = "kn"
    c_layout: Literal["mn", "nm"] = "mn"

    @property
    def dtype(self) -> ir.Type:
        """The type the kernel computes in (`kernel_dtype` of C's)."""
        return kernel_dtype(self.c_type)

    @property
    def widened(self) -> bool:
        """A and B hold a narrower type than the kernel computes in (bf16 or f16 into f32, i8 into f32):
        each value is widened as it is packed (both are packed; a prepacked B was widened when packed)."""
        return self.a_type.element_type != self.dtype

    @property
    def integer_c(self) -> bool:
        return isinstance(self.c_type.element_type, ir.IntegerType)

    @property
    def dynamic_m(self) -> bool:
        return self.m < 0

    @property
    def dynamic(self) -> bool:
        """Some size is known only at call time."""
        return min(self.m, self.n, self.k, self.batch) < 0

    @classmethod
    def transposed(cls, m: int, n: int, k: int, batch: int, a_type: ir.MemRefType, b_type: ir.MemRefType,
                   c_type: ir.MemRefType, a_layout: Literal["mk", "km"] = "mk",
                   b_layout: Literal["kn", "nk"] = "kn") -> MatmulShape:
        """``C[m, n] += A[m, k] B[k, n]`` (buffers of these types, A and B stored as their layouts say)
        computed as ``C^T[n, m] += B^T[n, k] A^T[k, m]``: the kernel's A is the given B (stored [k, n]:
        "km"; [n, k]: "mk"), its B the given A (stored [m, k]: "nk"; [k, m]: "kn")."""
        return cls(n, m, k, batch, b_type, a_type, c_type, "km" if b_layout == "kn" else "mk",
                   "nk" if a_layout == "mk" else "kn", "nm")


#: `MatmulShape.m` of a kernel whose row count is C's dynamic row dimension (MLIR's dynamic size marker).
DYNAMIC = ir.ShapedType.get_dynamic_size()


def packed_b_shape(k: int, n: int, nr: int) -> tuple[int, int, int]:
    """The shape of B (k x n) packed by `pack_b_panels`: ``(ceil(n/nr), k, nr)``."""
    return (-(-n // nr), k, nr)


def pack_b_panels(b: np.ndarray, nr: int, *, alignment: int = 64) -> np.ndarray:
    """B (k x n, any float dtype) as the kernel's micro-panels: ``out[p, k, j] = b[k, p*nr + j]``, zero
    past column n; C order, its first byte at an ``alignment``-byte address (a whole panel row is then
    aligned vector loads)."""
    k, n = b.shape
    shape = packed_b_shape(k, n, nr)
    out = aligned_empty(int(np.prod(shape)) * b.dtype.itemsize, alignment).view(b.dtype).reshape(shape)
    full = n // nr
    out[:full] = b[:, :full * nr].reshape(k, full, nr).transpose(1, 0, 2)
    if full < shape[0]:
        out[full] = 0
        out[full, :, :n - full * nr] = b[:, full * nr:]
    return out


@dataclasses.dataclass(frozen=True)
class Window:
    """A read in place from an NHWC input (implicit GEMM): the rows of A are the output pixels
    ``(n, oh, ow)`` of a convolution, its columns the taps and channels ``(i, j, c)``, and

        A[(n, oh, ow), (i, j, c)] = X[n, oh*sh + i*dh, ow*sw + j*dw, c]

    with ``X`` (already padded) a contiguous buffer of type ``x_type``. The kernel then neither copies
    the patches (im2col) nor packs A: each micro-tile reads its ``mr`` pixels' channels straight from X,
    one base address per pixel plus the tap's offset plus the channel."""

    geometry: ConvGeometry
    x_type: ir.MemRefType
    #: One step of the tap loop reads a whole kernel row (``kw * C`` adjacent values; needs ``dw == 1``)
    #: instead of one tap's ``C`` channels: for inputs with few channels (`window_run`).
    row_runs: bool = False
    #: The k values of a run come in groups of this many (a matrix unit's k): a run that is no whole number
    #: of groups reads on past its end into the values that follow it in X, which B's zero rows cancel
    #: (`k_run`; B laid out with ``k_run`` rows per run,
    #: `pbsdk.core.plan.window.pad_runs`).
    group: int = 1

    @property
    def run(self) -> int:
        """Contiguous input values per step of the tap loop (the k index advances through them in order)."""
        return self.channels * (self.geometry.kw if self.row_runs else 1)

    @property
    def k_run(self) -> int:
        """k values per run: `run` rounded up to whole groups."""
        return -(-self.run // self.group) * self.group

    def last_read(self) -> int:
        """One past the flat index of X the last output pixel's last run reads up to (groups included)."""
        g, (n, hp, wp, ch) = self.geometry, self.x_type.shape
        pixel = (n - 1) * hp * wp + ((g.oh - 1) * g.sh + (g.kh - 1) * g.dh) * wp + (g.ow - 1) * g.sw
        last = (g.kw - 1) * g.dw * ch if not self.row_runs else 0
        return pixel * ch + last + self.k_run

    @property
    def channels(self) -> int:
        return int(self.x_type.shape[3])


@dataclasses.dataclass(frozen=True)
class EpilogueOp:
    """One scalar op of the epilogue body: ``result = op(operands)``. Operands name earlier results,
    ``"acc"`` (the contraction's value), ``"in<i>"`` (extra input i) — or, for ``arith.constant``,
    ``value`` holds the literal. ``predicate`` is cmpf's (`arith.CmpFPredicate`'s value). ``dtype``: the
    result's float type where it is not the accumulator's (a constant of it, the ``arith.truncf`` of a
    bf16 product's rounding and what follows it, an ``arith.extf`` back)."""

    result: str
    op: str
    operands: tuple[str, ...] = ()
    value: float = 0.0
    predicate: int = 0
    dtype: str = ""


@dataclasses.dataclass(frozen=True)
class Epilogue:
    """An elementwise op applied to the contraction's result before it is stored.

    ``inputs``: (kind, memref type) of each extra operand, kind ``full`` (same indices as C), ``col``
    (indexed by the column), ``row`` (by the row) or ``scalar``; ``out_type``: the type of ``D``, where the
    result goes."""

    inputs: tuple[tuple[str, ir.MemRefType], ...]
    body: tuple[EpilogueOp, ...]
    result: str
    out_type: ir.MemRefType


#: B (stored [k, n]) is packed this many of its rows at a time across all the block's panels, not a panel
#: (kc rows, a row stride apart) at a time: the reads then run along B's rows and each panel gets one
#: contiguous run of rows. Zen 4, 1 thread, same process: a 14x3072x768 product with B packed 1.16 -> 0.86
#: ms (1 row 0.96, 4 0.88, 16 1.00, 32 1.13); 512x3072x768 22.9 -> 22.2 ms, 128x4096x4096 47.5 -> 43.3 ms.
PACK_B_ROWS = 8

#: Epilogue ops with a vector form of the same name (operands and result all of the vector type).
VECTOR_SAME = {"arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.maximumf", "arith.minimumf",
               "arith.maxnumf", "arith.minnumf", "arith.negf", "math.exp", "math.tanh", "math.erf", "math.log",
               "math.sqrt", "math.rsqrt", "math.absf", "math.exp2", "math.log1p", "math.expm1"}
EPILOGUE_OPS = VECTOR_SAME | {"arith.constant", "arith.cmpf", "arith.select", "arith.truncf", "arith.extf"}


def _vector_same(name: str) -> Callable[..., ir.Value]:
    """The bindings' builder of a `VECTOR_SAME` op (``arith.addf`` -> `mlir.dialects.arith.addf`)."""
    dialect, op = name.split(".")
    return getattr({"arith": arith, "math": math}[dialect], op)  # type: ignore[no-any-return]


class IndexOps:
    """Index arithmetic at the insertion point, with index constants memoised and hoisted to the top of
    the function (``hoist``) so that they dominate every use."""

    def __init__(self, entry: ir.Block) -> None:
        self.entry = entry
        self.index = ir.IndexType.get()
        self._consts = Indices(entry)

    def const(self, v: int) -> ir.Value:
        return self._consts.c(v)

    def hoist(self) -> None:
        """Put the constants first in the entry block, in increasing order."""
        self._consts.hoist()

    @staticmethod
    def add(a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.addi(a, b)

    @staticmethod
    def sub(a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.subi(a, b)

    @staticmethod
    def mul(a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.muli(a, b)

    @staticmethod
    def divu(a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.divui(a, b)

    @staticmethod
    def min(a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.minsi(a, b)

    @staticmethod
    def max(a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.maxsi(a, b)


def window_rows(w: Window, x: IndexOps, m0: ir.Value, m1: ir.Value, m: int) -> ir.Value:
    """A table ``rows[r]``: where output pixel ``r = (n, oh, ow)``'s window starts in the flattened input,
    ``n*Hp*Wp*C + oh*sh*Wp*C + ow*sw*C``, filled for this thread's rows ``[m0, m1)`` (so the division of
    ``r`` into pixel coordinates runs once per row, not once per micro-tile and k block)."""
    c = x.const
    rows = memref.alloc(ir.MemRefType.get([m], x.index), [], [], alignment=64)
    _for(m0, m1, c(1), lambda r: memref.store(window_start(r, w.geometry, w.x_type, c), rows, [r]))
    return rows


def window_start(r: ir.Value, g: ConvGeometry, x_type: ir.MemRefType, c: Callable[[int], ir.Value]) -> ir.Value:
    """Where output pixel ``r = (n, oh, ow)``'s window starts in the flattened NHWC input ``x_type``:
    ``n*Hp*Wp*C + oh*sh*Wp*C + ow*sw*C`` (``c``: index constants)."""
    _, hp, wp, ch = x_type.shape
    n = arith.divui(r, c(g.oh * g.ow))
    rem = arith.remui(r, c(g.oh * g.ow))
    oh = arith.divui(rem, c(g.ow))
    ow = arith.remui(rem, c(g.ow))
    return arith.addi(arith.addi(arith.muli(n, c(hp * wp * ch)), arith.muli(oh, c(g.sh * wp * ch))),
                      arith.muli(ow, c(g.sw * ch)))


def window_k_loop(rows: ir.Value, w: Window, x: IndexOps, mr: int, last_row: ir.Value, r0: ir.Value,
                  pc: ir.Value, kc: ir.Value, init: list[ir.Value],
                  step: Callable[[ir.Value, Callable[[int], ir.Value], list[ir.Value]], list[ir.Value]],
                  k_step: int = 1) -> list[ir.Value]:
    """The k loop of one micro-tile over the k block ``[pc, pc + kc)`` of a `Window` read: taps outer,
    channels inner. ``step(k, addr, accs)`` builds one k step (``k`` relative to the block, for B;
    ``addr(i)``: the flat input index of row ``i``'s A element) and returns the new accumulators. A step
    consumes ``k_step`` adjacent channels (a matrix unit's group of k: runs and ``pc`` are multiples of it).

    Rows past this thread's last row read that row's window (valid memory; the results are never stored).
    When the tile's ``mr`` pixels lie in one output row (they do, unless the tile wraps to the next output
    row or runs past the thread's rows), row ``i`` is row 0 plus a constant, so the loop needs one base address instead of
    ``mr``: that case is its own copy of the loop, chosen once per tile."""
    c = x.const
    _, _, wp, ch = w.x_type.shape
    bases = [memref.load(rows, [x.min(x.add(r0, c(i)), last_row) if i else r0]) for i in range(mr)]
    # The block holds whole runs (a tap's channels, or a kernel row's taps and channels) when a run fits in
    # it (pc a multiple of the run), else part of one run starting at c0.
    length = w.k_run
    t0 = x.divu(pc, c(length))
    c0 = arith.remui(pc, c(length))
    ntaps = x.max(x.divu(kc, c(length)), c(1))
    run = x.min(kc, c(length))
    pixel = w.geometry.sw * ch
    # One image row holds the whole tile (no wrap, no row past the thread's last): the bases are linear.
    # (Comparing only the first and last base is not enough: a wrap's jump and the clamp of the rows past
    # the end can cancel.)
    in_row = arith.cmpi(arith.CmpIPredicate.ult, x.add(arith.remui(r0, c(w.geometry.ow)), c(mr - 1)), c(w.geometry.ow))
    in_part = arith.cmpi(arith.CmpIPredicate.sle, x.add(r0, c(mr - 1)), last_row)
    linear = arith.andi(in_row, in_part)

    def loops(addr_of: Callable[[int, ir.Value], ir.Value]) -> list[ir.Value]:
        outer = scf.ForOp(c(0), ntaps, c(1), init)
        with ir.InsertionPoint(outer.body):
            t = outer.induction_variable
            tap = x.add(t0, t)
            if w.row_runs:  # a run is kernel row `tap`: its taps and channels are adjacent in X
                off = x.add(x.mul(tap, c(w.geometry.dh * wp * ch)), c0)
            else:
                ti = x.divu(tap, c(w.geometry.kw))
                tj = arith.remui(tap, c(w.geometry.kw))
                off = x.add(x.add(x.mul(ti, c(w.geometry.dh * wp * ch)), x.mul(tj, c(w.geometry.dw * ch))), c0)
            kb = x.mul(t, c(length))
            inner = scf.ForOp(c(0), run, c(k_step), list(outer.inner_iter_args))
            with ir.InsertionPoint(inner.body):
                chan = inner.induction_variable
                col = x.add(off, chan)

                def addr(i: int, col: ir.Value = col) -> ir.Value:
                    return addr_of(i, col)

                scf.YieldOp(step(x.add(kb, chan), addr, list(inner.inner_iter_args)))
            scf.YieldOp(list(inner.results))
        return list(outer.results)

    return _if_values(linear, [v.type for v in init],
                      lambda: loops(lambda i, col: x.add(x.add(bases[0], col), c(i * pixel)) if i
                                    else x.add(bases[0], col)),
                      lambda: loops(lambda i, col: x.add(bases[i], col)))


def tile_variants(m: int, n: int, mr: int, nv: int, lanes: int) -> tuple[int, int]:
    """The register tiles at the op's last rows and columns: (rows, vectors) they compute, 0 where the edge
    tile is a whole one. Thread parts and cache blocks are whole multiples of mr rows and nv vectors, so
    only the last tile row (``m % mr`` rows) and the last tile column (``n % (nv * lanes)`` columns) are
    short: their k loops are their own copies, with fewer accumulators, instead of whole tiles whose
    extra rows and vectors are computed and thrown away (512 rows in 14-row tiles: the last tile's 8
    rows took a whole tile's FMAs)."""
    rows = m % mr
    vecs = -(-(n % (nv * lanes)) // lanes)
    return rows, vecs if vecs < nv else 0


def _epilogue_values(ep: Epilogue, args: Sequence[ir.Value], acc: ir.Value, lead: list[ir.Value],
                     r: ir.Value, col: ir.Value, mask: ir.Value | None, vzero: ir.Value) -> ir.Value:
    """Build the epilogue on one vector of results (``args``: the extra inputs' buffers); returns the
    value to store."""
    vt = ir.VectorType(acc.type)
    lanes = vt.shape[0]

    def typed(dtype: str) -> ir.VectorType:  # the vector of an op's (or an input's) element type
        return vt if not dtype else ir.VectorType.get([lanes], element_type(dtype))

    env = {"acc": acc}
    for i, (kind, t) in enumerate(ep.inputs):
        it = ir.VectorType.get([lanes], t.element_type)
        if kind in ("full", "col"):
            idx = [*lead, r, col] if kind == "full" else [col]
            zero = vzero if it == vt else zero_vector(it)
            x = vector.load(it, args[i], idx) if mask is None else vector.maskedload(it, args[i], idx, mask, zero)
        else:
            s = memref.load(args[i], [r] if kind == "row" else [])
            x = vector.broadcast(it, s)
        env[f"in{i}"] = x
    for op in ep.body:
        operands = [env[o] for o in op.operands]
        if op.op == "arith.constant":
            ct = typed(op.dtype)
            x = arith.constant(ct, ir.DenseElementsAttr.get_splat(ct, ir.FloatAttr.get(ct.element_type, op.value)))
        elif op.op in ("arith.truncf", "arith.extf"):
            x = (arith.truncf if op.op == "arith.truncf" else arith.extf)(typed(op.dtype), *operands)
        elif op.op == "arith.cmpf":
            x = arith.cmpf(arith.CmpFPredicate(op.predicate), *operands)
        elif op.op == "arith.select":
            x = arith.select(*operands)
        else:
            x = _vector_same(op.op)(*operands)
        env[op.result] = x
    return env[ep.result]


def build_matmul_kernel(module: ir.Module, name: str, shape: MatmulShape, blk: Blocking, *,
                        epilogue: Epilogue | None = None, zero_init: bool = False,
                        window: Window | None = None, prepacked_b: bool = False) -> func.FuncOp:
    """Append two functions to ``module`` and return the second: ``@{name}_part`` (public: one thread's
    part, given its index; the cpu target's fork glue links to it) and ``@{name}`` (private: the op,
    one call per thread part inside an ``scf.forall``).

    Both take ``A, B, C``; with an ``epilogue`` they also take its inputs and its output buffer ``D``,
    and the last k block stores ``epilogue(C + acc)`` to ``D`` (``C`` then holds partial sums only).
    With ``zero_init`` C's initial contents are taken to be zero (the fill before it is dropped): the
    first k block stores instead of adding. With a ``window`` the first operand is the convolution's
    input ``X`` (``window.x_type``) instead of A, read in place (see `Window`; ``blk.kc`` must be a
    `window_k_block`). With ``prepacked_b`` B comes as `pack_b_panels` made it for ``blk.nr``
    (``shape.b_type`` is that packed type) and is not packed again. A combination that makes no kernel
    is a ValueError (`KernelConfig`). Like every builder of the bindings, it needs an enclosing
    ``ir.Location`` (the ops take it)."""
    config = KernelConfig(f"{name}_part", shape, blk, epilogue=epilogue, zero_init=zero_init, window=window,
                          prepacked_b=prepacked_b)
    with ir.InsertionPoint(module.body):
        part = _PartBuilder(config).build()
        arg_types = list(part.type.inputs)[:-1]
        op = func.FuncOp(name, (arg_types, []), visibility="private")
        entry = op.add_entry_block()
        with ir.InsertionPoint(entry):
            call_parts(f"{name}_part", list(entry.arguments), blk.threads)
            func.ReturnOp([])
    return op


@dataclasses.dataclass(frozen=True)
class KernelConfig:
    """What one thread part ``@{name}`` of a kernel computes (`build_matmul_kernel`'s arguments), checked
    once when made: a combination that makes no kernel is a ValueError naming ``name``. The properties
    are the facts the builder derives from it (layouts, which operands are packed, the buffers' types);
    the types are made in the current MLIR context."""

    name: str
    shape: MatmulShape
    blk: Blocking
    epilogue: Epilogue | None = None
    zero_init: bool = False
    window: Window | None = None
    prepacked_b: bool = False

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise a ValueError unless the operands' layouts, the blocking and the flags fit together."""
        shape, blk, window, name = self.shape, self.blk, self.window, self.name
        if window is not None and (self.batched or (blk.kc % window.run and window.run % blk.kc)
                                   or (window.row_runs and window.geometry.dw != 1)):
            raise ValueError(f"{name}: a window needs a plain matmul, kc {blk.kc} in whole runs or dividing the "
                             f"run of {window.run}, and adjacent kernel columns for row runs")
        if self.prepacked_b and (self.batched or tuple(shape.b_type.shape) != packed_b_shape(shape.k, shape.n, blk.nr)):
            raise ValueError(f"{name}: a prepacked B needs a plain matmul and the type of B packed for nr {blk.nr} "
                             f"{packed_b_shape(shape.k, shape.n, blk.nr)}, got {shape.b_type}")
        if (self.a_km or self.b_nk or self.c_nm) and window is not None:
            raise ValueError(f"{name}: a window reads its input in place as A[m, k]; layouts {shape.a_layout}/"
                             f"{shape.b_layout}/{shape.c_layout} are not for it")
        if self.b_nk and not self.prepacked_b and not blk.pack_b:
            raise ValueError(f"{name}: a B stored [n, k] is read through its packing (pack_b)")
        if shape.dynamic and (window is not None or self.a_km or self.b_nk or self.c_nm or blk.transposed
                              or self.prepacked_b):
            raise ValueError(f"{name}: dynamic sizes need A stored [m, k], B [k, n] and C [m, n] in the given "
                             "orientation, B not prepacked, without a window")
        if shape.widened and (window is not None or not self.packs_a or not (self.packs_b or self.prepacked_b)):
            raise ValueError(f"{name}: operands of {shape.a_type.element_type} widened to {self.dtype} need no "
                             "window, and A and B packed (B prepacked at compile time counts)")
        if shape.integer_c and (not shape.widened or self.epilogue is not None or blk.kc > EXACT_I8_K):
            raise ValueError(f"{name}: an integer C takes widened i8 operands, no epilogue and k blocks of at most "
                             f"{EXACT_I8_K} (kc {blk.kc})")

    @property
    def dtype(self) -> ir.Type:
        return self.shape.dtype

    @property
    def batched(self) -> bool:
        """Batched operands are indexed ``[b, row, col]``, plain ones ``[row, col]``."""
        return self.shape.batch != 0

    @property
    def a_km(self) -> bool:
        return self.shape.a_layout == "km"

    @property
    def b_nk(self) -> bool:
        return self.shape.b_layout == "nk"

    @property
    def c_nm(self) -> bool:
        return self.shape.c_layout == "nm"

    @property
    def packs_a(self) -> bool:
        """A is copied into the block's micro-panels (a window's input is always read in place)."""
        return self.window is None and self.blk.pack_a

    @property
    def packs_b(self) -> bool:
        """B is copied into the block's micro-panels (a prepacked B is read as it comes)."""
        return self.blk.pack_b and not self.prepacked_b

    @property
    def stages_sums(self) -> bool:
        """The last k block's sums go through a scratch micro-tile before the epilogue (see `_update`); an
        epilogue on a C stored [n, m] is applied on the transposed registers instead."""
        return self.epilogue is not None and not self.c_nm

    @property
    def a_packed_type(self) -> ir.MemRefType:
        """The packed A block: mc/mr k-major micro-panels of mr rows. An A stored [m, k] is packed through
        L x L transposes like a B stored [n, k]: its panels run a whole block and a head past kc."""
        blk = self.blk
        depth = blk.kc if self.a_km else -(-blk.kc // blk.lanes) * blk.lanes + blk.lanes
        return ir.MemRefType.get([blk.mc // blk.mr, depth, blk.mr], self.dtype)

    @property
    def b_packed_type(self) -> ir.MemRefType:
        """The packed B block: nc/nr micro-panels of nr columns. A B stored [n, k] is packed L x L blocks at
        a time, the first one short so that the rest load aligned vectors: its panels run up to a whole
        block and a head past kc."""
        blk = self.blk
        depth = -(-blk.kc // blk.lanes) * blk.lanes + blk.lanes if self.b_nk else blk.kc
        return ir.MemRefType.get([blk.nc // blk.nr, depth, blk.nr], self.dtype)

    @property
    def arg_types(self) -> list[ir.Type]:
        """``A`` (a window's ``X``), ``B``, ``C``, the epilogue's inputs and ``D``, the thread index."""
        a_type = self.shape.a_type if self.window is None else self.window.x_type
        extra = [] if self.epilogue is None else [t for _, t in self.epilogue.inputs] + [self.epilogue.out_type]
        return [a_type, self.shape.b_type, self.shape.c_type, *extra, ir.IndexType.get()]


@dataclasses.dataclass(frozen=True)
class _Tile:
    """Where a micro-tile is: its batch index (``lead``), its B block (columns from ``jc``, k from ``pc``,
    ``kc`` of them), its A block (rows from ``ic``) and its offset in the blocks (``jr``, ``row``); B's
    packed ``panel`` (None: B read in place, through the ``direct`` columns and masks) and the tile's
    ``rows`` clamped to the part's last (where C is prefetched and an A in place is read; else empty)."""

    lead: list[ir.Value]
    jc: ir.Value
    pc: ir.Value
    kc: ir.Value
    ic: ir.Value
    jr: ir.Value
    row: ir.Value
    panel: ir.Value | None
    direct: list[tuple[ir.Value, ir.Value]]
    rows: list[ir.Value]


@dataclasses.dataclass(frozen=True)
class _Sums:
    """A micro-tile's accumulators after its k loop (``acc``: mr x nv vectors, row-major) and where they
    go: C's element at the tile's corner (``row0``, ``col0``), the rows and columns of the tile inside
    the part (``rvalid``, ``cvalid``), and with zero_init whether this is the first k block (``first``)."""

    lead: list[ir.Value]
    row0: ir.Value
    col0: ir.Value
    rvalid: ir.Value
    cvalid: ir.Value
    acc: list[ir.Value]
    first: ir.Value | None


def _per_thread(extent: int, unit: int, threads: int) -> int:
    """Elements per thread along a split dimension: whole units, spread evenly."""
    units = -(-extent // unit)
    return -(-units // threads) * unit


class _PartBuilder:
    """Builds ``@{name}(A, B, C[, E..., D], t)``, thread part ``t`` of the kernel of a `KernelConfig`
    (see `build_matmul_kernel`), at the current insertion point. The constructor makes the function and
    its prologue (this thread's part, the packed and scratch buffers); `build` adds the loop nest, one
    method per loop level and per packing (the module docstring's pseudo-code), and returns it."""

    def __init__(self, config: KernelConfig) -> None:
        self.cfg = cfg = config
        blk, shape = cfg.blk, cfg.shape
        self.L, self.mr, self.nv, self.nr = blk.lanes, blk.mr, blk.nv, blk.nr
        self.M, self.N, self.K = shape.m, shape.n, shape.k
        t = cfg.dtype
        self.vt = ir.VectorType.get([self.L], t)
        self.ct = ir.VectorType.get([self.L], shape.c_type.element_type)  # C's vectors (i32: an i8 product)
        self.mt = ir.VectorType.get([self.L], ir.IntegerType.get_signless(1))
        self.fn = func.FuncOp(cfg.name, (cfg.arg_types, []))
        self.entry = self.fn.add_entry_block()
        self.A, self.B, self.C, *extra, tid = self.entry.arguments
        self.E, self.D = extra[:-1], (extra[-1] if extra else None)
        self.x = x = IndexOps(self.entry)
        c = x.const
        with ir.InsertionPoint(self.entry):
            # The row count: C's row dimension where it is dynamic (then read once, here).
            rank = ir.MemRefType(self.C.type).rank
            self.m_size = memref.dim(self.C, c(rank - 2)) if shape.dynamic_m else c(self.M)
            self.n_size = memref.dim(self.C, c(rank - 1)) if shape.n < 0 else c(self.N)
            self.k_size = memref.dim(self.A, c(rank - 1)) if shape.k < 0 else c(self.K)
            self.b0, self.b1, self.m0, self.m1, self.n0, self.n1 = self._partition(tid)
            self.Ap = memref.alloc(cfg.a_packed_type, [], [], alignment=64) if cfg.packs_a else None
            w = cfg.window
            self.rows = window_rows(w, x, self.m0, self.m1, self.M) if w is not None else None
            self.A_flat = (memref.CollapseShapeOp(ir.MemRefType.get([int(np.prod(w.x_type.shape))], t), self.A,
                                                  reassociation([[0, 1, 2, 3]])).result if w is not None else None)
            # Rows past the part are clamped to its last where a tile reads a whole mr rows.
            self.last_row = x.sub(self.m1, c(1))
            self.Bp = memref.alloc(cfg.b_packed_type, [], [], alignment=64) if cfg.packs_b else None
            # The last k block's sums C + acc, one micro-tile, before the epilogue (see `_update`).
            self.Tp = (memref.alloc(ir.MemRefType.get([self.mr, self.nr], t), [], [], alignment=64)
                       if cfg.stages_sums else None)
            self.vzero = zero_vector(self.vt)
            self.czero = self.vzero if self.ct == self.vt else zero_vector(self.ct)

    def _load(self, src: ir.Value, indices: list[ir.Value], mask: ir.Value) -> ir.Value:
        """``L`` values of ``src`` from ``indices`` (masked lanes zero) in the kernel's vector type: an
        operand of a narrower float is loaded as it is stored and widened (exactly)."""
        narrow = ir.MemRefType(src.type).element_type
        if narrow == self.cfg.dtype:
            return vector.maskedload(self.vt, src, indices, mask, self.vzero)
        nt = ir.VectorType.get([self.L], narrow)
        stored = vector.maskedload(nt, src, indices, mask, zero_vector(nt))
        # i8: exact in f32
        return (arith.sitofp if isinstance(narrow, ir.IntegerType) else arith.extf)(self.vt, stored)

    def _accumulate(self, old: ir.Value, acc: ir.Value) -> ir.Value:
        """C's old vector plus the sums ``acc``, in C's type (an integer C: the exact f32 sums as i32)."""
        if self.ct == self.vt:
            return arith.addf(old, acc)
        return arith.addi(old, arith.fptosi(self.ct, acc))

    def build(self) -> func.FuncOp:
        c = self.x.const
        with ir.InsertionPoint(self.entry):
            _for(self.b0, self.b1, c(1), self._batch_loop)
            for buf in (self.Ap, self.rows, self.Bp, self.Tp):
                if buf is not None:
                    memref.dealloc(buf)
            func.ReturnOp([])
        self.x.hoist()
        return self.fn

    def _partition(self, tid: ir.Value) -> tuple[ir.Value, ...]:
        """This thread's part of the (batch, rows, columns) space: ``b0, b1, m0, m1, n0, n1``."""
        x, c, blk = self.x, self.x.const, self.cfg.blk
        nb, T = max(self.cfg.shape.batch, 1), blk.threads
        # a batch known at call time: C's batch dimension, read once here
        nb_v = memref.dim(self.C, c(0)) if self.cfg.shape.batch < 0 else c(nb)
        b0, b1, m0, m1, n0, n1 = c(0), nb_v, c(0), self.m_size, c(0), self.n_size
        if T > 1:
            if blk.split == "batch" and self.cfg.shape.batch < 0:  # whole batches per thread, at run time
                per_v = x.divu(x.add(nb_v, c(T - 1)), c(T))
                b0 = x.mul(tid, per_v)
                b1 = x.min(x.add(b0, per_v), nb_v)
            elif blk.split == "batch":
                per = _per_thread(nb, 1, T)
                b0 = x.mul(tid, c(per))
                b1 = x.min(x.add(b0, c(per)), c(nb))
            elif blk.split == "m":
                if self.cfg.shape.dynamic_m:  # whole tiles per thread, spread evenly: `_per_thread` at run time
                    tiles = x.divu(x.add(self.m_size, c(self.mr - 1)), c(self.mr))
                    per_v = x.mul(x.divu(x.add(tiles, c(T - 1)), c(T)), c(self.mr))
                    m0 = x.mul(tid, per_v)
                    m1 = x.min(x.add(m0, per_v), self.m_size)
                else:
                    per = _per_thread(self.M, self.mr, T)
                    m0 = x.mul(tid, c(per))
                    m1 = x.min(x.add(m0, c(per)), c(self.M))
            elif self.cfg.shape.n < 0:  # whole register tiles of columns per thread, at run time
                tiles = x.divu(x.add(self.n_size, c(self.nr - 1)), c(self.nr))
                per_v = x.mul(x.divu(x.add(tiles, c(T - 1)), c(T)), c(self.nr))
                n0 = x.mul(tid, per_v)
                n1 = x.min(x.add(n0, per_v), self.n_size)
            else:
                per = _per_thread(self.N, self.nr, T)
                n0 = x.mul(tid, c(per))
                n1 = x.min(x.add(n0, c(per)), c(self.N))
        return b0, b1, m0, m1, n0, n1

    def _a_at(self, lead: list[ir.Value], row: ir.Value, kk: ir.Value) -> ir.Value:
        """A[row, kk], however A is stored."""
        return memref.load(self.A, [*lead, kk, row] if self.cfg.a_km else [*lead, row, kk])

    # -- the loop nest, outside in

    def _batch_loop(self, b: ir.Value) -> None:
        lead = [b] if self.cfg.batched else []  # a plain matmul's b loop runs once
        _for(self.n0, self.n1, self.x.const(self.cfg.blk.nc), lambda jc: self._col_block(lead, jc))

    def _col_block(self, lead: list[ir.Value], jc: ir.Value) -> None:
        x, c, blk = self.x, self.x.const, self.cfg.blk
        nc = x.min(c(blk.nc), x.sub(self.n1, jc))
        _for(c(0), self.k_size, c(blk.kc), lambda pc: self._k_block(lead, jc, nc, pc))

    def _k_block(self, lead: list[ir.Value], jc: ir.Value, nc: ir.Value, pc: ir.Value) -> None:
        x, c, blk = self.x, self.x.const, self.cfg.blk
        kc = x.min(c(blk.kc), x.sub(self.k_size, pc))
        if self.Bp is not None and self.cfg.b_nk:
            self._pack_b_transposed(lead, jc, nc, pc, kc)
        elif self.Bp is not None:
            self._pack_b(lead, jc, nc, pc, kc)
        _for(self.m0, self.m1, c(blk.mc), lambda ic: self._row_block(lead, jc, nc, pc, kc, ic))

    def _row_block(self, lead: list[ir.Value], jc: ir.Value, nc: ir.Value, pc: ir.Value, kc: ir.Value,
                   ic: ir.Value) -> None:
        x, c = self.x, self.x.const
        mc = x.min(c(self.cfg.blk.mc), x.sub(self.m1, ic))
        if self.cfg.window is not None or self.Ap is None:
            pass  # A is read in place
        elif not self.cfg.a_km:
            self._pack_a_transposed(lead, pc, kc, ic, mc)
        else:
            self._pack_a(lead, pc, kc, ic, mc)
        _for(c(0), nc, c(self.nr), lambda jr: self._micro_col(lead, jc, pc, kc, ic, mc, jr))

    def _micro_col(self, lead: list[ir.Value], jc: ir.Value, pc: ir.Value, kc: ir.Value, ic: ir.Value,
                   mc: ir.Value, jr: ir.Value) -> None:
        x, c, nr, L = self.x, self.x.const, self.nr, self.L
        # B's packed micro-panel: in this block's copy, or in the whole prepacked B
        panel = (x.divu(jr, c(nr)) if self.Bp is not None else x.divu(x.add(jc, jr), c(nr))
                 if self.cfg.prepacked_b else None)
        direct = []  # without packing: B's columns of this panel, and their masks past this thread's columns
        if self.Bp is None and not self.cfg.prepacked_b:
            for v in range(self.nv):
                col = x.add(x.add(jc, jr), c(v * L))
                cnt = x.min(x.max(x.sub(self.n1, col), c(0)), c(L))
                direct.append((col, vector.create_mask(self.mt, [cnt])))
        _for(c(0), mc, c(self.mr), lambda row: self._micro_tile(lead, jc, pc, kc, ic, jr, row, panel, direct))

    # -- packing

    def _pack_b(self, lead: list[ir.Value], jc: ir.Value, nc: ir.Value, pc: ir.Value, kc: ir.Value) -> None:
        """Pack B: Bp[jb, k, :] = B[pc + k, jc + jb*nr + :]  (masked past this thread's columns),
        `PACK_B_ROWS` rows of B at a time across every panel (see there)."""
        x, c, L, nr, Bp = self.x, self.x.const, self.L, self.nr, self.Bp
        assert Bp is not None
        npanels = x.divu(x.add(nc, c(nr - 1)), c(nr))

        def b_rows(k0: ir.Value) -> None:
            k1 = x.min(x.add(k0, c(PACK_B_ROWS)), kc)

            def b_panel(jb: ir.Value) -> None:
                colbase = x.add(jc, x.mul(jb, c(nr)))
                cols = []
                for v in range(self.nv):
                    col = x.add(colbase, c(v * L))
                    cnt = x.min(x.max(x.sub(self.n1, col), c(0)), c(L))
                    cols.append((col, vector.create_mask(self.mt, [cnt])))

                def b_row(kb: ir.Value) -> None:
                    krow = x.add(pc, kb)
                    for v, (col, msk) in enumerate(cols):
                        val = self._load(self.B, [*lead, krow, col], msk)
                        vector.store(val, Bp, [jb, kb, c(v * L)])

                _for(k0, k1, c(1), b_row)

            _for(c(0), npanels, c(1), b_panel)

        _for(c(0), kc, c(PACK_B_ROWS), b_rows)

    def _transposing_pack(self, src: ir.Value, src_type: ir.MemRefType, lead: list[ir.Value], rows: list[ir.Value],
                          k0: ir.Value, kc: ir.Value, store: Callable[[ir.Value, int, int, ir.Value], None]) -> None:
        """Read ``src[row, k0 + k]`` for ``k`` in ``[0, kc)`` and each of ``rows`` (whole groups of L) an
        L x L block at a time: L vector loads along k (masked past kc), `transpose_vectors`, then
        ``store(kb, s, group, vector)`` gets, for k = kb + s, the group's L rows as one vector.

        The loads go a whole cache line at a time: a short head block first (up to where the first row
        reaches an L-aligned address; the junk its vectors hold past the head is stored where the next
        block stores again), then aligned blocks. (An unaligned load straddles two lines, and rows a
        power-of-two stride apart share cache sets: every line came from L2 twice.)"""
        x, c, L = self.x, self.x.const, self.L
        strides, offset = src_type.get_strides_and_offset()
        dynamic = ir.ShapedType.get_dynamic_stride_or_offset()

        def block(kb: ir.Value, count: ir.Value) -> None:
            msk = vector.create_mask(self.mt, [count])
            kcol = x.add(k0, kb)
            for g in range(len(rows) // L):
                loads = [self._load(src, [*lead, rows[g * L + j], kcol], msk)
                         for j in range(L)]
                for s_, val in enumerate(transpose_vectors(loads)):
                    store(kb, s_, g, val)

        if offset == dynamic or dynamic in strides:
            _for(c(0), kc, c(L), lambda kb: block(kb, x.min(x.sub(kc, kb), c(L))))
            return
        element_bytes = element_bits(ir.MemRefType(src.type).element_type) // 8
        first = x.add(x.divu(memref.extract_aligned_pointer_as_index(src), c(element_bytes)), c(offset))
        if lead:
            first = x.add(first, x.mul(lead[0], c(strides[0])))
        first = x.add(x.add(first, x.mul(rows[0], c(strides[-2]))), k0)
        head = x.min(arith.remui(x.sub(c(L), arith.remui(first, c(L))), c(L)), kc)
        # Block i: the head [0, head) for i = 0 (skipped when empty), then [head + (i-1) L, +L).
        start = arith.select(arith.cmpi(arith.CmpIPredicate.eq, head, c(0)), c(1), c(0))
        blocks = x.divu(x.add(x.sub(kc, head), c(L - 1)), c(L))

        def numbered(i: ir.Value) -> None:
            is_head = arith.cmpi(arith.CmpIPredicate.eq, i, c(0))
            kb = arith.select(is_head, c(0), x.add(head, x.mul(x.sub(i, c(1)), c(L))))
            block(kb, arith.select(is_head, head, x.min(x.sub(kc, kb), c(L))))

        _for(start, x.add(blocks, c(1)), c(1), numbered)

    def _pack_b_transposed(self, lead: list[ir.Value], jc: ir.Value, nc: ir.Value, pc: ir.Value, kc: ir.Value
                           ) -> None:
        """Pack B stored [n, k]: Bp[jb, k, :] = Bs[jc + jb*nr + :, pc + k] (`_transposing_pack`). Columns
        past this thread's last read that column (their results are never stored)."""
        x, c, L, nr, Bp = self.x, self.x.const, self.L, self.nr, self.Bp
        assert Bp is not None
        npanels = x.divu(x.add(nc, c(nr - 1)), c(nr))

        def b_panel(jb: ir.Value) -> None:
            colbase = x.add(jc, x.mul(jb, c(nr)))
            cols = [x.min(x.add(colbase, c(j)) if j else colbase, x.sub(self.n1, c(1))) for j in range(nr)]
            # One group of L rows at a time through the whole k block: L streams of B at once (all nr
            # rows at once are more streams than the prefetchers follow).
            for v in range(self.nv):
                def store(kb: ir.Value, s_: int, _g: int, val: ir.Value, v: int = v) -> None:
                    vector.store(val, Bp, [jb, x.add(kb, c(s_)) if s_ else kb, c(v * L)])

                self._transposing_pack(self.B, self.cfg.shape.b_type, lead, cols[v * L:(v + 1) * L], pc, kc, store)

        _for(c(0), npanels, c(1), b_panel)

    def _pack_a_transposed(self, lead: list[ir.Value], pc: ir.Value, kc: ir.Value, ic: ir.Value, mc: ir.Value
                           ) -> None:
        """Pack A stored [m, k] into its k-major micro-panels: Ap[ib, k, i] = A[ic + ib*mr + i, pc + k]
        (`_transposing_pack`, the mr rows padded to whole groups of L; each stored vector masked to the
        panel's mr lanes). Rows past the block read its last row (never stored)."""
        x, c, L, mr, Ap = self.x, self.x.const, self.L, self.mr, self.Ap
        assert Ap is not None
        last = x.sub(x.add(ic, mc), c(1))
        groups = -(-mr // L)
        lanes = [vector.create_mask(self.mt, [c(min(L, mr - g * L))]) for g in range(groups)]

        def a_panel(ib: ir.Value) -> None:
            base = x.add(ic, x.mul(ib, c(mr)))
            rows = [x.min(x.add(base, c(i)) if i else base, last) for i in range(mr)]
            rows += [rows[-1]] * (groups * L - mr)
            self._transposing_pack(self.A, self.cfg.shape.a_type, lead, rows, pc, kc,
                                   lambda kb, s_, g, val: vector.maskedstore(
                                       Ap, [ib, x.add(kb, c(s_)) if s_ else kb, c(g * L)], lanes[g], val))

        _for(c(0), x.divu(x.add(mc, c(mr - 1)), c(mr)), c(1), a_panel)

    def _pack_a(self, lead: list[ir.Value], pc: ir.Value, kc: ir.Value, ic: ir.Value, mc: ir.Value) -> None:
        """Pack A stored [k, m]: Ap[ib, ka, :mr] = A[pc + ka, ic + ib*mr :+ mr] (k-major mr-row micro-panels),
        a row of A (the block's mc values of one k) at a time, each panel's mr values as masked vectors
        (rows past the block are not read; the kernel never stores their results)."""
        x, c, L, mr, Ap = self.x, self.x.const, self.L, self.mr, self.Ap
        assert Ap is not None
        groups = -(-mr // L)

        def a_k(ka: ir.Value) -> None:
            krow = x.add(pc, ka)

            def a_panel(ib: ir.Value) -> None:
                base = x.mul(ib, c(mr))
                for g in range(groups):
                    off = x.add(base, c(g * L)) if g else base
                    msk = vector.create_mask(self.mt, [x.min(x.max(x.sub(mc, off), c(0)), c(min(L, mr - g * L)))])
                    val = self._load(self.A, [*lead, krow, x.add(ic, off)], msk)
                    vector.maskedstore(Ap, [ib, ka, c(g * L)], msk, val)

            _for(c(0), x.divu(x.add(mc, c(mr - 1)), c(mr)), c(1), a_panel)

        _for(c(0), kc, c(1), a_k)

    # -- the micro-kernel

    def _micro_tile(self, lead: list[ir.Value], jc: ir.Value, pc: ir.Value, kc: ir.Value, ic: ir.Value,
                    jr: ir.Value, row: ir.Value, panel: ir.Value | None, direct: list[tuple[ir.Value, ir.Value]]
                    ) -> None:
        """The micro-kernel: mr x nv accumulators carried through the k loop, in registers (fewer in the
        tiles at the edges, see `tile_variants`), then C (+)= them (`_update`, `_update_transposed`)."""
        cfg, x, c, mr, nv = self.cfg, self.x, self.x.const, self.mr, self.nv
        prefetch = cfg.blk.prefetch_c and not cfg.c_nm
        rows = ([x.min(x.add(x.add(ic, row), c(i)), self.last_row) for i in range(mr)]
                if prefetch or (cfg.window is None and self.Ap is None) else [])
        tile = _Tile(lead, jc, pc, kc, ic, jr, row, panel, direct, rows)
        if prefetch:
            self._prefetch_c(tile)
        row0 = x.add(ic, row)
        col0 = x.add(jc, jr)
        rvalid = x.min(x.sub(self.m1, row0), c(mr))
        cvalid = x.min(x.sub(self.n1, col0), c(self.nr))
        full_r = arith.cmpi(arith.CmpIPredicate.eq, rvalid, c(mr))
        full_c = arith.cmpi(arith.CmpIPredicate.eq, cvalid, c(self.nr))
        accs = [self.vt] * (mr * nv)

        # The tiles at the op's edges compute only the rows and vectors they store (`tile_variants`).
        edge_rows, edge_vecs = tile_variants(max(self.M, 0), max(self.N, 0), mr, nv, self.L)

        def dynamic_cols(nrows: int, vecs: int) -> list[ir.Value]:
            """A dynamic column count: the fewest vectors covering ``cvalid`` columns (``vecs`` and up)."""
            if vecs >= nv:
                return self._k_loop(tile, nrows, nv)
            fits = arith.cmpi(arith.CmpIPredicate.sle, cvalid, c(vecs * self.L))
            return _if_values(fits, accs, lambda: self._k_loop(tile, nrows, vecs), lambda: dynamic_cols(nrows, vecs + 1))

        def cols(nrows: int) -> list[ir.Value]:
            if cfg.shape.n < 0 and nv > 1:
                return _if_values(full_c, accs, lambda: self._k_loop(tile, nrows, nv), lambda: dynamic_cols(nrows, 1))
            if edge_vecs:
                return _if_values(full_c, accs, lambda: self._k_loop(tile, nrows, nv),
                                  lambda: self._k_loop(tile, nrows, edge_vecs))
            return self._k_loop(tile, nrows, nv)

        def dynamic_rows(variants: tuple[int, ...]) -> list[ir.Value]:
            """The smallest variant of at least ``rvalid`` rows (`edge_row_variants`), a whole tile above them."""
            if not variants:
                return cols(mr)
            fits = arith.cmpi(arith.CmpIPredicate.sle, rvalid, c(variants[0]))
            return _if_values(fits, accs, lambda: cols(variants[0]), lambda: dynamic_rows(variants[1:]))

        if cfg.shape.dynamic_m:
            variants = edge_row_variants(mr)
            acc = _if_values(full_r, accs, lambda: cols(mr), lambda: dynamic_rows(variants)) if variants else cols(mr)
        else:
            acc = _if_values(full_r, accs, lambda: cols(mr), lambda: cols(edge_rows)) if edge_rows else cols(mr)

        # C += acc: whole tiles unmasked; edge tiles masked by row (scf.if) and column (vector masks).
        full = arith.andi(full_r, full_c)
        first = arith.cmpi(arith.CmpIPredicate.eq, pc, c(0)) if cfg.zero_init else None
        sums = _Sums(lead, row0, col0, rvalid, cvalid, acc, first)
        update = self._update_transposed if cfg.c_nm else self._update

        def both(fused: bool) -> None:
            _if(full, lambda: update(sums, False, fused), lambda: update(sums, True, fused))

        if cfg.epilogue is None:
            both(False)
        else:
            last = arith.cmpi(arith.CmpIPredicate.sge, x.add(pc, kc), self.k_size)
            _if(last, lambda: both(True), lambda: both(False))

    def _prefetch_c(self, tile: _Tile) -> None:
        """Prefetch (for writing) the lines the update after the k loop touches: C's; on the last k block
        with an epilogue D's, and C's unless that block is also the first with zero_init (C is then not
        read)."""
        cfg, x, c = self.cfg, self.x, self.x.const
        pcols = [x.min(x.add(x.add(tile.jc, tile.jr), c(v * self.L)), x.sub(self.n1, c(1))) for v in range(self.nv)]

        def prefetch(buf: ir.Value) -> None:
            for r in tile.rows:
                for col in pcols:
                    memref.prefetch(buf, [*tile.lead, r, col], True, 3, True)

        if cfg.epilogue is None:
            prefetch(self.C)
            return

        def last_block() -> None:
            assert self.D is not None
            prefetch(self.D)
            if cfg.zero_init:
                _if(arith.cmpi(arith.CmpIPredicate.ne, tile.pc, c(0)), lambda: prefetch(self.C))
            else:
                prefetch(self.C)

        _if(arith.cmpi(arith.CmpIPredicate.sge, x.add(tile.pc, tile.kc), self.k_size), last_block,
            lambda: prefetch(self.C))

    def _b_vectors(self, tile: _Tile, k: ir.Value, vecs: int) -> list[ir.Value]:
        """B's first ``vecs`` vectors of the tile's columns at step ``k`` of the k block."""
        c, L = self.x.const, self.L
        bvs = []
        for v in range(vecs):
            if tile.direct:
                col, msk = tile.direct[v]
                bvs.append(vector.maskedload(self.vt, self.B, [*tile.lead, self.x.add(tile.pc, k), col], msk,
                                             self.vzero))
            elif self.cfg.prepacked_b:
                assert tile.panel is not None
                bvs.append(vector.load(self.vt, self.B, [tile.panel, self.x.add(tile.pc, k), c(v * L)]))
            else:
                assert self.Bp is not None and tile.panel is not None
                bvs.append(vector.load(self.vt, self.Bp, [tile.panel, k, c(v * L)]))
        return bvs

    def _fmas(self, avals: list[ir.Value], bvs: list[ir.Value], accs: list[ir.Value]) -> list[ir.Value]:
        """One k step: each row's A value broadcast times each of B's vectors, added to its accumulator."""
        outs = []
        for i, a_val in enumerate(avals):
            ab = vector.broadcast(self.vt, a_val)
            outs += [vector.fma(ab, bv, accs[i * len(bvs) + v]) for v, bv in enumerate(bvs)]
        return outs

    def _k_loop(self, tile: _Tile, nrows: int, vecs: int) -> list[ir.Value]:
        """The k loop of a tile of ``nrows`` rows and ``vecs`` vectors of columns: its accumulators in the
        tile's mr x nv order, zeros for the rows and vectors it does not compute."""
        x, c, vzero, window = self.x, self.x.const, self.vzero, self.cfg.window
        if window is not None:
            A_flat = self.A_flat
            assert self.rows is not None and A_flat is not None
            acc = window_k_loop(
                self.rows, window, x, nrows, self.last_row, x.add(tile.ic, tile.row), tile.pc, tile.kc,
                [vzero] * (nrows * vecs),
                lambda k, addr, accs: self._fmas([memref.load(A_flat, [addr(i)]) for i in range(nrows)],
                                                 self._b_vectors(tile, k, vecs), accs))
        else:
            apanel = x.divu(tile.row, c(self.mr)) if self.Ap is not None else None
            loop = scf.ForOp(c(0), tile.kc, c(1), [vzero] * (nrows * vecs))
            with ir.InsertionPoint(loop.body):
                k = loop.induction_variable
                if self.Ap is None:  # A in place
                    ka = x.add(tile.pc, k)
                    avals = [self._a_at(tile.lead, r, ka) for r in tile.rows[:nrows]]
                else:
                    avals = [memref.load(self.Ap, [apanel, k, c(i)]) for i in range(nrows)]
                scf.YieldOp(self._fmas(avals, self._b_vectors(tile, k, vecs), list(loop.inner_iter_args)))
            acc = list(loop.results)
        return [acc[i * vecs + v] if i < nrows and v < vecs else vzero for i in range(self.mr) for v in range(self.nv)]

    # -- the update of C (and the epilogue)

    def _update(self, s: _Sums, masked: bool, fused: bool) -> None:
        """C (+)= acc for this micro-tile; on the last k block with an epilogue, the epilogue's value goes
        to D instead.

        With the epilogue, the sums C + acc are first stored to the scratch tile ``Tp`` (which frees the
        mr x nv accumulator registers), then a loop over the tile's rows applies the epilogue to one row
        of nv vectors at a time: its temporaries and constants then have the register file to themselves
        instead of spilling around 28 live accumulators."""
        x, c, L = self.x, self.x.const, self.L
        vmasks = []
        if masked:
            for v in range(self.nv):
                cnt = x.min(x.max(x.sub(s.cvalid, c(v * L)), c(0)), c(L))
                vmasks.append(vector.create_mask(self.mt, [cnt]))
        for i in range(self.mr):
            if masked:
                ok = arith.cmpi(arith.CmpIPredicate.slt, c(i), s.rvalid)
                _if(ok, functools.partial(self._store_row, s, i, vmasks, fused))
            else:
                self._store_row(s, i, vmasks, fused)
        if fused:
            _for(c(0), s.rvalid if masked else c(self.mr), c(1), lambda i: self._epilogue_row(s, i, vmasks))

    def _load_c(self, s: _Sums, r: ir.Value, col: ir.Value, mask: ir.Value | None) -> ir.Value:
        """C[r, col:+L] before this k block's sums: zero on the first block with zero_init."""
        def load() -> list[ir.Value]:
            if mask is not None:
                return [vector.maskedload(self.ct, self.C, [*s.lead, r, col], mask, self.czero)]
            return [vector.load(self.ct, self.C, [*s.lead, r, col])]

        if s.first is None:
            return load()[0]
        return _if_values(s.first, [self.ct], lambda: [self.czero], load)[0]

    def _store_row(self, s: _Sums, i: int, vmasks: list[ir.Value], fused: bool) -> None:
        """Row i of the micro-tile: C + acc to C, or to the scratch tile when the epilogue follows."""
        x, c, L = self.x, self.x.const, self.L
        r = x.add(s.row0, c(i)) if i else s.row0
        for v in range(self.nv):
            col = x.add(s.col0, c(v * L)) if v else s.col0
            mask = vmasks[v] if vmasks else None
            new = self._accumulate(self._load_c(s, r, col, mask), s.acc[i * self.nv + v])
            if fused:  # the epilogue follows, row by row (see `_update`)
                assert self.Tp is not None
                vector.store(new, self.Tp, [c(i), c(v * L)])
            elif mask is not None:
                vector.maskedstore(self.C, [*s.lead, r, col], mask, new)
            else:
                vector.store(new, self.C, [*s.lead, r, col])

    def _epilogue_row(self, s: _Sums, i: ir.Value, vmasks: list[ir.Value]) -> None:
        """D[row i of the micro-tile] = epilogue(Tp[i])."""
        x, c, L, epilogue, D, Tp = self.x, self.x.const, self.L, self.cfg.epilogue, self.D, self.Tp
        assert epilogue is not None and D is not None and Tp is not None
        r = x.add(s.row0, i)
        for v in range(self.nv):
            col = x.add(s.col0, c(v * L)) if v else s.col0
            mask = vmasks[v] if vmasks else None
            new = _epilogue_values(epilogue, self.E, vector.load(self.vt, Tp, [i, c(v * L)]), s.lead, r, col, mask,
                                   self.vzero)
            if mask is not None:
                vector.maskedstore(D, [*s.lead, r, col], mask, new)
            else:
                vector.store(new, D, [*s.lead, r, col])

    def _update_transposed(self, s: _Sums, masked: bool, fused: bool) -> None:
        """C stored [n, m] (the kernel's columns are its rows): each L x L block of accumulators (L kernel
        columns by up to L kernel rows, zeros past mr) is transposed in registers, and each stored row it
        covers is updated with one vector masked to the tile's rows; on the last k block with an epilogue,
        in C's stored frame (its inputs' kinds are the stored C's)."""
        x, c, L, mr, nv = self.x, self.x.const, self.L, self.mr, self.nv
        for v in range(nv):
            for i0 in range(0, mr, L):
                width = min(L, mr - i0)
                cnt = x.min(x.max(x.sub(s.rvalid, c(i0)), c(0)), c(width)) if masked else c(width)
                lanes = vector.create_mask(self.mt, [cnt])
                scol = x.add(s.row0, c(i0)) if i0 else s.row0
                block = [s.acc[(i0 + i) * nv + v] if i0 + i < mr else self.vzero for i in range(L)]
                for j, val in enumerate(transpose_vectors(block)):
                    srow = x.add(s.col0, c(v * L + j)) if v * L + j else s.col0
                    row = functools.partial(self._store_stored_row, s, srow, scol, lanes, val, fused)
                    if masked:
                        _if(arith.cmpi(arith.CmpIPredicate.slt, c(v * L + j), s.cvalid), row)
                    else:
                        row()

    def _store_stored_row(self, s: _Sums, srow: ir.Value, scol: ir.Value, lanes: ir.Value, val: ir.Value,
                          fused: bool) -> None:
        """C[srow, scol:+L] (+)= val on the lanes of the mask, through the epilogue into D when fused."""
        new = self._accumulate(self._load_c(s, srow, scol, lanes), val)
        if fused:
            assert self.cfg.epilogue is not None and self.D is not None
            new = _epilogue_values(self.cfg.epilogue, self.E, new, s.lead, srow, scol, lanes, self.vzero)
        vector.maskedstore(self.D if fused else self.C, [*s.lead, srow, scol], lanes, new)
