"""`pbsdk.core.ir.layout.channels_last` on traced graphs (no MLIR): which convolutions go to NHWC, what
runs on their NHWC twins, and where transposes are left. The numerics are in
tests/numerics/test_channels_last.py."""

from __future__ import annotations

from collections import Counter

import numpy as np

from pbsdk import ops
from pbsdk.core.ir.graph import Graph, TensorType
from pbsdk.core.ir.layout import channels_last
from pbsdk.frontends.tracing import Tensor, tracing

RNG = np.random.default_rng(3)


def _trace(fn, *shapes: tuple[int, ...]) -> Graph:
    graph = Graph()
    with tracing(graph):
        args = [Tensor(graph.add("input", [], TensorType(s, "f32")), graph) for s in shapes]
        out = fn(*args)
        graph.outputs = [o.value for o in (out if isinstance(out, tuple) else (out,))]
    return graph


def _w(o: int, c: int, k: int) -> np.ndarray:
    return RNG.standard_normal((o, c, k, k)).astype(np.float32)


W1, W2, W3 = _w(16, 8, 3), _w(16, 16, 3), _w(32, 16, 1)
SCALE = RNG.standard_normal((16,)).astype(np.float32)


def block(x):
    """conv-BN-ReLU, conv, residual add, maxpool with padding, 1x1 conv, global average pool, flatten."""
    h = ops.relu(ops.add(ops.mul(ops.conv2d(x, W1, padding=1), SCALE.reshape(1, 16, 1, 1)), SCALE.reshape(16, 1, 1)))
    h = ops.add(ops.conv2d(h, W2, padding=1), h)
    h = ops.max_pool(h, 3, 2, padding=1)
    h = ops.conv2d(h, W3)
    return ops.reshape(ops.mean(h, axis=(2, 3)), (2, 32))


def _ops(graph: Graph) -> Counter:
    return Counter(n.op for n in graph.live_nodes())


def test_every_conv_nhwc_one_transpose_in() -> None:
    g = _trace(block, (2, 8, 12, 12))
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: True)
    assert report.convs_nhwc == 3 and report.convs_kept == 0
    convs = [n for n in new.live_nodes() if n.op == "conv2d"]
    assert [n.attrs["layout"] for n in convs] == ["NHWC"] * 3
    assert convs[0].inputs[1].shape == (3, 3, 8, 16)  # weights (KH, KW, C, O), a new constant
    # The image is transposed once; the pooling, the BatchNorm, the residual add and the global pool
    # run on NHWC twins, and the flatten of (N, C) needs nothing back.
    assert report.transposes == 1
    transposes = [n for n in new.live_nodes() if n.op == "transpose"]
    assert transposes[0].inputs[0] is g.inputs[0]
    assert new.outputs == g.outputs and new.inputs == g.inputs
    reduce = next(n for n in new.live_nodes() if n.op == "reduce_sum")
    assert reduce.attrs["axes"] == (1, 2) and reduce.out is next(n for n in g.nodes if n.op == "reduce_sum").out


def test_nothing_chosen_leaves_the_graph() -> None:
    g = _trace(block, (2, 8, 12, 12))
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: False)
    assert new is g and report.convs_kept == 3 and report.convs_nhwc == 0


def test_decide_sees_whether_the_input_is_nhwc() -> None:
    seen = []

    def decide(node, input_nhwc, output_nhwc):
        seen.append((input_nhwc, output_nhwc))
        return True

    # Every convolution's result reaches only ops that run on twins (the next convolution, the pooling,
    # the global pool whose (N, C) result is the same in both layouts).
    channels_last(_trace(block, (2, 8, 12, 12)), decide)
    assert seen == [(False, True), (True, True), (True, True)]


def test_a_result_flattened_whole_is_needed_in_nchw() -> None:
    seen = []

    def flat(x):
        return ops.reshape(ops.relu(ops.conv2d(x, W1, padding=1)), (2, 16 * 12 * 12))

    def decide(node, input_nhwc, output_nhwc):
        seen.append(output_nhwc)
        return False

    channels_last(_trace(flat, (2, 8, 12, 12)), decide)
    channels_last(_trace(lambda x: ops.relu(ops.conv2d(x, W1, padding=1)), (2, 8, 12, 12)), decide)
    assert seen == [False, False]  # a flatten of the whole map; a graph output


def test_a_conv_left_nchw_gets_its_input_back() -> None:
    # Only the first convolution goes to NHWC: the second reads its input in NCHW, so the twin is
    # transposed back right before it; the residual add then has one NHWC and one NCHW operand.
    g = _trace(block, (2, 8, 12, 12))
    first = next(n for n in g.nodes if n.op == "conv2d")
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: node is first)
    assert report.convs_nhwc == 1 and report.convs_kept == 2
    order = [n for n in new.live_nodes() if n.op in ("conv2d", "transpose")]
    assert [(n.op, n.attrs.get("layout"), n.attrs.get("perm")) for n in order[:4]] == [
        ("transpose", None, (0, 2, 3, 1)), ("conv2d", "NHWC", None), ("transpose", None, (0, 3, 1, 2)),
        ("conv2d", "NCHW", None)]


def test_an_op_it_does_not_know_reads_nchw() -> None:
    # A flatten of a whole feature map (not only unit dimensions) needs the NCHW order back.
    def flat(x):
        return ops.reshape(ops.relu(ops.conv2d(x, W1, padding=1)), (2, 16 * 12 * 12))

    g = _trace(flat, (2, 8, 12, 12))
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: True)
    assert report.transposes == 2
    live = new.live_nodes()
    assert [n.attrs["perm"] for n in live if n.op == "transpose"] == [(0, 2, 3, 1), (0, 3, 1, 2)]
    back = next(n for n in live if n.op == "transpose" and n.attrs["perm"] == (0, 3, 1, 2))
    assert next(n for n in live if n.op == "reshape").inputs[0] is back.out


def test_no_nchw_conv_no_work() -> None:
    g = _trace(lambda x: ops.relu(x), (2, 8, 4, 4))
    assert channels_last(g, lambda node, input_nhwc, output_nhwc: True)[0] is g


def test_an_input_in_nhwc_storage_needs_no_transpose() -> None:
    # The torch frontend takes a channels-last input in its storage order and transposes it to NCHW in the
    # graph (`dynamo_backend.storage_order`): that transpose is the first convolution's twin input, so the
    # network runs channels last from its input on, with no transpose at all for a classifier.
    g = _trace(lambda x: block(ops.transpose(x, (0, 3, 1, 2))), (2, 12, 12, 8))
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: True)
    assert report.convs_nhwc == 3 and report.transposes == 0
    first = next(n for n in new.live_nodes() if n.op == "conv2d")
    assert first.inputs[0] is g.inputs[0]
    assert new.outputs == g.outputs


def test_a_block_that_runs_channels_last_between_convs_costs_no_transpose() -> None:
    # ConvNeXt's block: conv (NCHW), permute to NHWC, per-channel ops on the last axis, permute back, residual
    # add. With the conv in NHWC, the permute to NHWC is the conv's twin and the permute back gives a value
    # whose twin is its operand: the only transposes left are the image's and the output's.
    scale = RNG.standard_normal((16,)).astype(np.float32)

    def convnext_like(x):
        h = ops.conv2d(x, W1, padding=1)
        t = ops.relu(ops.mul(ops.transpose(h, (0, 2, 3, 1)), scale))
        return ops.conv2d(ops.add(ops.transpose(t, (0, 3, 1, 2)), h), W2, padding=1)

    seen = []

    def decide(node, input_nhwc, output_nhwc):
        seen.append(output_nhwc)
        return True

    g = _trace(convnext_like, (2, 8, 12, 12))
    new, report = channels_last(g, decide)
    assert seen == [True, False]  # the first conv's result is read through the permute; the second is the output
    assert report.convs_nhwc == 2
    perms = [n.attrs["perm"] for n in new.live_nodes() if n.op == "transpose"]
    assert perms == [(0, 2, 3, 1), (0, 3, 1, 2)]
    mul = next(n for n in new.live_nodes() if n.op == "mul")
    assert next(n for n in new.live_nodes() if n.op == "conv2d").out is mul.inputs[0]


def test_a_transpose_of_a_conv_kept_nchw_stays() -> None:
    def permuted(x):
        return ops.relu(ops.transpose(ops.conv2d(x, W1, padding=1), (0, 2, 3, 1)))

    g = _trace(permuted, (2, 8, 12, 12))
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: False)
    assert new is g and report.convs_kept == 1


def test_ops_on_a_channels_last_input_run_as_it_lies() -> None:
    # No convolution at all: a channels-last input viewed as NCHW, an elementwise op, the result wanted back
    # channels last (as the torch frontend returns it). The op runs on the input itself: no transpose left.
    g = _trace(lambda x: ops.transpose(ops.mul(ops.transpose(x, (0, 3, 1, 2)), 2.0), (0, 2, 3, 1)), (1, 6, 6, 8))
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: True)
    assert report.transposes == 0 and report.convs_nhwc == 0
    assert _ops(new)["transpose"] == 0
    mul = next(n for n in new.live_nodes() if n.op == "mul")
    assert mul.inputs[0] is g.inputs[0] and new.outputs == [mul.out]


def test_without_a_conv_a_rewrite_that_adds_transposes_is_not_kept() -> None:
    # The channels-last input meets an NCHW one: computing the add in NHWC would transpose the other operand
    # and the result back (two transposes for one): the graph stays as it was.
    g = _trace(lambda x, y: ops.add(ops.transpose(x, (0, 3, 1, 2)), y), (1, 6, 6, 8), (1, 8, 6, 6))
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: True)
    assert new is g and report.transposes == 0


def test_an_interleave_runs_on_twins() -> None:
    # A transposed convolution's phases (NCHW convolutions sent to NHWC) are woven into the output on their
    # twins: its spatial axes and strides move to NHWC's positions, and no transpose sits between.
    w = RNG.standard_normal((8, 4, 3, 3)).astype(np.float32)
    g = _trace(lambda x: ops.relu(ops.conv_transpose(ops.transpose(x, (0, 3, 1, 2)), w, stride=2, padding=1,
                                                     output_padding=1)), (1, 5, 5, 8))
    assert _ops(g)["interleave"] == 1 and _ops(g)["reshape"] == 0  # no stacking of the phases
    new, report = channels_last(g, lambda node, input_nhwc, output_nhwc: True)
    weave = next(n for n in new.live_nodes() if n.op == "interleave")
    assert weave.attrs["axes"] == (1, 2) and weave.attrs["strides"] == (2, 2)
    assert weave.out.shape == (1, 10, 10, 4)
    assert report.convs_nhwc == 4 and report.transposes == 1  # the result, back to NCHW for the graph's output
