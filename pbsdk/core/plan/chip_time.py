"""The time a run would take on the chip a spec describes, from what the emulation counted.

The template target (and every target scaffolded from it) counts, per run, the matrix-unit instructions
issued (``matrix_unit:<unit>``), the elements its vector steps computed at each level
(``vector:<level>``), the bytes each copy moved between two levels (``bytes:<from>-><to>``) and, where the
vector unit is emulated instruction by instruction (cache-only chips, `pbsdk.targets.template.register_tile`),
the vector instructions it issued per kind (``vector_op:<kind>``: ``fma``, ``load``, ``broadcast``,
``store``, ``reduction``, an arithmetic op's name such as ``addf`` or ``exp``). `model_time` turns those
counters into seconds on the chip, from the spec alone:

- **matrix units**: instructions / (instructions per second of one unit x the units the run used). One
  unit's rate is the spec's ``peak_tflops`` for its operand dtype, divided by the instruction's
  ``2*m*n*k`` and by the number of units on the chip (one per instance of its ``scope``).
- **vector instructions** (where ``vector_op:`` counters exist): each kind issues on its pipe of one core,
  instructions / (issue rate x clock x cores used): loads and broadcasts at ``loads_per_cycle``, stores at
  ``stores_per_cycle``, FMAs and every other arithmetic kind at ``fma_per_cycle`` (terms
  ``vector_op:load``, ``vector_op:store``, ``vector_op:arith``). The pipes issue in the same cycles, so
  the busiest one sets the vector time. The innermost level serves the loads and stores at the vector
  width (``width_bits / 8`` bytes each; a broadcast reads one element and is left out) at its
  ``bandwidth_gbps`` (term ``cache:<level>:vector``), under the same instructions: the vector time is the
  largest of these terms. The ``vector:<level>`` counters are then not read (they count the same work).
- **vector elements** (a target that counts no instructions): elements / (lanes x ``fma_per_cycle`` x clock
  x cores used), lanes for 32-bit elements (``width_bits / 32``). Without a vector unit, one element per
  cycle per core.
- **copies** on a chip with software-managed levels (DMA): each level's port moves the bytes of every
  transfer that starts or ends there at its ``bandwidth_gbps`` (per instance: a core-scoped level has one
  port per core in use); the copies run on ``dma_channels`` channels per core (the outermost compute
  level's ``limits``, default 1). With two or more, the levels' ports work at once and the slowest sets
  the pace; with one, transfers follow each other and their times add up.
- **copies** on a cache-only chip (`pbsdk.core.plan.packing`: no DMA, the packing copies are the core's
  loads and stores streaming through the caches): every level a copy starts or ends at serves its bytes
  at its bandwidth, all levels at once (terms ``cache:<level>``); the slowest sets the pace.
- **overlap**: when the plan double-buffers its tiles, copies run under compute and the run takes the
  larger of the two; otherwise (and by default) copy and compute alternate and their times add up.
  Matrix-unit and vector work are added: in the kernels pbsdk generates, one waits for the other.

The clock is ``clock_ghz``; a spec without it gets the clock its f32 peak implies on the vector unit
(``peak / (2 x lanes x fma_per_cycle x cores)``), else 1 GHz.

What it leaves out, by design (the counters do not see it): scalar code outside staged ops, reads and
writes that ops make in main memory without a copy, cache misses inside a packed tile, instruction
latencies and dependences (a pipe is assumed to issue every cycle), synchronisation, bank conflicts. The
terms say where the time goes; `ModelledTime.bound` names the largest.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from pbsdk.core.plan.packing import is_cache_only
from pbsdk.core.spec import ChipSpec, MatrixUnit

#: Counter-name prefixes the model reads (the template target's `Counter` names).
MATRIX_UNIT, VECTOR, BYTES, VECTOR_OP = "matrix_unit:", "vector:", "bytes:", "vector_op:"
#: Instruction kinds that issue on the load pipe (``loads_per_cycle``) and the store pipe
#: (``stores_per_cycle``); every other ``vector_op:`` kind is arithmetic (``fma_per_cycle``).
LOAD_KINDS, STORE_KINDS = frozenset({"load", "broadcast"}), frozenset({"store"})


@dataclasses.dataclass(frozen=True)
class ModelledTime:
    """A run's time on the chip: ``seconds`` in all, ``bound`` the largest term, ``terms`` (name,
    seconds): ``matrix_unit:<unit>``, ``vector:<level>`` (elements) or the vector unit's per-instruction
    terms (``vector_op:arith``/``load``/``store``, ``cache:<level>:vector``: the largest is the one added
    up), ``dma:<level>`` per port or ``dma:<from>-><to>`` per transfer with one channel, ``cache:<level>``
    for the copies of a cache-only chip. ``compute_seconds``/``dma_seconds`` are the two sides (on a
    cache-only chip the copy side is its packing copies), ``matrix_unit_utilisation`` the share of
    ``seconds`` the used matrix units are busy."""

    seconds: float
    bound: str
    terms: tuple[tuple[str, float], ...]
    compute_seconds: float
    dma_seconds: float
    overlapped: bool
    cores: int
    clock_ghz: float
    matrix_unit_utilisation: float

    def as_dict(self) -> dict[str, object]:
        return {"seconds": self.seconds, "bound": self.bound, "terms": dict(self.terms),
                "compute_seconds": self.compute_seconds, "dma_seconds": self.dma_seconds,
                "overlapped": self.overlapped, "cores": self.cores, "clock_ghz": self.clock_ghz,
                "matrix_unit_utilisation": self.matrix_unit_utilisation}


def clock_hz(spec: ChipSpec) -> float:
    """The spec's clock, or the one its f32 peak implies on the vector unit (1 GHz without either)."""
    if spec.clock_ghz:
        return spec.clock_ghz * 1e9
    peak = {str(k): v for k, v in spec.peak_tflops.items()}.get("f32")
    if peak and spec.vector is not None:
        per_cycle = 2 * spec.vector.lanes("f32") * spec.vector.fma_per_cycle * spec.compute[0].count
        return peak * 1e12 / per_cycle
    return 1e9


def unit_rate(spec: ChipSpec, unit: MatrixUnit) -> float:
    """Instructions per second of one instance of ``unit`` (spec peak for its operand dtype, shared by
    every instance of its scope)."""
    peaks = {str(k): v for k, v in spec.peak_tflops.items()}
    peak = peaks.get(unit.operand_dtype) or max(peaks.values(), default=1.0)
    return peak * 1e12 / unit.flops / spec.total_units(unit.scope)


def _units_used(spec: ChipSpec, scope: str, cores: int) -> int:
    """Instances of ``scope`` inside ``cores`` units of the outermost compute level."""
    per_core = spec.total_units(scope) // spec.compute[0].count if scope != "device" else 0
    if scope == "device" or per_core == 0:
        return 1
    return max(1, min(spec.total_units(scope), cores * per_core))


def model_time(spec: ChipSpec, counters: Mapping[str, int], *, cores: int = 1, double_buffered: bool = False,
               unit_dtypes: Mapping[str, str] | None = None) -> ModelledTime:
    """The run's time on ``spec`` from its ``counters``, spread over ``cores`` units of the outermost
    compute level (what the kernel's ``scf.forall`` used). ``unit_dtypes`` picks, for a unit name the
    spec lists for several dtypes, the one the run used (default: the first listed)."""
    cores = max(1, min(int(cores), spec.compute[0].count))
    clock = clock_hz(spec)
    dtypes = dict(unit_dtypes or {})
    compute: list[tuple[str, float]] = []
    unit_busy = 0.0
    transfers: dict[tuple[str, str], int] = {}
    per_instruction = any(name.startswith(VECTOR_OP) and value > 0 for name, value in counters.items())
    for name, value in sorted(counters.items()):
        if value <= 0:
            continue
        if name.startswith(MATRIX_UNIT):
            unit_name = name[len(MATRIX_UNIT):]
            units = [u for u in spec.matrix_units if u.name == unit_name]
            if not units:
                raise ValueError(f"counter {name!r}: {spec.name} has no matrix unit {unit_name!r}")
            unit = next((u for u in units if u.operand_dtype == dtypes.get(unit_name)), units[0])
            seconds = value / (unit_rate(spec, unit) * _units_used(spec, unit.scope, cores))
            compute.append((name, seconds))
            unit_busy += seconds
        elif name.startswith(VECTOR) and not per_instruction:
            if spec.vector is not None:
                per_cycle = spec.vector.lanes("f32") * spec.vector.fma_per_cycle
            else:
                per_cycle = 1
            compute.append((name, value / (per_cycle * clock * cores)))
        elif name.startswith(BYTES):
            src, _, dst = name[len(BYTES):].partition("->")
            transfers[(src, dst)] = transfers.get((src, dst), 0) + value
    vector_terms = vector_instruction_terms(spec, counters, cores=cores, clock=clock)
    if vector_terms:  # the pipes and the innermost level's port work in the same cycles
        compute.append(max(vector_terms, key=lambda t: t[1]))
    channels = int(spec.compute[0].limits.get("dma_channels", 1) or 1)
    dma: list[tuple[str, float]] = []
    if is_cache_only(spec):  # the core's own copies through the caches, every level at once
        served = bytes_per_level(counters)
        dma = [(f"cache:{lv}", n / _bandwidth(spec, lv, cores)) for lv, n in sorted(served.items())]
        dma_seconds = max((s for _, s in dma), default=0.0)
    elif channels >= 2:  # every level's port at once: each moves what starts or ends there
        served = bytes_per_level(counters)
        dma = [(f"dma:{lv}", n / _bandwidth(spec, lv, cores)) for lv, n in sorted(served.items())]
        dma_seconds = max((s for _, s in dma), default=0.0)
    else:  # one channel: one transfer at a time, each at its slower port
        dma = [(f"dma:{src}->{dst}", n / min(_bandwidth(spec, src, cores), _bandwidth(spec, dst, cores)))
               for (src, dst), n in sorted(transfers.items())]
        dma_seconds = sum(s for _, s in dma)
    compute_seconds = sum(s for _, s in compute)
    total = max(compute_seconds, dma_seconds) if double_buffered else compute_seconds + dma_seconds
    terms = tuple(compute + [t for t in vector_terms if t not in compute] + dma)
    bound = max(terms, key=lambda t: t[1])[0] if terms else "nothing"
    return ModelledTime(seconds=total, bound=bound, terms=terms, compute_seconds=compute_seconds,
                        dma_seconds=dma_seconds, overlapped=double_buffered, cores=cores, clock_ghz=clock / 1e9,
                        matrix_unit_utilisation=unit_busy / total if total > 0 else 0.0)


def vector_instruction_terms(spec: ChipSpec, counters: Mapping[str, int], *, cores: int,
                             clock: float) -> list[tuple[str, float]]:
    """The vector unit's time from the ``vector_op:<kind>`` counters (empty without any, or without a
    vector unit): one term per pipe (``vector_op:arith`` at ``fma_per_cycle``, ``vector_op:load`` at
    ``loads_per_cycle`` with broadcasts, ``vector_op:store`` at ``stores_per_cycle``), instructions /
    (rate x ``clock`` x ``cores``), and ``cache:<innermost level>:vector``: the loads' and stores' bytes at
    the vector width through that level at its bandwidth. The vector time is the largest term."""
    vec = spec.vector
    kinds = {name[len(VECTOR_OP):]: n for name, n in counters.items() if name.startswith(VECTOR_OP) and n > 0}
    if vec is None or not kinds:
        return []
    issued = {"arith": 0, "load": 0, "store": 0}
    for kind, n in kinds.items():
        issued["load" if kind in LOAD_KINDS else "store" if kind in STORE_KINDS else "arith"] += n
    rates = {"arith": vec.fma_per_cycle, "load": vec.loads_per_cycle, "store": vec.stores_per_cycle}
    terms = [(f"{VECTOR_OP}{pipe}", n / (rates[pipe] * clock * cores)) for pipe, n in issued.items() if n]
    moved = (kinds.get("load", 0) + kinds.get("store", 0)) * vec.width_bits // 8
    if moved:
        level = spec.memory[-1].name
        terms.append((f"cache:{level}:vector", moved / _bandwidth(spec, level, cores)))
    return terms


def bytes_per_level(counters: Mapping[str, int]) -> dict[str, int]:
    """DMA bytes each level served (read from or written to), from the ``bytes:<from>-><to>`` counters."""
    out: dict[str, int] = {}
    for name, n in counters.items():
        if name.startswith(BYTES) and n > 0:
            for level in name[len(BYTES):].split("->"):
                out[level] = out.get(level, 0) + n
    return out


def planner_estimate(resources: Mapping[str, Any]) -> float | None:
    """The planner's predicted seconds summed over the contractions of a compile-time ``resources`` record
    (None without any): what the modelled time is compared with."""
    estimates = [c["estimate_seconds"] for c in resources.get("contractions", ()) if "estimate_seconds" in c]
    return sum(estimates) if estimates else None


def modelled_time(spec: ChipSpec, counters: Mapping[str, int], resources: Mapping[str, Any]) -> ModelledTime:
    """`model_time` of one run, with the cores, double buffering and unit dtypes from the target's
    compile-time ``resources`` record (the template target's: ``cores``, ``double_buffered``,
    ``contractions`` with ``unit`` and ``dtype``)."""
    units = {c["unit"]: c["dtype"] for c in resources.get("contractions", ()) if c.get("unit")}
    return model_time(spec, counters, cores=int(resources.get("cores", 1)),
                      double_buffered=bool(resources.get("double_buffered", False)), unit_dtypes=units)


def _bandwidth(spec: ChipSpec, level: str, cores: int) -> float:
    """Bytes per second through ``level``'s ports with ``cores`` cores at work."""
    lv = spec.memory_level(level)
    return lv.bandwidth_gbps * 1e9 * _units_used(spec, lv.scope, cores)
