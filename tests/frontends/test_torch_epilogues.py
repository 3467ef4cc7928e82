"""A linear layer followed by activations that torch traces op by op and that read their input more than once
(leaky ReLU, SiLU, GELU, two Mish in a row: KernelBench level 2's Gemm problems) runs as one packed kernel with
the activations in its epilogue (isolate-contractions' `_epilogue_region`), and matches eager."""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")

from torch import nn


class _LinearThen(nn.Module):
    def __init__(self, *acts: nn.Module) -> None:
        super().__init__()
        self.fc = nn.Linear(48, 40)
        self.acts = nn.Sequential(*acts)

    def forward(self, x):  # type: ignore[no-untyped-def]
        return self.acts(self.fc(x) * 2.0)


def _fused_ops(notes: list[str]) -> int:
    (note,) = [s for s in notes if "packed kernel" in s]
    found = re.search(r"epilogue of (\d+) ops fused", note)
    return int(found[1]) if found else 0


# Fused op counts measured: leaky ReLU 11, SiLU 9, GELU 11 (one converted op: fused before the region too),
# two Mish 39. Without the region: 3, 3, 11, 3; with the chain capped at 12 generics, the two Mish 23.
@pytest.mark.parametrize(("acts", "at_least"), [
    ((nn.LeakyReLU(0.1),), 8),
    ((nn.SiLU(),), 6),
    ((nn.GELU(),), 8),
    ((nn.Mish(), nn.Mish()), 30),
])
def test_activations_run_in_the_linear_kernel(acts, at_least: int, pack_log: list[str]) -> None:  # type: ignore[no-untyped-def]
    torch.manual_seed(0)
    model, x = _LinearThen(*acts).eval(), torch.randn(24, 48)
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(model, backend="pbsdk", options={"compile_options": {"cache": False}})(x)
        want = model(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert _fused_ops(pack_log) >= at_least, pack_log
