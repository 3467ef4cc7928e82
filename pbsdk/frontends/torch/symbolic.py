"""Which nodes of an ATen graph traced with symbolic sizes (Dynamo's automatic dynamic shapes,
``mark_dynamic``) depend on a size that changes between calls.

A node is *static* when every tensor it reads or makes has int sizes and no argument is a symbolic
scalar: it computes the same thing whatever the symbols' values, so it compiles once, as in a static graph.
A node whose value is a symbolic scalar (``sym_size``, ``s0 + 1``, ``sym_numel``) is host arithmetic on
sizes. Everything else is *dynamic*: its sizes are read at run time.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from typing import Any

import torch

from pbsdk.core.dims import Dim
from pbsdk.core.errors import UnsupportedError

_SYMBOLIC = (torch.SymInt, torch.SymFloat, torch.SymBool)


def is_symbolic_value(val: Any) -> bool:
    """Whether ``val`` (a node's ``meta["val"]``, or a tensor, a size, a tuple of them) involves a symbol."""
    if isinstance(val, _SYMBOLIC):
        return True
    if isinstance(val, torch.Tensor):
        return any(isinstance(d, torch.SymInt) for d in val.shape)
    if isinstance(val, (tuple, list)):
        return any(is_symbolic_value(v) for v in val)
    return False


def is_size_arithmetic(node: torch.fx.Node) -> bool:
    """A node computing a symbolic scalar on the host (``sym_size.int``, ``operator.add`` of sizes)."""
    return isinstance(node.meta.get("val"), _SYMBOLIC)


def _argument_is_symbolic(arg: Any) -> bool:
    if isinstance(arg, torch.fx.Node):
        return is_symbolic_value(arg.meta.get("val"))
    if isinstance(arg, (tuple, list)):
        return any(_argument_is_symbolic(a) for a in arg)
    return isinstance(arg, _SYMBOLIC)


def is_dynamic(node: torch.fx.Node) -> bool:
    """Whether ``node`` reads or makes a tensor of symbolic sizes, or takes a symbolic scalar."""
    if is_symbolic_value(node.meta.get("val")):
        return True
    return any(_argument_is_symbolic(a) for a in (*node.args, *node.kwargs.values()))


def graph_is_symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether any node of ``gm`` involves a symbol."""
    return any(is_dynamic(n) for n in gm.graph.nodes if n.op in ("placeholder", "call_function"))


_CONCRETE = contextvars.ContextVar("pbsdk_concrete_sizes", default=False)
_BOUND: contextvars.ContextVar[dict[str, int] | None] = contextvars.ContextVar("pbsdk_bound_sizes", default=None)


@contextlib.contextmanager
def bound_sizes(values: dict[str, int]) -> Iterator[None]:
    """Within it, `as_dim` evaluates each symbolic size with the symbols' ``values`` (a call's sizes): a
    graph traced with symbols converted for one concrete shape."""
    token = _BOUND.set(values)
    try:
        yield
    finally:
        _BOUND.reset(token)


def bind_symbols(gm: torch.fx.GraphModule, args: Any) -> dict[str, int]:
    """The values of ``gm``'s size symbols in a call with ``args``: from each placeholder that is a lone
    symbol (a ``SymInt`` input) or has a dimension that is one."""
    values: dict[str, int] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for node, arg in zip(placeholders, args):
        val = node.meta.get("val")
        if isinstance(val, torch.SymInt) and val.node.expr.is_Symbol and isinstance(arg, int):
            values[str(val.node.expr)] = arg
        elif isinstance(val, torch.Tensor) and isinstance(arg, torch.Tensor):
            for d, n in zip(val.shape, arg.shape):
                if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol:
                    values[str(d.node.expr)] = int(n)
    return values


@contextlib.contextmanager
def concrete_sizes() -> Iterator[None]:
    """Within it, `as_dim` gives each symbolic size its example value (the sizes of the call being
    traced): whether a node would convert once its sizes are known, i.e. compiled per shape."""
    token = _CONCRETE.set(True)
    try:
        yield
    finally:
        _CONCRETE.reset(token)


def as_dim(size: Any) -> int | Dim:
    """A size as pbsdk's graph carries it: an int, or a `Dim` form over torch's size symbols (``s0``,
    ``s0 + 1``, ``2*s1``, ``s0*s1``: a sum of products of them). Any other size (``s0 // 2``) is an
    `UnsupportedError`: its node stays with torch."""
    if isinstance(size, int):
        return size
    if not isinstance(size, torch.SymInt):
        raise UnsupportedError(f"size {size!r} is not an int")
    bound = _BOUND.get()
    if bound is not None:
        expr = size.node.expr
        missing = [str(s) for s in expr.free_symbols if str(s) not in bound]
        if missing:
            raise UnsupportedError(f"size {expr}: no input gives {', '.join(missing)}")
        return int(expr.subs({s: bound[str(s)] for s in expr.free_symbols}))
    if _CONCRETE.get():
        if not size.node.has_hint():
            raise UnsupportedError(f"size {size.node.expr} has no example value")
        return int(size.node.hint)
    expr = size.node.expr
    if expr.is_number:
        return int(expr)
    coeffs: dict[str, int] = {}
    const = 0
    for term, coeff in expr.as_coefficients_dict().items():
        if not coeff.is_integer:
            raise UnsupportedError(f"size {expr} is not linear in the size symbols")
        if term.is_number:
            const += int(coeff) * int(term)
        else:
            key = _monomial(term)
            if key is None:
                raise UnsupportedError(f"size {expr} is not a sum of products of the size symbols")
            coeffs[key] = coeffs.get(key, 0) + int(coeff)
    return Dim.of(coeffs, const)


def _monomial(term: Any) -> str | None:
    """A product of size symbols (``s0``, ``s0*s1``, ``s0**2``) as `Dim`'s term key (its factors sorted,
    joined by ``*``: the rows of a ``(b, s, d)`` tensor flattened are ``b*s``); None for anything else
    (a floor division, a negative power)."""
    factors: list[str] = []
    for base, power in term.as_powers_dict().items():
        if not base.is_Symbol or not power.is_Integer or int(power) < 1:
            return None
        factors += [str(base)] * int(power)
    return "*".join(sorted(factors)) if factors else None


def has_no_elements(val: Any) -> bool:
    """Whether ``val`` is a tensor with a static zero size (a symbolic size is at least 2: Dynamo
    specialises 0 and 1). Asks no question of the symbols, so it adds no guard."""
    return isinstance(val, torch.Tensor) and any(isinstance(d, int) and d == 0 for d in val.shape)
