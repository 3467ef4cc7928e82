"""Differential fuzzing: random small `pbsdk.ops` programs, compiled and run, against numpy.

`generate(seed)` builds a `Program`: Python source of one function written with ``ops.*`` calls (random
shapes including 1 and primes, broadcasting, chains of elementwise ops feeding reductions, matmuls,
softmax, log_softmax, layernorm, transposes and reshapes) plus its random inputs. The same source runs
twice: with ``ops`` bound to `pbsdk.ops` under ``pbsdk.jit`` and with ``ops`` bound to
`pbsdk.testing.reference` on float64 copies of the inputs. `check` compares the two with
`pbsdk.testing.assert_close` at a tolerance widened for the chain's length and reduction sizes.

Every op stays inside its domain by construction (``log(abs(x) + 1)``, ``exp(minimum(x, 3))``, division
by ``abs(y) + 1``), so a mismatch is a compiler bug, not a NaN race.

``pbsdk fuzz --count N --seed S`` runs programs ``S .. S+N-1``; a failure prints its seed and program.
"""

from __future__ import annotations

import dataclasses
import math
import random
import traceback
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pbsdk.core.errors import UnsupportedError

DIMS = (1, 1, 2, 3, 4, 5, 7, 8, 11, 13, 16)
UNARY = ("relu", "neg", "abs", "tanh", "sigmoid", "erf", "gelu", "exp", "log", "sqrt", "rsqrt")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")


@dataclasses.dataclass
class Program:
    seed: int
    source: str
    inputs: list[np.ndarray]
    dtype: str
    n_ops: int
    reduction: int  # the largest product of reduction lengths along any path (for the tolerance)

    def __str__(self) -> str:
        shapes = ", ".join(f"{a.shape}:{a.dtype}" for a in self.inputs)
        return f"# seed {self.seed}; inputs {shapes}\n{self.source}"


@dataclasses.dataclass
class _Var:
    name: str
    shape: tuple[int, ...]
    red: int  # reduction terms accumulated so far


class _Gen:
    def __init__(self, seed: int) -> None:
        self.r = random.Random(seed)
        self.seed = seed
        self.dtype = "float64" if self.r.random() < 0.2 else "float32"
        self.params: list[str] = []
        self.shapes: list[tuple[int, ...]] = []
        self.lines: list[str] = []
        self.pool: list[_Var] = []
        self.n = 0
        self.ops = 0

    def dim(self) -> int:
        return self.r.choice(DIMS)

    def new_input(self, shape: tuple[int, ...]) -> _Var:
        name = f"x{len(self.params)}"
        self.params.append(name)
        self.shapes.append(shape)
        v = _Var(name, shape, 1)
        self.pool.append(v)
        return v

    def emit(self, expr: str, shape: tuple[int, ...], red: int) -> _Var:
        name = f"t{self.n}"
        self.n += 1
        self.ops += 1
        self.lines.append(f"    {name} = {expr}")
        v = _Var(name, shape, red)
        self.pool.append(v)
        return v

    def broadcastable(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts against ``shape`` (dims set to 1, leading dims dropped)."""
        out = [d if self.r.random() < 0.6 else 1 for d in shape]
        drop = self.r.randint(0, len(out)) if self.r.random() < 0.3 else 0
        return tuple(out[drop:])

    # ----------------------------------------------------------------------------------------- steps
    def unary(self, v: _Var) -> _Var:
        op = self.r.choice(UNARY)
        a = v.name
        expr = {
            "exp": f"ops.exp(ops.minimum({a}, 3.0))",
            "log": f"ops.log(ops.abs({a}) + 1.0)",
            "sqrt": f"ops.sqrt(ops.abs({a}) + 0.5)",
            "rsqrt": f"ops.rsqrt(ops.abs({a}) + 1.0)",
        }.get(op, f"ops.{op}({a})")
        return self.emit(expr, v.shape, v.red)

    def binary(self, v: _Var) -> _Var:
        op = self.r.choice(BINARY)
        choice = self.r.random()
        if choice < 0.25:
            other, shape, red = repr(round(self.r.uniform(-2, 2), 3)), v.shape, v.red
        else:
            partners = [p for p in self.pool if p is not v and _broadcasts(p.shape, v.shape)]
            if partners and choice < 0.6:
                p = self.r.choice(partners)
            else:
                p = self.new_input(self.broadcastable(v.shape))
            other, shape, red = p.name, tuple(np.broadcast_shapes(v.shape, p.shape)), max(v.red, p.red)
        if op == "div":
            scalar = other[0].isdigit() or other[0] == "-"
            divisor = repr(abs(float(other)) + 1.0) if scalar else f"ops.abs({other}) + 1.0"
            expr = f"ops.div({v.name}, {divisor})"
        elif self.r.random() < 0.4:
            expr = f"ops.{op}({other}, {v.name})"
        else:
            expr = f"ops.{op}({v.name}, {other})"
        return self.emit(expr, shape, red)

    def reduce(self, v: _Var) -> _Var:
        if not v.shape:
            return self.unary(v)
        op = self.r.choice(("sum", "max", "min", "mean"))
        keep = self.r.random() < 0.4
        rank = len(v.shape)
        if self.r.random() < 0.15:
            axes: Any = None
            red_axes = tuple(range(rank))
        elif self.r.random() < 0.2 and rank >= 2:
            axes = tuple(sorted(self.r.sample(range(rank), 2)))
            red_axes = axes
        else:
            axes = self.r.randrange(rank) - (rank if self.r.random() < 0.5 else 0)
            red_axes = (axes % rank,)
        shape = tuple(1 if i in red_axes else d for i, d in enumerate(v.shape) if keep or i not in red_axes)
        terms = math.prod(v.shape[i] for i in red_axes)
        return self.emit(f"ops.{op}({v.name}, axis={axes!r}, keepdims={keep})", shape,
                         v.red * (terms if op in ("sum", "mean") else 1))

    def normalise(self, v: _Var) -> _Var:
        if not v.shape:
            return self.unary(v)
        rank = len(v.shape)
        kind = self.r.choice(("softmax", "log_softmax", "layernorm"))
        if kind == "layernorm":
            if self.r.random() < 0.5:
                w = self.new_input((v.shape[-1],))
                b = self.new_input((v.shape[-1],))
                return self.emit(f"ops.layernorm({v.name}, {w.name}, {b.name})", v.shape, v.red * v.shape[-1])
            return self.emit(f"ops.layernorm({v.name})", v.shape, v.red * v.shape[-1])
        axis = self.r.randrange(rank) - (rank if self.r.random() < 0.5 else 0)
        return self.emit(f"ops.{kind}({v.name}, axis={axis})", v.shape, v.red * v.shape[axis])

    def matmul(self, v: _Var) -> _Var:
        if not v.shape:
            return self.unary(v)
        k, n = v.shape[-1], self.dim()
        tb = self.r.random() < 0.3
        if len(v.shape) >= 2 and self.r.random() < 0.3:  # a batched right operand, batch dims broadcast
            batch = tuple(d if self.r.random() < 0.5 else 1 for d in v.shape[:-2])
            w_shape = batch + ((n, k) if tb else (k, n))
        elif len(v.shape) == 1 and self.r.random() < 0.4:  # vector @ vector
            w_shape, tb = (k,), False
        else:
            w_shape = (n, k) if tb else (k, n)
        w = self.new_input(w_shape)
        b_eff = np.zeros(w_shape if not tb else w_shape[:-2] + (w_shape[-1], w_shape[-2]))
        out = tuple(np.matmul(np.zeros(v.shape), b_eff).shape)
        if tb or self.r.random() < 0.3:
            expr = f"ops.matmul({v.name}, {w.name}, transpose_b={tb})"
        else:
            expr = f"{v.name} @ {w.name}"
        return self.emit(expr, out, v.red * k)

    def shape_op(self, v: _Var) -> _Var:
        if len(v.shape) >= 2 and self.r.random() < 0.6:
            perm = list(range(len(v.shape)))
            self.r.shuffle(perm)
            return self.emit(f"ops.transpose({v.name}, {tuple(perm)!r})", tuple(v.shape[p] for p in perm), v.red)
        size = math.prod(v.shape)
        return self.emit(f"ops.reshape({v.name}, ({size},))", (size,), v.red)

    def build(self) -> Program:
        rank = self.r.choice((1, 2, 2, 3))
        base = tuple(self.dim() for _ in range(rank))
        v = self.new_input(base)
        steps = self.r.randint(1, 6)
        weights = [("unary", 3), ("binary", 4), ("reduce", 2), ("normalise", 1), ("matmul", 2), ("shape", 1)]
        names = [w for w, c in weights for _ in range(c)]
        for _ in range(steps):
            kind = self.r.choice(names)
            if kind in ("reduce", "matmul", "normalise") and len(v.shape) == 0:
                kind = "unary"
            v = {"unary": self.unary, "binary": self.binary, "reduce": self.reduce, "normalise": self.normalise,
                 "matmul": self.matmul, "shape": self.shape_op}[kind](v)
        results = [v.name]
        if self.r.random() < 0.2 and len(self.pool) > 2:
            extra = self.r.choice([p for p in self.pool[:-1] if p.name.startswith("t")] or [self.pool[0]])
            results.append(extra.name)
        ret = ", ".join(results)
        src = f"def prog({', '.join(self.params)}):\n" + "\n".join(self.lines) + f"\n    return {ret}\n"
        rng = np.random.default_rng(self.seed)
        inputs = [rng.uniform(-2.0, 2.0, size=s).astype(self.dtype) for s in self.shapes]
        return Program(self.seed, src, inputs, self.dtype, self.ops, max(p.red for p in self.pool))


def _broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """True when broadcasting ``a`` against ``b`` gives ``b``'s shape."""
    try:
        return tuple(np.broadcast_shapes(a, b)) == tuple(b)
    except ValueError:
        return False


def generate(seed: int) -> Program:
    return _Gen(seed).build()


def _function(source: str, ops_module: Any) -> Callable[..., Any]:
    namespace: dict[str, Any] = {"ops": ops_module}
    exec(compile(source, "<pbsdk-fuzz>", "exec"), namespace)  # noqa: S102 - generated above, never user input
    return namespace["prog"]


class _Float64Reference:
    """`pbsdk.testing.reference` with ``dtype=float64`` forced: numpy arithmetic on 0-d arrays (``x + 1.0``
    in a program) gives numpy scalars, which the reference's dtype inference does not count as arrays."""

    def __init__(self, module: Any) -> None:
        self._m = module

    def __getattr__(self, name: str) -> Any:
        import functools
        import inspect

        fn = getattr(self._m, name)
        if "dtype" in inspect.signature(fn).parameters:
            return functools.partial(fn, dtype=np.float64)
        return fn


def reference(program: Program) -> list[np.ndarray]:
    """The program evaluated in float64 with `pbsdk.testing.reference`, rounded to the program's dtype."""
    from pbsdk.testing import reference as ref

    out = _function(program.source, _Float64Reference(ref))(*[a.astype(np.float64) for a in program.inputs])
    outs = list(out) if isinstance(out, tuple) else [out]
    return [np.asarray(o).astype(program.dtype) for o in outs]


def tolerance(program: Program) -> Any:
    from pbsdk.testing import Tolerance

    base = 2e-6 if program.dtype == "float32" else 1e-13
    factor = program.n_ops * math.sqrt(max(1, program.reduction))
    return Tolerance(base * factor, base * factor)


def run(program: Program, *, target: str = "cpu", options: dict[str, Any] | None = None) -> list[np.ndarray]:
    import pbsdk

    fn = pbsdk.jit(_function(program.source, pbsdk.ops), target=target, options=options)
    out = fn(*program.inputs)
    return list(out) if isinstance(out, tuple) else [out]


def check(program: Program, **kwargs: Any) -> None:
    """Compile and run ``program`` and compare with numpy; raises AssertionError (or the pbsdk error)."""
    from pbsdk.testing import assert_close

    expected = reference(program)
    actual = run(program, **kwargs)
    if len(actual) != len(expected):
        raise AssertionError(f"{len(actual)} results, expected {len(expected)}")
    tol = tolerance(program)
    for i, (a, e) in enumerate(zip(actual, expected)):
        scale = max(1.0, float(np.max(np.abs(e.astype(np.float64))))) if e.size else 1.0
        t = type(tol)(tol.atol * scale, tol.rtol)
        assert_close(np.asarray(a), e, op=f"fuzz seed {program.seed} result {i}", dtype=program.dtype, tol=t)


@dataclasses.dataclass
class Failure:
    program: Program
    error: str
    #: "wrong" (a result off numpy), "error" (an exception), or "unsupported": the target's spec declares
    #: no support for the program's dtype and says so with a typed error, which is correct behaviour.
    kind: str = "error"

    def __str__(self) -> str:
        return f"{self.program}{self.error}"


def fuzz(count: int, seed: int = 0, **kwargs: Any) -> Iterator[tuple[Program, Failure | None]]:
    """Run programs ``seed .. seed+count-1``; yields each program and its failure (None when it passed)."""
    for s in range(seed, seed + count):
        program = generate(s)
        try:
            check(program, **kwargs)
        except AssertionError as exc:
            yield program, Failure(program, f"WRONG RESULT: {exc}", "wrong")
        except UnsupportedError as exc:
            unsupported = "is not supported by chip spec" in str(exc)
            yield program, Failure(program, f"{'UNSUPPORTED' if unsupported else 'ERROR'}: {exc}",
                                   "unsupported" if unsupported else "error")
        except Exception as exc:  # noqa: BLE001 - a PbsdkError or a crash: both are findings
            tb = traceback.format_exception_only(type(exc), exc)[-1].strip()
            yield program, Failure(program, f"ERROR: {tb}")
        else:
            yield program, None
