"""Code for CPU features the host lacks is refused with a typed error before it is made, never run into an
illegal instruction (which kills the process). The host's flags are replaced by a smaller set here, so the
test sees the refusal on any machine."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk.core.errors import DeviceUnavailableError
from pbsdk.core.spec import load_spec
from pbsdk.targets.cpu import missing_host_flags
from pbsdk.testing import cannot_run


@pytest.fixture
def sse2_only(monkeypatch: pytest.MonkeyPatch) -> None:
    from pbsdk.runtime import model

    monkeypatch.setattr(model, "host_cpu_flags", lambda: frozenset({"fpu", "sse", "sse2"}))


def test_code_for_missing_features_is_refused_naming_them(sse2_only: None) -> None:
    spec = load_spec("avx512")
    assert {"avx512f", "avx2", "fma"} <= set(missing_host_flags(spec))
    assert cannot_run("avx512") is not None and "avx512f" in str(cannot_run("avx512"))
    fn = pbsdk.jit(lambda x: x * 2.0, target="cpu", spec="avx512", options={"cache": False})
    with pytest.raises(DeviceUnavailableError, match=r"spec 'intel/xeon-avx512'.*lacks \(.*avx512f.*\)"):
        fn(np.ones(8, np.float32))


def test_the_hosts_own_code_runs() -> None:
    assert missing_host_flags(load_spec("host")) == () and cannot_run("host") is None
    np.testing.assert_array_equal(pbsdk.jit(lambda x: x * 2.0, options={"cache": False})(np.ones(8, np.float32)),
                                  np.full(8, 2.0, np.float32))


def test_the_torch_backend_falls_back_instead(sse2_only: None) -> None:
    import torch

    from pbsdk.frontends import torch as pbsdk_torch

    torch._dynamo.reset()
    pbsdk_torch.clear_reports()
    fn = torch.compile(lambda x: torch.relu(x) * 2, backend="pbsdk", options={"target": "cpu", "spec": "avx512"})
    x = torch.randn(16)
    torch.testing.assert_close(fn(x), torch.relu(x) * 2)  # ran in torch, logged
