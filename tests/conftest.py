"""Test groups by what they need: unit (no MLIR), ir (lit + FileCheck), numerics (host JIT), gpu (marker)."""

from __future__ import annotations

import shutil

import pytest


@pytest.fixture(autouse=True, scope="session")
def _isolated_compile_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep the suite's compiled kernels out of the user's ~/.cache/pbsdk (one cache per session)."""
    import os

    if "PBSDK_CACHE_DIR" not in os.environ:
        os.environ["PBSDK_CACHE_DIR"] = str(tmp_path_factory.mktemp("pbsdk-cache"))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--runslow", action="store_true", default=False, help="run long sweeps marked slow")
    parser.addoption("--runrealmodels", action="store_true", default=False,
                     help="run the full-size real models (torchvision, transformers) marked realmodels")
    parser.addoption("--runray", action="store_true", default=False,
                     help="run the tests marked ray (each starts a local Ray: pip install 'pbsdk[ray]')")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip_slow = pytest.mark.skip(reason="long sweep: run with --runslow")
    has_gpu = shutil.which("nvidia-smi") is not None
    skip_gpu = pytest.mark.skip(reason="needs an NVIDIA GPU")
    skip_real = pytest.mark.skip(reason="full-size real model: run with --runrealmodels")
    skip_ray = pytest.mark.skip(reason="starts a local Ray: run with --runray")
    for item in items:
        if "ray" in item.keywords and not config.getoption("--runray"):
            item.add_marker(skip_ray)
        if "realmodels" in item.keywords and not config.getoption("--runrealmodels"):
            item.add_marker(skip_real)
        if "slow" in item.keywords and not config.getoption("--runslow"):
            item.add_marker(skip_slow)
        if "gpu" in item.keywords and not has_gpu:
            item.add_marker(skip_gpu)


@pytest.fixture
def pipeline_runs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """``[n]``: how many times a compilation ran the MLIR pipeline since the test began (a cache hit runs
    none)."""
    from pbsdk.core import compiler

    runs = [0]
    real = compiler.pipeline_for

    def counting(request):  # type: ignore[no-untyped-def]
        runs[0] += 1
        return real(request)

    monkeypatch.setattr(compiler, "pipeline_for", counting)
    return runs


@pytest.fixture
def pack_log(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """A list that collects what the cpu target's ``pack-contractions`` notes on every compilation in this
    test (however it is compiled: `pbsdk.jit`, ``torch.compile``)."""
    import pbsdk.targets.cpu.pack_contractions as pc

    seen: list[str] = []
    real = pc.PackContractions.apply

    def spy(self, module, ctx):  # type: ignore[no-untyped-def]
        real(self, module, ctx)
        seen.extend(ctx.notes.get(self.name, []))

    monkeypatch.setattr(pc.PackContractions, "apply", spy)
    return seen


@pytest.fixture
def pack_notes(pack_log: list[str]):  # type: ignore[no-untyped-def]
    """``pack_notes(fn, options, *inputs, spec=None)``: what the cpu target's ``pack-contractions`` noted while
    ``pbsdk.jit(fn)`` compiled (fully, cache off; for ``spec``, the host's by default) for ``inputs`` (arrays
    or `TensorType`s)."""
    import pbsdk
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.frontends.tracing import input_type

    def notes(fn, options, *inputs, spec=None):  # type: ignore[no-untyped-def]
        pack_log.clear()
        types = tuple(a if isinstance(a, TensorType) else input_type(a, i) for i, a in enumerate(inputs))
        pbsdk.jit(fn, spec=spec, options={"cache": False, **options}).kernel(types)
        return list(pack_log)

    return notes
