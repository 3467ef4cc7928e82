"""pbsdk's attributes (`pbsdk.core.ir.attributes`): one place for the names, typed access, the verifier."""

from __future__ import annotations

import pytest
from mlir import ir

from pbsdk.core.errors import CompileError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.pipeline import Pipeline, Stage, StageContext

COPY = """
func.func @f(%a: memref<4xf32>, %b: memref<4xf32>) {
  linalg.copy {ATTRS} ins(%a : memref<4xf32>) outs(%b : memref<4xf32>)
  return
}
"""


def _copy(attributes: str) -> tuple[ir.Module, ir.Operation]:
    module = ir.Module.parse(COPY.replace("{ATTRS}", attributes), ir.Context())
    return module, module.body.operations[0].regions[0].blocks[0].operations[0].operation


def test_typed_access_round_trips() -> None:
    module, op = _copy('{pbsdk.dma = "dram->spm"}')
    assert attrs.string(op, attrs.DMA) == "dram->spm" and attrs.string(op, attrs.COMPUTE) is None
    attrs.set_string(op, attrs.COMPUTE, "vector")
    attrs.set_i64(op, attrs.KERNEL, 3)
    attrs.set_unit(op, attrs.B_TRANSPOSED)
    assert (attrs.string(op, attrs.COMPUTE), attrs.i64(op, attrs.KERNEL)) == ("vector", 3)
    assert attrs.has(op, attrs.B_TRANSPOSED) and attrs.problems(op) == []
    attrs.verify(module)
    with pytest.raises(KeyError, match="unknown pbsdk attribute 'pbsdk.dmaa'"):
        attrs.string(op, "pbsdk.dmaa")
    with pytest.raises(TypeError, match="holds a string, not a i64"):
        attrs.set_i64(op, attrs.DMA, 1)


@pytest.mark.parametrize("written, message", [
    ('{pbsdk.dma = "spm"}', "pbsdk.dma: expected 'outer->inner' (two memory level names), got 'spm'"),
    ('{pbsdk.dmaa = "a->b"}', "unknown attribute pbsdk.dmaa (known: pbsdk.matrix_unit"),
    ('{pbsdk.compute = "tensor-core"}', "pbsdk.compute: expected one of vector-fma, scalar, vector, got 'tensor-core'"),
    ('{pbsdk.matrix_unit = 3 : i64}', "pbsdk.matrix_unit must be a string, got 3 : i64"),
    ('{pbsdk.attention = {}}', "pbsdk.attention may only be set on func.func"),
    ('{pbsdk.kernel = "x"}', 'pbsdk.kernel must be an integer, got "x"'),
])
def test_the_verifier_names_the_op_and_the_attribute(written: str, message: str) -> None:
    module, _ = _copy(written)
    with pytest.raises(CompileError) as err:
        attrs.verify(module)
    assert err.value.op == "linalg.copy" and message in str(err.value)


def test_the_pipeline_verifies_them_after_a_marking_stage() -> None:
    module, op = _copy("")

    def mark(m: ir.Module, ctx: StageContext) -> None:
        attrs.set_string(op, attrs.DMA, "nowhere")

    with pytest.raises(CompileError, match="in stage 'mark', op 'linalg.copy': malformed pbsdk attribute"):
        Pipeline((Stage("mark", fn=mark, marks=True),)).run(module, StageContext(None))
    module, op = _copy("")
    Pipeline((Stage("mark", fn=mark),)).run(module, StageContext(None))  # not a marking stage: not walked


def test_no_pbsdk_attribute_literal_outside_the_module() -> None:
    """The names are spelt once: code elsewhere uses the constants (docstrings and comments may name them)."""
    import re
    from pathlib import Path

    import pbsdk

    root = Path(pbsdk.__file__).parent
    names = "|".join(n.split(".")[1] for n in attrs.DEFINITIONS)
    literal = re.compile(r"""["']pbsdk\.(""" + names + r""")["']""")
    offenders = [f"{p.relative_to(root)}:{i}" for p in root.rglob("*.py") if p.name != "attributes.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if literal.search(line)]
    assert offenders == []


def test_plain_data_round_trips_through_a_dictionary_attribute() -> None:
    value = {"version": 1, "scale": 0.125, "causal_offset": None, "mask": False, "dtype": "bf16",
             "operands": {"q": {"shape": [1, 2, 64], "batch": [[2, 128, 1]]}, "mask": None}}
    with ir.Context(), ir.Location.unknown():
        attr = attrs.to_attribute(value)
        assert isinstance(attr, ir.DictAttr)
        assert attrs.from_attribute(ir.Attribute.parse(str(attr))) == value  # through its printed form too
        with pytest.raises(TypeError, match="no attribute for set"):
            attrs.to_attribute({"bad": {1, 2}})


def test_the_attention_descriptor_must_be_a_dictionary() -> None:
    with ir.Context():
        module = ir.Module.parse('func.func private @k(memref<4xf32>) attributes {pbsdk.attention = "{}"}')
        with pytest.raises(CompileError, match="pbsdk.attention must be a dictionary"):
            attrs.verify(module)
        fn = module.body.operations[0]
        with pytest.raises(TypeError, match="must be a dictionary"):
            attrs.data(fn, attrs.ATTENTION)
