"""Symbolic dimensions: a kernel's shapes where some sizes are known only at call time.

A dimension in a kernel's signature (`pbsdk.core.target.Artifact.inputs`/``outputs``) is an ``int`` (static)
or a `Dim` expression string (dynamic): a sum of named symbols, or products of them, with integer
coefficients, ``"s0"``, ``"s0 + 1"``, ``"2*s0 - 3"``, ``"64*b*s"`` (a batch times a length: the rows of a
``(b, s, 64)`` tensor flattened). A call binds the symbols from the inputs' shapes (`bind`: a
symbol met twice must have one value) and evaluates every other expression from them (`evaluate`): the
outputs' shapes and the sizes the entry takes (`pbsdk.core.passes.dynamic_sizes`). Pure Python, no MLIR.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any

from pbsdk.core.errors import ArgumentError

Shape = tuple["int | str", ...]

_SYMBOL = r"[A-Za-z_][\w.]*"
_TERM = re.compile(rf"\s*([+-])?\s*(?:(\d+)\s*\*\s*)?({_SYMBOL}(?:\s*\*\s*{_SYMBOL})*|\d+)\s*")


def _monomial(factors: Sequence[str]) -> str:
    """The key of a product of symbols: its factors sorted, joined by ``*`` (``"b*s"``, ``"s*s"``)."""
    return "*".join(sorted(factors))


@dataclasses.dataclass(frozen=True)
class Dim:
    """``sum(coeff * term) + const``, parsed from and printed as its string form. A term is a symbol or a
    product of symbols (``"b*s"``: its factors sorted, joined by ``*``); a form whose terms are all single
    symbols is `linear` (what sizes read from one input dimension, or a cache grown by a step, are)."""

    coeffs: tuple[tuple[str, int], ...]
    const: int = 0

    @classmethod
    def parse(cls, text: str) -> Dim:
        pos, coeffs, const = 0, dict[str, int](), 0
        text = text.strip()
        if not text:
            raise ValueError("empty dimension expression")
        while pos < len(text):
            match = _TERM.match(text, pos)
            if match is None or match.end() == pos or (pos and match.group(1) is None):
                raise ValueError(f"malformed dimension expression {text!r} at {text[pos:]!r}")
            sign = -1 if match.group(1) == "-" else 1
            factor = int(match.group(2)) if match.group(2) else 1
            atom = match.group(3)
            if atom.isdigit():
                if match.group(2):
                    raise ValueError(f"malformed dimension expression {text!r}: a product of numbers")
                const += sign * int(atom)
            else:
                atom = _monomial([f.strip() for f in atom.split("*")])
                coeffs[atom] = coeffs.get(atom, 0) + sign * factor
            pos = match.end()
        return cls(tuple(sorted((s, c) for s, c in coeffs.items() if c)), const)

    @property
    def symbols(self) -> tuple[str, ...]:
        """The symbols the form names, each once, in the order of its terms."""
        return tuple(dict.fromkeys(f for term, _ in self.coeffs for f in term.split("*")))

    @property
    def linear(self) -> bool:
        """Whether every term is a single symbol (no product of symbols)."""
        return all("*" not in term for term, _ in self.coeffs)

    @property
    def symbol(self) -> str | None:
        """The symbol when the form is that symbol alone (``s``, not ``s + 1``, ``2*s`` or ``b*s``)."""
        if self.const or len(self.coeffs) != 1 or self.coeffs[0][1] != 1 or "*" in self.coeffs[0][0]:
            return None
        return self.coeffs[0][0]

    def evaluate(self, env: Mapping[str, int]) -> int:
        total = self.const
        for term, c in self.coeffs:
            for f in term.split("*"):
                c *= env[f]
            total += c
        return total

    # Sizes in shape arithmetic (a converter's ``n + 1``, ``2 * n``, ``b * s``): a form stays one, a form
    # with no symbol left is an int. Anything else (an inexact division, an ordering, ``int()``) is a
    # TypeError: the caller cannot handle a size known only at run time.
    @staticmethod
    def _form(x: object) -> Dim | None:
        if isinstance(x, Dim):
            return x
        if isinstance(x, int) and not isinstance(x, bool):
            return Dim((), x)
        return None

    @staticmethod
    def of(coeffs: Mapping[str, int], const: int = 0) -> int | Dim:
        """The form ``sum(coeffs) + const``, or the int ``const`` when no coefficient is left."""
        kept = tuple(sorted((s, c) for s, c in coeffs.items() if c))
        return Dim(kept, const) if kept else const

    def __add__(self, other: object) -> int | Dim:
        form = Dim._form(other)
        if form is None:
            return NotImplemented
        coeffs = dict(self.coeffs)
        for s, c in form.coeffs:
            coeffs[s] = coeffs.get(s, 0) + c
        return Dim.of(coeffs, self.const + form.const)

    __radd__ = __add__

    def __neg__(self) -> int | Dim:
        return Dim.of({s: -c for s, c in self.coeffs}, -self.const)

    def __sub__(self, other: object) -> int | Dim:
        form = Dim._form(other)
        return NotImplemented if form is None else self + (-form)

    def __rsub__(self, other: object) -> int | Dim:
        form = Dim._form(other)
        return NotImplemented if form is None else form + (-self)

    def __mul__(self, other: object) -> int | Dim:
        if isinstance(other, Dim):  # a product of forms: each term of one times each of the other
            coeffs: dict[str, int] = {}
            const = self.const * other.const
            for (ta, ca), (tb, cb) in (*((a, b) for a in self.coeffs for b in other.coeffs),
                                       *((a, ("", other.const)) for a in self.coeffs),
                                       *((("", self.const), b) for b in other.coeffs)):
                term = _monomial([f for f in (*ta.split("*"), *tb.split("*")) if f])
                coeffs[term] = coeffs.get(term, 0) + ca * cb
            return Dim.of(coeffs, const)
        if not isinstance(other, int) or isinstance(other, bool):
            return NotImplemented
        return Dim.of({s: c * other for s, c in self.coeffs}, self.const * other)

    __rmul__ = __mul__

    def _quotient(self, other: object) -> int | Dim | None:
        """The exact quotient by ``other`` (an int, or a form of one term: ``64*b*s``) when it exists for
        every value of the symbols; None when it depends on them; NotImplemented for other types."""
        if isinstance(other, Dim):
            if len(other.coeffs) != 1 or other.const:
                return None
            (term, c), = other.coeffs
            factors = term.split("*")
            coeffs: dict[str, int] = {}
            for t, k in self.coeffs:
                rest = t.split("*")
                for f in factors:
                    if f not in rest:
                        return None
                    rest.remove(f)
                if k % c:
                    return None
                coeffs[_monomial(rest)] = coeffs.get(_monomial(rest), 0) + k // c
            if self.const:
                return None
            const = coeffs.pop("", 0)
            return Dim.of(coeffs, const)
        if not isinstance(other, int) or isinstance(other, bool) or other == 0:
            return NotImplemented
        if all(c % other == 0 for _, c in self.coeffs) and self.const % other == 0:
            return Dim.of({s: c // other for s, c in self.coeffs}, self.const // other)
        return None

    def __mod__(self, other: object) -> int:
        """0 when the form is a multiple of ``other`` (an int, or a form of one term) whatever the symbols;
        a TypeError when that depends on the symbols' values."""
        q = self._quotient(other)
        if q is NotImplemented:
            return NotImplemented
        if q is None:
            raise TypeError(f"{self} % {other} depends on the values of {', '.join(self.symbols)}")
        return 0

    def __rmod__(self, other: object) -> int:
        form = Dim._form(other)
        return NotImplemented if form is None else form % self

    def __floordiv__(self, other: object) -> int | Dim:
        """The exact quotient by ``other`` (see `__mod__`)."""
        q = self._quotient(other)
        if q is NotImplemented:
            return NotImplemented
        if q is None:
            raise TypeError(f"{self} // {other} is not exact")
        return q

    def __rfloordiv__(self, other: object) -> int | Dim:
        form = Dim._form(other)
        return NotImplemented if form is None else form // self

    def __str__(self) -> str:
        parts = []
        for s, c in self.coeffs:
            term = s if abs(c) == 1 else f"{abs(c)}*{s}"  # a product's factors are joined by * already
            parts.append(("- " if c < 0 else "+ ") + term)
        if self.const or not parts:
            parts.append(("- " if self.const < 0 else "+ ") + str(abs(self.const)))
        text = " ".join(parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]


def static(d: int | Dim) -> int:
    """``d`` where it is static; a TypeError (as `Dim`'s orderings raise) where it is known only at run time: for
    code that handles static sizes only, behind a check that refuses dynamic ones."""
    if isinstance(d, Dim):
        raise TypeError(f"size {d} is known only at run time")
    return d


def is_dynamic(shape: Sequence[int | str | Dim]) -> bool:
    return any(isinstance(d, (str, Dim)) for d in shape)


def canonical(dim: int | str) -> int | str:
    """A dimension as an int, or its expression in `Dim`'s printed form (an expression with no symbol is
    an int)."""
    if isinstance(dim, str):
        parsed = Dim.parse(dim)
        return parsed.const if not parsed.coeffs else str(parsed)
    return int(dim)


def evaluate(dim: int | str, env: Mapping[str, int]) -> int:
    return dim if isinstance(dim, int) else Dim.parse(dim).evaluate(env)


def bind(declared: Sequence[Sequence[int | str]], shapes: Sequence[Sequence[int]], *,
         what: str = "kernel") -> dict[str, int]:
    """The symbols' values from actual ``shapes`` of arguments ``declared`` so. A dimension that is a
    lone symbol binds it; others (static sizes, expressions) are checked once every symbol is bound. An
    inconsistent or unbound size is an `ArgumentError` naming the argument."""
    env: dict[str, int] = {}
    for i, (want, got) in enumerate(zip(declared, shapes)):
        if len(want) != len(got):
            raise ArgumentError(f"{what}: argument {i} has shape {tuple(got)}, expected rank {len(want)}")
        for d, n in zip(want, got):
            if isinstance(d, str):
                parsed = Dim.parse(d)
                sym = parsed.symbol
                if sym is not None and env.setdefault(sym, int(n)) != int(n):
                    raise ArgumentError(f"{what}: argument {i} has shape {tuple(got)}, but {sym} is "
                                        f"{env[sym]} in an earlier argument")
    for i, (want, got) in enumerate(zip(declared, shapes)):
        for d, n in zip(want, got):
            try:
                expect = evaluate(d, env)
            except KeyError as exc:
                raise ArgumentError(f"{what}: argument {i}'s size {d} names {exc.args[0]}, which no "
                                    "argument's size binds") from None
            if expect != int(n):
                raise ArgumentError(f"{what}: argument {i} has shape {tuple(got)}, expected "
                                    f"{tuple(evaluate(x, env) for x in want)} ({', '.join(map(str, want))})")
    for sym, n in env.items():
        if n < 1:
            raise ArgumentError(f"{what}: {sym} = {n}; dynamic sizes are at least 1")
    return env


def concrete(shape: Sequence[int | str], env: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(evaluate(d, env) for d in shape)


class Signature:
    """`bind` and `concrete` for one kernel's signature, parsed once: ``inputs`` and ``outputs`` are the
    shapes (ints and expressions), ``sizes`` further expressions to evaluate (a dynamic entry's sizes
    buffer). `__call__` maps the inputs' actual shapes to the outputs' and the sizes' values in a few
    microseconds; a mismatch falls back to `bind`, which names it."""

    def __init__(self, inputs: Sequence[Sequence[int | str]], outputs: Sequence[Sequence[int | str]],
                 sizes: Sequence[str] = (), *, what: str = "kernel") -> None:
        self.inputs = [tuple(s) for s in inputs]
        self.what = what
        self._binds: list[tuple[int, int, str]] = []  # (argument, dimension, symbol): first place a symbol is
        self._checks: list[tuple[int, int, Any]] = []  # (argument, dimension, int or parsed Dim)
        seen: set[str] = set()
        for i, shape in enumerate(self.inputs):
            for d, n in enumerate(shape):
                form = Dim.parse(n) if isinstance(n, str) else None
                lone = form.symbol if form is not None else None
                if lone is not None and lone not in seen:
                    seen.add(lone)
                    self._binds.append((i, d, lone))
                else:
                    self._checks.append((i, d, form if form is not None else int(n)))
        self._outputs = [[Dim.parse(n) if isinstance(n, str) else int(n) for n in shape] for shape in outputs]
        self._sizes = [Dim.parse(e) for e in sizes]

    def __call__(self, shapes: Sequence[Sequence[int]]) -> tuple[list[tuple[int, ...]], list[int]]:
        try:
            env = {sym: shapes[i][d] for i, d, sym in self._binds}
            ok = len(shapes) == len(self.inputs) and all(len(s) == len(w) for s, w in zip(shapes, self.inputs)) \
                and all(shapes[i][d] == (want if isinstance(want, int) else want.evaluate(env))
                        for i, d, want in self._checks) and all(v >= 1 for v in env.values())
        except (IndexError, KeyError):
            ok = False
        if not ok:
            env = bind(self.inputs, shapes, what=self.what)  # raises, naming the mismatch
        outs = [tuple(n if isinstance(n, int) else n.evaluate(env) for n in shape) for shape in self._outputs]
        return outs, [e.evaluate(env) for e in self._sizes]


__all__ = ["Dim", "Shape", "Signature", "bind", "canonical", "concrete", "evaluate", "is_dynamic", "static"]
