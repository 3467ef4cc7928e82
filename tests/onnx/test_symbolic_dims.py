"""ONNX symbolic dimensions (issue #31 item 2, `pbsdk.onnx.symbolic`): a model whose inputs have ``dim_param``
dimensions compiles once on the cpu target (which compiles run-time sizes) and runs every size.

Unit tests of the pure parts (symbols, folding shape values, requirements, binding), then numerics against
onnxruntime (CPU provider) of a hand-built model (matmul + bias, layernorm, a softmax over heads reshaped
by a ``Shape -> Gather -> Concat -> Reshape`` chain, a position table sliced to the sequence length) at
several sizes with one compile, and of a transformers BERT exported by ``torch.onnx.export`` with dynamic
batch and sequence axes (``--runslow``: its compile takes 50-65 s). Tolerance: f32, sums over at most 64 terms in another order than onnxruntime's:
``atol 1e-5, rtol 1e-4`` (observed ~2e-7 relative).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper, numpy_helper

import pbsdk.frontends.jit
import pbsdk.onnx
from pbsdk.core.dims import Dim
from pbsdk.core.errors import ArgumentError, UnsupportedError
from pbsdk.onnx import symbolic
from pbsdk.testing import Tolerance, assert_close

TOL = Tolerance(atol=1e-5, rtol=1e-4)
B, S = Dim.parse("batch"), Dim.parse("seq")


# ---------------------------------------------------------------------------------------------- pure parts

def test_one_symbol_per_dim_param_and_per_unnamed_dimension() -> None:
    syms = symbolic.symbols_of({"ids": ["batch", "seq"], "mask": ["batch", "seq", 1], "x": [None, "n-1", 8],
                                "y": ["n-1", "batch"]})
    assert syms.shapes["ids"] == (B, S) and syms.shapes["mask"] == (B, S, 1)  # one name, one symbol
    x0, x1, _ = syms.shapes["x"]
    assert isinstance(x0, Dim) and x0 not in (B, S) and syms.names[str(x0)] == "x[0]"  # unnamed: its own
    assert syms.names[str(x1)] == "n-1" and syms.shapes["y"] == (x1, B)  # not an identifier: renamed, still one
    assert len(syms.names) == 4


def test_shape_chains_fold_on_symbols() -> None:
    shape = symbolic.shape_value((B, S, 64))
    assert symbolic.is_symbolic(shape)

    def fold(op: str, *inputs: Any, **attrs: Any) -> Any:
        out = symbolic.fold(op, 17, attrs, list(inputs), 7)
        assert out is not None
        return out[0]

    heads = fold("Concat", fold("Gather", shape, np.array([0, 1])), np.array([4, 16]), axis=0)
    assert list(heads) == [B, S, 4, 16]
    seq = fold("Gather", shape, np.array(1))
    assert seq.shape == () and seq[()] == S
    assert fold("Mul", seq, np.array(2))[()] == 2 * S and fold("Div", fold("Mul", seq, np.array(4)), np.array(2))[()] == 2 * S
    # the Where(Equal(shape, -1), 1, shape) of an exported expand: a size is never -1
    assert not fold("Equal", heads, np.array(-1)).any()
    flat = fold("Mul", fold("Gather", shape, np.array(0)), seq)
    assert flat[()] == B * S  # a product of symbols: the rows of (batch, seq, 64) flattened
    with pytest.raises(UnsupportedError, match="not an exact division"):
        symbolic.fold("Div", 17, {}, [seq, np.array(2)], 7)
    with pytest.raises(UnsupportedError, match="depends on the symbols"):
        symbolic.fold("Equal", 17, {}, [seq, np.array(5)], 9)
    assert symbolic.fold("Cast", 17, {"to": 1}, [seq], 1) is None  # a size read as a float: data, converted


def test_requirements_are_decided_at_import_or_checked_per_call() -> None:
    reqs: list[symbolic.Requirement] = []
    with symbolic.collecting(reqs), symbolic.at_node("Slice node pos"):
        symbolic.require(0, S, "start")  # holds for every size
        symbolic.require(1, S, "index 0")
        symbolic.require(S, 64, "end")  # only the values decide
        with pytest.raises(UnsupportedError, match="is false"):
            symbolic.require(S + 1, S, "past the end")
    assert [str(r) for r in reqs] == ["seq <= 64 (Slice node pos (end))"]
    symbolic.check(reqs, {"seq": 64})
    with pytest.raises(ArgumentError, match=r"Slice node pos \(end\) needs seq <= 64.*seq=65"):
        symbolic.check(reqs, {"seq": 65})


def test_binding_reads_each_symbol_once_and_names_a_mismatch() -> None:
    syms = symbolic.symbols_of({"ids": ["batch", "seq"], "mask": ["batch", "seq"]})
    assert symbolic.bind(syms.shapes, {"ids": (2, 7), "mask": (2, 7)}, syms) == {"batch": 2, "seq": 7}
    with pytest.raises(ArgumentError, match="'batch', which is 2 in input 'ids' dimension 0"):
        symbolic.bind(syms.shapes, {"ids": (2, 7), "mask": (3, 7)}, syms)


# ------------------------------------------------------------------------------------- a hand-built model

D, HEADS, POSITIONS = 32, 4, 40


def _model(seed: int = 0) -> bytes:
    """x (batch, seq, 32), bias (batch, seq): y = softmax over each head's 8 features of
    layernorm(x @ W + b + pos[:seq]), heads split and joined by reshapes whose shapes come from Shape(x),
    plus bias as a column."""
    rng = np.random.default_rng(seed)
    inits = [numpy_helper.from_array(a, n) for n, a in (
        ("W", rng.standard_normal((D, D)).astype(np.float32) / 4), ("b", rng.standard_normal(D).astype(np.float32)),
        ("pos", rng.standard_normal((POSITIONS, D)).astype(np.float32)),
        ("gamma", rng.uniform(0.5, 1.5, D).astype(np.float32)), ("beta", rng.standard_normal(D).astype(np.float32)),
        ("i0", np.array([0], np.int64)), ("i01", np.array([0, 1], np.int64)), ("i1", np.array(1, np.int64)),
        ("heads", np.array([HEADS, D // HEADS], np.int64)), ("width", np.array([D], np.int64)),
        ("axis0", np.array([0], np.int64)), ("axis_last", np.array([-1], np.int64)))]
    n = helper.make_node
    nodes = [
        n("MatMul", ["x", "W"], ["xw"]), n("Add", ["xw", "b"], ["xb"]),
        n("Shape", ["x"], ["shape"]), n("Gather", ["shape", "i1"], ["seq"]),
        n("Unsqueeze", ["seq", "axis0"], ["seq1"]), n("Slice", ["pos", "i0", "seq1", "i0"], ["pos_s"]),
        n("Add", ["xb", "pos_s"], ["xp"]),
        n("LayerNormalization", ["xp", "gamma", "beta"], ["ln"], axis=-1, epsilon=1e-5),
        n("Gather", ["shape", "i01"], ["bs"]), n("Concat", ["bs", "heads"], ["split_shape"], axis=0),
        n("Reshape", ["ln", "split_shape"], ["split"]), n("Softmax", ["split"], ["sm"], axis=-1),
        n("Concat", ["bs", "width"], ["join_shape"], axis=0), n("Reshape", ["sm", "join_shape"], ["joined"]),
        n("Unsqueeze", ["bias", "axis_last"], ["bias1"]), n("Add", ["joined", "bias1"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes, "symbolic", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", D]),
                            helper.make_tensor_value_info("bias", TensorProto.FLOAT, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", D])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many kernels are compiled (one entry per `compile_text` call of the jit)."""
    calls: list[int] = []
    real = pbsdk.frontends.jit.compile_text

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(pbsdk.frontends.jit, "compile_text", counting)
    return calls


def _feeds(rng: np.random.Generator, b: int, s: int) -> dict[str, np.ndarray]:
    return {"x": rng.standard_normal((b, s, D)).astype(np.float32), "bias": rng.standard_normal((b, s)).astype(np.float32)}


def test_symbolic_model_compiles_once_and_matches_onnxruntime_at_every_size(compiles: list[int]) -> None:
    data = _model()
    model = pbsdk.onnx.load(data)
    assert len(compiles) == 1 and model.symbols is not None
    assert [t.shape for _, t, _ in model.inputs] == [(B, S, D), (B, S)]
    (kernel,) = model.kernels
    assert kernel.dynamic
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(1)
    for b, s in ((1, 1), (2, 5), (3, 17), (1, 40), (4, 33)):  # 1, sizes off the vector width, the table's end
        feeds = _feeds(rng, b, s)
        want = session.run(None, feeds)[0]
        got = model.run(feeds)[0]
        assert got.shape == (b, s, D)
        assert_close(got, want, op=f"symbolic model at batch {b}, seq {s}", tol=TOL)
    assert len(compiles) == 1  # no size compiled again


def test_a_dim_param_shared_by_two_inputs_binds_once(compiles: list[int]) -> None:
    model = pbsdk.onnx.load(_model())
    feeds = _feeds(np.random.default_rng(2), 2, 5)
    with pytest.raises(ArgumentError, match="'batch', which is 2 in input 'x'"):
        model.run({"x": feeds["x"], "bias": feeds["bias"][:1]})
    with pytest.raises(ArgumentError, match="'seq', which is 5 in input 'x'"):
        model.run({"x": feeds["x"], "bias": feeds["bias"][:, :4]})
    with pytest.raises(ArgumentError, match="expected \\[batch, seq, 32\\]"):
        model.run({"x": feeds["x"][..., :8], "bias": feeds["bias"]})
    assert len(compiles) == 1


def test_a_size_past_a_static_table_is_refused_at_the_call() -> None:
    model = pbsdk.onnx.load(_model())
    assert [str(r.large) for r in model.requirements] == [str(POSITIONS)]
    with pytest.raises(ArgumentError, match=f"Slice node .*needs seq <= {POSITIONS}.*seq=41"):
        model.run(_feeds(np.random.default_rng(3), 1, POSITIONS + 1))


def test_input_shapes_still_specialise_and_unnamed_dims_get_their_own_symbol(compiles: list[int]) -> None:
    data = _model()
    static = pbsdk.onnx.load(data, input_shapes={"x": (2, 5, D), "bias": (2, 5)})
    assert static.symbols is None and not static.kernels[0].dynamic
    feeds = _feeds(np.random.default_rng(4), 2, 5)
    want = ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    assert_close(static.run(feeds)[0], want, op="static specialisation", tol=TOL)
    # an unnamed dimension: a symbol of its own, bound from that input
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [None, 8])
    w = numpy_helper.from_array(np.eye(8, dtype=np.float32) * 2, "w")
    g = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "unnamed", [x],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [None, 8])], [w])
    model = pbsdk.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))
    assert model.symbols is not None and list(model.symbols.names.values()) == ["x[0]"]
    for rows in (1, 3, 70):
        a = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8)
        np.testing.assert_array_equal(model(a), 2 * a)


def test_targets_without_dynamic_shapes_still_ask_for_input_shapes() -> None:
    with pytest.raises(UnsupportedError, match=r"input 'x' has dynamic dimensions \(batch, seq\).*input_shapes="):
        pbsdk.onnx.load(_model(), target="template")


def test_what_symbols_cannot_express_is_refused_naming_the_node() -> None:
    """A reshape to half the sequence length: seq / 2 is exact only for even lengths."""
    n = helper.make_node
    inits = [numpy_helper.from_array(np.array(v, np.int64), name) for name, v in
             (("i1", 1), ("two", 2), ("a0", [0]), ("tail", [2 * 8]))]
    nodes = [n("Shape", ["x"], ["shape"]), n("Gather", ["shape", "i1"], ["seq"]), n("Div", ["seq", "two"], ["half"]),
             n("Unsqueeze", ["half", "a0"], ["half1"]), n("Concat", ["half1", "tail"], ["target"], axis=0),
             n("Reshape", ["x", "target"], ["y"], name="pairs")]
    g = helper.make_graph(nodes, "halves", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "seq", 8])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, None, 16])], inits)
    with pytest.raises(UnsupportedError, match="Div .*seq / 2 is not an exact division"):
        pbsdk.onnx.load(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]))


def test_explain_shows_the_symbols_the_checks_and_the_kernels() -> None:
    text = pbsdk.onnx.load(_model()).explain()
    assert "symbolic dimensions: batch, seq: compiled once" in text
    assert "input x: [batch, seq, 32] float32" in text
    assert f"checked at each call: seq <= {POSITIONS}" in text
    assert "one kernel for every size" in text
    assert "matmul batchxseqx32xf32 (rows batch * seq): 1x ?x32x32, known at call time: rows m = batch*seq" in text


# --------------------------------------------------------------------------------------- a real export

def _bert(layers: int, hidden: int, seq: int) -> tuple[bytes, Any]:
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from pbsdk.onnx.export import TEXT_AXES, export_module
    from pbsdk.testing.real_models import _transformers

    transformers = _transformers()  # after torchvision, as the real models import it

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=128, hidden_size=hidden, num_hidden_layers=layers,
                                     num_attention_heads=4, intermediate_size=2 * hidden, max_position_embeddings=64,
                                     attn_implementation="sdpa")
    bert = transformers.BertModel(config, add_pooling_layer=False).eval()

    class Hidden(torch.nn.Module):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.inner = bert

        def forward(self, ids: Any, mask: Any) -> Any:
            return self.inner(input_ids=ids, attention_mask=mask)[0]

    inputs = {"input_ids": np.ones((1, seq), np.int64), "attention_mask": np.ones((1, seq), np.int64)}
    axes = {n: dict(TEXT_AXES) for n in (*inputs, "out")}
    return export_module(Hidden(), inputs, dynamic_axes=axes), config


def _check_bert(data: bytes, shapes: list[tuple[int, int]], compiles: list[int]) -> None:
    model = pbsdk.onnx.load(data)
    assert not model.report.fallback and len(model.plan.steps) == 1 and len(compiles) == 1
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for b, s in shapes:
        mask = np.ones((b, s), np.int64)
        mask[-1, (s + 1) // 2:] = 0  # the last sequence padded
        feeds = {"input_ids": rng.integers(0, 128, (b, s)).astype(np.int64), "attention_mask": mask}
        want = session.run(None, feeds)[0]
        scale = float(np.abs(want).max())
        assert_close(model.run(feeds)[0], want, op=f"BERT at batch {b}, seq {s}",
                     tol=Tolerance(atol=1e-4 * scale, rtol=0.0))
    assert len(compiles) == 1


@pytest.mark.slow
def test_exported_bert_with_dynamic_axes_runs_every_size_from_one_compile(compiles: list[int]) -> None:
    """One layer, hidden 32: three sequence lengths at two batch sizes. Slow: 48 s with an empty compile
    cache at load 4-5 on 2 cores (most of it LLVM on the size-bucket kernels of 8 products), 10 s with a
    warm one; the hand-built model above covers the default run."""
    data, _ = _bert(1, 32, 8)
    _check_bert(data, [(1, 8), (1, 3), (2, 13), (2, 8), (1, 1), (2, 29)], compiles)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["bert_small", "gpt2_small"])
def test_exported_small_models_with_dynamic_axes(name: str, compiles: list[int]) -> None:
    """`pbsdk.testing.real_models`' 2-layer BERT and GPT-2 exported with dynamic batch and sequence axes."""
    from pbsdk.onnx.export import export

    data = export(name, dynamic=True)
    model = pbsdk.onnx.load(data)
    assert not model.report.fallback and len(compiles) == 1
    session = ort.InferenceSession(data, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(6)
    for b, s in ((1, 16), (1, 5), (2, 33), (2, 1), (3, 12)):
        feeds = {n: np.ones((b, s), np.int64) for n in model.input_names}
        feeds["input_ids"] = rng.integers(0, 256, (b, s)).astype(np.int64)
        want = session.run(None, feeds)[0]
        assert_close(model.run(feeds)[0], want, op=f"{name} at batch {b}, seq {s}",
                     tol=Tolerance(atol=1e-4 * float(np.abs(want).max()), rtol=0.0))
    assert len(compiles) == 1
