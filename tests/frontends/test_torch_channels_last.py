"""Channels-last models and the backend's failure contract (issue #32).

``model.to(memory_format=torch.channels_last)`` — the layout torch's CPU performance guide recommends for
CNNs — compiles and matches eager with no fallback: a strided frozen weight is copied to C order once (a
contiguous one stays zero-copy), a channels-last input is read by logical index. And inside the backend
every exception is a logged fallback: the user's call returns torch's result, never pbsdk's error.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from torch import nn

import pbsdk.frontends.torch as pbsdk_torch
from pbsdk import ops
from pbsdk.core.ir.graph import Graph
from pbsdk.frontends.torch import convert
from pbsdk.frontends.torch import dynamo_backend as db
from pbsdk.frontends.tracing import tracing
from pbsdk.testing import Tolerance, assert_close

CL = torch.channels_last

#: f32 against eager: contractions of length <= 288 (3x3x32) and a 512-long linear, a few ulp each.
F32 = Tolerance(atol=2e-5, rtol=2e-5)
#: bf16 against eager bf16, relative to the output's largest magnitude: eager rounds to bf16 after every
#: op, pbsdk after every fused kernel (tests/models/test_real_models_bf16.py's bound).
BF16_RELATIVE_TO_MAX = 5e-2


@pytest.fixture(autouse=True)
def _fresh_dynamo() -> None:
    torch._dynamo.reset()
    pbsdk_torch.clear_reports()


class _CNN(nn.Module):
    """conv-BN-ReLU-maxpool twice, then a linear over the flattened 32x4x4 map."""

    def __init__(self) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(32 * 4 * 4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.features(x).flatten(1))


def _cnn() -> nn.Module:
    torch.manual_seed(0)
    model = _CNN()
    g = torch.Generator().manual_seed(1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):  # non-trivial statistics, so that folding them matters
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
    return model.eval()


def _assert_no_fallback(*, frozen: bool = True) -> None:
    reports = pbsdk_torch.reports()
    assert reports, "nothing was compiled by pbsdk"
    for report in reports:
        assert report.fallback_ops == () and report.failed_partitions == 0 and report.errors == (), report
        assert report.compiled_ops == report.graph_ops and report.frozen == frozen, report


def _run(model: Callable[..., torch.Tensor], *inputs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        return torch.compile(model, backend="pbsdk")(*inputs), model(*inputs)


# ------------------------------------------------------------------------------------------ constants

def test_const_copies_only_a_strided_array() -> None:
    base = np.random.default_rng(0).standard_normal((8, 3, 3, 16)).astype(np.float32)  # NHWC storage
    strided = base.transpose(0, 3, 1, 2)  # the NCHW view torch's channels-last weight hands to numpy
    contiguous = np.ascontiguousarray(strided)
    with tracing(Graph()) as graph:
        ops._const(contiguous, "f32", copy=False)
        ops._const(strided, "f32", copy=False)
    kept, copied = (n.attrs["value"] for n in graph.nodes)
    # A contiguous weight is held zero-copy (not duplicated in memory); a strided one is copied to C order.
    assert np.shares_memory(kept, contiguous) and not kept.flags.writeable
    assert not np.shares_memory(copied, base) and copied.flags.c_contiguous
    np.testing.assert_array_equal(copied, strided)


# ------------------------------------------------------------------------------------------ channels last

def test_channels_last_conv_relu() -> None:
    torch.manual_seed(2)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).eval().to(memory_format=CL)
    x = torch.randn(2, 3, 10, 10).to(memory_format=CL)
    actual, expected = _run(model, x)
    assert_close(actual.numpy(), expected.numpy(), op="conv2d", tol=F32)
    _assert_no_fallback()


def test_channels_last_and_default_inputs_to_one_channels_last_model() -> None:
    # The same values in either layout give the same result (never the elements in storage order).
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(4, 8, 3), nn.ReLU()).eval().to(memory_format=CL)
    compiled = torch.compile(model, backend="pbsdk")
    x = torch.randn(1, 4, 7, 9)
    with torch.no_grad():
        expected = model(x)
        for layout in (CL, torch.contiguous_format, CL):
            assert_close(compiled(x.to(memory_format=layout)).numpy(), expected.numpy(), op="conv2d", tol=F32)
    _assert_no_fallback()


def test_a_channels_last_input_is_read_in_place(monkeypatch: pytest.MonkeyPatch) -> None:
    # The kernel takes the input's own memory as NHWC (its graph transposes it to NCHW, and channels last
    # across layers turns that into the first convolution's NHWC input): no copy to C order on a call.
    model = _cnn().to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(7)).to(memory_format=CL)
    compiled = torch.compile(model, backend="pbsdk")
    with torch.no_grad():
        expected = model(x)
        compiled(x)
        copies = []
        contiguous = torch.Tensor.contiguous

        def counted(self: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            copies.append(tuple(self.shape))
            return contiguous(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "contiguous", counted)
        actual = compiled(x)
    assert copies == []
    assert_close(actual.numpy(), expected.numpy(), op="small_cnn", tol=F32)
    (report,) = pbsdk_torch.reports()
    assert report.stored_order_inputs == 1
    _assert_no_fallback()


class _TwoOutputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        y = torch.relu(self.conv(x))
        return y, y.mean((2, 3))


def test_a_channels_last_output_is_returned_channels_last() -> None:
    # Eager returns a channels-last convolution's result channels last; so does the compiled model: the
    # kernel writes it NHWC and the caller gets that memory viewed as NCHW (no transpose back, no copy).
    # The 2-D output beside it stays as it was; a held result survives the next call.
    torch.manual_seed(4)
    model = _TwoOutputs().eval().to(memory_format=CL)
    x = torch.randn(2, 3, 12, 11).to(memory_format=CL)
    compiled = torch.compile(model, backend="pbsdk")
    with torch.no_grad():
        expected, pooled = model(x)
        first, first_pooled = compiled(x)
        second, _ = compiled(x * 2)
        expected_second, _ = model(x * 2)
    assert expected.is_contiguous(memory_format=CL)
    assert first.is_contiguous(memory_format=CL) and not first.is_contiguous()
    assert first_pooled.is_contiguous() and first_pooled.shape == (2, 16)
    assert_close(first.numpy(), expected.numpy(), op="conv2d", tol=F32)
    assert_close(first_pooled.numpy(), pooled.numpy(), op="conv2d", tol=F32)
    assert_close(second.numpy(), expected_second.numpy(), op="conv2d", tol=F32)
    _assert_no_fallback()


def test_storage_order_only_for_channels_last_that_is_not_also_contiguous() -> None:
    cl = torch.empty(2, 3, 5, 5).to(memory_format=CL)
    assert db.storage_order(cl) == (0, 2, 3, 1) and cl.permute(0, 2, 3, 1).is_contiguous()
    assert db.storage_order(torch.empty(2, 3, 5, 5)) is None
    assert db.storage_order(torch.empty(2, 1, 5, 5).to(memory_format=CL)) is None  # one channel: both layouts
    assert db.storage_order(torch.empty(2, 3, 5, 5).transpose(2, 3)) is None  # strided, not channels last
    assert db.storage_order(torch.empty(3, 5, 5)) is None


def test_strided_input_to_a_linear() -> None:
    torch.manual_seed(4)
    model = nn.Linear(16, 8).eval()
    x = torch.randn(16, 5).t()  # a transposed view: not contiguous
    actual, expected = _run(model, x)
    assert_close(actual.numpy(), expected.numpy(), op="matmul", tol=F32)
    _assert_no_fallback()


def test_channels_last_cnn_f32() -> None:
    model = _cnn().to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(5)).to(memory_format=CL)
    actual, expected = _run(model, x)
    assert_close(actual.numpy(), expected.numpy(), op="small_cnn", tol=F32)
    _assert_no_fallback()


def test_channels_last_cnn_bf16() -> None:
    # bf16 needs no matrix unit (pbsdk lowers it with or without AVX512-BF16): nothing to skip.
    model = _cnn().to(torch.bfloat16).to(memory_format=CL)
    x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16, memory_format=CL)
    actual, expected = _run(model, x)
    assert actual.dtype == torch.bfloat16
    scale = float(expected.float().abs().max())
    assert scale > 1e-3
    assert_close(actual.float().numpy(), expected.float().numpy(), op="small_cnn",
                 tol=Tolerance(atol=BF16_RELATIVE_TO_MAX * scale, rtol=0.0))
    _assert_no_fallback()


def _resnet(name: str, tol: Tolerance) -> None:
    from pbsdk.testing.real_models import MODELS
    from pbsdk.testing.torchvision import import_torchvision

    try:
        import_torchvision()
    except ImportError as exc:
        pytest.skip(f"torchvision: {exc}")

    model, (x,) = MODELS[name].build(1)
    model = model.eval().to(memory_format=CL)
    actual, expected = _run(model, x.to(memory_format=CL))
    assert float(expected.abs().max()) > 1e-3
    assert_close(actual.numpy(), expected.numpy(), op=name, tol=tol)
    _assert_no_fallback()


def test_channels_last_resnet18() -> None:
    # ~12 s on 2 cores with a cold compile cache: in the default run (tests/models marks "realmodels" the
    # full-size models that take minutes). Its adaptive average pool restrides with as_strided.
    _resnet("resnet18", Tolerance(atol=1e-3, rtol=1e-3))  # tests/models' full-size bound


# ------------------------------------------------------------------------------------------ failures

class _Injected(RuntimeError):
    pass


def _boom(*args: Any, **kwargs: Any) -> Any:
    raise _Injected("injected failure")


#: Where a failure is injected: (module or table, the name replaced by `_boom`, what the log then says).
INJECTIONS = {
    # a converter: its op falls back (the partitioner never sees it as supported)
    "converter": (convert.CONVERTERS, "aten.relu.default", "falls back to torch: the converter raised _Injected"),
    # lowering a partition to pbsdk's graph, and compiling it: that partition runs in torch
    "lowering": (db, "lower_partition", "did not compile and runs in torch: _Injected: injected failure"),
    "compiling": (db, "compile_text", "did not compile and runs in torch: _Injected: injected failure"),
    # partitioning the graph: the whole graph runs in torch
    "partitioning": (db, "compile_aten", "could not be compiled (_Injected: injected failure); it runs in torch"),
    # the first call (the kernel's boundary): the partition runs in torch from then on
    "first_call": (db.OutputPool, "take", "raised when called (_Injected: injected failure); it runs in torch"),
}


@pytest.mark.parametrize("where", INJECTIONS)
def test_an_exception_in_the_backend_is_a_logged_fallback(where: str, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    owner, name, logged = INJECTIONS[where]
    if isinstance(owner, dict):
        monkeypatch.setitem(owner, name, _boom)
    else:
        monkeypatch.setattr(owner, name, _boom)
    torch.manual_seed(7)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    compiled = torch.compile(model, backend="pbsdk")
    with torch.no_grad(), caplog.at_level(logging.INFO, logger="pbsdk"):
        for seed in (8, 9):  # a second call too: a fallen-back partition keeps answering through torch
            x = torch.randn(2, 3, 6, 6, generator=torch.Generator().manual_seed(seed))
            assert_close(compiled(x).numpy(), model(x).numpy(), op="conv2d", tol=F32)
    lines = [r.getMessage() for r in caplog.records if logged in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    (report,) = pbsdk_torch.reports()
    if where == "converter":
        assert report.fallback_ops == ("aten.relu.default",)
    elif where != "first_call":  # a call's failure comes after the report
        assert report.failed_partitions == 1 and report.errors == ("_Injected: injected failure",), report


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_is_not_swallowed(exc: type[BaseException], monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(*args: Any, **kwargs: Any) -> Any:
        raise exc()

    monkeypatch.setattr(db, "lower_partition", interrupted)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    with torch.no_grad(), pytest.raises(exc):
        torch.compile(model, backend="pbsdk")(torch.randn(1, 3, 6, 6))


def test_a_graph_compiled_per_shape_falls_back_at_its_call(monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    # A dynamic-shape graph compiles each new shape inside the user's call (`PerShape`): a failure there
    # was the user's error (issue #32: a channels-last Conv2d raised ValueError at its second batch size).
    monkeypatch.setattr(db, "compile_aten", _boom)
    torch.manual_seed(10)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU()).eval()
    compiled = torch.compile(model, backend="pbsdk", dynamic=True)
    with torch.no_grad(), caplog.at_level(logging.WARNING, logger="pbsdk"):
        for n in (1, 2, 2):
            x = torch.randn(n, 3, 6, 6)
            assert_close(compiled(x).numpy(), model(x).numpy(), op="conv2d", tol=F32)
    lines = [r.getMessage() for r in caplog.records if "_Injected: injected failure" in r.getMessage()]
    assert len(lines) == 2, lines  # once per shape, not per call
    assert all(r.failed_partitions == 1 and r.compiled_ops == 0 for r in pbsdk_torch.reports())


def test_channels_last_model_at_a_second_batch_size() -> None:
    torch.manual_seed(11)
    model = nn.Sequential(nn.Conv2d(16, 32, 3), nn.ReLU()).eval().to(memory_format=CL)
    compiled = torch.compile(model, backend="pbsdk")
    with torch.no_grad():
        for n in (1, 2, 3):  # the second size recompiles with a symbolic batch (`PerShape`)
            x = torch.randn(n, 16, 8, 8).to(memory_format=CL)
            assert_close(compiled(x).numpy(), model(x).numpy(), op="conv2d", tol=F32)
    _assert_no_fallback()


def test_as_strided_restride_converts_and_any_other_stays_with_torch() -> None:
    # adaptive_avg_pool2d's decomposition restrides its mean to channels-last with as_strided: the same
    # elements at the same indices, converted as the identity.
    def restride(x: torch.Tensor) -> torch.Tensor:
        y = x.relu().mean((-1, -2), keepdim=True)  # (2, 8, 1, 1), strides (8, 1, 1, 1)
        return torch.as_strided(y, y.shape, (8, 1, 8, 8)).flatten(1) * 2.0

    x = torch.randn(2, 8, 3, 3, generator=torch.Generator().manual_seed(12))
    actual, expected = _run(restride, x)
    assert_close(actual.numpy(), expected.numpy(), op="mean", tol=F32)
    _assert_no_fallback(frozen=False)  # no parameters


@pytest.mark.parametrize("read", ["windows", "transposed", "overlapping_rows_of_a_view", "strided_input"])
def test_as_strided_that_rereads_storage_is_a_gather(read: str) -> None:
    """Sliding windows, a transposed read, overlapping rows of a slice, a read through a transposed input:
    each element of the result is the input's element at the storage position it names."""
    reads = {
        "windows": (lambda v: torch.as_strided(v.relu(), (5, 4), (2, 1)) * 2.0, (12,)),
        "transposed": (lambda v: torch.as_strided(v.relu(), (4, 3), (1, 4)) * 2.0, (12,)),
        "overlapping_rows_of_a_view": (lambda v: torch.as_strided(v[2:], (3, 4), (3, 1)) + 1.0, (16,)),
        "strided_input": (lambda m: torch.as_strided(m.t(), (3, 2), (1, 4), 1) + 1.0, (3, 4)),
    }
    fn, shape = reads[read]
    v = torch.randn(*shape, generator=torch.Generator().manual_seed(13))
    actual, expected = _run(fn, v)
    assert_close(actual.numpy(), expected.numpy(), op="mul", tol=F32)
    assert all(r.fallback_ops == () for r in pbsdk_torch.reports()), pbsdk_torch.reports()


def test_as_strided_reading_storage_outside_its_input_stays_with_torch() -> None:
    # v[4:] holds storage 4..11; reading from offset 0 names positions no element of it holds.
    def outside(v: torch.Tensor) -> torch.Tensor:
        return torch.as_strided(v[4:], (3,), (1,), 0) * 2.0

    v = torch.randn(12, generator=torch.Generator().manual_seed(14))
    actual, expected = _run(outside, v)
    assert_close(actual.numpy(), expected.numpy(), op="mul", tol=F32)
    assert "aten.as_strided.default" in pbsdk_torch.reports()[0].fallback_ops


def test_storage_indices_against_torch_on_random_layouts() -> None:
    """`_storage_indices` against torch itself: random input layouts (permuted, sliced with a step, offset)
    and random reads inside the storage they cover, each result element the input element torch's
    as_strided reads."""
    rng = np.random.default_rng(21)
    for _ in range(40):
        storage = torch.arange(200, dtype=torch.float32)
        shape = tuple(int(d) for d in rng.integers(1, 5, rng.integers(1, 4)))
        base = storage[int(rng.integers(0, 8)):].as_strided(shape, _dense_strides(shape, rng))
        size = tuple(int(d) for d in rng.integers(1, 4, rng.integers(1, 3)))
        stride = tuple(int(s) for s in rng.integers(0, 3, len(size)))
        offset = int(base.storage_offset() + rng.integers(0, 3))
        want = torch.as_strided(base, size, stride, offset)
        try:
            index = convert._storage_indices(tuple(base.shape), tuple(base.stride()), base.storage_offset(), size,
                                             stride, offset)
        except Exception:  # noqa: BLE001 - a position the input does not hold: torch reads it, pbsdk refuses
            held = {int(v) for v in base.reshape(-1)}
            assert any(int(v) not in held for v in want.reshape(-1))
            continue
        np.testing.assert_array_equal(base.reshape(-1).numpy()[index], want.numpy())


def _dense_strides(shape: tuple[int, ...], rng: np.random.Generator) -> tuple[int, ...]:
    """Strides of a dense layout of ``shape`` in a random dimension order (a permuted contiguous tensor)."""
    order = rng.permutation(len(shape))
    strides = [0] * len(shape)
    step = 1
    for d in order[::-1]:
        strides[d] = step
        step *= shape[d]
    return tuple(strides)
