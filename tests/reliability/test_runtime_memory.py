"""The cpu runtime's process-wide memory policy: kernels' per-call temporaries stay on glibc's heap."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize("env, tuned", [({}, True), ({"PBSDK_MALLOC_TUNING": "0"}, False),
                                        ({"MALLOC_ARENA_MAX_": "2"}, False)])
def test_malloc_tuning_applies_once_unless_the_user_chose(env: dict[str, str], tuned: bool) -> None:
    """The cpu runtime keeps kernels' per-call temporaries on the heap (mallopt), except where the user set
    glibc's MALLOC_* variables or PBSDK_MALLOC_TUNING=0."""
    import platform

    if platform.libc_ver()[0] != "glibc":
        pytest.skip("glibc only")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "PBSDK_MALLOC_TUNING"}
    code = "from pbsdk.targets.cpu import tune_malloc; print(tune_malloc(), tune_malloc())"
    out = subprocess.run([sys.executable, "-c", code], env={**clean, **env}, capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == [str(tuned)] * 2
