"""The first call of a model under ``torch.compile(backend="pbsdk")`` (issue #15): batch-norm models take
the direct inference path, a second compilation of the same model comes from the on-disk cache without
running the MLIR pipeline, a changed weight is a miss (never a stale kernel), and a kernel compiled in
parts by several processes (`pbsdk.targets.cpu.split_llvm`) runs as the whole one does."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from torch import nn

from pbsdk.frontends.torch import dynamo_backend as db
from pbsdk.targets import cpu
from pbsdk.targets.cpu import split_llvm


def _net() -> nn.Module:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics, so that folding them matters
            m.running_mean.uniform_(-0.5, 0.5)
            m.running_var.uniform_(0.5, 2.0)
    return net.eval()


X = torch.randn(1, 3, 8, 8, generator=torch.Generator().manual_seed(1))


def _compiled(model: nn.Module) -> torch.Tensor:
    torch._dynamo.reset()
    with torch.no_grad():
        return torch.compile(model, backend="pbsdk")(X)


@pytest.fixture
def fresh_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("PBSDK_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("PBSDK_CACHE", raising=False)
    monkeypatch.delenv("PBSDK_DISABLE_CACHE", raising=False)
    monkeypatch.delenv("PBSDK_DUMP_DIR", raising=False)
    return tmp_path


def test_batch_norm_model_takes_the_direct_path(monkeypatch: pytest.MonkeyPatch) -> None:
    # native_batch_norm's decomposition leaves dead integer ``empty``s; they must not send the graph
    # through a second trace by AOTAutograd.
    def no_aot(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the graph went through AOTAutograd")

    monkeypatch.setattr(db, "compile_static", no_aot)
    net = _net()
    with torch.no_grad():
        torch.testing.assert_close(_compiled(net), net(X), atol=1e-5, rtol=1e-5)


def test_a_second_compilation_skips_the_pipeline_and_a_changed_weight_does_not(
        fresh_cache: Path, pipeline_runs: list[int]) -> None:
    net = _net()
    with torch.no_grad():
        expected = net(X)
    first = _compiled(net)
    assert pipeline_runs[0] == 1
    torch.testing.assert_close(first, expected, atol=1e-5, rtol=1e-5)
    # The same model again, in a new Dynamo compilation: the cache's hit, no MLIR stage runs.
    again = _compiled(copy.deepcopy(net))
    assert pipeline_runs[0] == 1
    torch.testing.assert_close(again, first, atol=0, rtol=0)
    # One value changed of a weight passed as an operand (hashed by its bytes), or of one small enough to
    # be written into the MLIR text: both are misses and compute with the new value.
    for change in ("conv", "bias"):
        other = copy.deepcopy(net)
        with torch.no_grad():
            if change == "conv":
                other[3].weight[5, 7, 1, 1] += 0.5  # 2304 values: a constant operand, hashed by its bytes
            else:
                other[8].bias[3] += 0.5             # 10 values: inlined into the MLIR text
            want = other(X)
        runs = pipeline_runs[0]
        got = _compiled(other)
        assert pipeline_runs[0] == runs + 1, f"a changed {change} weight must not hit the cache"
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
        assert not torch.equal(got, first)


def test_a_kernel_compiled_in_parts_runs_and_its_objects_are_cached(
        fresh_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PBSDK_JIT_JOBS", "2")
    monkeypatch.setattr(split_llvm, "SPLIT_MIN_BYTES", 0)
    parts: list[int] = []
    real = cpu._compile_parts

    def counting(texts, *args, **kwargs):  # type: ignore[no-untyped-def]
        parts.append(len(texts))
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(cpu, "_compile_parts", counting)
    net = _net()
    with torch.no_grad():
        expected = net(X)
    torch.testing.assert_close(_compiled(net), expected, atol=1e-5, rtol=1e-5)
    assert parts and parts[0] > 1, "the kernel was not split"
    (obj,) = fresh_cache.glob("*.pbsdk-object")
    assert obj.read_bytes()[32:].startswith(cpu._OBJECTS_MAGIC)

    def no_llvm(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the object cache was not used")

    monkeypatch.setattr(cpu, "_compile_parts", no_llvm)
    monkeypatch.setattr(cpu, "jit_in_process", no_llvm)
    torch.testing.assert_close(_compiled(copy.deepcopy(net)), expected, atol=1e-5, rtol=1e-5)
