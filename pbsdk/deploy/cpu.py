"""The cpu target's code for a deploy artifact: an `Artifact`'s LLVM IR as one shared library.

The IR (and its parallel glue, threaded through libgomp) is optimised and compiled by llvmlite for the
spec's machine as position-independent code, then linked by the system C compiler with a small C
wrapper, ``pbsdk_entry(void **args)``, which calls the entry with its pointers spread out: the runtime
(Python or C) then calls every entry the same way, whatever its arity. Linking is checked
(``--no-undefined``): every symbol the code calls resolves in libc, libm or libgomp.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile

from pbsdk.core.errors import CompileError, PbsdkError
from pbsdk.core.spec import ChipSpec
from pbsdk.core.target import WORKSPACE, Artifact
from pbsdk.runtime.model import required_flags

#: The symbol every entry's library exports (see the module docstring).
ENTRY_SYMBOL = "pbsdk_entry"


def spec_hash(spec: ChipSpec) -> str:
    return hashlib.sha256(spec.model_dump_json().encode()).hexdigest()


def compiler_versions() -> dict[str, str]:
    import importlib.metadata
    import sys

    import pbsdk

    def version(dist: str) -> str:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return "?"

    return {"pbsdk": pbsdk.__version__, "mlir": version("xtc-mlir-python-bindings"),
            "llvmlite": version("llvmlite"), "python": f"{sys.version_info[0]}.{sys.version_info[1]}"}


@dataclasses.dataclass(frozen=True)
class Library:
    """An entry's code: the shared library's bytes and the facts the manifest records about it."""

    data: bytes
    cpu_features: tuple[str, ...]
    amx: bool
    workspace: int


def _wrapper_source(entry: str, n_args: int) -> str:
    params = ", ".join(["void *"] * n_args)
    spread = ", ".join(f"a[{i}]" for i in range(n_args))
    return (f"extern void {entry}({params});\n"
            f"__attribute__((visibility(\"default\"))) void {ENTRY_SYMBOL}(void **a) {{ {entry}({spread}); }}\n")


def find_cc() -> str:
    """The system C compiler (``CC``, else cc, gcc or clang); a `PbsdkError` when there is none."""
    for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if name and shutil.which(name):
            return name
    raise PbsdkError("exporting for the cpu target links a shared library and needs a C compiler (cc, gcc or "
                     "clang; or set CC)")


def _run(cmd: list[str], what: str) -> None:
    done = subprocess.run(cmd, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise CompileError(f"{what} failed ({' '.join(cmd[:2])} ...): {done.stderr.strip()[-2000:]}", stage="export")


def build_library(artifact: Artifact, spec: ChipSpec | None) -> Library:
    """Compile ``artifact`` (kind ``llvm-ir``: the cpu target's, or the template's emulation) into a shared
    library (see the module) for the spec's machine (``None``: this host's, as the template's emulation)."""
    from pbsdk.targets.cpu import _BF16_RUNTIME, _llvm, machine
    from pbsdk.targets.cpu.llvm_worker import compile_object
    from pbsdk.targets.cpu.parallel import fork_glue

    if artifact.kind != "llvm-ir":
        raise PbsdkError(f"the cpu export takes an llvm-ir artifact, got {artifact.kind!r}")
    llvm = _llvm()
    triple, cpu, features = machine(spec)
    tm = llvm.Target.from_triple(triple).create_target_machine(cpu=cpu, features=features, opt=3, reloc="pic",
                                                               codemodel="default")
    payload = artifact.payload if isinstance(artifact.payload, str) else artifact.payload.decode()
    texts = [payload]
    forks = artifact.metadata.get("forks", [])
    if forks:
        texts.append(fork_glue(forks, threaded=True))
    try:
        code = compile_object(llvm, texts, tm, features)
        bf16 = compile_object(llvm, [_BF16_RUNTIME.replace("define bfloat", "define hidden bfloat")], tm, features)
    except RuntimeError as exc:
        raise CompileError(f"LLVM rejected the module: {exc}", stage="export") from exc
    workspace = int(artifact.metadata.get(WORKSPACE, 0))
    n_args = len(artifact.inputs) + len(artifact.constants) + len(artifact.outputs) + (1 if workspace else 0)
    cc = find_cc()
    with tempfile.TemporaryDirectory(prefix="pbsdk-export-") as tmp:
        paths = {name: os.path.join(tmp, name) for name in ("code.o", "bf16.o", "entry.c", "entry.o", "lib.so",
                                                            "exports.map")}
        with open(paths["exports.map"], "w") as f:
            # Only the entry is exported: the kernels' own symbols stay local to the library, so one that
            # shares a name with a symbol already in the process is never interposed (nor exported).
            f.write(f"{{ global: {ENTRY_SYMBOL}; local: *; }};\n")
        for name, data in (("code.o", code), ("bf16.o", bf16)):
            with open(paths[name], "wb") as f:
                f.write(data)
        with open(paths["entry.c"], "w") as f:
            f.write(_wrapper_source(artifact.entry, n_args))
        _run([cc, "-c", "-O2", "-fPIC", "-o", paths["entry.o"], paths["entry.c"]], "compiling the entry wrapper")
        _run([cc, "-shared", "-o", paths["lib.so"], paths["entry.o"], paths["code.o"], paths["bf16.o"],
              f"-Wl,--version-script={paths['exports.map']}", "-Wl,-Bsymbolic", "-Wl,--no-undefined",
              "-Wl,-z,noexecstack", "-lgomp", "-lm"], "linking the shared library")
        with open(paths["lib.so"], "rb") as f:
            data = f.read()
    return Library(data, required_flags(features), bool(artifact.metadata.get("amx")), workspace)



def platform_of(spec: ChipSpec | None) -> tuple[str, str]:
    """(machine, system) the code runs on, as ``platform.machine()``/``platform.system()`` name them, from
    the spec's target triple; only Linux is supported (dlopen, memfd, /proc/cpuinfo)."""
    from pbsdk.targets.cpu import machine

    triple = machine(spec)[0]
    arch = triple.split("-")[0]
    if "linux" not in triple:
        raise PbsdkError(f"deploy artifacts run on Linux; the spec's target triple is {triple!r}")
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(arch, arch), "Linux"
