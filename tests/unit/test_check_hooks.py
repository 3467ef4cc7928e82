"""The hook contract's check (`pbsdk.core.hooks.check_hooks`): what a target's ``hooks`` implements, and a
`TargetError` naming a misspelt hook, a wrong signature or a hook that is not a function. No IR is built."""

from __future__ import annotations

import inspect
import types
from pathlib import Path

import pytest

from pbsdk.core.errors import TargetError
from pbsdk.core.hooks import HOOKS, HookSpec, UnitStep, check_hooks
from pbsdk.core.target import Target
from pbsdk.targets.template import TemplateTarget
from pbsdk.targets.template import hooks as emulated


def _module(name: str, source: str) -> types.ModuleType:
    """A module ``name`` executed from ``source`` (its functions' ``__module__`` is ``name``)."""
    module = types.ModuleType(name)
    module.__file__ = f"/plugins/pbsdk_{name}/hooks.py"
    exec(compile(source, module.__file__, "exec"), module.__dict__)  # noqa: S102 - test input
    return module


MISSPELT = """
from pbsdk.targets.template.hooks import dma_copy  # imported: a hook wherever it was defined
from pbsdk.core.hooks import address                # imported helper: not checked

def matrix_unit_opp(op, a, b, c, spec):
    pass
"""


def test_a_misspelt_hook_in_a_module_names_it_the_closest_hook_and_the_known_ones() -> None:
    with pytest.raises(TargetError) as err:
        check_hooks(_module("mynpu", MISSPELT), target="mynpu")
    assert str(err.value) == (
        "target 'mynpu': pbsdk_mynpu/hooks.py defines 'matrix_unit_opp', which is not a hook (did you mean "
        "'matrix_unit_op'? hooks: " + ", ".join(HOOKS) + "; list public helpers in __pbsdk_helpers__)")


def test_a_name_close_to_no_hook_gets_no_suggestion() -> None:
    with pytest.raises(TargetError, match=r"defines 'frobnicate', which is not a hook \(hooks: matrix_unit_op, "):
        check_hooks(_module("mynpu", "def frobnicate(x):\n    return x\n"), target="mynpu")


def test_a_module_implements_the_hooks_it_defines_or_imports() -> None:
    module = _module("mynpu", MISSPELT.replace("matrix_unit_opp", "matrix_unit_op"))
    assert check_hooks(module, target="mynpu") == {"matrix_unit_op", "dma_copy"}


def test_helpers_private_names_classes_and_none_are_not_checked() -> None:
    source = """
__pbsdk_helpers__ = ("tile_bytes", "descriptor")

def tile_bytes(copy):
    return 0

def descriptor(copy):
    return None

def _private(x):
    return x

class Descriptor:
    size = 0

vector_ops = None  # not implemented: the emulation's

def scratchpad_alloc(alloc, spec):
    return None
"""
    assert check_hooks(_module("mynpu", source), target="mynpu") == {"scratchpad_alloc"}


def test_a_helper_string_instead_of_a_tuple_is_one_name() -> None:
    source = "__pbsdk_helpers__ = 'tile_bytes'\n\ndef tile_bytes(copy):\n    return 0\n"
    assert check_hooks(_module("mynpu", source), target="mynpu") == frozenset()


@pytest.mark.parametrize("hook, message", [
    (lambda op, a, b, spec: None, "cannot be called with the contract's 5 arguments"),
    (lambda op, a, b, c, spec, extra: None, "cannot be called with the contract's 5 arguments"),
    (lambda a, b, c, op, spec: None, "whose parameters are the contract's in another order"),
])
def test_a_hook_with_the_wrong_parameters_is_refused(hook: object, message: str) -> None:
    with pytest.raises(TargetError, match=message) as err:
        check_hooks(types.SimpleNamespace(matrix_unit_op=hook), target="mynpu")
    assert str(err.value).startswith("target 'mynpu': the SimpleNamespace object defines hook 'matrix_unit_op(")
    assert str(err.value).endswith(HOOKS["matrix_unit_op"].signature)


@pytest.mark.parametrize("hook", [
    lambda op, a, b, c, spec: None,
    lambda x, y, z, w, s: None,              # names are free: hooks are called positionally
    lambda op, *rest: None,
    lambda op, a, b, c, spec, extra=1: None,  # an optional extra parameter
])
def test_hooks_that_take_the_declared_arguments_pass(hook: object) -> None:
    assert check_hooks(types.SimpleNamespace(matrix_unit_op=hook), target="mynpu") == {"matrix_unit_op"}


def test_a_hook_that_is_not_a_function_is_refused() -> None:
    with pytest.raises(TargetError, match="sets hook 'dma_copy' to a str, not a function: the contract calls "
                                          r"dma_copy\(copy: DmaCopy"):
        check_hooks(types.SimpleNamespace(dma_copy="linalg.copy"), target="mynpu")


class _StaticHooks:
    @staticmethod
    def dma_copy(copy: object, src: object, dst: object, spec: object) -> None:
        pass

    @staticmethod
    def helper(x: int) -> int:
        return x


class _MethodHooks:
    def unit_step(self, step: object, acc: object, a: object, b: object, spec: object) -> object:
        return acc


class _Misspelt(_MethodHooks):
    def unit_stepp(self, step: object, acc: object, a: object, b: object, spec: object) -> object:
        return acc


def test_the_class_and_instance_forms() -> None:
    # A class of static methods; its public helper is an error until declared.
    with pytest.raises(TargetError, match="class _StaticHooks defines 'helper', which is not a hook"):
        check_hooks(_StaticHooks, target="mynpu")
    declared = type("Declared", (_StaticHooks,), {"__pbsdk_helpers__": ("helper",)})
    assert check_hooks(declared, target="mynpu") == {"dma_copy"}
    # An instance: bound methods take the declared arguments; on the class they would take self too.
    assert check_hooks(_MethodHooks(), target="mynpu") == {"unit_step"}
    with pytest.raises(TargetError, match="cannot be called with the contract's 5 arguments"):
        check_hooks(_MethodHooks, target="mynpu")
    # Inherited methods count (not object's); the misspelt one names the hook.
    with pytest.raises(TargetError, match="the _Misspelt object defines 'unit_stepp', which is not a hook "
                                          r"\(did you mean 'unit_step'\?"):
        check_hooks(_Misspelt(), target="mynpu")
    # Attributes of the instance itself (a namespace).
    assert check_hooks(types.SimpleNamespace(parallel_loop=lambda spec: "x"), target="t") == {"parallel_loop"}


def test_the_template_emulation_module_implements_its_hooks() -> None:
    assert check_hooks(emulated, target="template") == set(emulated.TEMPLATE_HOOKS)
    assert set(emulated.TEMPLATE_HOOKS) == set(HOOKS) - {"unit_step"}


def test_the_declared_parameters_are_the_emulations() -> None:
    """HOOKS and the template's default implementations say the same thing."""
    for name in emulated.TEMPLATE_HOOKS:
        params = list(inspect.signature(getattr(emulated, name)).parameters)
        assert params == [p for p, _ in HOOKS[name].parameters], name


def test_unit_step_is_declared() -> None:
    spec = HOOKS["unit_step"]
    assert spec == HookSpec("unit_step", (("step", "UnitStep"), ("acc", "ir.Value"), ("a", "ir.Value"),
                                          ("b", "ir.Value"), ("spec", "ChipSpec")), "ir.Value", spec.doc)
    assert spec.signature == ("unit_step(step: UnitStep, acc: ir.Value, a: ir.Value, b: ir.Value, spec: ChipSpec) "
                              "-> ir.Value")
    fields = [f.name for f in UnitStep.__dataclass_fields__.values()]
    assert fields == ["module", "unit", "acc_type", "a_type", "b_type"]
    assert UnitStep.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_the_core_contract_imports_no_target_or_frontend() -> None:
    for module in (check_hooks, UnitStep):  # pbsdk/core/hook_contract.py, pbsdk/core/hooks.py
        text = Path(inspect.getfile(module)).read_text()
        imports = [line for line in text.splitlines() if line.strip().startswith(("import ", "from "))]
        assert not [line for line in imports if "pbsdk.targets" in line or "pbsdk.frontends" in line]


def test_a_targets_implemented_hooks() -> None:
    class Plain(Target):  # no hooks: its own lowering
        name = "plain"
        default_spec = "host"

        def stages(self, spec, options):  # type: ignore[no-untyped-def]
            return ()

        def load(self, artifact, spec):  # type: ignore[no-untyped-def]
            raise NotImplementedError

    assert Plain.implemented_hooks() == frozenset()
    assert TemplateTarget.implemented_hooks() == frozenset()  # the emulation throughout
    ns = types.SimpleNamespace(matrix_unit_op=lambda op, a, b, c, spec: None)
    mine: type[TemplateTarget] = type("MineTarget", (TemplateTarget,), {"name": "mine", "hooks": ns})
    assert mine.implemented_hooks() == {"matrix_unit_op"}
    resolved = mine().resolved_hooks()
    assert resolved["matrix_unit_op"] is ns.matrix_unit_op
    assert resolved["dma_copy"] is emulated.dma_copy  # exactly the ones not implemented are emulated
    wrong: type[TemplateTarget] = type("WrongTarget", (TemplateTarget,), {"name": "wrong", "hooks": types.SimpleNamespace(dma_cpy=print)})
    with pytest.raises(TargetError, match="target 'wrong': the SimpleNamespace object defines 'dma_cpy'"):
        wrong().resolved_hooks()


def test_the_docs_reference_table_is_the_contract() -> None:
    """docs/writing-a-target.md lists every hook with the signature `HOOKS` declares, in its order."""
    docs = Path(__file__).resolve().parents[2] / "docs" / "writing-a-target.md"
    rows = [line.replace("\\|", "|") for line in docs.read_text().splitlines() if line.startswith("| `")]
    listed = [row.split("`")[1] for row in rows if row.split("`")[1].split("(")[0] in HOOKS]
    assert listed[:len(HOOKS)] == [h.signature for h in HOOKS.values()]


def test_the_declaration_and_the_check_need_no_mlir() -> None:
    """Discovery checks hooks; the MLIR-free loaders discover targets, so the check imports no MLIR."""
    import subprocess
    import sys

    code = ("import sys, types, pbsdk.core.hook_contract as c; "
            "print(sorted(c.check_hooks(types.SimpleNamespace(vector_ops=lambda spec: ''), target='t'))); "
            "bad = [m for m in sys.modules if m == 'mlir' or m.startswith('mlir.')]; sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert result.returncode == 0 and result.stdout.strip() == "['vector_ops']", result.stdout + result.stderr
