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
    "SCALED_OPS", "TABLE", "Tolerance", "assert_close", "dtype_name", "max_error", "override", "reference",
    "tolerance",
]
