"""pbsdk as a JAX compiler: ``pbsdk.jax.jit(fn, target="cpu")``.

    import pbsdk.jax
    f = pbsdk.jax.jit(fn, target="cpu")
    y = f(x)   # primitives without a converter run in XLA, one log line each with PBSDK_LOG=info

Options, covered primitives, fallback and logging: docs/frontends.md and `jit`. Set ``PBSDK_LOG=info``
(or configure the ``logging`` logger ``"pbsdk"``) to see one line per primitive that falls back to XLA.
"""

from __future__ import annotations

import logging
import os


def _configure_logging() -> None:
    """``PBSDK_LOG=debug|info|warning`` attaches a stderr handler to the ``pbsdk`` logger (once; shared
    with the torch frontend, which does the same)."""
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

from pbsdk.frontends.jax.function import JaxCompileReport, JaxFunction, clear_reports, jit, reports

__all__ = ["JaxCompileReport", "JaxFunction", "clear_reports", "jit", "reports"]
