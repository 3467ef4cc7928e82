"""``pbsdk.onnx.Backend``: pbsdk as an ONNX backend (``onnx.backend.base.Backend``), so the official backend
tests run against any installed target.

The target and spec come from ``prepare``'s keyword arguments (``target=``, ``spec=``, ``options=``), else
from the environment (``PBSDK_ONNX_TARGET``, ``PBSDK_ONNX_SPEC``), else the class attributes (``cpu`` and
its default spec). ``Backend.for_target("template")`` is a subclass bound to one target.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import onnx
import onnx.backend.base

from pbsdk.onnx.model import OnnxModel, load


class BackendRep(onnx.backend.base.BackendRep):
    def __init__(self, model: OnnxModel) -> None:
        self.model = model

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        if isinstance(inputs, dict):
            feeds = inputs
        else:
            arrays = [inputs] if isinstance(inputs, np.ndarray) else list(inputs)
            feeds = dict(zip(self.model.input_names, arrays))
        return tuple(self.model.run(feeds))


class Backend(onnx.backend.base.Backend):
    target: str | None = None
    spec: str | None = None

    @classmethod
    def for_target(cls, target: str, spec: str | None = None) -> type[Backend]:
        return type(f"Backend_{target}", (cls,), {"target": target, "spec": spec})

    @classmethod
    def _choice(cls, kwargs: dict[str, Any]) -> tuple[str, str | None]:
        target = kwargs.pop("target", None) or cls.target or os.environ.get("PBSDK_ONNX_TARGET") or "cpu"
        spec = kwargs.pop("spec", None) or cls.spec or os.environ.get("PBSDK_ONNX_SPEC") or None
        return target, spec

    @classmethod
    def is_compatible(cls, model: Any, device: str = "CPU", **kwargs: Any) -> bool:
        return cls.supports_device(device)

    @classmethod
    def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> BackendRep:
        target, spec = cls._choice(kwargs)
        options = kwargs.pop("options", None)
        kwargs.pop("rtol", None), kwargs.pop("atol", None)
        return BackendRep(load(model, target=target, spec=spec, options=options, **kwargs))

    @classmethod
    def run_model(cls, model: Any, inputs: Any, device: str = "CPU", **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: Any, inputs: Any, device: str = "CPU", outputs_info: Any = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        """One node on numpy inputs: wrapped in a model whose input types are the arrays'."""
        arrays = [np.asarray(a) for a in inputs]
        ins = [onnx.helper.make_tensor_value_info(n, onnx.helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
               for n, a in zip(node.input, arrays)]
        outs = [onnx.helper.make_empty_tensor_value_info(n) for n in node.output]
        graph = onnx.helper.make_graph([node], "node", ins, outs)
        model = onnx.helper.make_model(graph)
        # the outputs' types are left to shape inference, which the checker does not accept: skip it here
        return cls.run_model(model, arrays, device, check=False, **kwargs)

    @classmethod
    def supports_device(cls, device: str) -> bool:
        """pbsdk runs on the host (``CPU``); a target's own device is chosen by the target, not ONNX's name."""
        return device == "CPU"
