"""``pbsdk.jax.jit``: a JAX function traced to a jaxpr, its equations lowered to pbsdk kernels, the rest
run by XLA.

Flow of one input signature (the pytree structure, every leaf's shape and dtype, the static arguments):

1. ``jax.make_jaxpr`` traces the function. Calls (``jit``/``pjit``, ``closed_call``, ``remat``) and custom
   derivatives (``custom_jvp_call``, ``custom_vjp_call``: their primal jaxpr) are inlined, giving one flat
   list of equations (`Step`s) over numbered values; equations computing small values from constants
   only are evaluated once (`_fold_constants`).
2. Every equation is tried through its converter on fresh inputs (`convert.step_supported`); those that
   do not convert are logged (logger ``pbsdk.jax``, one line per primitive) and left to XLA.
3. The equations are scheduled (a topological order that keeps supported and unsupported equations
   together where the dependencies allow) and cut into contiguous runs. A run of supported equations
   becomes one pbsdk kernel, unless it only moves data (reshapes, broadcasts, ...), which XLA does for
   free; every other run is one ``jax.jit`` of its equations (`XlaStage`). A kernel that does not compile
   is logged at WARNING and its run goes to XLA too: never a crash, never a wrong result.
4. A call runs the stages in order over an environment of values (numpy arrays between kernels, XLA
   arrays from XLA stages) and returns the outputs as ``jax.Array``s (or numpy arrays with
   ``output="numpy"``), in the function's output pytree.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import logging
import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.extend import core as jcore

from pbsdk.core.compiler import CompileRequest, compile_text, resolve
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.ir.emit import emit_graph, emit_program
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY, Graph
from pbsdk.core.runtime.kernel import Kernel
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Target
from pbsdk.frontends.jax.convert import (
    LAYOUT_PRIMITIVES,
    Context,
    convert_step,
    step_supported,
    value_type,
)
from pbsdk.frontends.jax.polymorphic import (
    bind_call,
    check_spec,
    declared_shapes,
    export_stage,
    symbolic_leaves,
    symbols_of,
)
from pbsdk.frontends.tracing import Tensor, tracing

log = logging.getLogger("pbsdk.jax")

#: Primitives whose body is inlined: calls, and custom derivatives (the primal computation only).
_INLINE = {"jit", "pjit", "closed_call", "core_call", "remat", "remat2", "checkpoint", "custom_jvp_call",
           "custom_vjp_call", "custom_vjp_call_jaxpr"}

#: Closed-over constants up to this many elements are folded into kernels; larger ones are kernel inputs
#: (the cpu target prints constants into its LLVM IR text, which is slow for big weights).
CONST_FOLD_LIMIT = 1024


# ----------------------------------------------------------------------------------------- flattening

@dataclasses.dataclass(frozen=True)
class Step:
    """One equation of the flattened jaxpr. Operands are value numbers or jax ``Literal``s; results are
    value numbers, or None for dropped results."""

    eqn: Any
    ins: tuple[Any, ...]
    outs: tuple[int | None, ...]

    @property
    def name(self) -> str:
        return str(self.eqn.primitive.name)


@dataclasses.dataclass
class Program:
    """A flattened jaxpr: steps in order, the avals and constants of its values, inputs and outputs."""

    steps: list[Step] = dataclasses.field(default_factory=list)
    avals: dict[int, Any] = dataclasses.field(default_factory=dict)
    consts: dict[int, Any] = dataclasses.field(default_factory=dict)
    inputs: list[int] = dataclasses.field(default_factory=list)
    outputs: list[Any] = dataclasses.field(default_factory=list)

    def new(self, aval: Any) -> int:
        ref = len(self.avals)
        self.avals[ref] = aval
        return ref

    def aval(self, ref: Any) -> Any:
        return ref.aval if isinstance(ref, jcore.Literal) else self.avals[ref]


def _callee(eqn: Any) -> tuple[Any, Sequence[Any]] | None:
    """The (jaxpr, consts) an inlinable equation calls, or None."""
    if eqn.primitive.name not in _INLINE:
        return None
    sub = eqn.params.get("jaxpr", eqn.params.get("call_jaxpr"))
    if isinstance(sub, jcore.ClosedJaxpr):
        jaxpr, consts = sub.jaxpr, sub.consts
    elif isinstance(sub, jcore.Jaxpr):
        jaxpr, consts = sub, ()
    else:
        return None
    if len(jaxpr.invars) != len(eqn.invars) or len(jaxpr.outvars) != len(eqn.outvars):
        return None
    return jaxpr, consts


def _inline(program: Program, jaxpr: Any, consts: Sequence[Any], ins: Sequence[Any]) -> list[Any]:
    """Append ``jaxpr``'s equations to ``program`` with its inputs bound to ``ins``; returns its outputs."""
    env: dict[Any, Any] = {}
    for var, value in zip(jaxpr.constvars, consts):
        ref = program.new(var.aval)
        program.consts[ref] = value
        env[var] = ref
    env.update(zip(jaxpr.invars, ins))

    def read(v: Any) -> Any:
        return v if isinstance(v, jcore.Literal) else env[v]

    for eqn in jaxpr.eqns:
        args = [read(v) for v in eqn.invars]
        callee = _callee(eqn)
        if callee is not None:
            results = _inline(program, callee[0], callee[1], args)
            for var, ref in zip(eqn.outvars, results):
                if not isinstance(var, jcore.DropVar):
                    env[var] = ref
            continue
        outs = tuple(None if isinstance(v, jcore.DropVar) else program.new(v.aval) for v in eqn.outvars)
        for var, out in zip(eqn.outvars, outs):
            if out is not None:
                env[var] = out
        program.steps.append(Step(eqn, tuple(args), outs))
    return [read(v) for v in jaxpr.outvars]


def _static_size(aval: Any) -> int | None:
    """The element count of an aval of static shape; None for one without a shape or of symbolic sizes."""
    shape = getattr(aval, "shape", None)
    if shape is None or not all(isinstance(d, (int, np.integer)) for d in shape):
        return None
    return math.prod(shape)


def _mentions_symbol(params: Mapping[str, Any]) -> bool:
    """Whether an equation's params hold a symbolic size (``iota[shape=(b,)]``, ``dim_as_value[dim=b]``)."""
    def symbolic(x: Any) -> bool:
        if isinstance(x, (tuple, list)):
            return any(symbolic(v) for v in x)
        return bool(jax.export.is_symbolic_dim(x))
    return any(symbolic(v) for v in params.values())


def _fold_constants(program: Program) -> None:
    """Evaluate (with JAX, as XLA would) the steps that compute small values from literals and
    constants only -- a pad value converted to the operand's dtype, a broadcast scalar -- so that their
    users see constants. Not a step whose sizes are symbolic (shape polymorphism)."""
    kept = []
    for step in program.steps:
        known = all(isinstance(r, jcore.Literal) or r in program.consts for r in step.ins) \
            and not _mentions_symbol(step.eqn.params)
        small = all((n := _static_size(v.aval)) is not None and n <= CONST_FOLD_LIMIT for v in step.eqn.outvars)
        if not (known and small) or step.eqn.effects or step.name in _INLINE:
            kept.append(step)
            continue
        eqn = step.eqn
        try:
            args = [r.val if isinstance(r, jcore.Literal) else program.consts[r] for r in step.ins]
            with eqn.ctx.manager:
                result = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(eqn.params))
        except Exception:  # noqa: BLE001 - not evaluable eagerly: left in place
            kept.append(step)
            continue
        for ref, value in zip(step.outs, result if eqn.primitive.multiple_results else [result]):
            if ref is not None:
                program.consts[ref] = value
    program.steps = kept


def flatten(closed: Any) -> Program:
    program = Program()
    program.inputs = [program.new(v.aval) for v in closed.jaxpr.invars]
    program.outputs = _inline(program, closed.jaxpr, closed.consts, program.inputs)
    _fold_constants(program)
    return program


# ------------------------------------------------------------------------------------ partitioning

def _literal_values(program: Program, step: Step) -> list[np.ndarray | None]:
    """Per operand: its value when it is a literal or a small constant (folded into kernels), else None."""
    out: list[np.ndarray | None] = []
    for ref in step.ins:
        if isinstance(ref, jcore.Literal):
            out.append(np.asarray(ref.val))
        elif ref in program.consts and np.size(program.consts[ref]) <= CONST_FOLD_LIMIT:
            out.append(np.asarray(program.consts[ref]))
        else:
            out.append(None)
    return out


def _schedule(program: Program, supported: list[bool]) -> list[int]:
    """A topological order of the steps that switches between supported and unsupported ones as rarely
    as the dependencies allow (greedy: keep taking ready steps of the current kind, in program order).
    Effectful steps keep their relative order."""
    producer = {ref: i for i, s in enumerate(program.steps) for ref in s.outs if ref is not None}
    deps: list[set[int]] = []
    last_effect = None
    for i, s in enumerate(program.steps):
        d = {producer[r] for r in s.ins if not isinstance(r, jcore.Literal) and r in producer}
        if s.eqn.effects:
            if last_effect is not None:
                d.add(last_effect)
            last_effect = i
        deps.append(d)
    users: list[list[int]] = [[] for _ in program.steps]
    for i, d in enumerate(deps):
        for j in d:
            users[j].append(i)
    waiting = [len(d) for d in deps]
    ready: dict[bool, list[int]] = {True: [], False: []}  # heaps of ready steps by kind
    for i, w in enumerate(waiting):
        if w == 0:
            heapq.heappush(ready[supported[i]], i)
    order: list[int] = []
    kind = supported[0] if supported else True
    while ready[True] or ready[False]:
        if not ready[kind]:
            kind = not kind
        i = heapq.heappop(ready[kind])
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready[supported[u]], u)
    assert len(order) == len(program.steps)
    return order


def _runs(order: list[int], supported: list[bool]) -> list[tuple[bool, list[int]]]:
    runs: list[tuple[bool, list[int]]] = []
    for i in order:
        if runs and runs[-1][0] == supported[i]:
            runs[-1][1].append(i)
        else:
            runs.append((supported[i], [i]))
    return runs


# ------------------------------------------------------------------------------------------- stages

def _to_carrier(x: Any, dtype: np.dtype) -> np.ndarray:
    a = x if type(x) is np.ndarray else np.asarray(x)  # a CPU jax.Array: no copy
    return a if a.dtype == dtype else a.astype(dtype)


def _from_carrier(a: np.ndarray, aval: Any) -> np.ndarray:
    dt = np.dtype(aval.dtype)
    if a.dtype == dt:
        return a
    return a != 0 if dt == np.bool_ else a.astype(dt)


class KernelStage:
    """A run of equations compiled into one pbsdk kernel: reads ``inputs`` from the environment (cast to
    the carrying dtypes), writes ``outputs`` (cast back to the jaxpr's dtypes); ``aliases`` are results
    that are an input or a constant unchanged."""

    def __init__(self, kernel: Kernel, graph: Graph, inputs: list[int], in_dtypes: list[str],
                 outputs: list[int], out_avals: list[Any], aliases: dict[int, Any], n_ops: int) -> None:
        self.kernel = kernel
        self.graph = graph
        self.inputs = inputs
        self.in_dtypes = [np.dtype(DTYPE_TO_NUMPY[dt]) for dt in in_dtypes]
        self.outputs = outputs
        self.out_avals = out_avals
        # Results whose dtype is not their carrier's (bool, integers) are converted after the call.
        self.converted = [np.dtype(DTYPE_TO_NUMPY[dt]) != np.dtype(a.dtype) for dt, a in
                          zip((value_type(a).dtype for a in out_avals), out_avals)]
        self.aliases = aliases
        self.n_ops = n_ops

    def run(self, env: dict[int, Any], sizes: Mapping[str, int] | None = None) -> None:
        outs = self.kernel(*[_to_carrier(env[r], dt) for r, dt in zip(self.inputs, self.in_dtypes)])
        if not isinstance(outs, tuple):
            outs = (outs,)
        for ref, out, aval, convert in zip(self.outputs, outs, self.out_avals, self.converted):
            env[ref] = _from_carrier(out, aval) if convert else out
        for ref, source in self.aliases.items():
            env[ref] = env[source] if isinstance(source, int) else source


class XlaStage:
    """A run of equations evaluated by XLA: one ``jax.jit`` of a function that binds them in order. In a
    symbolic plan (shape polymorphism: ``symbols`` given, ``in_avals`` the inputs' symbolic avals), the
    equations are exported once with their symbolic sizes and XLA compiles the export per concrete shape
    (`export_stage`)."""

    def __init__(self, steps: list[Step], inputs: list[int], outputs: list[int], *,
                 symbols: Mapping[str, Any] | None = None, in_avals: Sequence[Any] = ()) -> None:
        self.steps = steps
        self.inputs = inputs
        self.outputs = outputs
        self.n_ops = len(steps)
        self.carriers: tuple[str, ...] = ()
        if symbols:
            self.fn, self.carriers = export_stage(self._evaluate, in_avals, symbols)
        else:
            self.fn = jax.jit(self._evaluate)

    def _evaluate(self, *values: Any) -> list[Any]:
        env = dict(zip(self.inputs, values))
        for step in self.steps:
            eqn = step.eqn
            args = [r.val if isinstance(r, jcore.Literal) else env[r] for r in step.ins]
            with eqn.ctx.manager:
                result = eqn.primitive.bind(*args, **eqn.primitive.get_bind_params(eqn.params))
            results = result if eqn.primitive.multiple_results else [result]
            for ref, value in zip(step.outs, results):
                if ref is not None:
                    env[ref] = value
        return [env[r] for r in self.outputs]

    def run(self, env: dict[int, Any], sizes: Mapping[str, int] | None = None) -> None:
        carried = [np.empty((sizes[s],), np.int8) for s in self.carriers] if sizes is not None else []
        outs = self.fn(*[env[r] for r in self.inputs], *carried)
        env.update(zip(self.outputs, outs))


@dataclasses.dataclass(frozen=True)
class JaxCompileReport:
    """What compiling one signature of one function did (see `reports`)."""

    function: str
    signature: tuple[str, ...]            # the input leaves' types, e.g. ("float32[2,64]",)
    ops: int                              # equations after inlining calls
    compiled_ops: int                     # of those, how many run in pbsdk kernels
    kernels: int                          # pbsdk kernels compiled
    xla_stages: int                       # runs of equations left to XLA
    fallback_primitives: tuple[str, ...]  # one entry per equation that does not convert
    failed_kernels: int                   # kernels that did not compile (their equations run in XLA)
    seconds: float                        # tracing, lowering and compiling
    stages: tuple[Any, ...] = dataclasses.field(default=(), repr=False, compare=False)  # the kernel stages
    #: Shape polymorphism: the dimension variables this compile left symbolic (its kernels run every value
    #: of them); () for a compile of one concrete signature.
    symbols: tuple[str, ...] = ()

    def modelled_seconds(self) -> float | None:
        """On a target that models the chip's time (template and targets scaffolded from it): the time the
        kernels' last runs would take on the chip (`pbsdk.emulation`); None elsewhere."""
        from pbsdk.emulation import last_modelled_seconds

        return last_modelled_seconds([s.kernel for s in self.stages])


_reports: list[JaxCompileReport] = []
_reports_lock = threading.Lock()


def reports() -> list[JaxCompileReport]:
    """Reports of every signature compiled so far in this process, oldest first."""
    with _reports_lock:
        return list(_reports)


def clear_reports() -> None:
    with _reports_lock:
        _reports.clear()


class Plan:
    """One compiled signature: its stages and where the outputs come from. ``symbols``: the dimension
    variables of a symbolic signature (shape polymorphism; each as JAX's symbolic dimension), whose XLA
    stages are exported (`XlaStage`)."""

    def __init__(self, program: Program, request: CompileRequest, name: str,
                 symbols: Mapping[str, Any] | None = None) -> None:
        self.program = program
        self.stages: list[KernelStage | XlaStage] = []
        self.fallbacks: list[str] = []
        self.failed = 0
        steps = program.steps
        supported = []
        reasons: dict[str, str] = {}
        for step in steps:
            ok, why = step_supported(step.name, dict(step.eqn.params), [program.aval(r) for r in step.ins],
                                     [v.aval for v in step.eqn.outvars], _literal_values(program, step))
            supported.append(ok)
            if not ok:
                self.fallbacks.append(step.name)
                reasons.setdefault(step.name, why)
        for prim, count in Counter(self.fallbacks).items():
            log.info("pbsdk: jax primitive %s falls back to XLA: %s%s", prim, reasons[prim],
                     f" ({count} equations)" if count > 1 else "")
        order = _schedule(program, supported) if steps else []
        runs = _runs(order, supported)
        # Values each run must hand on: read by a later run or returned.
        later_uses: list[set[int]] = []
        seen = {r for r in program.outputs if isinstance(r, int)}
        for _, idx in reversed(runs):
            later_uses.append(set(seen))
            for i in idx:
                seen.update(r for r in steps[i].ins if isinstance(r, int))
        later_uses.reverse()
        for k, ((ok, idx), needed) in enumerate(zip(runs, later_uses)):
            run_steps = [steps[i] for i in idx]
            defined = {r for s in run_steps for r in s.outs if r is not None}
            outputs = sorted(defined & needed)
            if not outputs and not any(s.eqn.effects for s in run_steps):
                continue  # dead code (make_jaxpr keeps unused equations)
            if ok and any(s.name not in LAYOUT_PRIMITIVES for s in run_steps):
                try:
                    self.stages.append(self._kernel(run_steps, outputs, request, f"{name}_k{k}"))
                    continue
                except Exception as exc:  # noqa: BLE001 - any failure: XLA runs these equations instead
                    self.failed += 1
                    log.warning("pbsdk: a kernel of %d jax equations did not compile and runs in XLA: %s: %s",
                                len(run_steps), type(exc).__name__, exc)
            inputs = sorted({r for s in run_steps for r in s.ins if isinstance(r, int)} - defined)
            self.stages.append(XlaStage(run_steps, inputs, outputs, symbols=symbols,
                                        in_avals=[program.avals[r] for r in inputs]))

    def _kernel(self, run_steps: list[Step], outputs: list[int], request: CompileRequest,
                name: str) -> KernelStage:
        program = self.program
        graph = Graph()
        cx = Context()
        env: dict[int, Tensor] = {}
        inputs: list[int] = []
        with tracing(graph):
            for step in run_steps:
                args = []
                literals = _literal_values(program, step)
                for ref, lit in zip(step.ins, literals):
                    if isinstance(ref, jcore.Literal):
                        args.append(cx.operand(lit, value_type(ref.aval).dtype))
                        continue
                    if ref not in env:
                        vt = value_type(program.avals[ref])
                        if lit is not None:
                            env[ref] = cx.operand(lit, vt.dtype)
                        else:
                            env[ref] = Tensor(graph.add("input", [], vt), graph)
                            inputs.append(ref)
                    args.append(env[ref])
                results = convert_step(cx, step.name, dict(step.eqn.params), args,
                                       [program.aval(r) for r in step.ins], [v.aval for v in step.eqn.outvars])
                for ref, t in zip(step.outs, results):
                    if ref is not None:
                        env[ref] = t
        # Results that are an input or a constant unchanged, or the same value as another result, are
        # not kernel outputs: the stage copies them into the environment.
        by_value = {env[r].value.id: r for r in inputs}
        aliases: dict[int, Any] = {}
        kernel_outputs: list[int] = []
        for ref in outputs:
            t = env[ref]
            vid = t.value.id
            if vid in by_value:
                aliases[ref] = by_value[vid]
            elif vid in cx.consts:
                value = np.asarray(cx.consts[vid], dtype=DTYPE_TO_NUMPY[t.dtype]).reshape(t.shape)
                aliases[ref] = _from_carrier(value, program.avals[ref])
            else:
                by_value[vid] = ref
                kernel_outputs.append(ref)
        graph.outputs = [env[r].value for r in kernel_outputs]
        if not kernel_outputs:
            raise UnsupportedError("the kernel would compute nothing that is used")
        emitted = emit_program(graph, func_name=name, spec=request.spec, options=request.options,
                               forms=request.target.attention_forms)
        artifact = compile_text(emitted.text, request, constants=emitted.constants)
        kernel = Kernel(artifact, request.target.load(artifact, request.spec), name=name)
        return KernelStage(kernel, graph, inputs, [env[r].dtype for r in inputs], kernel_outputs,
                           [program.avals[r] for r in kernel_outputs], aliases, len(run_steps))

    @property
    def compiled_ops(self) -> int:
        return sum(s.n_ops for s in self.stages if isinstance(s, KernelStage))

    def __call__(self, leaves: Sequence[Any], sizes: Mapping[str, int] | None = None) -> list[Any]:
        """The outputs for inputs ``leaves``; ``sizes``: the dimension variables' values (a symbolic plan)."""
        program = self.program
        env: dict[int, Any] = dict(zip(program.inputs, leaves))
        env.update(program.consts)
        for stage in self.stages:
            stage.run(env, sizes)
        return [np.asarray(r.val, dtype=getattr(r.aval, "dtype", None)) if isinstance(r, jcore.Literal) else env[r]
                for r in program.outputs]


# ---------------------------------------------------------------------------------------- the function

def _leaf_key(x: Any) -> Any:
    shape, dtype = getattr(x, "shape", None), getattr(x, "dtype", None)
    if shape is not None and dtype is not None:
        return (shape, dtype, getattr(x, "weak_type", False))  # str(dtype) would cost ~7 us a leaf
    return (type(x),)


class JaxFunction:
    """A JAX function compiled by pbsdk, one `Plan` per input signature (pytree structure, shapes, dtypes).

    With ``polymorphic_shapes`` (see `jit`), one `Plan` per symbolic signature: the function is traced with
    JAX's symbolic dimensions, its kernels compiled once for every value of them, and each call binds them
    from its arguments (`polymorphic`).

    Thread-safe: concurrent first calls with one signature compile it once. After ``max_signatures``
    signatures, further ones run through ``jax.jit`` (logged once).
    """

    #: Concrete signatures of a polymorphic function remembered with their plan and sizes (then cleared).
    BOUND = 256

    def __init__(self, fn: Callable[..., Any], request: CompileRequest, *, max_signatures: int,
                 output: str, static_argnums: tuple[int, ...] = (), polymorphic_shapes: Any = None) -> None:
        self.fn = fn
        self.request = request
        self.static_argnums = static_argnums
        self.max_signatures = max_signatures
        self.output = output
        self.polymorphic_shapes = polymorphic_shapes
        #: Why this function's polymorphic signatures are compiled per concrete shape (None: symbolically).
        self.per_shape: str | None = None
        if polymorphic_shapes is not None and not request.target.dynamic_shapes:
            self.per_shape = (f"target {request.target.name} has no dynamic shapes (Target.dynamic_shapes): "
                              "compiled per concrete shape")
            log.info("pbsdk: %s: polymorphic_shapes on %s", self._name(), self.per_shape)
        self._plans: dict[Any, tuple[Plan, Any]] = {}
        self._bound: dict[Any, tuple[Plan, Any, dict[str, int]]] = {}  # concrete key -> symbolic plan, sizes
        self._lock = threading.Lock()
        self._xla: Any = None
        functools.update_wrapper(self, fn)

    @property
    def signatures(self) -> list[Any]:
        """The signatures compiled (with ``polymorphic_shapes``: symbolic ones, each a ``(treedef,
        ((shape, dtype, weak_type), ...), static)`` key with shapes such as ``("b", 768)``)."""
        return list(self._plans)

    def _name(self) -> str:
        return "".join(c if c.isalnum() else "_" for c in getattr(self.fn, "__name__", "fn")) or "fn"

    def _split(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[Any], Any, tuple[Any, ...]]:
        """The traced leaves, their pytree structure, and the static arguments (part of the signature)."""
        static = tuple((i, args[i]) for i in self.static_argnums if i < len(args))
        dynamic = tuple(a for i, a in enumerate(args) if i not in self.static_argnums)
        leaves, treedef = jax.tree_util.tree_flatten((dynamic, kwargs))
        return leaves, treedef, static

    def _compile(self, leaves: Sequence[Any], treedef: Any, static: tuple[Any, ...],
                 symbols: Mapping[str, Any] | None = None) -> tuple[Plan, Any]:
        """Trace and compile one signature: ``leaves`` are the call's arrays, or ``jax.ShapeDtypeStruct``s
        with symbolic dimensions (``symbols``: shape polymorphism)."""
        start = time.perf_counter()

        def flat(*xs: Any) -> Any:
            dynamic, kwargs = jax.tree_util.tree_unflatten(treedef, xs)
            args = list(dynamic)
            for i, value in static:
                args.insert(i, value)
            return self.fn(*args, **kwargs)

        closed, out_shape = jax.make_jaxpr(flat, return_shape=True)(*leaves)
        program = flatten(closed)
        plan = Plan(program, self.request, self._name(), symbols)
        signature = tuple(str(v.aval.str_short()) for v in closed.jaxpr.invars)
        report = JaxCompileReport(
            function=getattr(self.fn, "__name__", "fn"), signature=signature, ops=len(program.steps),
            compiled_ops=plan.compiled_ops, kernels=sum(isinstance(s, KernelStage) for s in plan.stages),
            xla_stages=sum(isinstance(s, XlaStage) for s in plan.stages),
            fallback_primitives=tuple(plan.fallbacks), failed_kernels=plan.failed,
            seconds=time.perf_counter() - start,
            stages=tuple(s for s in plan.stages if isinstance(s, KernelStage)), symbols=tuple(symbols or ()))
        with _reports_lock:
            _reports.append(report)
        log.debug("pbsdk: %s", report)
        return plan, jax.tree_util.tree_structure(out_shape)

    def _compiled(self, key: Any, compile: Callable[[], tuple[Plan, Any]]) -> tuple[Plan, Any] | None:
        """The plan of signature ``key``, compiled (once, under the lock) on first use; None beyond
        ``max_signatures``."""
        found = self._plans.get(key)
        if found is None:
            with self._lock:
                found = self._plans.get(key)
                if found is None and len(self._plans) >= self.max_signatures:
                    if self._xla is None:
                        log.warning("pbsdk: %s compiled for %d signatures (max_signatures); further ones run "
                                    "in XLA", self._name(), self.max_signatures)
                        self._xla = jax.jit(self.fn, static_argnums=self.static_argnums)
                    return None
                if found is None:
                    found = compile()
                    self._plans[key] = found
        return found

    def _plan(self, args: tuple[Any, ...], kwargs: dict[str, Any]
              ) -> tuple[Plan, Any, list[Any], Mapping[str, int] | None] | None:
        """The plan of this signature (compiled on first use), its output structure, the call's leaves and
        the dimension variables' values (a symbolic plan); None beyond ``max_signatures``."""
        leaves, treedef, static = self._split(args, kwargs)
        key = (treedef, tuple(_leaf_key(x) for x in leaves), static)
        if self.polymorphic_shapes is not None:
            bound = self._bound.get(key)
            if bound is None:
                bound = self.polymorphic(args, kwargs, leaves, treedef, static, key)
                if bound is None:
                    return None
            return bound[0], bound[1], leaves, bound[2]
        found = self._compiled(key, lambda: self._compile(leaves, treedef, static))
        return None if found is None else (found[0], found[1], leaves, None)

    def polymorphic(self, args: tuple[Any, ...], kwargs: dict[str, Any], leaves: list[Any], treedef: Any,
                    static: tuple[Any, ...], key: Any) -> tuple[Plan, Any, dict[str, int]] | None:
        """A new concrete signature of a function with ``polymorphic_shapes``: its leaves' symbolic shapes
        (JAX's ``symbolic_args_specs``), the dimension variables bound from the arguments (a variable met twice
        with two values, or a static size that differs from the spec, is an `ArgumentError`), then the plan
        of the symbolic signature, traced and compiled on its first call. Where the symbolic trace or
        compile fails (the function needs a size's value, a size not linear in the variables), or the target
        has no dynamic shapes, the signature is compiled per concrete shape (logged once)."""
        what = f"pbsdk.jax.jit({self._name()})"
        specs = symbolic_leaves(self.polymorphic_shapes, args, kwargs, self.static_argnums, leaves, what=what)
        what = f"{what} with polymorphic_shapes={self.polymorphic_shapes!r} (arguments flattened)"
        try:
            declared = declared_shapes(specs)
        except UnsupportedError as exc:
            self._per_shape(f"polymorphic_shapes {self.polymorphic_shapes!r}: {exc.reason}")
            declared = None
        sizes = bind_call(declared, leaves, what=what) if declared is not None else {}
        found = None
        if self.per_shape is None and declared is not None:
            skey = (treedef, tuple((shape, s.dtype, s.weak_type) for shape, s in zip(declared, specs)), static)
            symbols = symbols_of(specs)
            try:
                found = self._compiled(skey, lambda: self._compile(specs, treedef, static, symbols))
            except Exception as exc:  # noqa: BLE001 - the symbolic trace or plan failed: per concrete shape
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                self._per_shape(f"tracing with symbolic sizes failed: {type(exc).__name__}: {first}")
            else:
                if found is None:
                    return None
        if found is None:
            found = self._compiled(key, lambda: self._compile(leaves, treedef, static))
            if found is None:
                return None
        bound = (found[0], found[1], sizes)
        if len(self._bound) >= self.BOUND:
            self._bound.clear()
        self._bound[key] = bound
        return bound

    def _per_shape(self, why: str) -> None:
        if self.per_shape is None:
            self.per_shape = why
            log.warning("pbsdk: %s: %s; compiled per concrete shape", self._name(), why)

    def _graphs(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Graph]:
        found = self._plan(args, kwargs)
        if found is None:
            raise PbsdkError(f"{self._name()}: this signature runs in XLA (beyond max_signatures)")
        return [s.graph for s in found[0].stages if isinstance(s, KernelStage)]

    def lower(self, *args: Any, **kwargs: Any) -> list[str]:
        """The MLIR (linalg on tensors) of each pbsdk kernel this function compiles to for these arguments
        (with ``polymorphic_shapes``: the symbolic signature's kernels, ``?`` where a size is symbolic)."""
        return [emit_graph(g, func_name=f"{self._name()}_k{i}", spec=self.request.spec, options=self.request.options,
                           forms=self.request.target.attention_forms)
                for i, g in enumerate(self._graphs(args, kwargs))]

    def explain(self, *args: Any, **kwargs: Any) -> str:
        """The planner's decisions for each contraction, convolution route and attention in this function's
        kernels, as text. With ``polymorphic_shapes``, a first line names the signature and its dimension
        variables (or why it is compiled per shape), and a contraction with a symbolic size shows its size
        buckets (`pbsdk.core.plan.explain.explain_dynamic_contractions`)."""
        from pbsdk.core.ir.attention import explain_attention, fused_nodes
        from pbsdk.core.plan import explain_graph, format_plan
        from pbsdk.core.plan.explain import explain_conv_routes, explain_dynamic_contractions

        options = self.request.options
        spec = self.request.target.planning_spec(self.request.spec, options)
        forms = self.request.target.attention_forms
        text = []
        graphs = self._graphs(args, kwargs)
        if self.polymorphic_shapes is not None:
            text.append(self._polymorphic_header(args, kwargs))
        for i, graph in enumerate(graphs):
            inside = fused_nodes(graph, spec, options, forms)  # matmuls a fused attention kernel replaced
            text += [f"kernel {i}: " + format_plan(title, plan) for title, plan in explain_graph(graph, spec, options)
                     if int(title.split()[0][1:]) not in inside]
            text += [f"kernel {i}: " + line for line in explain_dynamic_contractions(graph, spec, options)
                     if int(line.split()[0][1:]) not in inside]
            text += [f"kernel {i}: " + line for line in explain_conv_routes(graph, spec, options)]
            text += [f"kernel {i}: " + line for line in explain_attention(graph, spec, options, forms)]
        return "\n".join(text) or "no contractions"

    def _polymorphic_header(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
        found = self._plan(args, kwargs)
        assert found is not None
        plan, sizes = found[0], found[3] or {}
        signature = ", ".join(str(plan.program.avals[r].str_short()) for r in plan.program.inputs)
        values = ", ".join(f"{k} = {v}" for k, v in sorted(sizes.items()))
        if self.per_shape is not None:
            return f"signature ({signature}): {self.per_shape} (this call: {values})"
        return (f"signature ({signature}): dimension variables {', '.join(sorted(sizes))} symbolic, one kernel set "
                f"for every value (this call: {values})")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if any(isinstance(x, jax.core.Tracer) for x in jax.tree_util.tree_leaves((args, kwargs))):
            # Called under a JAX transformation (jax.jit, grad, vmap): pbsdk's kernels are opaque to it, so
            # the function joins the outer trace as plain JAX.
            return self.fn(*args, **kwargs)
        found = self._plan(args, kwargs)
        if found is None:
            return self._xla(*args, **kwargs)
        plan, out_tree, leaves, sizes = found
        outs = plan(leaves, sizes)
        if self.output == "jax":
            outs = [o if isinstance(o, jax.Array) else jax.numpy.asarray(o) for o in outs]
        return jax.tree_util.tree_unflatten(out_tree, outs)


def jit(fn: Callable[..., Any] | None = None, *, target: str | Target = "cpu", spec: str | ChipSpec | None = None,
        options: Mapping[str, Any] | None = None, max_signatures: int = 8, output: str = "jax",
        static_argnums: int | Sequence[int] = (), polymorphic_shapes: Any = None) -> Any:
    """Compile a JAX function with pbsdk, like ``jax.jit``: traced per input signature and cached.

    ``target``/``spec``/``options`` are those of `pbsdk.jit` (``options``: pbsdk pipeline options).
    Primitives without a converter run in XLA (one INFO line each on logger ``pbsdk.jax``).
    ``max_signatures``: signatures compiled before further ones go to ``jax.jit``. ``output``: ``"jax"``
    returns ``jax.Array``s, ``"numpy"`` returns the kernels' numpy arrays without a copy.
    ``static_argnums``: positional arguments that are Python values (hashable) baked into the trace and
    part of the signature, as in ``jax.jit``.
    ``polymorphic_shapes``: shape polymorphism, as ``jax.export.symbolic_args_specs``'s ``shapes_specs``
    (jax2tf's ``polymorphic_shapes``): one string for all positional arguments or one entry per positional
    argument, e.g. ``["(b, 768)", None]``; the function is traced once with those symbolic dimensions and its
    kernels run every value of them (targets with ``Target.dynamic_shapes``; others compile per concrete
    shape, logged). A dimension variable met twice with two values is an `ArgumentError`. Default None:
    one compile per concrete signature. Usable bare (``@pbsdk.jax.jit``) or with arguments.
    """
    if not isinstance(max_signatures, int) or max_signatures < 0:
        raise PbsdkError(f"pbsdk.jax.jit: max_signatures must be an int >= 0, got {max_signatures!r}")
    if output not in ("jax", "numpy"):
        raise PbsdkError(f"pbsdk.jax.jit: output must be 'jax' or 'numpy', got {output!r}")

    static = (static_argnums,) if isinstance(static_argnums, int) else tuple(static_argnums)
    if any(not isinstance(i, int) or i < 0 for i in static):
        raise PbsdkError(f"pbsdk.jax.jit: static_argnums must be non-negative ints, got {static_argnums!r}")
    poly = check_spec(polymorphic_shapes)

    def wrap(f: Callable[..., Any]) -> JaxFunction:
        return JaxFunction(f, resolve(target, spec, options), max_signatures=max_signatures, output=output,
                           static_argnums=static, polymorphic_shapes=poly)
    return wrap(fn) if fn is not None else wrap
