"""Model inputs that carry shapes, axes or indices (`pbsdk.onnx.specialise`): the pure decision of which
inputs are specialised on, the bounded LRU of specialisations, and models compiled per value of such inputs
(compared with onnxruntime)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pbsdk.onnx.specialise import MAX_VALUES, Specialisations, value_inputs

# ------------------------------------------------------------------------------- the decision (no ONNX)


def test_a_shape_operand_input_is_specialised_and_the_data_is_not() -> None:
    d = value_inputs([("Reshape", ["x", "shape"], ["y"])], {"x": (2, 3), "shape": (2,)})
    assert d.specialised == {"shape": "Reshape's shape"} and not d.refused


def test_values_reached_through_a_computation_are_specialised_but_not_what_only_gives_a_shape() -> None:
    # center-crop style: starts = (Shape(x) - size) / 2, the crop size a model input
    nodes = [("Shape", ["x"], ["s"]), ("Sub", ["s", "size"], ["d"]), ("Div", ["d", "two"], ["starts"]),
             ("Add", ["starts", "size"], ["ends"]), ("Slice", ["x", "starts", "ends"], ["y"]),
             ("Relu", ["y"], ["z"])]
    d = value_inputs(nodes, {"x": (10, 7), "size": (2,)})
    assert set(d.specialised) == {"size"} and d.specialised["size"] in ("Slice's starts", "Slice's ends")


def test_castlike_reads_only_the_type_of_its_second_input() -> None:
    # the Attention function body pads its mask with CastLike(-inf, mask): the mask stays data
    nodes = [("Where", ["m", "zero", "ninf"], ["bias"]), ("CastLike", ["ninf", "bias"], ["fill"]),
             ("Pad", ["bias", "pads", "fill"], ["out"])]
    d = value_inputs(nodes, {"m": (2, 3, 6)})
    assert d.specialised == {} and d.refused == {}


def test_inputs_too_large_or_dynamic_are_refused_with_the_operand_named() -> None:
    nodes = [("ReduceMax", ["data", "one"], ["mx"]), ("Pad", ["x", "pads", "mx"], ["y"]),
             ("CumSum", ["x", "axis"], ["c"])]
    d = value_inputs(nodes, {"data": (MAX_VALUES + 1,), "x": (4,), "pads": (2,), "axis": None})
    assert d.specialised == {"pads": "Pad's pads"}
    assert d.refused == {"data": f"it feeds Pad's constant_value and holds {MAX_VALUES + 1} values "
                                 f"(at most {MAX_VALUES} are specialised on)",
                         "axis": "it feeds CumSum's axis and its shape is dynamic"}


def test_an_omitted_optional_operand_and_an_older_opset_without_it_specialise_nothing() -> None:
    nodes = [("Slice", ["x", "st", "en", "", "steps"], ["y"]), ("ReduceSum", ["y"], ["r"])]
    d = value_inputs(nodes, {"x": (8,), "st": (1,), "en": (1,), "steps": (1,)})
    assert d.specialised == {"st": "Slice's starts", "en": "Slice's ends", "steps": "Slice's steps"}


# --------------------------------------------------------------------------------------- the LRU


def test_specialisations_evict_the_least_recently_used_and_log_it(caplog: pytest.LogCaptureFixture) -> None:
    built: list[str] = []
    cache: Specialisations[str] = Specialisations(2, what="model m")

    def get(key: str) -> str:
        return cache.get(key, lambda: built.append(key) or key.upper(), describe=lambda: f"k={key}")

    with caplog.at_level(logging.INFO, logger="pbsdk.onnx"):
        assert [get(k) for k in "abab"] == ["A", "B", "A", "B"]
        assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
        get("a")  # a is now the most recent: c evicts b
        get("c")
    assert built == ["a", "b", "c"] and len(cache) == 2
    assert (cache.hits, cache.misses, cache.evictions) == (3, 3, 1)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "model m" in warnings[0] and "(k=b)" in warnings[0]
    get("b")  # rebuilt, evicting a
    assert built[-1] == "b" and cache.evictions == 2


def test_a_failed_build_keeps_nothing() -> None:
    cache: Specialisations[int] = Specialisations(4, what="m")

    def fail() -> int:
        raise RuntimeError("no")

    with pytest.raises(RuntimeError):
        cache.get("k", fail, describe=lambda: "k")
    assert len(cache) == 0 and cache.get("k", lambda: 3, describe=lambda: "k") == 3


def test_the_limit_must_be_positive() -> None:
    with pytest.raises(ValueError, match="positive"):
        Specialisations(0, what="m")


# ------------------------------------------------------------------------------------------- models

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper

import pbsdk
import pbsdk.onnx
from pbsdk.core.errors import ArgumentError, OptionsError, UnsupportedError
from pbsdk.testing import Tolerance, assert_close

F32 = Tolerance(atol=1e-5, rtol=1e-5)


def _reshape_sum_model():  # type: ignore[no-untyped-def]
    """y = ReduceSum(Reshape(x, shape) * 2, axes) + 1: a shape and axes fed as inputs."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["r"]), helper.make_node("Mul", ["r", "two"], ["m"]),
             helper.make_node("ReduceSum", ["m", "axes"], ["s"], keepdims=0), helper.make_node("Add", ["s", "one"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
              helper.make_tensor_value_info("shape", TensorProto.INT64, [3]),
              helper.make_tensor_value_info("axes", TensorProto.INT64, [1])]
    out = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]), helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])]
    graph = helper.make_graph(nodes, "reshape_sum", inputs, [out], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _ort(model, feeds):  # type: ignore[no-untyped-def]
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]


def test_a_model_compiles_per_value_of_its_shape_inputs_and_matches_onnxruntime() -> None:
    model = _reshape_sum_model()
    compiled = pbsdk.onnx.load(model, target="cpu")
    assert compiled.value_inputs == {"shape": "Reshape's shape", "axes": "ReduceSum's axes"}
    assert compiled.specialisations is not None and len(compiled.specialisations) == 0  # nothing compiled yet
    x = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    cases = [([2, 3, 4], [1]), ([6, 2, 2], [0]), ([2, 3, 4], [1]), ([-1, 4, 2], [-1])]
    for shape, axes in cases:
        feeds = {"x": x, "shape": np.array(shape, np.int64), "axes": np.array(axes, np.int64)}
        got = compiled.run(feeds)[0]
        assert_close(got, _ort(model, feeds), op="onnx specialised reshape/sum", tol=F32)
    assert len(compiled.specialisations) == 3 and compiled.specialisations.hits == 1
    one = compiled.specialise({"shape": np.array([2, 3, 4], np.int64), "axes": np.array([1], np.int64)})
    assert one.input_names == ["x"] and one.report.converted["Reshape"] == 1  # x stays a run-time tensor
    assert compiled.specialisations.hits == 2
    assert_close(one(x), np.sum((x.reshape(2, 3, 4) * 2), axis=1) + 1, op="onnx specialised", tol=F32)


def test_the_specialisations_are_bounded_and_eviction_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    compiled = pbsdk.onnx.load(_reshape_sum_model(), target="cpu", specialisations=1)
    x = np.ones((4, 6), np.float32)
    with caplog.at_level(logging.WARNING, logger="pbsdk.onnx"):
        for shape in ([2, 12, 1], [12, 2, 1], [2, 12, 1]):
            out = compiled(x, np.array(shape, np.int64), np.array([0], np.int64))
            assert out.shape == (shape[1], 1) and np.all(out == 2 * shape[0] + 1)
    assert len(compiled.specialisations) == 1 and compiled.specialisations.evictions == 2
    assert sum("evicting the least recently used" in r.getMessage() for r in caplog.records) == 2


def test_what_exists_only_per_value_is_a_typed_error_and_values_are_checked() -> None:
    compiled = pbsdk.onnx.load(_reshape_sum_model(), target="cpu")
    with pytest.raises(UnsupportedError, match=r"per value of the input\(s\) 'shape' \(Reshape's shape\)"):
        _ = compiled.report
    with pytest.raises(UnsupportedError, match="specialise"):
        _ = compiled.kernels
    with pytest.raises(ArgumentError, match=r"input 'shape' must be int64\[3\], got int32\[3\]"):
        compiled.specialise({"shape": np.array([2, 3, 4], np.int32), "axes": np.array([0], np.int64)})
    with pytest.raises(ArgumentError, match="needs a value for 'axes'"):
        compiled.specialise({"shape": np.array([2, 3, 4], np.int64)})
    with pytest.raises(OptionsError, match="specialisations must be a positive int"):
        pbsdk.onnx.load(_reshape_sum_model(), specialisations=0)
    # a value the op refuses is the specialisation's typed error, and nothing is kept
    with pytest.raises(UnsupportedError, match="Reshape"):
        compiled.run({"x": np.ones((4, 6), np.float32), "shape": np.array([5, 5, 1], np.int64),
                      "axes": np.array([0], np.int64)})
    assert len(compiled.specialisations) == 0


def test_an_input_read_only_for_its_shape_is_not_specialised() -> None:
    # EyeLike and CastLike read their input's type alone: no compile per value
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [3, 4])
    nodes = [helper.make_node("EyeLike", ["x"], ["e"], k=1), helper.make_node("Add", ["x", "e"], ["y"])]
    model = helper.make_model(helper.make_graph(nodes, "eye", [x], [helper.make_tensor_value_info("y", 1, [3, 4])]),
                              opset_imports=[helper.make_opsetid("", 17)])
    compiled = pbsdk.onnx.load(model, target="cpu")
    assert compiled.value_inputs == {} and compiled.report.folded == {}
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    assert_close(compiled(a), a + np.eye(3, 4, k=1, dtype=np.float32), op="onnx eyelike", tol=F32)


def test_an_input_too_large_to_specialise_on_is_named_in_the_error() -> None:
    # Reshape's shape computed from a data tensor of 100 values: no compile per value, a typed error naming it
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 6]),
              helper.make_tensor_value_info("big", TensorProto.INT64, [100])]
    nodes = [helper.make_node("Slice", ["big", "zero", "two"], ["shape"]), helper.make_node("Reshape", ["x", "shape"], ["y"])]
    inits = [helper.make_tensor("zero", TensorProto.INT64, [1], [0]), helper.make_tensor("two", TensorProto.INT64, [1], [2])]
    graph = helper.make_graph(nodes, "big_shape", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", "b"])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(UnsupportedError, match=r"model input 'big' cannot be specialised on: it feeds Reshape's shape "
                                               r"and holds 100 values \(at most 64"):
        pbsdk.onnx.load(model, target="cpu")


def test_one_specialisation_exports_and_the_model_itself_does_not(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import pbsdk.runtime

    compiled = pbsdk.onnx.load(_reshape_sum_model(), target="cpu")
    one = compiled.specialise({"shape": np.array([2, 3, 4], np.int64), "axes": np.array([1], np.int64)})
    x = np.random.default_rng(3).standard_normal((4, 6)).astype(np.float32)
    deployed = pbsdk.runtime.load(pbsdk.export(one, (), tmp_path / "one.pbsdk"))
    np.testing.assert_array_equal(deployed(x), one(x))
    with pytest.raises(UnsupportedError, match="call specialise"):
        pbsdk.export(compiled, (), tmp_path / "all.pbsdk")
