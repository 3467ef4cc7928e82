"""The host CPU target: bufferized linalg -> loops -> LLVM dialect -> LLVM IR -> llvmlite MCJIT.

Why llvmlite and not MLIR's ExecutionEngine: the engine picks the host CPU itself, while llvmlite lets the
chip spec's ``codegen`` (triple, cpu, features) choose the machine code, and loading needs only LLVM IR
text — so a cached artifact runs without MLIR. ``memref.copy`` between identity-layout buffers lowers to an
``llvm.memcpy`` intrinsic and math functions without an LLVM intrinsic (erf) become libm calls, so no MLIR
runtime library is needed at run time.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from pbsdk.core.errors import CompileError, DeviceUnavailableError, TargetError
from pbsdk.core.options import Options
from pbsdk.core.passes.collapse_loops import CollapseLoops
from pbsdk.core.passes.copies_to_linalg import CopiesToLinalg
from pbsdk.core.passes.dedupe_functions import DedupeFunctions
from pbsdk.core.passes.dynamic_expand import DynamicExpand
from pbsdk.core.passes.dynamic_sizes import NOTE as DYNAMIC_NOTE
from pbsdk.core.passes.dynamic_sizes import DynamicSizes
from pbsdk.core.passes.expose_rows import ExposeRows
from pbsdk.core.passes.fill_borders import FillBorders
from pbsdk.core.passes.fuse_rows import FuseRows
from pbsdk.core.passes.math_approx import MathApprox
from pbsdk.core.passes.plan_workspace import PlanWorkspace
from pbsdk.core.passes.transpose_blocks import TransposeBlocks
from pbsdk.core.passes.vectorize_rows import VectorizeRows
from pbsdk.core.pipeline import Stage, StageContext
from pbsdk.core.runtime.kernel import aligned_empty
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import DYNAMIC_SIZES, WORKSPACE, Artifact, Executable, Target
from pbsdk.targets.cpu import hooks as _cpu_hooks
from pbsdk.targets.cpu import llvm_worker, split_llvm
from pbsdk.targets.cpu.attention_kernel import AttentionKernels
from pbsdk.targets.cpu.bf16 import WidenBf16
from pbsdk.targets.cpu.depthwise_kernel import DepthwiseKernels
from pbsdk.targets.cpu.direct_conv_kernel import DirectConvKernels
from pbsdk.targets.cpu.hooks import resolve_tiles
from pbsdk.targets.cpu.llvm_worker import compile_object, illegal_bf16, optimize, target_machine_for
from pbsdk.targets.cpu.options import CpuOptions
from pbsdk.targets.cpu.outline import OutlineLoopNests
from pbsdk.targets.cpu.pack_contractions import PackContractions
from pbsdk.targets.cpu.parallel import ForallToFork, fork_glue

_log = logging.getLogger("pbsdk.cpu")


def _check_llvm_only(module: Any) -> None:
    """Translation of a module with an op left outside the LLVM dialect crashes the bindings (null module);
    name the op instead."""
    from mlir import ir

    left: list[str] = []

    def visit(op: Any) -> Any:
        name = op.name
        if not (name.startswith("llvm.") or name == "builtin.module"):
            left.append(name)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.operation.walk(visit)
    if left:
        raise CompileError(f"op {left[0]!r} was not lowered to the LLVM dialect", stage="llvm-ir", op=left[0])


def _to_llvm_ir(module: Any, ctx: StageContext) -> Artifact:
    from mlir.dialects import llvm as llvm_dialect

    from pbsdk.core.runtime.cache import caching

    _check_llvm_only(module)
    with module.context:
        text = str(llvm_dialect.translate_module_to_llvmir(module.operation))
    return Artifact(kind="llvm-ir", payload=text, entry=ctx.notes["entry"], inputs=ctx.notes["inputs"],
                    outputs=ctx.notes["outputs"], metadata={"forks": ctx.notes.get("forks", []),
                                                            "object_cache": caching(ctx.options),
                                                            WORKSPACE: ctx.notes.get("workspace", 0),
                                                            DYNAMIC_SIZES: list(ctx.notes.get(DYNAMIC_NOTE, [])),
                                                            "resources": {"contractions": list(
                                                                ctx.notes.get("contractions", []))},
                                                            "amx": bool(ctx.notes.get("amx"))},
                    constants=ctx.constants)


_llvm_lock = threading.Lock()
_llvm_ready = False


def _llvm() -> Any:
    global _llvm_ready
    import llvmlite.binding as llvm

    with _llvm_lock:
        if not _llvm_ready:
            llvm.initialize_native_target()
            llvm.initialize_native_asmprinter()
            _llvm_ready = True
    return llvm


def machine(spec: ChipSpec | None) -> tuple[str, str, str]:
    """(triple, cpu, features) of the spec's codegen (the host's where unset; the host's for None)."""
    llvm = _llvm()
    codegen = dict(spec.codegen) if spec is not None else {}
    triple = codegen.get("triple") or llvm.get_process_triple()
    cpu = codegen.get("cpu") or llvm.get_host_cpu_name()
    features = codegen.get("features")
    if features is None:
        features = llvm.get_host_cpu_features().flatten()
    return triple, cpu, features


def missing_host_flags(spec: ChipSpec | None) -> tuple[str, ...]:
    """The CPU flags (as /proc/cpuinfo names them) that machine code for ``spec``'s codegen needs and this
    host lacks: empty where it runs here, or where the host's flags cannot be read (not Linux, or the code
    is for another architecture, which the JIT refuses by itself)."""
    from pbsdk.runtime.model import host_cpu_flags, required_flags

    triple, _, features = machine(spec)
    host = host_cpu_flags()
    if host is None or triple.split("-")[0] != _llvm().get_process_triple().split("-")[0]:
        return ()
    return tuple(f for f in required_flags(features) if f not in host)


def converts_bf16(features: str) -> bool:
    """Whether machine code for ``features`` rounds f32 to bf16 with an instruction (AVX512-BF16 or
    AVX-NE-CONVERT). Without one, LLVM calls ``__truncsfbf2`` (for a truncation, and for any bf16
    arithmetic or comparison it vectorises), which neither the process nor libgcc defines here: the JIT
    would call address 0. The lowering then computes bf16 arithmetic in f32 and expands the conversions
    in arith first (`lowering_stages`: round to nearest even on the bits, NaN kept), so the LLVM IR holds
    no bf16 arithmetic at all."""
    flags = {f.strip() for f in features.split(",")}
    return bool(flags & {"+avx512bf16", "+avxneconvert"})


def expands_bf16(features: str) -> bool:
    """Whether the lowering computes bf16 in f32 with its conversions expanded in arith (no bf16 conversion
    or arithmetic in the LLVM IR): on a machine without bf16 conversions (`converts_bf16`), and on one whose
    LLVM back end cannot legalise the bf16 arithmetic the O3 pipeline narrows conversions into
    (`llvm_worker.BF16_ARITHMETIC_ILLEGAL`: AVX512-FP16, e.g. Sapphire Rapids)."""
    flags = {f.strip() for f in features.split(",")}
    return not converts_bf16(features) or bool(flags & llvm_worker.BF16_ARITHMETIC_ILLEGAL)


def bf16_expansion(features: str) -> str:
    """The passes (a pipeline prefix ending in ", ", or "") that compute bf16 in f32 with its conversions
    expanded in arith, for machine code of ``features`` where `expands_bf16`; they run before
    ``convert-arith-to-llvm`` (the cpu lowering's, and a host emulation's of another target's schedule)."""
    if not expands_bf16(features):
        return ""
    return ("func.func(arith-emulate-unsupported-floats{source-types=bf16 target-type=f32}, "
            "arith-expand{include-bf16=true}), ")


#: The math ops upstream's ``math-expand-ops`` rewrites into arith by default, and the CPU features under
#: which LLVM lowers one to a single instruction instead (``llvm.roundeven``/``llvm.ceil``: SSE4.1's
#: ``roundps``, AVX-512's ``vrndscaleps``; ``llvm.fma``: ``vfmadd``). Expanded, ``math.roundeven`` is ~55
#: vector ops — in every requantize epilogue (an int8 GEMM's last store: 13% of its time on Zen 4).
MATH_EXPANDED = ("ctlz", "tan", "sinh", "cosh", "asinh", "acosh", "atanh", "tanh", "fma", "ceil", "exp2",
                 "powf", "fpowi", "roundeven", "round", "rsqrt")
MATH_NATIVE = {"roundeven": "+sse4.1", "ceil": "+sse4.1", "fma": "+fma"}


def math_expansions(features: str) -> tuple[str, ...]:
    """The math ops the lowering expands into arith on a machine with ``features``: all of
    `MATH_EXPANDED` but those it has an instruction for (`MATH_NATIVE`)."""
    flags = {f.strip() for f in features.split(",")}
    return tuple(op for op in MATH_EXPANDED if MATH_NATIVE.get(op) not in flags)


def target_machine(spec: ChipSpec | None) -> Any:
    """An llvmlite TargetMachine for the spec's codegen triple/cpu/features (the host's when unset, or
    for None)."""
    return target_machine_for(_llvm(), *machine(spec))


_process = ctypes.CDLL(None)  # what MCJIT's symbol lookup searches: the process and its libraries
_openmp: bool | None = None


def _openmp_available() -> bool:
    """Load GNU libgomp globally (so MCJIT resolves ``GOMP_parallel``); False where it is missing, and
    the parallel parts then run one after another on the calling thread."""
    global _openmp
    with _llvm_lock:
        if _openmp is None:
            try:
                ctypes.CDLL("libgomp.so.1", mode=ctypes.RTLD_GLOBAL)
                _openmp = True
            except OSError:
                _openmp = False
    return _openmp


#: ``__truncsfbf2`` (f32 -> bf16, round to nearest even, NaN kept quiet): the libcall LLVM emits for a
#: bf16 truncation, select or comparison it must widen on a machine without bf16 conversions (see
#: `converts_bf16`). Compiler-rt defines it; the process here has no compiler-rt, so the JIT gets this.
_BF16_RUNTIME = """
define bfloat @__truncsfbf2(float %x) {
  %bits = bitcast float %x to i32
  %nan = fcmp uno float %x, %x
  %odd = lshr i32 %bits, 16
  %lsb = and i32 %odd, 1
  %bias = add i32 %lsb, 32767
  %rounded = add i32 %bits, %bias
  %high = lshr i32 %rounded, 16
  %quiet = or i32 %bits, 4194304
  %qhigh = lshr i32 %quiet, 16
  %pick = select i1 %nan, i32 %qhigh, i32 %high
  %half = trunc i32 %pick to i16
  %out = bitcast i16 %half to bfloat
  ret bfloat %out
}
"""
_bf16_runtime: Any = None


def _install_bf16_runtime() -> None:
    """JIT `_BF16_RUNTIME` once per process (for the host) and give its address to MCJIT's symbol lookup."""
    global _bf16_runtime
    if _bf16_runtime is not None or hasattr(_process, "__truncsfbf2"):
        return
    llvm = _llvm()
    tm = target_machine(None)
    with _llvm_lock:
        if _bf16_runtime is None:
            engine = llvm.create_mcjit_compiler(llvm.parse_assembly(_BF16_RUNTIME), tm)
            engine.finalize_object()
            llvm.add_symbol("__truncsfbf2", engine.get_function_address("__truncsfbf2"))
            _bf16_runtime = engine


def _resolvable(symbol: str) -> bool:
    return hasattr(_process, symbol) or (symbol == "__truncsfbf2" and _bf16_runtime is not None)


def parse_llvm_ir(text: str | bytes, what: str = "the module") -> Any:
    """An llvmlite module from LLVM IR text, verified; a `CompileError` at stage ``jit`` otherwise."""
    llvm = _llvm()
    try:
        mod = llvm.parse_assembly(text)
        mod.verify()
    except RuntimeError as exc:
        raise CompileError(f"LLVM rejected {what}: {exc}", stage="jit") from exc
    return mod


def jit_in_process(mod: Any, tm: Any, entry: str, globals_: Sequence[str] = (), *,
                   object_sink: Any = None, features: str = "") -> tuple[Any, int, list[int]]:
    """Optimise ``mod`` (O3) for ``tm`` and JIT it with MCJIT: (engine, address of ``entry``, addresses of
    ``globals_``). Every external the code calls must resolve in this process (libm, libc); otherwise
    MCJIT would jump to address 0 at run time, so that is a `CompileError` first. ``object_sink``, if
    given, receives the object file's bytes that MCJIT generated."""
    llvm = _llvm()
    missing = [f.name for f in mod.functions
               if f.is_declaration and not f.name.startswith("llvm.") and not _resolvable(f.name)]
    if missing:
        raise CompileError(f"the code calls {', '.join(missing)}, which this process cannot resolve",
                           stage="jit")
    optimize(llvm, mod, tm)
    bad = illegal_bf16(mod, features)
    if bad is not None:
        raise CompileError(f"the code holds bf16 arithmetic this machine's LLVM back end cannot legalise: {bad}",
                           stage="jit", op=bad.split()[2] if len(bad.split()) > 2 else None)
    _install_bf16_runtime()
    with _llvm_lock:
        engine = llvm.create_mcjit_compiler(mod, tm)
        if object_sink is not None:
            engine.set_object_cache(notify_func=lambda _module, data: object_sink(bytes(data)))
        engine.finalize_object()
        address = engine.get_function_address(entry)
        addresses = [engine.get_global_value_address(g) for g in globals_]
    if not address:
        raise CompileError(f"entry symbol '{entry}' not found after JIT", stage="jit")
    return engine, address, addresses


def jit_jobs() -> int:
    """How many processes compile a large kernel's LLVM IR at once (`split_llvm`): ``PBSDK_JIT_JOBS``, else
    the cores this process may run on. 1 compiles every kernel as one module in this process."""
    value = os.environ.get("PBSDK_JIT_JOBS", "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            raise TargetError(f"PBSDK_JIT_JOBS must be a positive integer, got {value!r}") from None
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


#: Parts per job: more parts than processes, taken from one queue, even out parts of unequal cost
#: (ResNet-50's matmul kernels cost ≈3x their share of the text, its entry function ≈0.3x).
PARTS_PER_JOB = 4


def jit_cached(texts: Sequence[str], spec: ChipSpec | None, entry: str, globals_: Sequence[str] = (), *,
               use_cache: bool = True) -> tuple[Any, int, list[int]]:
    """`jit_in_process` of the LLVM IR ``texts`` (linked into the first) for ``spec``'s machine, through
    the on-disk cache's object files (`pbsdk.core.runtime.cache.CompileCache.get_object`): the machine code
    of identical IR for the same machine is optimised and generated once, and a later load maps it
    (which makes a cache hit of a large model cheap: the LLVM back end is most of a cold compile).
    ``use_cache``: False where the compilation was not to use the cache (the artifact's
    ``object_cache``).

    A large kernel (at least `split_llvm.SPLIT_MIN_BYTES` of IR) on more than one `jit_jobs` is cut into
    `PARTS_PER_JOB` parts per job, compiled by worker processes and this one at once, and linked from
    the object files; the cache then holds all of them under one key."""
    import hashlib

    import llvmlite

    from pbsdk.core.runtime.cache import get_cache

    tm = target_machine(spec)
    jobs = jit_jobs()
    parts = jobs * PARTS_PER_JOB if jobs > 1 and sum(len(t) for t in texts) >= split_llvm.SPLIT_MIN_BYTES else 1
    what: tuple[Any, ...] = (machine(spec), llvmlite.__version__, entry, list(globals_))
    h = hashlib.sha256(repr(what if parts == 1 else (*what, "parts", parts)).encode())
    for text in texts:
        h.update(b"\0" + hashlib.sha256(text.encode()).digest())
    key = h.hexdigest()
    cache = get_cache() if use_cache else None
    obj = cache.get_object(key) if cache is not None else None
    if obj is not None:
        objects = [obj] if parts == 1 else _unpack_objects(obj)
        if objects is not None:
            got = _link_objects(objects, tm, entry, globals_)
            if got[1]:
                return got
    if parts > 1:
        found = split_llvm.scan(texts)
        plan = split_llvm.plan_parts(found, parts) if found is not None and found.size >= split_llvm.SPLIT_MIN_BYTES \
            else ()
        if found is not None and len(plan) > 1:
            _check_externals([n for n in split_llvm.external_functions(found) if not n.startswith("llvm.")])
            try:
                objects = _compile_parts([split_llvm.part_texts(texts, found, p, first=i == 0)
                                          for i, p in enumerate(plan)], spec, tm, jobs)
            except CompileError as exc:
                # A part LLVM rejects: the split's fault or the module's. Compiled whole below, which
                # names the module's own error.
                _log.warning("pbsdk: compiling %s in %d parts failed (%s); compiling it as one module", entry,
                             len(plan), exc)
            else:
                engine, address, addresses = _link_objects(objects, tm, entry, globals_)
                if not address:
                    raise CompileError(f"entry symbol '{entry}' not found after JIT", stage="jit")
                if cache is not None:
                    cache.put_object(key, _pack_objects(objects))
                return engine, address, addresses
    mod = parse_llvm_ir(texts[0])
    for text in texts[1:]:
        mod.link_in(parse_llvm_ir(text, "the parallel glue"))
    made: list[bytes] = []
    engine, address, addresses = jit_in_process(mod, tm, entry, globals_, object_sink=made.append,
                                                features=machine(spec)[2])
    if cache is not None and made:
        cache.put_object(key, made[0] if parts == 1 else _pack_objects(made[:1]))
    return engine, address, addresses


def _check_externals(names: Sequence[str]) -> None:
    missing = [n for n in names if not _resolvable(n)]
    if missing:
        raise CompileError(f"the code calls {', '.join(missing)}, which this process cannot resolve",
                           stage="jit")


def _link_objects(objects: Sequence[bytes], tm: Any, entry: str,
                  globals_: Sequence[str]) -> tuple[Any, int, list[int]]:
    """An MCJIT engine holding ``objects`` (their calls to one another resolved), the address of ``entry``
    (0 if absent) and of ``globals_``."""
    llvm = _llvm()
    _install_bf16_runtime()
    with _llvm_lock:
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), tm)
        for obj in objects:
            engine.add_object_file(llvm.ObjectFileRef.from_data(obj))
        engine.finalize_object()
        address = engine.get_function_address(entry)
        addresses = [engine.get_global_value_address(g) for g in globals_]
    return engine, address, addresses


_OBJECTS_MAGIC = b"PBSDKOBJS1"


def _pack_objects(objects: Sequence[bytes]) -> bytes:
    """Several object files as one cache entry: a magic, their count and lengths, their bytes."""
    head = _OBJECTS_MAGIC + len(objects).to_bytes(4, "big") + b"".join(len(o).to_bytes(8, "big") for o in objects)
    return head + b"".join(objects)


def _unpack_objects(blob: bytes) -> list[bytes] | None:
    """`_pack_objects`' inverse; None if ``blob`` is not such an entry."""
    if not blob.startswith(_OBJECTS_MAGIC):
        return None
    pos = len(_OBJECTS_MAGIC)
    count = int.from_bytes(blob[pos:pos + 4], "big")
    lengths = [int.from_bytes(blob[pos + 4 + 8 * i:pos + 12 + 8 * i], "big") for i in range(count)]
    pos += 4 + 8 * count
    if pos + sum(lengths) != len(blob):
        return None
    out = []
    for n in lengths:
        out.append(blob[pos:pos + n])
        pos += n
    return out


def _compile_parts(parts: Sequence[Sequence[str]], spec: ChipSpec | None, tm: Any, jobs: int) -> list[bytes]:
    """The object file of each part (its texts linked into one module, optimised at O3 for ``tm``): ``jobs
    - 1`` worker processes (`llvm_worker`) and this process take parts from one queue, largest first. A
    part whose worker fails (or cannot start) is compiled here; a part that LLVM rejects here is a
    `CompileError`."""
    import json
    import queue
    import subprocess
    import sys

    llvm = _llvm()
    triple, cpu, features = machine(spec)
    line = json.dumps({"triple": triple, "cpu": cpu, "features": features}).encode() + b"\n"
    order: queue.SimpleQueue[int] = queue.SimpleQueue()
    for i in sorted(range(len(parts)), key=lambda i: -sum(len(t) for t in parts[i])):
        order.put(i)
    objects: list[bytes | None] = [None] * len(parts)

    def take() -> int | None:
        try:
            return order.get_nowait()
        except queue.Empty:
            return None

    def work() -> None:
        try:
            proc = subprocess.Popen([sys.executable, "-I", llvm_worker.__file__], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        except OSError:
            return
        assert proc.stdin is not None and proc.stdout is not None
        try:
            while (i := take()) is not None:
                request = line + b"\0".join(t.encode() for t in parts[i])
                proc.stdin.write(len(request).to_bytes(8, "big") + request)
                proc.stdin.flush()
                head = proc.stdout.read(9)
                if len(head) != 9:
                    return
                reply = proc.stdout.read(int.from_bytes(head[1:], "big"))
                if head[0] == 0:
                    objects[i] = reply
        except OSError:
            return
        finally:
            try:
                proc.stdin.close()
            except OSError:
                pass
            proc.wait()

    threads = [threading.Thread(target=work, daemon=True) for _ in range(jobs - 1)]
    for t in threads:
        t.start()
    while (mine := take()) is not None:
        objects[mine] = _compile_here(llvm, parts[mine], tm, features)
    for t in threads:
        t.join()
    return [o if o is not None else _compile_here(llvm, p, tm, features) for o, p in zip(objects, parts)]


def _compile_here(llvm: Any, texts: Sequence[str], tm: Any, features: str) -> bytes:
    try:
        return compile_object(llvm, texts, tm, features)
    except RuntimeError as exc:
        raise CompileError(f"LLVM rejected a part of the module: {exc}", stage="jit") from exc


#: glibc ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
#: Allocations below this come from the heap (glibc's default starts at 128 KiB and only adapts upward).
#: Above a kernel's largest per-call buffer: a unit kernel's packed B block is up to half an l3 (16 MiB
#: here); at 16 MiB that one was a fresh mmap each call, and an i8 256x4096x4096 with B given per call spent
#: a fifth of its time faulting it in (Zen 4, 1 thread: 149k page faults against 63k, 32.3 -> 29.2 ms).
MMAP_THRESHOLD = 64 << 20
#: Free memory the heap keeps before it is returned to the system.
TRIM_THRESHOLD = 256 << 20
_malloc_tuned = False


def tune_malloc() -> bool:
    """Keep a kernel's per-call temporaries (``memref.alloc`` buffers: packed panels, and intermediate
    activations where the workspace is off, `pbsdk.core.passes.plan_workspace`) on glibc's heap between
    calls, once per process.

    With glibc's defaults, a temporary above the mmap threshold is a fresh ``mmap`` on every call, and a
    freed heap top is trimmed. The next call then page-faults all of its memory in again: 2.0 million
    faults against 0.09 million over the same 8 s of GPT-2-block calls at batch 16, 1.5x the time. This
    sets ``M_MMAP_THRESHOLD`` (`MMAP_THRESHOLD`) and ``M_TRIM_THRESHOLD`` (`TRIM_THRESHOLD`) through
    ``mallopt``, which the benchmark suite's ``MALLOC_*`` environment does from outside.

    It is process-wide, so it is skipped where the user chose for themselves (any ``MALLOC_*_`` variable
    in the environment), with ``PBSDK_MALLOC_TUNING=0``, and off glibc. Returns whether it tuned."""
    global _malloc_tuned
    if _malloc_tuned:
        return True
    if os.environ.get("PBSDK_MALLOC_TUNING", "1") == "0" or any(
            k.startswith("MALLOC_") and k.endswith("_") for k in os.environ):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    _malloc_tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return _malloc_tuned


class EntryCall:
    """The JIT-compiled entry of ``artifact`` at ``address`` as a call on the addresses of its inputs then
    its outputs (then a dynamic entry's sizes buffer, `Artifact`): the constants' addresses
    (`Artifact.constants`, held here) are bound in between, and its workspace (``metadata[WORKSPACE]``
    bytes, `pbsdk.core.passes.plan_workspace`) after the rest.

    Workspaces are made on first need and kept for the next call: a call takes a free one (or a new one
    when every one is in use by a call on another thread), so calls in flight never share one."""

    def __init__(self, artifact: Artifact, address: int) -> None:
        tune_malloc()
        self._constants = tuple(np.asarray(c) for c in artifact.constants)  # keeps their memory alive
        self._bound = tuple(c.ctypes.data for c in self._constants)
        self._n_inputs = len(artifact.inputs)
        self._workspace = int(artifact.metadata.get(WORKSPACE, 0))
        self._free: list[np.ndarray] = []
        sizes = 1 if artifact.metadata.get(DYNAMIC_SIZES) else 0  # a dynamic entry's sizes buffer, after the outputs
        n_args = self._n_inputs + len(self._bound) + len(artifact.outputs) + sizes + (1 if self._workspace else 0)
        self._fn = ctypes.CFUNCTYPE(None, *([ctypes.c_void_p] * n_args))(address)

    def __call__(self, pointers: Sequence[int]) -> None:
        args = list(pointers)
        if self._bound:
            args[self._n_inputs:self._n_inputs] = self._bound
        if not self._workspace:
            self._fn(*args)
            return
        try:
            ws = self._free.pop()  # list.pop and append are atomic: no two calls get one workspace
        except IndexError:
            ws = aligned_empty(self._workspace)
        try:
            self._fn(*args, ws.ctypes.data)
        finally:
            self._free.append(ws)


class CpuExecutable(Executable):
    """A JIT-compiled kernel in this process. Owns its engine; the code is freed with the object."""

    def __init__(self, artifact: Artifact, spec: ChipSpec) -> None:
        payload = artifact.payload if isinstance(artifact.payload, str) else artifact.payload.decode()
        texts = [payload]
        forks = artifact.metadata.get("forks", [])
        if forks:
            texts.append(fork_glue(forks, threaded=_openmp_available()))
        self._texts, self._spec = texts, spec
        missing = missing_host_flags(spec)
        if missing:  # before any code is made: running it would be an illegal instruction, a dead process
            raise DeviceUnavailableError(
                f"the kernel is machine code for spec {spec.name!r}, which needs CPU features this host lacks "
                f"({', '.join(missing)}): compile for spec 'host' to run it here, or export it (pbsdk.export) "
                "for a machine that has them")
        #: What the compilation did with each contraction (`pack_contractions.CONTRACTIONS`): the compile-time
        #: record the conformance suite reads (a bf16 or i8 case on the spec's unit must have used it).
        self.resources: dict[str, Any] = dict(artifact.metadata.get("resources") or {"contractions": []})
        self._engine, address, _ = jit_cached(texts, spec, artifact.entry,
                                              use_cache=bool(artifact.metadata.get("object_cache", True)))
        if artifact.metadata.get("amx"):  # checked once the machine code is made, before any call
            from pbsdk.targets.cpu.tile_kernel import request_amx

            if not request_amx():
                raise DeviceUnavailableError("the kernel uses AMX tiles and Linux did not grant this process "
                                             "their state (arch_prctl ARCH_REQ_XCOMP_PERM)")
        self._fn = EntryCall(artifact, address)

    @property
    def optimized_ir(self) -> str:
        """The LLVM IR after the O3 pipeline the JIT ran (recomputed: a load from the object cache runs
        none)."""
        llvm = _llvm()
        tm = target_machine(self._spec)
        mod = parse_llvm_ir(self._texts[0])
        for text in self._texts[1:]:
            mod.link_in(parse_llvm_ir(text, "the parallel glue"))
        mod.triple, mod.data_layout = tm.triple, str(tm.target_data)
        pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
        pb.getModulePassManager().run(mod, pb)
        return str(mod)

    def run(self, buffers: Sequence[np.ndarray]) -> None:
        self._fn([b.ctypes.data for b in buffers])

    def run_pointers(self, pointers: Sequence[int]) -> None:  # type: ignore[override]
        self._fn(pointers)


class CpuTarget(Target):
    """The host CPU. Correct, simple lowering; the optimising pipeline adds tiling/packing stages."""

    name = "cpu"
    attention_forms = ("lanes",)
    dynamic_shapes = True
    default_spec = "host"
    description = "host CPU: LLVM via llvmlite MCJIT, runs in-process on numpy buffers"
    options_type = CpuOptions
    #: The cpu target's implementation of the hook contract (`pbsdk.targets.cpu.hooks`); a subclass sets its
    #: own module or object and keeps this one's functions for the hooks it does not implement.
    hooks: ClassVar[Any] = _cpu_hooks

    def resolved_hook(self, name: str) -> Any:
        """The function for hook ``name``: the target's ``hooks``' where it implements it
        (`Target.implemented_hooks`, which raises `TargetError` for a misspelt hook), the cpu target's own
        (`pbsdk.targets.cpu.hooks`) otherwise."""
        return getattr(self.hooks if name in self.implemented_hooks() else _cpu_hooks, name)

    def planning_spec(self, spec: ChipSpec, options: Options) -> ChipSpec:
        from pbsdk.targets.cpu.pack_contractions import unit_spec

        return unit_spec(spec, options.target_as(CpuOptions).amx)[0]

    def check_spec(self, spec: ChipSpec) -> None:
        if spec.kind != "cpu":
            raise TargetError(f"target 'cpu' needs a chip spec of kind 'cpu'; '{spec.name}' is a {spec.kind}")

    def stages(self, spec: ChipSpec, options: Options) -> Sequence[Stage]:
        return self.scheduling_stages(spec, options) + lowering_stages(spec, options)

    def scheduling_stages(self, spec: ChipSpec, options: Options) -> tuple[Stage, ...]:
        """The stages that decide how the host runs the kernels: one copy of each repeated kernel, the fused
        attention kernels, packed matmul kernels, row fusion, the fork onto the cores. The core passes
        among them take the cpu options that turn them off as their ``enabled`` field."""
        cpu = options.target_as(CpuOptions)
        return (
            Stage("dedupe-functions", fn=DedupeFunctions().apply,
                  description="kernels of repeated layers (identical but for their names) built once"),
            Stage("attention", fn=AttentionKernels(unit_step=self.resolved_hook("unit_step")).apply,
                  description="fused \"lanes\" attentions (pbsdk.attention declarations) to kernels on vector "
                              "FMAs, and the bf16 unit (hook unit_step) where the plan names it"),
            Stage("pack-contractions", fn=PackContractions(unit_step=self.resolved_hook("unit_step")).apply,
                  description="planned matmuls to packed, register-tiled vector FMA kernels"),
            Stage("depthwise", fn=DepthwiseKernels().apply,
                  description="channels-last depthwise convolutions to register-tiled vector FMA kernels"),
            Stage("direct-conv", fn=DirectConvKernels().apply,
                  description="channels-last convolutions the planner sends to a direct kernel (narrow groups, "
                              "few channels) to register-tiled vector FMA kernels"),
            Stage("fill-borders", fn=FillBorders(enabled=cpu.fill_borders).apply,
                  description="a fill that a later op overwrites in a box (a padded input) fills only the frame"),
            Stage("expose-rows", fn=ExposeRows(enabled=cpu.expose_rows and cpu.fuse_rows).apply,
                  description="leading unit dimensions dropped and strided copies as linalg.copy, for fuse-rows"),
            Stage("fuse-rows", fn=FuseRows(enabled=cpu.fuse_rows).apply,
                  description="runs of row-local ops (softmax, layernorm, ...) row by row, rows over the cores"),
            Stage("collapse-loops", fn=CollapseLoops().apply,
                  description="adjacent loops of elementwise ops that every operand walks contiguously as one"),
            Stage("vectorize-rows", fn=VectorizeRows(enabled=cpu.vectorize_rows).apply,
                  description="row ops' loops (a softmax's max, sum and maps) as vector loops, reductions "
                              "carried in registers"),
            Stage("transpose-blocks", fn=TransposeBlocks(enabled=cpu.transpose_blocks).apply,
                  description="copies that transpose their innermost dimension (NCHW <-> NHWC) as L x L "
                              "blocks through the vector registers"),
            Stage("dynamic-sizes", fn=DynamicSizes().apply,
                  description="dynamic buffers at function boundaries as pointers plus a buffer of their sizes"),
            Stage("lower-parallel", fn=ForallToFork().apply,
                  description="scf.forall over kernel parts to a fork onto the cores (libgomp at load time)"),
            Stage("outline", fn=OutlineLoopNests().apply,
                  description="a long body's loop nests to noinline functions, identical ones built once"),
            Stage("plan-workspace", fn=PlanWorkspace(enabled=cpu.workspace).apply,
                  description="the entry's temporaries as views of one workspace the executable allocates once"),
        )

    def load(self, artifact: Artifact, spec: ChipSpec) -> Executable:
        return CpuExecutable(artifact, spec)


def lowering_stages(spec: ChipSpec, options: Options) -> tuple[Stage, ...]:
    """The stages that lower already-scheduled IR (loops, vectors, memrefs) to LLVM IR for the host JIT,
    deciding nothing: the cpu target's last stages, and what another target's host emulation of its own
    schedule runs (nvgpu's `emulate`)."""
    features = machine(spec)[2]
    amx = "{enable-amx=true}" if resolve_tiles(options.target_as(CpuOptions).amx, features) == "on" else ""
    # Branches carrying AMX tiles (a tile kernel's loop over k) convert with the amx dialect's type conversion.
    cf_to_llvm = "convert-to-llvm{filter-dialects=cf,amx}" if amx else "convert-cf-to-llvm"
    expand = expands_bf16(features)  # arith expands bf16 whole; else only its extensions are widened
    math_ops = ",".join(math_expansions(features))
    expand_bf16 = bf16_expansion(features)
    return (
            Stage("math-approx", fn=MathApprox().apply,
                  description="f32 exp/log/tanh/erf/powf to vectorisable arith polynomials (no libm calls)"),
            Stage("lower-copies", fn=CopiesToLinalg(memcpy_contiguous=True, row_copies=True).apply,
                  description="strided memref.copy to linalg.copy (no runtime library needed), contiguous "
                              "copies to memcpy, strided copies with long contiguous rows to a memcpy per row"),
            Stage("lower-loops", passes="scf-forall-to-for, convert-vector-to-scf, convert-linalg-to-loops, "
                                        "lower-affine, convert-scf-to-cf, canonicalize",
                  description="linalg ops to explicit loops"),
            *(() if expand else (
                Stage("widen-bf16", fn=WidenBf16().apply,
                      description="bf16 -> f32 extensions as bit shifts, so LLVM keeps bf16 ops in f32 "
                                  "and vectorises them"),)),
            Stage("dynamic-expand", fn=DynamicExpand().apply,
                  description="views splitting a dimension into several run-time sizes (b*s -> b, s) as "
                              "reinterpret_casts, which expand-strided-metadata does not take"),
            Stage("lower-llvm",
                  passes=f"func.func(math-expand-ops{{ops={math_ops}}}), convert-math-to-llvm, convert-math-to-libm, "
                         f"convert-vector-to-llvm{amx}, "
                         f"expand-strided-metadata, lower-affine, finalize-memref-to-llvm, {expand_bf16}"
                         "convert-arith-to-llvm, "
                         f"{cf_to_llvm}, convert-func-to-llvm{{use-bare-ptr-memref-call-conv=1}}, "
                         "reconcile-unrealized-casts",
                  description="everything to the LLVM dialect; memrefs become bare pointers"),
            Stage("llvm-ir", fn=_to_llvm_ir, description="LLVM IR text (the artifact)"),
    )
