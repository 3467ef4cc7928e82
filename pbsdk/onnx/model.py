"""Load an ONNX model, convert its graph to `pbsdk.ops`, compile it and call it on numpy arrays."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pbsdk.core.compiler import CompileRequest, resolve
from pbsdk.core.dims import Dim, is_dynamic
from pbsdk.core.errors import ArgumentError, OptionsError, PbsdkError, UnsupportedError
from pbsdk.core.ir.graph import Graph, TensorType
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import Target
from pbsdk.frontends.jit import JitFunction
from pbsdk.frontends.logs import configure_from_env
from pbsdk.frontends.tracing import Tensor, tracing
from pbsdk.onnx import symbolic
from pbsdk.onnx.convert import ELEM_TYPES, NodeInfo, carrier, convert_node, is_integer
from pbsdk.onnx.plan import Plan, Step, plan_steps
from pbsdk.onnx.specialise import DEFAULT_LIMIT, Specialisations, value_inputs

log = logging.getLogger("pbsdk.onnx")

TypeInfo = tuple[int, "tuple[int, ...] | None"]


def _onnx() -> Any:
    try:
        import onnx
    except ImportError:  # pragma: no cover - the extra is installed in the test environment
        raise PbsdkError("pbsdk.onnx needs the onnx package: pip install 'pbsdk[onnx]'") from None
    return onnx


@dataclasses.dataclass(frozen=True)
class ImportOptions:
    """How a model is imported. ``fallback``: nodes pbsdk cannot convert run through ``onnx.reference``
    between compiled segments (each logged) instead of failing the import; ``input_shapes``: static
    shapes for inputs with dynamic dimensions (name -> shape); ``check``: run ``onnx.checker`` first;
    ``specialisations``: how many compiles a model whose inputs carry shapes or axes keeps, one per
    distinct value of those inputs (`pbsdk.onnx.specialise`)."""

    fallback: bool = False
    input_shapes: Mapping[str, tuple[int, ...]] = dataclasses.field(default_factory=dict)
    check: bool = True
    specialisations: int = DEFAULT_LIMIT

    @staticmethod
    def parse(options: ImportOptions | Mapping[str, Any] | None) -> ImportOptions:
        if isinstance(options, ImportOptions):
            return options
        options = dict(options or {})
        known = {f.name for f in dataclasses.fields(ImportOptions)}
        unknown = sorted(set(options) - known)
        if unknown:
            raise OptionsError(f"unknown ONNX import option(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
        shapes = options.get("input_shapes") or {}
        if not isinstance(shapes, Mapping) or not all(
                isinstance(v, (tuple, list)) and all(isinstance(d, int) and d >= 1 for d in v) for v in shapes.values()):
            raise OptionsError("input_shapes must map input names to shapes of positive ints")
        for flag in ("fallback", "check"):
            if flag in options and not isinstance(options[flag], bool):
                raise OptionsError(f"{flag} must be a bool, got {options[flag]!r}")
        limit = options.get("specialisations", DEFAULT_LIMIT)
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise OptionsError(f"specialisations must be a positive int, got {limit!r}")
        return ImportOptions(fallback=options.get("fallback", False),
                             input_shapes={k: tuple(v) for k, v in shapes.items()},
                             check=options.get("check", True), specialisations=limit)


@dataclasses.dataclass(frozen=True)
class ImportReport:
    """What became of each node: converted into a kernel, folded at import, or run by ``onnx.reference``
    (op type -> node count)."""

    converted: Mapping[str, int]
    folded: Mapping[str, int]
    fallback: Mapping[str, int]
    opset: int

    def format(self) -> str:
        def line(title: str, counts: Mapping[str, int]) -> str:
            items = ", ".join(f"{k} x{v}" for k, v in sorted(counts.items()))
            return f"{title} ({sum(counts.values())} nodes): {items or '-'}"
        return "\n".join([f"opset {self.opset}", line("compiled", self.converted), line("folded at import", self.folded),
                          line("onnx.reference fallback", self.fallback)])


def _read(model: Any) -> Any:
    onnx = _onnx()
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    path = Path(model)
    if not path.is_file():
        raise PbsdkError(f"cannot read ONNX model {path}: no such file")
    try:
        return onnx.load(str(path))
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends: not a model
        raise PbsdkError(f"{path} is not a readable ONNX model: {exc}") from None


def _elem_shape(value_type: Any) -> TypeInfo | None:
    if not value_type.HasField("tensor_type"):
        return None
    tt = value_type.tensor_type
    if not tt.HasField("shape"):
        return (tt.elem_type, None)
    dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim)
    return (tt.elem_type, None if any(d < 0 for d in dims) else dims)


#: Initializers of more values than this are taken out of the model before the checker and shape inference
#: run (`_lift_initializers`), as frozen weights of more than 1024 values are never MLIR text.
LIFT_ABOVE = 1024


def _lift_initializers(model: Any) -> dict[str, np.ndarray]:
    """Take the large initializers out of ``model`` (mutated): their data as numpy arrays, by name; each
    becomes a graph input of its type and shape, so that the checker and shape inference, which serialise
    and copy the whole model two or three times, see their types without their data (BERT-base's 435 MB of
    weights: the import's peak resident memory 1.9 -> 1.1 GB)."""
    onnx = _onnx()
    inits = model.graph.initializer
    inputs = {i.name for i in model.graph.input}  # before IR version 4 initializers are inputs too
    lifted: dict[str, np.ndarray] = {}
    for k in reversed(range(len(inits))):
        init = inits[k]
        if init.data_type == onnx.TensorProto.STRING or int(np.prod(init.dims)) <= LIFT_ABOVE:
            continue
        try:
            lifted[init.name] = onnx.numpy_helper.to_array(init)
        except (ValueError, TypeError) as exc:  # its data does not fill its dims, or an unknown type
            raise PbsdkError(f"initializer {init.name!r} of the ONNX model is malformed: {exc}") from None
        if init.name not in inputs:
            model.graph.input.append(onnx.helper.make_tensor_value_info(init.name, init.data_type,
                                                                        list(init.dims)))
        del inits[k]
    return lifted


def _declared(value_type: Any) -> tuple[int | str | None, ...] | None:
    """A tensor type's dimensions as declared: ``dim_value`` ints, ``dim_param`` strs, None where unnamed."""
    if not value_type.HasField("tensor_type") or not value_type.tensor_type.HasField("shape"):
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
                 for d in value_type.tensor_type.shape.dim)


def _with_static_inputs(model: Any, shapes: Mapping[str, tuple[int, ...]], weights: Mapping[str, Any],
                        symbolic_dims: bool = False) -> Any:
    """A copy of ``model`` whose graph inputs have static shapes (given ones replace dynamic dimensions);
    ``weights``: the lifted initializers, graph inputs that are not the model's. ``symbolic_dims`` (a target
    that compiles run-time sizes): dimensions not given stay dynamic, compiled as symbols
    (`pbsdk.onnx.symbolic`)."""
    onnx = _onnx()
    inits = {i.name for i in model.graph.initializer} | set(weights)
    model = onnx.ModelProto.FromString(model.SerializeToString()) if shapes else model
    unknown = set(shapes) - {i.name for i in model.graph.input}
    if unknown:
        raise OptionsError(f"input_shapes names no input of the model: {', '.join(sorted(unknown))}")
    for inp in model.graph.input:
        if inp.name in inits:
            continue
        if not inp.type.HasField("tensor_type"):
            raise UnsupportedError(f"input {inp.name!r} is not a tensor")
        dims = inp.type.tensor_type.shape.dim
        if inp.name in shapes:
            want = shapes[inp.name]
            if len(want) != len(dims):
                raise ArgumentError(f"input_shapes[{inp.name!r}] = {want} has rank {len(want)}, the model's input "
                                    f"has rank {len(dims)}")
            for d, v in zip(dims, want):
                if d.HasField("dim_value") and d.dim_value != v:
                    raise ArgumentError(f"input_shapes[{inp.name!r}] = {want} contradicts the model's static "
                                        f"dimension {d.dim_value}")
                d.dim_value = v
        elif any(not d.HasField("dim_value") for d in dims) and not symbolic_dims:
            sym = [d.dim_param or "?" for d in dims if not d.HasField("dim_value")]
            raise UnsupportedError(f"input {inp.name!r} has dynamic dimensions ({', '.join(sym)}): pbsdk compiles "
                                   f"static shapes on this target; give them with input_shapes={{'{inp.name}': (...)}} "
                                   "(targets that compile run-time sizes, such as cpu, compile them as symbols)")
    return model


def _attrs(node: Any) -> dict[str, Any]:
    onnx = _onnx()
    out = {}
    for a in node.attribute:
        if a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS):
            out[a.name] = a  # subgraphs stay protos: their ops are not converted
            continue
        v = onnx.helper.get_attribute_value(a)
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, list) and v and isinstance(v[0], bytes):
            v = [s.decode() for s in v]
        elif isinstance(v, onnx.TensorProto):
            v = onnx.numpy_helper.to_array(v)
        out[a.name] = v
    return out


def gather_elements(data: np.ndarray, indices: np.ndarray, axis: int = 0) -> np.ndarray:
    """ONNX GatherElements in numpy: ``out[i][j][k] = data[i][indices[i][j][k]][k]`` along ``axis`` (negative
    indices counted from the end); ``indices`` has ``data``'s rank and, off ``axis``, dimensions no larger."""
    axis = int(axis) % data.ndim
    idx = np.where(indices < 0, indices + data.shape[axis], indices)
    view = data[tuple(slice(None) if d == axis else slice(0, n) for d, n in enumerate(idx.shape))]
    return np.take_along_axis(view, idx, axis=axis)


def _reference_ops() -> list[Any]:
    """Node implementations used in place of ``onnx.reference``'s own: its GatherElements (onnx 1.23) fails on
    data longer than the indices along the axis (data (1, 512), indices (1, 16): "cannot reshape array"),
    which BERT's export by transformers 5 has for its token-type buffer."""
    from onnx.reference.op_run import OpRun

    class GatherElements(OpRun):  # type: ignore[misc]
        op_domain = ""

        def _run(self, data: np.ndarray, indices: np.ndarray, axis: int | None = None) -> tuple[np.ndarray]:
            return (gather_elements(data, indices, axis or 0),)

    return [GatherElements]


def _reference_run(node: Any, opsets: Mapping[str, int], inputs: Sequence[Any]) -> list[np.ndarray]:
    """One node through ``onnx.reference`` (folding and fallback), with `_reference_ops` for its faulty ones."""
    from onnx.reference import ReferenceEvaluator

    feeds = {name: value for name, value in zip(node.input, inputs) if name}
    evaluator = ReferenceEvaluator(node, opsets=dict(opsets), new_ops=_reference_ops())
    return [np.asarray(v) for v in evaluator.run(None, feeds)]


def _prepare(given: Any, options: ImportOptions, symbolic_dims: bool = False) -> tuple[Any, dict[str, np.ndarray]]:
    """The model read, its local functions inlined, its large initializers lifted out (`_lift_initializers`),
    checked and its inputs given static shapes; never the caller's proto."""
    onnx = _onnx()
    model = _read(given)
    if model.functions:
        from onnx import inliner
        model = inliner.inline_local_functions(model)
    elif model is given:  # the caller's proto: lifting the initializers must not change it
        model = onnx.ModelProto()
        model.CopyFrom(given)
    weights = _lift_initializers(model)
    if options.check:
        try:
            onnx.checker.check_model(model)
        except onnx.checker.ValidationError as exc:
            raise PbsdkError(f"the ONNX checker rejects the model: {str(exc).splitlines()[0]}") from None
    return _with_static_inputs(model, options.input_shapes, weights, symbolic_dims), weights


class OnnxModel:
    """An ONNX model compiled for one target and spec. Call it on numpy arrays (positionally, in the
    model's input order, or ``run({name: array})``); returns one array, or a tuple for several outputs."""

    def __init__(self, model: Any, request: CompileRequest, options: ImportOptions, *,
                 _lifted: Mapping[str, np.ndarray] | None = None) -> None:
        configure_from_env()
        onnx = _onnx()
        self.request = request
        self.options = options
        if _lifted is None:
            model, weights = _prepare(model, options, bool(request.target.dynamic_shapes))
        else:  # a specialisation: a copy of a prepared model, its weights already lifted
            weights = dict(_lifted)
        inits = {i.name for i in model.graph.initializer} | set(weights)
        graph = model.graph
        self.name = re.sub(r"\W", "_", graph.name or "onnx_model") or "onnx_model"
        self.input_names = [i.name for i in graph.input if i.name not in inits]
        self.output_names = [o.name for o in graph.output]
        in_types = {i.name: _elem_shape(i.type) for i in graph.input if i.name not in inits}
        declared = {i.name: _declared(i.type) for i in graph.input if i.name not in inits}
        #: the symbols of the inputs' dynamic dimensions (`pbsdk.onnx.symbolic`); None: static shapes
        self.symbols: symbolic.Symbols | None = None
        if any(in_types[n] is not None and in_types[n][1] is None for n in self.input_names):  # type: ignore[index]
            self.symbols = symbolic.symbols_of({n: declared[n] or () for n in self.input_names})
        self.inputs: list[tuple[str, TensorType, Any]] = []
        for name in self.input_names:  # static shapes (`_with_static_inputs`), or symbolic ones
            t = in_types[name]
            assert t is not None
            shape: Any = t[1] if t[1] is not None else self.symbols.shapes[name]  # type: ignore[union-attr]
            self.inputs.append((name, TensorType(shape, carrier(t[0], f"input {name!r}")), ELEM_TYPES[t[0]][0]))
        #: sizes the conversion needs of the symbols' values, checked at each call (`pbsdk.onnx.symbolic`)
        self.requirements: list[symbolic.Requirement] = []
        #: the model compiled per input shape, where its kernels do not compile with symbolic sizes
        self.per_shape: Specialisations[OnnxModel] | None = None
        self._traced: dict[str, TensorType] = {}  # the traced type of every tensor value (symbolic shapes)
        decision = value_inputs([(n.op_type if (n.domain or "") in ("", "ai.onnx") else "", n.input, n.output)
                                 for n in graph.node],
                                {n: None if is_dynamic(t.shape) else t.shape for n, t, _ in self.inputs})
        #: the inputs the model is compiled per value of (name -> the operand each reaches); empty: one compile
        self.value_inputs: Mapping[str, str] = decision.specialised
        self.refused_value_inputs: Mapping[str, str] = decision.refused
        self._specialisations: Specialisations[OnnxModel] | None = None
        if self.value_inputs:
            self._base, self._weights = model, weights
            self._specialisations = Specialisations(
                options.specialisations, what=f"ONNX model {self.name!r}")
            log.info("ONNX model %r is compiled per value of %s", self.name,
                     ", ".join(f"{n!r} ({why})" for n, why in self.value_inputs.items()))
            return
        self._prepared, self._weights = model, weights  # what a per-shape compile starts from (`_static_copy`)
        try:
            model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception as exc:  # noqa: BLE001 - onnx raises InferenceError and a few others
            raise PbsdkError(f"ONNX shape inference fails on the model: {exc}") from None
        self.proto = model
        graph = model.graph
        self.opsets = {(o.domain or ""): o.version for o in model.opset_import}
        self.opsets.setdefault("", 1)
        self.opset = self.opsets.get("", self.opsets.get("ai.onnx", 1))
        inits_arrays = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer} | weights
        types: dict[str, TypeInfo | None] = {}
        self._declared: dict[str, tuple[int | str | None, ...] | None] = {}
        for v in list(graph.input) + list(graph.value_info) + list(graph.output):
            types[v.name] = _elem_shape(v.type)
            self._declared[v.name] = _declared(v.type)
        for name in inits_arrays:
            types[name] = None
        self.types = types
        self._nodes = list(graph.node)
        self.infos = [self._info(n) for n in self._nodes]
        self.known: dict[str, np.ndarray] = dict(inits_arrays)
        for name, ttype, np_dtype in self.inputs:  # an empty input is known: it holds nothing
            if 0 in ttype.shape:
                self.known[name] = np.zeros(ttype.shape, np_dtype)
        try:
            fallback, converted, folded = self._probe()
        except UnsupportedError as exc:
            if not self.refused_value_inputs:
                raise
            why = "; ".join(f"model input {n!r} cannot be specialised on: {w}" for n, w in self.refused_value_inputs.items())
            raise UnsupportedError(f"{exc.reason}\n{why}", op=exc.op) from exc
        self._report = ImportReport(converted=dict(converted), folded=dict(folded),
                                    fallback=dict(Counter(self.infos[i].op_type for i in fallback)),
                                    opset=self.opset)
        self._plan = plan_steps([(n.input, n.output) for n in self._nodes], fallback, set(self.known),
                                self.output_names)
        self._jits = {id(s): self._jit(s) for s in self._plan.compiled}
        for step in self._plan.compiled:  # compile now: errors belong to the import, not the first call
            jit, sig, _ = self._jits[id(step)]
            if jit is None:
                continue
            try:
                jit.kernel(sig)
            except (TypeError, PbsdkError) as exc:
                if self.symbols is None:
                    raise
                # a kernel the pipeline cannot build with symbolic sizes (a convolution over a symbolic
                # batch): the model compiles per input shape instead, as with input_shapes=, logged
                log.warning("ONNX model %r does not compile with symbolic sizes (%s: %s); it compiles per input "
                            "shape instead (at most %d kept)", self.name, type(exc).__name__,
                            str(exc).splitlines()[0] if str(exc) else "", options.specialisations)
                self.per_shape = Specialisations(options.specialisations, what=f"ONNX model {self.name!r}")
                break

    def _static_copy(self, shapes: Mapping[str, tuple[int, ...]]) -> OnnxModel:
        """The model imported and compiled for inputs of ``shapes`` (static kernels, `per_shape`)."""
        onnx = _onnx()
        proto = onnx.ModelProto()
        proto.CopyFrom(self._prepared)
        return OnnxModel(_with_static_inputs(proto, shapes, self._weights), self.request, self.options,
                         _lifted=self._weights)

    # --------------------------------------------------------------------------------- specialisation

    def _specialising(self, what: str) -> UnsupportedError:
        names = ", ".join(f"{n!r} ({why})" for n, why in self.value_inputs.items())
        return UnsupportedError(f"{self.name}: {what} exists per value of the input(s) {names}, which the model "
                                "is compiled for at run time: call specialise({name: value}) for one")

    @property
    def report(self) -> ImportReport:
        """What became of each node (of one specialisation: `specialise`)."""
        if self._specialisations is not None:
            raise self._specialising("the import report")
        return self._report

    @property
    def plan(self) -> Plan:
        """The compiled and reference steps (of one specialisation: `specialise`)."""
        if self._specialisations is not None:
            raise self._specialising("the plan")
        return self._plan

    @property
    def specialisations(self) -> Specialisations[OnnxModel] | None:
        """The compiled specialisations of a model with `value_inputs` (None for one compiled at import)."""
        return self._specialisations

    def specialise(self, values: Mapping[str, Any]) -> OnnxModel:
        """The model compiled for these values of its `value_inputs` (each a constant of that compile), from
        the cache of specialisations or compiled now; its inputs are the model's others."""
        if self._specialisations is None:
            raise ArgumentError(f"{self.name}: no input is specialised on (the model compiles once)")
        missing = [n for n in self.value_inputs if n not in values]
        if missing:
            raise ArgumentError(f"{self.name}: specialise needs a value for {', '.join(map(repr, missing))}")
        arrays = {}
        for name, t, np_dtype in self.inputs:
            if name in self.value_inputs:
                a = np.asarray(values[name])
                if a.shape != t.shape or a.dtype != np_dtype:
                    raise ArgumentError(f"{self.name}: input {name!r} must be {np.dtype(np_dtype).name}"
                                        f"{list(t.shape)}, got {a.dtype.name}{list(a.shape)}")
                arrays[name] = a
        key = tuple((n, a.tobytes()) for n, a in arrays.items())
        return self._specialisations.get(
            key, lambda: self._specialised(arrays),
            describe=lambda: ", ".join(f"{n}={a.tolist()}" for n, a in arrays.items()))

    def _specialised(self, values: Mapping[str, np.ndarray]) -> OnnxModel:
        """A copy of the prepared model whose ``values`` inputs are initializers, imported and compiled."""
        onnx = _onnx()
        proto = onnx.ModelProto()
        proto.CopyFrom(self._base)
        kept = [i for i in proto.graph.input if i.name not in values]
        del proto.graph.input[:]
        proto.graph.input.extend(kept)
        proto.graph.initializer.extend(onnx.numpy_helper.from_array(a, n) for n, a in values.items())
        return OnnxModel(proto, self.request, self.options, _lifted=self._weights)

    # ---------------------------------------------------------------------------------------- analysis

    def _info(self, node: Any) -> NodeInfo:
        domain = node.domain or ""
        opset = self.opsets.get(domain, self.opsets.get("ai.onnx", 1) if domain == "" else 0)
        return NodeInfo(op_type=node.op_type if domain in ("", "ai.onnx") else f"{domain}.{node.op_type}",
                        name=node.name, inputs=tuple(node.input), outputs=tuple(node.output), attrs=_attrs(node),
                        opset=opset, in_types=tuple(self.types.get(n) for n in node.input),
                        out_types=tuple(self.types.get(n) for n in node.output))

    def _foldable(self, node: Any, info: NodeInfo, values: Sequence[Any]) -> bool:
        return (not any(isinstance(v, Tensor) for v in values) and info.op_type not in _NONDETERMINISTIC
                and not any(not isinstance(a, (int, float, str, list, np.ndarray)) for a in info.attrs.values()))

    def _probe(self) -> tuple[set[int], Counter[str], Counter[str]]:
        """Convert every node once on fresh inputs (nothing compiled): which fold, which convert, and which
        do not (an error listing each, or fallback nodes when the option allows them)."""
        graph = Graph()
        env: dict[str, Any] = dict(self.known)
        fallback: set[int] = set()
        failures: list[str] = []
        converted: Counter[str] = Counter()
        folded: Counter[str] = Counter()
        with tracing(graph), symbolic.collecting(self.requirements):
            for name, t, _ in self.inputs:
                if name not in self.known:
                    env[name] = Tensor(graph.add("input", [], t), graph)
                    self._traced[name] = t
            for i, (node, info) in enumerate(zip(self._nodes, self.infos)):
                values = [env.get(n) if n else None for n in node.input]
                try:
                    results: tuple[Any, ...] | None = None
                    if self._foldable(node, info, values):
                        results = self._fold(node, info, values)
                    if results is not None:
                        folded[info.op_type] += 1
                    else:
                        with symbolic.at_node(self._label(node, info)):
                            results = convert_node(info, values)
                        converted[info.op_type] += 1
                except UnsupportedError as exc:
                    if not self.options.fallback:
                        failures.append(f"{node.name or '(unnamed)'}: {exc.reason}")
                    fallback.add(i)
                    try:
                        results = tuple(self._fresh(graph, name, exc) for name in node.output)
                    except UnsupportedError:
                        if self.options.fallback:
                            raise
                        break  # the nodes after it cannot be probed without its outputs: report those so far
                for name, r in zip(node.output, results):
                    if not name:
                        continue
                    env[name] = r
                    if isinstance(r, np.ndarray) and i not in fallback:
                        self.known[name] = r
                    elif isinstance(r, Tensor):
                        self._traced[name] = TensorType(r.shape, r.dtype)
        if failures:
            ops_ = sorted({f"{self.infos[i].op_type} (opset {self.infos[i].opset})" for i in fallback})
            raise UnsupportedError(f"{len(failures)} node(s) of the ONNX model cannot be converted "
                                   f"({', '.join(ops_)}); import with fallback=True to run them through "
                                   "onnx.reference instead"
                                   + (" (or give input_shapes= for static shapes: the model's dimensions "
                                      f"{self.symbols.describe()} are symbolic)" if self.symbols else "")
                                   + ":\n  " + "\n  ".join(failures),
                                   op=", ".join(sorted({self.infos[i].op_type for i in fallback})))
        for name in self.output_names:
            if name not in env:
                raise PbsdkError(f"output {name!r} is not computed by any node")
        return fallback, converted, folded

    def _fold(self, node: Any, info: NodeInfo, values: Sequence[Any]) -> tuple[Any, ...] | None:
        """A node whose inputs are all known, evaluated at import: by ``onnx.reference``, or, where a value
        holds symbolic sizes, by `pbsdk.onnx.symbolic.fold` (None: an op that converts such values instead)."""
        if any(symbolic.is_symbolic(v) for v in values):
            try:
                return symbolic.fold(info.op_type, info.opset, info.attrs, values, info.out_elem())
            except UnsupportedError as exc:
                raise UnsupportedError(f"{info.op_type} (opset {info.opset}) on symbolic sizes: {exc.reason}",
                                       op=info.op_type) from None
            except (TypeError, ValueError, IndexError) as exc:
                raise UnsupportedError(f"{info.op_type} (opset {info.opset}) on symbolic sizes: {exc}",
                                       op=info.op_type) from None
        try:
            return tuple(_reference_run(node, self.opsets, values))
        except Exception as exc:  # noqa: BLE001 - the evaluator's own errors: the op cannot fold
            raise UnsupportedError(f"{info.op_type} (opset {info.opset}): folding it at import "
                                   f"failed: {exc}", op=info.op_type) from None

    @staticmethod
    def _label(node: Any, info: NodeInfo) -> str:
        return f"{info.op_type} node {node.name or '(unnamed)'}"

    def _fresh(self, graph: Graph, name: str, why: UnsupportedError) -> Any:
        """A stand-in input for a fallback node's output (its type from shape inference: static, or
        dimensions that are the inputs' symbols)."""
        if not name:
            return None
        t = self.types.get(name)
        shape: tuple[Any, ...] | None = t[1] if t is not None else None
        if t is not None and shape is None and self.symbols is not None:
            shape = self._symbolic_shape(name)
        if t is None or shape is None:
            raise UnsupportedError(f"{why.reason}; and its output {name!r} has no static shape for a fallback"
                                   + (" (nor one of the inputs' symbolic dimensions)" if self.symbols else ""))
        tt = TensorType(shape, carrier(t[0], name))
        self._traced[name] = tt
        return Tensor(graph.add("input", [], tt), graph)

    def _symbolic_shape(self, name: str) -> tuple[Any, ...] | None:
        """The shape shape inference declares for ``name`` where each dynamic dimension is a ``dim_param`` of
        the inputs (their symbol); None where one is not."""
        assert self.symbols is not None
        by_param = {param: sym for sym, param in self.symbols.names.items()}
        out: list[Any] = []
        for d in self._declared.get(name) or ():
            if isinstance(d, int):
                out.append(d)
            elif d in by_param:
                out.append(Dim(((by_param[d], 1),)))
            else:
                return None
        return tuple(out) if self._declared.get(name) is not None else None

    def _jit(self, step: Step) -> tuple[JitFunction | None, tuple[TensorType, ...], list[str]]:
        """The kernel of a compiled step: its traced inputs, and which of its outputs it computes."""
        sig = []
        for name in step.inputs:
            if self.symbols is not None:  # the types traced at import: symbolic sizes where they are
                sig.append(self._traced[name])
                continue
            t = self.types.get(name)
            assert t is not None and t[1] is not None, name
            sig.append(TensorType(t[1], carrier(t[0], name)))
        computed = [n for n in step.outputs if n not in self.known]
        if not computed:
            return None, tuple(sig), computed
        nodes = [(self._nodes[i], self.infos[i]) for i in step.nodes]

        def fn(*args: Tensor) -> tuple[Tensor, ...]:
            env: dict[str, Any] = dict(self.known)
            env.update(zip(step.inputs, args))
            with symbolic.collecting(self.requirements):
                for node, info in nodes:
                    if all(not o or o in self.known for o in node.output):
                        continue
                    with symbolic.at_node(self._label(node, info)):
                        results = convert_node(info, [env.get(n) if n else None for n in node.input])
                    env.update((o, r) for o, r in zip(node.output, results) if o)
            return tuple(env[n] for n in computed)

        fn.__name__ = self.name
        return JitFunction(fn, self.request), tuple(sig), computed

    # ------------------------------------------------------------------------------------------- running

    def _feeds(self, args: Sequence[Any], feeds: Mapping[str, Any] | None) -> dict[str, np.ndarray]:
        if feeds is not None:
            missing = [n for n in self.input_names if n not in feeds]
            if missing or args:
                raise ArgumentError(f"{self.name}: give every input by name (missing: {', '.join(missing)})")
            args = [feeds[n] for n in self.input_names]
        if len(args) != len(self.inputs):
            raise ArgumentError(f"{self.name}: takes {len(self.inputs)} input(s) "
                                f"({', '.join(self.input_names)}), got {len(args)}")
        out = {}
        for a, (name, t, np_dtype) in zip(args, self.inputs):
            a = np.asarray(a)
            if (a.shape != t.shape and self.symbols is None) or a.dtype != np_dtype:
                raise ArgumentError(f"{self.name}: input {name!r} must be {np.dtype(np_dtype).name}{list(t.shape)}, "
                                    f"got {a.dtype.name}{list(a.shape)}")
            out[name] = a
        if self.symbols is not None:  # each symbol bound once, the others and the requirements checked
            env = symbolic.bind({n: t.shape for n, t, _ in self.inputs}, {n: a.shape for n, a in out.items()},
                                self.symbols, what=self.name)
            symbolic.check(self.requirements, env)
        return out

    def _onnx_dtype(self, name: str) -> Any:
        t = self.types.get(name)
        return ELEM_TYPES[t[0]][0] if t is not None and t[0] in ELEM_TYPES else None

    def run(self, feeds: Mapping[str, Any]) -> list[np.ndarray]:
        """The outputs, in the model's order, for inputs given by name (as ``onnxruntime``'s ``run``)."""
        given = self._feeds((), feeds)
        if self.per_shape is not None:
            shapes = {n: tuple(a.shape) for n, a in given.items()}
            compiled = self.per_shape.get(tuple(shapes.items()), lambda: self._static_copy(shapes),
                                          describe=lambda: ", ".join(f"{n}: {list(v)}" for n, v in shapes.items()))
            return compiled.run(given)
        if self._specialisations is not None:
            compiled = self.specialise({n: given[n] for n in self.value_inputs})
            return compiled.run({n: a for n, a in given.items() if n not in self.value_inputs})
        env: dict[str, Any] = dict(self.known)
        env.update(given)
        for step in self.plan.steps:
            if step.kind == "reference":
                node = self._nodes[step.nodes[0]]
                log.info("%s (opset %d) runs through onnx.reference", node.op_type, self.infos[step.nodes[0]].opset)
                env.update(zip(node.output, _reference_run(node, self.opsets, [env.get(n) if n else None
                                                                               for n in node.input])))
                continue
            jit, sig, computed = self._jits[id(step)]
            if jit is None:
                continue
            args = [_to_carrier(env[n], t) for n, t in zip(step.inputs, sig)]
            if self.symbols is not None:  # the one kernel of symbolic sizes, whatever the call's sizes
                kernel, _ = jit.kernel(sig)
                out = kernel(*args)
                results = out if isinstance(out, tuple) else (out,)
            else:
                results = jit(*args)
            for name, r in zip(computed, results):
                dtype = self._onnx_dtype(name)
                env[name] = _from_carrier(r, dtype) if dtype is not None else r
        return [np.asarray(env[n]) for n in self.output_names]

    def __call__(self, *args: Any) -> Any:
        outs = self.run(dict(zip(self.input_names, self._feeds(args, None).values())))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __repr__(self) -> str:
        ins = ", ".join(f"{n}: {t}" for n, t, _ in self.inputs)
        if self._specialisations is not None:
            return (f"OnnxModel({self.name}({ins}) on {self.request.target.name}, compiled per value of "
                    f"{', '.join(self.value_inputs)}: {len(self._specialisations)} of at most "
                    f"{self._specialisations.limit} kept)")
        return f"OnnxModel({self.name}({ins}) on {self.request.target.name}, {len(self.plan.compiled)} kernel(s))"

    def lower(self) -> list[str]:
        """The MLIR (linalg on tensors) of each compiled segment, constants inline."""
        from pbsdk.core.ir.emit import emit_graph
        from pbsdk.frontends.jit import trace

        if self._specialisations is not None:
            raise self._specialising("the MLIR")
        texts = []
        for step in self.plan.compiled:
            jit, sig, _ = self._jits[id(step)]
            if jit is not None:
                graph, _ = trace(jit.fn, sig)
                texts.append(emit_graph(graph, spec=self.request.spec, options=self.request.options,
                                        forms=self.request.target.attention_forms))
        return texts

    def explain(self) -> str:
        """What the model compiled to: its inputs' symbolic dimensions (each ``dim_param`` one symbol, the
        kernels compiled once for every size), what each call checks of them, and per kernel its signature
        and each contraction's plan (size buckets where a row count is known only at run time)."""
        if self._specialisations is not None:
            raise self._specialising("the explanation")
        lines = [f"ONNX model {self.name} on {self.request.target.name} (spec {self.request.spec.name})"]
        if self.symbols is not None:
            lines.append(f"symbolic dimensions: {self.symbols.describe()}: compiled once, any sizes at call time")
        else:
            lines.append("static shapes: kernels specialised for them")
        lines += [f"  input {n}: [{', '.join(str(d) for d in t.shape)}] {np.dtype(dt).name}" for n, t, dt in self.inputs]
        if self.requirements:
            lines.append("checked at each call: " + "; ".join(map(str, self.requirements)))
        if self.per_shape is not None:
            lines.append(f"its kernels do not compile with symbolic sizes: compiled per input shape "
                         f"({len(self.per_shape)} so far, at most {self.per_shape.limit} kept)")
            return "\n".join(lines)
        for i, step in enumerate(self.plan.compiled):
            jit, sig, computed = self._jits[id(step)]
            if jit is None:
                continue
            kernel = jit.kernel(sig)[0]
            outs = ", ".join(str(self._traced[n]) if n in self._traced else n for n in computed)
            lines.append(f"kernel {i}: ({', '.join(map(str, sig))}) -> ({outs})"
                         + (", one kernel for every size" if kernel.dynamic else ""))
            lines += ["  " + line for line in jit.explain_signature(sig).splitlines()]
        return "\n".join(lines)

    @property
    def kernels(self) -> list[Any]:
        if self._specialisations is not None:
            raise self._specialising("a kernel")
        if self.per_shape is not None:
            raise UnsupportedError(f"{self.name}: its kernels exist per input shape (it does not compile with "
                                   "symbolic sizes): see per_shape")
        return [jit.kernel(sig)[0] for jit, sig, _ in self._jits.values() if jit is not None]


_NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial",
                     "Bernoulli"}


def _to_carrier(a: np.ndarray, t: TensorType) -> np.ndarray:
    from pbsdk.core.ir.graph import DTYPE_TO_NUMPY

    return np.ascontiguousarray(a, dtype=DTYPE_TO_NUMPY[t.dtype])


def _from_carrier(a: np.ndarray, dtype: Any) -> np.ndarray:
    a = np.asarray(a)
    if np.dtype(dtype) == np.bool_:
        return a != 0
    if is_integer(dtype):
        return np.rint(a).astype(dtype)
    return a.astype(dtype, copy=False)


def load(model: str | Path | bytes | Any, *, target: str | Target = "cpu", spec: str | ChipSpec | None = None,
         options: Mapping[str, Any] | None = None, fallback: bool = False,
         input_shapes: Mapping[str, Sequence[int]] | None = None, check: bool = True,
         specialisations: int = DEFAULT_LIMIT) -> OnnxModel:
    """Load an ONNX model (a path, its bytes or a ``ModelProto``), check and shape-infer it, convert it to
    pbsdk ops and compile it for ``target`` and ``spec`` (``options``: the target's compile options).

    An op pbsdk cannot convert is an `UnsupportedError` naming each such node, its op and opset, unless
    ``fallback``: then those nodes run through ``onnx.reference`` between compiled segments (logged).

    A model input that carries a shape, axes, pads, indices or a bound (it feeds Reshape's shape, a
    reduction's axes, ...: `value_inputs`) is specialised on: the model compiles at its first call with each
    distinct value of such inputs, at most ``specialisations`` compiles kept (least recently used evicted,
    logged); the other inputs stay run-time tensors."""
    parsed = ImportOptions.parse({"fallback": fallback, "input_shapes": dict(input_shapes or {}), "check": check,
                                  "specialisations": specialisations})
    return OnnxModel(model, resolve(target, spec, options), parsed)
