"""``@pbsdk.jit`` and ``pbsdk.compile_mlir``: the Python entry points."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from pbsdk.core.compiler import CompileRequest, compile_text, resolve
from pbsdk.core.errors import ArgumentError, PbsdkError
from pbsdk.core.ir.emit import emit_graph, emit_program, layout_graph
from pbsdk.core.ir.graph import Graph, TensorType
from pbsdk.core.runtime.kernel import Kernel
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Artifact, Target
from pbsdk.frontends.tracing import Tensor, input_type, tracing

Signature = tuple[TensorType, ...]


def trace(fn: Callable[..., Any], types: Signature) -> tuple[Graph, bool]:
    """Run ``fn`` on traced tensors of ``types``; returns the graph and whether fn returned a tuple."""
    graph = Graph()
    with tracing(graph):
        args = [Tensor(graph.add("input", [], t), graph) for t in types]
        result = fn(*args)
    multiple = isinstance(result, (tuple, list))
    results = list(result) if multiple else [result]
    for i, r in enumerate(results):
        if not isinstance(r, Tensor):
            raise PbsdkError(f"{getattr(fn, '__name__', 'function')}: result {i} is a {type(r).__name__}, "
                             "not a traced tensor (return values computed with pbsdk.ops)")
        if r.graph is not graph:
            raise PbsdkError("a result belongs to another trace (a tensor leaked from an earlier call?)")
    graph.outputs = [r.value for r in results]
    return graph, multiple


class JitFunction:
    """A traced-and-compiled function, one kernel per input signature (shapes and dtypes).

    Thread-safe: concurrent first calls with one signature compile it once; others wait for it.
    """

    def __init__(self, fn: Callable[..., Any], request: CompileRequest) -> None:
        self.fn = fn
        self.request = request
        self._kernels: dict[Signature, tuple[Kernel, bool]] = {}
        self._artifacts: dict[Signature, tuple[Artifact, bool]] = {}  # compiled, not loaded yet (`artifact`)
        self._locks: dict[Signature, threading.Lock] = {}
        self._lock = threading.Lock()
        self._fast: dict[tuple[Any, ...], tuple[Kernel, bool]] = {}
        functools.update_wrapper(self, fn)

    @property
    def signatures(self) -> list[Signature]:
        return list(self._kernels)

    def _signature(self, args: tuple[Any, ...]) -> Signature:
        import inspect
        try:
            inspect.signature(self.fn).bind(*args)
        except TypeError as exc:
            raise ArgumentError(f"{self.fn.__name__}: {exc}") from None
        except ValueError:  # builtins without a signature
            pass
        return tuple(input_type(a, i) for i, a in enumerate(args))

    def lower(self, *args: Any) -> str:
        """The MLIR (linalg on tensors) this function traces to for these arguments, self-contained: every
        constant printed inline, so the text compiles alone (a compilation of the function itself passes
        large constants as operands, `pbsdk.core.ir.emit.emit_program`)."""
        graph, _ = trace(self.fn, self._signature(args))
        return emit_graph(graph, spec=self.request.spec, options=self.request.options,
                          forms=self.request.target.attention_forms)

    def explain(self, *args: Any) -> str:
        """The planner's decisions for each contraction this function traces to, as text."""
        return self.explain_signature(self._signature(args))

    def explain_signature(self, sig: Signature) -> str:
        """`explain` for traced input types ``sig`` (sizes known only at run time among them: `Dim`s)."""
        from pbsdk.core.dims import is_dynamic
        from pbsdk.core.plan import explain_graph, format_plan
        from pbsdk.core.plan.explain import explain_conv_routes, explain_dynamic_contractions

        graph, _ = trace(self.fn, sig)
        request = self.request
        spec, options = request.target.planning_spec(request.spec, request.options), request.options
        if any(is_dynamic(t.shape) for t in sig):  # static contractions' plans, then the dynamic ones' buckets
            text = [format_plan(title, plan) for title, plan in explain_graph(graph, spec, options)]
            return "\n".join(text + explain_dynamic_contractions(graph, spec, options)) or "no contractions"
        from pbsdk.core.ir.attention import explain_attention, fused_nodes

        # As build_graph does: the convolutions then explained are the NHWC ones it emits.
        graph, report = layout_graph(graph, request.spec, options)
        layout = f"{report.summary()} (pbsdk.core.ir.layout)" if report.convs_nhwc else ""
        plans = explain_graph(graph, spec, options)
        inside = fused_nodes(graph, spec, options, request.target.attention_forms)  # matmuls a fused kernel replaced
        text = [format_plan(title, plan) for title, plan in plans if int(title.split()[0][1:]) not in inside]
        text += explain_conv_routes(graph, spec, options)
        text += explain_attention(graph, spec, options,
                                  request.target.attention_forms)
        return "\n".join(([layout] if layout else []) + text) or "no contractions"

    def _compile(self, sig: Signature) -> tuple[Artifact, bool]:
        found = self._artifacts.get(sig)
        if found is None:
            graph, multiple = trace(self.fn, sig)
            program = emit_program(graph, spec=self.request.spec, options=self.request.options,
                                   forms=self.request.target.attention_forms)
            found = (compile_text(program.text, self.request, constants=program.constants), multiple)
            self._artifacts[sig] = found
        return found

    def artifact(self, sig: Signature) -> Artifact:
        """The compiled artifact for ``sig``, without loading it (what `pbsdk.export` writes: a GPU target's
        code needs no GPU here); kept, so a later call of the function loads this one."""
        with self._lock:
            lock = self._locks.setdefault(sig, threading.Lock())
        with lock:
            loaded = self._kernels.get(sig)
            return loaded[0].artifact if loaded is not None else self._compile(sig)[0]

    def kernel(self, sig: Signature) -> tuple[Kernel, bool]:
        found = self._kernels.get(sig)
        if found is not None:
            return found
        with self._lock:
            lock = self._locks.setdefault(sig, threading.Lock())
        with lock:
            found = self._kernels.get(sig)
            if found is None:
                artifact, multiple = self._compile(sig)
                executable = self.request.target.load(artifact, self.request.spec)
                found = (Kernel(artifact, executable, name=self.fn.__name__), multiple)
                self._kernels[sig] = found
                self._artifacts.pop(sig, None)
        return found

    def __call__(self, *args: Any) -> Any:
        # Fast path: arrays of a (shape, dtype) combination already compiled skip the signature checks
        # (tens of microseconds of Python per call, comparable to a small kernel's run time).
        try:
            found = self._fast.get(tuple((a.shape, a.dtype) for a in args))
        except (AttributeError, TypeError):  # a scalar or another non-array argument
            found = None
        if found is not None:
            kernel, multiple = found
        else:
            kernel, multiple = self.kernel(self._signature(args))
            if all(isinstance(a, np.ndarray) for a in args):
                self._fast[tuple((a.shape, a.dtype) for a in args)] = (kernel, multiple)
        out = kernel(*args)
        if multiple:
            return out if isinstance(out, tuple) else (out,)
        return out


def jit(fn: Callable[..., Any] | None = None, *, target: str | Target = "cpu", spec: str | ChipSpec | None = None,
        options: Mapping[str, Any] | None = None) -> Any:
    """Decorator: trace ``fn`` (written with `pbsdk.ops`) on numpy inputs and compile it for ``target``.

    Compiles once per input signature and caches. ``spec`` is a preset name, a YAML path or a ChipSpec
    (default: the target's). Usable bare (``@pbsdk.jit``) or with arguments.
    """
    def wrap(f: Callable[..., Any]) -> JitFunction:
        return JitFunction(f, resolve(target, spec, options))
    return wrap(fn) if fn is not None else wrap


def compile_mlir(text: str, *, target: str | Target = "cpu", spec: str | ChipSpec | None = None,
                 options: Mapping[str, Any] | None = None) -> Kernel:
    """Compile MLIR at the linalg-on-tensors level (one public ``func.func`` with static tensor
    arguments and results) and return a callable `Kernel`."""
    request = resolve(target, spec, options)
    artifact = compile_text(text, request)
    return Kernel(artifact, request.target.load(artifact, request.spec), name=artifact.entry)
