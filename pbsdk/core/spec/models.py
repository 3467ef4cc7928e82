"""The chip-spec data model: what the target-independent core knows about a chip.

A `ChipSpec` describes a chip as a hierarchy of compute levels (outermost first), a hierarchy of memory
levels (outermost first; ``memory[0]`` is main memory, where kernel arguments live), the matrix units the
chip can issue, its vector unit, its peak throughput and a bag of target-specific code-generation
parameters that the core never reads.

All models are frozen pydantic v2 models that reject unknown fields. Single-field constraints are
expressed with `Field`; cross-field consistency is checked by `ChipSpec`'s model validator, which raises
`SpecError` naming each offending field path (for example ``memory[2].scope``).
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from pbsdk.core.errors import SpecError

#: Element types a chip can support. Floating point: ``f64``, ``f32``, ``tf32`` (19-bit tensor float,
#: stored in 32 bits), ``f16``, ``bf16``, ``f8e4m3``, ``f8e5m2``; integers: ``i64`` .. ``i1``.
DType = Literal[
    "f64", "f32", "tf32", "f16", "bf16", "f8e4m3", "f8e5m2", "i64", "i32", "i16", "i8", "i4", "i1"
]

#: Storage width in bits of each `DType` (``tf32`` occupies 32 bits).
_DTYPE_BITS: dict[str, int] = {
    "f64": 64,
    "f32": 32,
    "tf32": 32,
    "f16": 16,
    "bf16": 16,
    "f8e4m3": 8,
    "f8e5m2": 8,
    "i64": 64,
    "i32": 32,
    "i16": 16,
    "i8": 8,
    "i4": 4,
    "i1": 1,
}
assert set(_DTYPE_BITS) == set(get_args(DType))

#: Sanity bounds: anything beyond these is a typo, not a chip.
MAX_BYTES = 2**50
MAX_COUNT = 2**20
MAX_TOTAL_UNITS = 2**40
MAX_LIMIT = 2**50
MAX_BANDWIDTH_GBPS = 1e7
MAX_TFLOPS = 1e7
MAX_CLOCK_GHZ = 100.0
MAX_TILE_DIM = 2**16

#: Reserved name: ``"host"`` always means the detected machine (`detect_host`); no preset file may use it
#: as its name or an alias.
RESERVED_NAMES = frozenset({"host"})

_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.+-]*(/[a-z0-9][a-z0-9_.+-]*)*$"
_LEVEL_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"

LevelName = Annotated[str, Field(pattern=_LEVEL_PATTERN, max_length=64)]
LimitValue = Annotated[int, Field(ge=0, le=MAX_LIMIT)]
Tflops = Annotated[float, Field(gt=0, le=MAX_TFLOPS)]


def dtype_bits(dt: str) -> int:
    """Storage width in bits of ``dt`` (a `DType` name). Raises `SpecError` for an unknown name."""
    try:
        return _DTYPE_BITS[dt]
    except (KeyError, TypeError):
        raise SpecError(f"unknown dtype {dt!r}; known: {', '.join(_DTYPE_BITS)}", field="dtype") from None


def _is_pow2(v: int) -> bool:
    return v > 0 and (v & (v - 1)) == 0


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    def __hash__(self) -> int:  # dict fields make the default field-tuple hash fail; hash the content
        return hash((type(self).__name__, self.model_dump_json()))


class ComputeLevel(_Model):
    """One level of the compute hierarchy (e.g. ``sm`` -> ``warp`` -> ``thread``, or ``core`` -> ``lane``)."""

    name: LevelName = Field(
        description="Level name, unique within the chip; memory and matrix-unit `scope`s refer to it."
    )
    count: int = Field(
        ge=1,
        le=MAX_COUNT,
        description="How many of this level one instance of the enclosing level holds; for the outermost "
        "level, how many the chip has (e.g. 132 SMs, then 64 resident warps per SM).",
    )
    limits: dict[str, LimitValue] = Field(
        default_factory=dict,
        description="Free-form per-instance resource limits, all integers >= 0, e.g. `max_threads`, "
        "`max_threads_per_block`, `registers_32bit`, `max_blocks`, `max_registers`.",
    )


class MemoryLevel(_Model):
    """One level of the memory hierarchy. ``size_bytes`` and ``bandwidth_gbps`` are per instance."""

    name: LevelName = Field(description="Level name, unique within the chip (e.g. `hbm`, `l2`, `smem`).")
    scope: LevelName = Field(
        description="Name of the compute level that owns one instance of this memory, or `device` for "
        "memory shared by the whole chip."
    )
    size_bytes: int = Field(
        gt=0,
        le=MAX_BYTES,
        description="Default capacity of one instance in bytes (for GPU shared memory: what a block gets "
        "without opting in).",
    )
    max_size_bytes: int | None = Field(
        default=None,
        gt=0,
        le=MAX_BYTES,
        description="Opt-in maximum capacity of one instance, if larger than the default (e.g. GPU shared "
        "memory: 227 KiB per block on H100 versus 48 KiB by default). Must be >= `size_bytes`.",
    )
    bandwidth_gbps: float = Field(
        gt=0,
        le=MAX_BANDWIDTH_GBPS,
        description="Peak bandwidth of one instance in GB/s (10^9 bytes per second).",
    )
    core_bandwidth_gbps: float | None = Field(
        default=None,
        gt=0,
        le=MAX_BANDWIDTH_GBPS,
        description="For a level shared by several cores: the most one core draws from it in GB/s (one core "
        "reading main memory alone rarely gets all of `bandwidth_gbps`); `null`: unknown, any core may draw "
        "all of it. Host detection measures it.",
    )
    alignment_bytes: int = Field(
        default=16,
        ge=1,
        le=2**30,
        description="Alignment in bytes that buffers in this level should have (a power of two).",
    )
    line_bytes: int | None = Field(
        default=None,
        ge=1,
        le=2**20,
        description="Cache line / transaction size in bytes (a power of two), if meaningful.",
    )
    managed: Literal["software", "cache"] = Field(
        description="`software`: explicitly addressed (main memory, or a scratchpad such as GPU shared "
        "memory); `cache`: hardware-managed, transparent to the program."
    )
    banks: int | None = Field(
        default=None, ge=1, le=4096, description="Number of banks, if the level is banked (e.g. 32)."
    )
    ways: int | None = Field(
        default=None,
        ge=1,
        le=1024,
        description="Associativity of a cache (lines per set, e.g. 8), if known: with `size_bytes` and "
        "`line_bytes` it says which addresses share a set. Planners use it to avoid access patterns whose "
        "lines evict each other (rows a power-of-two stride apart); unknown: no set conflicts are modelled.",
    )

    @field_validator("alignment_bytes", "line_bytes")
    @classmethod
    def _pow2(cls, v: int | None) -> int | None:
        if v is not None and not _is_pow2(v):
            raise ValueError(f"must be a power of two, got {v}")
        return v

    @field_validator("max_size_bytes")
    @classmethod
    def _max_size(cls, v: int | None, info: ValidationInfo) -> int | None:
        size = info.data.get("size_bytes")
        if v is not None and size is not None and v < size:
            raise ValueError(f"{v} is smaller than size_bytes ({size})")
        return v

    def shared_bandwidth(self, cores: int) -> float:
        """GB/s one instance serves to ``cores`` cores reading it together: its bandwidth, or less where
        one core draws at most `core_bandwidth_gbps`."""
        if self.core_bandwidth_gbps is None:
            return self.bandwidth_gbps
        return min(self.bandwidth_gbps, max(1, cores) * self.core_bandwidth_gbps)


class MatrixUnit(_Model):
    """A matrix-multiply-accumulate instruction: D[m,n] += A[m,k] x B[k,n], issued by one `scope` instance."""

    name: str = Field(
        min_length=1, max_length=128, description="Instruction family and shape, e.g. `mma.sync.m16n8k16`."
    )
    scope: LevelName = Field(
        description="Compute level whose single instance issues the instruction (e.g. `warp`, `warpgroup`)."
    )
    m: int = Field(ge=1, le=MAX_TILE_DIM, description="Rows of A and of the accumulator.")
    n: int = Field(ge=1, le=MAX_TILE_DIM, description="Columns of B and of the accumulator.")
    k: int = Field(ge=1, le=MAX_TILE_DIM, description="Reduction depth (columns of A, rows of B).")
    operand_dtype: DType = Field(description="Element type of A and B.")
    accumulator_dtype: DType = Field(description="Element type of the accumulator C/D.")
    instruction: str | None = Field(
        default=None,
        max_length=256,
        description="Free-form instruction text for the target (e.g. the full PTX opcode).",
    )
    registers: Literal["vector", "tile"] | None = Field(
        default=None,
        description="Where the unit keeps its operands and accumulator between instructions on a chip whose "
        "memory levels are caches: `vector` — the vector unit's registers (a dot-product instruction such as "
        "AVX512-BF16's `vdpbf16ps` or VNNI's `vpdpbusd`: m is 1, A one broadcast group of k values, n the "
        "accumulator lanes of one vector), so the planner builds a register tile of many instructions; "
        "`tile` — a file of `tile_registers` tile registers of its own (AMX). Unset: the operands are tiles "
        "in memory (a scratchpad), one instruction a tile.",
    )
    tile_registers: int | None = Field(
        default=None, ge=1, le=256,
        description="With `registers: tile`: how many tile registers one scope instance has (AMX: 8).",
    )
    broadcast_registers: int = Field(
        default=1, ge=1, le=64,
        description="With `registers: vector`: vector registers a register tile of the instruction keeps for A's "
        "broadcast groups, beside its accumulators and B's vectors. 1 where the instruction reads its "
        "broadcast operand from memory (`vdpbf16ps`'s `{1to16}`, like an FMA's); more where A must be "
        "broadcast into a register first (VNNI's `vpdpbusd` takes its unsigned operand only from a register, "
        "and a signed A is offset on the way): the code generator keeps several such broadcasts in flight, "
        "and a tile that leaves it too few spills accumulators inside the k loop.",
    )
    register_dtype: DType | None = Field(
        default=None,
        description="With `registers: vector`: the element type the instruction reads A and B in, where it is "
        "wider than `operand_dtype` and the operands are widened into it exactly as they are packed (AVX2's "
        "`vpmaddwd`: i8 values sign-extended to i16 pairs, their products summed pairwise into i32 lanes). "
        "Unset: `operand_dtype` itself.",
    )
    per_cycle: float | None = Field(
        default=None, gt=0, le=64,
        description="Instructions one scope instance completes per cycle (throughput, e.g. 1 for a "
        "dot-product instruction on one pipe, 0.0625 for an AMX tile product every 16 cycles), if known: "
        "the planner's estimate of the unit's peak.",
    )

    @property
    def flops(self) -> int:
        """Floating-point (or integer) operations of one instruction: 2*m*n*k."""
        return 2 * self.m * self.n * self.k

    @property
    def reads(self) -> str:
        """The element type the instruction reads its operands in (`register_dtype`, else `operand_dtype`)."""
        return self.register_dtype or self.operand_dtype


class VectorUnit(_Model):
    """The SIMD unit of one core."""

    width_bits: int = Field(
        ge=32, le=2**16, description="Vector register width in bits (a power of two >= 32)."
    )
    dtypes: list[DType] = Field(min_length=1, description="Element types the vector unit computes on.")
    registers: int = Field(
        ge=1, le=4096, description="Number of architectural vector registers (e.g. 32 for AVX-512)."
    )
    fma: bool = Field(description="Whether fused multiply-add is available.")
    fma_per_cycle: int = Field(
        default=1, ge=1, le=64,
        description="Vector FMA (or multiply-add) instructions one core can issue per cycle (e.g. 2 on Xeons "
                    "with two 512-bit FMA ports). The register-tile model balances these against loads.",
    )
    loads_per_cycle: int = Field(
        default=1, ge=1, le=64,
        description="Vector or broadcast loads from the innermost cache one core can issue per cycle.",
    )
    fma_latency: int = Field(
        default=1, ge=1, le=64,
        description="Cycles from a vector FMA issuing to its result feeding the next FMA on the same accumulator "
                    "(4 on x86 cores since Haswell and Zen). A register tile's k step cannot take fewer cycles: "
                    "a tile of fewer than fma_latency x fma_per_cycle accumulators leaves the FMA pipes idle. "
                    "1: no dependency limit modelled.",
    )
    stores_per_cycle: int = Field(
        default=1, ge=1, le=64,
        description="Vector stores to the innermost cache one core can issue per cycle (the modelled time of a "
                    "cache-only chip issues counted stores at this rate).",
    )

    @field_validator("width_bits")
    @classmethod
    def _pow2(cls, v: int) -> int:
        if not _is_pow2(v):
            raise ValueError(f"must be a power of two, got {v}")
        return v

    @field_validator("dtypes")
    @classmethod
    def _unique(cls, v: list[str]) -> list[str]:
        dups = sorted({d for d in v if v.count(d) > 1})
        if dups:
            raise ValueError(f"duplicate dtypes: {', '.join(dups)}")
        return v

    def lanes(self, dtype: str) -> int:
        """Elements of ``dtype`` in one vector register (``width_bits // dtype_bits(dtype)``).

        This is arithmetic only; whether the unit computes on ``dtype`` is ``dtype in self.dtypes``."""
        return self.width_bits // dtype_bits(dtype)


class ChipSpec(_Model):
    """A complete chip description. Load one with `load_spec`; presets live in `chip_specs/`."""

    name: str = Field(
        pattern=_NAME_PATTERN,
        max_length=128,
        description="Canonical name, `vendor/model` in lower case (e.g. `nvidia/h100`).",
    )
    aliases: list[str] = Field(
        default_factory=list,
        description="Other names the preset answers to (e.g. `h100`, `sm_90`); lower case, unique.",
    )
    vendor: str = Field(min_length=1, max_length=64, description="Vendor name (e.g. `nvidia`, `intel`).")
    kind: Literal["cpu", "gpu", "accelerator"] = Field(description="Broad class of the chip.")
    description: str = Field(default="", max_length=4096, description="One or two human-readable sentences.")
    dtypes: list[DType] = Field(
        min_length=1, description="Element types the chip can compute on (natively or by cheap conversion)."
    )
    compute: list[ComputeLevel] = Field(
        min_length=1, max_length=16, description="Compute hierarchy, outermost level first."
    )
    memory: list[MemoryLevel] = Field(
        min_length=1,
        max_length=16,
        description="Memory hierarchy, outermost first. `memory[0]` is main memory (scope `device`, "
        "software-managed); an inner level's scope is never outer than the previous level's "
        "and its per-instance `size_bytes` is never larger.",
    )
    matrix_units: list[MatrixUnit] = Field(
        default_factory=list,
        max_length=256,
        description="Matrix-multiply instructions in order of preference, one entry per (shape, operand "
        "dtype, accumulator dtype); may be empty.",
    )
    vector: VectorUnit | None = Field(
        default=None, description="The per-core SIMD unit (CPUs, accelerators); `null` for GPUs."
    )
    peak_tflops: dict[DType, Tflops] = Field(
        default_factory=dict,
        description="Dense peak throughput of the whole chip in TFLOP/s (TOP/s for integers), per dtype.",
    )
    clock_ghz: float | None = Field(
        default=None,
        gt=0,
        le=MAX_CLOCK_GHZ,
        description="Clock frequency in GHz used for the peaks (boost clock).",
    )
    codegen: dict[str, str] = Field(
        default_factory=dict,
        description="Target-specific code-generation parameters, never read by the target-independent "
        "core, e.g. `{arch: sm_90, ptx_features: +ptx80}` for nvgpu or `{triple, cpu, "
        "features}` for cpu.",
    )
    provenance: dict[str, str] = Field(
        default_factory=dict,
        description="Where figures came from, by dotted field path (e.g. `clock_ghz: measured ...`, "
        "`memory.l2.size_bytes: sysfs`); written by host detection, which measures what CPUID and sysfs "
        "do not say. Informational: nothing reads it to decide.",
    )

    # ------------------------------------------------------------------ validation

    @field_validator("aliases")
    @classmethod
    def _aliases_shape(cls, v: list[str]) -> list[str]:
        for a in v:
            if not isinstance(a, str) or not re.match(_NAME_PATTERN, a) or len(a) > 128:
                raise ValueError(f"alias {a!r} must match {_NAME_PATTERN}")
        return v

    @field_validator("dtypes")
    @classmethod
    def _dtypes_unique(cls, v: list[str]) -> list[str]:
        dups = sorted({d for d in v if v.count(d) > 1})
        if dups:
            raise ValueError(f"duplicate dtypes: {', '.join(dups)}")
        return v

    @model_validator(mode="after")
    def _consistent(self) -> ChipSpec:
        problems = _cross_field_problems(self)
        if problems:
            err = SpecError("\n".join(f"{path}: {msg}" for path, msg in problems), field=problems[0][0])
            err.problems = problems  # type: ignore[attr-defined]
            raise err
        return self

    # ------------------------------------------------------------------ queries

    def compute_level(self, name: str) -> ComputeLevel:
        """The compute level called ``name``; `SpecError` if there is none."""
        for lvl in self.compute:
            if lvl.name == name:
                return lvl
        raise SpecError(
            f"{self.name}: no compute level {name!r}; levels: {', '.join(c.name for c in self.compute)}",
            source=self.name,
            field="compute",
        )

    def memory_level(self, name: str) -> MemoryLevel:
        """The memory level called ``name``; `SpecError` if there is none."""
        for lvl in self.memory:
            if lvl.name == name:
                return lvl
        raise SpecError(
            f"{self.name}: no memory level {name!r}; levels: {', '.join(m.name for m in self.memory)}",
            source=self.name,
            field="memory",
        )

    @property
    def main_memory(self) -> MemoryLevel:
        """``memory[0]``: where kernel arguments live."""
        return self.memory[0]

    def scratchpads(self) -> list[MemoryLevel]:
        """Software-managed levels other than main memory, outermost first (e.g. GPU shared memory)."""
        return [m for m in self.memory[1:] if m.managed == "software"]

    def caches(self) -> list[MemoryLevel]:
        """Hardware-managed cache levels, outermost first."""
        return [m for m in self.memory if m.managed == "cache"]

    def scope_depth(self, scope: str) -> int:
        """-1 for ``device``, else the index of the compute level (0 = outermost)."""
        if scope == "device":
            return -1
        for i, lvl in enumerate(self.compute):
            if lvl.name == scope:
                return i
        raise SpecError(f"{self.name}: unknown scope {scope!r}", source=self.name, field="scope")

    def total_units(self, level_name: str) -> int:
        """Instances of ``level_name`` on the whole chip: the product of the counts down to it.
        ``total_units("device")`` is 1."""
        depth = self.scope_depth(level_name)
        return math.prod(c.count for c in self.compute[: depth + 1])

    def instances(self, memory_name: str) -> int:
        """How many instances of the memory level exist on the chip (1 for device-scoped levels)."""
        return self.total_units(self.memory_level(memory_name).scope)

    def matrix_units_for(self, dtype: str, accumulator: str | None = None) -> list[MatrixUnit]:
        """Matrix units whose operand dtype is ``dtype`` (and accumulator, if given), in preference order."""
        return [
            u
            for u in self.matrix_units
            if u.operand_dtype == dtype and (accumulator is None or u.accumulator_dtype == accumulator)
        ]

    def supports(self, dtype: str) -> bool:
        """Whether ``dtype`` is in `dtypes`."""
        return dtype in self.dtypes


def _cross_field_problems(spec: ChipSpec) -> list[tuple[str, str]]:
    """Every cross-field inconsistency of ``spec`` as (field path, problem)."""
    out: list[tuple[str, str]] = []
    dtypes = set(spec.dtypes)

    seen_alias: set[str] = set()
    for i, a in enumerate(spec.aliases):
        if a == spec.name:
            out.append((f"aliases[{i}]", f"alias {a!r} is the canonical name itself"))
        elif a in seen_alias:
            out.append((f"aliases[{i}]", f"duplicate alias {a!r}"))
        seen_alias.add(a)

    depth: dict[str, int] = {"device": -1}
    for i, c in enumerate(spec.compute):
        if c.name == "device":
            out.append((f"compute[{i}].name", "'device' is reserved for chip-wide memory scope"))
        elif c.name in depth:
            out.append((f"compute[{i}].name", f"duplicate compute level {c.name!r}"))
        else:
            depth[c.name] = i
    total = 1
    for i, c in enumerate(spec.compute):
        total *= c.count
        if total > MAX_TOTAL_UNITS:
            out.append(
                (
                    f"compute[{i}].count",
                    f"{total} {c.name} instances in total is implausible (more than 2**40)",
                )
            )
            break

    names: set[str] = set()
    prev: MemoryLevel | None = None
    prev_i = -1
    for i, m in enumerate(spec.memory):
        if m.name in names:
            out.append((f"memory[{i}].name", f"duplicate memory level {m.name!r}"))
        names.add(m.name)
        if m.scope not in depth:
            out.append(
                (
                    f"memory[{i}].scope",
                    (f"unknown scope {m.scope!r}; expected 'device' or one of: "
                    f"{', '.join(c.name for c in spec.compute)}"),
                )
            )
            continue
        if i == 0:
            if m.scope != "device":
                out.append(
                    ("memory[0].scope", f"main memory (memory[0]) must have scope 'device', not {m.scope!r}")
                )
            if m.managed != "software":
                out.append(("memory[0].managed", "main memory (memory[0]) must be 'software'-managed"))
        if prev is not None:
            if depth[m.scope] < depth[prev.scope]:
                out.append(
                    (
                        f"memory[{i}].scope",
                        (f"{m.name!r} (scope {m.scope!r}) is listed after {prev.name!r} (scope "
                        f"{prev.scope!r}) but its scope is outer; list memory outermost first"),
                    )
                )
            if m.size_bytes > prev.size_bytes:
                out.append(
                    (
                        f"memory[{i}].size_bytes",
                        (f"{m.name!r} ({m.size_bytes} bytes per instance) is larger than the outer level "
                        f"memory[{prev_i}] {prev.name!r} ({prev.size_bytes} bytes per instance)"),
                    )
                )
        prev, prev_i = m, i

    seen_mu: set[tuple] = set()
    for i, u in enumerate(spec.matrix_units):
        if u.scope not in depth or u.scope == "device":
            out.append(
                (
                    f"matrix_units[{i}].scope",
                    (f"unknown compute level {u.scope!r}; expected one of: "
                    f"{', '.join(c.name for c in spec.compute)}"),
                )
            )
        for fld in ("operand_dtype", "accumulator_dtype"):
            dt = getattr(u, fld)
            if dt not in dtypes:
                out.append((f"matrix_units[{i}].{fld}", f"{dt!r} is not in the chip's dtypes"))
        out += _register_unit_problems(spec, i, u)
        key = (u.name, u.m, u.n, u.k, u.operand_dtype, u.accumulator_dtype)
        if key in seen_mu:
            out.append(
                (
                    f"matrix_units[{i}]",
                    f"duplicate matrix unit {u.name} {u.operand_dtype}->{u.accumulator_dtype}",
                )
            )
        seen_mu.add(key)

    if spec.vector is not None:
        for i, dt in enumerate(spec.vector.dtypes):
            if dt not in dtypes:
                out.append((f"vector.dtypes[{i}]", f"{dt!r} is not in the chip's dtypes"))
    for dt in spec.peak_tflops:
        if dt not in dtypes:
            out.append((f"peak_tflops.{dt}", f"{dt!r} is not in the chip's dtypes"))
    return out


def _register_unit_problems(spec: ChipSpec, i: int, u: MatrixUnit) -> list[tuple[str, str]]:
    """What is inconsistent about matrix unit ``i`` (``u``) keeping its operands in registers."""
    out: list[tuple[str, str]] = []
    where = f"matrix_units[{i}]"
    if u.registers == "tile" and u.tile_registers is None:
        out.append((f"{where}.tile_registers", "a unit with `registers: tile` needs its count of tile registers"))
    if u.registers != "tile" and u.tile_registers is not None:
        out.append((f"{where}.tile_registers", "only a unit with `registers: tile` has tile registers"))
    if u.registers != "vector" and u.broadcast_registers != 1:
        out.append((f"{where}.broadcast_registers", "only a unit with `registers: vector` stages broadcasts in them"))
    if u.register_dtype is not None:
        if u.registers != "vector":
            out.append((f"{where}.register_dtype", "only a unit with `registers: vector` widens its operands into them"))
        elif dtype_bits(u.register_dtype) < dtype_bits(u.operand_dtype):
            out.append((f"{where}.register_dtype", (f"{u.register_dtype} is narrower than the operands' "
                                                   f"{u.operand_dtype}: operands are widened, never narrowed")))
        elif u.k * dtype_bits(u.register_dtype) != 32:
            out.append((f"{where}.k", (f"{u.k} values of {u.register_dtype} are not one 32-bit group, what an "
                                       "accumulator lane of a unit in the vector registers sums")))
    if u.registers == "vector":
        if spec.vector is None:
            out.append((f"{where}.registers", "`vector` needs the chip's vector unit (`vector`)"))
        elif u.m != 1:
            out.append((f"{where}.m", f"a unit in the vector registers broadcasts one row of A (m = 1), not {u.m}"))
        elif u.n * dtype_bits(u.accumulator_dtype) != spec.vector.width_bits:
            out.append((f"{where}.n", (f"{u.n} {u.accumulator_dtype} accumulators are not one "
                                       f"{spec.vector.width_bits}-bit vector")))
        elif u.broadcast_registers + 2 > spec.vector.registers:
            out.append((f"{where}.broadcast_registers",
                        (f"{u.broadcast_registers} leave no room for an accumulator and a B vector among "
                         f"the {spec.vector.registers} vector registers")))
    return out
