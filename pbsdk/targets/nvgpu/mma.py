"""The tensor-core step: one warp's ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`` on shared memory.

`schedule.py` emits each 16x8x16 step as a call to a private function whose host body is a
``linalg.matmul`` (what the emulation runs). For the GPU, `mma_gpu_function` builds, with the bindings'
builders, the body that the hardware instruction needs: every lane loads its fragments (PTX ISA, "Matrix fragments for mma.m16n8k16")
— with ``g = lane / 4`` and ``t = lane % 4``:

- A (16x16, row-major): register ``i`` (of 4) holds row ``g + 8 * (i % 2)``, columns ``2t + 8 * (i // 2)``
  and the next;
- B (16x8, column-major): register ``j`` (of 2) holds rows ``2t + 8j`` and ``2t + 8j + 1`` of column ``g``;
- C/D (16x8, f32): rows ``g`` and ``g + 8``, columns ``2t`` and ``2t + 1``;

then issues the instruction through the ``unit_step`` hook of the contract (`pbsdk.core.hooks`; nvgpu's
own is `pbsdk.targets.nvgpu.hooks.unit_step`: ``nvvm.mma.sync``) on the lane's fragments as vectors (A
``vector<8xT>``, B ``vector<4xT>``, C ``vector<4xf32>``) and stores D back over C. A function may also take
a whole warp strip (A 16 x K, B K x N, C 16 x N): each 16x8 accumulator fragment then stays in registers
across the K/16 steps, loaded and stored once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from mlir import ir
from mlir.dialects import arith, func, gpu, memref, vector

from pbsdk.core.errors import CompileError, UnsupportedError


def _shape(t: ir.Type) -> tuple[int, int]:
    shape = ir.MemRefType(t).shape
    return int(shape[0]), int(shape[1])


#: One instruction on a lane's fragments: ``step(acc, a, b)`` builds it and returns the new accumulator.
UnitStepFn = Callable[[ir.Value, ir.Value, ir.Value], ir.Value]


def mma_gpu_function(name: str, types: Sequence[ir.Type], unit: str, step: UnitStepFn, *, a_transposed: bool = False,
                     b_transposed: bool = False, c_transposed: bool = False) -> func.FuncOp:
    """Build the lane-level body of ``@name(%a, %b, %c)`` for the matrix unit ``unit`` at the current
    insertion point (a module body, with a context and location active), and return the private
    ``func.func``. ``step`` builds each instruction (the target's ``unit_step`` hook).

    ``%a`` is 16 x K, ``%b`` K x N, ``%c`` 16 x N (K a multiple of 16, N of 8): one warp's strip
    ``C += A · B`` as N/8 x K/16 ``mma.sync`` steps, each 16x8 accumulator fragment loaded once and
    stored once (K = 16, N = 8 is the single step). With ``b_transposed``, ``%b`` holds Bᵀ (N x K, e.g.
    the keys of an attention's K tile): a B register's two k-consecutive halves are then adjacent in
    memory and are loaded as one vector, exactly like A's. With ``a_transposed`` ``%a`` holds Aᵀ (K x 16),
    with ``c_transposed`` ``%c`` holds Cᵀ (N x 16), as an implicit-GEMM convolution over NCHW stages them:
    A's halves are then two scalar loads, C's elements are read and written at swapped indices."""
    if not unit.startswith("mma.sync.m16n8k16"):
        raise UnsupportedError(f"matrix unit {unit} is not lowered by nvgpu (mma.sync.m16n8k16 is)")
    ta, tb, tc = (ir.MemRefType(t) for t in types)
    elem = ta.element_type
    dtype = "bf16" if isinstance(elem, ir.BF16Type) else "f16" if isinstance(elem, ir.F16Type) else None
    if dtype is None or not isinstance(tc.element_type, ir.F32Type):
        raise UnsupportedError(f"mma.sync.m16n8k16 for {ta} x {tb} -> {tc}")
    m, k = reversed(_shape(ta)) if a_transposed else _shape(ta)
    mc, nc = reversed(_shape(tc)) if c_transposed else _shape(tc)
    kb, n = reversed(_shape(tb)) if b_transposed else _shape(tb)
    if m != 16 or mc != 16 or kb != k or nc != n or k % 16 or n % 8:
        raise UnsupportedError(f"mma.sync.m16n8k16 strip for {ta} x {tb} -> {tc}")
    index, f32 = ir.IndexType.get(), ir.F32Type.get()
    pair = ir.VectorType.get([2], elem)
    accumulator = ir.VectorType.get([4], f32)
    fn = func.FuncOp(name, ir.FunctionType.get([ta, tb, tc], []), visibility="private")
    with ir.InsertionPoint(fn.add_entry_block()):
        a, b, c = fn.arguments
        lane = gpu.lane_id()
        # every offset a fragment index may add (canonicalize drops the unused)
        const = {v: arith.constant(index, v) for v in range(max(k, n) + 10)}
        g = arith.divui(lane, const[4])
        t = arith.remui(lane, const[4])
        t2 = arith.muli(t, const[2])
        g8 = arith.addi(g, const[8])

        def idx(base: ir.Value, off: int) -> ir.Value:
            """base + off (or base itself)."""
            return base if off == 0 else arith.addi(base, const[off])

        def unit_stride(t: ir.MemRefType) -> bool:
            return t.get_strides_and_offset()[0][-1] == 1

        def pair_along_rows(mem: ir.Value, row: ir.Value, col: ir.Value) -> ir.Value:
            """mem[row][col], mem[row][col + 1] as one vector (one load where the row is contiguous)."""
            if unit_stride(ir.MemRefType(mem.type)):
                return vector.load(pair, mem, [row, col])
            return vector.from_elements(pair, [memref.load(mem, [row, col]), memref.load(mem, [row, idx(col, 1)])])

        def pair_down_column(mem: ir.Value, row: ir.Value, next_row: ir.Value, col: ir.Value) -> ir.Value:
            """mem[row][col], mem[next_row][col] (the next row) as one vector: two scalar loads."""
            return vector.from_elements(pair, [memref.load(mem, [row, col]), memref.load(mem, [next_row, col])])

        def fragment(regs: Sequence[ir.Value]) -> ir.Value:
            """A lane's registers (pairs) as one vector, in order: 2 -> vector<4xT>, 4 -> vector<8xT>."""
            halves = [vector.shuffle(regs[i], regs[i + 1], [0, 1, 2, 3]) for i in range(0, len(regs), 2)]
            return halves[0] if len(halves) == 1 else vector.shuffle(halves[0], halves[1], list(range(8)))

        # Column/row offsets of the fragments within the strip, shared by all steps.
        kcols = {k0: (idx(t2, k0), idx(t2, k0 + 8)) for k0 in range(0, k, 16)}
        krows = {k0: tuple(idx(t2, k0 + o) for o in (0, 1, 8, 9)) for k0 in range(0, k, 16)}
        for n0 in range(0, n, 8):
            col = idx(g, n0)  # B column this lane reads
            c0 = idx(t2, n0)
            c1 = idx(c0, 1)
            c_pos = ((g, c0), (g, c1), (g8, c0), (g8, c1))
            c_at = [(cc, row) if c_transposed else (row, cc) for row, cc in c_pos]
            acc = vector.from_elements(accumulator, [memref.load(c, list(at)) for at in c_at])
            for k0 in range(0, k, 16):
                lo, hi = kcols[k0]
                a_regs = [pair_down_column(a, cc, idx(cc, 1), row) if a_transposed else pair_along_rows(a, row, cc)
                          for row, cc in ((g, lo), (g8, lo), (g, hi), (g8, hi))]
                b_regs = []
                r0, r1, r8, r9 = krows[k0]
                for k_lo, k_hi in ((r0, r1), (r8, r9)):
                    if b_transposed:  # Bᵀ[n][k], Bᵀ[n][k + 1]: one load where Bᵀ's rows are contiguous
                        b_regs.append(pair_along_rows(b, col, k_lo))
                    else:
                        b_regs.append(pair_down_column(b, k_lo, k_hi, col))
                acc = step(acc, fragment(a_regs), fragment(b_regs))
                if not isinstance(acc, ir.Value) or acc.type != accumulator:
                    raise CompileError(f"hook unit_step returned {acc!r}, not a value of the accumulator's type "
                                       f"{accumulator}", op="nvvm.mma.sync")
            for i, at in enumerate(c_at):
                memref.store(vector.extract(acc, [], [i]), c, list(at))
        func.return_([])
    return fn
