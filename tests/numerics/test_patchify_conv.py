"""Patch embeddings (stride = kernel, more taps than `PATCHIFY_TAPS`: CLIP ViT-B/32's 32x32) take their
patches by one transpose of the input (`Emitter.patchify`), in both layouts, against numpy: an input the
patches do not cover to the edge (its last rows and columns are dropped), a batch, and the contraction or
the direct kernel behind it."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.ir.emit import PATCHIFY_TAPS
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(32)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("direct_conv", [False, True])
def test_patch_embedding_matches_numpy(layout: str, direct_conv: bool) -> None:
    k = 17
    assert k * k > PATCHIFY_TAPS
    n, c, h, w, o = 2, 3, 2 * k + 4, 3 * k + 2, 8
    if layout == "NCHW":
        x, wt = RNG.standard_normal((n, c, h, w)), RNG.standard_normal((o, c, k, k))
    else:
        x, wt = RNG.standard_normal((n, h, w, c)), RNG.standard_normal((k, k, c, o))
    x, wt = x.astype(np.float32), wt.astype(np.float32)
    got = pbsdk.jit(lambda a, b: ops.conv2d(a, b, stride=k, layout=layout),
                    options={"direct_conv": direct_conv})(x, wt)
    expect = ref.conv2d(x, wt, stride=k, layout=layout)
    assert got.shape == expect.shape == ((n, o, 2, 3) if layout == "NCHW" else (n, 2, 3, o))
    assert_close(got, expect, op="conv2d", reduction_size=c * k * k)
