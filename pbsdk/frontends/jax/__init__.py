"""pbsdk as a JAX compiler: ``pbsdk.jax.jit(fn, target="cpu")``.

    import pbsdk.jax
    f = pbsdk.jax.jit(fn, target="cpu")
    y = f(x)   # primitives without a converter run in XLA, one log line each with PBSDK_LOG=info

Options, covered primitives, fallback and logging: docs/frontends.md and `jit`. Set ``PBSDK_LOG=info``
(or configure the ``logging`` logger ``"pbsdk"``) to see one line per primitive that falls back to XLA.
"""

from __future__ import annotations

from pbsdk.frontends.logs import configure_from_env

configure_from_env()

from pbsdk.frontends.jax.function import JaxCompileReport, JaxFunction, clear_reports, jit, reports

__all__ = ["JaxCompileReport", "JaxFunction", "clear_reports", "jit", "reports"]
