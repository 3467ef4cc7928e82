"""The ``pbsdk-runtime`` wheel (scripts/runtime_wheel.py): what it holds, that it is the same bytes each
build, that its RECORD checks out, and that no module in it imports anything but the standard library,
numpy, the wheel's own modules and its extras' (ml_dtypes for bf16): every path, the CUDA one included,
not only those a test runs."""

from __future__ import annotations

import ast
import base64
import hashlib
import re
import sys
import zipfile

import pytest


@pytest.fixture(scope="module")
def runtime_wheel():  # type: ignore[no-untyped-def]
    from test_isolated import runtime_wheel as load

    return load()


def test_wheel_holds_the_runtime_and_is_reproducible(runtime_wheel, tmp_path) -> None:  # type: ignore[no-untyped-def]
    first = runtime_wheel.build(tmp_path / "a")
    second = runtime_wheel.build(tmp_path / "b")
    assert first.name == f"pbsdk_runtime-{runtime_wheel.version()}-py3-none-any.whl"
    assert first.read_bytes() == second.read_bytes()
    with zipfile.ZipFile(first) as zf:
        names = set(zf.namelist())
        info = f"pbsdk_runtime-{runtime_wheel.version()}.dist-info"
        code = {n for n in names if not n.startswith(info)}
        assert code == {name for name, _ in runtime_wheel.sources()}
        assert {"pbsdk/runtime/__init__.py", "pbsdk/runtime/c/pbsdk_runtime.h", "pbsdk/core/errors.py"} <= code
        assert not any(n.startswith(("pbsdk/targets", "pbsdk/frontends", "pbsdk/deploy")) or n.endswith(".pyc")
                       for n in code)
        metadata = zf.read(f"{info}/METADATA").decode()
        assert [line for line in metadata.splitlines() if line.startswith("Requires-Dist")] == \
            ["Requires-Dist: numpy>=1.24", 'Requires-Dist: ml_dtypes>=0.5; extra == "bf16"']
        for line in zf.read(f"{info}/RECORD").decode().splitlines():
            name, digest, size = line.split(",")
            if name.endswith("RECORD"):
                continue
            data = zf.read(name)
            want = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            assert (digest, int(size)) == (f"sha256={want}", len(data)), name


def _imports(source: str) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
    return found


def test_wheel_imports_only_the_standard_library_numpy_and_itself(runtime_wheel) -> None:  # type: ignore[no-untyped-def]
    optional = {re.split(r"[<>=;\[ ]", r)[0] for reqs in runtime_wheel.EXTRAS.values() for r in reqs}
    modules = {name[:-3].replace("/", ".").removesuffix(".__init__") for name, _ in runtime_wheel.sources()
               if name.endswith(".py")}
    for name, path in runtime_wheel.sources():
        if not name.endswith(".py"):
            continue
        for imported in _imports(path.read_text()):
            top = imported.split(".")[0]
            ok = top in sys.stdlib_module_names or top == "numpy" or top in optional or imported in modules
            assert ok, f"{name} imports {imported}, which the pbsdk-runtime wheel does not hold"
