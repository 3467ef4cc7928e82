"""ONNX symbolic dimensions: a model whose inputs have ``dim_param`` (or unnamed unknown) dimensions compiled
once with symbolic sizes, on targets that compile run-time sizes (`pbsdk.core.target.Target.dynamic_shapes`).

Each distinct ``dim_param`` becomes one symbol (`symbols_of`: the same name on two inputs is the same
symbol, bound once per call), each unnamed unknown dimension a symbol of its own. A size is then an int or
a `pbsdk.core.dims.Dim` (a sum of symbols and products of them, ``b*s`` for a flattened batch of sequences).

A *shape value* is what ``Shape(x)`` of such a tensor gives: a numpy object array holding ints and `Dim`s.
`fold` evaluates the shape ops of an exported model (``Shape -> Gather -> Concat -> Reshape`` chains, their
``Unsqueeze``, ``Slice``, ``Cast``, integer arithmetic and the ``Where(Equal(shape, -1), ...)`` of an
``expand``) on such values at import, as ``onnx.reference`` folds static ones; a value it cannot decide
(whether a size equals 5, a division that is not exact) is an `UnsupportedError`. Other ops read a shape
value as sizes (`sizes`: ``Reshape``, ``Expand``, ``ConstantOfShape``, ``Range``, ``Slice``) or as data
(`pbsdk.onnx.convert.tensor`: the kernel reads the symbols' values from its inputs' shapes).

Where a size meets a bound only the values can settle (a ``Slice`` of a 64-row position table up to the
sequence length ``s``), the conversion records a `Requirement` (``s <= 64``) that each call checks before
running (`check`: an `ArgumentError` naming the node). Pure: numpy and `Dim`, no protos, no IR.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from pbsdk.core.dims import Dim
from pbsdk.core.errors import ArgumentError, UnsupportedError

_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


@dataclasses.dataclass(frozen=True)
class Symbols:
    """The inputs' shapes with a `Dim` per dynamic dimension, and what each symbol stands for (its
    ``dim_param``, or ``"input_ids[1]"`` for an unnamed one)."""

    shapes: Mapping[str, tuple[int | Dim, ...]]
    names: Mapping[str, str]

    def describe(self) -> str:
        return ", ".join(f"{s} = {n}" if s != n else s for s, n in self.names.items())


def symbols_of(inputs: Mapping[str, Sequence[int | str | None]]) -> Symbols:
    """A symbol per distinct ``dim_param`` (spelt as it is when it is an identifier, else ``d<k>``) and per
    unnamed unknown dimension (``<input>_<axis>``, made an identifier), none named twice."""
    by_param: dict[str, str] = {}
    names: dict[str, str] = {}

    def fresh(wanted: str) -> str:
        base = re.sub(r"\W", "_", wanted)
        base = base if _IDENTIFIER.fullmatch(base) else f"d_{base}"
        name, k = base, 1
        while name in names:
            name, k = f"{base}_{k}", k + 1
        return name

    shapes: dict[str, tuple[int | Dim, ...]] = {}
    for inp, dims in inputs.items():
        shape: list[int | Dim] = []
        for axis, d in enumerate(dims):
            if isinstance(d, int) and d >= 0:
                shape.append(d)
                continue
            if isinstance(d, str) and d:
                sym = by_param.get(d)
                if sym is None:
                    sym = by_param[d] = fresh(d if _IDENTIFIER.fullmatch(d) else f"d{len(names)}")
                    names[sym] = d
            else:
                sym = fresh(f"{inp}_{axis}")
                names[sym] = f"{inp}[{axis}]"
            shape.append(Dim(((sym, 1),)))
        shapes[inp] = tuple(shape)
    return Symbols(shapes, names)


def is_symbolic(value: Any) -> bool:
    """Whether ``value`` is a shape value holding a `Dim` (an object array)."""
    return isinstance(value, np.ndarray) and value.dtype == object


def shape_value(shape: Sequence[int | Dim]) -> np.ndarray:
    """``Shape(x)`` of a tensor of ``shape``: an int64 array, or an object array where a size is a `Dim`."""
    if any(isinstance(d, Dim) for d in shape):
        out = np.empty(len(shape), dtype=object)
        out[:] = list(shape)
        return out
    return np.asarray(shape, dtype=np.int64)


def _plain(value: np.ndarray) -> np.ndarray:
    """An object array whose entries are all ints again as int64 (a shape value whose symbols cancelled)."""
    if is_symbolic(value) and not any(isinstance(v, Dim) for v in value.reshape(-1)):
        return value.astype(np.int64)
    return value


def _sized(value: Any) -> np.ndarray:
    """An operand of `fold` as an array: object arrays as they are, others as int64 where integral."""
    a = np.asarray(value)
    return a if is_symbolic(a) or a.dtype.kind in "fb" else a.astype(np.int64)


def _equal(a: Any, b: Any) -> bool:
    """Whether sizes ``a`` and ``b`` are equal for every value of the symbols (a size is at least 1, so a
    `Dim` of positive coefficients never equals an int below 1); an `UnsupportedError` when it depends."""
    if isinstance(a, Dim) or isinstance(b, Dim):
        if isinstance(a, Dim) and isinstance(b, Dim) and a == b:
            return True
        diff = a - b
        if isinstance(diff, int):
            return diff == 0
        if all(c > 0 for _, c in diff.coeffs) and diff.const >= 0:
            return False
        if all(c < 0 for _, c in diff.coeffs) and diff.const <= 0:
            return False
        raise UnsupportedError(f"whether {a} equals {b} depends on the symbols' values")
    return bool(a == b)


def _compare(op: str, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    out = np.empty(a.shape, dtype=np.bool_)
    for idx in np.ndindex(a.shape):
        x, y = a[idx], b[idx]
        if op == "Equal":
            out[idx] = _equal(x, y)
            continue
        if not (isinstance(x, Dim) or isinstance(y, Dim)):
            out[idx] = {"Less": x < y, "Greater": x > y, "LessOrEqual": x <= y, "GreaterOrEqual": x >= y}[op]
            continue
        raise UnsupportedError(f"{op} of sizes {x} and {y} depends on the symbols' values")
    return out


def _divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a, b)
    out = np.empty(a.shape, dtype=object)
    for idx in np.ndindex(a.shape):
        x, y = a[idx], b[idx]
        try:
            out[idx] = x // y if isinstance(x, Dim) or isinstance(y, Dim) else int(x) // int(y)
        except TypeError:
            raise UnsupportedError(f"{x} / {y} is not an exact division for every value of the symbols") from None
    return out


def _slice(data: np.ndarray, attrs: Mapping[str, Any], starts: Any, ends: Any, axes: Any = None,
           steps: Any = None) -> np.ndarray:
    st, en = _ints(starts, "Slice's starts"), _ints(ends, "Slice's ends")
    ax = _ints(axes, "Slice's axes") if axes is not None else list(range(len(st)))
    sp = _ints(steps, "Slice's steps") if steps is not None else [1] * len(st)
    index = [slice(None)] * data.ndim
    for a, s, e, step in zip(ax, st, en, sp):
        index[a % data.ndim] = slice(s, e, step)
    return data[tuple(index)]


def _ints(value: Any, what: str) -> list[int]:
    a = np.asarray(value)
    if is_symbolic(a):
        raise UnsupportedError(f"{what} depends on the model's symbolic dimensions ({_show(a)})")
    return [int(v) for v in a.reshape(-1)]


def _show(a: np.ndarray) -> str:
    return "[" + ", ".join(str(v) for v in a.reshape(-1)) + "]"


def _axes(node_axes: Any, given: Any, what: str) -> list[int]:
    return _ints(given, what) if given is not None else [int(v) for v in (node_axes or [])]


#: ONNX integer element types: a Cast to one keeps the sizes.
_INT_TYPES = {2, 3, 4, 5, 6, 7, 12, 13}


def fold(op: str, opset: int, attrs: Mapping[str, Any], inputs: Sequence[Any], out_elem: int | None) -> \
        tuple[np.ndarray, ...] | None:
    """The outputs of shape op ``op`` on known values ``inputs``, some of them shape values (`is_symbolic`);
    None when ``op`` is not one evaluated on shape values (it is converted instead: `sizes`, or data)."""
    out = _fold(op, opset, attrs, inputs, out_elem)
    if out is None:
        return None
    # numpy gives a lone element of an object array as the element itself: a 0-d array again
    return tuple(_plain(v if isinstance(v, np.ndarray) else np.asarray(v, dtype=object)) for v in out)


def _fold(op: str, opset: int, attrs: Mapping[str, Any], inputs: Sequence[Any], out_elem: int | None) -> \
        tuple[Any, ...] | None:
    xs: list[Any] = [None if v is None else _sized(v) for v in inputs]
    if op == "Identity":
        return (xs[0],)
    if op == "Shape":
        start, end = attrs.get("start", 0), attrs.get("end", None)
        return (np.asarray(np.shape(inputs[0])[slice(start, end)], dtype=np.int64),)
    if op == "Size":
        return (np.asarray(int(np.prod(np.shape(inputs[0]))), dtype=np.int64),)
    if op == "Cast":
        if out_elem in _INT_TYPES:
            return (_plain(xs[0]),)
        return None  # a size read as a float or bool: data
    if op == "Gather":
        axis = int(attrs.get("axis", 0))
        idx = _ints(xs[1], "Gather's indices")
        index = np.asarray(idx, dtype=np.int64).reshape(np.shape(xs[1]))
        return (_plain(np.take(xs[0], index, axis=axis)),)
    if op == "Unsqueeze":
        axes = _axes(attrs.get("axes"), xs[1] if len(xs) > 1 else None, "Unsqueeze's axes")
        out = xs[0]
        rank = out.ndim + len(axes)
        for a in sorted(a % rank for a in axes):
            out = np.expand_dims(out, a)
        return (out,)
    if op == "Squeeze":
        axes = _axes(attrs.get("axes"), xs[1] if len(xs) > 1 else None, "Squeeze's axes")
        return (np.squeeze(xs[0], axis=tuple(axes)) if axes else np.squeeze(xs[0]),)
    if op == "Concat":
        parts = [x for x in xs if x is not None and x.size]
        return (_plain(np.concatenate([p.astype(object) for p in parts], axis=int(attrs["axis"]))),)
    if op == "Reshape":
        target = _ints(xs[1], "Reshape's shape")
        target = [xs[0].shape[i] if d == 0 and not attrs.get("allowzero", 0) else d for i, d in enumerate(target)]
        return (xs[0].reshape(target),)
    if op == "Slice" and opset >= 10:
        if any(is_symbolic(x) for x in xs[1:]):
            return None  # known data cut to a symbolic size: a tensor of that size
        return (_plain(_slice(xs[0], attrs, *xs[1:])),)
    if op in ("Add", "Sub", "Mul"):
        if any(x.dtype.kind == "f" for x in xs):
            return None  # float arithmetic on a size: data
        fn = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply}[op]
        return (_plain(fn(xs[0].astype(object), xs[1].astype(object))),)
    if op == "Div":
        if any(x.dtype.kind == "f" for x in xs):
            return None
        return (_plain(_divide(xs[0], xs[1])),)
    if op == "Neg":
        return (_plain(-xs[0].astype(object)),)
    if op in ("Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual"):
        return (_compare(op, xs[0], xs[1]),)
    if op == "Where":
        cond = xs[0]
        if is_symbolic(cond) or cond.dtype != np.bool_:
            return None
        return (_plain(np.where(cond, xs[1].astype(object), xs[2].astype(object))),)
    if op == "Expand" and not is_symbolic(xs[1]):
        return (np.broadcast_to(xs[0], np.broadcast_shapes(xs[0].shape, tuple(_ints(xs[1], "Expand's shape")))).copy(),)
    return None


def sizes(value: Any, what: str) -> list[int | Dim]:
    """The sizes in a known value (a shape value's `Dim`s among them): a Reshape's shape, a Range's bound."""
    a = np.asarray(value)
    if is_symbolic(a):
        return [v if isinstance(v, Dim) else int(v) for v in a.reshape(-1)]
    return [int(v) for v in a.reshape(-1)]


# ----------------------------------------------------------------------------------------- requirements

@dataclasses.dataclass(frozen=True)
class Requirement:
    """``small <= large`` at every call, where a symbolic size meets a bound only the values settle (the
    ``node`` that needs it: a slice of a 64-row table up to ``s`` needs ``s <= 64``)."""

    small: int | Dim
    large: int | Dim
    node: str

    def check(self, env: Mapping[str, int]) -> None:
        lo, hi = (v.evaluate(env) if isinstance(v, Dim) else v for v in (self.small, self.large))
        if lo > hi:
            named = sorted({s for v in (self.small, self.large) if isinstance(v, Dim) for s in v.symbols})
            raise ArgumentError(f"{self.node} needs {self.small} <= {self.large}, and the inputs give {lo} > {hi} "
                                f"({', '.join(f'{s}={env[s]}' for s in named)})")

    def __str__(self) -> str:
        return f"{self.small} <= {self.large} ({self.node})"


_REQUIREMENTS: contextvars.ContextVar[list[Requirement] | None] = contextvars.ContextVar(
    "pbsdk_onnx_requirements", default=None)
_NODE: contextvars.ContextVar[str] = contextvars.ContextVar("pbsdk_onnx_node", default="a node")


@contextlib.contextmanager
def collecting(into: list[Requirement]) -> Iterator[None]:
    """Within it, `require` records into ``into`` (a model's conversion)."""
    token = _REQUIREMENTS.set(into)
    try:
        yield
    finally:
        _REQUIREMENTS.reset(token)


@contextlib.contextmanager
def at_node(label: str) -> Iterator[None]:
    """The node being converted, named in the requirements it records."""
    token = _NODE.set(label)
    try:
        yield
    finally:
        _NODE.reset(token)


def _holds(small: int | Dim, large: int | Dim) -> bool | None:
    """Whether ``small <= large`` for every value of the symbols (each at least 1): True or False where that
    is decided, None where it depends on the values."""
    diff = large - small
    if isinstance(diff, int):
        return diff >= 0
    least = diff.evaluate(dict.fromkeys(diff.symbols, 1))
    if all(c >= 0 for _, c in diff.coeffs) and least >= 0:
        return True
    if all(c <= 0 for _, c in diff.coeffs) and least < 0:
        return False
    return None


def require(small: int | Dim, large: int | Dim, what: str) -> None:
    """``small <= large``: checked now where it is decided (an `UnsupportedError` where it is false),
    recorded for every call otherwise (a `Requirement` of the node being converted)."""
    holds = _holds(small, large)
    if holds:
        return
    if holds is False:
        raise UnsupportedError(f"{what}: {small} <= {large} is false")
    collector = _REQUIREMENTS.get()
    if collector is None:
        raise UnsupportedError(f"{what}: {small} <= {large} is needed at run time")
    req = Requirement(small, large, f"{_NODE.get()} ({what})")
    if req not in collector:
        collector.append(req)


def check(requirements: Sequence[Requirement], env: Mapping[str, int]) -> None:
    for r in requirements:
        r.check(env)


def bind(declared: Mapping[str, Sequence[int | Dim]], shapes: Mapping[str, Sequence[int]], symbols: Symbols, *,
         what: str = "model") -> dict[str, int]:
    """The symbols' values in one call: each read from the first input dimension that is it, every other
    dimension checked (the same ``dim_param`` on two inputs must have one size, a static one its size); a
    mismatch is an `ArgumentError` naming the input and the ``dim_param``."""
    env: dict[str, int] = {}
    where: dict[str, str] = {}
    for name, want in declared.items():
        got = tuple(shapes[name])
        if len(got) != len(want):
            raise ArgumentError(f"{what}: input {name!r} has shape {list(got)}, expected rank {len(want)} "
                                f"({_declared(want, symbols)})")
        for axis, (d, n) in enumerate(zip(want, got)):
            if isinstance(d, Dim):
                sym = d.symbol
                assert sym is not None, d
                if sym not in env:
                    if n < 1:
                        raise ArgumentError(f"{what}: input {name!r} has shape {list(got)}: its dimension {axis} "
                                            f"({symbols.names[sym]}) must be at least 1")
                    env[sym], where[sym] = int(n), f"input {name!r} dimension {axis}"
                elif env[sym] != n:
                    raise ArgumentError(f"{what}: input {name!r} has shape {list(got)}, but its dimension {axis} is "
                                        f"{symbols.names[sym]!r}, which is {env[sym]} in {where[sym]}")
            elif d != n:
                raise ArgumentError(f"{what}: input {name!r} has shape {list(got)}, expected "
                                    f"{_declared(want, symbols)}")
    return env


def _declared(shape: Sequence[int | Dim], symbols: Symbols) -> str:
    return "[" + ", ".join(symbols.names.get(str(d), str(d)) if isinstance(d, Dim) else str(d) for d in shape) + "]"
