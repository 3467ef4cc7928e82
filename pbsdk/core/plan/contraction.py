"""Planning a contraction ``C[b, m, n] += A[b, m, k] * B[b, k, n]`` from a chip's description.

The model, in three steps, each reading only the `ChipSpec`:

1. **Compute tile** (innermost): the first matrix unit the spec lists for the operand dtype, shaped
   m x n x k; else a register tile for the vector unit — ``mr`` rows by ``nr_vecs`` vectors of
   accumulators, chosen to maximise the tile's arithmetic intensity ``mr*nr / (mr + nr)`` while the
   accumulators, one B vector per column of vectors and one broadcast A value fit the vector register
   file; else a scalar tile.
2. **Memory-level tiles**, innermost level first (the level closest to the compute units, e.g. L1 or a
   core's scratchpad), each a multiple of the tile inside it. Starting from the inner tile, the model
   repeatedly doubles the dimension (m, n or k) that most reduces the traffic the tile implies from the
   next level out — A is re-read once per column of tiles, B once per row, partial sums of C once per k
   step — as long as the tile's working set fits the level's budget: a cache keeps half its capacity as
   headroom; a software-managed scratchpad holds two copies of the operand tiles (double buffering),
   plus the accumulator tile unless the owning compute level's registers hold it.
3. **Parallel mapping**: tiles of the outermost per-unit level are spread over the outermost compute
   level (cores, SMs); when there are fewer tiles than units, that tile shrinks until every unit has
   work or it reaches the tile inside it. In the tiled form, the m and n tile loops of the outermost
   software-managed level that is per unit (a core's scratchpad: one instance per core) run as an
   ``scf.forall`` over that compute level, split by `split_parallel` (``ContractionPlan.parallel``);
   the k loop never is, nor a level shared by the units (one instance cannot hold every unit's tile).

The estimate is a roofline per level: compute at the unit's peak, and the bytes each level serves at
its bandwidth; the largest term names the bound.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pbsdk.core.errors import UnsupportedError
from pbsdk.core.options import Options, as_options
from pbsdk.core.quant import compute_dtype
from pbsdk.core.spec import ChipSpec, MatrixUnit, MemoryLevel, dtype_bits

# Fraction of a cache's capacity a tile may use (the rest is headroom for conflict misses, other data).
CACHE_BUDGET = 0.5


@dataclasses.dataclass(frozen=True)
class Contraction:
    """The op being planned: shapes and dtypes only."""

    m: int
    n: int
    k: int
    batch: int = 1
    dtype: str = "f32"
    acc_dtype: str | None = None
    #: B is a constant packed ahead of time (a frozen weight): packing it costs nothing at run time.
    b_prepacked: bool = False
    #: A is a constant that can be packed ahead of time where the product is computed transposed (its
    #: transposing pack, B^T of `Blocking.transposed`, then costs nothing at run time).
    a_prepackable: bool = False
    #: How A and B are stored (their last two dimensions, row-major): A as ``[m, k]`` or ``[k, m]``, B as
    #: ``[k, n]`` or ``[n, k]`` (an operand read transposed, ``x @ w.T``). Which of them needs packing
    #: through register transposes depends on the orientation (`orientation`).
    a_layout: Literal["mk", "km"] = "mk"
    b_layout: Literal["kn", "nk"] = "kn"

    def __post_init__(self) -> None:
        if min(self.m, self.n, self.k, self.batch) < 1:
            raise UnsupportedError(f"contraction with an empty dimension: {self}", op="matmul")
        if self.a_layout not in ("mk", "km") or self.b_layout not in ("kn", "nk"):
            raise ValueError(f"contraction {self}: layouts are A 'mk' or 'km', B 'kn' or 'nk'")

    def transposed(self) -> Contraction:
        """The product ``C^T = B^T A^T`` (n, m, k): its A is this B, stored ``[k, n]`` ('km') or ``[n, k]``
        ('mk'); its B is this A, stored ``[m, k]`` ('nk') or ``[k, m]`` ('kn'). Neither is a constant
        packed ahead of time (the caller says where this A is: `blocking`'s ``b_constant``)."""
        return dataclasses.replace(self, m=self.n, n=self.m, b_prepacked=False, a_prepackable=False,
                                   a_layout="km" if self.b_layout == "kn" else "mk",
                                   b_layout="nk" if self.a_layout == "mk" else "kn")

    @property
    def accumulator(self) -> str:
        return self.acc_dtype or compute_dtype("matmul", [self.dtype])  # i8 -> i32, f16/bf16 -> f32

    @property
    def flops(self) -> int:
        return 2 * self.batch * self.m * self.n * self.k


@dataclasses.dataclass(frozen=True)
class ComputeTile:
    """What one instruction (matrix unit) or one register tile (vector FMA) computes."""

    kind: Literal["matrix-unit", "vector-fma", "scalar"]
    name: str
    m: int
    n: int
    k: int
    operand_dtype: str
    accumulator_dtype: str
    scope: str
    registers: int = 0  # vector registers the tile uses (vector-fma, or a unit in the vector registers)
    #: The instruction's (m, n, k) when the tile is a register tile of many instructions of a matrix unit
    #: kept in the vector registers (``MatrixUnit.registers == "vector"``: ``m x n`` above is the register
    #: tile, ``k`` the instruction's depth); None when the tile is one instruction (or not a unit).
    instruction: tuple[int, int, int] | None = None
    #: The dtype the instructions read A and B in where the operands are widened into it as they are packed
    #: (`MatrixUnit.register_dtype`: AVX2's ``vpmaddwd`` reads i8 as i16); "" for the operands' own.
    reads: str = ""


@dataclasses.dataclass(frozen=True)
class LevelTile:
    """The tile held at one memory level, and why it is that size."""

    level: str
    managed: str
    m: int
    n: int
    k: int
    footprint_bytes: int
    budget_bytes: int
    double_buffered: bool
    holds_accumulator: bool
    traffic_bytes: int  # bytes the next level out serves for the whole op with this tile


@dataclasses.dataclass(frozen=True)
class Estimate:
    seconds: float
    bound: str  # "compute" or a memory level's name
    terms: tuple[tuple[str, float], ...]  # (what, seconds)


@dataclasses.dataclass(frozen=True)
class Blocking:
    """How a vector-FMA contraction is packed and blocked on a cache hierarchy (Goto/BLIS loop nest).

    ``kc`` is the reduction block (its B micro-panel, ``kc x nr``, is reused from ``kc_level`` across
    the whole A block); ``mc x kc`` is the packed A block, kept in ``mc_level``; ``kc x nc`` the packed
    B panel, kept in ``nc_level``. ``threads`` parts of the output (split along ``split``) run on as
    many units of the outermost compute level, each with its own packed buffers."""

    mr: int
    nv: int
    lanes: int
    mc: int
    nc: int
    kc: int
    threads: int = 1
    split: str = "m"  # "batch", "m" or "n"
    kc_level: str = ""
    mc_level: str = ""
    nc_level: str = ""
    #: B is copied into micro-panels; False when a thread's rows fit one register tile, so each B panel
    #: would be read once — the micro-kernel then loads B in place (a GEMV-like shape: packing would
    #: triple the traffic of an operation bound by reading B).
    pack_b: bool = True
    #: Each micro-tile prefetches its C lines (for writing) before its k loop, so the C update after the
    #: loop does not wait for them: C is read and written once per k block, and a C larger than the
    #: middle cache comes from the outer one.
    prefetch_c: bool = True
    #: A is copied into k-major micro-panels; False when a thread's columns fit `A_IN_PLACE_PANELS` register
    #: tiles, so each A element would be used that many times at most — the micro-kernel then broadcasts A
    #: from its rows in place (packing costs a scalar load and store an element, more than it saves there).
    pack_a: bool = True
    #: Computed transposed, ``C^T = B^T A^T`` (`orientation`): every size above is of that product, whose
    #: rows are the op's columns; A^T (the given B) is read in place (packed where B is stored ``[n, k]``),
    #: B^T (the given A) packed (through register transposes where A is stored ``[m, k]``), and C updated a
    #: transposed micro-tile at a time.
    transposed: bool = False
    #: The matrix unit whose instructions make the register tile (`ComputeTile.instruction`), or "" for
    #: vector FMAs; ``unit_k`` is its depth: each step of the micro-kernel's k loop consumes that many k.
    unit: str = ""
    unit_k: int = 1
    #: Panels of B a unit kernel packs per call in one pass down B's rows (`_pass_panels`): each pass reads
    #: that many panels' columns of every row, so B's rows (and pages) are visited once per pass, not once
    #: per panel.
    pass_panels: int = 1

    def __post_init__(self) -> None:
        if min(self.mr, self.nv, self.lanes, self.mc, self.nc, self.kc, self.threads) < 1:
            raise ValueError(f"blocking {self}: every size must be positive")
        if self.mc % self.mr or self.nc % self.nr:
            raise ValueError(f"blocking {self}: mc must be a multiple of mr and nc of nr")

    @property
    def nr(self) -> int:
        return self.nv * self.lanes


#: Long k blocks (see `_k_block`): the B micro-panel may take 1/LONG_K_SHARE of the middle cache — of its
#: capacity, and of its bandwidth while the micro-kernel streams it from there (`long_k_stream_share`) — when a
#: thread has at least LONG_K_ROW_TILES register-tile rows. Measured on a Zen 4 core (1 MiB L2, 64 B a cycle;
#: the 30x16 tile's B stream takes 3 % of it), 1 thread, against kc filling L1: 1024^3 1.04x, 512x768x3072
#: 1.05x, 2048^3 (two blocks of 1024) 1.07x, 6272x1152x128 1.16x; 128x4096x4096 (10 row tiles) 0.86x with
#: kc 1024, so few rows keep the L1 rule. On a Zen 3 core (512 KiB L2, 31 B a cycle; the 6x16 tile's B stream
#: takes 34 % of it), kc 512 (L1) against long blocks (`benchmarks/long_k.py`, same process, clock 3.2 GHz),
#: 1 thread: 128x4096x4096 1.06x, 512x768x3072 (kc 768) 1.01x, 2048^3 0.99x, 1024^3 0.98x; 2 threads 1.15x,
#: 0.98x, 1.04x, 1.04x; at a 2.8-3.0 GHz clock (a busier host) 1 thread 1.05-1.12x on all but 1024^3.
LONG_K_SHARE = 8
LONG_K_ROW_TILES = 16

#: A is read in place (`Blocking.pack_a` False) when a thread's columns fit this many register tiles.
#: 1x1 conv at 7x7, 2048 -> 512 as given (512x49x2048, B 49 columns: 2 tiles of 32), Zen 4: 1.78 -> 1.4 ms.
A_IN_PLACE_PANELS = 2

#: An A stored [m, k] read in place is packed instead when more of a register tile's mr rows fall in one set
#: of the innermost cache than it has ways (`rows_per_set`: rows a multiple of the set span apart, e.g. 4 KiB)
#: and the tile does at most this many vector FMAs per A value loaded: the rows' lines then evict one another
#: before their L values are used, and each A value comes from the next level. Zen 4 (32 KiB 8-way l1d),
#: 1 thread, packed / in place: 30 rows in one set (the 30x16 tile: 1024x16x4096, 2048x16x2048, 512x16x4096,
#: 1024x16x6144) 2.9-3.7x, 15 in each of 2 sets (1024x16x512, 1024x16x1536, 1024x16x2560) 1.47-1.51x; 14 rows
#: in one set with 2 vectors a row (1024x24x1024, 1024x32x4096, 1024x64x4096) 1.03-1.14x; with 3 (the 8x48
#: tile of 1024x48x1024, 1024x48x4096, 1024x40x4096) 0.79-0.85x: kept in place; 8 rows a set (1024x16x256)
#: 0.73x and 4 (1024x16x4100) 0.57x: in place, as without conflicts (1024x16x1000 0.71x).
SET_CONFLICT_MAX_NV = 2

#: An A stored [k, m] (a transposed product's A^T, an ``a.T @ b``) is read in place unless a thread's columns
#: span more than this many register tiles: its mr values of a k step are adjacent, but the k steps are a
#: row apart. Zen 4, 1 thread: 512x768x3072 with A stored [768, 512], 96 tiles: packed 1.03x in place; the
#: same product computed transposed (A^T = the given B, 16 tiles): in place 1.03x packed; the transposed
#: products of `TRANSPOSE_MARGIN` (up to 64 tiles) were measured in place.
A_KM_IN_PLACE_PANELS = 64

#: Least work per core (seconds, by the one-core roofline estimate) worth a fork onto another core.
MIN_PARALLEL_SECONDS = 10e-6


#: A transposing pack (`Blocking.transposed`: B^T from A, L x L blocks through register shuffles) costs
#: as much as this many vector FMAs per element: Zen 4 (one 512-bit FMA a cycle), 0.37 cycles an element
#: (A 512 x 2048 f32 in 0.1 ms).
TRANSPOSE_PACK_FMAS = 0.4
#: A product is computed transposed when that takes at most this share of the cycles of the given one.
#: Measured on Zen 4, transposed / given time at 1 (2) threads, model in brackets: 512x49x2048 0.74 [0.87],
#: 64x49x576 0.83 [0.87], 512x33x512 0.85 [0.82], 2048x49x2048 0.89 [0.88], 4096x8x4096 0.49 [0.87];
#: the 14x14 1x1 convolutions of ResNet-50 as NCHW products 512x196x512 0.93 (0.92) [0.92], 256x196x1024
#: 0.93 (0.82) [0.92], 1024x196x256 0.92 (0.88) [0.92], 1024x196x512 0.93 (0.90) [0.92] (all transposed);
#: 1024x100x1024 1.00 (1.01) [0.95], 1000x10x1000 1.11 [0.99] (not). Missed: 1024x24x1024 0.84 (0.83)
#: [0.94], 256x40x256 0.95 (0.88) [0.95] — the given orientation loses more than its issue cycles say where
#: it reads A in place from many rows.
TRANSPOSE_MARGIN = 0.93


def rows_per_set(level: MemoryLevel, stride_bytes: int, rows: int) -> int:
    """The most of ``rows`` rows ``stride_bytes`` apart (the first at a line boundary) whose lines at one
    column fall in one set of the cache ``level``; 1 where its associativity or line size is unknown."""
    if not level.ways or not level.line_bytes or rows < 1:
        return 1
    sets = level.size_bytes // (level.ways * level.line_bytes)
    if sets < 1:
        return 1
    span = sets * level.line_bytes  # addresses this far apart share a set
    counts: dict[int, int] = {}
    for r in range(rows):
        line = (r * stride_bytes) % span // level.line_bytes
        counts[line] = counts.get(line, 0) + 1
    return max(counts.values())


def _round_down(v: int, multiple: int) -> int:
    return max(multiple, v // multiple * multiple)


def step_cycles(fma_per_cycle: int, loads_per_cycle: int, mr: int, nv: int, latency: int = 1) -> float:
    """Issue cycles of one k step of one ``mr x nv``-vector register tile: its FMAs, its loads, and at least
    the FMA ``latency`` (`VectorUnit.fma_latency`): each accumulator's FMA waits for its previous one."""
    return max(mr * nv / fma_per_cycle, (mr + nv) / loads_per_cycle, latency)


def issue_cycles(fma_per_cycle: int, loads_per_cycle: int, lanes: int, m: int, n: int, mr: int, nv: int,
                 latency: int = 1) -> float:
    """Issue cycles of one k step over an ``m x n`` output in ``mr x nv``-vector register tiles (tiles that
    overhang the edges cost their full time; see `register_tile`), each step at least the FMA ``latency``
    except where the tile is as tall as the product: B then streams past its rows once (each B element meets
    each row once, read in place), and that stream, not the latency, bounds it (widening such a tile for the
    latency lost, Zen 3: 2x768x3072 in 2x4 vectors instead of 2x2 at 2 threads 0.72x; 1x768x3072 in 1x7
    instead of 1x6 at 1 thread 0.6x)."""
    per_step = step_cycles(fma_per_cycle, loads_per_cycle, mr, nv, latency if mr < m else 1)
    return -(-m // mr) * -(-n // (nv * lanes)) * per_step


@dataclasses.dataclass(frozen=True)
class Orientation:
    """`orientation`'s decision, with the figures it compared (issue cycles of one k step; 0 where it
    compared none)."""

    transposed: bool
    given_cycles: float = 0.0  # the given tiles' and, for a B stored [n, k], its transposing pack's
    transposed_cycles: float = 0.0  # the transposed tiles' and the transposing pack's
    pack_cycles: float = 0.0  # the transposed product's transposing pack (of the given A stored [m, k])
    given_pack_cycles: float = 0.0  # the given product's transposing pack (of a B stored [n, k])
    why: str = ""


def orientation(spec: ChipSpec, op: Contraction, options: Options | Mapping[str, Any] | None = None
                ) -> Orientation:
    """Whether the vector register tiles compute ``op`` transposed, ``C^T = B^T A^T``, and why.

    Vectors run along the output's columns: ``n`` = 49 fills four 16-lane vectors at 77 %, while its
    ``m`` = 512 rows would fill them whole. Transposed, the op's rows are the vectors' lanes, at the cost
    of packing B^T = A through register transposes (`TRANSPOSE_PACK_FMAS` an element, per k step ``m``
    of them) where A is stored ``[m, k]``: chosen when the issue cycles of the transposed tiles plus that
    pack are at most `TRANSPOSE_MARGIN` of the given tiles' (plus, for a B stored ``[n, k]``, its own
    transposing pack, ``n`` elements a k step). A pack is free for a constant A (``a_prepackable``: packed
    at compile time) and for an A stored ``[k, m]`` (B^T is then a plain copy). Never for a prepacked B
    (its packing is free as it is)."""
    opts = as_options(options)
    vec = spec.vector
    if opts.transpose_gemm is False or vec is None or not vec.fma or op.accumulator not in vec.dtypes:
        return Orientation(False)
    if op.b_prepacked:
        return Orientation(False, why="not transposed: B is packed ahead of time in the given orientation")
    lanes = vec.lanes(op.accumulator)
    fma, loads, lat = vec.fma_per_cycle, vec.loads_per_cycle, vec.fma_latency
    mr, nv, _ = register_tile(vec.registers, lanes, fma, loads, op.m, op.n, latency=lat)
    tmr, tnv, _ = register_tile(vec.registers, lanes, fma, loads, op.n, op.m, latency=lat)
    given_pack = op.n * TRANSPOSE_PACK_FMAS / fma if op.b_layout == "nk" else 0.0
    given = issue_cycles(fma, loads, lanes, op.m, op.n, mr, nv, lat) + given_pack
    pack = 0.0 if op.a_prepackable or op.a_layout == "km" else op.m * TRANSPOSE_PACK_FMAS / fma
    swapped = issue_cycles(fma, loads, lanes, op.n, op.m, tmr, tnv, lat) + pack
    a_pack = ("A constant: packed as B^T at compile time" if op.a_prepackable else
              "A stored [k, m]: B^T a plain copy" if op.a_layout == "km" else f"{pack:.0f} of them packing A^T")
    figures = (f"{given:.0f} issue cycles a k step as given ({mr}x{nv * lanes} tiles"
               + (f", {given_pack:.0f} of them packing B stored [n, k]" if given_pack else "")
               + f"), {swapped:.0f} transposed ({tmr}x{tnv * lanes} tiles, {a_pack})")
    if opts.transpose_gemm:
        return Orientation(True, given, swapped, pack, given_pack,
                           f"computed transposed (C^T = B^T A^T), as option transpose_gemm asks: {figures}")
    if swapped <= TRANSPOSE_MARGIN * given:
        reason = (f"its {op.m} rows fill the vector lanes better than its {op.n} columns"
                  if issue_cycles(fma, loads, lanes, op.n, op.m, tmr, tnv, lat) < given - given_pack else
                  "its operands need fewer transposing packs that way")
        return Orientation(True, given, swapped, pack, given_pack, f"computed transposed (C^T = B^T A^T): {reason}: "
                           f"{figures}")
    return Orientation(False, given, swapped, pack, given_pack,
                       f"not transposed: {figures}" if given_pack or op.a_layout == "km" else "")


def blocking(spec: ChipSpec, op: Contraction, unit: ComputeTile,
             options: Options | Mapping[str, Any] | None = None, solo_seconds: float | None = None,
             ) -> tuple[Blocking | None, list[str]]:
    """Block sizes for packing on a cache hierarchy, from capacities alone (None without caches or
    without a vector register tile).

    ``solo_seconds`` is the roofline estimate of the whole op on one unit of the outermost compute
    level (compute or memory, whichever is larger; default: compute at the unit's peak). Each extra unit
    must get at least `MIN_PARALLEL_SECONDS` of it: a matrix-vector product has little arithmetic but
    streams its whole matrix, and split over the cores each core streams (and caches) only its part.

    When `orientation` says so, the blocking is that of the transposed product (``Blocking.transposed``)."""
    opts = as_options(options)
    caches = [lv for lv in reversed(spec.memory) if lv.managed == "cache"]  # innermost first
    if not (unit.kind == "vector-fma" or unit.instruction is not None) or not caches or spec.vector is None:
        return None, []
    if unit.instruction is not None and (op.a_layout != "mk" or op.b_layout != "kn"):
        return None, [(f"{unit.name}: operands stored transposed are not planned for a unit in the vector "
                       "registers")]
    if unit.instruction is not None:  # the unit's groups of k are along A's rows: never transposed
        opts = opts.replace(transpose_gemm=False)
    turn = orientation(spec, op, opts)
    if turn.transposed:
        # The transposed product's B is the given A, packed ahead of time when it is a constant; the split
        # over threads stays that of a B packed per call (each thread then reads only its columns of the
        # prepacked B: the split along m it would get as prepacked made 196x1024x256 at 2 threads 0.82x).
        swapped = op.transposed()
        blk, why = _blocking(spec, swapped, compute_tile(spec, swapped, opts)[0], opts, solo_seconds, caches, True,
                             b_constant=op.a_prepackable)
        return blk, [f"{turn.why}; the blocking below is the transposed product's ({op.n}x{op.m}x{op.k})", *why]
    blk, why = _blocking(spec, op, unit, opts, solo_seconds, caches, False)
    return blk, ([turn.why] if turn.why else []) + why


@dataclasses.dataclass(frozen=True)
class _MicroTile:
    """The register tile `_blocking` blocks for: ``mr`` rows by ``nv`` vectors of ``lanes`` (``nr``
    columns), on packed operands of ``eb`` bytes an element (``source_eb`` as stored, where packing widens
    them for the unit)."""

    mr: int
    nv: int
    nr: int
    lanes: int
    eb: float
    source_eb: float = 0.0

    @property
    def stored_eb(self) -> float:
        return self.source_eb or self.eb


@dataclasses.dataclass(frozen=True)
class _ThreadSplit:
    """`_thread_split`'s decision: ``threads`` parts along ``split``, each thread's rows (``m_part``) and
    columns (``n_part``), and why."""

    threads: int
    split: str
    m_part: int
    n_part: int
    why: str


def _blocking(spec: ChipSpec, op: Contraction, unit: ComputeTile, opts: Options, solo_seconds: float | None,
              caches: list[MemoryLevel], transposed: bool, b_constant: bool = False) -> tuple[Blocking, list[str]]:
    """The blocking of ``op`` (the transposed product's, with ``transposed``; ``b_constant``: its B is the
    given A, packed at compile time)."""
    assert spec.vector is not None
    lanes = spec.vector.lanes(op.accumulator)
    tile = _MicroTile(unit.m, unit.n // lanes, unit.n, lanes, _bytes(unit.reads or op.dtype), _bytes(op.dtype))
    par = _thread_split(spec, op, opts, solo_seconds, tile)
    l1 = caches[0]
    l2 = caches[1] if len(caches) > 1 else l1
    l3 = caches[2] if len(caches) > 2 else l2
    kc, why_kc = _k_block(spec, op, unit, tile, l1, l2, par.m_part)
    mc, nc, why_mc_nc = _cache_blocks(tile, l2, l3, kc, par)
    pack_b, why_b = _b_packing(op, opts, tile, par.m_part, transposed, b_constant)
    pack_a, why_a = _a_packing(op, unit, opts, tile, l1, par.n_part)
    unit_name, unit_k = (unit.name, unit.k) if unit.instruction is not None else ("", 1)
    why = [par.why, *why_kc, *why_mc_nc]
    # The FMA kernel prefetches C; a unit kernel does not (prefetching there measured 1.00x on the suite's
    # products and 0.96x on 3136x256x64 i8, Zen 4: its k loop is long enough, or too short to hide it).
    prefetch_c = not transposed and unit.instruction is None
    if prefetch_c:
        why.append("C prefetched by each micro-tile before its k loop (C is updated once per k block)")
    why += why_b + why_a + _unit_steps(unit, kc, pack_a)
    passes = 1
    if unit_k > 1 and pack_b and not b_constant:
        passes, why_pass = _pass_panels(spec, op, tile, l1, nc, par.n_part, sums=op.dtype == "i8" and not unit.reads)
        why.append(why_pass)
    return Blocking(tile.mr, tile.nv, lanes, mc, nc, kc, par.threads, par.split, l1.name, l2.name, l3.name, pack_b,
                    prefetch_c=prefetch_c, pack_a=pack_a, transposed=transposed, unit=unit_name,
                    unit_k=unit_k, pass_panels=passes), why


def _thread_split(spec: ChipSpec, op: Contraction, opts: Options, solo_seconds: float | None,
                  tile: _MicroTile) -> _ThreadSplit:
    """How many units of the outermost compute level share ``op`` and along which dimension: every extra
    unit gets at least `MIN_PARALLEL_SECONDS` of the work and whole register tiles."""
    mr, nr = tile.mr, tile.nr
    units = spec.compute[0].count
    per_core = max({str(k): v for k, v in spec.peak_tflops.items()}.get(op.dtype, 0.0), 1e-6) * 1e12 / units
    solo = max(solo_seconds or 0.0, op.flops / per_core)
    threads = opts.threads or units
    if solo / max(threads, 1) < MIN_PARALLEL_SECONDS:
        threads = max(1, min(threads, int(solo / MIN_PARALLEL_SECONDS)))
    packing = ""
    if threads == 1:
        split = "m"
    elif op.batch >= threads:
        split = "batch"
    elif -(-op.n // nr) < threads:
        split = "m"
    elif -(-op.m // mr) < 2 * threads:
        split = "n"
    else:
        # Each thread packs what it does not split: all of B (k x n) when the rows are split, all of A
        # (m x k) when the columns are. Split the operand whose copy per thread would be larger.
        b_pack = 0 if op.b_prepacked else op.k * op.n
        split = "n" if b_pack > op.m * op.k else "m"
        packing = (f": each thread packs all of the operand it does not split, B ({b_pack} values"
                   + (", packed ahead of time" if op.b_prepacked else "") + f") or A ({op.m * op.k})")
    if split == "batch":
        threads = min(threads, op.batch)
    elif split == "m":
        threads = min(threads, -(-op.m // mr))
    else:
        threads = min(threads, -(-op.n // nr))
    m_part = -(-op.m // threads) if split == "m" else op.m
    n_part = -(-op.n // threads) if split == "n" else op.n
    why = (f"{threads} thread{'s' if threads > 1 else ''} over '{spec.compute[0].name}' split along {split}"
           + packing
           + ("" if threads == units else f" (of {units}: less work than {MIN_PARALLEL_SECONDS * 1e6:.0f} us "
                                              f"per extra unit (one {spec.compute[0].name}: "
                                              f"{solo * 1e6:.1f} us), or too few tiles)"))
    return _ThreadSplit(threads, split, m_part, n_part, why)


def long_k_stream_share(spec: ChipSpec, tile: _MicroTile, level: MemoryLevel) -> float | None:
    """The share of ``level``'s bandwidth a vector-FMA micro-kernel's B stream takes when its B micro-panel
    comes from ``level`` instead of the innermost cache: ``nr`` values a k step, each step `issue_cycles` of
    one ``mr x nv`` tile at the spec's clock. None where the spec gives no clock or no vector unit."""
    vec = spec.vector
    if vec is None or not spec.clock_ghz or level.bandwidth_gbps <= 0:
        return None
    step = step_cycles(vec.fma_per_cycle, vec.loads_per_cycle, tile.mr, tile.nv, vec.fma_latency)
    return tile.nr * tile.eb / step / (level.bandwidth_gbps / spec.clock_ghz)


def _k_block(spec: ChipSpec, op: Contraction, unit: ComputeTile, tile: _MicroTile, l1: MemoryLevel,
             l2: MemoryLevel, m_part: int) -> tuple[int, list[str]]:
    """The reduction block ``kc`` for a thread of ``m_part`` rows, and why: the B micro-panel in ``l1``,
    or long blocks streaming it from ``l2`` where passes over C would cost more and ``l2`` feeds the stream
    with a small share of its bandwidth (`long_k_stream_share`)."""
    mr, nr, lanes, eb = tile.mr, tile.nr, tile.lanes, tile.eb
    why = []
    l1_kc = min(op.k, max(lanes, int(l1.size_bytes // (nr * eb)) // lanes * lanes))
    l2_kc = max(l1_kc, int(l2.size_bytes // LONG_K_SHARE // (nr * eb)) // lanes * lanes)
    share = long_k_stream_share(spec, tile, l2) if unit.instruction is None else None
    if op.k > l1_kc and m_part >= LONG_K_ROW_TILES * mr and share is not None and share > 1 / LONG_K_SHARE:
        kc = l1_kc
        why.append(f"kc {kc}: the {kc}x{nr} B micro-panel fills {l1.name} ({l1.size_bytes} B); not longer: "
                   f"streamed from {l2.name} it would take {share:.0%} of its bandwidth (at most 1/{LONG_K_SHARE})")
    elif unit.instruction is not None and unit.instruction[0] == 1 and l1_kc < op.k <= 2 * l2_kc:
        # A unit tile takes k in one block where its B micro-panel fits the long-k share of l2: no pass of
        # f32 partial sums over C between blocks (C may then be elided: the epilogue stores D directly).
        kc = op.k
        why.append(f"kc {kc}: all of k in one block, the {kc}x{nr} B micro-panel in 1/{LONG_K_SHARE} of {l2.name}: "
                   "no pass over f32 partial sums")
    elif op.k > l1_kc and m_part >= LONG_K_ROW_TILES * mr:
        # Many rows: every k block is a pass over C and a pack of the A block, so take few long blocks
        # (equal ones), the B micro-panel streaming from l2 to row tiles enough to hide it.
        blocks = -(-op.k // l2_kc)
        kc = min(op.k, _round_up(-(-op.k // blocks), lanes))
        why.append(f"kc {kc}: {blocks} equal k block(s), the {kc}x{nr} B micro-panel in 1/{LONG_K_SHARE} of "
                   f"{l2.name}: {m_part} rows make a pass over C cost more than streaming it from there")
    else:
        kc = l1_kc
        why.append(f"kc {kc}: the {kc}x{nr} B micro-panel fills {l1.name} ({l1.size_bytes} B)")
    if unit.instruction is not None:  # whole groups of the unit's depth (the last one zero-padded past k)
        kc = _round_up(kc, unit.k)
    return kc, why


def _cache_blocks(tile: _MicroTile, l2: MemoryLevel, l3: MemoryLevel, kc: int, par: _ThreadSplit
                  ) -> tuple[int, int, list[str]]:
    """``mc`` (the packed A block, in half of ``l2``) and ``nc`` (the packed B panel, in half of ``l3``,
    shared by the threads where ``l3`` is), each at most a thread's part, and why."""
    mr, nr, eb = tile.mr, tile.nr, tile.eb
    mc = _round_down(int(l2.size_bytes * CACHE_BUDGET // (kc * eb)), mr)
    mc = min(mc, _round_up(par.m_part, mr))
    why = [f"mc {mc}: the packed {mc}x{kc} A block in half of {l2.name}"]
    sharing = par.threads if l3.scope == "device" else 1
    nc = _round_down(int(l3.size_bytes * CACHE_BUDGET // sharing // (kc * eb)), nr)
    nc = min(nc, _round_up(par.n_part, nr))
    why.append(f"nc {nc}: the packed {kc}x{nc} B panel in half of {l3.name}" + (f" (shared by {sharing})" if sharing > 1 else ""))
    return mc, nc, why


def _b_packing(op: Contraction, opts: Options, tile: _MicroTile, m_part: int, transposed: bool,
               b_constant: bool) -> tuple[bool, list[str]]:
    """Whether B is packed into micro-panels, and why (with, for the transposed product, how its operands
    are read)."""
    mr = tile.mr
    why = []
    b_nk, a_km = op.b_layout == "nk", op.a_layout == "km"
    # A B stored [n, k] is only ever read through its (transposing) pack.
    pack_b = True if transposed or b_nk else opts.pack_b if opts.pack_b is not None else m_part > mr
    if transposed:
        why.append("B^T (the given A) packed " + ("at compile time (a constant)" if b_constant else
                                                  "through register transposes" if b_nk else "(stored [k, m])")
                   + (", A^T read in place (mr adjacent values a k step)" if a_km else ", A^T (the given B) packed")
                   + ", C updated a transposed micro-tile at a time")
    elif b_nk:
        why.append("B stored [n, k]: packed through register transposes")
    if not pack_b:
        why.append(f"B not packed: {m_part} row(s) per thread fit one {mr}-row register tile, so every B element "
                   "is used once; the micro-kernel reads B in place")
    return pack_b, why


def _a_packing(op: Contraction, unit: ComputeTile, opts: Options, tile: _MicroTile, l1: MemoryLevel,
               n_part: int) -> tuple[bool, list[str]]:
    """Whether A is packed into micro-panels, and why: by the reuse of a thread's ``n_part`` columns, the
    unit's operand form (`_unit_a_packing`), and rows read in place that would evict each other in ``l1``."""
    mr, nv, nr, lanes, eb = tile.mr, tile.nv, tile.nr, tile.lanes, tile.eb
    why = []
    a_km = op.a_layout == "km"
    # A stored [k, m] is read in place, mr adjacent values a k step, unless very many column tiles reuse it.
    panels = A_IN_PLACE_PANELS if not a_km else A_KM_IN_PLACE_PANELS
    pack_a = opts.pack_a if opts.pack_a is not None else n_part > panels * nr
    unit_packing = _unit_a_packing(unit, op, l1, mr, opts, a_km, -(-n_part // nr))
    if unit_packing is not None:
        pack_a, reason = unit_packing
        why.append(reason)
    # An A stored [m, k] read in place whose tile rows (contiguous: k values apart) evict one another in l1.
    if (not (a_km or pack_a or opts.pack_a is not None or l1.ways is None) and nv <= SET_CONFLICT_MAX_NV
            and unit.instruction is None):
        stride = int(op.k * eb)
        shared = rows_per_set(l1, stride, mr)
        if shared > l1.ways:
            pack_a = True
            why.append(f"A packed: read in place, {shared} of a tile's {mr} rows ({stride} B apart) would share "
                       f"one {l1.name} set ({l1.ways} ways) and evict each other before their {lanes} values are "
                       f"used ({nv} vector FMA(s) per A value)")
    if a_km:
        why.append(f"A stored [k, m]: {'packed' if pack_a else 'read in place'} (its rows' mr adjacent values a k "
                   f"step; {n_part} column(s) per thread, {-(-n_part // nr)} register tile(s), packed past {panels})")
    elif not pack_a and unit.instruction is None:
        why.append(f"A not packed: {n_part} column(s) per thread fit {-(-n_part // nr)} {nr}-column register "
                   "tile(s), so every A element is used at most that often; the micro-kernel reads A in place")
    return pack_a, why


#: Lines of each row of B one packing pass of a unit kernel reads (`_pass_panels`). Zen 4, 1 thread, i8 /
#: bf16 256x4096x4096 with B given per call, against a pass per panel (one 32-byte / 64-byte read a row): 2
#: lines 1.145x / 1.07x, 4 lines 1.156x / 1.10x; 1024^3, 2048^3, 512x768x3072 within 1 %.
PASS_LINES = 4
#: Line size where the spec's innermost cache does not give one.
DEFAULT_LINE_BYTES = 64


def _pass_panels(spec: ChipSpec, op: Contraction, tile: _MicroTile, l1: MemoryLevel, nc: int, n_part: int,
                 sums: bool = False) -> tuple[int, str]:
    """How many of B's micro-panels a unit kernel packs in one pass down B's rows, and why: enough that each
    row's read is `PASS_LINES` lines of ``l1`` (packed one panel at a time, a B of wide rows has every row, on
    its own page, visited once per panel for an nr-column sliver), at most the columns of a thread's
    ``nc``-column block (a pass past the block's last panel masks its loads), and with ``sums`` (VNNI's int8
    correction) the column sums of the pass's panels (one accumulator per vector) in at most half the vector
    registers."""
    assert spec.vector is not None
    line = l1.line_bytes or DEFAULT_LINE_BYTES
    row_bytes = tile.nr * tile.stored_eb
    panels = min(max(1, int(PASS_LINES * line // row_bytes)), -(-min(nc, n_part) // tile.nr))
    if sums:
        panels = min(panels, max(1, spec.vector.registers // 2 // tile.nv))
    return panels, (f"B packed {panels} micro-panel(s) a pass down its rows ({panels * row_bytes:g} B of each row, "
                    f"{PASS_LINES} lines of {line} B wanted)")


def _unit_steps(unit: ComputeTile, kc: int, pack_a: bool) -> list[str]:
    """What each micro-kernel step of a unit in the vector registers consumes (none without a unit)."""
    unit_name, unit_k = (unit.name, unit.k) if unit.instruction is not None else ("", 1)
    tile_unit = unit.instruction is not None and unit.instruction[0] > 1
    if unit_k > 1 and not tile_unit:
        return [(f"{unit_name}: each micro-kernel step consumes {unit_k} k; B packed in groups of {unit_k} rows "
                 f"interleaved, A broadcast in groups of {unit_k} "
                 f"{'from rows packed a vector at a time' if pack_a else 'from its rows in place'}")]
    if tile_unit:
        return [(f"{unit_name}: each step loads 2 A and 2 B tiles of {unit_k} k (B in 32-bit groups of rows "
                 f"interleaved) into 2 x 2 accumulator tiles; kc {kc} in {kc // unit_k} steps, a loop carrying them")]
    return []


def _unit_a_packing(unit: ComputeTile, op: Contraction, l1: MemoryLevel, mr: int, opts: Options,
                    a_km: bool, panels: int) -> tuple[bool, str] | None:
    """Whether a register tile of unit instructions packs A, and why; None where the FMA tile's rule holds
    (no unit, A stored [k, m], or the ``pack_a`` option forcing it). ``panels``: the register tiles across a
    thread's columns, i.e. how often each A group is broadcast."""
    if unit.instruction is None:
        return None
    if unit.instruction[0] > 1:
        # Tile loads read whole rows of 16 x k: A is packed, zero past k and clamped past the last row.
        return True, f"A packed: {unit.name} loads tiles of {unit.instruction[0]} rows x {unit.k} from a packed block"
    if opts.pack_a is not None or a_km:
        return None
    if unit.reads:
        # Widened in place, each broadcast group would take a load and a sign extension per value before its
        # broadcast (and more instructions than the unit's); packed, it is one 32-bit broadcast load. Zen 3, 1
        # thread, i8 on vpmaddwd, packed against in place: 3136x64x576 1.65x, 49x512x4608 1.38x.
        return True, (f"A packed: {unit.name} reads A widened to {unit.reads}, once as packed rather than at each "
                      "broadcast")
    # A unit's A operand is a broadcast group of k values, loaded from A's rows as they are or from a packed
    # copy alike: packing pays when the tile's rows evict one another from l1, and for int8 (read as u8, each
    # byte offset by 128) when the offset, once per packed byte, saves more broadcasts' offsets than the
    # pass costs. Zen 4, 1 thread, packed against in place: 2 panels (6272x64x576, 25088x64x64) 0.94x, 8
    # (3136x256x64) and 16 (784x512x4608) 1.00x, 32 (1024^3) 1.05x, 64 (2048^3) 1.02x.
    stride = int(op.k * _bytes(op.dtype))
    if l1.ways is None:
        return True, (f"A packed: {unit.name}'s A operand is a broadcast group of {unit.k}; {l1.name}'s "
                      "associativity is unknown")
    shared = rows_per_set(l1, stride, mr)
    where = f"{shared} of a tile's {mr} rows ({stride} B apart) share one {l1.name} set ({l1.ways} ways)"
    if shared > l1.ways:
        return True, f"A packed: {unit.name}'s A operand is a broadcast group of {unit.k}; {where}"
    if op.dtype == "i8":
        pack = panels > A_IN_PLACE_PANELS
        return pack, (f"A {'packed' if pack else 'read in place'}: {unit.name} reads A as u8 (each byte + 128), "
                      f"{'once while packing' if pack else 'at each broadcast'}: each group is broadcast for "
                      f"{panels} register tile(s) of columns (in place up to {A_IN_PLACE_PANELS}); {where}")
    return False, f"A read in place: {unit.name}'s A operand is a broadcast group of {unit.k}; {where}"


def split_parallel(loops: Sequence[tuple[str, int]], units: int, *, unit: str = "unit"
                   ) -> tuple[tuple[tuple[str, int], ...], str]:
    """How the tiles of parallel ``loops`` ((name, tile count), outermost first) are shared by ``units``
    compute units (each a ``unit``, for the reason): ``((name, parts), ...)`` — one loop, or two when that shortens the busiest unit's
    work — and why.

    Each split loop's tiles go to ``parts`` units in balanced runs of ``ceil(tiles / parts)``
    consecutive tiles (the last run may be shorter); ``parts`` is the fewest giving that run length, so
    no unit idles inside a split. The choice minimises the busiest unit's tile count (the product over
    all loops of tiles per part), then the units used, then the loops split, preferring outer loops.
    A loop of one tile is never split; with one unit, or no loop of more than one tile, nothing is."""
    cands = [(i, name, count) for i, (name, count) in enumerate(loops) if count > 1]
    if units <= 1 or not cands:
        why = f"one {unit}" if units <= 1 else "no parallel loop has more than one tile"
        return (), f"no parallel split: {why}"
    total = 1
    for _, count in loops:
        total *= max(1, count)

    def balanced(count: int, parts: int) -> int:
        return -(-count // -(-count // parts))

    options: list[tuple[tuple[int, int, int, tuple[int, ...]], tuple[tuple[str, int], ...]]] = []
    for i, name, count in cands:
        p = balanced(count, min(units, count))
        busiest = total // count * -(-count // p)
        options.append(((busiest, p, 1, (i,)), ((name, p),)))
    for a in range(len(cands)):
        for b in range(a + 1, len(cands)):
            (i, n1, c1), (j, n2, c2) = cands[a], cands[b]
            for p1 in range(2, min(units, c1) + 1):
                p2 = min(c2, units // p1)
                if p2 < 2:
                    continue
                p1b, p2b = balanced(c1, p1), balanced(c2, p2)
                busiest = total // (c1 * c2) * -(-c1 // p1b) * -(-c2 // p2b)
                options.append(((busiest, p1b * p2b, 2, (i, j)), ((n1, p1b), (n2, p2b))))
    (busiest, used, _, _), chosen = min(options, key=lambda o: o[0])
    split = " x ".join(f"{name} {parts}" for name, parts in chosen)
    tiles = ", ".join(f"{name} {count}" for name, count in loops)
    return chosen, (f"{split} part(s) on {used} of {units} {unit}s ({tiles} tiles; the busiest {unit} gets "
                    f"{busiest} of {total})")


@dataclasses.dataclass(frozen=True)
class ContractionPlan:
    op: Contraction
    compute: ComputeTile
    levels: tuple[LevelTile, ...]  # innermost first
    loop_order: tuple[str, ...]  # outermost first, one name per tiled loop, e.g. ("n@l3", "k@l2", ...)
    parallel_level: str | None
    parallel_dims: tuple[str, ...]
    parallel_ways: int
    estimate: Estimate
    reasons: tuple[str, ...]
    blocking: Blocking | None = None
    #: The tiled form's split over ``spec.compute[0]``: ((loop, parts), ...) with loops named like
    #: `loop_order`'s (``"m@spm"``), those of the outermost software-managed level of that compute
    #: level's scope; empty when nothing runs in parallel there (`split_parallel`).
    parallel: tuple[tuple[str, int], ...] = ()
    #: The dtype A and B are widened to as they are packed (`widened_dtype`: a bf16 product on a chip
    #: without bf16 arithmetic runs on its f32 FMAs; the tiles are that product's); None: used as they come.
    widened_to: str | None = None

    def tile(self, level: str) -> LevelTile:
        return next(t for t in self.levels if t.level == level)


def _bytes(dtype: str) -> float:
    return dtype_bits(dtype) / 8


def _round_up(v: int, multiple: int) -> int:
    return -(-v // multiple) * multiple


def operand_dtypes(dtype: str, options: Options | Mapping[str, Any] | None) -> list[str]:
    """The operand dtypes the precision policy (``options.matmul_precision``) lets a ``dtype`` matmul
    use, preferred first: "exact" keeps the op's dtype; "tf32" lets f32 use tf32 units; "mixed" also
    lets f32 use f16/bf16 units (f32 accumulate)."""
    precision = as_options(options).matmul_precision
    allowed = [dtype]
    if dtype == "f32" and precision in ("tf32", "mixed"):
        allowed.append("tf32")
    if dtype == "f32" and precision == "mixed":
        allowed += ["bf16", "f16"]
    return allowed


def scratchpad_capacity(level: MemoryLevel, options: Options | Mapping[str, Any] | None) -> int:
    """Bytes one instance of a software-managed level may hold: its opt-in maximum when it has one (and
    ``optin_scratchpad`` is not false), else ``size_bytes``."""
    if level.max_size_bytes and as_options(options).optin_scratchpad:
        return level.max_size_bytes
    return level.size_bytes


def units_for(spec: ChipSpec, dtype: str, accumulator: str) -> list[MatrixUnit]:
    """The spec's matrix units for ``dtype`` operands into ``accumulator``, in its order, less any that widens
    its operands (`MatrixUnit.register_dtype`) with fewer multiply-adds a cycle than the f32 FMAs the operands
    could be widened to instead (`widened_dtype`): a ``vpmaddwd`` step of 16 i8 products at 1.6 a cycle (Zen
    3) beats 1.98 f32 FMAs of 8; one that shares its ports with its own add (1 a cycle) merely ties them."""
    vec = spec.vector
    out = []
    for u in spec.matrix_units_for(dtype, accumulator):
        if u.register_dtype is not None and vec is not None and vec.fma and u.per_cycle is not None:
            fma_macs = vec.fma_per_cycle * vec.lanes("f32")
            if u.per_cycle * u.m * u.n * u.k < fma_macs:
                continue
        out.append(u)
    return out


def compute_tile(spec: ChipSpec, op: Contraction,
                 options: Options | Mapping[str, Any] | None = None) -> tuple[ComputeTile, str]:
    """Step 1: the matrix unit, or a vector register tile, or scalar; with the reason."""
    opts = as_options(options)
    allowed = operand_dtypes(op.dtype, opts)
    if opts.matrix_units:
        units = [u for dt in allowed for u in units_for(spec, dt, op.accumulator)]
        if units:
            u = units[0]
            if u.registers == "vector" and spec.vector is not None and spec.caches():
                return _unit_register_tile(spec, op, u)
            if u.registers == "tile" and spec.vector is not None and spec.caches() and (u.tile_registers or 0) >= 8:
                return _unit_tile_registers(spec, u)
            return (ComputeTile("matrix-unit", u.name, u.m, u.n, u.k, u.operand_dtype, u.accumulator_dtype, u.scope),
                    (f"matrix unit {u.name} ({u.m}x{u.n}x{u.k} {u.operand_dtype}->{u.accumulator_dtype}) is the "
                    f"spec's first choice for {op.dtype}"))
    vec = spec.vector
    if vec is not None and op.accumulator in vec.dtypes and vec.fma:
        lanes = vec.lanes(op.accumulator)
        mr, nr_vecs, why = register_tile(vec.registers, lanes, vec.fma_per_cycle, vec.loads_per_cycle, op.m, op.n,
                                         latency=vec.fma_latency)
        scope = spec.compute[0].name
        return (ComputeTile("vector-fma", f"fma{vec.width_bits}", mr, nr_vecs * lanes, 1, op.dtype, op.accumulator,
                            scope, registers=mr * nr_vecs + nr_vecs + 1),
                (f"no matrix unit for {op.dtype}: {mr}x{nr_vecs * lanes} register tile of {vec.width_bits}-bit FMAs "
                f"({mr * nr_vecs} accumulators of {vec.registers} registers; {why})"))
    return (ComputeTile("scalar", "scalar", 1, 1, 1, op.dtype, op.accumulator, spec.compute[-1].name),
            f"no matrix or vector unit for {op.dtype}: scalar code")


#: Narrow operands a vector unit without a unit for them computes on after widening them exactly to f32 (a
#: bf16 or f16 value is an f32 one with fewer mantissa bits; an i8 is an f32 integer).
WIDENABLE = {"bf16": "f32", "f16": "f32", "i8": "f32"}
#: The k block of an i8 product on widened operands: each of its f32 sums of i8 x i8 products (at most
#: 2^14 each) stays within 2^24, where every integer is exact in f32, and is added to C as an i32.
EXACT_I8_K = (1 << 24) // (1 << 14)


def widened_dtype(spec: ChipSpec, op: Contraction, options: Options | Mapping[str, Any] | None = None) -> str | None:
    """The dtype a product of narrow operands is computed in when the spec offers nothing better: no matrix
    unit the precision policy allows for ``op.dtype``, but f32 FMAs and caches to pack into (the
    register-tile kernels' hierarchy); for floats, no ``op.dtype`` arithmetic in the vector unit and an f32
    accumulator; for i8 (i32 accumulator), f32 sums of k blocks of at most `EXACT_I8_K`, each exact.
    Widening each operand element once as it is packed costs O(mk + kn) conversions beside the O(mnk) FMAs;
    converting inside the FMA loop, or computing element by element, costs far more."""
    wide = WIDENABLE.get(op.dtype)
    vec = spec.vector
    floats = op.dtype != "i8"
    if wide is None or vec is None or not vec.fma or wide not in vec.dtypes or not spec.caches() \
            or op.accumulator != (wide if floats else "i32") or (floats and op.dtype in vec.dtypes):
        return None
    opts = as_options(options)
    if opts.matrix_units and any(units_for(spec, dt, op.accumulator) for dt in operand_dtypes(op.dtype, opts)):
        return None
    return wide


def _unit_register_tile(spec: ChipSpec, op: Contraction, u: MatrixUnit) -> tuple[ComputeTile, str]:
    """The register tile of a dot-product unit kept in the vector registers (``u.registers == "vector"``):
    ``mr`` rows by ``nv`` vectors of ``u.n`` accumulators, each step one instruction per accumulator
    consuming ``u.k`` values of k (A: one broadcast group of ``u.k`` a row, B: one vector a column)."""
    vec = spec.vector
    assert vec is not None
    rate = max(1, round(u.per_cycle)) if u.per_cycle else vec.fma_per_cycle
    staged = u.broadcast_registers
    mr, nv, why = register_tile(vec.registers, u.n, rate, vec.loads_per_cycle, op.m, op.n, broadcasts=staged)
    return (ComputeTile("matrix-unit", u.name, mr, nv * u.n, u.k, u.operand_dtype, u.accumulator_dtype,
                        spec.compute[0].name, registers=mr * nv + nv + staged, instruction=(u.m, u.n, u.k),
                        reads=u.register_dtype or ""),
            (f"matrix unit {u.name} ({u.m}x{u.n}x{u.k} {u.operand_dtype}->{u.accumulator_dtype}, in the vector "
             f"registers) is the spec's first choice for {op.dtype}: {mr}x{nv * u.n} register tile of its "
             f"instructions ({mr * nv} accumulators"
             + (f" and {staged} for A's broadcasts" if staged > 1 else "")
             + f" of {vec.registers} registers; {why})"))


def _unit_tile_registers(spec: ChipSpec, u: MatrixUnit) -> tuple[ComputeTile, str]:
    """The register tile of a unit with its own tile registers (AMX, ``u.registers == "tile"``): 2 x 2
    accumulator tiles fed by 2 tiles of A and 2 of B — the 8 registers such a unit has at least — so each
    loaded tile serves two instructions."""
    return (ComputeTile("matrix-unit", u.name, 2 * u.m, 2 * u.n, u.k, u.operand_dtype, u.accumulator_dtype,
                        spec.compute[0].name, registers=8, instruction=(u.m, u.n, u.k)),
            (f"matrix unit {u.name} ({u.m}x{u.n}x{u.k} {u.operand_dtype}->{u.accumulator_dtype}, "
             f"{u.tile_registers} tile registers) is the spec's first choice: {2 * u.m}x{2 * u.n} register tile of "
             "2 x 2 accumulator tiles, 2 A and 2 B tiles a step"))


def register_tile(registers: int, lanes: int, fma_per_cycle: int, loads_per_cycle: int, m: int,
                  n: int, broadcasts: int = 1, latency: int = 1) -> tuple[int, int, str]:
    """The vector register tile (rows ``mr``, columns in vectors ``nv``) with the fewest issue cycles.

    One k step of an ``mr x nv`` tile issues ``mr * nv`` FMAs and ``mr + nv`` loads (one broadcast of A
    per row, one vector of B per column), so it takes ``max(mr*nv / fma_per_cycle, (mr+nv) /
    loads_per_cycle, latency)`` cycles (``latency``: `VectorUnit.fma_latency`, the cycles each
    accumulator waits for its previous FMA — a tile of few accumulators is latency-bound; not for a tile
    as tall as the product, which streams B); the whole ``m x n`` output needs
    ``ceil(m/mr) * ceil(n/(nv*lanes))`` tiles, so tiles that overhang the edges cost their full time (conservative: the cpu kernel runs the
    last tile row and column with fewer accumulators, `pbsdk.targets.cpu.matmul_kernel.tile_variants`). ``mr * nv`` accumulators, ``nv`` B
    vectors and ``broadcasts`` registers for A's broadcasts (`MatrixUnit.broadcast_registers`; one for an
    FMA, which reads its broadcast from memory) must fit the register file. Among tiles within 3 % of the fewest cycles, the
    narrowest wins (its B micro-panel, reused from the innermost cache across the A block, is smallest,
    so the reduction block can be longest), then the one issuing fewer loads per FMA — except where A's
    broadcasts are staged in registers (``broadcasts`` > 1): each is then an instruction of its own
    beside the unit's, so fewer loads per instruction come first. vpdpbusd on Zen 4, 1 thread, 5x64
    (0.45 loads an instruction) against 11x32 (0.59): implicit-GEMM convolutions of ResNet-18 at batch 8
    1.02-1.17x (the 7x7 stem 1.19x), GEMMs 0.98-1.02x."""
    options: list[tuple[float, float, int, int]] = []
    for nv in range(1, registers):
        for mr in range(1, registers):
            if mr * nv + nv + broadcasts > registers:
                break
            cycles = issue_cycles(fma_per_cycle, loads_per_cycle, lanes, m, n, mr, nv, latency)
            options.append((cycles, (mr + nv) / (mr * nv), nv, mr))
    fastest = min(o[0] for o in options)
    order = ((lambda o: (round(o[1], 9), o[2])) if broadcasts > 1 else (lambda o: (o[2], round(o[1], 9))))
    cycles, _, nv, mr = min((o for o in options if o[0] <= fastest * 1.03), key=order)
    ideal = m * n / (lanes * fma_per_cycle)
    return mr, nv, f"{ideal / cycles:.0%} of FMA issue at this shape"


def _traffic(op: Contraction, tm: int, tn: int, tk: int) -> int:
    """Bytes the next level out serves for the whole op when tiles of tm x tn x tk are held here."""
    a, c = _bytes(op.dtype), _bytes(op.accumulator)
    row_tiles, col_tiles, k_steps = -(-op.m // tm), -(-op.n // tn), -(-op.k // tk)
    per_batch = (op.m * op.k * a * col_tiles + op.k * op.n * a * row_tiles
                 + op.m * op.n * c * (2 * k_steps - 1))
    return int(op.batch * per_batch)


def _holds_accumulator_in_registers(spec: ChipSpec, level: MemoryLevel, tm: int, tn: int, acc: str) -> bool:
    """Whether the compute level owning ``level`` has registers enough for the C tile (GPU blocks do)."""
    if level.scope == "device":
        return False
    regs = spec.compute_level(level.scope).limits.get("registers_32bit", 0)
    return regs > 0 and tm * tn * _bytes(acc) <= regs * 4 // 2


def _level_budget(level: MemoryLevel, options: Options) -> tuple[int, bool]:
    if level.managed == "cache":
        return int(level.size_bytes * CACHE_BUDGET), False
    return scratchpad_capacity(level, options), options.double_buffer


def _footprint(op: Contraction, tm: int, tn: int, tk: int, double: bool, acc_here: bool) -> int:
    operands = (tm * tk + tk * tn) * _bytes(op.dtype) * (2 if double else 1)
    return int(operands + (tm * tn * _bytes(op.accumulator) if acc_here else 0))


def _grow(spec: ChipSpec, op: Contraction, level: MemoryLevel, inner: tuple[int, int, int], budget: int,
          double: bool, acc_in_regs_possible: bool) -> tuple[tuple[int, int, int], bool]:
    """Step 2 for one level: greedy doubling that most reduces outer-level traffic while it fits."""
    base = inner
    limit = (_round_up(op.m, base[0]), _round_up(op.n, base[1]), _round_up(op.k, base[2]))
    tile = list(inner)

    def acc_here(t: list[int]) -> bool:
        return level.managed == "cache" or not (
            acc_in_regs_possible and _holds_accumulator_in_registers(spec, level, t[0], t[1], op.accumulator))

    def fits(t: list[int]) -> bool:
        return _footprint(op, t[0], t[1], t[2], double, acc_here(t)) <= budget

    if not fits(tile):
        return tuple(tile), acc_here(tile)  # type: ignore[return-value]
    while True:
        best: tuple[float, int] | None = None
        current = _traffic(op, *tile)
        for dim in (2, 0, 1):  # k first on ties: long k amortises the accumulator (BLIS)
            if tile[dim] >= limit[dim]:
                continue
            cand = list(tile)
            cand[dim] = min(cand[dim] * 2, limit[dim])
            if not fits(cand):
                continue
            saved = current - _traffic(op, *cand)
            if saved > 0 and (best is None or saved > best[0]):
                best = (saved, dim)
        if best is None:
            return tuple(tile), acc_here(tile)  # type: ignore[return-value]
        tile[best[1]] = min(tile[best[1]] * 2, limit[best[1]])


def plan_contraction(spec: ChipSpec, op: Contraction,
                     options: Options | Mapping[str, Any] | None = None, *,
                     accumulator_in_registers: bool = True, widen: bool = True) -> ContractionPlan:
    """The full plan for ``op`` on ``spec`` (see the module docstring for the model). ``options``: the
    compilation's `Options` (or a mapping of core option keys, parsed). ``accumulator_in_registers``:
    whether the lowering can keep a level's C tile in its compute level's registers (False: every
    software-managed level holds its C tile, as a target whose unit steps read and write C in the
    scratchpad needs). ``widen``: whether narrow operands may be widened for the f32 FMAs
    (`widened_dtype`; a scratchpad lowering that computes the op's dtype itself passes False)."""
    opts = as_options(options)
    wide = widened_dtype(spec, op, opts) if accumulator_in_registers and widen else None
    if wide is not None:
        plan = plan_contraction(spec, dataclasses.replace(op, dtype=wide, acc_dtype=None), opts)
        why = (f"no matrix unit for {op.dtype} and no {op.dtype} arithmetic in the vector unit: A and B are "
               f"widened to {wide} as they are packed (both packed), and the {wide} FMAs compute"
               if op.dtype != "i8" else
               f"no matrix unit for i8: A and B are widened to {wide} as they are packed (both packed), and the "
               f"{wide} FMAs compute k blocks of at most {EXACT_I8_K} exactly (their sums stay within 2^24), "
               "each added to C as i32")
        blk = (dataclasses.replace(plan.blocking, pack_a=True, pack_b=True,
                                   kc=plan.blocking.kc if op.dtype != "i8" else min(plan.blocking.kc, EXACT_I8_K))
               if plan.blocking is not None else None)
        return dataclasses.replace(plan, op=op, blocking=blk, widened_to=wide, reasons=(why, *plan.reasons))
    unit, why_unit = compute_tile(spec, op, opts)
    reasons = [why_unit]
    inner = (unit.m, unit.n, unit.k)
    tiles: list[LevelTile] = []
    for level in reversed(spec.memory[1:]):  # innermost first
        budget, double = _level_budget(level, opts)
        (tm, tn, tk), acc_here = _grow(spec, op, level, inner, budget, double,
                                        unit.kind != "scalar" and accumulator_in_registers)
        fp = _footprint(op, tm, tn, tk, double, acc_here)
        if fp > budget:
            reasons.append(f"{level.name}: even the inner tile {tm}x{tn}x{tk} ({fp} B) exceeds the budget "
                           f"({budget} B); streaming through it")
        tiles.append(LevelTile(level.name, level.managed, tm, tn, tk, fp, budget, double, acc_here,
                               _traffic(op, tm, tn, tk)))
        reasons.append(f"{level.name} ({level.managed}, budget {budget} B{', double-buffered' if double else ''}): "
                       f"tile {tm}x{tn}x{tk} uses {fp} B")
        inner = (tm, tn, tk)

    # Step 3: parallel work for the outermost compute level.
    top = spec.compute[0]
    units = top.count
    per_unit = [i for i, t in enumerate(tiles) if spec.memory_level(t.level).scope == top.name]
    par_idx = per_unit[-1] if per_unit else (len(tiles) - 1 if tiles else None)
    ways = 1
    if par_idx is not None and units > 1:
        t = tiles[par_idx]
        floor = tiles[par_idx - 1] if par_idx > 0 else None
        fm, fn = (floor.m, floor.n) if floor else (unit.m, unit.n)
        tm, tn = t.m, t.n

        def count(a: int, b: int) -> int:
            return op.batch * -(-op.m // a) * -(-op.n // b)

        while count(tm, tn) < units and (tm > fm or tn > fn):
            if tm >= tn and tm > fm:
                tm = max(fm, _round_up(tm // 2, fm))
            elif tn > fn:
                tn = max(fn, _round_up(tn // 2, fn))
            else:
                tm = max(fm, _round_up(tm // 2, fm))
        if (tm, tn) != (t.m, t.n):
            reasons.append(f"{t.level}: tile shrunk from {t.m}x{t.n} to {tm}x{tn} so that {units} {top.name}s get work")
            tiles[par_idx] = dataclasses.replace(t, m=tm, n=tn, traffic_bytes=_traffic(op, tm, tn, t.k),
                                                 footprint_bytes=_footprint(op, tm, tn, t.k, t.double_buffered,
                                                                            t.holds_accumulator))
        ways = min(units, count(tm, tn))
    par_level = top.name if ways > 1 else None
    dims = tuple(d for d, extent in (("batch", op.batch), ("m", op.m), ("n", op.n)) if extent > 1) if ways > 1 else ()

    # Loop order: outermost level's loops first; inside each level n, k, m (B panel reused across m rows).
    order: list[str] = []
    for t in reversed(tiles):
        order += [f"n@{t.level}", f"k@{t.level}", f"m@{t.level}"]
    order += ["m@reg", "n@reg", "k@reg"] if unit.kind != "matrix-unit" else [f"{unit.name}"]

    split, why_split = parallel_split(spec, op, tiles)
    reasons.append(why_split)

    solo = _estimate(spec, op, unit, tiles, 1).seconds
    blk, why_blk = blocking(spec, op, unit, opts, solo)
    reasons += why_blk
    # The estimate is for the units the code runs on: the blocking's threads on a cache hierarchy, else the
    # parallel ways, at most the ``threads`` option.
    running = blk.threads if blk is not None else min(ways, opts.threads or ways)
    estimate = _estimate(spec, op, unit, tiles, running)
    if blk is not None:
        estimate = _with_packing(spec, op, blk, estimate)
    reasons.append(f"estimate {estimate.seconds * 1e3:.3f} ms on {running} {top.name}(s), bound by {estimate.bound}")
    return ContractionPlan(op, unit, tuple(tiles), tuple(order), par_level, dims, ways, estimate, tuple(reasons),
                           blk, split)


def parallel_split(spec: ChipSpec, op: Contraction, tiles: Sequence[LevelTile | tuple[str, int, int]]
                   ) -> tuple[tuple[tuple[str, int], ...], str]:
    """The split of the m and n tile loops over ``spec.compute[0]`` for level ``tiles`` (innermost
    first; a `LevelTile` or ``(level, m, n)``), with the reason: the loops of the outermost
    software-managed level whose scope is that compute level, whose extents are the tile of the
    software-managed level outside it (or the op's)."""
    top = spec.compute[0]
    sw = [(t.level, t.m, t.n) if isinstance(t, LevelTile) else t for t in tiles
          if spec.memory_level(t.level if isinstance(t, LevelTile) else t[0]).managed == "software"]
    per_unit = [i for i, (lv, _, _) in enumerate(sw) if spec.memory_level(lv).scope == top.name]
    if not per_unit:
        return (), (f"no parallel split: no software-managed level is per '{top.name}' (a shared level's one "
                    f"buffer cannot hold every {top.name}'s tile)")
    i = per_unit[-1]
    level, tm, tn = sw[i]
    em, en = (sw[i + 1][1], sw[i + 1][2]) if i + 1 < len(sw) else (op.m, op.n)
    split, why = split_parallel([(f"n@{level}", -(-en // tn)), (f"m@{level}", -(-em // tm))], top.count,
                                unit=top.name)
    return split, why + (f"; {level} buffers per {top.name}, in the parallel loop's body" if split else "")



def _with_packing(spec: ChipSpec, op: Contraction, blk: Blocking, roofline: Estimate) -> Estimate:
    """``roofline`` plus the time a thread spends packing its operands (`packing_seconds`), which the
    blocked loop nest does before the micro-kernels that read them, not beside them."""
    pack = packing_seconds(spec, op, blk)
    if not pack:
        return roofline
    return Estimate(roofline.seconds + pack, roofline.bound, (*roofline.terms, ("packing", pack)))


def holding_level(spec: ChipSpec, nbytes: float, cores: int) -> MemoryLevel:
    """The innermost memory level that holds ``nbytes`` (a core-scoped level: in the ``cores`` cores' copies)."""
    found = spec.memory[0]
    for lv in spec.memory[1:]:  # outermost to innermost
        if nbytes <= lv.size_bytes * (cores if lv.scope != "device" else 1):
            found = lv
    return found


def _per_thread_gbps(level: MemoryLevel, threads: int) -> float:
    return level.shared_bandwidth(threads) / threads if level.scope == "device" else level.bandwidth_gbps


def packing_seconds(spec: ChipSpec, op: Contraction, blk: Blocking) -> float:
    """Seconds one thread of ``blk`` spends packing per call: each element of B it packs (all of its columns
    of B, once, unless B is packed ahead of time) and of A (its rows, once per ``nc`` panel of its columns)
    read from the level that holds the whole operand and written to the level that keeps the packed copy
    (``nc_level`` for B, ``mc_level`` for A), at a thread's share of each level's bandwidth. Of the product
    the blocking is for (the transposed one for a transposed blocking; its B is then the given A, constant
    where that is prepackable)."""
    prod = op.transposed() if blk.transposed else op
    b_ahead = op.a_prepackable if blk.transposed else op.b_prepacked
    t, eb = blk.threads, _bytes(prod.dtype)
    batch = -(-prod.batch // t) if blk.split == "batch" else prod.batch
    m_part = -(-prod.m // t) if blk.split == "m" else prod.m
    n_part = -(-prod.n // t) if blk.split == "n" else prod.n
    seconds = 0.0
    packs = [(prod.k * prod.n * prod.batch * eb, batch * prod.k * n_part * eb, blk.nc_level, blk.pack_b and not b_ahead),
             (prod.m * prod.k * prod.batch * eb, batch * m_part * prod.k * -(-n_part // blk.nc) * eb, blk.mc_level,
              blk.pack_a)]
    for whole, moved, kept, packed in packs:
        if not packed or not moved:
            continue
        source = holding_level(spec, whole, t)
        target = next((lv for lv in spec.memory if lv.name == kept), source)
        seconds += moved / (_per_thread_gbps(source, t) * 1e9) + moved / (_per_thread_gbps(target, t) * 1e9)
    return seconds


#: Vector instructions of one step of a unit that widens its operands (`ComputeTile.reads`): the instruction,
#: which yields the products alone, and the add into the accumulator (``vpmaddwd``, ``vpaddd``).
WIDENED_STEP_INSTRUCTIONS = 2


def _broadcast_share(unit: ComputeTile) -> float:
    """How much longer a register tile of a widening unit's steps takes than its steps alone (1.0 for any
    other tile): each of its ``mr`` rows broadcasts A's group into a register once a group of k, an instruction
    on the vector pipes its ``mr x nv`` steps of `WIDENED_STEP_INSTRUCTIONS` issue on, while the unit's
    calibrated rate (`MatrixUnit.per_cycle`) counts the steps alone. llvm-mca's Zen 3 model of the 5x16
    ``vpmaddwd`` tile: 25 vector instructions a group for 10 steps; measured 1.41x the steps-alone estimate
    on 3136x64x576, 1.25x on 784x128x1152."""
    if not unit.reads or unit.instruction is None:
        return 1.0
    nv = max(1, unit.n // unit.instruction[1])
    return 1.0 + 1.0 / (WIDENED_STEP_INSTRUCTIONS * nv)


def _estimate(spec: ChipSpec, op: Contraction, unit: ComputeTile, tiles: list[LevelTile], ways: int) -> Estimate:
    peaks: dict[str, float] = {str(k): v for k, v in spec.peak_tflops.items()}
    peak = peaks.get(unit.operand_dtype if unit.kind == "matrix-unit" else op.dtype)
    if peak is None:
        peak = max(spec.peak_tflops.values(), default=1.0) / 16
    if unit.kind == "scalar" and spec.vector is not None:
        peak /= max(1, spec.vector.lanes(op.accumulator) if op.accumulator in spec.vector.dtypes else 1)
    units = spec.compute[0].count
    active = max(1, min(ways, units)) / units
    terms = [("compute", op.flops / (peak * 1e12 * active) * _broadcast_share(unit))]
    # Bytes served by each level: the tile held inside it determines the traffic it serves.
    levels = list(spec.memory)
    inner_traffic = {t.level: t.traffic_bytes for t in tiles}
    for i, level in enumerate(levels):
        inner_name = levels[i + 1].name if i + 1 < len(levels) else None
        if inner_name is None:
            # The innermost level feeds the compute tile; its accumulators stay in registers (or in the
            # unit) across the k range of the innermost memory tile.
            traffic = _traffic(op, unit.m, unit.n, tiles[0].k if tiles else unit.k)
        else:
            traffic = inner_traffic[inner_name]
        if level.scope != "device":
            bandwidth = level.bandwidth_gbps * max(1, min(spec.instances(level.name), ways))
        else:  # a chip-wide level serves the cores in use (each drawing at most its per-core share)
            bandwidth = level.shared_bandwidth(min(ways, units)) * spec.instances(level.name)
        terms.append((level.name, traffic / (bandwidth * 1e9)))
    bound, seconds = max(terms, key=lambda t: t[1])
    return Estimate(seconds, bound, tuple(terms))
