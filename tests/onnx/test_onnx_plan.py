"""Pure planners of pbsdk.onnx, without ONNX protos or IR: the step plan, the node-suite selection and the
import options."""

from __future__ import annotations

import pytest

from pbsdk.core.errors import OptionsError
from pbsdk.onnx.nodesuite import case_op, family, select
from pbsdk.onnx.plan import Step, plan_steps

pytest.importorskip("onnx")

from pbsdk.onnx.model import ImportOptions


def test_one_compiled_step_without_fallback() -> None:
    nodes = [(["x", "w"], ["a"]), (["a"], ["b"]), (["b", "a"], ["y"])]
    plan = plan_steps(nodes, set(), {"w"}, ["y"])
    assert plan.steps == (Step("compiled", (0, 1, 2), ("x",), ("y",)),)


def test_fallback_node_splits_the_graph_and_values_cross_steps() -> None:
    nodes = [(["x"], ["a"]), (["a"], ["b"]), (["b", "a"], ["c"]), (["c", ""], ["y"])]
    plan = plan_steps(nodes, {1}, set(), ["y"])
    assert [s.kind for s in plan.steps] == ["compiled", "reference", "compiled"]
    first, ref, last = plan.steps
    assert first.outputs == ("a",)  # read by the reference step and the last step
    assert ref == Step("reference", (1,), ("a",), ("b",))
    assert last.inputs == ("b", "a") and last.outputs == ("y",)  # the empty name is no input
    assert len(plan.compiled) == 2 and len(plan.reference) == 1


def test_known_values_are_not_passed_between_steps() -> None:
    plan = plan_steps([(["s"], ["t"]), (["x", "t"], ["y"])], {0}, {"s", "t"}, ["y"])
    assert plan.steps[1].inputs == ("x",)
    assert plan.steps[0].outputs == ()


def test_selection_lists_exclusions_with_reasons() -> None:
    cases = [("test_relu", ["Relu"]), ("test_lstm_defaults", ["LSTM"]), ("test_add_bcast", ["Add"])]
    sel = select(cases, {"Relu", "Add"}, excluded={"^test_add_bcast$": "known wrong"})
    assert sel.run == ("test_relu",)
    assert sel.excluded == {"test_lstm_defaults": "no converter for LSTM", "test_add_bcast": "known wrong"}


def test_case_operator_and_family() -> None:
    assert case_op("test_layer_normalization_2d_axis0_expanded", ["Shape", "LayerNormalization", "Cast"]) == \
        "LayerNormalization"
    assert case_op("test_reduce_sum_keepdims", ["ReduceSum"]) == "ReduceSum"
    assert family("Conv") == "contractions" and family("NoSuchOp") == "other"


def test_import_options_are_typed() -> None:
    assert ImportOptions.parse(None) == ImportOptions()
    assert ImportOptions.parse({"input_shapes": {"x": [2, 3]}}).input_shapes == {"x": (2, 3)}
    with pytest.raises(OptionsError, match="unknown ONNX import option"):
        ImportOptions.parse({"fallbak": True})
    with pytest.raises(OptionsError, match="input_shapes"):
        ImportOptions.parse({"input_shapes": {"x": [0]}})
    with pytest.raises(OptionsError, match="fallback must be a bool"):
        ImportOptions.parse({"fallback": "yes"})
