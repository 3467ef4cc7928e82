"""Test support for pbsdk and for conformance suites of new targets: declared tolerances, the one
comparison helper (`assert_close`) and float64 numpy references of every `pbsdk.ops` op.

Pure numpy; importing it does not load MLIR.
"""

from pbsdk.testing import reference
from pbsdk.testing.tolerances import (
    SCALED_OPS,
    TABLE,
    Tolerance,
    assert_close,
    dtype_name,
    max_error,
    override,
    tolerance,
)

__all__ = [
    "SCALED_OPS", "TABLE", "Tolerance", "assert_close", "cannot_run", "dtype_name", "max_error", "override",
    "reference", "tolerance",
]


def cannot_run(spec: object) -> str | None:
    """Why the cpu target's machine code for ``spec`` (a preset's name or a `ChipSpec`) cannot run on this
    host, or None where it can: the CPU features its codegen needs that this host lacks (AVX-512 code on an
    AVX2 machine). A test that executes code for a preset skips on it (compiling and checking the code
    for any CPU works everywhere); the cpu target refuses to load such code with this reason."""
    from pbsdk.core.spec import load_spec
    from pbsdk.targets.cpu import missing_host_flags

    loaded = load_spec(spec) if isinstance(spec, str) else spec
    missing = missing_host_flags(loaded)  # type: ignore[arg-type]
    if not missing:
        return None
    return f"this host lacks {', '.join(missing)}, which code for spec {loaded.name!r} uses"  # type: ignore[attr-defined]
