"""LLVM IR -> object file for the host JIT, in this process or in a worker process.

`compile_object` is the whole optimise-and-generate step (the O3 pipeline, then the back end) of one
module. llvmlite serialises every LLVM call behind one process-wide lock, so parts of a large kernel
(`pbsdk.targets.cpu.split_llvm`) compile at the same time only in separate processes: the JIT runs this
file as a script (``python -I llvm_worker.py``), which imports nothing but llvmlite (≈0.3 s to start).

Worker protocol, repeated until stdin closes: a request is an 8-byte big-endian length and that many
bytes: one line of JSON ``{"triple", "cpu", "features"}``, then the LLVM IR texts separated by NUL bytes
(the first is the module, the others are linked into it). The reply is one status byte (0: done, 1:
failed), an 8-byte big-endian length and that many bytes: the object file, or the error's message.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Sequence
from typing import Any


def target_machine_for(llvm: Any, triple: str, cpu: str, features: str) -> Any:
    """The TargetMachine the host JIT generates code for (the same one in every process)."""
    target = llvm.Target.from_triple(triple)
    return target.create_target_machine(cpu=cpu, features=features, opt=3, reloc="default", codemodel="jitdefault")


def optimize(llvm: Any, mod: Any, tm: Any) -> None:
    """The O3 pipeline for ``tm``, in place (sets the module's triple and data layout first)."""
    mod.triple = tm.triple
    mod.data_layout = str(tm.target_data)
    pb = llvm.create_pass_builder(tm, llvm.create_pipeline_tuning_options(speed_level=3))
    pb.getModulePassManager().run(mod, pb)


#: Target features with which LLVM 22's x86 back end cannot legalise bf16 arithmetic (``fadd``/``fmul``/...
#: on ``bfloat`` values, ``llvm.maximum.bf16``): the type is legal as AVX512-FP16 registers hold it, its
#: arithmetic is not, and selection aborts the process ("LegalizeDAG: Unexpected illegal type!"). The O3
#: pipeline's InstCombine makes such arithmetic from ``fptrunc(op(fpext x, fpext y))`` to bf16, so the cpu
#: lowering keeps bf16 conversions out of LLVM IR for such a machine (`pbsdk.targets.cpu.expands_bf16`), and
#: `illegal_bf16` refuses whatever still reaches the back end.
BF16_ARITHMETIC_ILLEGAL = frozenset({"+avx512fp16"})
_BF16_OPS = ("fadd", "fsub", "fmul", "fdiv", "frem", "fneg", "fcmp")


def illegal_bf16(mod: Any, features: str) -> str | None:
    """The first bf16 arithmetic instruction of ``mod`` (an optimised llvmlite module) and its function, on a
    machine whose ``features`` cannot legalise it (`BF16_ARITHMETIC_ILLEGAL`); None when there is none or
    the machine can. Searches the module's text, printed once (walking its instructions through llvmlite
    costs a foreign call each: GPT-2 at batch 8, 685k of them, took 5 minutes)."""
    if not BF16_ARITHMETIC_ILLEGAL & {f.strip() for f in features.split(",")}:
        return None
    text = str(mod)
    if "bfloat" not in text:
        return None
    function = "?"
    for line in text.splitlines():
        if line.startswith("define "):
            found = _DEFINED.search(line)
            function = found.group(1) if found else "?"
            continue
        if "bfloat" not in line:
            continue
        op = _OPCODE.match(line)
        if op is None:
            continue
        if op.group(1) in _BF16_OPS or (op.group(1) == "call" and "bf16(" in line):
            return f"{line.strip()} (in @{function})"
    return None


#: An instruction line's opcode (after its result, if any: ``%x = fadd ...``, ``tail call ...``).
_OPCODE = re.compile(r"\s*(?:%[\w.\-]+\s*=\s*)?(?:tail\s+|musttail\s+|notail\s+)?(\w+)")
_DEFINED = re.compile(r"@\"?([^\s(\"]+)")


def compile_object(llvm: Any, texts: Sequence[str], tm: Any, features: str = "") -> bytes:
    """The object file of ``texts`` (the first, with the others linked in), optimised at O3 for ``tm``
    (whose target features are ``features``). Raises RuntimeError (llvmlite's) when a text does not parse or
    verify, or when the optimised module holds bf16 arithmetic the machine cannot legalise (`illegal_bf16`),
    before the back end would abort on it."""
    mod = llvm.parse_assembly(texts[0])
    for text in texts[1:]:
        mod.link_in(llvm.parse_assembly(text))
    mod.verify()
    optimize(llvm, mod, tm)
    bad = illegal_bf16(mod, features)
    if bad is not None:
        raise RuntimeError(f"bf16 arithmetic the target machine cannot legalise: {bad}")
    return bytes(tm.emit_object(mod))


def _read(stream: Any, n: int) -> bytes | None:
    data = stream.read(n)
    return data if len(data) == n else None


def serve(stdin: Any, stdout: Any) -> None:
    """Answer requests (see the module's docstring) until ``stdin`` ends."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    machines: dict[bytes, Any] = {}
    while True:
        head = _read(stdin, 8)
        if head is None:
            return
        request = _read(stdin, int.from_bytes(head, "big"))
        if request is None:
            return
        line, _, rest = request.partition(b"\n")
        try:
            tm = machines.get(line)
            if tm is None:
                machine = json.loads(line)
                tm = machines[line] = target_machine_for(llvm, machine["triple"], machine["cpu"], machine["features"])
            status, reply = 0, compile_object(llvm, [t.decode() for t in rest.split(b"\0")], tm,
                                              json.loads(line)["features"])
        except Exception as exc:  # noqa: BLE001 - reported to the parent, which compiles the part itself
            status, reply = 1, f"{type(exc).__name__}: {exc}".encode()
        stdout.write(bytes([status]) + len(reply).to_bytes(8, "big") + reply)
        stdout.flush()


if __name__ == "__main__":
    serve(sys.stdin.buffer, sys.stdout.buffer)
