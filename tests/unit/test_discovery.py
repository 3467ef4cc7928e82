"""Target discovery through real ``importlib.metadata``.

Every test installs plugins the way pip would leave them for discovery: a ``*.dist-info`` directory
(METADATA + entry_points.txt) on ``sys.path``, next to the plugin's importable sources. Nothing is
injected into `discover` — what is tested is what a user's environment does.
"""

from __future__ import annotations

import importlib
import importlib.util
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from pbsdk.core import target as target_mod
from pbsdk.core.errors import TargetError
from pbsdk.core.target import API_VERSION, ENTRY_POINT_GROUP, Target, TargetInfo, discover, get_target

PLUGINS = Path(__file__).resolve().parents[1] / "plugins"
SAMPLE_SRC = PLUGINS / "sample_target"
BROKEN_SRC = PLUGINS / "broken_target"
MISSPELT_SRC = PLUGINS / "misspelt_hook_target"

# The cpu target (and so the sample plugin, which subclasses it) needs the MLIR bindings to import.
_HAVE_CPU = importlib.util.find_spec("pbsdk.targets.cpu") is not None
_HAVE_MLIR = importlib.util.find_spec("mlir") is not None
needs_cpu = pytest.mark.skipif(
    not (_HAVE_CPU and _HAVE_MLIR),
    reason="pbsdk.targets.cpu has not landed yet" if not _HAVE_CPU else "the MLIR Python bindings are missing",
)

# Helper objects for the malformed-plugin cases, written next to the dist-infos.
ODDITIES = '''
from pbsdk.core.target import Target

class NotATarget:
    """Has the attributes, but is not a Target subclass."""
    name = "notatarget"

not_a_class = 42

class OldApiTarget(Target):
    name = "oldapi"
    api_version = 0
    default_spec = "host"
    def stages(self, spec, options):
        return ()
    def load(self, artifact, spec):
        raise NotImplementedError

class FutureApiTarget(OldApiTarget):
    name = "futureapi"
    api_version = 99
'''
ODDITIES_MODULE = "pbsdk_test_oddities"
PLUGIN_MODULES = ("pbsdk_sample_target", "pbsdk_broken_target", "pbsdk_misspelt_hook_target",
                  "pbsdk_misspelt_hook_target.hooks", ODDITIES_MODULE)

Install = Callable[[str, Mapping[str, str]], Path]


@pytest.fixture(autouse=True)
def _clear_target_cache() -> Iterator[None]:
    target_mod._cache.clear()
    yield
    target_mod._cache.clear()


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Install]:
    """A fake site directory: ``install(dist, {name: "module:attr"})`` writes a dist-info there."""
    site_dir = tmp_path / "site"
    site_dir.mkdir()
    (site_dir / f"{ODDITIES_MODULE}.py").write_text(ODDITIES)
    # The plugins' sources go on sys.path as their packages only: an in-place build of a plugin leaves
    # a *.egg-info next to its sources, which importlib.metadata would discover as an installation.
    for src in (SAMPLE_SRC, BROKEN_SRC, MISSPELT_SRC):
        copy = tmp_path / "src" / src.name
        for package in src.glob("pbsdk_*"):
            if package.is_dir() and not package.name.endswith(("-info", ".egg-info")):
                shutil.copytree(package, copy / package.name, ignore=shutil.ignore_patterns("__pycache__"))
        monkeypatch.syspath_prepend(str(copy))
    monkeypatch.syspath_prepend(str(site_dir))
    for module in PLUGIN_MODULES:  # import from this test's paths, not an earlier test's
        if module in sys.modules:
            monkeypatch.delitem(sys.modules, module)

    def install(dist: str, entry_points: Mapping[str, str]) -> Path:
        info = site_dir / f"{dist.replace('-', '_')}-0.1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
        lines = [f"[{ENTRY_POINT_GROUP}]"] + [f"{name} = {value}" for name, value in entry_points.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        importlib.invalidate_caches()  # importlib.metadata caches directory listings by mtime
        return info

    yield install
    for module in PLUGIN_MODULES:
        sys.modules.pop(module, None)


@pytest.fixture
def sample(site: Install) -> Install:
    site("pbsdk-sample-target", {"sample": "pbsdk_sample_target:SampleTarget"})
    return site


@pytest.fixture
def broken(site: Install) -> Install:
    site("pbsdk-broken-target", {"broken": "pbsdk_broken_target:BrokenTarget"})
    return site


@pytest.fixture
def misspelt(site: Install) -> Install:
    site("pbsdk-misspelt-hook-target", {"misspelt": "pbsdk_misspelt_hook_target:MisspeltTarget"})
    return site


def _by_name(infos: list[TargetInfo]) -> dict[str, TargetInfo]:
    names = [i.name for i in infos]
    assert len(names) == len(set(names)), f"discover() listed a name twice: {names}"
    return {i.name: i for i in infos}


# --- built-in targets ---------------------------------------------------------------------------------

BUILTINS = {
    "cpu": "pbsdk.targets.cpu:CpuTarget",
    "nvgpu": "pbsdk.targets.nvgpu:NvgpuTarget",
    "template": "pbsdk.targets.template:TemplateTarget",
}


@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_targets_are_discovered_through_entry_points(name: str) -> None:
    infos = _by_name(discover())
    assert name in infos, f"built-in target '{name}' not registered (is pbsdk installed, e.g. pip install -e .?)"
    info = infos[name]
    assert info.value == BUILTINS[name]
    assert info.distribution == "pbsdk"
    if name == "cpu" and not _HAVE_CPU:
        pytest.skip("pbsdk.targets.cpu has not landed yet: registered, class not importable")
    if name == "cpu" and not _HAVE_MLIR:
        pytest.skip("the MLIR Python bindings are missing: the cpu target cannot import")
    assert info.error is None, info.error
    assert info.cls is not None and issubclass(info.cls, Target)
    assert info.cls.name == name
    assert info.cls.api_version == API_VERSION
    assert isinstance(info.cls.default_spec, str) and info.cls.default_spec
    assert info.cls.description


def test_placeholder_targets_are_listed_as_not_implemented() -> None:
    infos = _by_name(discover())
    nvgpu, template = infos["nvgpu"].cls, infos["template"].cls
    assert nvgpu is not None and template is not None
    assert nvgpu.implemented is True  # the NVIDIA GPU target landed (PTX, cubin, artifact; runs where a GPU is)
    assert template.implemented is True  # the bring-up kit landed: an emulated accelerator
    assert nvgpu.default_spec == "nvidia/h100"
    assert template.default_spec == "example/npu"


class _PlaceholderTarget(Target):
    """A registered-but-not-landed target (every built-in one has landed)."""

    name = "placeholder"
    default_spec = "nvidia/h100"
    implemented = False

    def stages(self, spec, options):  # type: ignore[no-untyped-def]
        raise AssertionError("never called for an unimplemented target")

    def load(self, artifact, spec):  # type: ignore[no-untyped-def]
        raise AssertionError("never called for an unimplemented target")


@needs_cpu
def test_compiling_for_a_placeholder_target_raises_target_error() -> None:
    import pbsdk

    with pytest.raises(TargetError, match="target 'placeholder' is registered but"):
        pbsdk.compile_mlir(ADD, target=_PlaceholderTarget(), options={"cache": False})


def test_get_target_caches_one_instance() -> None:
    assert get_target("nvgpu") is get_target("nvgpu")
    target = get_target("template")
    assert get_target(target) is target  # an instance passes through


# --- third-party plugins ------------------------------------------------------------------------------

ADD = """
func.func @add(%a: tensor<3x5xf32>, %b: tensor<3x5xf32>) -> tensor<3x5xf32> {
  %e = tensor.empty() : tensor<3x5xf32>
  %r = linalg.add ins(%a, %b : tensor<3x5xf32>, tensor<3x5xf32>) outs(%e : tensor<3x5xf32>) -> tensor<3x5xf32>
  return %r : tensor<3x5xf32>
}
"""


@needs_cpu
def test_sample_plugin_is_discovered(sample: Install) -> None:
    infos = _by_name(discover())
    info = infos["sample"]
    assert info.error is None, info.error
    assert info.distribution == "pbsdk-sample-target"
    assert info.value == "pbsdk_sample_target:SampleTarget"
    assert info.cls is not None and info.cls.__name__ == "SampleTarget"
    for name in BUILTINS:  # a plugin adds to the built-ins, it does not replace them
        assert name in infos

    from pbsdk.targets.cpu import CpuTarget

    target = get_target("sample")
    assert isinstance(target, info.cls) and isinstance(target, CpuTarget)
    assert target.name == "sample" and target.default_spec == CpuTarget.default_spec
    assert get_target("sample") is target


@needs_cpu
def test_sample_plugin_compiles_and_runs_through_the_host_pipeline(sample: Install) -> None:
    import numpy as np

    import pbsdk

    kernel = pbsdk.compile_mlir(ADD, target="sample", options={"cache": False})
    a = np.arange(15, dtype=np.float32).reshape(3, 5)
    b = np.full((3, 5), 0.5, dtype=np.float32)
    np.testing.assert_array_equal(kernel(a, b), a + b)


def test_sample_plugin_is_unknown_until_installed(site: Install) -> None:
    assert "sample" not in _by_name(discover())
    with pytest.raises(TargetError, match="unknown target 'sample'"):
        get_target("sample")


def test_broken_plugin_is_reported_and_the_others_still_load(broken: Install) -> None:
    infos = _by_name(discover())  # must not raise
    info = infos["broken"]
    assert info.cls is None
    assert info.distribution == "pbsdk-broken-target"
    assert info.value == "pbsdk_broken_target:BrokenTarget"
    assert info.error is not None
    assert "import failed: ImportError" in info.error and "not-a-real-sdk" in info.error
    for name in ("nvgpu", "template"):
        assert infos[name].cls is not None
    assert get_target("nvgpu").name == "nvgpu"
    with pytest.raises(TargetError, match="target 'broken' cannot be used: import failed: ImportError"):
        get_target("broken")


@needs_cpu
def test_broken_plugin_does_not_hide_a_working_plugin(sample: Install, broken: Install) -> None:
    infos = _by_name(discover())
    assert infos["broken"].cls is None
    assert infos["sample"].cls is not None
    assert get_target("sample").name == "sample"


def test_clash_is_reported_and_get_target_names_both(site: Install) -> None:
    site("pbsdk-dup-one", {"dup": "pbsdk_test_oddities:OldApiTarget"})
    site("pbsdk-dup-two", {"dup": "pbsdk_test_oddities:FutureApiTarget"})
    infos = _by_name(discover())
    info = infos["dup"]
    assert info.cls is None and info.error is not None
    assert "name clash" in info.error
    for part in ("pbsdk_test_oddities:OldApiTarget", "pbsdk_test_oddities:FutureApiTarget",
                 "pbsdk-dup-one", "pbsdk-dup-two"):
        assert part in info.error
    with pytest.raises(TargetError) as err:
        get_target("dup")
    message = str(err.value)
    assert "name clash" in message
    assert "pbsdk_test_oddities:OldApiTarget (pbsdk-dup-one)" in message
    assert "pbsdk_test_oddities:FutureApiTarget (pbsdk-dup-two)" in message


def test_clash_with_a_builtin_name_is_refused(site: Install) -> None:
    site("pbsdk-impostor", {"nvgpu": "pbsdk_test_oddities:OldApiTarget"})
    with pytest.raises(TargetError, match="name clash") as err:
        get_target("nvgpu")
    assert "pbsdk.targets.nvgpu:NvgpuTarget (pbsdk)" in str(err.value)
    assert "pbsdk_test_oddities:OldApiTarget (pbsdk-impostor)" in str(err.value)


def test_the_same_entry_point_seen_twice_is_not_a_clash(site: Install) -> None:
    # e.g. one distribution reachable through two sys.path entries
    site("pbsdk-twice-a", {"twice": "pbsdk_test_oddities:NotATarget"})
    site("pbsdk-twice-b", {"twice": "pbsdk_test_oddities:NotATarget"})
    info = _by_name(discover())["twice"]
    assert info.error is not None and "clash" not in info.error


@needs_cpu
def test_entry_point_name_differing_from_the_class_name_is_reported(site: Install) -> None:
    site("pbsdk-misnamed", {"misnamed": "pbsdk_sample_target:SampleTarget"})
    info = _by_name(discover())["misnamed"]
    assert info.cls is None and info.error is not None
    assert "'misnamed'" in info.error and "SampleTarget" in info.error and "'sample'" in info.error
    with pytest.raises(TargetError, match="target 'misnamed' cannot be used"):
        get_target("misnamed")


@pytest.mark.parametrize("attr", ["NotATarget", "not_a_class"])
def test_non_target_object_is_reported(site: Install, attr: str) -> None:
    site("pbsdk-odd", {"odd": f"pbsdk_test_oddities:{attr}"})
    info = _by_name(discover())["odd"]
    assert info.cls is None
    assert info.error == f"pbsdk_test_oddities:{attr} is not a pbsdk Target subclass"
    with pytest.raises(TargetError, match="is not a pbsdk Target subclass"):
        get_target("odd")


def test_missing_attribute_is_reported_as_an_import_failure(site: Install) -> None:
    site("pbsdk-typo", {"typo": "pbsdk_test_oddities:NoSuchClass"})
    info = _by_name(discover())["typo"]
    assert info.cls is None and info.error is not None
    assert info.error.startswith("import failed: AttributeError")


@needs_cpu
def test_a_plugin_with_a_misspelt_hook_is_refused_naming_it(misspelt: Install,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Its hooks.py defines ``matrix_unit_opp``: the template would have run its emulation instead, so the
    plugin is unusable, with the name, the closest hook and the known ones (`pbsdk.core.hooks.check_hooks`)."""
    infos = _by_name(discover())
    info = infos["misspelt"]
    assert info.cls is None and info.error is not None
    assert info.error.startswith("pbsdk_misspelt_hook_target/hooks.py defines 'matrix_unit_opp', which is not a "
                                 "hook (did you mean 'matrix_unit_op'? hooks: matrix_unit_op, vector_tile_op, ")
    assert "tile_bytes" not in info.error  # a helper listed in __pbsdk_helpers__
    assert infos["template"].cls is not None  # the others still load
    with pytest.raises(TargetError, match="target 'misspelt' cannot be used: pbsdk_misspelt_hook_target/hooks.py "
                                          "defines 'matrix_unit_opp'"):
        get_target("misspelt")
    from pbsdk.cli import main

    assert main(["targets"]) == 0
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("misspelt"))
    assert "BROKEN" in line and "'matrix_unit_opp', which is not a hook (did you mean 'matrix_unit_op'?" in line


@pytest.mark.parametrize("name, version", [("oldapi", 0), ("futureapi", 99)])
def test_wrong_api_version_is_reported(site: Install, name: str, version: int) -> None:
    cls = "OldApiTarget" if name == "oldapi" else "FutureApiTarget"
    site(f"pbsdk-{name}", {name: f"pbsdk_test_oddities:{cls}"})
    info = _by_name(discover())[name]
    assert info.cls is None
    assert info.error == f"written for target API {version}, this pbsdk provides API {API_VERSION}"
    with pytest.raises(TargetError, match=f"target '{name}' cannot be used: written for target API {version}"):
        get_target(name)


def test_nvgpu_accepts_only_gpu_specs() -> None:
    from pbsdk.core.spec import load_spec

    target = get_target("nvgpu")
    target.check_spec(load_spec("nvidia/h100"))
    with pytest.raises(TargetError, match="kind 'gpu'"):
        target.check_spec(load_spec("example/npu"))


def test_cli_targets_shows_ready_planned_and_broken(broken: Install, capsys: pytest.CaptureFixture[str]) -> None:
    from pbsdk.cli import main

    assert main(["targets"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines() if line.strip()}
    assert "ready" in lines["nvgpu"] and "spec=nvidia/h100" in lines["nvgpu"]
    assert "ready" in lines["template"] and "spec=example/npu" in lines["template"]
    assert "BROKEN" in lines["broken"] and "not-a-real-sdk" in lines["broken"]
    assert "[pbsdk_broken_target:BrokenTarget]" in lines["broken"]
    if _HAVE_CPU and _HAVE_MLIR:
        assert "ready" in lines["cpu"]
    assert main(["targets", "--strict"]) == 1  # a broken plugin fails --strict


def test_unknown_target_lists_the_known_ones(broken: Install) -> None:
    with pytest.raises(TargetError) as err:
        get_target("no-such-chip")
    message = str(err.value)
    assert "unknown target 'no-such-chip'" in message
    known = message.split("installed targets:", 1)[1]
    for name in ("broken", "cpu", "nvgpu", "template"):  # every registered name, broken ones included
        assert name in known


# --- packaging ----------------------------------------------------------------------------------------


def _can_build_without_isolation() -> str | None:
    """None if this environment can build the sample wheel with --no-build-isolation, else why not."""
    if importlib.util.find_spec("setuptools") is None:
        return "setuptools is not installed"
    import setuptools

    major, minor = (int(p) for p in setuptools.__version__.split(".")[:2])
    if (major, minor) < (70, 1) and importlib.util.find_spec("wheel") is None:  # bdist_wheel moved in 70.1
        return f"setuptools {setuptools.__version__} needs the 'wheel' package to build wheels"
    return None


def test_sample_plugin_builds_a_wheel_with_its_entry_point(tmp_path: Path) -> None:
    """The sample plugin is a real package: pip builds it into a wheel that declares the entry point.

    With --no-build-isolation where this environment can build wheels itself (offline); otherwise pip's
    isolated build, skipped if the build backend cannot be fetched. The build runs on a copy so that no
    build/ or *.egg-info is left next to the plugin's sources."""
    src = tmp_path / "src"
    shutil.copytree(SAMPLE_SRC, src, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    out = tmp_path / "wheels"
    why_not = _can_build_without_isolation()
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--disable-pip-version-check", str(src), "-w", str(out)]
    if why_not is None:
        cmd[4:4] = ["--no-build-isolation", "--no-index"]
    started = time.monotonic()
    proc = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0 and why_not is not None:
        pytest.skip(f"{why_not}, and pip's isolated build failed (offline?): {proc.stderr.strip()[-300:]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    wheels = list(out.glob("pbsdk_sample_target-*.whl"))
    assert len(wheels) == 1, list(out.iterdir())
    with zipfile.ZipFile(wheels[0]) as whl:
        names = whl.namelist()
        assert "pbsdk_sample_target/__init__.py" in names
        entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
        text = whl.read(entry_points).decode()
    assert f"[{ENTRY_POINT_GROUP}]" in text
    assert "sample = pbsdk_sample_target:SampleTarget" in text
    assert time.monotonic() - started < 120, "building the sample wheel got slow"
    assert not list(SAMPLE_SRC.glob("*.egg-info")), "a build left metadata next to the plugin's sources"


def test_plugin_sources_declare_the_entry_points_used_above() -> None:
    """The dist-infos written by the fixtures mirror the plugins' pyproject.toml files."""
    sample = (SAMPLE_SRC / "pyproject.toml").read_text()
    broken = (BROKEN_SRC / "pyproject.toml").read_text()
    group = f'[project.entry-points."{ENTRY_POINT_GROUP}"]'
    assert group in sample and 'sample = "pbsdk_sample_target:SampleTarget"' in sample
    assert 'name = "pbsdk-sample-target"' in sample
    assert group in broken and 'broken = "pbsdk_broken_target:BrokenTarget"' in broken
    misspelt = (MISSPELT_SRC / "pyproject.toml").read_text()
    assert group in misspelt and 'misspelt = "pbsdk_misspelt_hook_target:MisspeltTarget"' in misspelt

