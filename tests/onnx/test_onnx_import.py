"""pbsdk.onnx.load on small hand-built models, compared with onnxruntime: folding of shape computations,
integer and boolean tensors at the boundary, typed errors for unsupported ops and dynamic shapes, the
onnx.reference fallback (logged), and the Backend's target selection."""

from __future__ import annotations

import logging

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper

import pbsdk.onnx
from pbsdk.core.errors import ArgumentError, OptionsError, PbsdkError, UnsupportedError
from pbsdk.testing import Tolerance, assert_close

F32 = Tolerance(atol=1e-5, rtol=1e-5)


def _model(nodes, inputs, outputs, inits=(), opset=17):  # type: ignore[no-untyped-def]
    graph = helper.make_graph(nodes, "g", inputs, outputs, [numpy_helper.from_array(v, k) for k, v in inits])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def _conv_flatten(op: str = "Relu", batch: str | int = 2):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(0)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, 256])
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]), helper.make_node(op, ["c"], ["r"]),
             helper.make_node("Shape", ["r"], ["s"]), helper.make_node("Gather", ["s", "i0"], ["n"]),
             helper.make_node("Unsqueeze", ["n", "ax"], ["n1"]),
             helper.make_node("Concat", ["n1", "m1"], ["shape"], axis=0), helper.make_node("Reshape", ["r", "shape"], ["y"])]
    inits = [("w", rng.standard_normal((4, 3, 3, 3)).astype(np.float32)), ("i0", np.array(0, np.int64)),
             ("ax", np.array([0], np.int64)), ("m1", np.array([-1], np.int64))]
    return _model(nodes, [x], [y], inits)


def _reference(model, feeds):  # type: ignore[no-untyped-def]
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


@pytest.mark.parametrize("target", ["cpu", "template"])
def test_shape_computation_folds_and_matches_onnxruntime(target: str) -> None:
    model = _conv_flatten()
    compiled = pbsdk.onnx.load(model, target=target)
    assert compiled.report.folded == {"Gather": 1, "Unsqueeze": 1, "Concat": 1}
    assert compiled.report.converted["Conv"] == 1 and not compiled.report.fallback
    x = np.random.default_rng(1).standard_normal((2, 3, 8, 8)).astype(np.float32)
    assert_close(compiled(x), _reference(model, {"x": x})[0], op="onnx conv", tol=F32)


def test_integer_and_boolean_tensors_cross_the_boundary() -> None:
    ids = helper.make_tensor_value_info("ids", TensorProto.INT64, [2, 5])
    emb = np.random.default_rng(0).standard_normal((10, 4)).astype(np.float32)
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"]), helper.make_node("ArgMax", ["e"], ["am"], axis=2),
             helper.make_node("Greater", ["ids", "five"], ["big"]), helper.make_node("Add", ["ids", "one"], ["next"])]
    outs = [helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 5, 4]),
            helper.make_tensor_value_info("am", TensorProto.INT64, [2, 5, 1]),
            helper.make_tensor_value_info("big", TensorProto.BOOL, [2, 5]),
            helper.make_tensor_value_info("next", TensorProto.INT64, [2, 5])]
    model = _model(nodes, [ids], outs, [("emb", emb), ("five", np.array(5, np.int64)), ("one", np.array(1, np.int64))])
    feeds = {"ids": np.array([[0, 3, 9, -1, 5], [6, 2, 2, 8, 1]], np.int64)}
    got, want = pbsdk.onnx.load(model).run(feeds), _reference(model, feeds)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


def test_unsupported_op_is_a_typed_error_naming_op_and_opset() -> None:
    with pytest.raises(UnsupportedError, match=r"Shrink \(opset 17\).*fallback=True"):
        pbsdk.onnx.load(_conv_flatten("Shrink"))


def test_fallback_runs_the_op_through_onnx_reference_and_logs_it(caplog: pytest.LogCaptureFixture) -> None:
    model = _conv_flatten("Shrink")
    compiled = pbsdk.onnx.load(model, fallback=True)
    assert compiled.report.fallback == {"Shrink": 1}
    assert [s.kind for s in compiled.plan.steps] == ["compiled", "reference", "compiled"]
    x = np.random.default_rng(2).standard_normal((2, 3, 8, 8)).astype(np.float32)
    with caplog.at_level(logging.INFO, logger="pbsdk.onnx"):
        got = compiled(x)
    assert "Shrink (opset 17) runs through onnx.reference" in caplog.text
    assert_close(got, _reference(model, {"x": x})[0], op="onnx fallback", tol=F32)


def test_dynamic_dimension_needs_input_shapes_without_dynamic_shapes() -> None:
    """template compiles static shapes: it asks for them. cpu takes the batch N as a symbol
    (tests/onnx/test_symbolic_dims.py); a convolution over a symbolic batch does not compile so, and the
    model compiles per input shape instead (logged), or specialises on given shapes."""
    model = _conv_flatten(batch="N")
    with pytest.raises(UnsupportedError, match="dynamic dimensions .N.*input_shapes"):
        pbsdk.onnx.load(model, target="template")
    per_shape = pbsdk.onnx.load(model)
    assert per_shape.per_shape is not None and "compiled per input shape" in per_shape.explain()
    rng = np.random.default_rng(3)
    for n in (1, 3, 1):
        x = rng.standard_normal((n, 3, 8, 8)).astype(np.float32)
        assert_close(per_shape(x), _reference(model, {"x": x})[0], op=f"onnx conv, batch {n}", tol=F32)
    assert len(per_shape.per_shape) == 2 and per_shape.per_shape.hits == 1
    compiled = pbsdk.onnx.load(model, input_shapes={"x": (3, 3, 8, 8)})
    assert compiled.symbols is None
    x = rng.standard_normal((3, 3, 8, 8)).astype(np.float32)
    assert_close(compiled(x), _reference(model, {"x": x})[0], op="onnx conv", tol=F32)
    with pytest.raises(OptionsError, match="names no input"):
        pbsdk.onnx.load(model, input_shapes={"nope": (1,)})


def test_wrong_inputs_are_argument_errors() -> None:
    compiled = pbsdk.onnx.load(_conv_flatten())
    with pytest.raises(ArgumentError, match=r"input 'x' must be float32\[2, 3, 8, 8\]"):
        compiled(np.zeros((2, 3, 8, 8), np.float64))
    with pytest.raises(ArgumentError, match="takes 1 input"):
        compiled()


def test_backend_target_from_option_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    from pbsdk.onnx import Backend

    model = _conv_flatten()
    assert Backend.prepare(model).model.request.target.name == "cpu"
    monkeypatch.setenv("PBSDK_ONNX_TARGET", "template")
    assert Backend.prepare(model).model.request.target.name == "template"
    assert Backend.prepare(model, target="cpu").model.request.target.name == "cpu"
    node = helper.make_node("Relu", ["a"], ["b"])
    a = np.array([-1.0, 2.0], np.float32)
    (out,) = Backend.run_node(node, [a])
    np.testing.assert_array_equal(out, [0.0, 2.0])


def test_large_initializer_stays_binary() -> None:
    # a 512x512 f32 weight (1 MiB; ~6 MB as MLIR text) reaches the kernel as a binary constant operand
    # bound by the loader, as a frozen torch weight does; the payload holds code, not the weight
    rng = np.random.default_rng(0)
    w = rng.standard_normal((512, 512)).astype(np.float32)
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 512])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 512])
    proto = _model([helper.make_node("MatMul", ["x", "w"], ["y"])], [x], [y], [("w", w)])
    model = pbsdk.onnx.load(proto.SerializeToString())
    (kernel,) = model.kernels
    (constant,) = kernel.artifact.constants
    if model.request.target.name == "cpu":  # the cpu target packs a weight for its kernel at compile time
        from pbsdk.targets.cpu.matmul_kernel import pack_b_panels

        np.testing.assert_array_equal(constant, pack_b_panels(w, constant.shape[-1]))
    else:
        np.testing.assert_array_equal(np.asarray(constant).reshape(w.shape), w)
    assert len(kernel.artifact.payload) < w.nbytes
    xv = rng.standard_normal((4, 512)).astype(np.float32)
    assert_close(model(xv), xv @ w, op="onnx MatMul", tol=Tolerance(atol=1e-4, rtol=1e-4))


def _matmul_64(w: np.ndarray, *, listed_as_input: bool = False):  # type: ignore[no-untyped-def]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])
    inputs = [x, helper.make_tensor_value_info("w", TensorProto.FLOAT, [64, 64])] if listed_as_input else [x]
    return _model([helper.make_node("MatMul", ["x", "w"], ["y"])], inputs, [y], [("w", w)])


@pytest.mark.parametrize("listed_as_input", [False, True])
def test_large_initializers_are_lifted_without_changing_the_callers_model(listed_as_input: bool) -> None:
    # a 64x64 weight (4096 values > LIFT_ABOVE) is checked and shape-inferred as an input, not as data;
    # also when the model lists it among the graph inputs (as IR version < 4 requires)
    w = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    proto = _matmul_64(w, listed_as_input=listed_as_input)
    before = proto.SerializeToString()
    model = pbsdk.onnx.load(proto)
    assert proto.SerializeToString() == before
    assert model.input_names == ["x"]
    x = np.random.default_rng(1).standard_normal((2, 64)).astype(np.float32)
    assert_close(model(x), x @ w, op="onnx MatMul", tol=F32.scaled(10))


def test_malformed_large_initializer_is_a_typed_error() -> None:
    proto = _matmul_64(np.zeros((64, 64), np.float32))
    proto.graph.initializer[0].raw_data = np.zeros(10, np.float32).tobytes()  # 10 values for 64x64
    with pytest.raises(PbsdkError, match="initializer 'w'"):
        pbsdk.onnx.load(proto)


def test_gather_elements_folds_with_data_longer_than_its_indices() -> None:
    """onnx.reference's own GatherElements (onnx 1.23) fails on data longer than the indices along the axis
    (BERT's token-type buffer as transformers 5 exports it); folding and fallback use numpy's instead."""
    from onnx import helper

    from pbsdk.onnx.model import _reference_run, gather_elements

    node = helper.make_node("GatherElements", ["d", "i"], ["o"], axis=1)
    data, idx = np.arange(512, dtype=np.int64)[None], np.arange(16, dtype=np.int64)[None]
    (got,) = _reference_run(node, {"": 17}, [data, idx])
    np.testing.assert_array_equal(got, idx)
    data = np.arange(12).reshape(3, 4)
    np.testing.assert_array_equal(gather_elements(data, np.array([[0, -1], [2, 1]]), 1), [[0, 3], [6, 5]])
    np.testing.assert_array_equal(gather_elements(data, np.array([[2, 0, 1, 1]]), 0), [[8, 1, 6, 7]])


def test_gqa_attention_exports_with_its_heads_repeated() -> None:
    """scaled_dot_product_attention with enable_gqa (transformers 5's Llama) is the same attention with the
    key and value heads repeated, which the TorchScript exporter converts."""
    torch = pytest.importorskip("torch")
    from pbsdk.onnx.export import _gqa_expanded

    q, k, v = (torch.randn(1, h, 5, 8) for h in (4, 2, 2))
    want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    with _gqa_expanded(torch):
        got = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    torch.testing.assert_close(got, want)
    assert torch.nn.functional.scaled_dot_product_attention.__name__ == "scaled_dot_product_attention"


def test_empty_tensors_are_known_values() -> None:
    """A tensor with a zero-sized dimension holds nothing: an empty model input is known at import (a
    reduction over it folds), and a node whose every output is empty gives empty arrays without a kernel
    (a Split with an empty piece, whose Concat drops it; a Slice starting past the end)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 6])
    e = helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 0, 4])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y", "s", "z")]
    nodes = [helper.make_node("Split", ["x", "sizes"], ["a", "b"], axis=1),
             helper.make_node("Concat", ["b", "a"], ["c"], axis=1), helper.make_node("Relu", ["c"], ["y"]),
             helper.make_node("ReduceSum", ["e", "ax"], ["s"], keepdims=1),
             helper.make_node("Slice", ["x", "st", "en"], ["z"])]
    inits = [("sizes", np.array([6, 0], np.int64)), ("ax", np.array([1], np.int64)),
             ("st", np.array([7], np.int64)), ("en", np.array([9], np.int64))]
    model = _model(nodes, [x, e], outs, inits, opset=18)
    compiled = pbsdk.onnx.load(model, target="cpu", check=False)
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 6)).astype(np.float32),
             "e": np.zeros((2, 0, 4), np.float32)}
    got, want = compiled.run(feeds), _reference(model, feeds)
    assert [g.shape for g in got] == [(2, 6), (2, 1, 4), (0, 6)] == [w.shape for w in want]
    for g, w in zip(got, want):
        assert_close(g, w, op="onnx empty", tol=F32)
    assert compiled.report.folded == {"ReduceSum": 1}


def test_bfloat16_and_4_and_2_bit_integers_cross_the_boundary() -> None:
    """bfloat16 is carried as bf16, the 4- and 2-bit integers (``ml_dtypes``) as f64 like the other integers;
    compared with onnx.reference (float to integer truncates toward zero)."""
    import ml_dtypes
    from onnx.reference import ReferenceEvaluator

    ins = [helper.make_tensor_value_info("q", TensorProto.INT4, [2, 3]),
           helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])]
    outs = [helper.make_tensor_value_info("y", TensorProto.BFLOAT16, [2, 3]),
            helper.make_tensor_value_info("u", TensorProto.UINT2, [2, 3])]
    nodes = [helper.make_node("Cast", ["q"], ["qf"], to=TensorProto.FLOAT), helper.make_node("Add", ["qf", "x"], ["s"]),
             helper.make_node("Cast", ["s"], ["y"], to=TensorProto.BFLOAT16),
             helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Cast", ["a"], ["u"], to=TensorProto.UINT2)]
    model = _model(nodes, ins, outs, opset=25)
    feeds = {"q": np.array([[-8, -1, 0], [1, 5, 7]], ml_dtypes.int4),
             "x": np.array([[0.3, -1.7, 2.5], [3.9, 1.0e-3, -0.4]], np.float32)}
    got = pbsdk.onnx.load(model, target="cpu").run(feeds)
    want = ReferenceEvaluator(model).run(None, feeds)
    assert [g.dtype for g in got] == [np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.uint2)]
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g.astype(np.float32), w.astype(np.float32))


@pytest.mark.parametrize("mode", ["edge", "reflect", "wrap"])
def test_pad_modes_gather_known_indices(mode: str) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 6])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    model = _model([helper.make_node("Pad", ["x", "pads"], ["y"], mode=mode)], [x], [y],
                   [("pads", np.array([0, 2, -1, 0, 3, 4], np.int64))], opset=19)
    feeds = {"x": np.random.default_rng(5).standard_normal((2, 5, 6)).astype(np.float32)}
    got = pbsdk.onnx.load(model, target="cpu", check=False)(feeds["x"])
    want = _reference(model, feeds)[0]
    assert got.shape == want.shape == (2, 10, 9)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("include", [0, 1])
def test_dilated_average_pool_divides_by_the_window_counts(include: int) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 9, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[3, 2], strides=[2, 2], dilations=[2, 3],
                            pads=[1, 0, 1, 1], ceil_mode=1, count_include_pad=include)
    model = _model([node], [x], [y], opset=19)
    feeds = {"x": np.random.default_rng(6).standard_normal((1, 3, 9, 8)).astype(np.float32)}
    got = pbsdk.onnx.load(model, target="cpu", check=False)(feeds["x"])
    want = _reference(model, feeds)[0]
    assert got.shape == want.shape
    assert_close(got, want, op="onnx dilated avg pool", tol=F32)
