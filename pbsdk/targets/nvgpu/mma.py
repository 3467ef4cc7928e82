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
packed into ``i32`` (what the NVVM op expects for each).
"""

from __future__ import annotations

from collections.abc import Sequence

from pbsdk.core.errors import UnsupportedError


def mma_gpu_function(name: str, types: Sequence[str], unit: str) -> str:
    """The lane-level body of ``@name(%a, %b, %c)`` for the matrix unit ``unit``."""
    if not unit.startswith("mma.sync.m16n8k16"):
        raise UnsupportedError(f"matrix unit {unit} is not lowered by nvgpu (mma.sync.m16n8k16 is)")
    ta, tb, tc = types
    dtype = "bf16" if "xbf16" in ta else "f16" if "xf16" in ta else None
    if dtype is None or "xf32" not in tc:
        raise UnsupportedError(f"mma.sync.m16n8k16 for {ta} x {tb} -> {tc}")
    packed = dtype == "bf16"
    L = [f"func.func private @{name}(%a: {ta}, %b: {tb}, %c: {tc}) {{"]
    e = L.append
    e("  %lane = gpu.lane_id")
    for v in (1, 2, 4, 8):
        e(f"  %c{v} = arith.constant {v} : index")
    e("  %g = arith.divui %lane, %c4 : index")
    e("  %t = arith.remui %lane, %c4 : index")
    e("  %t2 = arith.muli %t, %c2 : index")
    e("  %t21 = arith.addi %t2, %c1 : index")
    e("  %t28 = arith.addi %t2, %c8 : index")
    e("  %t29 = arith.addi %t28, %c1 : index")
    e("  %g8 = arith.addi %g, %c8 : index")
    operand = "i32" if packed else f"vector<2x{dtype}>"

    def pack(src: str, dst: str) -> None:
        e(f"  %{dst}v = vector.bitcast %{src} : vector<2x{dtype}> to vector<1xi32>")
        e(f"  %{dst} = vector.extract %{dst}v[0] : i32 from vector<1xi32>")

    a_regs = []
    for i, (row, col) in enumerate((("%g", "%t2"), ("%g8", "%t2"), ("%g", "%t28"), ("%g8", "%t28"))):
        e(f"  %al{i} = vector.load %a[{row}, {col}] : {ta}, vector<2x{dtype}>")
        if packed:
            pack(f"al{i}", f"a{i}")
            a_regs.append(f"%a{i}")
        else:
            a_regs.append(f"%al{i}")
    b_regs = []
    for j, (k0, k1) in enumerate((("%t2", "%t21"), ("%t28", "%t29"))):
        e(f"  %bx{j} = memref.load %b[{k0}, %g] : {tb}")
        e(f"  %by{j} = memref.load %b[{k1}, %g] : {tb}")
        e(f"  %bl{j} = vector.from_elements %bx{j}, %by{j} : vector<2x{dtype}>")
        if packed:
            pack(f"bl{j}", f"b{j}")
            b_regs.append(f"%b{j}")
        else:
            b_regs.append(f"%bl{j}")
    c_pos = (("%g", "%t2"), ("%g", "%t21"), ("%g8", "%t2"), ("%g8", "%t21"))
    for i, (row, col) in enumerate(c_pos):
        e(f"  %cv{i} = memref.load %c[{row}, {col}] : {tc}")
    e(f"  %d = nvvm.mma.sync A[{', '.join(a_regs)}] B[{', '.join(b_regs)}] C[%cv0, %cv1, %cv2, %cv3] "
      "{layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, "
      f"shape = #nvvm.shape<m = 16, n = 8, k = 16>, multiplicandAPtxType = #nvvm.mma_type<{dtype}>, "
      f"multiplicandBPtxType = #nvvm.mma_type<{dtype}>}} : ({operand}, {operand}, f32) "
      "-> !llvm.struct<(f32, f32, f32, f32)>")
    for i, (row, col) in enumerate(c_pos):
        e(f"  %dv{i} = llvm.extractvalue %d[{i}] : !llvm.struct<(f32, f32, f32, f32)>")
        e(f"  memref.store %dv{i}, %c[{row}, {col}] : {tc}")
    e("  return\n}")
    return "\n".join(L)
