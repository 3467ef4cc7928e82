"""``PBSDK_LOG``: the frontends' switch for their fallback log lines (one per op that runs elsewhere)."""

from __future__ import annotations

import logging
import os


def configure_from_env() -> None:
    """``PBSDK_LOG=debug|info|warning`` attaches a stderr handler to the ``pbsdk`` logger, once per process
    whichever frontend asks first."""
    level = os.environ.get("PBSDK_LOG")
    logger = logging.getLogger("pbsdk")
    if not level or getattr(logger, "_pbsdk_env_handler", False):
        return
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(name)s %(levelname)s: %(message)s"))
    logger.addHandler(handler)
    logger.setLevel(getattr(logging, level.upper(), logging.INFO))
    logger._pbsdk_env_handler = True  # type: ignore[attr-defined]
