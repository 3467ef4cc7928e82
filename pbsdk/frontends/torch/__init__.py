"""pbsdk as a ``torch.compile`` backend.

    import torch
    model = torch.compile(model, backend="pbsdk", options={"target": "cpu"})
    y = model(x)

The backend is registered through the ``torch_dynamo_backends`` entry point, so ``backend="pbsdk"``
works without importing pbsdk. Options, fallback and logging: docs/frontends.md and `TorchOptions`.
Set ``PBSDK_LOG=info`` (or configure the ``logging`` logger ``"pbsdk"``) to see one line per op that
falls back to torch.
"""

from __future__ import annotations

from pbsdk.frontends.logs import configure_from_env

configure_from_env()

from pbsdk.frontends.torch.dynamo_backend import (
    CompiledPartition,
    CompileReport,
    TorchOptions,
    backend,
    clear_reports,
    reports,
)

__all__ = ["CompileReport", "CompiledPartition", "TorchOptions", "backend", "clear_reports", "reports"]
