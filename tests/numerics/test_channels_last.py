"""NCHW networks kept channels last between their convolutions (`pbsdk.core.ir.layout`), against numpy.

Each network is compiled with the rewrite on (checked to have sent its convolutions to NHWC, so a silent
fallback fails) and off, at awkward sizes (odd images, channel counts off the vector width): the
residual block and its pooling (-inf padding), a global average pool and flatten; a depthwise
convolution with a squeeze-excite scale (a (N, C, 1, 1) twin broadcast over the map); two branches
concatenated along the channels; a flatten of a whole feature map, which needs NCHW back; and grouped
convolutions with a residual add (each runs channels last anyway: as a direct kernel or a batched
contraction over its groups)."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.ir import emit
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(17)


def _w(o: int, c: int, k: int) -> np.ndarray:
    return (RNG.standard_normal((o, c, k, k)) / np.sqrt(c * k * k)).astype(np.float32)


def _v(n: int) -> np.ndarray:
    return RNG.standard_normal((n,)).astype(np.float32)


def _max_pool(x: np.ndarray, k: int, s: int, p: int) -> np.ndarray:
    n, c, h, w = x.shape
    xp = np.full((n, c, h + 2 * p, w + 2 * p), -np.inf, x.dtype)
    xp[:, :, p:p + h, p:p + w] = x
    oh, ow = (h + 2 * p - k) // s + 1, (w + 2 * p - k) // s + 1
    taps = [xp[:, :, i:i + s * (oh - 1) + 1:s, j:j + s * (ow - 1) + 1:s] for i in range(k) for j in range(k)]
    return np.max(taps, axis=0)


C = 7
W1, W2, W3 = _w(C, 5, 3), _w(C, C, 3), _w(12, C, 1)
S1, B1 = _v(C), _v(C)
WD = _w(C, 1, 3)
WR, WE = _w(3, C, 1), _w(C, 3, 1)
WA, WB = _w(4, C, 1), _w(6, C, 3)


def residual(x, lib):
    conv = ops.conv2d if lib is ops else ref.conv2d
    h = lib.relu(lib.add(lib.mul(conv(x, W1, padding=1), S1.reshape(1, C, 1, 1)), B1.reshape(C, 1, 1)))
    h = lib.add(conv(h, W2, padding=1), h)
    h = ops.max_pool(h, 3, 2, padding=1) if lib is ops else _max_pool(h, 3, 2, 1)
    h = conv(h, W3, stride=1)
    return lib.reshape(lib.mean(h, axis=(2, 3)), (h.shape[0], 12))


def depthwise_se(x, lib):
    conv = ops.conv2d if lib is ops else ref.conv2d
    sig = ops.sigmoid if lib is ops else ref.sigmoid
    h = lib.relu(conv(x, W1, padding=1))
    h = conv(h, WD, stride=2, padding=1, groups=C)
    s = lib.mean(h, axis=(2, 3), keepdims=True)
    s = sig(conv(lib.relu(conv(s, WR)), WE))
    return lib.mul(h, s)


def branches(x, lib):
    conv = ops.conv2d if lib is ops else ref.conv2d
    h = lib.relu(conv(x, W1, padding=1))
    a, b = conv(h, WA), conv(h, WB, padding=1)
    cat = ops.concatenate([a, b], axis=1) if lib is ops else np.concatenate([a, b], axis=1)
    return lib.reshape(lib.relu(cat), (cat.shape[0], -1))  # a whole map flattened: NCHW order


WG0, WG1, WG2 = _w(16, 5, 3), _w(16, 4, 3), _w(16, 8, 3)


def grouped(x, lib):
    """RegNet/ResNeXt-like: grouped 3x3 convolutions (groups of 4 and 8 channels) with a residual add."""
    conv = ops.conv2d if lib is ops else ref.conv2d
    h = lib.relu(conv(x, WG0, padding=1))
    g = lib.relu(conv(h, WG1, padding=1, groups=4))
    return lib.add(conv(g, WG2, padding=1, groups=2), h)


NETS = {"residual": (residual, 3, 27), "depthwise_se": (depthwise_se, 4, 56), "branches": (branches, 3, 63),
        "grouped": (grouped, 3, 72)}


@pytest.mark.parametrize("layout", ["planned", "all_nhwc", "off"])
@pytest.mark.parametrize("name", sorted(NETS))
def test_network(name: str, layout: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """``planned``: the cost model's choice (at these sizes some convolutions stay as given, so twins and
    NCHW values meet); ``all_nhwc``: every convolution sent to NHWC (the depthwise one, the squeeze-excite's
    1x1 convolutions of a 1x1 image); ``off``: each convolution decided alone, as before."""
    net, convs, reduction = NETS[name]
    if layout == "all_nhwc":
        monkeypatch.setattr(emit, "layout_decision", lambda spec, options, graph: lambda node, input_nhwc, output_nhwc: True)
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    fn = pbsdk.jit(lambda t: net(t, ops), options={"cache": False, "channels_last": layout != "off"})
    with caplog.at_level(logging.INFO, logger="pbsdk.core.ir.emit"):
        got = fn(x)
    assert_close(got, net(x, ref), op="conv2d", reduction_size=reduction)
    sent = [r.getMessage() for r in caplog.records if "channels last:" in r.getMessage()]
    if layout == "off":
        assert not sent
    else:
        nhwc, kept = map(int, re.match(r"channels last: (\d+) convolution\(s\) in NHWC, (\d+) as given", sent[0]).groups())
        assert nhwc >= 1 and nhwc + kept == convs
        if layout == "all_nhwc":
            assert nhwc == convs


def test_explain_says_what_the_layout_did() -> None:
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    text = pbsdk.jit(lambda t: residual(t, ops)).explain(x)
    assert text.startswith("channels last: ") and "convolution(s) in NHWC" in text
    assert "channels last" not in pbsdk.jit(lambda t: residual(t, ops), options={"channels_last": False}).explain(x)


def test_grouped_convolutions_stay_channels_last(caplog: pytest.LogCaptureFixture) -> None:
    """Grouped convolutions run channels last whichever route they take, so the graph keeps them NHWC with
    their neighbours: one transpose in, one out, none around each grouped convolution."""
    x = RNG.standard_normal((2, 5, 13, 11)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="pbsdk.core.ir.emit"):
        pbsdk.jit(lambda t: grouped(t, ops), options={"cache": False})(x)
    sent = [r.getMessage() for r in caplog.records if "channels last:" in r.getMessage()]
    assert sent and sent[0].startswith("channels last: 3 convolution(s) in NHWC, 0 as given, 2 transpose(s)"), sent
