"""Channels last across layers: a graph's NCHW convolutions and the ops between them rewritten to NHWC.

Deciding a convolution's layout alone (`pbsdk.core.plan.window.nchw_conv_layout`) charges every NHWC
convolution a transpose of its input and of its result; between two convolutions that both run in NHWC,
those two transposes undo each other, and an elementwise op between them (BatchNorm, ReLU, a residual
add) computes the same in either layout. `channels_last` rewrites the graph so that they are never made:

- a convolution that ``decide(node, input_is_nhwc)`` sends to NHWC becomes an NHWC ``conv2d`` (its
  weights (O, C, KH, KW) -> (KH, KW, C, O): a new constant when they are one, else a transpose) whose
  result is the NHWC *twin* of the NCHW value it replaces;
- an op whose operands have twins computes its own twin: elementwise ops (operands of the full shape
  through their twins, per-channel and other broadcast operands reshaped or transposed to match), slices,
  concatenations and interleaves (their axes permuted: the padding and window taps of a pooling, the
  output phases of a transposed convolution), reductions whose
  kept axes keep their order (a global average pool gives the NCHW result itself), and reshapes that only
  drop unit dimensions (``(N, C, 1, 1) -> (N, C)``, the same bytes in both layouts);
- any other op that reads a value which exists only as a twin gets an NCHW copy (``transpose``) made just
  before it, and so do the graph's outputs.

The transposes it adds carry ``fuse``: the emitter builds them as elementwise generics, which fuse with
the elementwise ops that produce or use them.

So a network's activations stay NHWC from its first convolution to its head, with one transpose in and
none out for a classifier. Nothing here builds IR; the emitter (`pbsdk.core.ir.emit`) sees NHWC
convolutions as if a frontend had given them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from pbsdk.core.ir.graph import BINARY_OPS, COMPARE_OPS, UNARY_OPS, Graph, Node, TensorType, Value

#: Axis permutations: ``nhwc = nchw.transpose(TO_NHWC)``, ``nchw = nhwc.transpose(TO_NCHW)``.
TO_NHWC = (0, 2, 3, 1)
TO_NCHW = (0, 3, 1, 2)
#: Weights (O, C, KH, KW) -> (KH, KW, C, O).
WEIGHTS_TO_HWCO = (2, 3, 1, 0)

_ELEMENTWISE = UNARY_OPS | BINARY_OPS | COMPARE_OPS | {"select", "cast"}
#: Where NCHW axis ``a`` sits in NHWC.
_NHWC_AXIS = tuple(TO_NHWC.index(a) for a in range(4))

#: ``decide(conv_node, input_nhwc, output_nhwc)``: whether an NCHW convolution runs in NHWC, given whether
#: its input already has an NHWC twin and whether every use of its result can take the twin.
Decide = Callable[[Node, bool, bool], bool]


def _permuted(shape: tuple[int, ...], perm: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape[p] for p in perm)


def _same_bytes(shape: tuple[int, ...]) -> bool:
    """Whether an NCHW tensor of ``shape`` holds its values in the same order as its NHWC twin: the
    permutation moves only dimensions of size 1 past each other."""
    return shape[1] == 1 or shape[2] * shape[3] == 1


@dataclasses.dataclass(frozen=True)
class LayoutReport:
    """What `channels_last` did: the convolutions it sent to NHWC and the transposes the new graph has."""

    convs_nhwc: int
    convs_kept: int
    transposes: int

    def summary(self) -> str:
        return (f"channels last: {self.convs_nhwc} convolution(s) in NHWC, {self.convs_kept} as given, "
                f"{self.transposes} transpose(s)")


class _Rewriter:
    def __init__(self, graph: Graph, decide: Decide) -> None:
        self.old = graph
        self.decide = decide
        self.producers = {n.out.id: n for n in graph.nodes}
        self.users: dict[int, list[Node]] = {}
        for n in graph.live_nodes():
            for v in n.inputs:
                self.users.setdefault(v.id, []).append(n)
        self.outputs = {v.id for v in graph.outputs}
        self.needs: dict[int, bool] = {}
        self.nodes: list[Node] = []
        self.present: set[int] = set()       # NCHW values the new graph computes
        self.twin: dict[int, Value] = {}     # NCHW value id -> its NHWC twin
        self.alias: dict[int, Value] = {}    # id of a transpose to NHWC of a value with a twin -> the twin
        self.sent = self.kept = 0

    # -- building -------------------------------------------------------------------------------------
    def add(self, op: str, inputs: tuple[Value, ...], t: TensorType, attrs: dict, group: str | None = None,
            out: Value | None = None) -> Value:
        value = out if out is not None else Value(t)
        self.nodes.append(Node(op, inputs, value, attrs, group))
        self.present.add(value.id)
        return value

    def nchw(self, v: Value) -> Value:
        """``v`` as the new graph has it in NCHW: computed, or transposed back from its twin here (a value
        that is a twin's transpose to NHWC: the twin)."""
        if v.id in self.alias:
            return self.alias[v.id]
        if v.id in self.present or v.id not in self.twin:
            return v
        self.add("transpose", (self.twin[v.id],), v.type, {"perm": TO_NCHW, "fuse": True}, out=v)
        return v

    def nhwc(self, v: Value) -> Value:
        """The NHWC twin of the 4-D value ``v``: its twin, or made here — a constant rearranged, a broadcast
        of one value broadcast to the new shape, else a transpose."""
        found = self.twin.get(v.id)
        if found is not None:
            return found
        t = TensorType(_permuted(v.shape, TO_NHWC), v.dtype)
        src = self.producers.get(v.id)
        if src is not None and src.op == "const":
            twin = self.rearranged(src, t, TO_NHWC)
        elif src is not None and src.op == "broadcast" and all(d == 1 for d in src.inputs[0].shape):
            twin = self.add("broadcast", (self.nchw(src.inputs[0]),), t, dict(src.attrs), src.group)
        elif _same_bytes(v.shape):
            twin = self.add("reshape", (self.nchw(v),), t, {})
        else:
            twin = self.add("transpose", (self.nchw(v),), t, {"perm": TO_NHWC, "fuse": True})
        self.twin[v.id] = twin
        return twin

    def rearranged(self, src: Node, t: TensorType, perm: tuple[int, ...]) -> Value:
        """A new constant of type ``t``: constant node ``src``'s value transposed by ``perm``."""
        value = np.asarray(src.attrs["value"]).reshape(src.out.shape).transpose(perm)
        return self.add("const", (), t, {**src.attrs, "value": np.ascontiguousarray(value)}, src.group)

    def operand(self, v: Value, out_shape: tuple[int, ...]) -> Value:
        """Operand ``v`` of an elementwise op whose NCHW result has ``out_shape``, for the op's twin."""
        if v.shape == out_shape or v.id in self.twin:
            return self.nhwc(v)
        if v.type.rank == 0:
            return self.nchw(v)
        shape4 = (1,) * (4 - v.type.rank) + v.shape  # numpy broadcasting aligns from the right
        v4 = self.nchw(v)
        if shape4 != v.shape:
            v4 = self.add("reshape", (v4,), TensorType(shape4, v.dtype), {})
        return self.nhwc(v4)

    def needs_nchw(self, v: Value) -> bool:
        """Whether some use of the 4-D value ``v``, had it an NHWC twin, would still need it in NCHW: a graph
        output, or an op that `rewrite` does not run on twins, reached through ops that it does (a
        convolution is taken to run in NHWC)."""
        found = self.needs.get(v.id)
        if found is not None:
            return found
        self.needs[v.id] = False  # a value reaches itself only through a cycle, which a graph has not
        need = v.id in self.outputs
        for user in self.users.get(v.id, ()):
            if need:
                break
            op, out = user.op, user.out
            if op == "conv2d":
                need = user.attrs["layout"] != "NCHW" or user.inputs[0] is not v
            elif op == "transpose":
                need = tuple(user.attrs["perm"]) != TO_NHWC  # to NHWC: the twin itself
            elif op in _ELEMENTWISE or op in ("broadcast", "slice", "concat", "interleave"):
                need = out.type.rank != 4 or self.needs_nchw(out)
            elif op.startswith("reduce_"):
                kept = [a for a in range(4) if a not in user.attrs["axes"]]
                need = sorted(kept, key=lambda a: _NHWC_AXIS[a]) != kept
            elif op == "reshape":
                need = not _same_bytes(v.shape)
            else:
                need = True
        self.needs[v.id] = need
        return need

    # -- ops ------------------------------------------------------------------------------------------
    def run(self) -> Graph:
        for node in self.old.live_nodes():
            if not self.rewrite(node):
                inputs = tuple(self.nchw(v) for v in node.inputs)
                self.add(node.op, inputs, node.out.type, dict(node.attrs), node.group, out=node.out)
        outputs = [self.nchw(v) for v in self.old.outputs]
        return Graph(nodes=self.nodes, inputs=list(self.old.inputs), outputs=outputs)

    def rewrite(self, node: Node) -> bool:
        """Emit ``node``'s NHWC form when it has one worth making; whether it did."""
        op, out = node.op, node.out
        if op == "conv2d":
            return self.conv(node)
        if op == "transpose" and out.type.rank == 4:
            return self.transpose(node)
        has = [v.id in self.twin for v in node.inputs]
        if not any(has) or op == "input":
            return False
        if op in _ELEMENTWISE or op == "broadcast":
            if out.type.rank != 4 or not any(h and v.shape == out.shape for h, v in zip(has, node.inputs)):
                return False
            inputs = tuple(self.operand(v, out.shape) for v in node.inputs)
            t = TensorType(_permuted(out.shape, TO_NHWC), out.dtype)
            self.twin[out.id] = self.add(op, inputs, t, dict(node.attrs), node.group)
            return True
        (x, *_) = node.inputs
        if op == "slice" and x.type.rank == 4:
            attrs = {"starts": _permuted(tuple(node.attrs["starts"]), TO_NHWC),
                     "steps": _permuted(tuple(node.attrs["steps"]), TO_NHWC)}
            t = TensorType(_permuted(out.shape, TO_NHWC), out.dtype)
            self.twin[out.id] = self.add(op, (self.nhwc(x),), t, attrs, node.group)
            return True
        if op == "concat" and out.type.rank == 4:
            inputs = tuple(self.nhwc(v) for v in node.inputs)
            t = TensorType(_permuted(out.shape, TO_NHWC), out.dtype)
            self.twin[out.id] = self.add(op, inputs, t, {"axis": _NHWC_AXIS[node.attrs["axis"]]}, node.group)
            return True
        if op == "interleave" and out.type.rank == 4:
            # Its axes permuted, their strides with them (the parts' order is row-major in the axes' order).
            inputs = tuple(self.nhwc(v) for v in node.inputs)
            t = TensorType(_permuted(out.shape, TO_NHWC), out.dtype)
            attrs = {"axes": tuple(_NHWC_AXIS[a] for a in node.attrs["axes"]), "strides": node.attrs["strides"]}
            self.twin[out.id] = self.add(op, inputs, t, attrs, node.group)
            return True
        if op.startswith("reduce_") and x.type.rank == 4:
            axes = tuple(node.attrs["axes"])
            kept = [a for a in range(4) if a not in axes]
            if sorted(kept, key=lambda a: _NHWC_AXIS[a]) != kept:
                return False  # the result's axes would come out in another order
            new_axes = tuple(sorted(_NHWC_AXIS[a] for a in axes))
            self.add(op, (self.nhwc(x),), out.type, {**node.attrs, "axes": new_axes}, node.group, out=out)
            return True
        if op == "reshape" and x.type.rank == 4 and _same_bytes(x.shape):
            self.add(op, (self.nhwc(x),), out.type, dict(node.attrs), node.group, out=out)
            return True
        return False

    def transpose(self, node: Node) -> bool:
        """A transpose between the two layouts costs nothing here: NHWC -> NCHW (a channels-last input, or
        a block that ran channels last, e.g. ConvNeXt's) gives a value whose twin is its operand; NCHW -> NHWC
        of a value with a twin is that twin."""
        (x,) = node.inputs
        perm = tuple(node.attrs["perm"])
        if perm == TO_NCHW:
            self.twin[node.out.id] = self.nchw(x)
            return True
        if perm == TO_NHWC and x.id in self.twin:
            self.alias[node.out.id] = self.twin[x.id]
            return True
        return False

    def conv(self, node: Node) -> bool:
        x, w = node.inputs
        if node.attrs["layout"] != "NCHW" or x.type.rank != 4:
            return False
        if not self.decide(node, x.id in self.twin, not self.needs_nchw(node.out)):
            self.kept += 1
            return False
        self.sent += 1
        wt = TensorType(_permuted(w.shape, WEIGHTS_TO_HWCO), w.dtype)
        src = self.producers.get(w.id)
        if src is not None and src.op == "const":
            wv = self.rearranged(src, wt, WEIGHTS_TO_HWCO)
        else:
            wv = self.add("transpose", (self.nchw(w),), wt, {"perm": WEIGHTS_TO_HWCO})
        t = TensorType(_permuted(node.out.shape, TO_NHWC), node.out.dtype)
        self.twin[node.out.id] = self.add("conv2d", (self.nhwc(x), wv), t, {**node.attrs, "layout": "NHWC"},
                                          node.group)
        return True


def _transposes(graph: Graph) -> int:
    return sum(n.op == "transpose" for n in graph.live_nodes())


def channels_last(graph: Graph, decide: Decide) -> tuple[Graph, LayoutReport]:
    """``graph`` with the convolutions ``decide`` picks, and what lies between them, in NHWC (module
    docstring), and a report; the graph itself when it has no NCHW convolution and no value viewed from
    NHWC to NCHW (a channels-last input). Without a convolution sent to NHWC the new graph is kept only
    when it has fewer transposes: ops on channels-last inputs computed on them as they lie."""
    to_nchw = any(n.op == "transpose" and n.out.type.rank == 4 and tuple(n.attrs["perm"]) == TO_NCHW
                  for n in graph.nodes)
    if not to_nchw and not any(n.op == "conv2d" and n.attrs.get("layout") == "NCHW" for n in graph.nodes):
        return graph, LayoutReport(0, 0, 0)
    r = _Rewriter(graph, decide)
    new = r.run()
    before, after = _transposes(graph), _transposes(new)
    if not r.sent and after >= before:
        return graph, LayoutReport(0, r.kept, 0)
    return new, LayoutReport(r.sent, r.kept, after)
