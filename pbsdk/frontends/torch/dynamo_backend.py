"""The ``torch.compile`` backend: Dynamo graph -> AOTAutograd (core ATen) -> partitions -> pbsdk kernels.

Flow of one Dynamo graph:

1. AOTAutograd traces it to a functional core-ATen graph (decompositions from
   ``torch._decomp.core_aten_decompositions``); in-place ops, input mutations and outputs that alias
   inputs are handled by AOTAutograd's own runtime wrappers, so the graph pbsdk sees is pure.
2. Every call node is tried through its converter (`convert.node_supported`); nodes that do not convert
   are logged — one line each, logger ``pbsdk.torch`` — and stay with torch.
3. ``CapabilityBasedPartitioner`` groups the supported nodes into maximal acyclic partitions. A partition
   of layout ops only (views, permutes, ...) is left to torch, where it costs nothing.
4. Each partition becomes one pbsdk graph, is compiled for the chosen target and spec, and runs as a
   `CompiledPartition` module inside the partitioned FX graph; the rest of the graph runs eagerly. A
   partition whose compilation fails is logged and runs eagerly too: never a crash, never a wrong result.
   So does a whole graph whose tracing or partitioning raises (`_runs_in_torch`), and a partition whose
   call raises (`CompiledPartition._fall_back`): inside the backend every exception is a logged
   fallback to torch, never an error in the user's call.

Parameters and buffers are frozen into the kernels as constants when compiling for inference (no input
requires grad) and ``freeze`` is on; each call checks (by identity and version counter, O(1)) that the
frozen tensors are unchanged, and recompiles that partition with them as inputs the first time they are
not. Graphs with symbolic shapes are compiled once per concrete shape, up to ``max_shapes``; beyond
that the graph runs eagerly (logged once).
"""

from __future__ import annotations

import dataclasses
import logging
import operator
import re
import sys
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
import torch.fx
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner
from torch.fx.passes.operator_support import OperatorSupportBase

from pbsdk import ops
from pbsdk.core.compiler import CompileRequest, compile_text, resolve
from pbsdk.core.errors import PbsdkError, UnsupportedError
from pbsdk.core.ir.emit import emit_program
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY, Graph, TensorType
from pbsdk.core.runtime.kernel import Kernel, OutputPool
from pbsdk.frontends.torch.convert import (
    LAYOUT_OPS,
    Context,
    convert_node,
    graph_dtype,
    node_supported,
    op_name,
    operand,
    value_type,
)
from pbsdk.frontends.torch.inplace import INPUT_WRITES, write_in_place
from pbsdk.frontends.torch.symbolic import (
    as_dim,
    bind_symbols,
    bound_sizes,
    concrete_sizes,
    graph_is_symbolic,
    has_no_elements,
    is_dynamic,
    is_size_arithmetic,
)
from pbsdk.frontends.tracing import Tensor, tracing

log = logging.getLogger("pbsdk.torch")

_OPTION_NAMES = ("target", "spec", "freeze", "dynamic", "max_shapes", "direct", "compile_options")


@dataclasses.dataclass(frozen=True)
class TorchOptions:
    """``torch.compile(..., backend="pbsdk", options={...})``.

    target          -- pbsdk target name (default ``"cpu"``).
    spec            -- chip spec preset, YAML path or ChipSpec (default: the target's).
    freeze          -- fold parameters and buffers into the kernels as constants for inference
                       (default True); False keeps them as kernel inputs.
    dynamic         -- a graph with symbolic sizes (Dynamo's automatic dynamic shapes, ``mark_dynamic``):
                       ``"symbolic"`` (default) compiles it once, sizes read at run time;
                       ``"per_shape"`` compiles it once per concrete input shape, up to ``max_shapes``.
    max_shapes      -- with ``dynamic="per_shape"``: how many concrete shapes a graph is compiled for
                       before it runs eagerly (default 8).
    direct          -- inference graphs (no gradients needed, no input mutated) are traced to ATen by
                       pbsdk and run without AOTAutograd's runtime wrappers (default True); False
                       always goes through AOTAutograd.
    compile_options -- options for pbsdk's pipeline (what ``pbsdk.jit(options=...)`` takes).
    """

    target: Any = "cpu"
    spec: Any = None
    freeze: bool = True
    dynamic: str = "symbolic"
    max_shapes: int = 8
    direct: bool = True
    compile_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    @classmethod
    def from_dict(cls, options: Mapping[str, Any] | None) -> TorchOptions:
        options = dict(options or {})
        unknown = sorted(set(options) - set(_OPTION_NAMES))
        if unknown:
            raise PbsdkError(f"torch.compile backend 'pbsdk': unknown option(s) {', '.join(unknown)}; "
                             f"known: {', '.join(_OPTION_NAMES)}")
        opts = cls(**options)
        if not isinstance(opts.freeze, bool):
            raise PbsdkError(f"backend 'pbsdk': option freeze must be a bool, got {opts.freeze!r}")
        if opts.dynamic not in ("symbolic", "per_shape"):
            raise PbsdkError(f"backend 'pbsdk': option dynamic must be 'symbolic' or 'per_shape', got "
                             f"{opts.dynamic!r}")
        if not isinstance(opts.max_shapes, int) or opts.max_shapes < 1:
            raise PbsdkError(f"backend 'pbsdk': option max_shapes must be an int >= 1, got {opts.max_shapes!r}")
        return opts


@dataclasses.dataclass(frozen=True)
class CompileReport:
    """What one compilation of one ATen graph did (see `reports`)."""

    graph_ops: int                    # call nodes in the ATen graph
    compiled_ops: int                 # of those, how many run in pbsdk kernels
    partitions: int                   # kernels compiled
    fallback_ops: tuple[str, ...]     # ATen ops left to torch because they do not convert
    failed_partitions: int            # partitions that did not compile and run eagerly (1: the whole graph)
    frozen: bool                      # parameters folded as constants
    seconds: float                    # wall time of partitioning, lowering and compiling
    fused_attention: int = 0          # attention patterns (e.g. decomposed SDPA) run as one fused kernel
    host_checks: int = 0              # assertions (``_assert_async``) and size arithmetic torch evaluates
    dynamic_ops: tuple[str, ...] = ()  # ops on sizes that change between calls, left to torch
    per_shape_partitions: int = 0     # partitions compiled per input shape (their kernels need the sizes)
    errors: tuple[str, ...] = ()      # why a partition, or the whole graph, runs in torch ("Type: message")
    stored_order_inputs: int = 0      # channels-last inputs the kernels read in place, as NHWC (no copy a call)
    input_writes: int = 0             # writes of graph inputs torch does between the kernels (a static cache's
                                      # rows written in place, `inplace.write_in_place`; whole-input copy_s)
    kernels: tuple[Any, ...] = dataclasses.field(default=(), repr=False, compare=False)  # the partitions' kernels

    def modelled_seconds(self) -> float | None:
        """On a target that models the chip's time (template and targets scaffolded from it): the time the
        partitions' last runs would take on the chip (`pbsdk.emulation`); None elsewhere. A whole
        model: ``sum`` over the `reports` of its graphs."""
        from pbsdk.emulation import last_modelled_seconds

        return last_modelled_seconds(self.kernels)


_reports: list[CompileReport] = []
_reports_lock = threading.Lock()


def reports() -> list[CompileReport]:
    """Reports of every graph compiled so far in this process, oldest first."""
    with _reports_lock:
        return list(_reports)


def clear_reports() -> None:
    with _reports_lock:
        _reports.clear()


# ------------------------------------------------------------------------------------------ partitions

class _KernelOf:
    """A partition's current kernel (a partition may recompile it, e.g. without frozen weights)."""

    def __init__(self, part: CompiledPartition) -> None:
        self._part = weakref.ref(part)

    @property
    def executable(self) -> Any:
        part = self._part()
        return None if part is None else part.kernel.executable


class CompiledPartition(torch.nn.Module):
    """One partition of the ATen graph compiled by pbsdk, called with the partition's torch inputs.

    Inputs are handed to the kernel without copies where they are contiguous and of a float dtype
    (``Tensor.numpy()`` shares memory). A channels-last input is too, in its storage order (``stored_order``:
    the kernel takes ``t.permute(0, 2, 3, 1)`` and its graph transposes that to NCHW, which channels last
    across layers absorbs); other strided views are copied to C order.
    Outputs are numpy arrays wrapped with ``torch.from_numpy`` (no copy), C-contiguous, but for an output
    Dynamo recorded as channels last: the kernel writes that one NHWC and the caller gets it viewed as the
    channels-last NCHW tensor eager returns (``output_order``, `user_view`). Booleans and integers are
    converted at this boundary (pbsdk carries them as floats).

    A call that raises (in the kernel's argument checks, a recompilation, or the run) is logged and
    answered by torch running the partition's own graph, ``sub``; the partition stays with torch from
    then on (`_fall_back`). The user's call never sees pbsdk's exception.
    """

    def __init__(self, name: str, sub: torch.fx.GraphModule, frozen: Mapping[int, torch.Tensor],
                 request: CompileRequest) -> None:
        super().__init__()
        self.name = name
        self.sub = sub
        self.request = request
        self._frozen = dict(frozen)  # placeholder position -> real tensor
        self._checks = tuple((i, t, t._version) for i, t in self._frozen.items())
        placeholders = [n for n in sub.graph.nodes if n.op == "placeholder"]
        # Empty operands (`convert.Empty`) are not kernel inputs: no dtype to convert them to.
        self._in_dtypes = [value_type(n.meta["val"]).dtype if isinstance(n.meta.get("val"), torch.Tensor)
                           and not has_no_elements(n.meta["val"]) else "" for n in placeholders]
        self._eager = False  # set by `_fall_back`: every call runs ``sub`` in torch
        (out_node,) = [n for n in sub.graph.nodes if n.op == "output"]
        result = out_node.args[0]
        self._single = not isinstance(result, (tuple, list))
        outs = [result] if self._single else list(result)
        self._out_dtypes = [n.meta["val"].dtype for n in outs]
        self.kernel, self._inputs, self.stored_order, self.output_order = self._compile(self._frozen)
        self._pointer_path()

    def _pointer_path(self) -> None:
        """Build ``self._fast``: the per-call path on the tensors' own memory, one Python frame.

        It checks, in order, that the frozen parameters are the same unmodified tensors, and that every
        kernel input is a CPU tensor of exactly the kernel's shape and dtype; one that is not C-contiguous
        (channels-last, a transposed or sliced view) is copied to C order for the call, since the kernel
        reads dense row-major buffers. Then it takes numpy-backed outputs (fresh, or recycled once dropped:
        `OutputPool`) and calls the executable's raw entry on the data pointers. It returns
        None when any check fails (or the executable has no raw entry); `_general` then takes the call,
        and recompiles if a frozen parameter changed."""
        self._outputs: OutputPool | None = None
        if self.kernel.dynamic:
            self._fast: Any = self._dynamic_path()
            return
        # Outputs are recycled once the caller has dropped them (and every view): `OutputPool`.
        pool = self._outputs = OutputPool([(s, np.dtype(DTYPE_TO_NUMPY[dt]))
                                           for s, dt in self.kernel.artifact.outputs])
        run_pointers: Any = getattr(self.kernel.executable, "run_pointers", None)
        if run_pointers is None:
            self._fast = None
            return
        checks = self._checks
        orders = self.stored_order
        expect = tuple((i, tuple(int(d) for d in s), getattr(torch, DTYPE_TO_NUMPY[dt]), orders.get(i))
                       for i, (s, dt) in zip(self._inputs, self.kernel.artifact.inputs))
        wants = self._out_dtypes
        converts = any(want is not getattr(torch, DTYPE_TO_NUMPY[dt])
                       for (_, dt), want in zip(self.kernel.artifact.outputs, wants))
        single = self._single
        views = tuple((k, _inverse(perm)) for k, perm in self.output_order.items())  # once, not per call
        tensor, take = torch.Tensor, pool.take
        # torch.from_numpy itself unless an output is bf16 (which numpy_to_torch reinterprets): no dtype
        # lookup per call.
        from_numpy = numpy_to_torch if any(DTYPE_TO_NUMPY[dt] == "bfloat16" for _, dt in
                                           self.kernel.artifact.outputs) else torch.from_numpy

        def fast(args: Sequence[Any]) -> Any:
            for i, t, version in checks:
                if args[i] is not t or t._version != version:
                    return None
            pointers, copies = [], []
            for i, shape, dtype, order in expect:
                t = args[i]
                if not isinstance(t, tensor) or t.dtype is not dtype or not t.is_cpu:
                    return None
                if order is not None:  # taken in its storage order (channels last): a view, no copy
                    t = t.permute(order)
                if t.shape != shape:
                    return None
                if not t.is_contiguous():
                    t = t.contiguous()
                    copies.append(t)  # alive until the kernel has run
                pointers.append(t.data_ptr())
            outs = []
            for a in take():
                o = from_numpy(a)
                outs.append(o)
                pointers.append(o.data_ptr())
            run_pointers(pointers)
            for k, back in views:
                outs[k] = outs[k].permute(back)
            if converts:
                outs = [_as_dtype(o, want) for o, want in zip(outs, wants)]
            return outs[0] if single else tuple(outs)

        self._fast = fast

    def _dynamic_path(self) -> Any:
        """The per-call path of a kernel with dynamic sizes: as `_pointer_path`'s, but the outputs' shapes
        and the sizes buffer come from the inputs' shapes on each call (`Kernel.sized`), the outputs are
        fresh torch tensors, and a shape the signature refuses returns None (`_general` then raises it)."""
        run_pointers: Any = getattr(self.kernel.executable, "run_pointers", None)
        if run_pointers is None:
            return None
        checks, sized, single = self._checks, self.kernel.sized, self._single
        orders = self.stored_order
        expect = tuple((i, getattr(torch, DTYPE_TO_NUMPY[dt]), orders.get(i))
                       for i, (_, dt) in zip(self._inputs, self.kernel.artifact.inputs))
        made = [getattr(torch, DTYPE_TO_NUMPY[dt]) for _, dt in self.kernel.artifact.outputs]
        wants = self._out_dtypes
        views = tuple((k, _inverse(perm)) for k, perm in self.output_order.items())  # once, not per call
        tensor = torch.Tensor

        def fast(args: Sequence[Any]) -> Any:
            for i, t, version in checks:
                if args[i] is not t or t._version != version:
                    return None
            pointers, copies, shapes = [], [], []
            for i, dtype, order in expect:
                t = args[i]
                if not isinstance(t, tensor) or t.dtype is not dtype or not t.is_cpu:
                    return None
                if order is not None:
                    t = t.permute(order)
                if not t.is_contiguous():
                    t = t.contiguous()
                    copies.append(t)  # alive until the kernel has run
                pointers.append(t.data_ptr())
                shapes.append(tuple(t.shape))
            out_shapes, sizes = sized(tuple(shapes))
            outs = [torch.empty(shape, dtype=dtype) for shape, dtype in zip(out_shapes, made)]
            pointers.extend(o.data_ptr() for o in outs)
            pointers.append(sizes.ctypes.data)
            run_pointers(pointers)
            for k, back in views:
                outs[k] = outs[k].permute(back)
            outs = [o if o.dtype is want else _as_dtype(o, want) for o, want in zip(outs, wants)]
            return outs[0] if single else tuple(outs)

        return fast

    def _compile(self, frozen: Mapping[int, torch.Tensor]
                 ) -> tuple[Kernel, list[int], dict[int, tuple[int, ...]], dict[int, tuple[int, ...]]]:
        """The partition compiled with ``frozen`` as constants: the kernel, its inputs' positions, their
        storage orders and the outputs' (`Lowered`)."""
        graph, inputs, orders, out_orders = lower_partition(
            self.sub, frozen, data_sizes=self.request.target.dynamic_shapes, in_storage_order=True)
        program = emit_program(graph, func_name=self.name, spec=self.request.spec, options=self.request.options,
                               forms=self.request.target.attention_forms)
        del graph  # the constants' arrays live on in the program alone
        self.fused_attention = len(re.findall(r"func\.func private @__pbsdk_attn\d+\(", program.text))
        artifact = compile_text(program.text, self.request, constants=program.constants)
        executable = self.request.target.load(artifact, self.request.spec)
        return Kernel(artifact, executable, name=self.name), inputs, orders, out_orders

    def _frozen_unchanged(self, args: Sequence[Any]) -> bool:
        for i, t, version in self._checks:
            if args[i] is not t or t._version != version:
                return False
        return True

    def forward(self, *args: Any) -> Any:
        try:
            fast = self._fast
            got = fast(args) if fast is not None else None
            return self._general(args) if got is None else got
        except Exception as exc:  # noqa: BLE001 - any failure of pbsdk's call is torch's to answer
            return self._fall_back(args, exc)

    def _fall_back(self, args: Sequence[Any], exc: Exception) -> Any:
        """Answer a call that raised with torch, logged once; later calls go to torch directly."""
        log.warning("pbsdk: partition %s raised when called (%s); it runs in torch from now on", self.name,
                    _described(exc))
        self._eager, self._fast = True, None
        return self.sub(*args)

    def _general(self, args: Sequence[Any]) -> Any:
        """The call when `_fast` declined it: recompile with parameters as inputs if a frozen one changed,
        else convert the inputs (copies where needed) and run the kernel on numpy arrays."""
        if self._eager:
            return self.sub(*args)
        if not self._frozen_unchanged(args):
            # Only the changed tensors become inputs (a static KV cache that transformers marks as a static
            # address is written on every step); the weights stay constants.
            changed = {i for i, t, version in self._checks if args[i] is not t or t._version != version}
            log.info("pbsdk: %d frozen tensor(s) of %s changed; recompiling it with them as inputs", len(changed),
                     self.name)
            self._frozen = {i: t for i, t in self._frozen.items() if i not in changed}
            self._checks = tuple((i, t, t._version) for i, t in self._frozen.items())
            self.kernel, self._inputs, self.stored_order, self.output_order = self._compile(self._frozen)
            self._pointer_path()
            return self.forward(*args)
        arrays = self.kernel.check_args([_to_numpy(_kernel_view(args[i], self.stored_order.get(i)), self._in_dtypes[i])
                                         for i in self._inputs])
        if self._outputs is None:  # dynamic sizes
            shapes, sizes = self.kernel.sizes(arrays)
            outs = [np.empty(shape, DTYPE_TO_NUMPY[dt]) for shape, (_, dt) in zip(shapes, self.kernel.artifact.outputs)]
            self.kernel.executable.run(arrays + outs + [sizes])
        else:
            outs = self._outputs.take()
            self.kernel.executable.run(arrays + outs)
        tensors = [user_view(_to_torch(o, dt), self.output_order.get(k))
                   for k, (o, dt) in enumerate(zip(outs, self._out_dtypes))]
        return tensors[0] if self._single else tuple(tensors)


def _described(exc: BaseException) -> str:
    """``Type: first line of the message``, for a fallback's log line and report."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


def _to_numpy(t: torch.Tensor, dtype: str) -> np.ndarray:
    t = t.detach()
    if t.device.type != "cpu":
        raise PbsdkError(f"pbsdk's torch backend takes CPU tensors, got one on {t.device}")
    want = getattr(torch, DTYPE_TO_NUMPY[dtype])
    if t.dtype != want:
        t = t.to(want)
    return torch_to_numpy(t)  # shares memory; the kernel copies only non-contiguous inputs to C order


def torch_to_numpy(t: torch.Tensor) -> np.ndarray:
    """``t.numpy()``, sharing memory; a bf16 tensor (which torch cannot hand to numpy) as an
    ``ml_dtypes.bfloat16`` array over the same bytes."""
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(np.dtype("bfloat16"))
    return t.numpy()


def numpy_to_torch(a: np.ndarray) -> torch.Tensor:
    """``torch.from_numpy(a)``, sharing memory; an ``ml_dtypes.bfloat16`` array as a torch.bfloat16 tensor."""
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(a)


def _to_torch(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    return _as_dtype(numpy_to_torch(a), dtype)


def _as_dtype(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A kernel's output as the graph's dtype (booleans travel as 0/1 floats, integers as floats)."""
    if dtype == torch.bool:
        return t != 0
    return t if t.dtype == dtype else t.to(dtype)


#: The storage order of a channels-last tensor: ``t.permute(CHANNELS_LAST)`` is its contiguous view.
CHANNELS_LAST = (0, 2, 3, 1)


class Lowered(NamedTuple):
    """A partition as a pbsdk graph (`lower_partition`): the graph, the positions of the placeholders that
    remain kernel inputs (in argument order), and for those the kernel takes in their storage order, the
    permutation whose view of the tensor is C-contiguous (the kernel input is ``t.permute(perm)``); likewise
    per output (by position) that the kernel writes in its storage order, that permutation (the caller
    hands back the kernel's array viewed through its inverse, `user_view`)."""

    graph: Graph
    inputs: list[int]
    stored_order: dict[int, tuple[int, ...]]
    output_order: dict[int, tuple[int, ...]]


def storage_order(meta: Any) -> tuple[int, ...] | None:
    """The permutation under which the recorded tensor ``meta`` is C-contiguous when that is channels last
    and not also the plain order (a tensor with one channel or one pixel is both): the kernel then takes the
    tensor's own memory as NHWC and the graph transposes it, a transpose that channels last across layers
    (`pbsdk.core.ir.layout`) absorbs into the first NHWC convolution. None otherwise (static 4-D shapes only)."""
    if not isinstance(meta, torch.Tensor) or meta.dim() != 4 or not all(isinstance(d, int) for d in meta.shape):
        return None
    if meta.is_contiguous() or not meta.is_contiguous(memory_format=torch.channels_last):
        return None
    return CHANNELS_LAST


def user_view(t: torch.Tensor, perm: tuple[int, ...] | None) -> torch.Tensor:
    """A kernel's output written in storage order ``perm`` (`Lowered.output_order`) as the graph's tensor: a
    view of the same memory (channels last for ``CHANNELS_LAST``), no copy."""
    return t if perm is None else t.permute(_inverse(perm))


def _inverse(perm: tuple[int, ...]) -> tuple[int, ...]:
    """The permutation that undoes ``perm``."""
    return tuple(perm.index(a) for a in range(len(perm)))


def _kernel_view(t: torch.Tensor, perm: tuple[int, ...] | None) -> torch.Tensor:
    """Input ``t`` as the kernel reads it: permuted to its storage order where the kernel takes it so (a view;
    `Kernel.check_args` copies what is then not C-contiguous, as for any strided input)."""
    return t if perm is None else t.permute(perm)


def lower_partition(sub: torch.fx.GraphModule, frozen: Mapping[int, torch.Tensor], *,
                    data_sizes: bool = False, in_storage_order: bool = False) -> Lowered:
    """The partition as a pbsdk graph; frozen placeholders (by position) become constants. ``data_sizes``:
    the target compiles sizes known only at run time (`Target.dynamic_shapes`), so ops whose loop bounds are
    data (a grouped matmul's groups) may become such ops (`Context.data_sizes`). ``in_storage_order``: a
    channels-last input is taken in its storage order (`storage_order`) rather than copied to C order per
    call; the caller then hands the kernel ``t.permute(perm)`` (`Lowered.stored_order`). Likewise a
    channels-last output (as Dynamo recorded it) is written in its storage order, so the graph does not end
    in a transpose back to NCHW and the caller returns the layout eager returns (`Lowered.output_order`)."""
    graph = Graph()
    cx = Context(data_sizes=data_sizes)
    env: dict[torch.fx.Node, Any] = {}
    inputs: list[int] = []
    orders: dict[int, tuple[int, ...]] = {}
    position = 0
    with tracing(graph):
        for node in sub.graph.nodes:
            if node.op == "placeholder":
                i, position = position, position + 1
                meta = node.meta.get("val")
                if isinstance(meta, torch.SymInt):
                    env[node] = as_dim(meta)  # a size: bound from the tensors' shapes, not a kernel input
                    continue
                if not isinstance(meta, torch.Tensor):  # a Python scalar of a graph traced per shape
                    env[node] = meta
                    continue
                if has_no_elements(meta):
                    env[node] = operand(graph, meta)  # Empty: no data, not a kernel input
                    continue
                vt = value_type(meta)
                if i in frozen:
                    value = frozen[i].detach().to(torch.float64 if vt.dtype == "f64" else frozen[i].dtype)
                    if value.dtype == torch.bool:
                        value = value.to(torch.float32)
                    # Not copied when C-contiguous: the partition checks these tensors on every call
                    # and recompiles if one changed, so the kernel may read the parameters' own memory.
                    # A strided one (channels-last, transposed) is copied to C order by `ops._const`.
                    env[node] = cx.const(torch_to_numpy(value), vt.dtype, copy=False)
                else:
                    perm = storage_order(meta) if in_storage_order else None
                    if perm is None:
                        env[node] = Tensor(graph.add("input", [], vt), graph)
                    else:
                        stored = TensorType(tuple(vt.shape[p] for p in perm), vt.dtype)
                        env[node] = ops.transpose(Tensor(graph.add("input", [], stored), graph),
                                                  [perm.index(a) for a in range(len(perm))])
                        orders[i] = perm
                    inputs.append(i)
            elif node.op == "call_function":
                env[node] = convert_node(cx, node, env)
            elif node.op == "output":
                result = node.args[0]
                outs = [result] if not isinstance(result, (tuple, list)) else list(result)
                graph.outputs, out_orders = _outputs(outs, env, in_storage_order)
    return Lowered(graph, inputs, orders, out_orders)


def _outputs(outs: list[Any], env: Mapping[Any, Any], in_storage_order: bool
             ) -> tuple[list[Any], dict[int, tuple[int, ...]]]:
    """The graph's output values, each channels-last one (`storage_order` of its recorded tensor) transposed
    to its storage order when ``in_storage_order``, and those outputs' permutations by position."""
    values, orders = [], {}
    for k, n in enumerate(outs):
        v = env[n]
        meta = n.meta.get("val") if isinstance(n, torch.fx.Node) else None
        perm = storage_order(meta) if in_storage_order and isinstance(v, Tensor) else None
        if perm is not None:
            v = ops.transpose(v, list(perm))
            orders[k] = perm
        values.append(v.value)
    return values, orders


def _supported(node: torch.fx.Node, data_sizes: bool = False) -> tuple[bool, str]:
    """`node_supported` (``data_sizes``: `Context.data_sizes`), remembered in the node's meta: the direct path
    asks before partitioning and `compile_aten` asks again for the same nodes (each answer converts the node
    on fresh inputs)."""
    key = "pbsdk_supported_data_sizes" if data_sizes else "pbsdk_supported"
    known = node.meta.get(key)
    if known is None:
        known = node.meta[key] = node_supported(node, data_sizes=data_sizes)
    return known  # type: ignore[no-any-return]


class _Support(OperatorSupportBase):
    def __init__(self, supported: set[torch.fx.Node]) -> None:
        self.supported = supported

    def is_node_supported(self, submodules: Mapping[str, torch.nn.Module], node: torch.fx.Node) -> bool:
        return node in self.supported


_VIEWS = {"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.permute.default",
          "aten.expand.default", "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.dims",
          "aten.squeeze.default", "aten.alias.default", "aten.t.default", "aten.transpose.int",
          "aten.slice.Tensor", "aten.select.int", "aten.as_strided.default"}


def _aliases_of_inputs(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """View nodes whose result is returned and views a graph input: they stay with torch, which keeps
    the aliasing that AOTAutograd's wrappers expect (a pbsdk kernel always returns fresh memory)."""
    keep: set[torch.fx.Node] = set()
    (out,) = [n for n in gm.graph.nodes if n.op == "output"]
    results = out.args[0]
    for n in (list(results) if isinstance(results, (tuple, list)) else [results]):
        chain = []
        while isinstance(n, torch.fx.Node) and n.op == "call_function" and op_name(n.target) in _VIEWS:
            chain.append(n)
            n = n.args[0]
        if isinstance(n, torch.fx.Node) and n.op == "placeholder":
            keep.update(chain)
    return keep


#: Ops that check a condition and raise, with no result (``one_hot``'s range check): torch evaluates them on
#: the kernels' results, between calls to them, as it must (a kernel cannot raise); they are counted in
#: `CompileReport.host_checks`, not as fallbacks, since there is nothing to compute.
_HOST_CHECKS = {"aten._assert_async.msg", "aten._assert_async.default", "aten._assert_scalar.default"}


def _empty_at_the_boundary(supported: set[torch.fx.Node]) -> list[torch.fx.Node]:
    """Supported nodes whose result has no elements (``torch.tensor([])``, a cache's first keys) but is read
    outside the supported nodes: they stay with torch, since a kernel has no element-less outputs (inside
    a partition such a value travels as `convert.Empty` to the ``cat`` that ignores it). Removed from
    ``supported`` and returned."""
    left: list[torch.fx.Node] = []
    changed = True
    while changed:
        changed = False
        for node in list(supported):
            val = node.meta.get("val")
            if (has_no_elements(val)
                    and any(user not in supported for user in node.users)):
                supported.discard(node)
                left.append(node)
                changed = True
    return left


class ShapesNeeded(UnsupportedError):
    """A graph with symbolic sizes holds an op that pbsdk converts only with its sizes known (a
    convolution over a symbolic batch): the graph is compiled per concrete shape instead (`PerShape`),
    as it would have been without symbols, rather than leave that op to torch."""


@dataclasses.dataclass
class _Triage:
    """Which call nodes of an ATen graph pbsdk compiles, and how (`_triage`)."""

    supported: set[torch.fx.Node] = dataclasses.field(default_factory=set)
    fallbacks: list[str] = dataclasses.field(default_factory=list)
    dynamic: list[str] = dataclasses.field(default_factory=list)
    checks: int = 0
    writes: int = 0


def _triage(gm: torch.fx.GraphModule, data_sizes: bool = False) -> _Triage:
    """Sort ``gm``'s call nodes: host checks and size arithmetic stay with torch (counted as checks); a node
    that converts (with its symbolic sizes, if any) is supported; the rest fall back to torch, each logged
    (a dynamic one as such). A dynamic node that converts only with its sizes known raises `ShapesNeeded`."""
    t = _Triage()
    excluded = _aliases_of_inputs(gm)
    for node in gm.graph.nodes:
        if node.op != "call_function" or node in excluded:
            continue
        name = op_name(node.target)
        if name in _HOST_CHECKS or is_size_arithmetic(node):
            t.checks += 1
            continue
        if name in INPUT_WRITES:
            t.writes += 1
            continue
        ok, why = _supported(node, data_sizes)
        if ok:
            t.supported.add(node)
        elif is_dynamic(node):
            with concrete_sizes():
                if node_supported(node, data_sizes=data_sizes)[0]:
                    raise ShapesNeeded(f"{name} converts only with its sizes known ({why})")
            t.dynamic.append(name)
            log.info("pbsdk: %s (dynamic sizes) falls back to torch: %s", name, why)
        elif name != "getitem":
            t.fallbacks.append(name)
            log.info("pbsdk: %s falls back to torch: %s", name, why)
    for node in _empty_at_the_boundary(t.supported):
        t.fallbacks.append(op_name(node.target))
        log.info("pbsdk: %s falls back to torch: its element-less result is read outside pbsdk's kernels",
                 op_name(node.target))
    return t


def _partition_module(name: str, sub: torch.fx.GraphModule, positions: Mapping[int, torch.Tensor],
                      request: CompileRequest, max_shapes: int) -> torch.nn.Module:
    """The module running partition ``sub``: compiled once (sizes read at run time where symbolic), or,
    when the compile with symbolic sizes fails, compiled per input shape (`PerShapePartition`)."""
    try:
        # AOTAutograd calls us under its fake-tensor mode; the frozen values are real tensors.
        with unset_fake_temporarily():
            return CompiledPartition(name, sub, positions, request)
    except Exception as exc:
        if not graph_is_symbolic(sub):
            raise
        log.info("pbsdk: partition %s did not compile with symbolic sizes (%s); it is compiled per shape",
                 name, _described(exc))
    return PerShapePartition(name, sub, positions, request, max_shapes)


def compile_aten(gm: torch.fx.GraphModule, frozen: Mapping[torch.fx.Node, torch.Tensor],
                 request: CompileRequest, max_shapes: int = 8) -> torch.fx.GraphModule:
    """Partition a functional core-ATen graph and replace its supported partitions with pbsdk kernels."""
    start = time.perf_counter()
    frozen_by_name = {n.name: t for n, t in frozen.items()}
    calls = [n for n in gm.graph.nodes if n.op == "call_function"]
    t = _triage(gm, request.target.dynamic_shapes)
    partitioner = CapabilityBasedPartitioner(gm, _Support(t.supported), allows_single_node_partition=True)
    partitions = [p for p in partitioner.propose_partitions()
                  if any(op_name(n.target) not in LAYOUT_OPS for n in p.nodes)]
    fused = partitioner.fuse_partitions(partitions, prefix="pbsdk_part_") if partitions else gm
    compiled_ops = failed = attention = stored = 0
    kernels = []
    errors: list[str] = []
    for node in list(fused.graph.nodes):
        if node.op != "call_module" or not str(node.target).startswith("pbsdk_part_"):
            continue
        sub = fused.get_submodule(str(node.target))
        assert isinstance(sub, torch.fx.GraphModule)
        # Placeholders by name: partitioning may rebuild the graph, so node identity is not kept.
        positions = {i: frozen_by_name[a.name] for i, a in enumerate(node.args) if isinstance(a, torch.fx.Node)
                     and a.op in ("placeholder", "get_attr") and a.name in frozen_by_name}
        n_ops = sum(1 for n in sub.graph.nodes if n.op == "call_function")
        try:
            part = _partition_module(str(node.target), sub, positions, request, max_shapes)
        except Exception as exc:  # noqa: BLE001 - a partition that fails to lower or compile runs in torch
            failed += 1
            errors.append(_described(exc))
            log.warning("pbsdk: partition %s (%d ops) did not compile and runs in torch: %s", node.target,
                        n_ops, errors[-1])
            continue
        setattr(fused, str(node.target), part)
        compiled_ops += n_ops
        if isinstance(part, CompiledPartition):
            attention += part.fused_attention
            stored += len(part.stored_order)
            kernels.append(part)
    fused.recompile()
    report = CompileReport(graph_ops=len(calls), compiled_ops=compiled_ops, partitions=len(partitions) - failed,
                           fallback_ops=tuple(t.fallbacks), failed_partitions=failed, frozen=bool(frozen),
                           seconds=time.perf_counter() - start, fused_attention=attention, host_checks=t.checks,
                           dynamic_ops=tuple(t.dynamic), per_shape_partitions=sum(
                               isinstance(getattr(fused, str(n.target), None), PerShapePartition)
                               for n in fused.graph.nodes if n.op == "call_module"),
                           kernels=tuple(_KernelOf(p) for p in kernels), errors=tuple(errors),
                           stored_order_inputs=stored, input_writes=t.writes)
    with _reports_lock:
        _reports.append(report)
    log.debug("pbsdk: %s", report)
    return fused


class PerShapePartition(torch.nn.Module):
    """A partition whose kernel needs its sizes: specialised to the concrete shapes of each call (its graph
    converted with the call's sizes in place of the symbols, `bound_sizes`), up to ``max_shapes`` shapes;
    further shapes, and a shape whose compile fails (logged once), run in torch. Python ints among the
    inputs (sizes) are part of the key."""

    def __init__(self, name: str, sub: torch.fx.GraphModule, frozen: Mapping[int, torch.Tensor],
                 request: CompileRequest, max_shapes: int) -> None:
        super().__init__()
        self.name, self.sub, self.request, self.max_shapes = name, sub, request, max_shapes
        self._frozen = dict(frozen)
        self.compiled: dict[tuple[Any, ...], Any] = {}
        self._lock = threading.Lock()

    def forward(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self.compiled.get(key) or self._specialise(key, args)
        return fn(*args)

    def _specialise(self, key: tuple[Any, ...], args: Sequence[Any]) -> Any:
        if len(self.compiled) >= self.max_shapes:
            log.info("pbsdk: partition %s compiled for %d shapes (max_shapes); further shapes run in torch",
                     self.name, self.max_shapes)
            return self.sub
        try:
            # The partition's own graph, converted with this call's sizes in place of its symbols.
            with bound_sizes(bind_symbols(self.sub, args)):
                fn: Any = CompiledPartition(f"{self.name}_{len(self.compiled)}", self.sub, self._frozen,
                                            self.request)
        except Exception as exc:  # noqa: BLE001 - this shape runs in torch, as any failed partition
            log.warning("pbsdk: partition %s did not compile for shapes %s and runs in torch for them: %s",
                        self.name, [k[0] for k in key if isinstance(k, tuple)], _described(exc))
            fn = self.sub
        self.compiled[key] = fn
        return fn


# ------------------------------------------------------------------------------------------ AOTAutograd

def _static_positions(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> set[int]:
    """Inputs Dynamo marks as parameters or buffers (or that are ``nn.Parameter``s)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    out = set()
    for i, (n, x) in enumerate(zip(placeholders, example_inputs)):
        marked = (n.meta.get("tensor_dict") or {}).get("_dynamo_static_input_type") is not None
        if isinstance(x, torch.Tensor) and (marked or isinstance(x, torch.nn.Parameter)):
            out.add(i)
    return out


def _is_dynamic(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> bool:
    if any(not isinstance(x, torch.Tensor) for x in example_inputs):
        return True
    for n in gm.graph.nodes:
        val = n.meta.get("example_value", n.meta.get("val"))
        if isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape):
            return True
    return False


def compile_static(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], request: CompileRequest,
                   opts: TorchOptions, static: set[int]) -> Any:
    """AOTAutograd with pbsdk as the forward (and inference) compiler; a backward runs in torch."""
    from torch._decomp import core_aten_decompositions
    from torch._functorch.aot_autograd import aot_module_simplified, make_boxed_func

    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    training = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    lifted = [t for _, t in gm.named_parameters(remove_duplicate=False)] + \
             [t for _, t in gm.named_buffers(remove_duplicate=False)]
    real = lifted + list(example_inputs)
    freeze = opts.freeze and not training
    frozen_positions = (set(range(len(lifted))) | {len(lifted) + i for i in static}) if freeze else set()
    if training:
        log.info("pbsdk: graph needs gradients; the forward is compiled, the backward runs in torch, "
                 "parameters stay inputs")

    def forward_compiler(fx: torch.fx.GraphModule, fake_args: Sequence[Any]) -> Any:
        writes = write_in_place(fx)
        placeholders = [n for n in fx.graph.nodes if n.op == "placeholder"]
        frozen: dict[torch.fx.Node, torch.Tensor] = {}
        # AOTAutograd keeps the argument order (lifted parameters first) unless it deduplicated or
        # rewrote inputs; freeze only when the positions provably line up.
        aligned = len(placeholders) == len(real) and all(
            isinstance(r, torch.Tensor) and isinstance(f, torch.Tensor) and tuple(r.shape) == tuple(f.shape)
            and r.dtype == f.dtype for r, f in ((real[i], fake_args[i]) for i in frozen_positions))
        if aligned:
            # An input the graph writes (a static cache marked as a static address) is never a constant.
            frozen = {placeholders[i]: real[i] for i in frozen_positions if placeholders[i].name not in writes.written}
        elif frozen_positions:
            log.info("pbsdk: AOTAutograd rewrote the inputs; parameters stay kernel inputs")
        if freeze:
            frozen.update(_attribute_constants(fx))
        return make_boxed_func(compile_aten(fx, frozen, request, opts.max_shapes))

    def backward_compiler(fx: torch.fx.GraphModule, fake_args: Sequence[Any]) -> Any:
        return make_boxed_func(fx)

    # torch's stubs type the compilers as AOTDispatchCompiler protocols and the decompositions as a dict.
    return aot_module_simplified(gm, example_inputs, fw_compiler=forward_compiler,  # type: ignore[arg-type]
                                 bw_compiler=backward_compiler,  # type: ignore[arg-type]
                                 inference_compiler=forward_compiler,  # type: ignore[arg-type]
                                 decompositions=core_aten_decompositions(),  # type: ignore[arg-type]
                                 # Input writes stay in the inference graph, where `write_in_place` makes
                                 # a cache update the row write it is (not a copy of the whole input).
                                 keep_inference_input_mutations=not training)


_MUTATING = {"aten.copy_.default", "aten.set_.source_Tensor", "aten.resize_.default"}


def compile_inference(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], request: CompileRequest,
                      opts: TorchOptions, static: set[int]) -> Any | None:
    """Inference without AOTAutograd's runtime wrappers: the graph is traced to functional core ATen
    here (``functionalize`` + ``make_fx`` with the core decompositions), partitioned and compiled, and
    Dynamo gets the partitioned graph module itself — no per-call input/output bookkeeping (≈30 µs a
    call on this host's small models). None when the graph mutates an input (AOTAutograd's wrappers
    replay such mutations; `compile_static` then takes it)."""
    from torch._decomp import core_aten_decompositions, get_decompositions
    from torch.func import functionalize
    from torch.fx.experimental.proxy_tensor import make_fx

    if any(not isinstance(x, torch.Tensor) for x in example_inputs):
        return None
    # AOTAutograd's functionalization rewrites batch norm's (here unused) running-stat updates away;
    # without it native_batch_norm needs a decomposition: in eval mode its functional inference overload
    # (one node, converted as one op), else torch's decomposition into elementwise ops.
    table = dict(core_aten_decompositions())
    decomposed = get_decompositions([torch.ops.aten.native_batch_norm])[torch.ops.aten.native_batch_norm.default]

    def batch_norm(x: Any, weight: Any, bias: Any, running_mean: Any, running_var: Any, training: bool,
                   momentum: float, eps: float) -> Any:
        if training or running_mean is None or running_var is None:
            return decomposed(x, weight, bias, running_mean, running_var, training, momentum, eps)
        return torch.ops.aten._native_batch_norm_legit_no_training.default(x, weight, bias, running_mean,
                                                                          running_var, momentum, eps)

    table[torch.ops.aten.native_batch_norm.default] = batch_norm
    # Traced on fake copies in a fresh, static-shape fake mode: nothing runs, so nothing the graph would
    # mutate (an input, a running statistic) is touched at compile time.
    from torch._subclasses.fake_tensor import FakeTensorMode

    with unset_fake_temporarily(), torch.no_grad():
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        fakes = [mode.from_tensor(x, static_shapes=True) for x in example_inputs]
        with mode:
            traced: torch.fx.GraphModule = gm
            if _uses_vmap(gm):
                # functorch's functionalize cannot wrap a graph that enters vmap levels itself (an internal
                # assert, and the failed trace leaves a vmap level behind); a plain trace first turns the
                # vmap into the batched ATen ops it runs (transformers builds its attention masks this way).
                traced = make_fx(gm, decomposition_table=table, tracing_mode="real")(*fakes)  # type: ignore[arg-type]
            aten = make_fx(functionalize(traced, remove="mutations"), decomposition_table=table,  # type: ignore[arg-type]
                           tracing_mode="real")(*fakes)
    # Decompositions leave dead nodes behind (native_batch_norm's decomposition allocates its unused
    # saved-statistics outputs with integer-typed ``empty``s); they must not make the support check fail.
    aten.graph.eliminate_dead_code()
    aten.recompile()
    calls = [n for n in aten.graph.nodes if n.op == "call_function"]
    if any(op_name(n.target) in _MUTATING or op_name(n.target).endswith("_.default") for n in calls):
        return None
    # An op pbsdk does not convert here might convert after AOTAutograd's rewrites: let it try.
    if any(not _supported(n, request.target.dynamic_shapes)[0] and op_name(n.target) not in _HOST_CHECKS | {"getitem"}
           for n in calls):
        return None
    placeholders = [n for n in aten.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return None
    frozen = {placeholders[i]: example_inputs[i] for i in static} if opts.freeze else {}
    if opts.freeze:
        frozen.update(_attribute_constants(aten))
    fused = compile_aten(aten, frozen, request, opts.max_shapes)
    return _single_partition_call(fused) or fused


def _attribute_constants(gm: torch.fx.GraphModule) -> dict[torch.fx.Node, torch.Tensor]:
    """The real tensors ``gm`` reads through ``get_attr``: the parameters Dynamo keeps on the graph module
    (not as inputs) when ``torch._inductor.config.freezing`` is on — what PyTorch's x86 int8 guide sets —
    and the constants a trace captured. Frozen like parameters, so a PT2E weight is still an i8 constant
    the planner sees (as inputs it would make the convolution a float one)."""
    from torch._subclasses.fake_tensor import is_fake

    out: dict[torch.fx.Node, torch.Tensor] = {}
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        value: Any = gm
        for part in str(n.target).split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor) and not is_fake(value):
            out[n] = value
    return out


def _uses_vmap(gm: torch.fx.GraphModule) -> bool:
    """Whether Dynamo's graph enters functorch vmap levels itself (``torch.vmap`` traced inline)."""
    return any(n.op == "call_function" and getattr(n.target, "__name__", "") == "_vmap_increment_nesting"
               for n in gm.graph.nodes)


def _single_partition_call(fused: torch.fx.GraphModule) -> Any | None:
    """When the whole graph is one pbsdk partition, a plain function calling its ``forward`` (no FX
    module and no ``nn.Module.__call__`` per call); None otherwise."""
    nodes = list(fused.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    calls = [n for n in nodes if n.op == "call_module"]
    (out,) = [n for n in nodes if n.op == "output"]
    if len(calls) != 1 or any(n.op == "call_function" and n.target is not operator.getitem for n in nodes):
        return None
    part = fused.get_submodule(str(calls[0].target))
    if not isinstance(part, CompiledPartition) or calls[0].kwargs:
        return None
    if not all(isinstance(a, torch.fx.Node) and a.op == "placeholder" for a in calls[0].args):
        return None
    where = {n: i for i, n in enumerate(placeholders)}
    picks = [where[a] for a in calls[0].args]  # type: ignore[index]
    result = out.args[0]
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    plan: list[tuple[str, int]] = []  # ("arg", position) | ("out", index) | ("all", 0)
    for item in items:
        if item is calls[0]:
            plan.append(("all", 0))
        elif isinstance(item, torch.fx.Node) and item.op == "placeholder":
            plan.append(("arg", where[item]))
        elif (isinstance(item, torch.fx.Node) and item.op == "call_function" and item.args[0] is calls[0]
              and isinstance(item.args[1], int)):
            plan.append(("out", item.args[1]))
        else:
            return None
    as_tuple = isinstance(result, (tuple, list))
    pick = operator.itemgetter(*picks) if len(picks) > 1 else (lambda a: (a[picks[0]],)) if picks else (lambda a: ())

    def call(args: Sequence[Any]) -> Any:
        chosen = pick(args)
        try:
            fast = part._fast  # rebuilt if the partition recompiles
            got = fast(chosen) if fast is not None else None
            return part._general(chosen) if got is None else got
        except Exception as exc:  # noqa: BLE001 - as `CompiledPartition.forward`
            return part._fall_back(chosen, exc)

    if plan == [("all", 0)] and not as_tuple:
        def run_one(*args: Any) -> Any:
            return call(args)
        return run_one

    def run(*args: Any) -> Any:
        got = call(args)
        outs = [got if kind == "all" else args[i] if kind == "arg" else got[i] for kind, i in plan]
        return tuple(outs) if as_tuple else outs[0]

    return run


def _specialise(gm: torch.fx.GraphModule, args: Sequence[Any]) -> torch.fx.GraphModule:
    """``gm`` traced for the concrete ``args``: on fake copies (a real trace runs the graph, and so writes
    the inputs it mutates, a cache's length, once more before the compiled graph writes them again), with
    the decompositions AOTAutograd applies next (traced without them, a fused op's result strides, e.g.
    SDPA's, turn the model's ``reshape`` into a ``view`` that the decomposed op's strides do not allow)."""
    from torch._decomp import core_aten_decompositions
    from torch.fx.experimental.proxy_tensor import make_fx

    table = core_aten_decompositions()
    return make_fx(gm, decomposition_table=table, tracing_mode="fake")(*args)  # type: ignore[arg-type]


class PerShape:
    """A graph with symbolic shapes, compiled once per concrete input signature (up to ``max_shapes``)."""

    def __init__(self, gm: torch.fx.GraphModule, request: CompileRequest, opts: TorchOptions,
                 static: set[int]) -> None:
        self.gm = gm
        self.request = request
        self.opts = opts
        self.static = static
        self.compiled: dict[tuple[Any, ...], Any] = {}
        self._warned = False
        self._lock = threading.Lock()

    def __call__(self, *args: Any) -> Any:
        key = tuple((tuple(a.shape), a.dtype) if isinstance(a, torch.Tensor) else a for a in args)
        fn = self.compiled.get(key)
        if fn is None:
            with self._lock:
                fn = self.compiled.get(key)
                if fn is None and len(self.compiled) >= self.opts.max_shapes:
                    if not self._warned:
                        log.warning("pbsdk: graph compiled for %d shapes (max_shapes); further shapes run "
                                    "in torch", self.opts.max_shapes)
                        self._warned = True
                    return self.gm(*args)
                if fn is None:
                    log.info("pbsdk: compiling for shapes %s", [k[0] for k in key if isinstance(k, tuple)])
                    start = time.perf_counter()
                    try:
                        specialized = _specialise(self.gm, args)
                        fn = compile_static(specialized, list(args), self.request, self.opts, self.static)
                    except Exception as exc:  # noqa: BLE001 - this shape runs in torch, as any failed graph
                        fn = _runs_in_torch(self.gm, exc, start)
                    self.compiled[key] = fn
        return fn(*args)


#: The transformers releases the frontend supports, ``[lowest, beyond)`` as (major, minor): tested with 4.57.6
#: (the 4.x pin) and 5.23.0; the model tests and the real-model tier run on both.
TRANSFORMERS_SUPPORTED = ((4, 57), (6, 0))
_transformers_checked = False


def transformers_support(version: str) -> str | None:
    """Why a transformers ``version`` is outside `TRANSFORMERS_SUPPORTED` (a message), or None inside it."""
    match = re.match(r"(\d+)\.(\d+)", version)
    (lo, beyond) = TRANSFORMERS_SUPPORTED
    if match and lo <= (int(match[1]), int(match[2])) < beyond:
        return None
    return (f"transformers {version} is not a version pbsdk's torch frontend supports (>= {lo[0]}.{lo[1]}, "
            f"< {beyond[0]}.{beyond[1]}); its models may trace to graphs or ops pbsdk does not convert, which "
            "then run in torch (each logged), or compile with untested patterns")


def _check_transformers() -> None:
    """Once per process, when the model's code comes from transformers: state an unsupported version."""
    global _transformers_checked
    module = sys.modules.get("transformers")
    if _transformers_checked or module is None:
        return
    _transformers_checked = True
    why = transformers_support(str(getattr(module, "__version__", "unknown")))
    if why is not None:
        log.warning("pbsdk: %s", why)


#: Exceptions AOTAutograd raises for Dynamo to catch and trace the frame again (e.g. with ``dynamic=True``, a
#: float input, dropout's probability, that must become a tensor): never a failure to fall back from.
_RESTART = torch._dynamo.exc.RestartAnalysis


def backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any], *,
            options: Mapping[str, Any] | None = None) -> Any:
    """The Dynamo backend registered as ``"pbsdk"`` (entry point ``torch_dynamo_backends``)."""
    opts = TorchOptions.from_dict(options)
    _check_transformers()
    request = resolve(opts.target, opts.spec, opts.compile_options)
    if any(isinstance(x, torch.Tensor) and x.device.type != "cpu" for x in example_inputs):
        log.warning("pbsdk: inputs are not on the CPU; the graph runs in torch")
        return gm.forward
    static = _static_positions(gm, example_inputs)
    if _is_dynamic(gm, example_inputs):
        if opts.dynamic == "per_shape":
            return PerShape(gm, request, opts, static)
        try:
            return compile_static(gm, example_inputs, request, opts, static)
        except _RESTART:
            raise  # Dynamo's signal to trace again (a float input made a tensor): its to handle, as for Inductor
        except Exception as exc:  # noqa: BLE001 - not traceable with its symbols: per concrete shape, as before
            log.info("pbsdk: the graph did not compile with symbolic sizes (%s); it is compiled per shape",
                     _described(exc))
            return PerShape(gm, request, opts, static)
    tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
    training = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
    start = time.perf_counter()
    try:
        if not training and opts.direct:
            direct = compile_inference(gm, example_inputs, request, opts, static)
            if direct is not None:
                return direct
        return compile_static(gm, example_inputs, request, opts, static)
    except _RESTART:
        raise
    except Exception as exc:  # noqa: BLE001 - untraceable (data-dependent ops, ...) or a pbsdk failure
        return _runs_in_torch(gm, exc, start)


def _runs_in_torch(gm: torch.fx.GraphModule, exc: Exception, start: float) -> Any:
    """The whole graph left to torch after ``exc`` (raised while tracing, partitioning, converting or
    compiling it): logged, reported as one failed partition, and Dynamo's graph returned to run eagerly.
    KeyboardInterrupt and SystemExit are not Exceptions and still reach the user."""
    why = _described(exc)
    log.warning("pbsdk: this graph could not be compiled (%s); it runs in torch", why)
    ops = sum(1 for n in gm.graph.nodes if n.op.startswith("call_"))
    report = CompileReport(graph_ops=ops, compiled_ops=0, partitions=0, fallback_ops=(), failed_partitions=1,
                           frozen=False, seconds=time.perf_counter() - start, errors=(why,))
    with _reports_lock:
        _reports.append(report)
    return gm.forward


__all__ = ["TRANSFORMERS_SUPPORTED", "CompileReport", "CompiledPartition", "TorchOptions", "backend",
           "clear_reports", "compile_aten", "graph_dtype", "reports", "transformers_support"]
