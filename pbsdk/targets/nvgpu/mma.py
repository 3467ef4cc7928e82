"""The tensor-core step: one warp's ``mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}`` on shared memory.

`schedule.py` emits each 16x8x16 step as a call to a private function whose host body is a
``linalg.matmul`` (what the emulation runs). For the GPU, `mma_gpu_function` writes the body that the
hardware instruction needs: every lane loads its fragments (PTX ISA, "Matrix fragments for mma.m16n8k16")
— with ``g = lane / 4`` and ``t = lane % 4``:

- A (16x16, row-major): register ``i`` (of 4) holds row ``g + 8 * (i % 2)``, columns ``2t + 8 * (i // 2)``
  and the next;
- B (16x8, column-major): register ``j`` (of 2) holds rows ``2t + 8j`` and ``2t + 8j + 1`` of column ``g``;
- C/D (16x8, f32): rows ``g`` and ``g + 8``, columns ``2t`` and ``2t + 1``;

then issues ``nvvm.mma.sync`` and stores D back over C. f16 operands go as ``vector<2xf16>``, bf16 ones
packed into ``i32`` (what the NVVM op expects for each). A function may also take a whole warp strip
(A 16 x K, B K x N, C 16 x N): each 16x8 accumulator fragment then stays in registers across the K/16
steps, loaded and stored once.
"""

from __future__ import annotations

from collections.abc import Sequence

from pbsdk.core.errors import UnsupportedError


def _shape(memref_type: str) -> tuple[int, int]:
    dims = memref_type[len("memref<"):].split("x")
    return int(dims[0]), int(dims[1])


def mma_gpu_function(name: str, types: Sequence[str], unit: str, *, b_transposed: bool = False) -> str:
    """The lane-level body of ``@name(%a, %b, %c)`` for the matrix unit ``unit``.

    ``%a`` is 16 x K, ``%b`` K x N, ``%c`` 16 x N (K a multiple of 16, N of 8): one warp's strip
    ``C += A · B`` as N/8 x K/16 ``mma.sync`` steps, each 16x8 accumulator fragment loaded once and
    stored once (K = 16, N = 8 is the single step). With ``b_transposed``, ``%b`` holds Bᵀ (N x K, e.g.
    the keys of an attention's K tile): a B register's two k-consecutive halves are then adjacent in
    memory and are loaded as one vector, exactly like A's."""
    if not unit.startswith("mma.sync.m16n8k16"):
        raise UnsupportedError(f"matrix unit {unit} is not lowered by nvgpu (mma.sync.m16n8k16 is)")
    ta, tb, tc = types
    dtype = "bf16" if "xbf16" in ta else "f16" if "xf16" in ta else None
    if dtype is None or "xf32" not in tc:
        raise UnsupportedError(f"mma.sync.m16n8k16 for {ta} x {tb} -> {tc}")
    (m, k), (mc, nc) = _shape(ta), _shape(tc)
    kb, n = reversed(_shape(tb)) if b_transposed else _shape(tb)
    if m != 16 or mc != 16 or kb != k or nc != n or k % 16 or n % 8:
        raise UnsupportedError(f"mma.sync.m16n8k16 strip for {ta} x {tb} -> {tc}")
    packed = dtype == "bf16"
    L = [f"func.func private @{name}(%a: {ta}, %b: {tb}, %c: {tc}) {{"]
    e = L.append
    e("  %lane = gpu.lane_id")
    offsets = range(max(k, n) + 10)  # every offset a fragment index may add (canonicalize drops the unused)
    for v in offsets:
        e(f"  %c{v} = arith.constant {v} : index")
    e("  %g = arith.divui %lane, %c4 : index")
    e("  %t = arith.remui %lane, %c4 : index")
    e("  %t2 = arith.muli %t, %c2 : index")
    e("  %g8 = arith.addi %g, %c8 : index")
    operand = "i32" if packed else f"vector<2x{dtype}>"

    def idx(base: str, off: int, tag: str) -> str:
        """%base + off as a fresh SSA value (or %base itself)."""
        if off == 0:
            return base
        e(f"  %{tag} = arith.addi {base}, %c{off} : index")
        return f"%{tag}"

    def pack(src: str, dst: str) -> str:
        if not packed:
            return f"%{src}"
        e(f"  %{dst}v = vector.bitcast %{src} : vector<2x{dtype}> to vector<1xi32>")
        e(f"  %{dst} = vector.extract %{dst}v[0] : i32 from vector<1xi32>")
        return f"%{dst}"

    # Column/row offsets of the fragments within the strip, shared by all steps.
    kcols = {k0: (idx("%t2", k0, f"ka{k0}"), idx("%t2", k0 + 8, f"kb{k0}")) for k0 in range(0, k, 16)}
    krows = {k0: tuple(idx("%t2", k0 + o, f"kr{k0}_{o}") for o in (0, 1, 8, 9)) for k0 in range(0, k, 16)}
    for n0 in range(0, n, 8):
        s = f"n{n0}"
        col = idx("%g", n0, f"bc{s}")  # B column this lane reads
        c0 = idx("%t2", n0, f"cc{s}")
        c1 = idx(c0, 1, f"cd{s}")
        c_pos = ((("%g", c0)), ("%g", c1), ("%g8", c0), ("%g8", c1))
        acc = []
        for i, (row, cc) in enumerate(c_pos):
            e(f"  %cv{s}_{i} = memref.load %c[{row}, {cc}] : {tc}")
            acc.append(f"%cv{s}_{i}")
        for k0 in range(0, k, 16):
            q = f"{s}k{k0}"
            lo, hi = kcols[k0]
            a_regs = []
            for i, (row, cc) in enumerate((("%g", lo), ("%g8", lo), ("%g", hi), ("%g8", hi))):
                e(f"  %al{q}_{i} = vector.load %a[{row}, {cc}] : {ta}, vector<2x{dtype}>")
                a_regs.append(pack(f"al{q}_{i}", f"ap{q}_{i}"))
            b_regs = []
            r0, r1, r8, r9 = krows[k0]
            for j, (k_lo, k_hi) in enumerate(((r0, r1), (r8, r9))):
                if b_transposed:  # Bᵀ[n][k], Bᵀ[n][k + 1]: one load
                    e(f"  %bl{q}_{j} = vector.load %b[{col}, {k_lo}] : {tb}, vector<2x{dtype}>")
                else:
                    e(f"  %bx{q}_{j} = memref.load %b[{k_lo}, {col}] : {tb}")
                    e(f"  %by{q}_{j} = memref.load %b[{k_hi}, {col}] : {tb}")
                    e(f"  %bl{q}_{j} = vector.from_elements %bx{q}_{j}, %by{q}_{j} : vector<2x{dtype}>")
                b_regs.append(pack(f"bl{q}_{j}", f"bp{q}_{j}"))
            e(f"  %d{q} = nvvm.mma.sync A[{', '.join(a_regs)}] B[{', '.join(b_regs)}] C[{', '.join(acc)}] "
              "{layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, "
              f"shape = #nvvm.shape<m = 16, n = 8, k = 16>, multiplicandAPtxType = #nvvm.mma_type<{dtype}>, "
              f"multiplicandBPtxType = #nvvm.mma_type<{dtype}>}} : ({operand}, {operand}, f32) "
              "-> !llvm.struct<(f32, f32, f32, f32)>")
            acc = []
            for i in range(4):
                e(f"  %dv{q}_{i} = llvm.extractvalue %d{q}[{i}] : !llvm.struct<(f32, f32, f32, f32)>")
                acc.append(f"%dv{q}_{i}")
        for i, (row, cc) in enumerate(c_pos):
            e(f"  memref.store {acc[i]}, %c[{row}, {cc}] : {tc}")
    e("  return\n}")
    return "\n".join(L)
