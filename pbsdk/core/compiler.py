"""The compile driver: MLIR text + target + spec + options -> `Artifact` (or the IR after any stage).

The core's stages are target-independent; the target's follow. Every compilation goes through here:
``pbsdk.jit`` (after tracing), ``pbsdk.compile_mlir`` and ``pbsdk compile``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from mlir import ir

from pbsdk.core.dims import Dim, Shape, is_dynamic
from pbsdk.core.errors import CompileError, DynamicShapeError, PbsdkError, UnsupportedError
from pbsdk.core.options import Options
from pbsdk.core.passes.copy_strided_casts import CopyStridedCasts
from pbsdk.core.passes.distinct_results import DistinctResults
from pbsdk.core.passes.dynamic_results import DynamicResults
from pbsdk.core.passes.forward_outputs import ForwardOutputs
from pbsdk.core.passes.isolate_contractions import IsolateContractions
from pbsdk.core.pipeline import Pipeline, Stage, StageContext, end_after
from pbsdk.core.spec import ChipSpec, load_spec
from pbsdk.core.target import DERIVED_CONSTANTS, Target, get_target

_SUPPORTED_ELEMENT_TYPES = {"f64", "f32", "f16", "bf16", "i8", "i32"}


def _read_signature(module: ir.Module, ctx: StageContext) -> None:
    """Find the entry function and record its signature; reject what the runtime cannot call."""
    wanted = ctx.options.entry
    funcs = [op for op in module.body.operations if op.operation.name == "func.func"]
    public = [f for f in funcs if "sym_visibility" not in f.attributes
              or ir.StringAttr(f.attributes["sym_visibility"]).value == "public"]
    public = [f for f in public if len(f.regions[0].blocks) > 0]  # declarations are not entries
    if wanted is not None:
        chosen = [f for f in funcs if ir.StringAttr(f.attributes["sym_name"]).value == wanted]
        if not chosen:
            raise CompileError(f"no function named '{wanted}' in the module", op="func.func")
    else:
        chosen = public
        if len(chosen) != 1:
            names = [ir.StringAttr(f.attributes["sym_name"]).value for f in public]
            raise CompileError(f"expected exactly one public function with a body, found {names or 'none'}; "
                               "pass options={'entry': NAME}", op="func.func")
    func = chosen[0]
    ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)

    def describe(types: Any, what: str) -> tuple[tuple[Shape, str], ...]:
        out: list[tuple[Shape, str]] = []
        for i, t in enumerate(types):
            if not isinstance(t, ir.RankedTensorType):
                raise UnsupportedError(f"{what} {i} has type {t}; entry functions take and return ranked tensors",
                                       op="func.func")
            rt = ir.RankedTensorType(t)
            if not rt.has_static_shape and not ctx.notes.get(DYNAMIC_SHAPES):
                raise DynamicShapeError(f"{what} {i} has dynamic shape {t}; the target compiles static shapes "
                                        "(one kernel per shape)", op="func.func")
            if any(d == 0 for d in rt.shape):
                raise UnsupportedError(f"{what} {i} has an empty dimension: {t}", op="func.func")
            dtype = str(rt.element_type)
            if dtype not in _SUPPORTED_ELEMENT_TYPES:
                raise UnsupportedError(f"{what} {i} has element type {dtype}; supported: "
                                       f"{', '.join(sorted(_SUPPORTED_ELEMENT_TYPES))}", op="func.func")
            dynamic = ir.ShapedType.get_dynamic_size()
            shape: Shape = tuple(f"a{i}d{d}" if n == dynamic else int(n) for d, n in enumerate(rt.shape))
            out.append((shape, dtype))
        return tuple(out)

    ctx.notes["entry"] = ir.StringAttr(func.attributes["sym_name"]).value
    arguments = describe(ftype.inputs, "argument")
    n_inputs = _check_constants(func, arguments, ctx.constants)
    ctx.notes["inputs"] = arguments[:n_inputs]
    outputs = describe(ftype.results, "result")
    if any(is_dynamic(shape) for shape, _ in outputs):
        outputs = _result_dims(module, func, arguments, outputs)
    ctx.notes["outputs"] = outputs
    if not ctx.notes["outputs"]:
        raise UnsupportedError("the entry function returns nothing", op="func.func")
    for dtype in {d for _, d in ctx.notes["inputs"] + ctx.notes["outputs"]}:
        if hasattr(ctx.spec, "supports") and not ctx.spec.supports(dtype):
            raise UnsupportedError(f"dtype {dtype} is not supported by chip spec '{ctx.spec.name}'")


#: `StageContext.notes` key: the target compiles dynamic (``?``) dimensions (`Target.dynamic_shapes`); without
#: it the ``input`` stage refuses them with a `DynamicShapeError`.
DYNAMIC_SHAPES = "dynamic_shapes"


def _result_dims(module: ir.Module, func: Any, arguments: Sequence[tuple[Shape, str]],
                 outputs: Sequence[tuple[Shape, str]]) -> tuple[tuple[Shape, str], ...]:
    """The results' dynamic sizes as expressions of the arguments' (`pbsdk.core.dims`), found by asking
    MLIR to reify each ``tensor.dim`` of a result in terms of the function's operands (upstream
    ``resolve-ranked-shaped-type-result-dims``) on a copy of the module. A size that is not an argument's
    size, a sum or product of such sizes (a data-dependent size) is a `DynamicShapeError`."""
    from mlir import passmanager
    from mlir.dialects import arith, tensor

    context = ir.Context()
    context.allow_unregistered_dialects = True
    copy = ir.Module.parse(str(module), context)
    name = ir.StringAttr(func.attributes["sym_name"]).value
    (fn,) = [op for op in copy.body.operations if op.operation.name == "func.func"
             and ir.StringAttr(op.attributes["sym_name"]).value == name]
    block = fn.regions[0].blocks[0]
    ret = list(block.operations)[-1]
    wanted: list[tuple[int, int]] = []
    with ir.InsertionPoint(ret), ret.location:
        dims = []
        for r, value in enumerate(ret.operands):
            for d, size in enumerate(outputs[r][0]):
                if isinstance(size, str):
                    dims.append(tensor.dim(value, arith.constant(ir.IndexType.get(), d)))
                    wanted.append((r, d))
        keep = ir.Operation.create("pbsdk.keep_dims", operands=dims)
    passmanager.PassManager.parse("builtin.module(func.func(resolve-ranked-shaped-type-result-dims, "
                                  "resolve-shaped-type-result-dims, canonicalize))", context).run(copy.operation)
    args = list(block.arguments)

    def expression(v: ir.Value) -> Dim | None:
        """``v`` as a linear form of the arguments' sizes, or None."""
        owner = v.owner
        if isinstance(owner, ir.Block):
            return None
        op = owner.operation if hasattr(owner, "operation") else owner
        if op.name == "arith.constant":
            return Dim((), int(ir.IntegerAttr(op.attributes["value"]).value))
        if op.name == "tensor.dim":
            src, index = op.operands
            d = expression(index)
            if src not in args or d is None or d.coeffs:
                return None
            size = arguments[args.index(src)][0][d.const]
            return Dim.parse(size) if isinstance(size, str) else Dim((), size)
        if op.name in ("arith.addi", "arith.subi", "arith.muli"):
            x, y = (expression(o) for o in op.operands)
            if x is None or y is None:
                return None
            form = x * y if op.name == "arith.muli" else x + y if op.name == "arith.addi" else x - y
            return form if isinstance(form, Dim) else Dim((), form)
        return None

    shapes = [list(shape) for shape, _ in outputs]
    for (r, d), v in zip(wanted, keep.operands):
        form = expression(v)
        if form is None:
            raise DynamicShapeError(f"result {r}'s dimension {d} is not an affine function of the arguments' "
                                    f"sizes (it is {v}); pbsdk compiles result sizes it can compute from the "
                                    "inputs' shapes", op="func.func")
        shapes[r][d] = str(form) if form.coeffs else form.const
    return tuple((tuple(shape), dtype) for shape, (_, dtype) in zip(shapes, outputs))


def _check_constants(func: Any, arguments: tuple[tuple[Shape, str], ...],
                     constants: tuple[Any, ...]) -> int:
    """How many of the entry's arguments are user inputs: those before its constant operands (arguments
    marked ``pbsdk.constant = i``, which must be the last ones, one per constant in order, each of its
    array's shape and dtype)."""
    from pbsdk.core.ir import attributes
    from pbsdk.core.ir.graph import NUMPY_TO_DTYPE

    marks = [attributes.arg_i64(func, i, attributes.CONSTANT) for i in range(len(arguments))]
    n_inputs = len(arguments) - len(constants)
    expected = [None] * n_inputs + list(range(len(constants)))
    if n_inputs < 0 or marks != expected:
        raise CompileError(f"the entry function's constant operands ({attributes.CONSTANT} on arguments "
                           f"{[i for i, m in enumerate(marks) if m is not None]}) do not match the "
                           f"{len(constants)} constant(s) given: they must be its last arguments, "
                           f"numbered 0, 1, ... in order", op="func.func")
    for i, array in enumerate(constants):
        shape, dtype = arguments[n_inputs + i]
        got = (tuple(array.shape), NUMPY_TO_DTYPE.get(array.dtype.name, str(array.dtype)))
        if got != (shape, dtype) or not array.flags.c_contiguous:
            raise CompileError(f"constant {i} is a {got[1]} array of shape {got[0]}; its argument is "
                               f"{shape} {dtype} (C order)", op="func.func")
    return n_inputs


#: The target-independent stages, in order. Targets append theirs.
CORE_STAGES: tuple[Stage, ...] = (
    Stage("input", fn=_read_signature, description="the input module (linalg on tensors), verified",
          marks=True),
    Stage("isolate-contractions", fn=IsolateContractions().apply,
          description="each named matmul into its own function, so fusion cannot generalise it"),
    Stage("fuse", passes="func.func(linalg-fuse-elementwise-ops), canonicalize, cse",
          description="producer-consumer fusion of elementwise ops"),
    Stage("bufferize",
          passes="eliminate-empty-tensors, one-shot-bufferize{bufferize-function-boundaries function-boundary-type-conversion="
                 "identity-layout-map}",
          description="tensors to buffers"),
    Stage("copy-strided-casts", fn=CopyStridedCasts().apply,
          description="a strided view cast to the identity layout (a dynamic size) is copied, not reinterpreted"),
    Stage("distinct-results", fn=DistinctResults().apply,
          description="a buffer returned twice gets a copy, so each output is written once"),
    Stage("dynamic-results", fn=DynamicResults().apply,
          description="a private function's dynamically sized result allocated by its callers, as an argument"),
    Stage("out-params",
          passes="drop-equivalent-buffer-results, buffer-results-to-out-params{hoist-static-allocs modify-public-functions}, "
                 "canonicalize, buffer-deallocation-pipeline, canonicalize",
          description="results become caller-allocated output buffers; deallocation"),
    Stage("forward-outputs", fn=ForwardOutputs().apply, marks=True,
          description="a result computed into a local buffer and copied out is computed in place"),
)


@dataclasses.dataclass(frozen=True)
class CompileRequest:
    """Everything that determines a compilation's output (and so its cache key)."""

    target: Target
    spec: ChipSpec
    options: Options


def resolve(target: str | Target, spec: str | ChipSpec | None,
            options: Options | Mapping[str, Any] | None) -> CompileRequest:
    """Find the target, load its spec (its default when none is given) and check they fit together;
    parse the options (`Target.parse_options`: an unknown key is an `OptionsError`)."""
    tgt = get_target(target)
    if not tgt.implemented:
        from pbsdk.core.errors import TargetError
        raise TargetError(f"target '{tgt.name}' is registered but its code generation has not landed yet")
    parsed = tgt.parse_options(options)
    chip = load_spec(spec if spec is not None else tgt.default_spec)
    tgt.check_spec(chip)
    return CompileRequest(tgt, chip, parsed)


def pipeline_for(request: CompileRequest) -> Pipeline:
    """The core's stages, then the target's; a target with ``emit_after`` (`Target.emit_after`) ends after
    that stage, with its last stage (the one producing the `Artifact`) run on the module at that point."""
    stages = CORE_STAGES + tuple(request.target.stages(request.spec, request.options))
    last = request.target.emit_after
    if last is not None:
        stages = end_after(stages, last, final=stages[-1])
    return Pipeline(stages)


def compile_text(text: str, request: CompileRequest, *, stop_after: str | None = None,
                 constants: Sequence[np.ndarray] = ()) -> Any:
    """Parse and compile MLIR text. Returns the final `Artifact`, or the IR after ``stop_after``.

    ``constants`` are the arrays of the entry's ``pbsdk.constant`` arguments (`pbsdk.core.ir.emit.Program`):
    their bytes go to the artifact, never into IR. A full compilation goes through the on-disk cache
    (`pbsdk.core.runtime.cache`; the key hashes the constants' bytes): a hit skips every stage."""
    consts = tuple(constants)
    cache = key = digests = None
    if stop_after is None:
        from pbsdk.core.runtime.cache import cache_for, cache_key, constant_digests

        cache = cache_for(request)
        if cache is not None:
            digests = constant_digests(consts)  # once: for the key, and for the stored entry
            key = cache_key(text, request, consts, digests=digests)
            hit = cache.get(key, consts)
            if hit is not None:
                return hit
    context = ir.Context()
    try:
        module = ir.Module.parse(text, context)
    except Exception as exc:
        raise CompileError(f"cannot parse the input MLIR: {str(exc).strip()}", stage="parse") from exc
    ctx = StageContext(request.spec, request.options, constants=consts)
    ctx.notes[DYNAMIC_SHAPES] = request.target.dynamic_shapes
    result = pipeline_for(request).run(module, ctx, stop_after=stop_after)
    if stop_after is None and not hasattr(result, "payload"):
        raise PbsdkError(f"target '{request.target.name}' pipeline did not produce an artifact")
    if hasattr(result, "payload") and result.constants is not consts:
        # A stage rewrote the constants (e.g. packed a weight for its kernel): a cache hit must return the
        # stored ones, not the caller's.
        result = dataclasses.replace(result, metadata={**result.metadata, DERIVED_CONSTANTS: True})
    if cache is not None and key is not None:
        cache.put(key, result, digests if result.constants is consts else None)
    return result
