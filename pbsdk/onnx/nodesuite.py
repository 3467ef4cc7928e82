"""Which official ONNX node tests (``onnx.backend.test``) pbsdk runs, and how their outcomes are reported.

Pure selection: a case is run when every op of its model has a converter (`pbsdk.onnx.convert.CONVERTERS`)
and it is not excluded by name below; otherwise it is listed as excluded with the reason. Each case
belongs to the operator family of its first node's op, for the per-family counts of the report.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Collection, Iterable, Mapping

#: Operator families, for the report and docs/onnx.md.
FAMILIES: dict[str, tuple[str, ...]] = {
    "elementwise math": ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "Neg", "Abs", "Exp", "Log", "Sqrt",
                         "Reciprocal", "Erf", "Sin", "Cos", "Tan", "Floor", "Ceil", "Round", "Sign", "Max", "Min",
                         "Sum", "Mean", "Clip", "IsNaN", "IsInf", "BitwiseAnd", "BitwiseOr", "BitwiseXor",
                         "BitwiseNot"),
    "activations": ("Relu", "Sigmoid", "Tanh", "LeakyRelu", "Elu", "Selu", "Celu", "HardSigmoid", "HardSwish",
                    "Softplus", "Softsign", "Gelu", "Mish", "ThresholdedRelu", "PRelu", "Softmax", "LogSoftmax",
                    "Hardmax"),
    "logic and comparison": ("Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Not", "And", "Or",
                             "Xor", "Where"),
    "contractions": ("MatMul", "Gemm", "Conv", "ConvTranspose"),
    "pooling": ("MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"),
    "attention": ("Attention",),
    "normalisation": ("BatchNormalization", "LayerNormalization", "InstanceNormalization", "GroupNormalization"),
    "reductions": ("ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceSumSquare",
                   "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ArgMax", "ArgMin", "CumSum"),
    "layout and indexing": ("Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice",
                            "Gather", "GatherElements", "Expand", "Tile", "Pad", "Trilu", "DepthToSpace",
                            "SpaceToDepth"),
    "shapes and constants": ("Shape", "Size", "Constant", "ConstantOfShape", "Range", "EyeLike", "Identity",
                             "Dropout", "Cast", "CastLike"),
}

FAMILY_OF = {op: family for family, ops in FAMILIES.items() for op in ops}

#: Cases of converted ops excluded by name (regular expression on the case name), with the reason.
EXCLUDED: dict[str, str] = {
    r"^test_flexattention_score_mod_expanded": "pbsdk core: the attention stage fails on this graph "
                                               "(memref.collapse_shape does not verify); a core bug, not the importer's",
}

#: The ops of the exported torchvision and transformers models (tests/onnx/test_onnx_models.py checks that
#: the full-size models convert no other op): their node tests run in the default suite; the other covered ops' cases are the long tail (``--runslow``).
MODEL_OPS = frozenset({
    "Add", "Sub", "Mul", "Div", "Pow", "Sqrt", "Neg", "Tanh", "Erf", "Relu", "Sigmoid", "Softmax", "MatMul",
    "Gemm", "Conv", "MaxPool", "AveragePool", "GlobalAveragePool", "BatchNormalization", "LayerNormalization",
    "ReduceMean", "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather",
    "Expand", "Where", "Equal", "Cast", "Shape", "Constant", "ConstantOfShape", "Range", "Trilu", "Identity",
    "Gelu", "Clip", "Less", "Not", "HardSigmoid", "HardSwish", "IsNaN",
})


@dataclasses.dataclass(frozen=True)
class Selection:
    """The cases to run and the ones excluded (name -> reason)."""

    run: tuple[str, ...]
    excluded: Mapping[str, str]
    op_of: Mapping[str, str]


def case_op(name: str, op_types: Iterable[str]) -> str:
    """The operator a case tests: its single op, else its first one (an ``_expanded`` function body is
    credited to the op whose name starts the case name when there is one)."""
    ops = list(op_types)
    simple = re.sub(r"[^a-z]", "", name.removeprefix("test_").lower())
    for op in sorted(set(ops), key=len, reverse=True):
        if simple.startswith(op.lower()):
            return op
    return ops[0] if ops else "?"


def select(cases: Iterable[tuple[str, Collection[str]]], converted: Collection[str],
           excluded: Mapping[str, str] | None = None) -> Selection:
    """``cases``: (name, op types of its model). Those whose every op converts and that no pattern of
    ``excluded`` (default `EXCLUDED`) matches are run."""
    rules = [(re.compile(p), why) for p, why in (EXCLUDED if excluded is None else excluded).items()]
    run, out, op_of = [], {}, {}
    for name, op_types in cases:
        op_of[name] = case_op(name, op_types)
        missing = sorted(set(op_types) - set(converted))
        if missing:
            out[name] = f"no converter for {', '.join(missing)}"
            continue
        why = next((w for r, w in rules if r.search(name)), None)
        if why is not None:
            out[name] = why
            continue
        run.append(name)
    return Selection(tuple(run), out, op_of)


def family(op: str) -> str:
    return FAMILY_OF.get(op, "other")


def official_selection() -> Selection:
    """`select` over the node cases of the installed ``onnx`` (generated in memory; ~10 s)."""
    from onnx.backend.test.loader import load_node_model_tests

    from pbsdk.onnx.convert import CONVERTERS

    cases = [(c.name, [n.op_type for n in c.model.graph.node]) for c in load_node_model_tests() if c.model]
    return select(cases, set(CONVERTERS))
