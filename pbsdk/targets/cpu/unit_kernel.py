"""The cpu target's lowering of a register tile of matrix-unit instructions kept in the vector registers
(``MatrixUnit.registers == "vector"``: AVX512-BF16's ``vdpbf16ps``, VNNI's ``vpdpbusd``): the packed kernel
of a (batched) bf16 or int8 matmul, built from its plan with the MLIR bindings' op builders.

Each instruction updates ``L`` accumulator lanes (``L = Blocking.lanes``) with the products of ``u``
values of k (``u = Blocking.unit_k``: 2 bf16, 4 int8): lane ``j`` of ``acc`` gains
``sum_t a[t] * b[j*u + t]``, where ``a`` is one group of ``u`` values of a row of A broadcast to every lane
and ``b`` holds ``u`` rows of B interleaved. The loop nest is the BLIS one of the f32 kernel
(`pbsdk.targets.cpu.matmul_kernel`), with k counted in groups of ``u``:

    for (batch, rows, cols) of this thread's part                 -- parallel over the spec's cores
      for jc in cols step NC
        for pc in 0..K step KC
          pack B[pc:+kc, jc:+nc]: panels [nc/nr][kc/u][nr*u], u rows interleaved (zero past K and N)
          for ic in rows step MC
            pack A[ic:+mc, pc:+kc]: panels [mc/mr][kc/u][mr*u], a row's u values together (or read in place)
            for jr, ir: micro-kernel: mr x nv accumulators carried through the groups of k as loop-carried
                        values; per group one broadcast of A per row, one vector of B per column of
                        vectors, mr*nv unit steps; then C (+)= acc, masked at the edges

The unit step itself is the target's hook (`pbsdk.targets.cpu.hooks.unit_step`): an LLVM intrinsic
through the LLVM dialect's ``call_intrinsic``. int8: ``vpdpbusd`` multiplies *unsigned* bytes of A by
signed bytes of B; the kernel flips A's sign bits (``a + 128``, an exact u8) and starts each accumulator at
``-128 * sum_k B[k, j]`` (the packing computes that sum with the same instruction), so the result is the
exact i32 product of two i8 matrices.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import numpy as np
from mlir import ir
from mlir.dialects import arith, func, memref, vector

from pbsdk.core.ir.builder import Indices, body_on_vectors, call_parts, on_vectors, zero_vector
from pbsdk.core.ir.builder import for_each as _for
from pbsdk.core.ir.builder import for_values as _for_values
from pbsdk.core.ir.builder import if_then as _if
from pbsdk.core.ir.builder import if_values as _if_values
from pbsdk.core.plan.contraction import Blocking
from pbsdk.core.spec import dtype_bits
from pbsdk.targets.cpu.matmul_kernel import IndexOps, Window, window_k_loop, window_rows

#: The operand element types a unit kernel is built for, and their accumulator's. A step's depth is the
#: values of the type the unit reads in one 32-bit group (`group_size`).
OPERANDS = {"bf16": "f32", "i8": "i32"}


@dataclasses.dataclass(frozen=True)
class UnitShape:
    """``C[b, m, n] (+)= A[b, m, k] * B[b, k, n]``: A and B of ``operand`` (bf16 or i8), C of the unit's
    accumulator (f32 or i32), row-major with unit innermost strides; ``batch`` 0 for rank-2 operands.
    ``unit_type``: the wider integer type the unit's instruction reads A and B in (`MatrixUnit.register_dtype`),
    each value sign-extended into it as it is packed or broadcast; None: the operands' own (a B packed at
    compile time then comes in that type)."""

    m: int
    n: int
    k: int
    batch: int
    a_type: ir.MemRefType
    b_type: ir.MemRefType
    c_type: ir.MemRefType
    unit_type: ir.Type | None = None

    @property
    def operand(self) -> str:
        return str(self.a_type.element_type)

    @property
    def reads(self) -> ir.Type:
        """The element type the unit's instructions read (and packed panels hold)."""
        return self.unit_type or self.a_type.element_type


StepFn = Callable[[ir.Value, ir.Value, ir.Value], ir.Value]


def group_size(dtype: str) -> int:
    """Values of ``dtype`` (a spec dtype name, or an element type's printed form) in one 32-bit group: the k
    a unit step in the vector registers consumes, and the rows of B packed panels interleave
    (`pack_unit_panels`) for every unit."""
    return 32 // dtype_bits(dtype)


def group_word(group: ir.Value) -> ir.Value:
    """A group of values filling 32 bits (``vector<u x T>``: a pair of bf16, four i8) as one i32."""
    i32 = ir.IntegerType.get_signless(32)
    return vector.extract(vector.bitcast(ir.VectorType.get([1], i32), group), [], [0])


def broadcast_word(word: ir.Value, wide_t: ir.VectorType) -> ir.Value:
    """The i32 ``word`` in every 32-bit lane of ``wide_t`` (e.g. ``vector<32xbf16>``): a dot-product
    unit's broadcast operand, one group of k values of A for every lane."""
    lanes = wide_t.shape[0] * wide_t.element_type.width // 32
    return vector.bitcast(wide_t, vector.broadcast(ir.VectorType.get([lanes], word.type), word))


def interleave(rows: list[ir.Value], lanes: int) -> ir.Value:
    """``u`` vectors of ``lanes`` values as one unit operand: element ``j*u + t`` is ``rows[t][j]`` (u a
    power of two; ``vector.shuffle`` pairwise)."""
    while len(rows) > 1:
        n = ir.VectorType(rows[0].type).shape[0]
        w = n // lanes  # values of one lane's group so far
        mask = [s * n + j * w + e for j in range(lanes) for s in range(2) for e in range(w)]
        rows = [vector.shuffle(rows[i], rows[i + 1], mask) for i in range(0, len(rows), 2)]
    return rows[0]


def unit_packed_shape(k: int, n: int, nr: int, u: int, k_multiple: int = 1) -> tuple[int, int, int]:
    """The shape of B (k x n) packed by `pack_unit_panels`: ``(ceil(n/nr), ceil(k'/u), nr*u)`` with ``k'``
    k rounded up to ``k_multiple`` (a tile kernel's k block, as the compile-time packing of a weight lays it out)."""
    k = -(-k // k_multiple) * k_multiple
    return (-(-n // nr), -(-k // u), nr * u)


def pack_unit_panels(b: np.ndarray, nr: int, u: int, lanes: int, k_multiple: int = 1) -> np.ndarray:
    """B (k x n) as a unit kernel's panels at compile time: ``out[p, g, v*L*u + j*u + t] = b[g*u + t,
    p*nr + v*L + j]`` (``L = lanes``), zero past k and n; C order, 64-byte aligned: what the kernel packs
    per call otherwise (`_UnitKernel.pack_b_panel`)."""
    from pbsdk.core.runtime.kernel import aligned_empty

    k, n = b.shape
    panels, groups, width = unit_packed_shape(k, n, nr, u, k_multiple)
    padded = np.zeros((groups * u, panels * nr), b.dtype)
    padded[:k, :n] = b
    # [g, t, p, v, j] -> [p, g, v, j, t]
    laid = padded.reshape(groups, u, panels, nr // lanes, lanes).transpose(2, 0, 3, 4, 1)
    out = aligned_empty(panels * groups * width * b.dtype.itemsize, 64).view(b.dtype).reshape(panels, groups, width)
    out[...] = laid.reshape(panels, groups, width)
    return out


@dataclasses.dataclass(frozen=True)
class UnitEpilogue:
    """An elementwise ``linalg.generic`` after the product, folded into the kernel's last store: it reads
    the product (C) once at the identity map, and inputs ``E`` whose maps pick loops of the output
    (``dims``: per input dimension, the output loop it walks, None for a unit dimension), and writes ``D``
    (any element type: bf16 rounded back, i8 requantized) at the identity map. ``body`` is the generic's
    region: its arith and math ops are built again on vectors (`vectorize`)."""

    generic: ir.Operation = dataclasses.field(compare=False)
    c_arg: int
    dims: tuple[tuple[int | None, ...], ...]
    input_types: tuple[ir.MemRefType, ...]
    out_type: ir.MemRefType


def find_epilogue(mm: ir.Operation) -> tuple[UnitEpilogue, list[ir.Value]] | None:
    """The `UnitEpilogue` right after the contraction ``mm`` (on buffers) and its operands (inputs, then
    D), or None if the next op is not one the kernel can fold."""
    from pbsdk.core.passes import map_dims

    ops = [o.operation for o in mm.block.operations]
    at = next(i for i, o in enumerate(ops) if o == mm)
    gen = ops[at + 1] if at + 1 < len(ops) else None
    if gen is None or gen.name != "linalg.generic" or gen.results:
        return None
    c = mm.operands[2]
    iters = [str(a) for a in ir.ArrayAttr(gen.attributes["iterator_types"])]
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(gen.attributes["indexing_maps"])]
    operands = list(gen.operands)
    n_in, rank = len(operands) - 1, len(iters)
    ident = ir.AffineMap.get_identity(rank, context=c.type.context)
    reads = [i for i in range(n_in) if operands[i] == c]
    out = operands[n_in]
    if (any("parallel" not in i for i in iters) or len(reads) != 1 or maps[reads[0]] != ident
            or maps[n_in] != ident or not isinstance(out.type, ir.MemRefType)
            or list(ir.MemRefType(out.type).shape) != list(ir.MemRefType(c.type).shape)
            or ir.MemRefType(out.type).get_strides_and_offset()[0][-1] != 1):
        return None
    body = gen.regions[0].blocks[0]
    if list(body.arguments[n_in].uses) or not all(on_vectors(o.operation) for o in body.operations):
        return None
    dims, types, values = [], [], []
    for i in range(n_in):
        if i == reads[0]:
            continue
        found = map_dims(maps[i])
        t = operands[i].type
        if found is None or not isinstance(t, ir.MemRefType):
            return None
        dims.append(tuple(found))
        types.append(ir.MemRefType(t))
        values.append(operands[i])
    return UnitEpilogue(gen, reads[0], tuple(dims), tuple(types), ir.MemRefType(out.type)), values + [out]


def vectorize(ep: UnitEpilogue, args: Sequence[ir.Value], lanes: int) -> ir.Value:
    """Build ``ep``'s body on vectors of ``lanes`` at the insertion point: ``args`` holds a vector per body
    argument (inputs, C's in place of its argument); returns the yielded vector (`body_on_vectors`)."""
    return body_on_vectors(ep.generic.regions[0].blocks[0], args, lanes)[0]


def check_window(shape: UnitShape, blk: Blocking, prepacked: bool, tile: bool, window: Window) -> None:
    """Raise ValueError unless ``window`` can be read in place by a unit kernel of ``blk``: a plain matmul on
    vector registers, A not packed, k runs of whole groups (runs padded to groups only with B packed at
    compile time, its zero rows in place: `pad_runs`), ``kc`` whole runs or dividing one, and no read past
    the end of X."""
    u = group_size(str(shape.reads))
    k_run = window.k_run
    if tile:  # the tile kernel packs A from the window, a step's k_step values from one tap's channels
        if shape.batch or not blk.pack_a or window.row_runs or window.channels % blk.unit_k or shape.k % k_run:
            raise ValueError(f"tile kernel: a window needs a plain matmul, A packed, and each tap's "
                             f"{window.channels} channels in whole steps of {blk.unit_k}")
        return
    if shape.batch or blk.pack_a or k_run % u or (blk.kc % k_run and k_run % blk.kc) \
            or (k_run != window.run and not prepacked):
        raise ValueError(f"unit kernel: a window needs a plain matmul on vector registers, A read in place, runs "
                         f"of whole {u}-groups (run {window.run}, {k_run} k values) padded only in a B packed "
                         f"ahead, and kc {blk.kc} in whole runs or dividing one")
    if shape.k % k_run or window.last_read() > math.prod(window.x_type.shape):
        raise ValueError(f"unit kernel: k {shape.k} is no whole number of {k_run}-value runs, or the last run "
                         f"reads past the end of {window.x_type}")


def check(shape: UnitShape, blk: Blocking, prepacked: bool = False, tile: bool = False,
          window: Window | None = None) -> None:
    """Raise ValueError unless the kernel can be built for ``shape`` and ``blk`` (validated once, before any
    IR is built)."""
    if shape.operand not in OPERANDS:
        raise ValueError(f"unit kernel: operands of {shape.operand}; supported: {', '.join(OPERANDS)}")
    acc = OPERANDS[shape.operand]
    reads = shape.reads
    u = group_size(str(reads))
    if blk.unit == "" or (not tile and blk.unit_k != u) or blk.unit_k % u:
        raise ValueError(f"unit kernel: blocking for unit {blk.unit!r} k {blk.unit_k}, not a 32-bit group of "
                         f"{reads} ({shape.operand} operands)")
    if shape.unit_type is not None and (not isinstance(reads, ir.IntegerType) or shape.operand != "i8" or tile
                                        or reads.width <= 8):
        raise ValueError(f"unit kernel: i8 operands widen to a wider integer type in the vector registers, not "
                         f"{shape.operand} to {reads}")
    want = unit_packed_shape(shape.k, shape.n, blk.nr, u, blk.kc if tile else 1)
    if prepacked and (shape.batch or list(shape.b_type.shape) != list(want)):
        raise ValueError(f"unit kernel: a prepacked B needs a plain matmul and B packed for nr {blk.nr} "
                         f"{want}, got {shape.b_type}")
    b_wanted = reads if prepacked else shape.a_type.element_type
    if shape.b_type.element_type != b_wanted or str(shape.c_type.element_type) != acc:
        raise ValueError(f"unit kernel: A {shape.a_type}, B {shape.b_type}, C {shape.c_type}: B must be "
                         f"{b_wanted} and C {acc}")
    if blk.transposed or blk.kc % blk.unit_k or blk.mc % blk.mr or blk.nc % blk.nr:
        raise ValueError(f"unit kernel: blocking {blk} is transposed or not in whole groups of {u}")
    if window is not None:
        check_window(shape, blk, prepacked, tile, window)
    rank = 3 if shape.batch else 2
    for t in (shape.a_type, shape.c_type) if prepacked else (shape.a_type, shape.b_type, shape.c_type):
        strides, _ = t.get_strides_and_offset()
        if t.rank != rank or strides[-1] != 1:
            raise ValueError(f"unit kernel: operand {t} is not rank {rank} with a unit innermost stride")


def build_unit_kernel(module: ir.Module, name: str, shape: UnitShape, blk: Blocking, step: StepFn, *,
                      zero_init: bool = False, epilogue: UnitEpilogue | None = None,
                      prepacked_b: bool = False, tiles: str | None = None,
                      window: Window | None = None) -> func.FuncOp:
    """Append ``@{name}_part(A, B, C[, E..., D], t)`` (public: thread part ``t``, for the fork glue) and
    ``@{name}(A, B, C[, E..., D])`` (private: every part, in an ``scf.forall`` when there are several) to
    ``module``; return the latter. ``step(acc, a, b)`` builds one unit instruction. With ``zero_init`` C's
    contents are taken to be zero: its first k block is stored, not added. With an ``epilogue`` the last k
    block stores ``epilogue(C + acc)`` to D instead (C then holds partial sums only, and is not touched at
    all when one k block covers K). With ``prepacked_b`` B comes as `pack_unit_panels` made it
    (``shape.b_type`` is that packed type) and is read in place. ``tiles`` builds the micro-kernel of a
    unit with tile registers instead (`pbsdk.targets.cpu.tile_kernel`): ``"amx"`` its instructions,
    ``"emulate"`` their arithmetic on host buffers. With a ``window`` the first operand is a convolution's
    NHWC input (``window.x_type``), read in place as A (implicit GEMM, `Window`). Needs an enclosing
    ``ir.Location``."""
    check(shape, blk, prepacked_b, tile=tiles is not None, window=window)
    with ir.InsertionPoint(module.body):
        if tiles is None:
            kernel = _UnitKernel(shape, blk, step, zero_init, epilogue, prepacked_b, window)
        else:
            from pbsdk.targets.cpu.tile_kernel import TileKernel

            kernel = TileKernel(shape, blk, step, zero_init, epilogue, prepacked_b, emulate=tiles == "emulate",
                                window=window)
        part = kernel.build(f"{name}_part")
        op = func.FuncOp(name, (list(part.type.inputs)[:-1], []), visibility="private")
        entry = op.add_entry_block()
        with ir.InsertionPoint(entry):
            call_parts(f"{name}_part", list(entry.arguments), blk.threads)
            func.ReturnOp([])
    return op


class _UnitKernel:
    """Builds one thread part of the kernel (see the module docstring); every size comes from the
    `Blocking`, every type from the `UnitShape`."""

    def __init__(self, shape: UnitShape, blk: Blocking, step: StepFn, zero_init: bool,
                 epilogue: UnitEpilogue | None, prepacked: bool = False, window: Window | None = None) -> None:
        self.shape, self.blk, self.step, self.zero_init, self.epilogue = shape, blk, step, zero_init, epilogue
        self.prepacked, self.window = prepacked, window
        self.u, self.L = group_size(str(shape.reads)), blk.lanes  # values of k in one 32-bit group
        self.et = shape.a_type.element_type  # as A and B are stored
        self.rt = shape.reads  # as the unit reads them (and the packed panels hold them)
        self.acc_t = shape.c_type.element_type
        # vpdpbusd reads A as u8, so A + 128 and a correction; a unit reading i8 widened multiplies signed values
        self.signed_a = shape.operand == "i8" and self.rt == self.et
        self.i32 = ir.IntegerType.get_signless(32)
        self.group_t = ir.VectorType.get([self.u], self.et)  # one group of u values of a row of A, stored
        self.packed_group_t = ir.VectorType.get([self.u], self.rt)  # the same in a packed A block
        self.wide_t = ir.VectorType.get([self.L * self.u], self.rt)  # one unit operand
        self.row_t = ir.VectorType.get([self.L], self.et)  # L values of one row of B
        self.vacc = ir.VectorType.get([self.L], self.acc_t)
        self.mask_t = ir.VectorType.get([self.L], ir.IntegerType.get_signless(1))
        self.index = ir.IndexType.get()

    # ------------------------------------------------------------------------------------ helpers
    def c(self, v: int) -> ir.Value:
        return self.x.c(v)

    def min(self, a: ir.Value, b: ir.Value) -> ir.Value:
        return arith.minsi(a, b)

    def zero(self, t: ir.Type) -> ir.Value:
        return zero_vector(ir.VectorType(t))

    def widen(self, v: ir.Value) -> ir.Value:
        """A vector of stored values in the type the unit reads (sign-extended where that is wider)."""
        vt = ir.VectorType(v.type)
        if vt.element_type == self.rt:
            return v
        return arith.extsi(ir.VectorType.get(vt.shape, self.rt), v)

    def broadcast_group(self, group: ir.Value, offset: bool) -> ir.Value:
        """A group of u values (``vector<u x et>`` as stored, or as packed: 32 bits in the unit's type) in
        every lane: the unit's A operand; ``offset``: each byte + 128 first (an int8 A read in place for
        vpdpbusd; packing does it once for a packed A)."""
        word = group_word(self.widen(group))
        if offset:  # each byte + 128: the u8 vpdpbusd reads
            word = arith.xori(word, arith.constant(self.i32, -0x7F7F7F80))  # 0x80808080
        return broadcast_word(word, self.wide_t)

    def interleave(self, rows: list[ir.Value]) -> ir.Value:
        """``u`` vectors of L values (rows of B) as one unit operand: element ``j*u + t`` is ``rows[t][j]``."""
        return interleave(rows, self.L)

    # ------------------------------------------------------------------------------------ structure
    def build(self, name: str) -> func.FuncOp:
        s, blk = self.shape, self.blk
        ep = self.epilogue
        extra = [] if ep is None else [*ep.input_types, ep.out_type]
        a_type = s.a_type if self.window is None else self.window.x_type
        fn = func.FuncOp(name, ([a_type, s.b_type, s.c_type, *extra, self.index], []))
        entry = fn.add_entry_block()
        self.A, self.B, self.C, *rest, tid = entry.arguments
        self.E, self.D = rest[:-1], (rest[-1] if rest else None)
        self.x = Indices(entry)
        self.ix = IndexOps(entry)
        with ir.InsertionPoint(entry):
            b0, b1, m0, m1, n0, n1 = self.partition(tid)
            self.m1, self.n1 = m1, n1
            buffers = self.buffers() + self.window_buffers(m0)
            _for(b0, b1, self.c(1), lambda b: _for(n0, n1, self.c(blk.nc), lambda jc: _for(
                self.c(0), self.c(s.k), self.c(blk.kc), lambda pc: self.k_block([b] if s.batch else [], jc, pc, m0))))
            for buf in buffers:
                memref.dealloc(buf)
            func.ReturnOp([])
        self.x.hoist()
        self.ix.hoist()
        return fn

    def window_buffers(self, m0: ir.Value) -> list[ir.Value]:
        """With a window: the flat view of X (``X_flat``) and this part's table of where each output pixel's
        window starts (`window_rows`, returned to be freed); nothing otherwise."""
        w = self.window
        if w is None:
            return []
        size = int(np.prod(w.x_type.shape))
        self.X_flat = memref.collapse_shape(ir.MemRefType.get([size], self.et), self.A, [[0, 1, 2, 3]])
        self.rows = window_rows(w, self.ix, m0, self.m1, self.shape.m)
        if self.rt == self.et:
            return [self.rows]
        self.X_flat = self.widened_input(self.X_flat, size)
        return [self.rows, self.X_flat]

    def widened_input(self, flat: ir.Value, size: int) -> ir.Value:
        """A copy of the flat input ``flat`` (``size`` values) in the unit's wider type, made once per call by
        each part: the window's groups are then broadcast from it as they are (a unit reading i8 as i16 pairs
        would otherwise extend every value at every broadcast: ResNet-18's 3x3 convolutions 1.4-1.6x slower)."""
        c, W = self.c, self.wide_t.shape[0]
        out = self.alloc([size], self.rt)
        stored_t = ir.VectorType.get([W], self.et)
        whole = size // W * W
        _for(c(0), c(whole), c(W), lambda i: vector.store(self.widen(vector.load(stored_t, flat, [i])), out, [i]))
        if whole < size:
            msk = vector.create_mask(ir.VectorType.get([W], ir.IntegerType.get_signless(1)), [c(size - whole)])
            tail = vector.maskedload(stored_t, flat, [c(whole)], msk, self.zero(stored_t))
            vector.maskedstore(out, [c(whole)], msk, self.widen(tail))
        return out

    def pack_groups(self, kc: ir.Value) -> ir.Value:
        """Groups of k this k block packs and steps through (``kc`` values of k: the last one zero-padded)."""
        return arith.divui(arith.addi(kc, self.c(self.u - 1)), self.c(self.u))

    def a_row_stride(self) -> int:
        """Elements between the rows of the packed A block: a k block in whole vectors, plus one vector, so
        that rows a multiple of the cache's set span apart (4 KiB of k) land in different sets."""
        W = self.wide_t.shape[0]
        return -(-self.blk.kc // W) * W + W

    def alloc(self, shape: Sequence[int], t: ir.Type) -> ir.Value:
        return memref.alloc(ir.MemRefType.get(list(shape), t), [], [], alignment=64)

    def buffers(self) -> list[ir.Value]:
        """This part's packed B block ``Bp`` (unless B comes packed), packed A block ``Ap`` (when the plan packs
        A), int8 correction ``Cr`` and epilogue tile ``Tp``; returns those it allocated."""
        blk, groups = self.blk, self.blk.kc // self.u
        panels = self.packed_panels()
        self.Bp = None if self.prepacked else self.alloc([panels, groups, blk.nr * self.u], self.rt)
        self.Ap = self.alloc([blk.mc // blk.mr, blk.mr, self.a_row_stride()], self.rt) if blk.pack_a else None
        self.Cr = self.alloc([panels, blk.nr], self.acc_t) if self.signed_a else None
        self.Tp = self.alloc([blk.mr, blk.nr], self.acc_t) if self.epilogue is not None else None
        return [b for b in (self.Bp, self.Ap, self.Cr, self.Tp) if b is not None]

    def packed_panels(self) -> int:
        """Panels of B's packing buffer ``Bp``: a block's ``nc / nr`` rounded up to whole packing passes of
        ``pass_panels`` (`pack_b_panels` writes whole passes)."""
        blk = self.blk
        return -(-blk.nc // blk.nr // blk.pass_panels) * blk.pass_panels

    def partition(self, tid: ir.Value) -> tuple[ir.Value, ...]:
        """This thread's [b0, b1) x [m0, m1) x [n0, n1)."""
        s, blk, c = self.shape, self.blk, self.c
        bounds = {"batch": [c(0), c(max(s.batch, 1))], "m": [c(0), c(s.m)], "n": [c(0), c(s.n)]}
        if blk.threads > 1:
            extent, unit = {"batch": (max(s.batch, 1), 1), "m": (s.m, blk.mr), "n": (s.n, blk.nr)}[blk.split]
            units = -(-extent // unit)
            per = -(-units // blk.threads) * unit
            lo = arith.muli(tid, c(per))
            bounds[blk.split] = [lo, self.min(arith.addi(lo, c(per)), c(extent))]
        return (*bounds["batch"], *bounds["m"], *bounds["n"])

    def k_block(self, lead: list[ir.Value], jc: ir.Value, pc: ir.Value, m0: ir.Value) -> None:
        blk, c = self.blk, self.c
        kc = self.min(c(blk.kc), arith.subi(c(self.shape.k), pc))
        groups = self.pack_groups(kc)
        nc = self.min(c(blk.nc), arith.subi(self.n1, jc))
        panels = arith.divui(arith.addi(nc, c(blk.nr - 1)), c(blk.nr))
        if not self.prepacked:
            P = blk.pass_panels
            passes = arith.divui(arith.addi(panels, c(P - 1)), c(P))
            _for(c(0), passes, c(1), lambda q: self.pack_b_panels(lead, jc, pc, arith.muli(q, c(P)), groups))
        elif self.signed_a:
            _for(c(0), panels, c(1), lambda jb: self.prepacked_sums(jc, pc, jb, groups))
        first = arith.cmpi(arith.CmpIPredicate.eq, pc, c(0)) if self.zero_init else None
        self.last = (arith.cmpi(arith.CmpIPredicate.sge, arith.addi(pc, kc), c(self.shape.k))
                     if self.epilogue is not None and self.shape.k > blk.kc else None)

        def row_block(ic: ir.Value) -> None:
            mc = self.min(c(blk.mc), arith.subi(self.m1, ic))
            tiles = arith.divui(arith.addi(mc, c(blk.mr - 1)), c(blk.mr))
            if self.Ap is not None:
                _for(c(0), tiles, c(1), lambda ib: self.pack_a_panel(lead, ic, pc, ib, groups))
            _for(c(0), panels, c(1), lambda jb: _for(c(0), tiles, c(1), lambda ib: self.micro_tile(
                lead, ic, jc, pc, ib, jb, groups, first, kc)))

        _for(m0, self.m1, c(blk.mc), row_block)

    # ------------------------------------------------------------------------------------ packing
    def columns(self, jc: ir.Value, jb: ir.Value) -> list[tuple[ir.Value, ir.Value]]:
        """(first column, lane mask) of each vector of panel ``jb`` of the block at ``jc``: the mask stops at
        this thread's last column and the block's (a packing pass's panels past the block are all masked)."""
        c, blk, L = self.c, self.blk, self.L
        end = self.min(self.n1, arith.addi(jc, c(blk.nc)))
        out = []
        for v in range(blk.nv):
            col = arith.addi(arith.addi(jc, arith.muli(jb, c(blk.nr))), c(v * L))
            count = self.min(arith.maxsi(arith.subi(end, col), c(0)), c(L))
            out.append((col, vector.create_mask(self.mask_t, [count])))
        return out

    def pack_b_panels(self, lead: list[ir.Value], jc: ir.Value, pc: ir.Value, jb0: ir.Value,
                      groups: ir.Value) -> None:
        """Panels ``jb0 .. jb0 + blk.pass_panels`` in one pass down B's rows: ``Bp[jb, g, v*L*u + j*u + t] =
        B[pc + g*u + t, jc + jb*nr + v*L + j]``, zero past K and past this thread's and this block's columns (a
        panel past them is packed as zeros, never read); for int8 also ``Cr[jb, :] = -128 * (column sums of the
        panel)``."""
        blk, c, P = self.blk, self.c, self.blk.pass_panels
        panels = [arith.addi(jb0, c(p)) if p else jb0 for p in range(P)]
        cols = [col for jb in panels for col in self.columns(jc, jb)]
        init = [self.zero(self.vacc) for _ in cols] if self.signed_a else []

        def group(g: ir.Value, sums: list[ir.Value]) -> list[ir.Value]:
            out = []
            for i, col in enumerate(cols):
                packed = self.packed_vector(lead, pc, g, col)
                vector.store(packed, self.Bp, [panels[i // blk.nv], g, c(i % blk.nv * self.L * self.u)])
                if self.signed_a:
                    out.append(self.step(sums[i], self.ones(), packed))
            return out

        sums = _for_values(c(0), groups, c(1), init, group)
        for p, jb in enumerate(panels):
            self.store_sums(jb, sums[p * blk.nv:(p + 1) * blk.nv])

    def packed_vector(self, lead: list[ir.Value], pc: ir.Value, g: ir.Value, col: tuple[ir.Value, ir.Value]
                      ) -> ir.Value:
        """One unit operand of B: group ``g``'s ``u`` rows of the L columns at ``col`` (masked), interleaved."""
        c, u, K = self.c, self.u, self.shape.k
        k0 = arith.addi(pc, arith.muli(g, c(u)))
        zrow = self.zero(self.row_t)
        rows = []
        for t in range(u):
            kk = arith.addi(k0, c(t))
            inside = arith.cmpi(arith.CmpIPredicate.slt, kk, c(K))
            row = vector.maskedload(self.row_t, self.B, [*lead, self.min(kk, c(K - 1)), col[0]], col[1], zrow)
            rows.append(self.widen(arith.select(inside, row, zrow)))
        return self.interleave(rows)

    def prepacked_sums(self, jc: ir.Value, pc: ir.Value, jb: ir.Value, groups: ir.Value) -> None:
        """`store_sums` of panel ``jb`` of a B packed at compile time (int8), from its groups in this k block."""
        def group(g: ir.Value, sums: list[ir.Value]) -> list[ir.Value]:
            return [self.step(sums[v], self.ones(), vector.load(self.wide_t, self.B, self.b_at(jc, pc, jb, g, v)))
                    for v in range(self.blk.nv)]

        c = self.c
        self.store_sums(jb, _for_values(c(0), groups, c(1), [self.zero(self.vacc)] * self.blk.nv, group))

    def ones(self) -> ir.Value:
        """128 in every byte: the unit's A operand whose products with B are 128 times B's column sums."""
        return vector.bitcast(self.wide_t, vector.broadcast(ir.VectorType.get([self.L], self.i32),
                                                            arith.constant(self.i32, -0x7F7F7F80)))

    def store_sums(self, jb: ir.Value, sums: list[ir.Value]) -> None:
        """``Cr[jb, :] = -(128 * column sums)``: where panel ``jb``'s accumulators start (int8)."""
        for v, total in enumerate(sums):
            vector.store(arith.subi(self.zero(self.vacc), total), self.Cr, [jb, self.c(v * self.L)])

    def b_at(self, jc: ir.Value, pc: ir.Value, jb: ir.Value, g: ir.Value, v: int) -> list[ir.Value]:
        """Where vector ``v`` of group ``g`` of panel ``jb`` (of the block at ``jc``, ``pc``) is: in the panels
        packed per call, or in the prepacked ones (whole panels of B, the block's offset added)."""
        c, blk = self.c, self.blk
        off = c(v * self.L * self.u)
        if not self.prepacked:
            return [jb, g, off]
        return [arith.addi(arith.divui(jc, c(blk.nr)), jb), arith.addi(arith.divui(pc, c(self.u)), g), off]

    def a_group(self, lead: list[ir.Value], row: ir.Value, kk: ir.Value, tail: bool = True) -> ir.Value:
        """The group of u values of A at ``[row, kk]`` (zero past K: a masked load where ``tail`` says the group
        may reach past K's end)."""
        if self.shape.k % self.u == 0 or not tail:
            return vector.load(self.group_t, self.A, [*lead, row, kk])
        count = self.min(arith.maxsi(arith.subi(self.c(self.shape.k), kk), self.c(0)), self.c(self.u))
        msk = vector.create_mask(ir.VectorType.get([self.u], ir.IntegerType.get_signless(1)), [count])
        return vector.maskedload(self.group_t, self.A, [*lead, row, kk], msk, self.zero(self.group_t))

    def tile_row(self, ic: ir.Value, ib: ir.Value, i: int) -> ir.Value:
        """Row ``i`` of tile ``ib`` of the A block at ``ic``, clamped to this thread's last row (rows past it
        are computed on and never stored)."""
        row = arith.addi(arith.addi(ic, arith.muli(ib, self.c(self.blk.mr))), self.c(i))
        return self.min(row, arith.subi(self.m1, self.c(1)))

    def pack_a_panel(self, lead: list[ir.Value], ic: ir.Value, pc: ir.Value, ib: ir.Value, groups: ir.Value) -> None:
        """``Ap[ib, i, :kc] = A[ic + ib*mr + i, pc : pc + kc]`` (zero past K; int8 each byte + 128, once here
        rather than at every broadcast): tile ``ib``'s rows copied a vector at a time into rows padded by a
        vector (`a_row_stride`), so the tile's rows never share an l1 set however A's rows fell."""
        c, W = self.c, self.wide_t.shape[0]
        K = self.shape.k
        stored_t = ir.VectorType.get([W], self.et)
        mask_t = ir.VectorType.get([W], ir.IntegerType.get_signless(1))
        chunks = arith.divui(arith.addi(arith.muli(groups, c(self.u)), c(W - 1)), c(W))
        flip = arith.constant(self.wide_t, ir.DenseElementsAttr.get_splat(
            self.wide_t, ir.IntegerAttr.get(self.et, -128))) if self.signed_a else None

        def row(i: ir.Value) -> None:
            at = self.min(arith.addi(arith.addi(ic, arith.muli(ib, c(self.blk.mr))), i), arith.subi(self.m1, c(1)))

            def chunk(j: ir.Value) -> None:
                off = arith.muli(j, c(W))
                kk = arith.addi(pc, off)
                count = self.min(arith.maxsi(arith.subi(c(K), kk), c(0)), c(W))
                value = self.widen(vector.maskedload(stored_t, self.A, [*lead, at, kk],
                                                     vector.create_mask(mask_t, [count]), self.zero(stored_t)))
                if flip is not None:
                    value = arith.xori(value, flip)
                vector.store(value, self.Ap, [ib, i, off])

            _for(c(0), chunks, c(1), chunk)

        _for(c(0), c(self.blk.mr), c(1), row)

    # ------------------------------------------------------------------------------------ micro-kernel
    def micro_tile(self, lead: list[ir.Value], ic: ir.Value, jc: ir.Value, pc: ir.Value, ib: ir.Value,
                   jb: ir.Value, groups: ir.Value, first: ir.Value | None, kc: ir.Value) -> None:
        blk, c, u, L = self.blk, self.c, self.u, self.L
        rows = [self.tile_row(ic, ib, i) for i in range(blk.mr)]
        if self.Cr is not None:
            start = [vector.load(self.vacc, self.Cr, [jb, c(v * L)]) for v in range(blk.nv)]
            init = [start[v] for _ in range(blk.mr) for v in range(blk.nv)]
        else:
            init = [self.zero(self.vacc)] * (blk.mr * blk.nv)

        def group(g: ir.Value, acc: list[ir.Value], tail: bool = False) -> list[ir.Value]:
            bv = self.b_group(jc, pc, jb, g)
            if self.Ap is not None:
                kk = arith.muli(g, c(u))
                return self.group_steps(acc, bv, lambda i: vector.load(self.packed_group_t, self.Ap, [ib, c(i), kk]),
                                        False)
            return self.group_steps(acc, bv, lambda i: self.a_group(lead, rows[i], arith.addi(pc, arith.muli(g, c(u))),
                                                                    tail), True)

        if self.window is None and self.Ap is None and self.shape.k % u:
            # K not in whole groups, A read in place: the whole groups load plainly, and only a last, partial
            # group of the block (the last block's) masks its loads (a masked load per row and group held
            # a 7x7 stem's 147-deep product to half the unit's rate).
            whole = arith.divui(kc, c(u))
            acc = _for_values(c(0), whole, c(1), init, group)
            partial = arith.cmpi(arith.CmpIPredicate.ne, whole, groups)
            acc = _if_values(partial, [v.type for v in acc], lambda: group(whole, acc, tail=True), lambda: acc)
        elif self.window is None:
            acc = _for_values(c(0), groups, c(1), init, group)
        else:
            acc = self.window_groups(ic, jc, pc, ib, jb, kc, init)
        self.update_c(lead, rows, ic, ib, jc, jb, acc, first)

    def b_group(self, jc: ir.Value, pc: ir.Value, jb: ir.Value, g: ir.Value) -> list[ir.Value]:
        """Group ``g`` of panel ``jb``: one unit operand of B per vector of the tile's columns."""
        src = self.B if self.prepacked else self.Bp
        return [vector.load(self.wide_t, src, self.b_at(jc, pc, jb, g, v)) for v in range(self.blk.nv)]

    def group_steps(self, acc: list[ir.Value], bv: list[ir.Value], row_group: Callable[[int], ir.Value],
                    in_place: bool) -> list[ir.Value]:
        """One group of k for the whole tile: row ``i``'s group of A (``row_group(i)``) broadcast (offset by
        128 for an int8 A read in place) and one unit step per accumulator of the row."""
        nv = self.blk.nv
        out = list(acc)
        for i in range(self.blk.mr):
            a = self.broadcast_group(row_group(i), self.signed_a and in_place)
            for v in range(nv):
                out[i * nv + v] = self.step(out[i * nv + v], a, bv[v])
        return out

    def window_groups(self, ic: ir.Value, jc: ir.Value, pc: ir.Value, ib: ir.Value, jb: ir.Value, kc: ir.Value,
                      init: list[ir.Value]) -> list[ir.Value]:
        """The micro-tile's k loop reading A from the window (`window_k_loop`: taps outer, groups of ``u``
        channels inner, one base address per pixel)."""
        blk, c, u = self.blk, self.c, self.u
        assert self.window is not None
        group_t = self.packed_group_t  # X_flat holds what the unit reads (`widened_input`)

        def step(k: ir.Value, addr: Callable[[int], ir.Value], acc: list[ir.Value]) -> list[ir.Value]:
            bv = self.b_group(jc, pc, jb, arith.divui(k, c(u)))
            return self.group_steps(acc, bv, lambda i: vector.load(group_t, self.X_flat, [addr(i)]), True)

        r0 = arith.addi(ic, arith.muli(ib, c(blk.mr)))
        return window_k_loop(self.rows, self.window, self.ix, blk.mr, arith.subi(self.m1, c(1)), r0, pc, kc, init,
                             step, k_step=u)

    def update_c(self, lead: list[ir.Value], rows: list[ir.Value], ic: ir.Value, ib: ir.Value, jc: ir.Value,
                 jb: ir.Value, acc: list[ir.Value] | None, first: ir.Value | None) -> None:
        """``C[row, col] (+)= acc`` for the tile's rows inside this thread's part and its columns, masked; with
        an epilogue, the last k block stores ``epilogue(C + acc)`` to D instead. Without one the rows are
        unrolled; with one the tile goes through ``Tp`` (one ``mr x nr`` buffer) and a loop over its rows
        builds the epilogue once per vector column, not once per accumulator (code size, compile time)."""
        blk, c, L = self.blk, self.c, self.L
        cols = self.columns(jc, jb)
        top = arith.addi(ic, arith.muli(ib, c(blk.mr)))
        if self.epilogue is None and acc is not None:
            for i in range(blk.mr):
                row_acc = [acc[i * blk.nv + v] for v in range(blk.nv)]

                def unrolled(at: ir.Value = rows[i], row_acc: list[ir.Value] = row_acc) -> None:
                    self.store_row(lead, at, cols, row_acc, first)

                _if(arith.cmpi(arith.CmpIPredicate.slt, arith.addi(top, c(i)), self.m1), unrolled)
            return
        assert self.Tp is not None
        for i, value in enumerate(acc or []):  # None: the tile is in Tp already
            vector.store(value, self.Tp, [c(i // blk.nv), c(i % blk.nv * L)])
        count = self.min(c(blk.mr), arith.subi(self.m1, top))
        invariant = self.row_invariant_inputs(lead, cols)

        def row(i: ir.Value) -> None:
            values = [vector.load(self.vacc, self.Tp, [i, c(v * L)]) for v in range(blk.nv)]
            at = arith.addi(top, i)
            if self.epilogue is None:
                self.store_row(lead, at, cols, values, first)
                return
            if self.last is None:  # one k block covers K
                self.finish_row(lead, at, cols, values, first, invariant)
                return
            _if(self.last, lambda: self.finish_row(lead, at, cols, values, first, invariant),
                lambda: self.store_row(lead, at, cols, values, first))

        _for(c(0), count, c(1), row)

    def total(self, lead: list[ir.Value], row: ir.Value, col: tuple[ir.Value, ir.Value], acc: ir.Value,
              first: ir.Value | None) -> ir.Value:
        """C + acc at ``[row, col]`` (acc alone where C is known zero: the first and only k block)."""
        add = arith.addf if isinstance(self.acc_t, ir.FloatType) else arith.addi
        if first is not None and self.shape.k <= self.blk.kc:
            return acc
        zero = self.zero(self.vacc)
        old = vector.maskedload(self.vacc, self.C, [*lead, row, col[0]], col[1], zero)
        if first is not None:
            old = arith.select(first, zero, old)
        return add(old, acc)

    def store_row(self, lead: list[ir.Value], row: ir.Value, cols: list[tuple[ir.Value, ir.Value]],
                  acc: list[ir.Value], first: ir.Value | None) -> None:
        """``C[row, cols] (+)= acc``: one row of the tile, its vectors masked at the columns' edge."""
        for v, (col, msk) in enumerate(cols):
            vector.maskedstore(self.C, [*lead, row, col], msk, self.total(lead, row, (col, msk), acc[v], first))

    def finish_row(self, lead: list[ir.Value], row: ir.Value, cols: list[tuple[ir.Value, ir.Value]],
                   acc: list[ir.Value], first: ir.Value | None, invariant: list[dict[int, ir.Value]]) -> None:
        """``D[row, cols] = epilogue(C + acc)``: one row of the tile through the epilogue (``invariant``: per
        vector of columns, the inputs read once for the tile, `row_invariant_inputs`)."""
        for v, (col, msk) in enumerate(cols):
            self.store_epilogue(lead, row, col, msk, self.total(lead, row, (col, msk), acc[v], first), invariant[v])

    def epilogue_input(self, e: int, loops: list[ir.Value], msk: ir.Value) -> ir.Value:
        """Epilogue input ``e`` at ``loops`` (the batch, the row, the column): a vector along the columns
        where its map walks them (masked), else a broadcast scalar."""
        ep = self.epilogue
        assert ep is not None
        dims, t = ep.dims[e], ep.input_types[e]
        at = [loops[d] if d is not None else self.c(0) for d in dims]
        vt = ir.VectorType.get([self.L], t.element_type)
        if dims and dims[-1] == len(loops) - 1:
            return vector.maskedload(vt, self.E[e], at, msk, self.zero(vt))
        return vector.broadcast(vt, memref.load(self.E[e], at))

    def row_invariant_inputs(self, lead: list[ir.Value], cols: list[tuple[ir.Value, ir.Value]],
                             ) -> list[dict[int, ir.Value]]:
        """The epilogue inputs that do not walk the rows (a bias, a batch norm's per-channel vectors), read
        once per tile: for each vector of its columns, {input: value}. The rows' loop then reads only what
        changes from row to row (and LLVM cannot hoist these loads itself: D may alias)."""
        ep = self.epilogue
        if ep is None:
            return [{} for _ in cols]
        out: list[dict[int, ir.Value]] = [{} for _ in cols]
        for e, dims in enumerate(ep.dims):
            if len(lead) not in dims:  # the row's loop is dimension len(lead) of [*lead, row, col]
                for v, (col, msk) in enumerate(cols):
                    out[v][e] = self.epilogue_input(e, [*lead, self.c(0), col], msk)
        return out

    def store_epilogue(self, lead: list[ir.Value], row: ir.Value, col: ir.Value, msk: ir.Value,
                       value: ir.Value, known: dict[int, ir.Value]) -> None:
        """``D[row, col:+L] = epilogue(value, E...)`` (masked): each input read where its map says, a vector
        along the columns where it walks them, else a broadcast scalar."""
        ep = self.epilogue
        assert ep is not None and self.D is not None
        loops = [*lead, row, col]
        args = [known[e] if e in known else self.epilogue_input(e, loops, msk) for e in range(len(ep.dims))]
        args.insert(ep.c_arg, value)
        out = vectorize(ep, args, self.L)
        vector.maskedstore(self.D, loops, msk, out)
