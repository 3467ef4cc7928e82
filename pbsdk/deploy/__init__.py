"""``pbsdk.export``: a compiled model as one file that runs without the compiler (`pbsdk.runtime`, or the C
API in ``runtime/c``). The format is `pbsdk.runtime.format`'s; docs/deploy.md describes both sides.

Three kinds of code are exported (`runtime_target`): the cpu target's (a shared library for the spec's
machine), the template target's and every target derived from it (its emulation: a shared library for the
host, since the emulated chip runs on the host), and nvgpu's (the kernels' cubin/PTX and launch plan, run
through the CUDA driver). Other targets are refused with a `TargetError`.
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


def runtime_target(target: Target) -> str:
    """The runtime path that runs ``target``'s code, recorded as the manifest's ``target``: "cpu" (a
    `CpuTarget`), "template" (a `TemplateTarget`, e.g. one scaffolded by ``pbsdk new-target``) or "nvgpu" (an
    `NvgpuTarget`); a `TargetError` for any other target."""
    from pbsdk.targets.cpu import CpuTarget
    from pbsdk.targets.nvgpu import NvgpuTarget
    from pbsdk.targets.template import TemplateTarget

    for cls, name in ((CpuTarget, "cpu"), (TemplateTarget, "template"), (NvgpuTarget, "nvgpu")):
        if isinstance(target, cls):
            return name
    raise TargetError(f"export for target {target.name!r} is not supported: the deploy runtime runs the code of "
                      "the cpu, template (and targets derived from it) and nvgpu targets")


def _check_exportable(request: CompileRequest) -> None:
    runtime_target(request.target)


def _tensors(types: Sequence[tuple[tuple[int, ...], str]], names: Sequence[str],
             given: Sequence[str] = ()) -> tuple[fmt.TensorDesc, ...]:
    given = list(given) + [""] * (len(types) - len(given))
    return tuple(fmt.TensorDesc(n, tuple(int(d) for d in shape), DTYPE_TO_NUMPY[dt], g)
                 for n, (shape, dt), g in zip(names, types, given))


def _check_static(e: EntryArtifact) -> None:
    if any(isinstance(d, str) for shape, _ in (*e.artifact.inputs, *e.artifact.outputs) for d in shape):
        from pbsdk.core.errors import DynamicShapeError

        raise DynamicShapeError(f"entry {e.name} has dynamic sizes; the deployed format and runtime take "
                                "static shapes (compile the entry for its shape)", stage="deploy")


Payloads = list[tuple[str, Any]]


def _host_entries(entries: Sequence[EntryArtifact], request: CompileRequest, family: str,
                  payloads: Payloads) -> tuple[list[fmt.EntryDesc], dict[str, Any]]:
    """Each entry's shared library (for the spec's machine on cpu; for this host on template, whose
    emulation runs here) and weights as payloads; the entries' descriptions and the manifest's platform."""
    from pbsdk.deploy import cpu

    spec = request.spec if family == "cpu" else None
    descs, features, amx = [], set(), False
    for e in entries:
        if e.artifact.kind != "llvm-ir":
            raise TargetError(f"target {request.target.name!r} emitted a {e.artifact.kind!r} artifact for {e.name}; "
                              "a host export takes LLVM IR (its final_emission must keep the template's)")
        lib = cpu.build_library(e.artifact, spec)
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
    machine, system = cpu.platform_of(spec)
    return descs, {"machine": machine, "system": system, "cpu_features": tuple(sorted(features)), "amx": amx}


def _device_entries(entries: Sequence[EntryArtifact], payloads: Payloads) -> tuple[list[fmt.EntryDesc], dict[str, Any]]:
    """Each entry's images and weights as payloads, its launch plan in its description (`deploy.nvgpu`)."""
    from pbsdk.deploy.nvgpu import device_code

    descs, archs = [], set()
    for e in entries:
        if e.artifact.constants:
            raise PbsdkError(f"the nvgpu artifact of {e.name} has constants outside its bundle")
        code = device_code(e.artifact, e.name)
        first = len(payloads)
        payloads.extend((name, [data]) for name, data in code.payloads)
        plan = code.placed(first)
        weights = tuple(b.section for b in plan.buffers if b.role == "weight")
        descs.append(fmt.EntryDesc(e.name, e.name, plan.images[0][1],
                                   _tensors(e.artifact.inputs, e.input_names, e.input_given), weights,
                                   _tensors(e.artifact.outputs, e.output_names), 0, plan))
        archs.add(code.arch)
    if len(archs) != 1:
        raise PbsdkError(f"the entries were compiled for several GPU architectures: {sorted(archs)}")
    return descs, {"machine": archs.pop(), "system": "cuda", "cpu_features": (), "amx": False}


def write_artifact(path: str | os.PathLike[str], entries: Sequence[EntryArtifact], request: CompileRequest) -> Path:
    """Build each entry's code and write the file (`pbsdk.runtime.format.write`)."""
    from pbsdk.deploy import cpu

    family = runtime_target(request.target)
    if not entries:
        raise PbsdkError("nothing to export: no entries")
    names = [e.name for e in entries]
    if len(set(names)) != len(names) or any(not n.isidentifier() for n in names):
        raise PbsdkError(f"entry names must be distinct identifiers, got {names}")
    for e in entries:
        _check_static(e)
    payloads: Payloads = []
    descs, platform = (_device_entries(entries, payloads) if family == "nvgpu"
                       else _host_entries(entries, request, family, payloads))
    manifest = fmt.Manifest(target=family, spec_name=request.spec.name, spec_hash=cpu.spec_hash(request.spec),
                            entries=tuple(descs), compiler=cpu.compiler_versions(),
                            target_name=request.target.name if request.target.name != family else "", **platform)
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
    ``target``/``spec``/``options`` as for ``pbsdk.jit`` (a jit function's own by default): cpu, template
    (or a target derived from it) or nvgpu (`runtime_target`). ``name`` names the entry (default: the function's or model's name)."""
    from pbsdk.deploy import frontends

    entries, request = frontends.entries_for(obj, example_inputs, target=target, spec=spec, options=options,
                                             name=name)
    return write_artifact(path, entries, request)


__all__ = ["EntryArtifact", "carried", "export", "runtime_target", "write_artifact"]
