"""``pbsdk.jax``: JAX functions compiled by pbsdk (``pip install 'pbsdk[jax]'``).

    import pbsdk.jax
    f = pbsdk.jax.jit(fn, target="cpu")

A thin re-export of `pbsdk.frontends.jax`; see docs/frontends.md.
"""

from pbsdk.frontends.jax import JaxCompileReport, JaxFunction, clear_reports, jit, reports

__all__ = ["JaxCompileReport", "JaxFunction", "clear_reports", "jit", "reports"]
