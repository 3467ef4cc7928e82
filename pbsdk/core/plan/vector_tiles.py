"""Planning the scratchpad tiles of a structured op that is not a contraction (no IR here).

Elementwise chains (with broadcasting), reductions over any axes, the passes of softmax and layernorm,
fills and convolutions computed on the vector unit are all one thing to the planner: a loop nest with
extents, each loop parallel or a reduction, and operands that read the loops through affine index
expressions — a plain loop index, a broadcast (constant 0), or a sum of loop indices with positive
coefficients (a convolution's ``oh * stride + kh * dilation``).

The plan stages the op through the innermost software-managed memory level (the level its compute
reads). It chooses one tile size per loop so that every operand's tile is live in that level at once:

1. **Budget**: the level's capacity (`scratchpad_capacity`), halved for double buffering (the next
   tiles arrive while this one is computed) when even the smallest tile fits twice and the
   ``double_buffer`` option is not false.
2. **Growth order**: loops that index the innermost (contiguous) dimension of the most operands first,
   so that every copy moves long contiguous runs; ties go to the later loop.
3. **Size**: each loop in turn takes the largest tile that keeps the footprint within the budget
   (all other tiles fixed), rounded down to whole alignment quanta of the level and then balanced, so
   that the tiles of the loop are of nearly equal size (``ceil(extent / count)``).

A reduction loop whose tile is shorter than its extent is a *chunked* (multi-pass) reduction: the
output tile — the accumulator — stays in the level while chunks of the reduced dimension stream
through it. A softmax or layernorm after fusion is several such ops (max, exp-sum, normalise), each
planned on its own, so a row wider than the level is a sequence of chunked passes, never a rejection.

4. **Parallel split**: when the level is per unit of the outermost compute level (a core's
   scratchpad), the tiles of the parallel loops are shared by those units (`split_parallel`: one loop
   or two, balanced parts, ``VectorPlan.parallel`` with loops named ``"d<i>"``); a reduction loop never
   is, nor is anything staged in a level the units share.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from pbsdk.core.errors import CompileError
from pbsdk.core.options import Options, as_options
from pbsdk.core.plan.contraction import scratchpad_capacity, split_parallel
from pbsdk.core.spec import ChipSpec, MemoryLevel, dtype_bits

#: One term of an index expression: (loop, coefficient).
Term = tuple[int, int]


@dataclasses.dataclass(frozen=True)
class Access:
    """How one operand is read or written: per operand dimension, the terms of its index expression (an
    empty tuple is a constant-0 index, i.e. a broadcast dimension of size 1)."""

    dims: tuple[tuple[Term, ...], ...]
    dtype: str
    output: bool = False

    def tile_shape(self, tile: tuple[int, ...]) -> tuple[int, ...]:
        """The operand's tile for loop tiles ``tile``: ``sum(c * (t - 1)) + 1`` per dimension (a window
        for a strided or dilated sum)."""
        return tuple(sum(c * (tile[d] - 1) for d, c in terms) + 1 for terms in self.dims)

    def loops(self) -> set[int]:
        return {d for terms in self.dims for d, _ in terms}


@dataclasses.dataclass(frozen=True)
class VectorOp:
    """The op being planned: loop extents, iterator kinds, and its operands (inputs then outputs)."""

    extents: tuple[int, ...]
    iterators: tuple[Literal["parallel", "reduction"], ...]
    operands: tuple[Access, ...]

    def __post_init__(self) -> None:
        if len(self.extents) != len(self.iterators):
            raise ValueError(f"{len(self.extents)} extents but {len(self.iterators)} iterator types")
        for a in self.operands:
            for terms in a.dims:
                if any(not 0 <= d < len(self.extents) or c < 1 for d, c in terms):
                    raise ValueError(f"operand {a}: index terms must name a loop with a positive coefficient")

    @property
    def reductions(self) -> tuple[int, ...]:
        return tuple(i for i, it in enumerate(self.iterators) if it == "reduction")


@dataclasses.dataclass(frozen=True)
class VectorPlan:
    """Where and how an op is staged: ``tile`` per loop (a reduction loop's tile is its chunk), the
    operand tiles (``buffers``, shape per operand), their bytes, and why."""

    op: VectorOp
    level: str
    space: int  # memory space of the level: its index in spec.memory
    alignment: int
    tile: tuple[int, ...]
    buffers: tuple[tuple[int, ...], ...]
    footprint_bytes: int  # bytes the operand tiles occupy together (one copy of each)
    budget_bytes: int
    capacity_bytes: int
    double_buffered: bool
    reasons: tuple[str, ...]
    #: The split of the parallel tile loops over ``spec.compute[0]``: ((``"d<loop>"``, parts), ...),
    #: outermost loop first; empty when the tiles run on one unit.
    parallel: tuple[tuple[str, int], ...] = ()

    @property
    def split(self) -> dict[int, int]:
        """`parallel` by loop index: {loop: parts}."""
        return {int(name[1:]): parts for name, parts in self.parallel}

    @property
    def chunks(self) -> int:
        """How many chunks each reduction streams through its accumulator (1: whole rows at once)."""
        n = 1
        for d in self.op.reductions:
            n *= -(-self.op.extents[d] // self.tile[d])
        return n

    @property
    def chunked(self) -> bool:
        return self.chunks > 1

    @property
    def tiles(self) -> int:
        """Tiles of the parallel loops (each is one pass of loads, compute and stores)."""
        n = 1
        for d, (e, t) in enumerate(zip(self.op.extents, self.tile)):
            if self.op.iterators[d] == "parallel":
                n *= -(-e // t)
        return n


def _bytes(dtype: str) -> int:
    return max(1, dtype_bits(dtype) // 8)


def footprint(op: VectorOp, tile: tuple[int, ...]) -> int:
    """Bytes of one tile of every operand."""
    total = 0
    for a in op.operands:
        n = 1
        for s in a.tile_shape(tile):
            n *= s
        total += n * _bytes(a.dtype)
    return total


def innermost_scratchpad(spec: ChipSpec) -> tuple[MemoryLevel, int] | None:
    """The innermost software-managed level besides main memory, and its memory space; None without."""
    for i in range(len(spec.memory) - 1, 0, -1):
        if spec.memory[i].managed == "software":
            return spec.memory[i], i
    return None


def _growth_order(op: VectorOp) -> list[int]:
    """Loops by how close to the operands' contiguous (last) dimension they index, nearest first."""
    def key(d: int) -> tuple[float, int]:
        depths = [len(a.dims) - 1 - j for a in op.operands for j, terms in enumerate(a.dims)
                  if any(x == d for x, _ in terms)]
        return (sum(depths) / len(depths) if depths else float("inf"), -d)
    return sorted(range(len(op.extents)), key=key)


def _quantum(op: VectorOp, d: int, level: MemoryLevel) -> int:
    """Elements per alignment unit of the level for loop ``d`` when it indexes an operand's last dim."""
    sizes = [_bytes(a.dtype) for a in op.operands if a.dims and any(x == d for x, _ in a.dims[-1])]
    return max(1, level.alignment_bytes // min(sizes)) if sizes else 1


def plan_vector(spec: ChipSpec, op: VectorOp, options: Options | Mapping[str, Any] | None = None,
                multiples: Mapping[int, int] | None = None) -> VectorPlan:
    """Tile sizes per loop for staging ``op`` in the innermost scratchpad (see the module docstring).

    ``multiples`` maps a loop to a granule its tile must be a whole multiple of (a matrix unit's m, n
    or k): its tile is rounded up past the extent where needed, the buffers hold the padded tile.
    Raises `CompileError` when there is no software-managed level; when even the smallest tile of every
    operand does not fit the level, the plan has that tile and a footprint over the capacity (the
    pass's capacity check then names the buffer that overflows)."""
    grain = dict(multiples or {})
    found = innermost_scratchpad(spec)
    if found is None:
        raise CompileError(f"spec '{spec.name}' has no software-managed level to stage vector work in")
    level, space = found
    cap = scratchpad_capacity(level, options)
    ones = tuple(grain.get(d, 1) for d in range(len(op.extents)))
    least = footprint(op, ones)
    if least > cap:  # the pass's capacity check names the buffer that does not fit
        return VectorPlan(op, level.name, space, level.alignment_bytes, ones,
                          tuple(a.tile_shape(ones) for a in op.operands), least, cap, cap, False,
                          ((f"{level.name}: even the smallest tile of every operand ({least} B) exceeds its "
                           f"capacity ({cap} B)"),))
    double = as_options(options).double_buffer and 2 * least <= cap
    budget = cap // 2 if double else cap
    reasons = [f"{level.name} (capacity {cap} B{', double-buffered: budget ' + str(budget) + ' B' if double else ''})"]
    tile = list(ones)
    for d in _growth_order(op):
        g = grain.get(d, 1)
        extent = -(-op.extents[d] // g) * g
        lo, hi = 1, extent // g  # the largest t = j * g, j in [lo, hi], that fits
        while lo < hi:
            mid = (lo + hi + 1) // 2
            trial = list(tile)
            trial[d] = mid * g
            if footprint(op, tuple(trial)) <= budget:
                lo = mid
            else:
                hi = mid - 1
        t = lo * g
        if t < extent:
            q = g if d in grain else _quantum(op, d, level)
            if t >= q:
                t = t // q * q
            count = -(-extent // t)
            balanced = -(-extent // count)
            if t >= q:
                balanced = -(-balanced // q) * q
            t = min(t, balanced)
            kind = "chunk" if op.iterators[d] == "reduction" else "tile"
            reasons.append(f"loop {d} ({op.iterators[d]}, extent {extent}): {kind} {t} ({count} per pass of "
                           f"the loops outside it)")
        tile[d] = t
    final = tuple(tile)
    buffers = tuple(a.tile_shape(final) for a in op.operands)
    fp = footprint(op, final)
    plan = VectorPlan(op, level.name, space, level.alignment_bytes, final, buffers, fp, budget, cap, double,
                      tuple(reasons))
    if plan.chunked:
        reasons.append(f"reduction in {plan.chunks} chunks: the accumulator tile stays in {level.name} while "
                       "the reduced dimension streams through it")
    split, why = vector_split(spec, op, level, final)
    reasons.append(why)
    return dataclasses.replace(plan, reasons=tuple(reasons), parallel=split)


def vector_split(spec: ChipSpec, op: VectorOp, level: MemoryLevel, tile: tuple[int, ...]
                 ) -> tuple[tuple[tuple[str, int], ...], str]:
    """Step 4: the split of ``op``'s parallel tile loops over ``spec.compute[0]`` when ``level`` (where
    the tiles are staged) is per unit of it, with the reason."""
    top = spec.compute[0]
    if level.scope != top.name:
        return (), (f"no parallel split: {level.name} is per '{level.scope}', not per '{top.name}' (a shared "
                    f"level's one buffer cannot hold every {top.name}'s tile)")
    loops = [(f"d{d}", -(-e // t)) for d, (e, t) in enumerate(zip(op.extents, tile))
             if op.iterators[d] == "parallel"]
    return split_parallel(loops, top.count, unit=top.name)


@dataclasses.dataclass(frozen=True)
class UnitMapping:
    """A convolution-like op read as an implicit GEMM on a matrix unit: its loops ``m`` (output pixels
    along one row), ``n`` (output channels of a group) and ``k`` (input channels of a group), which
    input is the image (``x``) and which the weights (``w``), and the unit's compute tile. Every other
    loop (batch, group, output rows, kernel taps) is iterated around the unit-sized pieces."""

    m: int
    n: int
    k: int
    x: int
    w: int
    unit: Any  # ComputeTile (kind "matrix-unit")

    def multiples(self) -> dict[int, int]:
        return {self.m: self.unit.m, self.n: self.unit.n, self.k: self.unit.k}


def unit_mapping(spec: ChipSpec, op: VectorOp, options: Any = None) -> tuple[UnitMapping | None, str]:
    """How ``op`` — two inputs, one output, read through sums of loops (a convolution) — maps onto the
    spec's matrix unit, or None with the reason it stays on the vector unit.

    ``k`` is a reduction loop that indexes both inputs plainly (input channels); ``n`` a parallel loop
    of the weights and the output only (output channels); ``m`` a parallel loop of the image and the
    output only, the one nearest the output's contiguous end (output columns). The unit is the one the
    contraction planner picks for an ``m x n x k`` matmul of these dtypes (`compute_tile`); a group
    whose ``k`` or ``n`` is 1 (a depthwise convolution: its only reduction is over the kernel taps)
    would fill one row of every unit instruction, so it stays a vector op."""
    from pbsdk.core.plan.contraction import Contraction, compute_tile

    ins = [a for a in op.operands if not a.output]
    outs = [a for a in op.operands if a.output]
    if len(ins) != 2 or len(outs) != 1:
        return None, "not two inputs and one output"
    out = outs[0]
    for xi, wi in ((0, 1), (1, 0)):
        x, w = ins[xi], ins[wi]

        def plain(a: Access, d: int) -> bool:
            return any(terms == ((d, 1),) for terms in a.dims)

        ks = [d for d in op.reductions if plain(x, d) and plain(w, d)]
        ns = [d for d in range(len(op.extents)) if op.iterators[d] == "parallel" and d in w.loops()
              and d in out.loops() and d not in x.loops()]
        ms = [d for d in range(len(op.extents)) if op.iterators[d] == "parallel" and d in x.loops()
              and d in out.loops() and d not in w.loops()]
        if not (ks and ns and ms):
            continue
        m = max(ms, key=lambda d: next(j for j, t in enumerate(out.dims) if any(x_ == d for x_, _ in t)))
        n, k = max(ns, key=lambda d: op.extents[d]), max(ks, key=lambda d: op.extents[d])
        # Each operand dimension may carry at most one of the unit's loops (a 2-D view per operand).
        roles = {m, n, k}
        if any(len({x_ for x_, _ in t} & roles) > 1 for a in (x, w, out) for t in a.dims):
            return None, "an operand dimension mixes two of the unit's loops"
        em, en, ek = op.extents[m], op.extents[n], op.extents[k]
        if ek == 1 or en == 1:
            return None, (f"per group only {ek} input and {en} output channel(s): the reduction is the kernel "
                          "taps alone, a vector op")
        tile, why = compute_tile(spec, Contraction(em, en, ek, dtype=x.dtype, acc_dtype=out.dtype), options)
        if tile.kind != "matrix-unit" or x.dtype != w.dtype:
            return None, why
        return UnitMapping(m, n, k, xi, wi, tile), why
    return None, "no loop pair reads as output pixels x output channels x input channels"
