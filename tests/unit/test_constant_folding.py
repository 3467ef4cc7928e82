"""Layout ops on constants fold into new constants when the graph is built (`pbsdk.ops._FOLDABLE`): a frozen
weight's transposes, reshapes, flips and slices are not recomputed on every call. No MLIR."""

from __future__ import annotations

import numpy as np

from pbsdk import ops
from pbsdk.core.dims import Dim
from pbsdk.core.ir.graph import Graph, TensorType
from pbsdk.frontends.jit import trace

TABLE = np.arange(60, dtype=np.float32).reshape(10, 6)


def _live(graph: Graph) -> list[str]:
    return [n.op for n in graph.live_nodes()]


def test_a_strided_slice_of_a_constant_is_a_constant() -> None:
    graph, _ = trace(lambda: ops.flip(ops.slice(ops.slice(ops._const(TABLE, "f32"), 0, 1, 9, 3), 1, 5, None), 0), ())
    assert _live(graph) == ["const"]
    np.testing.assert_array_equal(graph.live_nodes()[0].attrs["value"], TABLE[1:9:3, 5:][::-1])


def test_a_slice_at_a_run_time_position_is_not_folded() -> None:
    # A table read at a position known only at run time (a cache length): a slice node stays; its start
    # cannot index the constant now.
    s0 = Dim.parse("s0")
    graph, _ = trace(lambda x: ops.add(x, ops.slice(ops._const(TABLE, "f32"), 0, s0 - 1, s0)),
                     (TensorType((s0, 6), "f32"),))
    row = next(n for n in graph.live_nodes() if n.op == "slice")
    assert row.out.shape == (1, 6)
