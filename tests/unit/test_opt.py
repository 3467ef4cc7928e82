"""The pass registry and ``pbsdk opt``: name lookup, pass and compile options, errors and exit codes."""

from __future__ import annotations

from pathlib import Path

import pytest

from pbsdk import cli
from pbsdk.core.compiler import CORE_STAGES
from pbsdk.core.errors import CompileError, PbsdkError
from pbsdk.core.passes.copies_to_linalg import CopiesToLinalg
from pbsdk.core.passes.math_approx import MathApprox
from pbsdk.core.passes.registry import Notes, registry, resolve_pass, split_pipeline
from pbsdk.core.pipeline import Stage

CORE_STAGE_NAMES = ["input", "isolate-contractions", "fuse", "bufferize", "copy-strided-casts", "distinct-results",
                    "dynamic-results", "out-params", "forward-outputs"]
#: The passes in pbsdk/core/passes/ that are not core stages (at least these; new pass files join them).
OTHER_PASSES = ["copies-to-linalg", "fuse-rows", "math-approx", "promote"]
#: Modules of pbsdk/core/passes/ that hold no pass.
HELPERS = {"registry"}

NEG = """
func.func @neg(%a: tensor<4xf32>) -> tensor<4xf32> {
  %e = tensor.empty() : tensor<4xf32>
  %r = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>],
                       iterator_types = ["parallel"]} ins(%a : tensor<4xf32>) outs(%e : tensor<4xf32>) {
  ^bb0(%x: f32, %o: f32):
    %n = arith.negf %x : f32
    linalg.yield %n : f32
  } -> tensor<4xf32>
  return %r : tensor<4xf32>
}
"""


# ------------------------------------------------------------------------------------------ registry


def test_registry_names_core_stages_in_pipeline_order_then_the_passes() -> None:
    names = list(registry())
    assert names[:len(CORE_STAGE_NAMES)] == CORE_STAGE_NAMES == [s.name for s in CORE_STAGES]
    rest = names[len(CORE_STAGE_NAMES):]
    assert set(OTHER_PASSES) <= set(rest) and rest == sorted(rest)


def test_every_pass_module_holds_a_registered_pass() -> None:
    """The file naming rule: pbsdk/core/passes/<name>.py holds the pass <name> in kebab-case."""
    import pkgutil

    import pbsdk.core.passes as package

    modules = {m.name for m in pkgutil.iter_modules(package.__path__)} - HELPERS
    assert {m.replace("_", "-") for m in modules} <= set(registry())


def test_core_stages_are_the_compilers_own_objects() -> None:
    table = registry()
    for stage in CORE_STAGES:
        assert table[stage.name]({}) is stage


def test_pass_options_build_the_pass_object() -> None:
    stage = resolve_pass("math-approx{ops=exp,tanh}")
    assert stage.name == "math-approx" and stage.fn is not None
    assert stage.fn.__self__ == MathApprox(ops=("exp", "tanh"))  # type: ignore[attr-defined]
    stage = resolve_pass("copies-to-linalg{only-strided=false}")
    assert stage.fn.__self__ == CopiesToLinalg(only_strided=False)  # type: ignore[union-attr, attr-defined]
    assert resolve_pass("copies-to-linalg{only_strided}").fn.__self__ == CopiesToLinalg()  # type: ignore[union-attr, attr-defined]


@pytest.mark.parametrize("element, message", [
    ("math-approx{nope=1}", "pass 'math-approx' has no option 'nope' (options: ops)"),
    ("copies-to-linalg{only-strided=maybe}", "option 'only_strided' of pass 'copies-to-linalg' is true or false"),
    ("fuse{x=1}", "pass 'fuse' takes no options (got x)"),
    ("promote{tiles=1}", "option 'tiles' of pass 'promote' cannot be given in text"),
])
def test_bad_pass_options_are_errors(element: str, message: str) -> None:
    with pytest.raises(PbsdkError) as info:
        resolve_pass(element)
    assert message in str(info.value)


def test_upstream_passes_are_the_fallback() -> None:
    stage = resolve_pass("func.func(canonicalize,cse)")
    assert stage.passes == "func.func(canonicalize,cse)" and stage.fn is None
    assert resolve_pass("canonicalize{max-iterations=3}").passes == "canonicalize{max-iterations=3}"


def test_unknown_pass_lists_pbsdks_passes() -> None:
    with pytest.raises(PbsdkError) as info:
        resolve_pass("no-such-pass")
    text = str(info.value)
    assert text.startswith("unknown pass 'no-such-pass': not a pbsdk pass (pbsdk passes: ")
    assert ", ".join(CORE_STAGE_NAMES + ["collapse-loops", "copies-to-linalg", "dedupe-functions", "dynamic-expand", "dynamic-sizes", "expose-rows",
                                               "fill-borders", "fuse-rows"]) in text
    assert "does not refer to a registered pass" in text


def test_a_targets_stage_comes_first_for_a_bare_name() -> None:
    own = Stage("promote", fn=lambda m, c: None, description="the target's")
    extra = Stage("dma", fn=lambda m, c: None)
    assert resolve_pass("promote", target_stages=(own, extra), target="t") is own
    assert resolve_pass("dma", target_stages=(own, extra), target="t") is extra
    assert resolve_pass("promote{}", target_stages=(own,), target="t") is not own  # options: the pass class
    with pytest.raises(PbsdkError, match="target 't' adds: dma"):
        resolve_pass("nope", target_stages=(own, extra), target="t")


@pytest.mark.parametrize("text, parts", [
    ("a,b", ["a", "b"]),
    ("func.func(canonicalize,cse), fuse", ["func.func(canonicalize,cse)", "fuse"]),
    ("math-approx{ops=exp,log},cse", ["math-approx{ops=exp,log}", "cse"]),
    ("", []),
])
def test_split_pipeline_at_top_level_commas(text: str, parts: list[str]) -> None:
    assert split_pipeline(text) == parts


@pytest.mark.parametrize("text", ["func.func(cse", "a)", "a{x=1"])
def test_split_pipeline_rejects_unbalanced_brackets(text: str) -> None:
    with pytest.raises(PbsdkError):
        split_pipeline(text)


def test_a_missing_signature_note_names_the_input_stage() -> None:
    notes = Notes()
    assert notes.get("entry") is None
    with pytest.raises(CompileError, match="'input' stage"):
        notes["inputs"]
    with pytest.raises(CompileError, match="notes\\['forks'\\]"):
        notes["forks"]


# ------------------------------------------------------------------------------------------- options


def test_options_from_key_values_and_json() -> None:
    assert cli._parse_options(["pack=false", "threads=2", "matmul_precision=tf32", "entry=f"]) == {
        "pack": False, "threads": 2, "matmul_precision": "tf32", "entry": "f"}
    assert cli._parse_options(['{"fuse-rows": false, "tiles": {"spm": [64, 64, 64]}}', "threads=1"]) == {
        "fuse_rows": False, "tiles": {"spm": [64, 64, 64]}, "threads": 1}
    assert cli._parse_options(['tiles={"spm": [32, 32, 32]}']) == {"tiles": {"spm": [32, 32, 32]}}
    assert cli._parse_options(None) == {}


@pytest.mark.parametrize("item, message", [
    ("pack", "expected KEY=VALUE or a JSON object"),
    ("=1", "expected KEY=VALUE or a JSON object"),
    ("{nope", "is not valid JSON"),
])
def test_bad_options_are_errors(item: str, message: str) -> None:
    with pytest.raises(PbsdkError, match=message):
        cli._parse_options([item])


def test_split_input_file_chunks() -> None:
    assert cli._split_input("a\n// -----\nb\n  // -----  \nc\n") == ["a\n", "b\n", "c\n"]


# ----------------------------------------------------------------------------------------------- CLI


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def neg_file(tmp_path: Path) -> str:
    path = tmp_path / "neg.mlir"
    path.write_text(NEG)
    return str(path)


def test_opt_runs_the_named_passes_in_order(neg_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["opt", neg_file, "-p", "bufferize,canonicalize"], capsys)
    assert code == 0, err
    assert "func.func @neg(%arg0: memref<4xf32>) -> memref<4xf32>" in out and "tensor<" not in out


def test_opt_without_passes_prints_the_module(neg_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["opt", neg_file], capsys)
    assert code == 0 and "tensor<4xf32>" in out and "linalg.generic" in out


@pytest.mark.parametrize("argv, message", [
    (["-p", "nope"], "pbsdk: error: unknown pass 'nope': not a pbsdk pass (pbsdk passes: input, "),
    (["-p", "fuse", "--options", "nope=1"], "pbsdk: error: unknown option 'nope'"),
    (["-p", "fuse", "--options", "threads=-1"], "pbsdk: error: pbsdk option 'threads'"),
    (["-p", "fuse", "--options", "pack"], "pbsdk: error: --options 'pack': expected KEY=VALUE"),
    (["-p", "fuse", "--target", "nosuchtarget"], "pbsdk: error: unknown target 'nosuchtarget'"),
    (["-p", "fuse", "--spec", "no/such-spec"], "pbsdk: error: "),
    (["--target", "cpu", "-p", "llvm-ir"], "pbsdk: error: in stage 'llvm-ir'"),
])
def test_opt_errors_exit_2_with_one_line(neg_file: str, argv: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["opt", neg_file, *argv], capsys)
    assert code == 2
    assert err.startswith(message), err
    assert "Traceback" not in err and out == ""


def test_opt_missing_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(["opt", str(tmp_path / "missing.mlir"), "-p", "fuse"], capsys)
    assert code == 2 and err.startswith("pbsdk: error: cannot read ")


def test_opt_split_input_file_keeps_going(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "two.mlir"
    path.write_text('"nope.op"() : () -> ()\n// -----\n' + NEG)
    code, out, err = _run(["opt", str(path), "--split-input-file", "-p", "bufferize"], capsys)
    assert code == 2
    assert err.startswith("pbsdk: error: in stage 'parse': cannot parse the input MLIR")
    assert out.startswith("// -----\n") and "memref<4xf32>" in out


def test_opt_list_passes(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["opt", "--list-passes"], capsys)
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == list(registry())
    code, out, _ = _run(["opt", "--list-passes", "--target", "template"], capsys)
    assert code == 0 and "[template]" in out and "matrix-unit" in out


def test_opt_uses_the_target_stage_of_that_name(neg_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    # lower-copies exists only as the cpu target's stage (pass copies-to-linalg in the registry).
    code, _, err = _run(["opt", neg_file, "-p", "lower-copies"], capsys)
    assert code == 2 and "unknown pass 'lower-copies'" in err
    code, out, err = _run(["opt", neg_file, "--target", "cpu", "-p", "bufferize,lower-copies"], capsys)
    assert code == 0 and "memref<4xf32>" in out, err
