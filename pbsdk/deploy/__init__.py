"""``pbsdk.export``: a compiled model as one file that runs without the compiler (`pbsdk.runtime`, or the C
API in ``runtime/c``). The format is `pbsdk.runtime.format`'s; docs/deploy.md describes both sides.

Only the cpu target exports today: nvgpu's kernel bundle (``pbsdk compile --target nvgpu -o k.pbsdk``) holds
kernels, not a model, and the template target's emulation needs the compiler at run time; both are refused
with a `TargetError`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pbsdk.core.compiler import CompileRequest
from pbsdk.core.errors import PbsdkError, TargetError, UnsupportedError
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Artifact, Target
from pbsdk.runtime import format as fmt


@dataclasses.dataclass(frozen=True)
class EntryArtifact:
    """One entry to export: its name, its compiled artifact and the names of its inputs and outputs."""

    name: str
    artifact: Artifact
    input_names: tuple[str, ...]
    output_names: tuple[str, ...]
    #: Per input, the dtype callers pass where the code takes another (integers carried as floats), or "".
    input_given: tuple[str, ...] = ()


def carried(given: np.dtype, takes: str, name: str) -> str:
    """The empty string when an input of dtype ``given`` is what the code ``takes``; ``given``'s name when it is
    an integer the code takes as floats (the runtime converts: `pbsdk.runtime.format.TensorDesc.given`);
    otherwise an `UnsupportedError`."""
    if given == np.dtype(takes):
        return ""
    if given.kind in "iub" and np.dtype(takes).kind == "f":
        return given.name
    raise UnsupportedError(f"input {name!r} is {given.name} and pbsdk's kernel takes {takes}; export with inputs of "
                           "the kernel's dtype")


def _check_exportable(request: CompileRequest) -> None:
    from pbsdk.targets.cpu import CpuTarget

    if not isinstance(request.target, CpuTarget):
        raise TargetError(f"export for target {request.target.name!r} is not supported: only the cpu target "
                          "writes deploy artifacts (nvgpu: `pbsdk compile --target nvgpu -o k.pbsdk` bundles "
                          "kernels; template runs under the compiler's emulation)")


def _tensors(types: Sequence[tuple[tuple[int, ...], str]], names: Sequence[str],
             given: Sequence[str] = ()) -> tuple[fmt.TensorDesc, ...]:
    given = list(given) + [""] * (len(types) - len(given))
    return tuple(fmt.TensorDesc(n, tuple(int(d) for d in shape), DTYPE_TO_NUMPY[dt], g)
                 for n, (shape, dt), g in zip(names, types, given))


def write_artifact(path: str | os.PathLike[str], entries: Sequence[EntryArtifact], request: CompileRequest) -> Path:
    """Build each entry's library and write the file (`pbsdk.runtime.format.write`)."""
    from pbsdk.deploy import cpu

    _check_exportable(request)
    if not entries:
        raise PbsdkError("nothing to export: no entries")
    names = [e.name for e in entries]
    if len(set(names)) != len(names) or any(not n.isidentifier() for n in names):
        raise PbsdkError(f"entry names must be distinct identifiers, got {names}")
    payloads: list[tuple[str, Any]] = []
    descs, features, amx = [], set(), False
    for e in entries:
        if any(isinstance(d, str) for shape, _ in (*e.artifact.inputs, *e.artifact.outputs) for d in shape):
            from pbsdk.core.errors import DynamicShapeError

            raise DynamicShapeError(f"entry {e.name} has dynamic sizes; the deployed format and runtime take "
                                    "static shapes (compile the entry for its shape)", stage="deploy")
        lib = cpu.build_library(e.artifact, request.spec)
        features |= set(lib.cpu_features)
        amx = amx or lib.amx
        code = len(payloads)
        payloads.append((f"{e.name}.code", [lib.data]))
        consts = []
        for i, c in enumerate(e.artifact.constants):
            consts.append(len(payloads))
            payloads.append((f"{e.name}.weight{i}", [np.ascontiguousarray(c).reshape(-1).view(np.uint8)]))
        descs.append(fmt.EntryDesc(e.name, cpu.ENTRY_SYMBOL, code, _tensors(e.artifact.inputs, e.input_names, e.input_given),
                                   tuple(consts), _tensors(e.artifact.outputs, e.output_names), lib.workspace))
    machine, system = cpu.platform_of(request.spec)
    manifest = fmt.Manifest(target="cpu", machine=machine, system=system, spec_name=request.spec.name,
                            spec_hash=cpu.spec_hash(request.spec), cpu_features=tuple(sorted(features)),
                            entries=tuple(descs), compiler=cpu.compiler_versions(), amx=amx)
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    fmt.write(str(tmp), manifest, payloads)
    os.replace(tmp, out)  # a reader never sees a half-written file
    return out


def export(obj: Any, example_inputs: Sequence[Any] | Mapping[str, Any], path: str | os.PathLike[str], *,
           target: str | Target | None = None, spec: str | ChipSpec | None = None,
           options: Mapping[str, Any] | None = None, name: str | None = None) -> Path:
    """Compile ``obj`` for ``example_inputs``' shapes and dtypes and write it to ``path`` as one deploy
    artifact that `pbsdk.runtime.load` (or the C API) runs without the compiler. Returns the path.

    ``obj``: a ``pbsdk.jit`` function (or a plain function written with ``pbsdk.ops``), a ``pbsdk.jax.jit``
    function (refused, naming the primitives, when any equation would run in XLA), an ONNX model (a
    path to a ``.onnx`` file, its bytes, a ``ModelProto`` or a ``pbsdk.onnx`` model), or a ``torch.nn.Module``
    (through ``torch.export``; refused, naming the ops, when any op would fall back to torch).
    ``target``/``spec``/``options`` as for ``pbsdk.jit`` (a jit function's own by default); only the cpu
    target exports. ``name`` names the entry (default: the function's or model's name)."""
    from pbsdk.deploy import frontends

    entries, request = frontends.entries_for(obj, example_inputs, target=target, spec=spec, options=options,
                                             name=name)
    return write_artifact(path, entries, request)


__all__ = ["EntryArtifact", "carried", "export", "write_artifact"]
