"""Recognising attention in a `Graph`: ``matmul(Q, Kᵀ) → scale → mask → softmax(keys) → matmul(·, V)``.

Pure graph analysis (no MLIR): `find_attention` returns one frozen `AttentionMatch` per occurrence,
which `pbsdk.core.ir.emit` replaces by one fused kernel (`pbsdk.core.ir.attention_tiles`; for the
``"lanes"`` form, a declaration the cpu target's ``attention`` stage builds).

What is recognised, starting from each ``matmul(P, V)``:

- ``P`` is a softmax over the last axis in pbsdk's composite form (``e = exp(x - max(x))``,
  ``e / sum(e)``, keepdims reshapes) or without the max shift (``exp(x) / sum(exp(x))``);
- ``x`` is reached from ``matmul(Q, Kᵀ)`` through any sequence of: multiplication or division by a
  positive scalar constant (the scale), addition of a tensor broadcastable to the scores (an additive
  mask; any dtype-matching value, input or computed), and ``where(c, -inf, s)`` / ``where(c, s, -inf)``
  whose condition folds to a constant causal pattern (keys ``j > i + offset`` masked) — an additive
  constant mask equal to such a pattern is recognised as causal too. Causal is proven by value:
  `_fold` evaluates the mask's constant graph op by op in each op's dtype (the masks transformers
  builds with ``vmap`` over ``arange``s included); a constant mask of any other pattern is read;
- torch's safe softmax (``where(all(x == -inf), 0, softmax(x))``) around the softmax: dropped under a
  causal pattern of offset >= 0 (no row is empty), else kept as ``Attention.safe_softmax`` (the kernel
  gives 0 where every key of a row is masked);
- Q, K, V and the mask are *views* of base tensors through reshape, broadcast and transpose nodes and
  the matmuls' own transposes and batch broadcasting: each becomes (base value, strides). Grouped-query
  heads (K/V reshaped and broadcast over the group) are zero strides, so nothing is copied.

- a key length known only at run time (a decode step's cache, traced with a symbolic size: a `Dim` of one
  symbol plus a constant) is accepted, with the strides that follow from it (a (b, h, sk, d) cache's batch
  stride ``h*sk*d``, a mask's ``sk``) as `Dim` forms in that symbol; batch, query length and head sizes stay
  static. Such a graph's masks are computed at run time (from an ``iota`` over the cache length and the
  padding mask): they are additive masks (a constant causal pattern needs static sizes to fold).

A candidate is rejected (left to the unfused pipeline) when an intermediate value is used outside the
pattern (e.g. the probabilities are also returned), a view cannot be written as strides, or the dtypes
differ; the reason is kept in ``rejections`` for ``explain``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Collection, Iterable, Mapping
from typing import Any

import numpy as np

from pbsdk.core.dims import Dim, is_dynamic, static
from pbsdk.core.ir.graph import BINARY_OPS, COMPARE_OPS, DTYPE_TO_NUMPY, UNARY_OPS, Graph, Node, Value
from pbsdk.core.options import Options
from pbsdk.core.plan.attention import FORMS, Attention, AttentionPlan, plan_attention
from pbsdk.core.spec import ChipSpec

#: Operand dtypes whose matmuls accumulate in f32 and are cast back (the pattern then has casts).
LOW_PRECISION = ("f16", "bf16")

#: A dimension of a view: (size, stride) factors, outermost first; their sizes multiply to the dim.
Factors = tuple[tuple["int | Dim", "int | Dim"], ...]


@dataclasses.dataclass(frozen=True)
class View:
    """A logical tensor read from ``base`` at ``offset + Σ index * stride`` (row-major factors)."""

    base: Value
    dims: tuple[Factors, ...]

    @property
    def shape(self) -> tuple[int | Dim, ...]:
        return tuple(_size(f) for f in self.dims)


def _size(factors: Factors) -> int | Dim:
    """The product of ``factors``' sizes (a TypeError for two sizes known only at run time)."""
    out: int | Dim = 1
    for s, _ in factors:
        out = out * s if isinstance(s, int) else s * static(out)
    return out


@dataclasses.dataclass(frozen=True)
class Operand:
    """One attention operand: for the flat batch index β (row-major over the output's batch dims),
    element (r, c) is ``base[Σ_f ((β // inner_f) % size_f) * stride_f + r * row_stride + c * col_stride]``."""

    base: Value
    batch: tuple[tuple[int, int | Dim, int], ...]  # (size, stride, inner) per factor
    row_stride: int | Dim  # a stride may be a form in the key length's symbol (a cache of `s0` keys)
    col_stride: int | Dim


@dataclasses.dataclass(frozen=True)
class AttentionMatch:
    """One recognised attention. ``covered`` are the nodes the fused kernel replaces (ids of their
    outputs); ``out`` is the value it produces, shaped (batch..., sq, dv), written row-major."""

    op: Attention
    out: Value
    q: Operand  # rows: queries, cols: d
    k: Operand  # rows: keys, cols: d
    v: Operand  # rows: keys, cols: dv
    mask: Operand | None  # rows: queries, cols: keys
    scale: float  # applied to Q·Kᵀ
    mask_scale: float  # applied to the mask (scales that came after it)
    covered: frozenset[int]
    #: For a match that reads f16/bf16 operands the graph widens to f32 (``op.widened``): the same attention
    #: with the widening casts left to the graph (f32 operands), what runs when the narrow one is not fused.
    widened: AttentionMatch | None = None


# --------------------------------------------------------------------------------------------- views

def _contiguous(v: Value) -> View:
    dims, stride = [], 1
    for s in reversed(v.shape):
        dims.append(((s, stride),) if s != 1 else ())
        stride *= s
    return View(v, tuple(reversed(dims)))


def _reshape(view: View, shape: tuple[int, ...]) -> View | None:
    factors = [f for dim in view.dims for f in dim if f[0] != 1]
    out: list[Factors] = []
    for n in shape:
        need: int | Dim = n
        taken: list[tuple[int | Dim, int | Dim]] = []
        while need != 1:
            if not factors:
                return None
            s, st = factors[0]
            if isinstance(need, Dim) or isinstance(s, Dim):  # a size known at run time: only as a whole factor
                if need != s:
                    return None
                taken.append((s, st))
                factors.pop(0)
                need = 1
            elif need % s == 0:
                taken.append((s, st))
                factors.pop(0)
                need //= s
            elif s % need == 0:  # split the factor: the outer part goes here, the rest stays
                taken.append((need, st * (s // need)))
                factors[0] = (s // need, st)
                need = 1
            else:
                return None
        out.append(tuple(taken))
    return View(view.base, tuple(out)) if not factors else None


def _broadcast(view: View, shape: tuple[int, ...]) -> View | None:
    pad = len(shape) - len(view.dims)
    if pad < 0:
        return None
    dims: list[Factors] = [((n, 0),) if n != 1 else () for n in shape[:pad]]
    for d, n in zip(view.dims, shape[pad:]):
        size = _size(d)
        if size == n:
            dims.append(d)
        elif size == 1:
            dims.append(((n, 0),))
        else:
            return None
    return View(view.base, tuple(dims))


def _view_of(v: Value, producers: Mapping[int, Node], factor: list[float] | None = None,
             widened: list[str] | None = None) -> tuple[View, list[Node]] | None:
    """Walk back through reshape / broadcast / transpose nodes to a base value. With ``factor``
    (a one-element list), multiplications by a positive scalar constant on the way are walked through
    too and their product is left in ``factor[0]`` (torch's SDPA scales Q and Kᵀ by √scale each). With
    ``widened`` (a list), casts of f16/bf16 to f32 (exact) are walked through too and the narrow dtype of
    each is appended to it (torch's decomposed bf16 SDPA widens Q, K and V to f32)."""
    chain: list[Node] = []
    node = producers.get(v.id)
    while node is not None:
        if node.op in ("reshape", "broadcast", "transpose"):
            chain.append(node)
            node = producers.get(node.inputs[0].id)
            continue
        if (widened is not None and node.op == "cast" and node.out.dtype == "f32"
                and node.inputs[0].dtype in LOW_PRECISION and node.inputs[0].shape == node.out.shape):
            widened.append(node.inputs[0].dtype)
            chain.append(node)
            node = producers.get(node.inputs[0].id)
            continue
        c = _scalar(node.inputs[1], producers) if node.op == "mul" and len(node.inputs) == 2 else None
        if factor is None or c is None or not (math.isfinite(c) and c > 0) or node.inputs[0].shape != node.out.shape:
            break
        factor[0] *= c
        chain.append(node)
        node = producers.get(node.inputs[0].id)
    base = chain[-1].inputs[0] if chain else v
    view: View | None = _contiguous(base)
    for n in reversed(chain):
        assert view is not None
        if n.op in ("mul", "cast"):
            view = View(view.base, view.dims)
        elif n.op == "reshape":
            view = _reshape(view, n.out.shape)
        elif n.op == "broadcast":
            view = _broadcast(view, n.out.shape)
        else:
            view = View(view.base, tuple(view.dims[p] for p in n.attrs["perm"]))
        if view is None:
            return None
    return (view, chain) if view is not None else None


def _operand(view: View, batch_shape: tuple[int, ...], transposed: bool) -> Operand | None:
    """The (batch..., rows, cols) operand of a matmul over ``batch_shape`` (numpy broadcasting)."""
    if len(view.dims) < 2:
        return None
    rows, cols = (view.dims[-1], view.dims[-2]) if transposed else (view.dims[-2], view.dims[-1])
    lead = View(view.base, view.dims[:-2])
    b = _broadcast(lead, batch_shape)
    if b is None or len(rows) > 1 or len(cols) > 1:
        return None
    factors = [f for dim in b.dims for f in dim if f[0] != 1]
    batch: list[tuple[int, int | Dim, int]] = []
    inner = 1
    for s, st in reversed(factors):
        batch.append((static(s), st, inner))  # batch sizes are static (`_dynamic_key_length`)
        inner *= static(s)
    return Operand(view.base, tuple(reversed(batch)), rows[0][1] if rows else 0, cols[0][1] if cols else 0)


# ------------------------------------------------------------------------------------- const folding

_FOLD_BINARY = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.divide, "maximum": np.maximum,
                "minimum": np.minimum, "fmod": np.fmod}
_FOLD_BITWISE = {"bitwise_and": np.bitwise_and, "bitwise_or": np.bitwise_or, "bitwise_xor": np.bitwise_xor}
_FOLD_UNARY = {"neg": np.negative, "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc,
               "round": np.rint, "sign": np.sign}
_FOLD_COMPARE = {"equal": np.equal, "not_equal": np.not_equal, "less": np.less, "less_equal": np.less_equal,
                 "greater": np.greater, "greater_equal": np.greater_equal}
_FOLD_MOVE = ("reshape", "broadcast", "transpose", "cast", "select", "slice", "concat", "take", "flip")
#: Ops `_fold` evaluates (on constant operands).
FOLDABLE = frozenset(_FOLD_BINARY) | frozenset(_FOLD_BITWISE) | frozenset(_FOLD_UNARY) | frozenset(_FOLD_COMPARE) \
    | frozenset(_FOLD_MOVE) | {"const"}
#: Largest constant expression folded while looking for a causal pattern.
MAX_FOLD_ELEMENTS = 1 << 25
#: Deepest chain of ops folded (transformers' causal masks are ~40 deep at seq 128: a cumsum as log2(seq) steps).
MAX_FOLD_DEPTH = 256


def _rounded(values: np.ndarray, dtype: str) -> np.ndarray:
    """``values`` as ``dtype`` holds them (f16 keeps integers exact only to 2048, bf16 to 256), in float64:
    what the kernel computes with, so a pattern is recognised only where the kernel has it."""
    if dtype in ("f16", "bf16", "f32"):
        return values.astype(DTYPE_TO_NUMPY[dtype]).astype(np.float64)
    return values


def _whole(a: np.ndarray) -> np.ndarray | None:
    """``a`` as int64 as the emitted ``fptosi`` gives it, or None where that is not exact (NaN, inf,
    fractions, beyond 2^53): such a mask is not folded rather than folded to a guess."""
    if not np.isfinite(a).all() or (np.abs(a) >= 2.0 ** 53).any() or (a != np.trunc(a)).any():
        return None
    return a.astype(np.int64)


def _fold_node(node: Node, args: list[np.ndarray]) -> np.ndarray | None:
    """``node`` evaluated on constant operands ``args`` (float64), with the emitted code's semantics, in
    the output's dtype; None for an op not folded."""
    v, op = node.out, node.op
    with np.errstate(all="ignore"):
        if op == "reshape":
            return np.reshape(args[0], v.shape)
        if op == "broadcast":
            return np.broadcast_to(args[0], v.shape)
        if op == "transpose":
            return np.transpose(args[0], node.attrs["perm"])
        if op == "cast":
            return _rounded(args[0], v.type.dtype)
        if op in _FOLD_UNARY:
            return _rounded(_FOLD_UNARY[op](args[0]), v.type.dtype)
        if op in _FOLD_BINARY:
            return np.broadcast_to(_rounded(_FOLD_BINARY[op](args[0], args[1]), v.type.dtype), v.shape)
        if op in _FOLD_BITWISE:  # on whole numbers, as int64 (emit: fptosi, andi/ori/xori, sitofp)
            a, b = _whole(args[0]), _whole(args[1])
            if a is None or b is None:
                return None
            out = _FOLD_BITWISE[op](a, b).astype(np.float64)
            return np.broadcast_to(_rounded(out, v.type.dtype), v.shape)
        if op in _FOLD_COMPARE:
            return np.broadcast_to(_FOLD_COMPARE[op](args[0], args[1]).astype(np.float64), v.shape)
        if op == "select":
            return np.broadcast_to(np.where(args[0] != 0, args[1], args[2]), v.shape)
        if op == "slice":
            return args[0][tuple(slice(s, s + n * st, st)
                                 for s, st, n in zip(node.attrs["starts"], node.attrs["steps"], v.shape))]
        if op == "concat":
            return np.concatenate(args, axis=node.attrs["axis"])
        if op == "flip":
            return np.flip(args[0], node.attrs["axes"])
        if op == "take":  # indices clipped to [0, n - 1] (NaN to 0) and truncated, as emit's op_take
            table, idx = args
            axis = node.attrs["axis"]
            n = table.shape[axis]
            clipped = np.trunc(np.clip(np.nan_to_num(idx, nan=0.0), 0, n - 1)).astype(np.int64)
            return np.take(table, clipped, axis=axis)
    return None


def _fold(v: Value, producers: Mapping[int, Node], memo: dict[int, np.ndarray | None] | None = None,
          depth: int = 0) -> np.ndarray | None:
    """The value of ``v`` when it is computed from constants only (else None), evaluated as the emitted
    code computes it: each op in its output dtype (`_fold_node`). ``memo`` caches results by value id
    (a mask is shared by every layer, and transformers' masks reuse values)."""
    memo = {} if memo is None else memo
    if v.id in memo:
        return memo[v.id]
    if depth > MAX_FOLD_DEPTH:
        return None
    node = producers.get(v.id)
    out: np.ndarray | None = None
    if node is not None and node.op in FOLDABLE and isinstance(v.type.size, int) and v.type.size <= MAX_FOLD_ELEMENTS:
        if node.op == "const":
            out = np.broadcast_to(_rounded(np.asarray(node.attrs["value"], dtype=np.float64), v.type.dtype), v.shape)
        else:
            args = []
            for x in node.inputs:
                a = _fold(x, producers, memo, depth + 1)
                if a is None:
                    break
                args.append(a)
            else:
                out = _fold_node(node, args)
                if out is not None and out.shape != v.shape:
                    out = None
    memo[v.id] = out
    return out


_ELEMENTWISE = UNARY_OPS | BINARY_OPS | COMPARE_OPS | {"select", "cast", "broadcast"}


def _same_along(v: Value, axis: int, producers: Mapping[int, Node], memo: dict[int, np.ndarray | None],
                seen: dict[tuple[int, int], bool] | None = None, depth: int = 0) -> bool:
    """Whether ``v`` provably has equal values at every index along ``axis``: it is size 1 there, a constant
    that is, or an elementwise op (numpy broadcasting, right-aligned) of values that are. E.g. BERT's
    ``where(1 - m != 0, finfo.min, 1 - m)`` over ``m`` expanded from (B, 1, 1, S) to (B, 1, S, S): every
    query row of that mask is the same, so the kernel may read one."""
    seen = {} if seen is None else seen
    key = (v.id, axis)
    if v.shape[axis] == 1:
        return True
    if key in seen:
        return seen[key]
    node = producers.get(v.id)
    same = False
    if node is not None and depth <= MAX_FOLD_DEPTH:
        if node.op == "const":
            a = _fold(v, producers, memo)
            same = a is not None and bool((a == np.take(a, [0], axis=axis)).all())
        elif node.op in _ELEMENTWISE:
            same = all(ax < 0 or _same_along(x, ax, producers, memo, seen, depth + 1)
                       for x in node.inputs for ax in (axis - (len(v.shape) - len(x.shape)),))
    seen[key] = same
    return same


def _rows_repeat(base: Value, row_stride: int | Dim, rows: int, producers: Mapping[int, Node],
                 memo: dict[int, np.ndarray | None]) -> bool:
    """Whether reading ``rows`` rows of contiguous ``base`` at ``row_stride`` reads the same row each time:
    the stride is one axis's and ``base`` is the same along it (`_same_along`). (Not asked of a stride known
    only at run time: the rows are then read at it.)"""
    if isinstance(row_stride, Dim):
        return False
    stride = 1
    for axis in reversed(range(len(base.shape))):
        if stride == row_stride and base.shape[axis] > 1:
            return rows <= base.shape[axis] and _same_along(base, axis, producers, memo)
        stride *= base.shape[axis]
    return False


def _scalar(v: Value, producers: Mapping[int, Node]) -> float | None:
    if v.type.size != 1:
        return None
    node = producers.get(v.id)
    if node is None or node.op != "const":
        return None
    return float(np.asarray(node.attrs["value"]).reshape(()))


def _splat(v: Value, producers: Mapping[int, Node]) -> float | None:
    """The value of ``v`` where it is one scalar constant broadcast or reshaped (to any shape, dynamic ones
    included: `_fold` evaluates static shapes only), else None."""
    node = producers.get(v.id)
    while node is not None and node.op in ("broadcast", "reshape"):
        v = node.inputs[0]
        node = producers.get(v.id)
    return _scalar(v, producers)


def causal_offset(masked: np.ndarray) -> int | None:
    """``off`` such that ``masked[..., i, j] == (j > i + off)`` for every leading index, else None.
    (An all-False pattern is offset ``sk - 1``: nothing masked.)"""
    sq, sk = masked.shape[-2:]
    plane = masked.reshape(-1, sq, sk) if masked.ndim > 2 else masked[None]
    if not (plane == plane[:1]).all():
        return None
    m = plane[0]
    keep = (~m).sum(axis=1)
    off = None
    for i in (sq - 1, 0):
        if 0 < keep[i] < sk:
            off = int(keep[i]) - 1 - i
            break
    if off is None:
        if keep.min() == sk:
            off = sk - 1
        else:
            return None
    i = np.arange(sq)[:, None]
    j = np.arange(sk)[None, :]
    return off if bool(((j > i + off) == m).all()) else None


# ---------------------------------------------------------------------------------------- recognition

@dataclasses.dataclass
class _Uses:
    counts: dict[int, int]
    outputs: set[int]

    def only_inside(self, v: Value, users: int = 1) -> bool:
        return v.id not in self.outputs and self.counts.get(v.id, 0) == users


def _softmax_input(p: Value, producers: Mapping[int, Node], uses: _Uses) -> tuple[Value, list[Node], int] | None:
    """x such that p = softmax(x, axis=-1), with the nodes of the softmax and how many of them read x."""
    div = producers.get(p.id)
    if div is None or div.op != "div":
        return None
    e, denom = div.inputs
    last = len(p.shape) - 1
    keep = p.shape[:-1] + (1,)
    nodes = [div]
    rs = producers.get(denom.id)
    if rs is not None and rs.op == "reshape" and rs.out.shape == keep:
        nodes.append(rs)
        red = producers.get(rs.inputs[0].id)
    else:
        red = rs
    if red is not None and red.op == "cast" and red.inputs[0].dtype == "f32" and red.out.dtype in LOW_PRECISION:
        nodes.append(red)  # an f16/bf16 sum accumulated in f32
        red = producers.get(red.inputs[0].id)
    if red is None or red.op != "reduce_sum" or tuple(red.attrs["axes"]) != (last,) or red.inputs[0] is not e:
        return None
    nodes.append(red)
    ex = producers.get(e.id)
    if ex is None or ex.op != "exp" or ex.out.shape != p.shape or not uses.only_inside(e, 2):
        return None
    nodes.append(ex)
    shifted = ex.inputs[0]
    sub = producers.get(shifted.id)
    if sub is not None and sub.op == "sub" and uses.only_inside(shifted):
        x, mx = sub.inputs
        rm = producers.get(mx.id)
        chain = [sub]
        if rm is not None and rm.op == "reshape" and rm.out.shape == keep:
            chain.append(rm)
            rm = producers.get(rm.inputs[0].id)
        if rm is not None and rm.op == "reduce_max" and tuple(rm.attrs["axes"]) == (last,) and rm.inputs[0] is x \
                and x.shape == p.shape:
            return x, nodes + chain + [rm], 2
    return shifted, nodes, 1  # exp(x) / sum(exp(x)): the fused kernel computes the stable form


def _batch_reshape(node: Node) -> bool:
    """A reshape that only regroups leading (batch) dims: the last two are unchanged."""
    if node.op != "reshape":
        return False
    src, dst = node.inputs[0].shape, node.out.shape
    return len(src) >= 2 and len(dst) >= 2 and src[-2:] == dst[-2:]


_GUARD_OPS = ("equal", "not_equal", "reduce_max", "reshape", "broadcast", "cast")


def _safe_softmax(p: Value, producers: Mapping[int, Node], uses: _Uses,
                  memo: dict[int, np.ndarray | None]) -> tuple[Value, list[Node], Value] | None:
    """torch's ``_safe_softmax``: ``where(all(x == -inf, -1), 0, softmax(x))``. Returns (the softmax's
    value, the guard's nodes, x) when ``p`` is that select over a condition computed from x alone."""
    sel = producers.get(p.id)
    if sel is None or sel.op != "select":
        return None
    cond, zero, soft = sel.inputs
    folded = _fold(zero, producers, memo)
    if folded is None and is_dynamic(zero.shape):  # a scalar broadcast over a dynamic key length
        splat = _splat(zero, producers)
        folded = None if splat is None else np.asarray(splat)
    if folded is None or (folded != 0).any() or soft.shape != p.shape:
        return None
    nodes = [sel]
    zn = producers.get(zero.id)
    if zn is not None and zn.op != "const" and uses.only_inside(zero):
        nodes.append(zn)
    leaves: set[int] = set()
    leaf: Value | None = None
    stack = [cond]
    while stack:
        v = stack.pop()
        node = producers.get(v.id)
        if node is None or node.op == "const" or _fold(v, producers, memo) is not None:
            continue
        if node.op not in _GUARD_OPS or not uses.only_inside(v):
            if leaf is not None and leaf.id != v.id:
                return None
            leaf = v
            leaves.add(v.id)
            continue
        nodes.append(node)
        stack += node.inputs
    if leaf is None:
        return None
    return soft, nodes, leaf


def _users(graph_nodes: Iterable[Node]) -> dict[int, int]:
    counts: dict[int, int] = {}
    for n in graph_nodes:
        for x in n.inputs:
            counts[x.id] = counts.get(x.id, 0) + 1
    return counts


@dataclasses.dataclass(frozen=True)
class _Analysis:
    """What `find_attention` reads of a graph's live nodes: each value's producer and consumers, the
    uses of each value, and the constants folded so far (``memo``, shared by every candidate)."""

    graph: Graph
    producers: dict[int, Node]
    consumers: dict[int, list[Node]]
    uses: _Uses
    memo: dict[int, np.ndarray | None]


@dataclasses.dataclass(frozen=True)
class _Probabilities:
    """P of a ``matmul(P, V)`` read back to the softmax's input ``x`` (`_probabilities`): the nodes passed
    (the softmax's, batch reshapes, a safe softmax's guard), how many of them read ``x``, and whether the
    softmax is guarded (torch's safe softmax)."""

    x: Value
    nodes: tuple[Node, ...]
    x_users: int
    guarded: bool


@dataclasses.dataclass(frozen=True)
class _Logits:
    """The walk from the softmax's input back to Q·Kᵀ (`_walk_to_qk`): the value ``cur`` reached, the scale
    applied to it, the additive mask (``mask_value``, the scale seen before it, ``mask_scale``, and the
    scores' shape where it is added, ``mask_at``), the causal offset and the nodes passed; ``qk`` once
    the walk has reached Q·Kᵀ."""

    cur: Value
    scale: float = 1.0
    mask_scale: float = 1.0
    mask_value: Value | None = None
    mask_at: tuple[int, ...] = ()
    causal: int | None = None
    nodes: tuple[Node, ...] = ()
    qk: Node | None = None


def find_attention(graph: Graph, rejections: list[str] | None = None) -> list[AttentionMatch]:
    """Every attention in ``graph`` that the fused kernel can replace (see the module docstring)."""
    nodes = graph.live_nodes()
    producers = {n.out.id: n for n in nodes}
    uses = _Uses(_users(nodes), {v.id for v in graph.outputs})
    found: list[AttentionMatch] = []
    claimed: set[int] = set()
    memo: dict[int, np.ndarray | None] = {}  # folded constants, shared by every candidate
    why = rejections if rejections is not None else []

    # f16/bf16 matmuls accumulate in f32 and are cast back: the cast after P·V is the attention's output.
    consumers: dict[int, list[Node]] = {}
    for n in nodes:
        for i in n.inputs:
            consumers.setdefault(i.id, []).append(n)
    g = _Analysis(graph, producers, consumers, uses, memo)

    for pv in nodes:
        if pv.op != "matmul" or pv.attrs["transpose_a"] or pv.out.id in claimed:
            continue
        if is_dynamic(pv.inputs[0].shape[:-1]) or is_dynamic(pv.out.shape):
            if _probabilities(g, pv) is None:  # not a P·V (e.g. the Q·Kᵀ before it): nothing to say
                continue
            why.append(f"matmul -> softmax -> matmul at {pv.out.type}: only the key length may be known at run "
                       "time (batch, query length and head sizes static); the products and the softmax are "
                       "compiled apart")
            continue
        try:
            match = _match_at(g, pv, why)
        except TypeError as exc:  # `Dim` arithmetic that depends on a symbol's value (an ordering, a product)
            why.append(f"matmul -> softmax -> matmul at {pv.out.type}: a size known only at run time where the "
                       f"recogniser needs its value ({exc})")
            continue
        if match is not None:
            found.append(match)
            claimed |= match.covered
    return found


def _match_at(g: _Analysis, pv: Node, why: list[str]) -> AttentionMatch | None:
    """The attention whose P·V is the matmul ``pv``, or None (with a reason in ``why`` where the softmax
    was found but not what computes its input)."""
    final = pv
    after = g.consumers.get(pv.out.id, [])
    if (pv.out.dtype == "f32" and pv.inputs[0].dtype in LOW_PRECISION and len(after) == 1
            and after[0].op == "cast" and after[0].out.dtype == pv.inputs[0].dtype
            and pv.out.id not in g.uses.outputs):
        final = after[0]
    soft = _probabilities(g, pv)
    if soft is None:
        return None
    # Walk from the logits back to Q·Kᵀ.
    logits = _walk_to_qk(g, soft.x, soft.x_users)
    if isinstance(logits, str):
        why.append(f"matmul -> softmax -> matmul at {pv.out.type}: {logits}")
        return None
    covered_nodes = [*soft.nodes, *logits.nodes]
    # torch's safe softmax gives 0 for a row whose keys are all masked. A causal pattern with offset
    # >= 0 masks no whole row (the guard is then a no-op); any other mask may (a runtime padding mask
    # of zeros), so the kernel is asked to zero such rows exactly as torch does.
    causal = logits.causal
    safe = soft.guarded and (logits.mask_value is not None or (causal is not None and causal < 0))
    qk = logits.qk
    assert qk is not None
    covered_nodes.append(qk)
    if qk.attrs["transpose_a"]:
        why.append("Q·Kᵀ with Q transposed is not recognised")
        return None
    if final is not pv:
        covered_nodes.append(pv)
    match = _build(g.graph, final, qk, g.producers, logits.mask_value, causal, logits.scale, logits.mask_scale,
                   covered_nodes, g.uses, why, pv_matmul=pv, safe_softmax=safe, mask_at=logits.mask_at,
                   memo=g.memo)
    if match is not None and match.op.dtype == "f32":
        # An f32 pattern on f16/bf16 operands widened to f32 (torch's decomposed bf16 SDPA): the same
        # attention reading the narrow operands, and writing the narrow output where the result is
        # only rounded back to it; the f32 match stays as its fallback.
        narrow_final, extra = _narrow_output(g, pv, final, after)
        narrow = _build(g.graph, narrow_final, qk, g.producers, logits.mask_value, causal, logits.scale,
                        logits.mask_scale, covered_nodes + extra, g.uses, [], pv_matmul=pv, safe_softmax=safe,
                        mask_at=logits.mask_at, memo=g.memo, narrow=True)
        if narrow is not None:
            match = dataclasses.replace(narrow, widened=match)
    return match


def _probabilities(g: _Analysis, pv: Node) -> _Probabilities | None:
    """``pv``'s P read back through a batch reshape and torch's safe-softmax guard to the softmax's input;
    None where P is not a softmax used only there."""
    uses, producers = g.uses, g.producers
    p = pv.inputs[0]
    if not uses.only_inside(p):
        return None
    batch_views: list[Node] = []
    rp = producers.get(p.id)
    if rp is not None and _batch_reshape(rp) and uses.only_inside(rp.inputs[0]):
        batch_views.append(rp)  # (b, h, sq, sk) -> (b*h, sq, sk) for a 3-D matmul
        p = rp.inputs[0]
    guard = _safe_softmax(p, producers, uses, g.memo)
    if guard is not None:
        p = guard[0]
    soft = _softmax_input(p, producers, uses)
    if soft is None:
        return None
    x, covered_nodes, x_users = soft
    covered_nodes += batch_views
    if guard is not None:
        if guard[2] is not x:
            return None
        covered_nodes += guard[1]
        x_users += 1
    return _Probabilities(x, tuple(covered_nodes), x_users, guard is not None)


def _walk_to_qk(g: _Analysis, x: Value, x_users: int) -> _Logits | str:
    """The walk from the softmax's input ``x`` (read by ``x_users`` of the softmax's nodes) back to Q·Kᵀ
    through scales, masks, casts and batch reshapes (`_step_back`); a string: why it does not reach one."""
    s = _Logits(x)
    node = g.producers.get(x.id)
    while node is not None and node.op != "matmul":
        stepped = _step_back(g, node, s) if g.uses.only_inside(s.cur, x_users if s.cur is x else 1) else None
        if stepped is None:
            return ("an op between Q·Kᵀ and the softmax is not a positive scalar scale, an additive mask or a causal "
                    "select, or a value is used elsewhere")
        s = dataclasses.replace(stepped, nodes=stepped.nodes + (node,))
        node = g.producers.get(s.cur.id)
    if node is None or not g.uses.only_inside(s.cur, x_users if s.cur is x else 1):
        return "scores not computed by a matmul"
    return dataclasses.replace(s, qk=node)


def _step_back(g: _Analysis, node: Node, s: _Logits) -> _Logits | None:
    """The walk one op further back, through ``node`` (the producer of ``s.cur``): a positive scalar scale,
    an additive mask or causal pattern, a cast of Q·Kᵀ's f32 result, a batch reshape or a causal select;
    None for any other op."""
    producers, a = g.producers, node.inputs
    if node.op in ("mul", "div") and len(a) == 2:
        side = 0 if a[0].shape == s.cur.shape and _scalar(a[1], producers) is not None else \
            1 if node.op == "mul" and a[1].shape == s.cur.shape and _scalar(a[0], producers) is not None else None
        if side is None:
            return None
        c = _scalar(a[1 - side], producers)
        assert c is not None
        c = 1.0 / c if node.op == "div" else c
        if not (math.isfinite(c) and c > 0):
            return None
        # walking backwards: a scale seen before the mask also scales the mask
        return dataclasses.replace(s, scale=s.scale * c, cur=a[side])
    if node.op == "add":
        return _through_add(g, node, s)
    if (node.op == "cast" and node.out.dtype in LOW_PRECISION and node.inputs[0].dtype == "f32"
            and getattr(producers.get(node.inputs[0].id), "op", None) == "matmul"):
        return dataclasses.replace(s, cur=node.inputs[0])  # Q·Kᵀ accumulated in f32, cast to the operands' dtype
    if _batch_reshape(node):
        return dataclasses.replace(s, cur=a[0])  # batch dims merged or split; the score rows and columns unchanged
    if node.op == "select":
        return _through_select(g, node, s)
    return None


def _through_add(g: _Analysis, node: Node, s: _Logits) -> _Logits | None:
    """An addition: a constant causal pattern (0 and -inf) if none was seen, else the additive mask (one)."""
    a = node.inputs
    side = 0 if a[0].shape == s.cur.shape else 1
    other = a[1 - side]
    folded = _fold(other, g.producers, g.memo)
    off = None
    if folded is not None:
        finite = np.isfinite(folded)
        if ((folded == 0) | (folded == -np.inf)).all() and (~finite).any():
            off = causal_offset(np.broadcast_to(folded == -np.inf, s.cur.shape))
    if off is not None and s.causal is None:
        return dataclasses.replace(s, causal=off, cur=a[side])
    if s.mask_value is None:
        return dataclasses.replace(s, mask_value=other, mask_scale=s.scale, mask_at=node.out.shape, cur=a[side])
    return None


def _through_select(g: _Analysis, node: Node, s: _Logits) -> _Logits | None:
    """``where(c, -inf, s)`` or ``where(c, s, -inf)`` whose condition folds to a causal pattern (when no
    causal pattern was seen)."""
    cond, t, f = node.inputs
    tf, ff = _scalar(t, g.producers), _scalar(f, g.producers)
    folded = _fold(cond, g.producers, g.memo)
    if folded is None or s.causal is not None:
        return None
    if tf == -math.inf and f.shape == s.cur.shape:
        masked, cur = folded != 0, f
    elif ff == -math.inf and t.shape == s.cur.shape:
        masked, cur = folded == 0, t
    else:
        return None
    off = causal_offset(np.broadcast_to(masked, cur.shape))
    if off is None:
        return None
    return dataclasses.replace(s, causal=off, cur=cur)


def _narrow_output(g: _Analysis, pv: Node, final: Node, after: list[Node]) -> tuple[Node, list[Node]]:
    """For an f32 match on widened operands: the node the narrow match's output is (the cast rounding the
    result back to f16/bf16, past batch reshapes, where the result is only that) and the nodes it covers
    beyond the f32 match's; else ``final`` and none."""
    narrow_final, extra = final, []
    tail, nxt = [pv], after  # batch reshapes (e.g. (b*h, s, d) -> (b, h, s, d)) before the cast
    while len(nxt) == 1 and _batch_reshape(nxt[0]) and tail[-1].out.id not in g.uses.outputs:
        tail.append(nxt[0])
        nxt = g.consumers.get(nxt[0].out.id, [])
    if (final is pv and len(nxt) == 1 and nxt[0].op == "cast" and nxt[0].out.dtype in LOW_PRECISION
            and tail[-1].out.id not in g.uses.outputs):
        narrow_final, extra = nxt[0], tail
    return narrow_final, extra


def _build(graph: Graph, pv: Node, qk: Node, producers: Mapping[int, Node], mask_value: Value | None,
           causal: int | None, scale: float, mask_scale: float, covered_nodes: list[Node], uses: _Uses,
           why: list[str], pv_matmul: Node | None = None, safe_softmax: bool = False,
           mask_at: tuple[int, ...] = (),
           memo: dict[int, np.ndarray | None] | None = None, narrow: bool = False) -> AttentionMatch | None:
    """``pv`` is the node producing the output: the P·V matmul, or the cast after it
    (``pv_matmul``) for f16/bf16 operands. ``safe_softmax``: fully masked rows must give 0. ``mask_at``:
    the scores' shape where the mask is added (batch dims may be grouped otherwise than Q·Kᵀ's).
    ``narrow``: an f32 pattern whose Q, K and V are each widened from one f16/bf16 dtype, read narrow (the
    casts covered; the mask's too where it has one); None unless they are."""
    out = pv.out
    pvm = pv_matmul or pv
    batch_shape = pvm.out.shape[:-2]  # the output may group its batch dims otherwise (same row-major order)
    if qk.out.shape[:-2] != batch_shape:
        why.append(f"attention at {out.type}: the two matmuls have different batch shapes")
        return None
    sq, sk = qk.out.shape[-2:]
    dv = out.shape[-1]
    q_in, k_in = qk.inputs
    v_in = pvm.inputs[1]
    refused = _dynamic_key_length(qk, q_in, out, sk)
    if refused is not None:
        why.append(f"attention at {out.type}: {refused}")
        return None
    dynamic = sk.coeffs[0][0] if isinstance(sk, Dim) else None  # the key length's symbol
    dtypes = {q_in.dtype, k_in.dtype, v_in.dtype, out.dtype} | ({mask_value.dtype} if mask_value else set())
    if narrow:  # the pattern computes in f32; the output is f32 or rounded once to a narrow dtype
        dtypes = (dtypes - {out.dtype}) | {qk.out.dtype, pvm.out.dtype}
    elif qk.out.dtype != out.dtype and not (out.dtype in LOW_PRECISION and qk.out.dtype == "f32"):
        dtypes.add(qk.out.dtype)
    if len(dtypes) != 1 or (narrow and dtypes != {"f32"}):
        why.append(f"attention at {out.type}: mixed dtypes {sorted(dtypes)}")
        return None
    views = []
    chains: list[Node] = []
    widened: list[list[str]] = []
    factors = ([1.0], [1.0], None)  # scalar factors of Q and K join the scale; V's would scale the output
    for (val, transposed), factor in zip(((q_in, False), (k_in, not qk.attrs["transpose_b"]),
                                          (v_in, pvm.attrs["transpose_b"])), factors):
        widened.append([])
        found = _view_of(val, producers, factor, widened[-1] if narrow else None)
        if found is None:
            why.append(f"attention at {out.type}: an operand's reshape cannot be read with strides")
            return None
        view, chain = found
        opnd = _operand(view, batch_shape, transposed)
        if opnd is None:
            why.append(f"attention at {out.type}: an operand's layout cannot be read with strides")
            return None
        views.append(opnd)
        chains += chain
    q, k, v = views
    if dynamic is not None and not all(_strides_in(o, dynamic) for o in views):
        why.append(f"attention at {out.type}: an operand's strides depend on a size other than the key length {sk}")
        return None
    narrow_dtypes = {w[0] for w in widened if len(w) == 1}
    if narrow and (len(narrow_dtypes) != 1 or any(len(w) != 1 for w in widened)):
        return None  # not every operand widened, or from different dtypes: the f32 match only
    scale *= factors[0][0] * factors[1][0]
    d = q_in.shape[-1]
    mask = None
    mask_dtype = ""
    if mask_value is not None:
        mask_widened: list[str] = []
        found = _view_of(mask_value, producers, widened=mask_widened if narrow else None)
        mask_dtype = found[0].base.dtype if found is not None else ""
        mview = _broadcast(found[0], mask_at or qk.out.shape) if found is not None else None
        if mview is not None and mview.shape != qk.out.shape:  # a batch reshape between Q·Kᵀ and the mask
            mview = _reshape(mview, qk.out.shape)
        mask = _operand(mview, batch_shape, False) if mview is not None else None
        if mask is None or found is None:
            why.append(f"attention at {out.type}: the mask cannot be read with strides")
            return None
        chains += found[1]
        if dynamic is not None and not _strides_in(mask, dynamic):
            why.append(f"attention at {out.type}: the mask's strides depend on a size other than the key length {sk}")
            return None
        if mask.row_stride != 0 and _rows_repeat(found[0].base, mask.row_stride, sq, producers, memo or {}):
            mask = dataclasses.replace(mask, row_stride=0)  # one row read per key: no gather across queries
    # Nodes the kernel replaces: the pattern, plus view nodes used only by it.
    covered_nodes = covered_nodes + [pv]
    covered = {n.out.id for n in covered_nodes} | {n.out.id for n in chains}
    # A view node stays when something outside the fused region reads it.
    inside = set(covered)
    outside_users: set[int] = set()
    for n in graph.live_nodes():
        if n.out.id not in inside:
            outside_users.update(x.id for x in n.inputs)
    keep = _kept(graph, covered, {c for c in covered if c in outside_users or c in uses.outputs}, out.id)
    # A view of the pattern's operands read outside (a decoder's cache takes the key's heads) is emitted as
    # well; any other intermediate read outside refuses the match.
    pattern = {n.out.id for n in covered_nodes if n.op not in _VIEW_OPS}
    if keep & (pattern - {out.id}):
        why.append(f"attention at {out.type}: an intermediate value is used outside the pattern")
        return None
    covered -= keep - {out.id}
    # Query heads per K/V head: batch positions where K does not move but Q does.
    groups = math.prod(s for s, st, _ in k.batch if st == 0) // max(
        1, math.prod(s for s, st, _ in q.batch if st == 0))
    nb = math.prod(batch_shape) if batch_shape else 1
    causal_offset = causal if causal is not None and (dynamic is not None or causal < sk - 1) else None
    if narrow:
        (dtype,) = narrow_dtypes
        op = Attention(nb, sq, sk, d, dv, dtype, causal_offset, mask is not None, max(1, groups),
                       safe_softmax=safe_softmax, out_dtype=out.dtype, mask_dtype=mask_dtype, widened=True)
    else:
        op = Attention(nb, sq, sk, d, dv, out.dtype, causal_offset, mask is not None, max(1, groups),
                       safe_softmax=safe_softmax)
    return AttentionMatch(op, out, q, k, v, mask, scale, mask_scale, frozenset(covered))


def _dynamic_key_length(qk: Node, q_in: Value, out: Value, sk: int | Dim) -> str | None:
    """Why sizes known only at run time refuse the match (a dynamic batch, query length or head size, or a key
    length that is not one symbol plus a constant, which a kernel reads from a buffer's dimension); None when
    only the key length is dynamic, or nothing is."""
    if is_dynamic(qk.out.shape[:-1]) or is_dynamic(q_in.shape) or is_dynamic(out.shape):
        return "only the key length may be known at run time (batch, query length and head sizes static)"
    if isinstance(sk, Dim) and (len(sk.coeffs) != 1 or sk.coeffs[0][1] != 1 or not sk.linear):
        return f"the key length {sk} is not one symbol plus a constant"
    return None


def _strides_in(opnd: Operand, symbol: str) -> bool:
    """Whether every stride of ``opnd`` is static or a form in ``symbol`` alone (and its batch sizes static)."""
    strides = [opnd.row_stride, opnd.col_stride, *(st for _, st, _ in opnd.batch)]
    return (not is_dynamic([size for size, _, _ in opnd.batch])
            and all(isinstance(x, int) or x.symbols == (symbol,) for x in strides))


#: Ops that only view their input (no arithmetic): emitting one beside the fused kernel costs nothing extra.
_VIEW_OPS = frozenset({"reshape", "transpose", "broadcast", "slice"})


def _kept(graph: Graph, covered: set[int], keep: set[int], out: int) -> set[int]:
    """``keep`` (covered nodes read outside the fused region) with every covered node they read in turn: a
    view chain whose end something else uses (a decoder's key and value going into its cache as well as
    into the attention) is emitted whole, not from a value the kernel never makes. ``out``, the fused
    kernel's own result, is made by the kernel: what it reads is not walked."""
    producers = {n.out.id: n for n in graph.live_nodes()}
    todo = [c for c in keep if c != out]
    while todo:
        node = producers.get(todo.pop())
        for x in node.inputs if node is not None else ():
            if x.id in covered and x.id not in keep:
                keep.add(x.id)
                todo.append(x.id)
    return keep


def planned_attention(graph: Graph, spec: ChipSpec, options: Options | Mapping[str, Any] | None = None,
                      rejections: list[str] | None = None,
                      forms: Collection[str] = FORMS) -> list[tuple[AttentionMatch, AttentionPlan]]:
    """Every recognised attention with the planner's decision for it on ``spec`` (``forms``: the
    kernel forms the target lowers, `pbsdk.core.target.Target.attention_forms`)."""
    out = []
    for m in find_attention(graph, rejections):
        plan = plan_attention(spec, m.op, options, forms)
        if not plan.fused and m.widened is not None:
            # The narrow operands cannot be read here: the f32 kernel reads the graph's widened copies.
            wide = plan_attention(spec, m.widened.op, options, forms)
            if wide.fused:
                why = f"{m.op.dtype} operands widened to f32 by the graph: not read narrow ({plan.reasons[0]})"
                wide = dataclasses.replace(wide, reasons=(why, *wide.reasons))
            m, plan = m.widened, wide
        out.append((m, plan))
    return out


def explain_attention(graph: Graph, spec: ChipSpec, options: Options | Mapping[str, Any] | None = None,
                      forms: Collection[str] = FORMS) -> list[str]:
    """``explain`` text for each attention in ``graph`` (fused or not, and why)."""
    from pbsdk.core.plan.attention import format_attention_plan

    rejections: list[str] = []
    out = [format_attention_plan(f"attention #{i} -> {m.out.type}", p)
           for i, (m, p) in enumerate(planned_attention(graph, spec, options, rejections, forms))]
    out += [f"attention pattern not fused: {r}" for r in rejections]
    return out


def fused_nodes(graph: Graph, spec: ChipSpec, options: Options | Mapping[str, Any] | None = None,
                forms: Collection[str] = FORMS) -> set[int]:
    """Positions in ``graph.live_nodes()`` of the nodes that fused attention kernels replace."""
    covered = {i for m, p in planned_attention(graph, spec, options, forms=forms) if p.fused for i in m.covered}
    return {i for i, n in enumerate(graph.live_nodes()) if n.out.id in covered}
