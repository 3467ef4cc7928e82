"""``detect_host()``: a `ChipSpec` of the machine pbsdk runs on.

CPU name and features come from llvmlite (the same LLVM that generates the code), the core count from the
process's CPU affinity, the caches from ``/sys/devices/system/cpu/cpu0/cache``, the clock from
``/proc/cpuinfo``. Anything that cannot be read falls back to a conservative default. What none of them
says — the clock the cores run vector code at, FMA and matrix-instruction issue rates, the bandwidth of
each memory level — is measured once per machine (`pbsdk.core.spec.calibrate`, under a second, cached);
the spec's ``provenance`` says which figure came from where.
"""

from __future__ import annotations

import functools
import os
import platform
import re
from pathlib import Path
from typing import Any

from pbsdk.core.spec import calibrate as cal
from pbsdk.core.spec.loader import validate_data
from pbsdk.core.spec.models import ChipSpec

_SYS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")
_PROC_CPUINFO = Path("/proc/cpuinfo")
_DEFAULT_CLOCK_GHZ = 2.0
#: Cycles from a vector FMA to the next one on its result, where calibration is off: 4 on the x86 cores of
#: the last decade (Intel since Skylake, AMD since Zen; Agner Fog's instruction tables); measured otherwise.
FMA_LATENCY_ESTIMATE = 4
_KiB, _MiB, _GiB = 1 << 10, 1 << 20, 1 << 30
#: Used when /sys has no cache description: level -> (type, size per instance, shared chip-wide).
_DEFAULT_CACHES = [(3, 8 * _MiB, True), (2, 1 * _MiB, False), (1, 32 * _KiB, False)]


def _llvm_host() -> tuple[str, str, dict[str, bool], str]:
    """(cpu name, flattened feature string, feature map, process triple); generic values without llvmlite."""
    try:
        import llvmlite.binding as llvm

        # llvmlite >= 0.45 initialises LLVM itself (llvm.initialize() now raises); the host queries below
        # need no target initialisation, but initialising the native target is harmless and idempotent.
        try:
            llvm.initialize_native_target()
        except Exception:  # noqa: BLE001, S110 - pragma: no cover - older/odd builds
            pass
        name = llvm.get_host_cpu_name() or "generic"
        triple = llvm.get_process_triple()
        try:
            fmap = llvm.get_host_cpu_features()
            features = fmap.flatten()
            enabled = {k: bool(v) for k, v in fmap.items()}
        except RuntimeError:  # LLVM cannot list features on some hosts
            features, enabled = "", {}
        return name, features, enabled, triple
    except Exception:  # noqa: BLE001 - pragma: no cover - llvmlite missing or broken
        machine = platform.machine() or "unknown"
        return "generic", "", {}, f"{machine}-unknown-linux-gnu"


def _core_count() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _affinity() -> set[int]:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def _parse_cpu_list(text: str) -> set[int]:
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.update(range(int(lo), int(hi) + 1))
        else:
            cpus.add(int(part))
    return cpus


def _parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+)\s*([KMG]?)i?B?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(text)
    return int(m.group(1)) * {"": 1, "K": _KiB, "M": _MiB, "G": _GiB}[m.group(2).upper()]


def _read_caches(cache_dir: Path | None = None) -> list[tuple[int, int, bool, int, int | None]]:
    """[(level, bytes per instance, chip-wide?, line bytes, ways or None)] of the data/unified caches of cpu0."""
    cache_dir = _SYS_CACHE if cache_dir is None else cache_dir
    found: list[tuple[int, int, bool, int, int | None]] = []
    mine = _affinity()
    try:
        entries = sorted(cache_dir.glob("index*"))
    except OSError:
        entries = []
    for entry in entries:
        try:
            ctype = (entry / "type").read_text().strip()
            if ctype not in ("Data", "Unified"):
                continue
            level = int((entry / "level").read_text())
            size = _parse_size((entry / "size").read_text())
            try:
                sharers = _parse_cpu_list((entry / "shared_cpu_list").read_text())
            except (OSError, ValueError):
                sharers = {0}
            try:
                line = int((entry / "coherency_line_size").read_text())
            except (OSError, ValueError):
                line = 64
            try:
                ways: int | None = int((entry / "ways_of_associativity").read_text())
            except (OSError, ValueError):
                ways = None
        except (OSError, ValueError):
            continue
        chip_wide = len(mine) > 1 and mine <= sharers
        if not chip_wide and len(sharers & mine) > 1:
            # shared by a cluster of cores: count it per core (our hierarchy has no cluster level); its sets
            # are the whole cache's, which a per-core share no longer says
            size //= len(sharers & mine)
            ways = None
        if size > 0:
            found.append((level, size, chip_wide, line if line > 0 and line & (line - 1) == 0 else 64,
                          ways if ways is not None and 1 <= ways <= 1024 else None))
    if not found:
        found = [(lvl, size, wide, 64, None) for lvl, size, wide in _DEFAULT_CACHES]
    return found


def _clock_ghz() -> float:
    try:
        for line in _PROC_CPUINFO.read_text(errors="replace").splitlines():
            if line.lower().startswith("cpu mhz"):
                mhz = float(line.split(":", 1)[1])
                if 100 <= mhz <= 20000:
                    return round(mhz / 1000.0, 3)
    except (OSError, ValueError, IndexError):
        pass
    try:
        khz = int(Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq").read_text())
        if 100_000 <= khz <= 20_000_000:
            return round(khz / 1e6, 3)
    except (OSError, ValueError):
        pass
    return _DEFAULT_CLOCK_GHZ


def _cpuinfo_field(key: str) -> str | None:
    try:
        for line in _PROC_CPUINFO.read_text(errors="replace").splitlines():
            if line.split(":", 1)[0].strip().lower() == key:
                return line.split(":", 1)[1].strip()
    except (OSError, IndexError):
        pass
    return None


def _ram_bytes() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return 8 * _GiB


#: AMX (Intel's Advanced Matrix Extensions): eight 16-row tile registers of 64 bytes a row; one tile product
#: (16x16 accumulators, k 32 bf16 or 64 int8) issues every 16 cycles per core (Intel optimization manual).
AMX_TILE_REGISTERS = 8
AMX_PER_CYCLE = 1 / 16
#: VNNI's ``vpdpbusd`` takes its unsigned operand (A's broadcast group, offset by 128 where A is signed)
#: only from a register, and LLVM keeps several broadcasts in flight ahead of their instructions: a
#: register tile leaves a quarter of the vector registers for them. Measured on Zen 4 (32 zmm): a 12x2 tile
#: (6 left) spills accumulators inside the k loop, 1.5-2.3x slower as the stack lands 4 KiB-aliased with
#: A's loads or not; 11x2 (8 left) runs at the unit's peak.
VNNI_BROADCAST_SHARE = 4


def host_units(enabled: dict[str, bool], width: int, fma_per_cycle: int) -> list[dict]:
    """The matrix units of an x86 CPU with the LLVM features ``enabled`` (CPUID, as LLVM reads it) and
    ``width``-bit vectors, best first: AMX tiles (``amx-bf16``, ``amx-int8`` with ``amx-tile``), then the
    dot-product instructions in the vector registers — AVX512-BF16's ``vdpbf16ps`` (pairs of bf16 into f32
    lanes), AVX512-VNNI's or AVX-VNNI's ``vpdpbusd`` (quads of u8 x i8 into i32 lanes; a signed A is
    offset by 128 and corrected) — and, where the CPU has no i8 dot product, AVX2's or AVX512-BW's
    ``vpmaddwd`` (pairs of i16 into i32 lanes, added to the accumulator by a ``vpaddd``: i8 operands widened
    to i16 as they are packed, signed x signed, exact; twice the multiply-adds of an f32 FMA an instruction).
    A dot-product instruction issues on the FMA pipes (``fma_per_cycle``) until calibrated."""
    units: list[dict] = []
    if enabled.get("amx-tile"):
        for feature, name, k, operand, acc in (("amx-bf16", "tdpbf16ps", 32, "bf16", "f32"),
                                                ("amx-int8", "tdpbssd", 64, "i8", "i32")):
            if enabled.get(feature):
                units.append({"name": name, "scope": "core", "m": 16, "n": 16, "k": k, "operand_dtype": operand,
                              "accumulator_dtype": acc, "registers": "tile",
                              "tile_registers": AMX_TILE_REGISTERS, "per_cycle": AMX_PER_CYCLE,
                              "instruction": f"AMX {name} (16x16 {acc} accumulator tile, k {k})"})
    lanes = width // 32
    dot = [("avx512bf16", width == 512, "vdpbf16ps", 2, "bf16", "f32"),
           ("avx512vnni", width == 512, "vpdpbusd", 4, "i8", "i32"),
           ("avxvnni", width == 256, "vpdpbusd", 4, "i8", "i32")]
    registers = 32 if width == 512 else 16
    for feature, fits, name, k, operand, acc in dot:
        if enabled.get(feature) and fits and not any(u["name"] == name for u in units):
            staged = {"broadcast_registers": registers // VNNI_BROADCAST_SHARE} if name == "vpdpbusd" else {}
            units.append({"name": name, "scope": "core", "m": 1, "n": lanes, "k": k, "operand_dtype": operand,
                          "accumulator_dtype": acc, "registers": "vector", "per_cycle": float(fma_per_cycle),
                          **staged,
                          "instruction": f"{name} ({width}-bit: {lanes} {acc} lanes += {k} {operand} products each)"})
    pairs = enabled.get("avx512bw") if width == 512 else enabled.get("avx2") and width == 256
    if pairs and not any(u["operand_dtype"] == "i8" for u in units):
        units.append({"name": "vpmaddwd", "scope": "core", "m": 1, "n": lanes, "k": 2, "operand_dtype": "i8",
                      "register_dtype": "i16", "accumulator_dtype": "i32", "registers": "vector",
                      "per_cycle": float(fma_per_cycle), "broadcast_registers": registers // VNNI_BROADCAST_SHARE,
                      "instruction": f"vpmaddwd + vpaddd ({width}-bit: {lanes} i32 lanes += 2 i8 products each, "
                                     "read as i16)"})
    return units


def unit_peaks(units: list[dict], cores: int, clock_ghz: float) -> dict[str, float]:
    """Peak TFLOP/s (TOP/s for integers) per operand dtype of the best of ``units`` (`host_units`)."""
    peaks: dict[str, float] = {}
    for u in units:
        tflops = cores * clock_ghz * u["per_cycle"] * 2 * u["m"] * u["n"] * u["k"] / 1000.0
        peaks[u["operand_dtype"]] = max(peaks.get(u["operand_dtype"], 0.0), round(tflops, 4))
    return peaks


def _vector_shape(enabled: dict[str, bool], triple: str) -> tuple[int, int, list[int]]:
    """(widest vector width in bits, vector registers, the widths the CPU has, widest first) from CPUID."""
    if enabled.get("avx512f"):
        return 512, 32, [512, 256, 128]
    if enabled.get("avx2") or enabled.get("avx"):
        return 256, 16, [256, 128]
    if triple.startswith(("x86_64", "i386", "i686")):
        return 128, 16, [128]
    return 128, 32, [128]  # aarch64 NEON and others: 128-bit, 32 registers


def _memory(caches: list[tuple[int, int, bool, int, int | None]], cores: int, clock: float,
            width: int) -> tuple[list[dict], dict[str, str]]:
    """Main memory, then the caches outermost first (sizes kept non-increasing so the spec validates on
    odd topologies), with estimated bandwidths (GB/s: ~10 GB/s of DRAM per core; L1 two vector loads per
    cycle, L2 64 B/cycle, a shared last-level cache 16 B/cycle per core); and where each figure came from."""
    ram = max(_ram_bytes(), 64 * _MiB)
    memory = [{"name": "dram", "scope": "device", "size_bytes": ram,
               "bandwidth_gbps": round(min(10.0 * cores, 400.0), 1), "alignment_bytes": 64, "line_bytes": 64,
               "managed": "software"}]
    prov = {"memory.dram.size_bytes": "sysconf", "memory.dram.bandwidth_gbps": "estimate (10 GB/s a core)"}
    prev_size, seen = ram, set()
    for level, size, wide, line, ways in sorted(caches, key=lambda c: (0 if c[2] else 1, -c[0])):
        name = f"l{level}d" if level == 1 else f"l{level}"
        if name in seen:
            continue
        seen.add(name)
        if size > prev_size:  # clamped: no longer the physical cache, whose sets `ways` would describe
            size, ways = prev_size, None
        prev_size = size
        per_cycle = {1: 2 * width // 8, 2: 64}.get(level, 16)
        memory.append({"name": name, "scope": "device" if wide else "core", "size_bytes": size,
                       "bandwidth_gbps": round(per_cycle * clock * (cores if wide else 1), 1),
                       "alignment_bytes": line, "line_bytes": line, "managed": "cache",
                       **({"ways": ways} if ways is not None else {})})
        prov[f"memory.{name}.size_bytes"] = "sysfs" if _SYS_CACHE.exists() else "default"
        prov[f"memory.{name}.bandwidth_gbps"] = f"estimate ({per_cycle} B/cycle{' a core' if wide else ''})"
    return memory, prov


def host_spec_data(*, calibrate: bool = True, force: bool = False) -> dict:
    """The raw mapping `detect_host` validates (exposed for debugging: ``pbsdk spec show host``).
    ``calibrate``: measure what CPUID and sysfs do not say (`pbsdk.core.spec.calibrate`), once per machine;
    ``force``: measure again even if this machine's figures are cached (``pbsdk spec calibrate``)."""
    cpu, features, enabled, triple = _llvm_host()
    cores = _core_count()
    x86 = triple.startswith(("x86_64", "i386", "i686"))
    width, regs, widths = _vector_shape(enabled, triple)
    fma = bool(enabled.get("fma") or enabled.get("neon") or triple.startswith(("aarch64", "arm64")))
    vendor_id = (_cpuinfo_field("vendor_id") or "").lower()
    vendor = {"genuineintel": "intel", "authenticamd": "amd"}.get(vendor_id) or platform.machine().lower() or "unknown"
    model = _cpuinfo_field("model name") or cpu
    clock = _clock_ghz()
    memory, prov = _memory(_read_caches(), cores, clock, width)
    prov.update({"clock_ghz": f"/proc/cpuinfo ({clock} GHz: nominal, not necessarily the running clock)",
                 "compute.core.count": "sched_getaffinity", "vector.width_bits": "cpuid",
                 "vector.fma_per_cycle": "estimate (two FMA pipes)", "vector.loads_per_cycle": "estimate",
                 "vector.fma_latency": f"estimate ({FMA_LATENCY_ESTIMATE} cycles: x86 cores since Haswell and Zen)"})
    units = host_units(enabled, width, 2) if x86 else []
    for u in units:
        prov[f"matrix_units.{u['name']}.per_cycle"] = "estimate" if u["registers"] == "vector" else "Intel manual"
    data: dict[str, Any] = {
        "name": "host", "aliases": [], "vendor": vendor, "kind": "cpu",
        "description": f"Detected host: {model} ({cores} cores usable, {width}-bit vectors).",
        "dtypes": ["f64", "f32", "f16", "bf16", "i64", "i32", "i16", "i8", "i1"],
        "compute": [{"name": "core", "count": cores}, {"name": "lane", "count": width // 32}],
        "memory": memory,
        "matrix_units": units,
        "vector": {"width_bits": width, "dtypes": ["f64", "f32", "i64", "i32", "i16", "i8"], "registers": regs,
                   "fma": fma, "fma_per_cycle": 2 if fma else 1, "loads_per_cycle": 2,
                   "fma_latency": FMA_LATENCY_ESTIMATE if fma else 1},
        "clock_ghz": clock,
        "codegen": {"triple": triple, "cpu": cpu, "features": features},
        "provenance": prov,
    }
    if calibrate:
        levels = [(m["name"], m["size_bytes"], m["scope"] == "device") for m in reversed(memory[1:])]
        levels.append(("dram", 0, True))
        key = cal.host_key(model, cpu, features, cores, levels)
        found = cal.calibration(key, lambda: cal.measure(cpu, features, enabled, widths, levels, cores),
                                force=force)
        if found is not None:
            _apply_calibration(data, found)
    data["peak_tflops"] = _peaks(data)
    return data


def _apply_calibration(data: dict, c: cal.Calibration) -> None:
    """Replace ``data``'s estimates with the measured figures, saying so in its provenance."""
    prov, vec = data["provenance"], data["vector"]
    note = (f"measured in {c.seconds} s at load average {c.load:.1f}, cached per machine (pbsdk spec calibrate "
            "measures again; PBSDK_CALIBRATE=0: estimates)")
    prov["clock_ghz"] = f"measured (dependent add/xor chain); {prov['clock_ghz']}; {note}"
    data["clock_ghz"] = c.clock_ghz
    rates = ", ".join(f"{w}-bit {r}" for w, r in sorted(c.fma_per_cycle.items(), reverse=True))
    width = vec["width_bits"]
    prov["vector.width_bits"] = f"cpuid (the widest; FMAs a cycle measured: {rates})"
    if width in c.fma_per_cycle:
        vec["fma_per_cycle"] = cal.issue_rate(c.fma_per_cycle[width])
        prov["vector.fma_per_cycle"] = f"measured {c.fma_per_cycle[width]} {width}-bit FMAs a cycle ({rates})"
    if c.fma_latency is not None and vec["fma"]:
        vec["fma_latency"] = max(1, round(c.fma_latency))
        prov["vector.fma_latency"] = f"measured {c.fma_latency} cycles a dependent {width}-bit FMA"
    l1 = next((m for m in data["memory"] if m["name"] == "l1d"), None)
    if l1 is not None and "l1d" in c.bandwidth_gbps:
        per_cycle = c.bandwidth_gbps["l1d"] / c.clock_ghz
        vec["loads_per_cycle"] = cal.issue_rate(per_cycle / (width // 8))
        prov["vector.loads_per_cycle"] = f"measured: the l1d delivers {per_cycle:.1f} B a cycle to one core"
    for m in data["memory"]:
        if m["name"] in c.bandwidth_gbps:
            m["bandwidth_gbps"] = c.bandwidth_gbps[m["name"]]
            who = "every core" if m["scope"] == "device" else "one core"
            prov[f"memory.{m['name']}.bandwidth_gbps"] = f"measured ({who} reading)"
        alone = c.bandwidth_gbps.get(f"{m['name']}@core")
        if alone is not None and m["scope"] == "device":
            # timed on its own CPU time, one core's figure survives other processes; every core's wall
            # time does not: the level serves all of them at least what it serves one
            m["core_bandwidth_gbps"] = alone
            m["bandwidth_gbps"] = max(m["bandwidth_gbps"], alone)
            prov[f"memory.{m['name']}.core_bandwidth_gbps"] = "measured (one core reading alone)"
    for u in data["matrix_units"]:
        if u["name"] in c.unit_per_cycle:
            u["per_cycle"] = c.unit_per_cycle[u["name"]]
            prov[f"matrix_units.{u['name']}.per_cycle"] = "measured"


def _peaks(data: dict) -> dict[str, float]:
    """Peak TFLOP/s: the vector unit's f32 (f64 half), and each matrix unit's operand dtype."""
    vec, cores, clock = data["vector"], data["compute"][0]["count"], data["clock_ghz"]
    f32 = cores * clock * data["compute"][1]["count"] * vec["fma_per_cycle"] * (2 if vec["fma"] else 1) / 1000.0
    data["provenance"]["peak_tflops"] = "derived: cores x clock x lanes x issue rate x 2"
    return {"f32": max(round(f32, 4), 1e-4), "f64": max(round(f32 / 2, 4), 1e-4),
            **unit_peaks(data["matrix_units"], cores, clock)}


def recalibrate() -> ChipSpec:
    """Measure this machine again (replacing its cached figures) and return the new host spec; the
    process's `detect_host` answers with it from now on."""
    spec = validate_data(host_spec_data(force=True), source="host")
    detect_host.cache_clear()
    return spec


@functools.lru_cache(maxsize=1)
def detect_host() -> ChipSpec:
    """A validated `ChipSpec` of this machine (name ``host``, kind ``cpu``); cached for the process."""
    return validate_data(host_spec_data(), source="host")
