"""ONNX ``Attention`` (opsets 23-25) onto pbsdk's attention, compared with the ONNX reference evaluator: the
fused kernel where only ``Y`` is asked for, the composed one when an intermediate (``qk_matmul_output``) or a
softcap is; masks known at import and fed at run time. The node suite runs all 93 official cases
(``--runslow``)."""

from __future__ import annotations

import re

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

import pbsdk.onnx
from pbsdk.testing import Tolerance, assert_close

F32 = Tolerance(atol=1e-5, rtol=1e-4)


def _model(inputs: dict[str, tuple[int, tuple[int, ...]]], node_inputs: list[str], outputs: int,
           opset: int = 23, **attrs: object):  # type: ignore[no-untyped-def]
    names = ["Y", "present_key", "present_value", "qk_matmul_output"][:outputs]
    node = helper.make_node("Attention", node_inputs, names, **attrs)
    ins = [helper.make_tensor_value_info(n, e, list(s)) for n, (e, s) in inputs.items()]
    outs = [helper.make_empty_tensor_value_info(n) for n in names]
    graph = helper.make_graph([node], "attention", ins, outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx.shape_inference.infer_shapes(model)


def _fused(compiled: pbsdk.onnx.OnnxModel) -> int:
    return len(re.findall(r"func\.func private @__pbsdk_attn\d+\(", "\n".join(compiled.lower())))


def _check(model, feeds: dict[str, np.ndarray]) -> pbsdk.onnx.OnnxModel:  # type: ignore[no-untyped-def]
    compiled = pbsdk.onnx.load(model, target="cpu", check=False)
    want = ReferenceEvaluator(model).run(None, feeds)
    got = compiled.run(feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert_close(g, w, op="onnx Attention", tol=F32)
    return compiled


def test_causal_gqa_with_a_boolean_mask_runs_fused() -> None:
    rng = np.random.default_rng(0)
    f = TensorProto.FLOAT
    model = _model({"Q": (f, (2, 8, 5, 16)), "K": (f, (2, 2, 7, 16)), "V": (f, (2, 2, 7, 16)),
                    "attn_mask": (TensorProto.BOOL, (5, 7))}, ["Q", "K", "V", "attn_mask"], 1, is_causal=1)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in
             (("Q", (2, 8, 5, 16)), ("K", (2, 2, 7, 16)), ("V", (2, 2, 7, 16)))}
    mask = rng.random((5, 7)) > 0.3
    mask[2, :] = False  # a row that sees no key: 0, as the reference
    feeds["attn_mask"] = mask
    compiled = _check(model, feeds)
    assert _fused(compiled) == 1
    assert np.all(compiled.run(feeds)[0][:, :, 2] == 0)


def test_3d_inputs_with_a_cache_and_the_softmax_output_compose_the_primitives() -> None:
    rng = np.random.default_rng(1)
    f = TensorProto.FLOAT
    shapes = {"Q": (2, 4, 24), "K": (2, 6, 24), "V": (2, 6, 30), "attn_mask": (4, 10),
              "past_key": (2, 3, 4, 8), "past_value": (2, 3, 4, 10)}
    model = _model({n: (f, s) for n, s in shapes.items()}, list(shapes), 4, q_num_heads=3, kv_num_heads=3,
                   qk_matmul_output_mode=3, softcap=2.0)
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    compiled = _check(model, feeds)
    assert _fused(compiled) == 0


def test_the_padding_of_nonpad_kv_seqlen_is_a_run_time_input() -> None:
    rng = np.random.default_rng(2)
    f = TensorProto.FLOAT
    model = _model({"Q": (f, (2, 4, 1, 8)), "K": (f, (2, 2, 8, 8)), "V": (f, (2, 2, 8, 8)),
                    "nonpad_kv_seqlen": (TensorProto.INT64, (2,))},
                   ["Q", "K", "V", "", "", "", "nonpad_kv_seqlen"], 1, opset=24, is_causal=1)
    compiled = None
    for lengths in ([5, 8], [1, 3]):
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in
                 (("Q", (2, 4, 1, 8)), ("K", (2, 2, 8, 8)), ("V", (2, 2, 8, 8)))}
        feeds["nonpad_kv_seqlen"] = np.array(lengths, np.int64)
        compiled = compiled or _check(model, feeds)
        want = ReferenceEvaluator(model).run(None, feeds)[0]
        assert_close(compiled.run(feeds)[0], want, op="onnx Attention", tol=F32)
    assert compiled is not None and compiled.value_inputs == {}  # one compile serves every length
