"""How the cpu target runs the core's parallel loops: ``scf.forall`` → a fork onto the cores.

The core expresses work split across the outermost compute level as

    scf.forall (%t) in (T) { func.call @part(%buffers..., %t) }

Stage ``lower-parallel`` (`ForallToFork`) replaces each such loop by ``func.call @__pbsdk_fork_<part>``
with the same buffers, declared but not defined, and records ``{fork, part, args, threads}`` in the
artifact's metadata. At load time `fork_glue` defines the fork in LLVM IR: it packs the buffer pointers
into a stack struct and calls GNU OpenMP's ``GOMP_parallel`` with an outlined body that runs parts
``tid, tid + nthreads, ...`` — so every part runs even when the runtime grants fewer threads
(``OMP_THREAD_LIMIT``, nested regions). Where libgomp is missing the fork runs the parts in order on the
calling thread: slower, never wrong. Decided at load time, so a cached artifact is valid either way.

A forall of another shape is left for upstream ``scf-forall-to-for`` (serial).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from mlir import ir
from mlir.dialects import func

from pbsdk.core.passes import ops_named


def _part_call(forall: ir.Operation) -> tuple[ir.Operation, int] | None:
    """The single ``func.call`` in a one-dimensional constant-trip forall whose last operand is the
    induction variable and whose other operands are static buffers; with the trip count."""
    body = forall.regions[0].blocks[0]
    ops = [op for op in body.operations]
    if len(ops) != 2 or ops[0].operation.name != "func.call" or len(body.arguments) != 1:
        return None
    if "staticUpperBound" not in forall.attributes:
        return None
    ub = ir.DenseI64ArrayAttr(forall.attributes["staticUpperBound"])
    lb = ir.DenseI64ArrayAttr(forall.attributes["staticLowerBound"])
    if len(ub) != 1 or ub[0] < 1 or lb[0] != 0 or forall.operands:
        return None
    call = ops[0].operation
    args = list(call.operands)
    if not args or args[-1] != body.arguments[0]:
        return None
    for v in args[:-1]:
        if not isinstance(v.type, ir.MemRefType) or not ir.MemRefType(v.type).has_static_shape:
            return None
    return call, ub[0]


@dataclasses.dataclass(frozen=True)
class ForallToFork:
    name = "lower-parallel"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        forks: list[dict[str, Any]] = ctx.notes.setdefault("forks", [])
        declared: dict[tuple[str, int], str] = {}  # (part, trip count) -> fork
        for forall in ops_named(module, "scf.forall"):
            found = _part_call(forall)
            if found is None:
                continue
            call, threads = found
            part = ir.FlatSymbolRefAttr(call.attributes["callee"]).value
            # A fork runs a fixed number of parts, so one part forked with two trip counts needs two forks.
            taken = sum(1 for p, _ in declared if p == part)
            fork = declared.get((part, threads)) or (f"__pbsdk_fork_{part}" + (f"_{taken}" if taken else ""))
            buffers = list(call.operands)[:-1]
            if (part, threads) not in declared:
                with ir.InsertionPoint.at_block_begin(module.body), module.context, forall.location:
                    decl = func.FuncOp(fork, ir.FunctionType.get([v.type for v in buffers], []))
                    decl.attributes["sym_visibility"] = ir.StringAttr.get("private")
                declared[(part, threads)] = fork
                forks.append({"fork": fork, "part": part, "args": len(buffers), "threads": int(threads)})
            with ir.InsertionPoint(forall), forall.location:
                func.CallOp([], ir.FlatSymbolRefAttr.get(fork), buffers)
            forall.erase()


def fork_glue(forks: Sequence[Mapping[str, Any]], *, threaded: bool) -> str:
    """LLVM IR defining each fork (see the module docstring); parts take bare pointers and an i64."""
    out = []
    if threaded:
        out += ["declare void @GOMP_parallel(ptr, ptr, i32, i32)", "declare i32 @omp_get_thread_num()",
                "declare i32 @omp_get_num_threads()"]
    for f in forks:
        n, fork, part, threads = int(f["args"]), f["fork"], f["part"], int(f["threads"])
        params = ", ".join(f"ptr %a{i}" for i in range(n))
        ptrs = ", ".join(f"ptr %a{i}" for i in range(n))
        out.append(f"declare void @{part}({', '.join(['ptr'] * n)}, i64)")
        if not threaded:
            out += [f"define void @{fork}({params}) {{",
                    "entry:", "  br label %loop",
                    "loop:",
                    "  %p = phi i64 [ 0, %entry ], [ %next, %loop ]",
                    f"  call void @{part}({ptrs}, i64 %p)",
                    "  %next = add i64 %p, 1",
                    f"  %done = icmp eq i64 %next, {threads}",
                    "  br i1 %done, label %exit, label %loop",
                    "exit:", "  ret void", "}"]
            continue
        st = f"[{n} x ptr]"
        out += [f"define internal void @{fork}_body(ptr %s) {{", "entry:"]
        for i in range(n):
            out += [f"  %g{i} = getelementptr {st}, ptr %s, i64 0, i64 {i}", f"  %a{i} = load ptr, ptr %g{i}"]
        out += ["  %tid32 = call i32 @omp_get_thread_num()", "  %nt32 = call i32 @omp_get_num_threads()",
                "  %tid = sext i32 %tid32 to i64", "  %nt = sext i32 %nt32 to i64",
                f"  %none = icmp sge i64 %tid, {threads}", "  br i1 %none, label %exit, label %loop",
                "loop:",
                "  %p = phi i64 [ %tid, %entry ], [ %next, %loop ]",
                f"  call void @{part}({ptrs}, i64 %p)",
                "  %next = add i64 %p, %nt",
                f"  %done = icmp sge i64 %next, {threads}",
                "  br i1 %done, label %exit, label %loop",
                "exit:", "  ret void", "}",
                f"define void @{fork}({params}) {{", "entry:", f"  %s = alloca {st}"]
        for i in range(n):
            out += [f"  %g{i} = getelementptr {st}, ptr %s, i64 0, i64 {i}", f"  store ptr %a{i}, ptr %g{i}"]
        out += [f"  call void @GOMP_parallel(ptr @{fork}_body, ptr %s, i32 {threads}, i32 0)", "  ret void", "}"]
    return "\n".join(out) + "\n"
