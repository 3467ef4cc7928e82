"""Running the nvgpu schedule on the host: the tiling, the shared-memory staging and the matrix-unit steps
proven numerically without a GPU.

`emulate` compiles MLIR with the nvgpu target up to its ``schedule`` stage — exactly the IR the GPU
lowering starts from — then makes that IR host code with as little change as possible:

1. buffers in the workgroup address space become ordinary buffers (retyped in place, `drop_workgroup`;
   one per block iteration, as on the GPU);
2. every ``scf.forall`` (blocks, warps, threads) becomes a sequential ``scf.for`` — legal because the
   schedule only relies on the barrier after each thread-level loop, which sequential execution implies;
3. the matrix-unit functions keep their host body (one 16x8x16 ``linalg.matmul``) and are inlined;
4. the cpu target's own stages (``pbsdk.targets.cpu``) lower and JIT it.

The result is called like a kernel: numpy arrays in, numpy arrays out. bf16 arguments and results are
``ml_dtypes.bfloat16`` arrays (the host boundary's bf16 everywhere in pbsdk); a bf16 argument given as
another float array is rounded to bf16 (nearest even) on the way in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_dtypes
import numpy as np

from pbsdk.core.errors import ArgumentError
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY
from pbsdk.core.options import Options

BF16 = np.dtype(ml_dtypes.bfloat16)


def as_bf16(x: Any) -> np.ndarray:
    """``x`` as a C-order ``ml_dtypes.bfloat16`` array (floats rounded to nearest even; NaN stays NaN)."""
    x = np.asarray(x)
    if x.dtype == BF16:
        return np.ascontiguousarray(x)
    if x.dtype == np.uint16:  # raw bit patterns
        return np.ascontiguousarray(x).view(BF16)
    return np.ascontiguousarray(x, dtype=np.float32).astype(BF16)


def to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 (or bfloat16) -> bf16 bit patterns (uint16), rounding to nearest even; NaN stays NaN."""
    return as_bf16(x).view(np.uint16)


def from_bf16_bits(b: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (uint16), or a bfloat16 array, widened to float32."""
    return as_bf16(b).astype(np.float32)


def round_bf16(x: np.ndarray) -> np.ndarray:
    """``x`` rounded to bf16 precision, as float32 (for references)."""
    return from_bf16_bits(to_bf16_bits(np.asarray(x, np.float32)))


def drop_workgroup(module: Any) -> int:
    """Retype the module's workgroup-space buffers (shared memory) to ordinary host memory."""
    from mlir import ir

    from pbsdk.targets.nvgpu.build import workgroup
    from pbsdk.targets.nvgpu.schedule import retype_memory_spaces

    with module.context, ir.Location.unknown():
        ws = workgroup()
        return retype_memory_spaces(module.operation, lambda old: None if old is not None and old == ws else old)


class EmulatedKernel:
    """The nvgpu schedule JIT-compiled for the host."""

    def __init__(self, artifact: Any, executable: Any, scheduled: str, kernels: list[dict[str, Any]]) -> None:
        self.artifact = artifact
        self.executable = executable
        self.scheduled = scheduled  # the schedule-stage IR this kernel runs (for inspection and tests)
        self.kernels = kernels

    def __call__(self, *args: Any) -> Any:
        ins = self.artifact.inputs
        if len(args) != len(ins):
            raise ArgumentError(f"expected {len(ins)} arguments, got {len(args)}")
        buffers = []
        for i, (a, (shape, dtype)) in enumerate(zip(args, ins)):
            a = np.asarray(a)
            if tuple(a.shape) != tuple(shape):
                raise ArgumentError(f"argument {i} has shape {a.shape}, expected {shape}")
            buffers.append(as_bf16(a) if dtype == "bf16" else np.ascontiguousarray(a, DTYPE_TO_NUMPY[dtype]))
        outs = [np.empty(shape, DTYPE_TO_NUMPY[dt]) for shape, dt in self.artifact.outputs]
        self.executable.run(buffers + outs)
        return outs[0] if len(outs) == 1 else tuple(outs)


def emulate(text: str, *, spec: Any = "nvidia/h100", options: Options | Mapping[str, Any] | None = None) -> EmulatedKernel:
    """Compile ``text`` (linalg on tensors) with nvgpu's schedule and JIT it for the host."""
    from mlir import ir, passmanager

    from pbsdk.core.compiler import resolve
    from pbsdk.core.pipeline import Pipeline, StageContext
    from pbsdk.core.spec import load_spec
    from pbsdk.targets.cpu import CpuExecutable, lowering_stages

    request = resolve("nvgpu", spec, options)
    ctx_notes: dict[str, Any] = {}

    # Run the pipeline through `schedule`, keeping the signature the core recorded.
    from pbsdk.core.compiler import pipeline_for

    context = ir.Context()
    module = ir.Module.parse(text, context)
    sctx = StageContext(request.spec, request.options)
    scheduled_module = pipeline_for(request).run(module, sctx, stop_after="schedule")
    scheduled = str(scheduled_module)
    ctx_notes.update(entry=sctx.notes["entry"], inputs=sctx.notes["inputs"], outputs=sctx.notes["outputs"])

    host = scheduled_module
    from pbsdk.core.passes import ops_named

    drop_workgroup(host)
    for call in ops_named(host, "func.call"):  # the unit steps' host bodies are inlined here
        if "no_inline" in call.attributes:
            del call.attributes["no_inline"]
    with host.context:
        passmanager.PassManager.parse(
            "builtin.module(inline, symbol-dce, scf-forall-to-for, canonicalize, "
            "func.func(arith-expand{include-bf16=true}))").run(host.operation)
    host_spec = load_spec("host")
    hctx = StageContext(host_spec, notes=dict(ctx_notes))
    # Only the host's lowering stages: the cpu target's own scheduling (packing, row fusion, threading)
    # would re-schedule the IR whose schedule is what this run is meant to check.
    artifact = Pipeline(lowering_stages(host_spec, hctx.options)).run(host, hctx)
    return EmulatedKernel(artifact, CpuExecutable(artifact, host_spec), scheduled, sctx.notes.get("nvgpu.kernels", []))
