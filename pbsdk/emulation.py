"""Run a program on a chip's emulation and read the time it would take there.

The `template` target runs any spec's tiled form on the host and counts what the chip would do (matrix-unit
instructions, vector elements, DMA bytes between levels); `pbsdk.core.plan.chip_time.model_time` turns the
counts into seconds on the chip. `emulate` does both for a `pbsdk.ops` function, `emulate_mlir` for a
module's text; `pbsdk explain --modelled`, `pbsdk dse` and the frontends' reports use them.

    run = emulate(lambda a, b: ops.matmul(a, b), [((512, 512), "bf16")] * 2, spec="example/npu")
    run.modelled.seconds, run.modelled.bound, run.planner_estimate_seconds
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from pbsdk.core.plan.chip_time import ModelledTime, bytes_per_level, modelled_time, planner_estimate
from pbsdk.core.spec import ChipSpec

#: The target whose emulation counts (targets scaffolded from it count the same way).
EMULATION_TARGET = "template"


@dataclasses.dataclass(frozen=True)
class EmulatedRun:
    """One run on the emulated ``spec``: the modelled time, the raw counters, the compile-time resources
    (scratchpad bytes per level, contractions with the planner's estimates), the planner's predicted
    seconds summed over the program's contractions (None without one), and the host's compile time."""

    spec: str
    modelled: ModelledTime
    counters: Mapping[str, int]
    resources: Mapping[str, Any]
    planner_estimate_seconds: float | None
    compile_seconds: float

    def bytes_per_level(self) -> dict[str, int]:
        """DMA bytes each level served (read from or written to)."""
        return bytes_per_level(self.counters)

    def as_dict(self) -> dict[str, Any]:
        return {"spec": self.spec, "modelled": self.modelled.as_dict(), "counters": dict(self.counters),
                "bytes_per_level": self.bytes_per_level(), "planner_estimate_seconds": self.planner_estimate_seconds,
                "scratchpad_bytes": dict(self.resources.get("scratchpad_bytes", {})),
                "compile_seconds": self.compile_seconds}


def random_inputs(types: Sequence[tuple[tuple[int, ...], str]], seed: int = 0) -> list[np.ndarray]:
    """Standard-normal inputs of ``types`` ((shape, dtype) pairs; bf16 as ml_dtypes' bfloat16)."""
    from pbsdk.core.ir.graph import DTYPE_TO_NUMPY

    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(DTYPE_TO_NUMPY[dtype]) for shape, dtype in types]


def emulate(fn: Callable[..., Any], types: Sequence[tuple[tuple[int, ...], str]], *, spec: str | ChipSpec,
            options: Mapping[str, Any] | None = None, seed: int = 0) -> EmulatedRun:
    """Trace ``fn`` (written with `pbsdk.ops`) on inputs of ``types``, compile it for the emulation of
    ``spec``, run it once on random inputs and model the run's time."""
    from pbsdk.core.compiler import compile_text, resolve
    from pbsdk.core.ir.emit import emit_program
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.frontends.jit import trace

    request = resolve(EMULATION_TARGET, spec, options)
    t0 = time.perf_counter()
    graph, _ = trace(fn, tuple(TensorType(tuple(s), d) for s, d in types))
    program = emit_program(graph, spec=request.spec, options=request.options,
                           forms=request.target.attention_forms)
    artifact = compile_text(program.text, request, constants=program.constants)
    return _run(request, artifact, list(types), time.perf_counter() - t0, seed)


def emulate_mlir(text: str, *, spec: str | ChipSpec, options: Mapping[str, Any] | None = None,
                 seed: int = 0) -> EmulatedRun:
    """`emulate` for a module's text (its entry's arguments get random inputs)."""
    from pbsdk.core.compiler import compile_text, resolve

    request = resolve(EMULATION_TARGET, spec, options)
    t0 = time.perf_counter()
    artifact = compile_text(text, request)
    types = [(tuple(s), d) for s, d in artifact.inputs]
    return _run(request, artifact, types, time.perf_counter() - t0, seed)


def _run(request: Any, artifact: Any, types: list[tuple[tuple[int, ...], str]], compile_seconds: float,
         seed: int) -> EmulatedRun:
    from pbsdk.core.runtime.kernel import Kernel

    executable = request.target.load(artifact, request.spec)
    kernel = Kernel(artifact, executable, name="emulated")
    kernel(*random_inputs(types, seed))
    counters = dict(getattr(executable, "last_counters", {}) or {})
    resources = dict(getattr(executable, "resources", {}) or {})
    return EmulatedRun(spec=request.spec.name, modelled=modelled_time(request.spec, counters, resources),
                       counters=counters, resources=resources,
                       planner_estimate_seconds=planner_estimate(resources), compile_seconds=compile_seconds)


def last_modelled_seconds(kernels: Sequence[Any]) -> float | None:
    """The sum of the modelled times of ``kernels``' last runs (`pbsdk.core.runtime.kernel.Kernel`s on a
    target that models time, e.g. template), or None when none of them has one: what a frontend's report
    gives for a whole model."""
    times = [t.seconds for k in kernels
             if (t := getattr(getattr(k, "executable", None), "last_time", None)) is not None]
    return sum(times) if times else None
