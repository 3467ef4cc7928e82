"""A torch module as one exported entry: ``torch.export`` traces it to core ATen, pbsdk converts the whole
graph (parameters and buffers frozen as the file's weights) and compiles it as one kernel.

Unlike ``torch.compile(backend="pbsdk")``, nothing may fall back to torch here: the deploy runtime has no
torch. An op pbsdk does not convert is an `UnsupportedError` naming every such op and its count.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch
import torch.fx

from pbsdk.core.compiler import CompileRequest, compile_text
from pbsdk.core.errors import UnsupportedError
from pbsdk.core.ir.emit import emit_program
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY
from pbsdk.deploy import EntryArtifact, carried
from pbsdk.frontends.torch.convert import node_supported, op_name
from pbsdk.frontends.torch.dynamo_backend import lower_partition


def _as_tensors(example_inputs: Sequence[Any] | Mapping[str, Any]) -> tuple[torch.Tensor, ...]:
    values = list(example_inputs.values()) if isinstance(example_inputs, Mapping) else list(example_inputs)
    return tuple(torch.from_numpy(np.ascontiguousarray(v)) if isinstance(v, np.ndarray) else v for v in values)


def traced(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> Any:
    """``torch.export`` of the module in eval mode, decomposed to core ATen."""
    from torch._decomp import core_aten_decompositions

    module = module.eval()
    with torch.no_grad():
        program = torch.export.export(module, args)
        return program.run_decompositions(core_aten_decompositions())  # type: ignore[arg-type]


#: Checks torch.export leaves in the graph (a tensor's dtype/shape, a symbolic size's range): the exported
#: shapes are static and checked by the runtime at each call, so they compute nothing here.
_ASSERTIONS = {"aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten._assert_async.msg",
               "aten.sym_constrain_range_for_size.default", "aten.sym_constrain_range.default"}


def drop_assertions(gm: torch.fx.GraphModule) -> None:
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and op_name(node.target) in _ASSERTIONS and not node.users:
            gm.graph.erase_node(node)
    gm.recompile()


def refuse_fallbacks(gm: torch.fx.GraphModule, *, data_sizes: bool = False) -> None:
    """An `UnsupportedError` naming the ops pbsdk would leave to torch, if there are any."""
    left: Counter[str] = Counter()
    reasons: dict[str, str] = {}
    for node in gm.graph.nodes:
        if node.op != "call_function" or op_name(node.target) == "getitem":
            continue
        ok, why = node_supported(node, data_sizes=data_sizes)
        if not ok:
            left[op_name(node.target)] += 1
            reasons.setdefault(op_name(node.target), why)
    if left:
        listed = ", ".join(f"{op} x{n} ({reasons[op]})" for op, n in sorted(left.items()))
        raise UnsupportedError(f"{sum(left.values())} op(s) of the module would run in torch, which an exported "
                               f"model cannot: {listed}", op=", ".join(sorted(left)))


def from_torch(module: torch.nn.Module, example_inputs: Sequence[Any] | Mapping[str, Any],
               request: CompileRequest, name: str | None) -> EntryArtifact:
    """The module compiled whole for ``example_inputs``' shapes and dtypes (see the module docstring)."""
    from torch.export.graph_signature import InputKind

    args = _as_tensors(example_inputs)
    program = traced(module, args)
    gm = program.graph_module
    drop_assertions(gm)
    refuse_fallbacks(gm, data_sizes=request.target.dynamic_shapes)
    specs = program.graph_signature.input_specs
    frozen: dict[int, torch.Tensor] = {}
    for i, spec in enumerate(specs):
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            frozen[i] = program.state_dict[spec.target] if spec.target in program.state_dict \
                else program.constants[spec.target]
        elif spec.kind == InputKind.CONSTANT_TENSOR:
            frozen[i] = program.constants[spec.target]  # type: ignore[assignment]
    graph = lower_partition(gm, frozen, data_sizes=request.target.dynamic_shapes).graph
    entry = re.sub(r"\W", "_", name or type(module).__name__).lstrip("_") or "main"
    emitted = emit_program(graph, func_name=entry, spec=request.spec, options=request.options,
                           forms=request.target.attention_forms)
    del graph
    artifact = compile_text(emitted.text, request, constants=emitted.constants)
    user_in = [s.arg.name for s in specs if s.kind == InputKind.USER_INPUT]
    given = [carried(torch.empty(0, dtype=arg.dtype).numpy().dtype, DTYPE_TO_NUMPY[dt], nm)
             for (_, dt), arg, nm in zip(artifact.inputs, args, user_in)]
    (out_node,) = [n for n in gm.graph.nodes if n.op == "output"]
    results = out_node.args[0]
    outs = list(results) if isinstance(results, (tuple, list)) else [results]
    for (_, dt), node in zip(artifact.outputs, outs):
        want = node.meta["val"].dtype
        if torch.empty(0, dtype=want).numpy().dtype != np.dtype(DTYPE_TO_NUMPY[dt]):
            raise UnsupportedError(f"an output is {want} and pbsdk's kernel makes {DTYPE_TO_NUMPY[dt]}; exporting "
                                   "such modules is not supported")
    out_names = [str(s.arg.name) for s in program.graph_signature.output_specs]
    return EntryArtifact(entry, artifact, tuple(user_in), tuple(out_names), tuple(given))

