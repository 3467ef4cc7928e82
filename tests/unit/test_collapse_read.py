"""`collapse_read`: how an epilogue input is read once its generic runs on the contraction's own loops
(isolate-contractions, an epilogue after the reshape of a convolution's product), checked without IR."""

from __future__ import annotations

from pbsdk.core.passes.isolate_contractions import CollapsedRead, collapse_read

NHWC = [[0, 1, 2], [3]]           # (n, h, w) rows, c columns
NCHW = [[0, 1], [2, 3]]           # (n, c) rows, (h, w) columns


def test_per_channel_vectors_and_full_tensors() -> None:
    ext = [1, 14, 14, 32]
    assert collapse_read(NHWC, ext, [3], [32]) == CollapsedRead(None, (1,))
    assert collapse_read(NHWC, ext, [0, 1, 2, 3], [1, 14, 14, 32]) == CollapsedRead(((0, 1, 2), (3,)), (0, 1))
    # A (1, 1, 1, C) constant read as (d0, 0, 0, d3): d0 has extent 1, so it reads index 0 like a constant.
    assert collapse_read(NHWC, ext, [0, None, None, 3], [1, 1, 1, 32]) == CollapsedRead(((0, 1, 2, 3),), (1,))
    # NCHW: (1, C, 1, 1) per output channel is a row of the product.
    assert collapse_read(NCHW, [1, 32, 7, 7], [0, 1, None, None], [1, 32, 1, 1]) == CollapsedRead(((0, 1, 2, 3),), (0,))
    # A scalar (rank 0) and an all-ones tensor.
    assert collapse_read(NHWC, ext, [], []) == CollapsedRead(None, ())
    assert collapse_read(NHWC, ext, [None, None], [1, 1]) == CollapsedRead((), ())


def test_batches_above_one_need_the_whole_group() -> None:
    ext = [2, 14, 14, 32]
    assert collapse_read(NHWC, ext, [0, 1, 2, 3], [2, 14, 14, 32]) == CollapsedRead(((0, 1, 2), (3,)), (0, 1))
    # d0 now has extent 2: reading (d0, d3) reads part of the row group.
    assert collapse_read(NHWC, ext, [0, None, None, 3], [2, 1, 1, 32]) is None


def test_reads_that_no_collapsed_map_expresses_are_refused() -> None:
    ext = [1, 14, 14, 32]
    assert collapse_read(NHWC, ext, [2], [14]) is None                    # W alone of (n, h, w)
    assert collapse_read(NHWC, ext, [2, 1, 3], [14, 14, 32]) is None       # (w, h): out of order
    # Whole groups in another order are a transposed read: (c, h, w) is (columns, rows).
    assert collapse_read(NHWC, ext, [3, 1, 2], [32, 14, 14]) == CollapsedRead(((0,), (1, 2)), (1, 0))
    assert collapse_read(NHWC, ext, [None, 3], [2, 32]) is None            # a constant index on extent 2
    assert collapse_read(NHWC, ext, [3, 3], [32, 32]) is None              # a group read twice
    assert collapse_read(NHWC, ext, [3], [32, 1]) is None                  # rank and map disagree
