"""What each frontend exports: the entries (`EntryArtifact`) of a jit function, an ONNX model or a torch
module, compiled for one request. Whatever would run outside pbsdk's code (ONNX nodes left to the
reference evaluator, torch ops left to torch) is refused, naming the ops."""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from pbsdk.core.compiler import CompileRequest, resolve
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Target
from pbsdk.deploy import EntryArtifact


def _request(target: str | Target | None, spec: str | ChipSpec | None,
             options: Mapping[str, Any] | None, default: CompileRequest | None = None) -> CompileRequest:
    if default is not None and target is None and spec is None and options is None:
        return default
    return resolve(target if target is not None else "cpu", spec, options)


def _identifier(name: str) -> str:
    return re.sub(r"\W", "_", name).lstrip("_") or "main"


def from_jit(fn: Any, args: Sequence[Any], request: CompileRequest, name: str | None) -> EntryArtifact:
    """A ``pbsdk.jit`` function (or a plain function of ``pbsdk.ops``) compiled for ``args``."""
    from pbsdk.frontends.jit import JitFunction

    jf = fn if isinstance(fn, JitFunction) and fn.request is request else JitFunction(getattr(fn, "fn", fn), request)
    artifact = jf.artifact(jf._signature(tuple(args)))
    try:
        params = list(inspect.signature(jf.fn).parameters)
    except (TypeError, ValueError):
        params = []
    ins = tuple(params[i] if i < len(params) else f"input{i}" for i in range(len(artifact.inputs)))
    outs = tuple(f"output{i}" for i in range(len(artifact.outputs)))
    return EntryArtifact(_identifier(name or str(getattr(jf.fn, "__name__", "main"))), artifact, ins, outs)


def _onnx_model(obj: Any) -> Any:
    """``obj`` as a ``pbsdk.onnx`` model when it is one or an ONNX source; None otherwise."""
    if isinstance(obj, (bytes, bytearray)) or (isinstance(obj, str) and obj.endswith(".onnx")):
        return "load"
    if hasattr(obj, "__fspath__") and str(obj).endswith(".onnx"):
        return "load"
    kind = type(obj).__module__ + "." + type(obj).__name__
    if kind.startswith("onnx.") and type(obj).__name__ == "ModelProto":
        return "load"
    if kind == "pbsdk.onnx.model.OnnxModel":
        return obj
    return None


def from_onnx(model: Any, request: CompileRequest, name: str | None) -> EntryArtifact:
    """An ONNX model converted whole into one kernel (no node left to ``onnx.reference``; the fallback is
    refused). Its inputs and outputs keep their ONNX names and dtypes, which must be ones pbsdk computes in
    (the kernel's carriers)."""
    from pbsdk.core.ir.graph import DTYPE_TO_NUMPY
    from pbsdk.onnx.model import ImportOptions, OnnxModel

    if not isinstance(model, OnnxModel):
        model = OnnxModel(model, request, ImportOptions.parse(None))
    if model.plan.reference:
        ops = sorted({model.infos[s.nodes[0]].op_type for s in model.plan.reference})
        raise UnsupportedError(f"the model runs {len(model.plan.reference)} node(s) through onnx.reference "
                               f"({', '.join(ops)}); an exported model must compile whole", op=", ".join(ops))
    (step,) = model.plan.compiled
    jit, sig, computed = model._jits[id(step)]
    if jit is None or list(computed) != list(model.output_names) or list(step.inputs) != list(model.input_names):
        raise UnsupportedError("the model's outputs are not all computed by its kernel (some are constants "
                               "folded at import); exporting such a model is not supported")
    artifact = jit.artifact(sig)
    from pbsdk.deploy import carried

    given = tuple(carried(np.dtype(onnx_dtype), DTYPE_TO_NUMPY[t.dtype], tname) for tname, t, onnx_dtype in model.inputs)
    for oname, (_, dt) in zip(model.output_names, artifact.outputs):
        want = model._onnx_dtype(oname)
        if want is not None and np.dtype(want) != np.dtype(DTYPE_TO_NUMPY[dt]):
            raise UnsupportedError(f"output {oname!r} is {np.dtype(want).name} in the model and {DTYPE_TO_NUMPY[dt]} "
                                   "in pbsdk's kernel; exporting such models is not supported")
    return EntryArtifact(_identifier(name or model.name), artifact, tuple(model.input_names),
                         tuple(model.output_names), given)


def entries_for(obj: Any, example_inputs: Sequence[Any] | Mapping[str, Any], *, target: str | Target | None,
                spec: str | ChipSpec | None, options: Mapping[str, Any] | None,
                name: str | None) -> tuple[list[EntryArtifact], CompileRequest]:
    """The entries to export for ``obj`` (see `pbsdk.deploy.export`) and the request they were compiled for."""
    from pbsdk.deploy import _check_exportable
    from pbsdk.frontends.jit import JitFunction

    onnx_model = _onnx_model(obj)
    if onnx_model is not None:
        default = onnx_model.request if onnx_model != "load" else None
        request = _request(target, spec, options, default)
        _check_exportable(request)
        return [from_onnx(obj, request, name)], request
    jax_function = sys.modules.get("pbsdk.frontends.jax.function")
    if jax_function is not None and isinstance(obj, jax_function.JaxFunction):
        from pbsdk.deploy.jax_export import from_jax

        request = _request(target, spec, options, obj.request)
        _check_exportable(request)
        args = list(example_inputs.values()) if isinstance(example_inputs, Mapping) else list(example_inputs)
        return [from_jax(obj, args, request, name)], request
    if _is_torch_module(obj):
        from pbsdk.deploy.torch_export import from_torch

        request = _request(target, spec, options)
        _check_exportable(request)
        return [from_torch(obj, example_inputs, request, name)], request
    if isinstance(obj, JitFunction) or callable(obj):
        request = _request(target, spec, options, obj.request if isinstance(obj, JitFunction) else None)
        _check_exportable(request)
        args = list(example_inputs.values()) if isinstance(example_inputs, Mapping) else list(example_inputs)
        return [from_jit(obj, args, request, name)], request
    raise PbsdkError(f"cannot export a {type(obj).__name__}: give a pbsdk.jit function, an ONNX model or a "
                     "torch.nn.Module")


def _is_torch_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)
