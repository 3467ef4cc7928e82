"""The nvgpu target's implementation of the hook contract (`pbsdk.core.hooks`): ``unit_step``.

nvgpu lowers its own tiled form (`schedule.py`, `lower.py`); of the contract's hooks it implements
``unit_step``, one tensor-core instruction on the values a lane holds: ``mma.sync.aligned.m16n8k16.row.col``
with f16 or bf16 operands and an f32 accumulator. `mma.py` loads each lane's fragments from shared memory
and calls it once per 16x8x16 step, so a plugin subclassing `NvgpuTarget` with ``hooks`` implementing
``unit_step`` replaces the instruction (and keeps the fragment loads and stores).

The lane's values, in the order of the PTX ISA's "Matrix fragments for mma.m16n8k16" (``g = lane / 4``,
``t = lane % 4``):

- ``a``: ``vector<8xT>``, A's four registers of two elements: rows ``g``, ``g + 8``, ``g``, ``g + 8``,
  columns ``2t`` (+1) for the first two and ``2t + 8`` (+1) for the last two;
- ``b``: ``vector<4xT>``, B's two registers: rows ``2t`` (+1) and ``2t + 8`` (+1) of column ``g``;
- ``acc``: ``vector<4xf32>``, C's rows ``g`` and ``g + 8``, columns ``2t`` and ``2t + 1``.

The MLIR bindings are imported when a hook runs: the target class (which names this module as its
``hooks``), discovery and the MLIR-free loader import without them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pbsdk.core.errors import UnsupportedError

if TYPE_CHECKING:
    from mlir import ir

    from pbsdk.core.hooks import UnitStep
    from pbsdk.core.spec import ChipSpec


def unit_step(step: UnitStep, acc: ir.Value, a: ir.Value, b: ir.Value, spec: ChipSpec) -> ir.Value:
    """Build one ``mma.sync.m16n8k16`` on a lane's fragments (see the module docstring) and return the new
    accumulator (``vector<4xf32>``). f16 registers go to ``nvvm.mma_sync`` as ``vector<2xf16>``, bf16 ones
    packed into an ``i32`` (what the NVVM op expects for each)."""
    from mlir import ir
    from mlir.dialects import llvm, nvvm, vector

    unit = step.unit
    if not unit.name.startswith("mma.sync.m16n8k16") or unit.operand_dtype not in ("f16", "bf16") \
            or unit.accumulator_dtype != "f32":
        raise UnsupportedError(f"matrix unit {unit.name} {unit.operand_dtype}->{unit.accumulator_dtype} is not "
                               "issued by nvgpu (mma.sync.m16n8k16 f16/bf16 -> f32 is)")
    f32 = ir.F32Type.get()
    a_regs = [_register(a, i, unit.operand_dtype) for i in range(4)]
    b_regs = [_register(b, j, unit.operand_dtype) for j in range(2)]
    c_regs = [vector.extract(acc, [], [i]) for i in range(4)]
    dtype = unit.operand_dtype
    d = nvvm.mma_sync(ir.Type.parse("!llvm.struct<(f32, f32, f32, f32)>"),
                      ir.Attribute.parse("#nvvm.shape<m = 16, n = 8, k = 16>"),
                      ir.Attribute.parse("#nvvm.mma_layout<row>"), ir.Attribute.parse("#nvvm.mma_layout<col>"),
                      a_regs, b_regs, c_regs,
                      multiplicand_a_ptx_type=ir.Attribute.parse(f"#nvvm.mma_type<{dtype}>"),
                      multiplicand_b_ptx_type=ir.Attribute.parse(f"#nvvm.mma_type<{dtype}>"))
    return vector.from_elements(ir.VectorType.get([4], f32), [llvm.extractvalue(f32, d, [i]) for i in range(4)])


def _register(fragment: ir.Value, i: int, dtype: str) -> ir.Value:
    """Register ``i`` of a lane's fragment: elements ``2i`` and ``2i + 1`` as ``vector<2xT>`` (bf16: as the
    ``i32`` holding them)."""
    from mlir import ir
    from mlir.dialects import vector

    pair = vector.shuffle(fragment, fragment, [2 * i, 2 * i + 1])
    if dtype != "bf16":
        return pair
    word = vector.bitcast(ir.VectorType.get([1], ir.IntegerType.get_signless(32)), pair)
    return vector.extract(word, [], [0])
