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

import logging
import os


def _configure_logging() -> None:
    """``PBSDK_LOG=debug|info|warning`` attaches a stderr handler to the ``pbsdk`` logger (once)."""
    level = os.environ.get("PBSDK_LOG")
    logger = logging.getLogger("pbsdk")
    if not level or getattr(logger, "_pbsdk_env_handler", False):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(getattr(logging, level.upper(), logging.INFO))
    logger._pbsdk_env_handler = True  # type: ignore[attr-defined]


_configure_logging()

from pbsdk.frontends.torch.dynamo_backend import (
    CompiledPartition,
    CompileReport,
    TorchOptions,
    backend,
    clear_reports,
    reports,
)

__all__ = ["CompileReport", "CompiledPartition", "TorchOptions", "backend", "clear_reports", "reports"]
