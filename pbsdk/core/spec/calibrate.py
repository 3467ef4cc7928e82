"""Host calibration: the figures of a CPU that CPUID and sysfs do not say, measured in well under a second.

``/proc/cpuinfo`` gives a nominal clock (a VM's or a base clock, not the one the core runs vector code at),
and nothing says how many vector FMAs a core issues per cycle at a given width (an AMD Zen 4 issues one
512-bit FMA a cycle on two 256-bit pipes; a Xeon with two 512-bit ports issues two), how fast a matrix
instruction issues, or what each cache level and main memory deliver. As BLIS configurations and ATLAS's
probes do, pbsdk measures them with a few tiny loops JIT-compiled by the LLVM it generates code with
(built with llvmlite's IR builder) and timed best-of-N:

- **clock**: a chain of dependent ``add``/``xor`` pairs on registers (one cycle each on every x86 and Arm
  core; the pair cannot be folded by LLVM as a chain of adds could, and the add's operand is a register:
  Intel cores since Golden Cove execute an add of a small immediate in the renamer, which made an
  ``x + 1`` chain run two steps a cycle and the clock read twice the real one) — steps x 2 / seconds;
- **vector FMA issue rate** per width (512/256/128 bits as the CPU has them): independent chains of
  ``llvm.fma`` on more accumulators than latency x pipes needs — FMAs / (seconds x clock);
- **vector FMA latency** at the widest width: one chain of dependent ``llvm.fma`` — cycles per FMA (what a
  register tile of few accumulators is bound by: `VectorUnit.fma_latency`);
- **matrix-instruction issue rate**: the same with ``vpdpbusd`` / ``vdpbf16ps`` where the CPU has them, and
  with ``vpmaddwd`` + ``vpaddd`` (a step of the i8 unit of a CPU without them) on AVX2 / AVX512-BW;
- **read bandwidth** of each cache level and of main memory: vector loads summed over a buffer of half the
  level (core-scoped levels on one core; chip-wide ones on every usable core at once, one thread each).

`derive` turns the raw timings into figures (pure; unit-tested without a CPU). Results are cached per
machine (`host_key`: CPU model, LLVM's CPU name and features, usable cores, cache sizes) in
``~/.cache/pbsdk/host/`` (``PBSDK_HOST_DIR``); ``pbsdk spec calibrate`` measures again. A saved spec
(any YAML, presets included) is never calibrated. ``PBSDK_CALIBRATE=0`` turns calibration off (the host
spec then carries its estimates, labelled as such).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

log = logging.getLogger("pbsdk.calibrate")

#: Bumped whenever a probe or `derive` changes meaning: older cached calibrations are then re-measured.
PROBE_VERSION = 5
#: Dependent steps per loop iteration of the clock probe; each step is an add and an xor (2 cycles).
CLOCK_UNROLL = 16
#: Independent accumulator chains of the FMA / matrix-instruction probes: more than latency (4-5 cycles)
#: x issue ports (2) on any current core, so the probe measures issue, not latency.
CHAINS = 12
#: Vector loads per iteration (independent accumulators) of the bandwidth probe.
READ_UNROLL = 8
#: Each timed call runs at least this long; the best of `REPEATS` calls counts (a preempted call is slower,
#: never faster).
MIN_CALL_S = 0.002
REPEATS = 5
#: Main memory is read through buffers of at least this many bytes (and 4x the last cache) in all.
DRAM_MIN_BYTES = 32 << 20


@dataclasses.dataclass(frozen=True)
class Timing:
    """One probe's best call: ``count`` events (cycles of dependent steps, instructions or bytes) in
    ``seconds``."""
    count: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds > 0 else 0.0


@dataclasses.dataclass(frozen=True)
class Timings:
    """What the probes measured (raw): the clock chain, FMAs per vector width, matrix instructions by
    name, bytes read per memory level name."""
    clock: Timing
    fma: dict[int, Timing]
    units: dict[str, Timing]
    reads: dict[str, Timing]
    fma_latency: Timing | None = None  # one dependent chain of FMAs at the widest width


@dataclasses.dataclass(frozen=True)
class Calibration:
    """The derived figures: clock in GHz, vector FMAs per cycle by width, matrix instructions per cycle
    by name, read bandwidth in GB/s by memory level, cycles from one FMA to the next dependent one, and how
    long measuring took."""
    clock_ghz: float
    fma_per_cycle: dict[int, float]
    unit_per_cycle: dict[str, float]
    bandwidth_gbps: dict[str, float]
    seconds: float
    load: float = 0.0  # the 1-minute load average when measured (other processes lower shared-level figures)
    fma_latency: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"version": PROBE_VERSION, "clock_ghz": self.clock_ghz,
                "fma_per_cycle": {str(k): v for k, v in self.fma_per_cycle.items()},
                "unit_per_cycle": dict(self.unit_per_cycle), "bandwidth_gbps": dict(self.bandwidth_gbps),
                "seconds": self.seconds, "load": self.load, "fma_latency": self.fma_latency}

    @classmethod
    def from_json(cls, data: Any) -> Calibration:
        """The calibration ``to_json`` wrote; `ValueError` for anything else (another version included)."""
        try:
            if data["version"] != PROBE_VERSION:
                raise ValueError(f"probe version {data['version']!r}, not {PROBE_VERSION}")
            cal = cls(clock_ghz=float(data["clock_ghz"]),
                      fma_per_cycle={int(k): float(v) for k, v in data["fma_per_cycle"].items()},
                      unit_per_cycle={str(k): float(v) for k, v in data["unit_per_cycle"].items()},
                      bandwidth_gbps={str(k): float(v) for k, v in data["bandwidth_gbps"].items()},
                      seconds=float(data["seconds"]), load=float(data.get("load", 0.0)),
                      fma_latency=None if data.get("fma_latency") is None else float(data["fma_latency"]))
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a calibration: {exc!r}") from exc
        if not (0.1 <= cal.clock_ghz <= 20) or any(not (0 < v < 64) for v in cal.fma_per_cycle.values()) \
                or not (cal.fma_latency is None or 0 < cal.fma_latency < 64):
            raise ValueError(f"implausible calibration: {cal}")
        return cal


def derive(t: Timings) -> Calibration:
    """Figures from raw timings. The clock: each dependent step is two one-cycle operations. Issue
    rates: instructions per second over cycles per second; the FMA latency: cycles per FMA of one
    dependent chain. Bandwidths: bytes per second in GB/s."""
    hz = 2 * t.clock.rate
    if hz <= 0:
        raise ValueError("the clock probe measured nothing")
    return Calibration(clock_ghz=round(hz / 1e9, 3),
                       fma_per_cycle={w: round(x.rate / hz, 3) for w, x in t.fma.items()},
                       unit_per_cycle={n: round(x.rate / hz, 3) for n, x in t.units.items()},
                       bandwidth_gbps={n: round(x.rate / 1e9, 1) for n, x in t.reads.items()},
                       seconds=0.0,
                       fma_latency=round(hz / t.fma_latency.rate, 2) if t.fma_latency and t.fma_latency.rate else None)


def issue_rate(measured: float) -> int:
    """A measured per-cycle issue rate as the spec's integer ``fma_per_cycle``: the nearest whole rate, at
    least 1 (a core that issues 0.98 FMAs a cycle has one pipe; timing noise only ever lowers the rate)."""
    return max(1, math.floor(measured + 0.35))


def read_plan(levels: Sequence[tuple[str, int, bool]], cores: int) -> list[tuple[str, int, int]]:
    """For each memory level ``(name, bytes per instance, chip-wide?)`` (caches, then ``dram`` with size
    0), the probe's threads and bytes per thread: half a core-scoped cache on one core; half a chip-wide
    cache split over every core; main memory 4x the last cache (at least `DRAM_MIN_BYTES`) split alike.
    A chip-wide level of several cores is read once more by one core alone (``<name>@core``: the most one
    core draws from it)."""
    plan: list[tuple[str, int, int]] = []
    largest = 0
    for name, size, wide in levels:
        if name == "dram":
            per_thread = _round_down(max(4 * largest, DRAM_MIN_BYTES) // cores)
        elif wide:
            per_thread = _round_down(size // 2 // cores)
        else:
            per_thread = _round_down(size // 2)
        plan.append((name, cores if wide else 1, per_thread))
        if wide and cores > 1:
            plan.append((f"{name}@core", 1, per_thread))
        largest = max(largest, size)
    return [p for p in plan if p[2] >= 4096]


def _round_down(n: int, to: int = 4096) -> int:
    return n // to * to


# ----------------------------------------------------------------------------------------------- probes

class _Probes:
    """The probe functions, JIT-compiled once for this CPU (llvmlite IR builder -> MCJIT)."""

    def __init__(self, cpu: str, features: str, enabled: dict[str, bool], widths: Sequence[int]) -> None:
        import llvmlite.binding as llvm
        from llvmlite import ir

        llvm.initialize_native_target()  # idempotent; JIT needs the target and its assembly printer
        llvm.initialize_native_asmprinter()
        self.ir, self.widths = ir, list(widths)
        self.module = ir.Module(name="pbsdk_calibrate")
        self.module.triple = llvm.get_process_triple()
        self.units: list[str] = []
        self._clock()
        for w in self.widths:
            self._fma(w)
        self._fma(max(self.widths), chains=1)
        if enabled.get("avx512vnni") and 512 in self.widths:
            self._dot("vpdpbusd", "llvm.x86.avx512.vpdpbusd.512", ir.VectorType(ir.IntType(32), 16),
                      ir.VectorType(ir.IntType(32), 16))
        if enabled.get("avx512bf16") and 512 in self.widths:
            self._dot("vdpbf16ps", "llvm.x86.avx512bf16.dpbf16ps.512", ir.VectorType(ir.FloatType(), 16),
                      ir.VectorType(_bfloat(), 32))
        pairs = {512: ("avx512bw", "llvm.x86.avx512.pmaddw.d.512"), 256: ("avx2", "llvm.x86.avx2.pmadd.wd")}
        width = max(self.widths)
        if width in pairs and enabled.get(pairs[width][0]):
            self._pairs(pairs[width][1], width)
        self._read(width)
        target = llvm.Target.from_triple(self.module.triple)
        tm = target.create_target_machine(cpu=cpu, features=features, opt=2, codemodel="jitdefault")
        parsed = llvm.parse_assembly(str(self.module))
        parsed.verify()
        self.engine = llvm.create_mcjit_compiler(parsed, tm)
        self.engine.finalize_object()

    def fn(self, name: str, restype: Any, *argtypes: Any) -> Callable[..., Any]:
        return ctypes.CFUNCTYPE(restype, *argtypes)(self.engine.get_function_address(name))

    # -- IR: each probe is ``f(i64 n, ...)`` looping n times over an unrolled body
    def _loop(self, name: str, args: list[Any], ret: Any, carried: list[tuple[Any, Callable[[Any, Any], Any]]],
              body: Callable[[Any, Any, list[Any]], list[Any]], finish: Callable[[Any, Any, list[Any]], Any]) -> None:
        """``name(i64 n, *args)``: values of ``carried`` (type, initial value built from the function) stepped
        by ``body`` n times, then ``finish``ed."""
        ir = self.ir
        i64 = ir.IntType(64)
        f = ir.Function(self.module, ir.FunctionType(ret, [i64, *args]), name=name)
        entry, loop, done = f.append_basic_block("entry"), f.append_basic_block("loop"), f.append_basic_block("done")
        b = ir.IRBuilder(entry)
        init = [make(b, f) for _, make in carried]
        b.branch(loop)
        b.position_at_end(loop)
        i = b.phi(i64)
        i.add_incoming(ir.Constant(i64, 0), entry)
        values = []
        for (ty, _), v in zip(carried, init):
            phi = b.phi(ty)
            phi.add_incoming(v, entry)
            values.append(phi)
        new = body(b, f, values)
        nxt = b.add(i, ir.Constant(i64, 1))
        i.add_incoming(nxt, loop)
        for phi, v in zip(values, new):
            phi.add_incoming(v, loop)
        b.cbranch(b.icmp_signed("<", nxt, f.args[0]), loop, done)
        b.position_at_end(done)
        finish(b, f, new)

    def _clock(self) -> None:
        """``i64 clock(i64 n, i64 y)``: x = (x + y) ^ y', `CLOCK_UNROLL` times an iteration, with y' = y >> 1
        (registers both: no add of an immediate, which a renamer may execute without a cycle)."""
        ir = self.ir
        i64 = ir.IntType(64)

        def body(b: Any, f: Any, vals: list[Any]) -> list[Any]:
            (x,) = vals
            y = f.args[1]
            other = b.lshr(y, ir.Constant(i64, 1))
            for _ in range(CLOCK_UNROLL):
                x = b.xor(b.add(x, y), other)
            return [x]

        self._loop("clock", [i64], i64, [(i64, lambda b, f: f.args[1])], body, lambda b, f, v: b.ret(v[0]))

    def _accumulate(self, name: str, acc_t: Any, step: Callable[[Any, Any, Any, Any], Any], op_t: Any,
                    chains: int = CHAINS) -> None:
        """``void name(i64 n, acc_t* io)``: ``chains`` accumulators from ``io``, each stepped with two operands
        read from ``io`` n times; their sum stored back (nothing is dead, nothing constant)."""
        ir = self.ir
        ops: list[Any] = []

        def load(b: Any, f: Any) -> Any:
            io = f.args[1]
            if not ops:
                ops.extend(b.bitcast(b.load(b.gep(io, [ir.Constant(ir.IntType(64), j)])), op_t) for j in (1, 2))
            return b.load(io)

        def body(b: Any, f: Any, vals: list[Any]) -> list[Any]:
            return [step(b, v, ops[0], ops[1]) for v in vals]

        def finish(b: Any, f: Any, vals: list[Any]) -> None:
            total = vals[0]
            for v in vals[1:]:
                total = b.fadd(total, v) if isinstance(acc_t.element, ir.FloatType) else b.add(total, v)
            b.store(total, f.args[1])
            b.ret_void()

        self._loop(name, [acc_t.as_pointer()], ir.VoidType(), [(acc_t, load)] * chains, body, finish)

    def _fma(self, width: int, chains: int = CHAINS) -> None:
        """``fma<width>``: `CHAINS` independent chains (the issue rate); with ``chains=1``, ``fma_latency``:
        one chain, each FMA waiting for the one before (llvm.fma is never reassociated)."""
        ir = self.ir
        vt = ir.VectorType(ir.FloatType(), width // 32)
        name = f"llvm.fma.v{width // 32}f32"
        fma = self.module.globals.get(name) or ir.Function(self.module, ir.FunctionType(vt, [vt, vt, vt]), name=name)
        self._accumulate(f"fma{width}" if chains > 1 else "fma_latency", vt,
                         lambda b, acc, x, y: b.call(fma, [acc, x, y]), vt, chains)

    def _dot(self, name: str, intrinsic: str, acc_t: Any, op_t: Any) -> None:
        ir = self.ir
        f = ir.Function(self.module, ir.FunctionType(acc_t, [acc_t, op_t, op_t]), name=intrinsic)
        self._accumulate(name, acc_t, lambda b, acc, x, y: b.call(f, [acc, x, y]), op_t)
        self.units.append(name)

    def _pairs(self, intrinsic: str, width: int) -> None:
        """``vpmaddwd`` as a unit step: ``acc + pmaddwd(acc as i16 pairs, y)``. The product reads the chain's
        own accumulator, or LLVM would hoist a product of loop-invariant operands out of the loop and time the
        adds alone; a step's latency (product and add, 4-5 cycles) x 2 pipes stays under `CHAINS`."""
        ir = self.ir
        acc_t, op_t = ir.VectorType(ir.IntType(32), width // 32), ir.VectorType(ir.IntType(16), width // 16)
        f = ir.Function(self.module, ir.FunctionType(acc_t, [op_t, op_t]), name=intrinsic)
        self._accumulate("vpmaddwd", acc_t, lambda b, acc, x, y: b.add(acc, b.call(f, [b.bitcast(acc, op_t), y])),
                         op_t)
        self.units.append("vpmaddwd")

    def _read(self, width: int) -> None:
        """``float read(i64 n, float* buf, i64 vectors)``: n passes summing ``vectors`` vectors of ``buf``,
        `READ_UNROLL` at a time into as many accumulators."""
        ir = self.ir
        i64, vt = ir.IntType(64), ir.VectorType(ir.FloatType(), width // 32)
        f = ir.Function(self.module, ir.FunctionType(ir.FloatType(), [i64, vt.as_pointer(), i64]), name="read")
        n, buf, count = f.args
        entry, outer, inner, latch, done = (f.append_basic_block(s) for s in ("entry", "outer", "inner", "latch", "done"))
        b = ir.IRBuilder(entry)
        zero = ir.Constant(vt, [0.0] * (width // 32))
        b.branch(outer)
        b.position_at_end(outer)
        r = b.phi(i64)
        r.add_incoming(ir.Constant(i64, 0), entry)
        outer_acc = [b.phi(vt) for _ in range(READ_UNROLL)]
        for a in outer_acc:
            a.add_incoming(zero, entry)
        b.branch(inner)
        b.position_at_end(inner)
        j = b.phi(i64)
        j.add_incoming(ir.Constant(i64, 0), outer)
        acc = [b.phi(vt) for _ in range(READ_UNROLL)]
        for a, o in zip(acc, outer_acc):
            a.add_incoming(o, outer)
        new = [b.fadd(a, b.load(b.gep(buf, [b.add(j, ir.Constant(i64, u))]), align=64))
               for u, a in enumerate(acc)]
        j2 = b.add(j, ir.Constant(i64, READ_UNROLL))
        j.add_incoming(j2, inner)
        for a, v in zip(acc, new):
            a.add_incoming(v, inner)
        b.cbranch(b.icmp_signed("<", j2, count), inner, latch)
        b.position_at_end(latch)
        r2 = b.add(r, ir.Constant(i64, 1))
        r.add_incoming(r2, latch)
        for a, v in zip(outer_acc, new):
            a.add_incoming(v, latch)
        b.cbranch(b.icmp_signed("<", r2, n), outer, done)
        b.position_at_end(done)
        total = new[0]
        for v in new[1:]:
            total = b.fadd(total, v)
        b.ret(b.extract_element(total, ir.Constant(ir.IntType(32), 0)))


def _bfloat() -> Any:
    """LLVM's ``bfloat`` type for llvmlite's IR builder, which has none (its printed name is all LLVM needs)."""
    from llvmlite import ir

    class BFloat(ir.Type):
        def _to_string(self) -> str:
            return "bfloat"

        def __eq__(self, other: object) -> bool:
            return isinstance(other, BFloat)

        def __hash__(self) -> int:
            return hash("bfloat")

    return BFloat()


def _timed(call: Callable[[int], float | None], count_per_n: float) -> Timing:
    """Best of `REPEATS` calls of ``call(n)``, n grown until a call takes `MIN_CALL_S`. Time is the calling
    thread's CPU time (another process sharing the core does not count), or what ``call`` returns."""
    def once(n: int) -> float:
        start = time.thread_time()
        got = call(n)
        return got if got is not None else time.thread_time() - start

    n = 1
    while True:
        took = once(n)
        if took >= MIN_CALL_S or n >= 1 << 40:
            break
        n *= 2 if took <= 0 else max(2, min(64, int(MIN_CALL_S / took * 1.2) + 1))
    best = min([took] + [once(n) for _ in range(REPEATS - 1)])
    return Timing(int(n * count_per_n), best)


def _parallel_read(read: Callable[..., float], threads: int, nbytes: int, width: int) -> Timing:
    """Every thread reads its own ``nbytes`` buffer n times at once (ctypes drops the GIL during the call),
    timed as `_timed` does; several threads by the wall clock from a common start to the last one's end
    (their aggregate bandwidth; a loaded machine can only make it lower)."""
    import numpy as np

    vectors = nbytes // (width // 8) // READ_UNROLL * READ_UNROLL
    bufs = [np.ones(vectors * (width // 32) + 64, dtype=np.float32) for _ in range(threads)]
    ptrs = [b.ctypes.data + (-b.ctypes.data) % 64 for b in bufs]
    if threads == 1:
        return _timed(lambda n: read(n, ptrs[0], vectors) and None, vectors * (width // 8))

    def once(n: int) -> float:
        barrier = threading.Barrier(threads)
        workers = [threading.Thread(target=lambda p=p: (barrier.wait(), read(n, p, vectors))) for p in ptrs[1:]]
        for w in workers:
            w.start()
        barrier.wait()
        start = time.perf_counter()
        read(n, ptrs[0], vectors)
        for w in workers:
            w.join()
        return time.perf_counter() - start

    return _timed(once, vectors * (width // 8) * threads)


def measure(cpu: str, features: str, enabled: dict[str, bool], widths: Sequence[int],
            levels: Sequence[tuple[str, int, bool]], cores: int) -> Timings:
    """Run the probes on this machine (see the module docstring)."""
    import numpy as np

    t0 = time.perf_counter()
    probes = _Probes(cpu, features, enabled, widths)
    log.debug("calibration probes compiled in %.3f s", time.perf_counter() - t0)
    clock = probes.fn("clock", ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
    clock_t = _timed(lambda n: clock(n, 0x5A5A) and None, CLOCK_UNROLL)
    fma: dict[int, Timing] = {}
    io = np.ones(64 * 3, dtype=np.float32)
    ptr = io.ctypes.data + (-io.ctypes.data) % 64
    for w in widths:
        f = probes.fn(f"fma{w}", None, ctypes.c_int64, ctypes.c_void_p)
        fma[w] = _timed(lambda n, f=f: f(n, ptr), CHAINS)  # type: ignore[misc]
    chain = probes.fn("fma_latency", None, ctypes.c_int64, ctypes.c_void_p)
    latency = _timed(lambda n: chain(n, ptr), 1)
    units: dict[str, Timing] = {}
    for name in probes.units:
        io[:] = 0  # zero operands: no denormals, no overflow
        f = probes.fn(name, None, ctypes.c_int64, ctypes.c_void_p)
        units[name] = _timed(lambda n, f=f: f(n, ptr), CHAINS)  # type: ignore[misc]
    read = probes.fn("read", ctypes.c_float, ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64)
    reads = {name: _parallel_read(read, threads, nbytes, max(widths))
             for name, threads, nbytes in read_plan(levels, cores)}
    return Timings(clock=clock_t, fma=fma, units=units, reads=reads, fma_latency=latency)


@functools.lru_cache(maxsize=1)
def _clock_probe() -> Callable[[], float]:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    probes = _Probes(llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(), {}, [128])
    clock = probes.fn("clock", ctypes.c_int64, ctypes.c_int64, ctypes.c_int64)
    _clock_probe.probes = probes  # type: ignore[attr-defined]  # keeps the JIT engine (and clock's code) alive
    return lambda: 2 * _timed(lambda n: clock(n, 0x5A5A) and None, CLOCK_UNROLL).rate / 1e9


def clock_now() -> float | None:
    """The clock the calling thread's core runs at now, in GHz (the calibration's clock probe, about 10 ms):
    a shared or boosting host's clock moves with its load, so a benchmark reports it beside its times.
    None if it cannot be measured."""
    try:
        return round(_clock_probe()(), 3)
    except Exception as exc:  # noqa: BLE001 - a figure for a report, never a failure
        log.debug("clock probe failed: %s", exc)
        return None


# ----------------------------------------------------------------------------------------------- cache

def host_key(model: str, cpu: str, features: str, cores: int, levels: Sequence[tuple[str, int, bool]]) -> str:
    """What a calibration is valid for: the CPU, its features, the cores this process may use, the caches."""
    text = json.dumps([PROBE_VERSION, model, cpu, features, cores, [list(lv) for lv in levels]])
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def _cache_root() -> Path:
    """``PBSDK_HOST_DIR``, else ``~/.cache/pbsdk/host``: per machine, so apart from the compile cache
    (``PBSDK_CACHE_DIR``, which a test session or a CI job points at a fresh directory)."""
    return Path(os.environ.get("PBSDK_HOST_DIR") or Path("~/.cache/pbsdk/host")).expanduser()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """An exclusive lock beside ``path``: one process of several starting together measures, the others
    wait and read its result (two measuring at once would each see the other's load)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not Linux/macOS
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _load() -> float:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:  # pragma: no cover - not Unix
        return 0.0


def enabled_by_env() -> bool:
    return os.environ.get("PBSDK_CALIBRATE", "1").strip().lower() not in ("0", "off", "false", "no")


def calibration(key: str, run: Callable[[], Timings], *, force: bool = False) -> Calibration | None:
    """The calibration for ``key``: from the cache, else measured by ``run`` and stored. None (logged) if it
    is turned off by ``PBSDK_CALIBRATE=0`` or measuring fails; a damaged cache entry is measured again."""
    if not enabled_by_env():
        return None
    path = _cache_root() / f"{key}.json"
    try:
        with _locked(path):
            if not force:
                with contextlib.suppress(OSError, ValueError):
                    return Calibration.from_json(json.loads(path.read_text()))
            start = time.perf_counter()
            cal = dataclasses.replace(derive(run()), seconds=round(time.perf_counter() - start, 3), load=_load())
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(json.dumps(cal.to_json(), indent=1))
            tmp.replace(path)
            log.info("pbsdk: host calibrated in %.2f s: %s", cal.seconds, cal)
            if cal.load > max(1.0, (os.cpu_count() or 2) / 2):
                log.warning("pbsdk: host calibrated at load average %.1f: other processes lower the bandwidth "
                            "of shared levels; 'pbsdk spec calibrate' on a quieter machine measures again", cal.load)
            return cal
    except Exception as exc:  # noqa: BLE001 - calibration is an improvement, never a failure
        log.warning("pbsdk: host calibration failed (%s: %s); the host spec keeps its estimates",
                    type(exc).__name__, exc)
        return None


__all__ = ["Calibration", "Timing", "Timings", "calibration", "derive", "enabled_by_env",
           "host_key", "issue_rate", "measure", "read_plan"]
