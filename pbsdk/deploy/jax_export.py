"""A ``pbsdk.jax.jit`` function as one exported entry: its plan for the example arguments must be a single
pbsdk kernel computing every output from the function's inputs (no equation left to XLA, which the deploy
runtime does not have); otherwise an `UnsupportedError` names the primitives."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from pbsdk.core.compiler import CompileRequest
from pbsdk.core.errors import UnsupportedError
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY
from pbsdk.deploy import EntryArtifact, carried
from pbsdk.frontends.jax.function import JaxFunction, KernelStage


def from_jax(fn: JaxFunction, args: Sequence[Any], request: CompileRequest, name: str | None) -> EntryArtifact:
    """The function compiled for ``args`` (positional, no static arguments) as one kernel."""
    if fn.static_argnums:
        raise UnsupportedError("exporting a pbsdk.jax.jit function with static_argnums is not supported")
    jf = fn if fn.request is request else JaxFunction(fn.fn, request, max_signatures=1, output="numpy")
    leaves, treedef, static = jf._split(tuple(args), {})
    plan, _ = jf._compile(leaves, treedef, static)
    if plan.fallbacks:
        counts = Counter(plan.fallbacks)
        listed = ", ".join(f"{p} x{n}" for p, n in sorted(counts.items()))
        raise UnsupportedError(f"{sum(counts.values())} equation(s) would run in XLA, which an exported model "
                               f"cannot: {listed}", op=", ".join(sorted(counts)))
    program = plan.program
    stages = plan.stages
    if len(stages) != 1 or not isinstance(stages[0], KernelStage):
        raise UnsupportedError(f"the function compiles to {len(stages)} stage(s); an export needs exactly one "
                               "pbsdk kernel")
    stage = stages[0]
    if (stage.aliases or any(stage.converted) or stage.inputs != list(program.inputs)
            or stage.outputs != list(program.outputs)):
        raise UnsupportedError("the function's kernel does not take every input and compute every output "
                               "itself (an output is an input or a constant, or is converted after the call); "
                               "exporting such functions is not supported")
    artifact = stage.kernel.artifact
    given = tuple(carried(np.dtype(np.asarray(leaf).dtype), DTYPE_TO_NUMPY[dt], f"input{i}")
                  for i, (leaf, (_, dt)) in enumerate(zip(leaves, artifact.inputs)))
    entry = name or jf._name()
    return EntryArtifact(entry, artifact, tuple(f"input{i}" for i in range(len(artifact.inputs))),
                         tuple(f"output{i}" for i in range(len(artifact.outputs))), given)
