"""The template target's hook contract: hooks get values and types and build IR with the bindings.

A third-party target replaces hooks without knowing SSA names or text formats (the test plugin
``tests/plugins/loop_hooks_target`` replaces the matrix-unit and DMA hooks and passes conformance with the
template's counters); a hook that builds ill-typed IR, raises or returns the wrong thing is a
`CompileError` naming it, at its stage."""

from __future__ import annotations

import ctypes
import importlib.util
import os
import shutil
import subprocess
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from mlir import ir
from mlir.dialects import arith, func, memref

import pbsdk
from pbsdk.conformance import generate_cases, run_cases
from pbsdk.core.errors import CompileError, TargetError
from pbsdk.core.spec import ChipSpec
from pbsdk.targets.template import TemplateTarget
from pbsdk.targets.template import hooks as emulated

PLUGIN = Path(__file__).resolve().parents[1] / "plugins" / "loop_hooks_target"


def _import_plugin() -> types.ModuleType:
    """The plugin's package, imported from its sources without putting them on sys.path (where a build's
    egg-info would make importlib.metadata see it as installed for the whole session)."""
    name = "pbsdk_loop_hooks_target"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, PLUGIN / name / "__init__.py")
        assert spec is not None and spec.loader is not None
        sys.modules[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[name])
    return sys.modules[name]


LoopHooksTarget = _import_plugin().LoopHooksTarget

NO_CACHE = {"cache": False}


def _matmul(target: object, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, dict[str, int]]:
    f = pbsdk.jit(lambda x, y: x @ y, target=target, options=NO_CACHE)  # type: ignore[arg-type]
    out = f(a, b)
    return out, dict(f.kernel(f.signatures[0])[0].executable.last_counters)


def _inputs(*shapes: tuple[int, ...], dtype: type = np.float16) -> list[np.ndarray]:
    rng = np.random.default_rng(1)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _target(name: str, **hooks: object) -> TemplateTarget:
    cls = type(f"{name.title()}Target", (TemplateTarget,), {"name": name, "hooks": types.SimpleNamespace(**hooks)})
    return cls()


# ------------------------------------------------------------------------------- the test plugin

PLUGIN_CASES = ("matmul/f16/unit+1/", "matmul/f16/transposed-b/", "matmul/f16/batched/", "matmul/f16/tile@spm+1/",
                "matmul/f32/batched/", "attention/f16/2x35x16", "attention/f32/blocks+1-causal/", "softmax/f32/(")


def test_the_plugin_passes_conformance_with_the_templates_counters(npu: ChipSpec) -> None:
    cases = [c for c in generate_cases(npu, ops_filter=["matmul", "attention", "softmax"])
             if c.name.startswith(PLUGIN_CASES) and not c.skip]
    assert all(any(c.name.startswith(p) for c in cases) for p in PLUGIN_CASES)
    mine = run_cases(cases, target=LoopHooksTarget(), spec=npu)  # type: ignore[arg-type]
    theirs = run_cases(cases, target="template", spec=npu)
    for r, t in zip(mine, theirs):
        assert r.status == "pass" and r.resource_check == "ok", (r.name, r.message)
        assert r.resources is not None and t.resources is not None
        assert r.resources["counters"] == t.resources["counters"], r.name  # same unit ops, same bytes per pair
        assert r.max_abs_error == t.max_abs_error, r.name  # same numbers: the k order per element is unchanged
    unit_cases = [r for r in mine if r.name.startswith("matmul/f16")]
    assert all(r.resources and r.resources["matrix_unit_ops"]["mxu"] > 0 for r in unit_cases)


def test_the_plugins_numbers_are_the_templates_bit_for_bit() -> None:
    a, b = _inputs((33, 65), (65, 40))
    mine, mine_counts = _matmul(LoopHooksTarget(), a, b)
    theirs, their_counts = _matmul("template", a, b)
    np.testing.assert_array_equal(mine, theirs)
    assert mine_counts == their_counts
    # What the contraction must produce whoever lowers it: one unit op per 32x32x32 block of the padded
    # problem (64 x 64 x 96), A and B in once, the f32 accumulator out once (it starts as zeros in sram:
    # the fill that initialises it is folded into the staged tile).
    assert mine_counts["matrix_unit:mxu"] == 2 * 2 * 3
    assert mine_counts["bytes:dram->sram"] == a.nbytes + b.nbytes
    assert mine_counts["bytes:sram->dram"] == 33 * 40 * 4


def _installed(plugin: Path, tmp_path: Path) -> dict[str, str]:
    """pip-install a copy of ``plugin`` into a fresh site directory: the environment that sees it."""
    site, src = tmp_path / "site", tmp_path / "src"
    shutil.copytree(plugin, src, ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--no-index", "--target", str(site), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
            "PBSDK_CACHE": "0"}


def test_the_plugin_is_found_through_its_entry_point(tmp_path: Path) -> None:
    env = _installed(PLUGIN, tmp_path)
    code = ("from pbsdk.core.target import get_target; t = get_target('loophooks'); "
            "print(type(t).__module__, t.hooks.matrix_unit_op.__module__, *sorted(t.implemented_hooks()))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env,
                          cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["pbsdk_loop_hooks_target", "pbsdk_loop_hooks_target", "dma_copy", "matrix_unit_op"]


def test_a_plugin_with_a_misspelt_hook_is_listed_as_broken(tmp_path: Path) -> None:
    """``tests/plugins/misspelt_hook_target`` defines ``matrix_unit_opp``: installed, it is listed as broken
    with the name and the hook meant, instead of running the emulation in its place."""
    env = _installed(PLUGIN.parent / "misspelt_hook_target", tmp_path)
    proc = subprocess.run([sys.executable, "-m", "pbsdk.cli", "targets"], capture_output=True, text=True,
                          timeout=300, env=env, cwd=tmp_path, check=False)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("misspelt")), proc.stdout)
    assert "BROKEN" in line and "pbsdk_misspelt_hook_target/hooks.py defines 'matrix_unit_opp', which is not a " \
        "hook (did you mean 'matrix_unit_op'?" in line, proc.stdout + proc.stderr


def test_a_misspelt_hook_stops_the_compilation_before_any_stage() -> None:
    """A target made in code (not discovered) is checked when its stages are built."""
    a, b = _inputs((8, 8), (8, 8))
    with pytest.raises(TargetError, match="target 'typo_test': the SimpleNamespace object defines "
                                          "'matrix_unit_opp', which is not a hook \\(did you mean 'matrix_unit_op'"):
        _matmul(_target("typo_test", matrix_unit_opp=emulated.matrix_unit_op), a, b)


# ----------------------------------------------------------- an intrinsic in a C shared library

MAC_C = r"""
#include <stdint.h>
long test_mac_calls = 0;
/* C[8x16] += A[8x4] * B[4x16], f32, row strides in elements: the tiny spec's mac8 instruction. */
void test_mac_8x16x4(intptr_t a, intptr_t b, intptr_t c, intptr_t lda, intptr_t ldb, intptr_t ldc) {
    const float *A = (const float *)a, *B = (const float *)b;
    float *C = (float *)c;
    test_mac_calls++;
    for (long m = 0; m < 8; m++)
        for (long n = 0; n < 16; n++) {
            float acc = C[m * ldc + n];
            for (long k = 0; k < 4; k++) acc = acc + A[m * lda + k] * B[k * ldb + n];
            C[m * ldc + n] = acc;
        }
}
"""


def _plain_matmul(op: emulated.UnitOp) -> bool:
    d = ir.AffineDimExpr.get
    return op.indexing_maps == (ir.AffineMap.get(3, 0, [d(0), d(2)]), ir.AffineMap.get(3, 0, [d(2), d(1)]),
                                ir.AffineMap.get(3, 0, [d(0), d(1)]))


def mac_through_c(op: emulated.UnitOp, a: ir.Value, b: ir.Value, c: ir.Value, spec: ChipSpec) -> None:
    """The scaffold's example made real: the instruction is an external function taking addresses and
    row strides; forms it does not cover (batched, transposed B, other dtypes) stay emulated."""
    f32 = ir.F32Type.get()
    if not (_plain_matmul(op) and (op.unit.m, op.unit.n, op.unit.k) == (8, 16, 4)
            and op.a_dtype == op.b_dtype == op.c_dtype == op.operand_dtype == f32):
        emulated.matrix_unit_op(op, a, b, c, spec)
        return
    args = [emulated.address(v) for v in (a, b, c)] + [emulated.strides(v)[0] for v in (a, b, c)]
    mac = op.declare("test_mac_8x16x4", [v.type for v in args])
    func.CallOp(mac, args)
    op.count()


def test_a_unit_op_calling_an_intrinsic_in_a_c_library(tmp_path: Path, tiny: ChipSpec) -> None:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    src, lib = tmp_path / "mac.c", tmp_path / "libmac.so"
    src.write_text(MAC_C)
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-ffp-contract=off", str(src), "-o", str(lib)], check=True)
    calls = ctypes.c_long.in_dll(ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL), "test_mac_calls")
    a, b = _inputs((17, 33), (33, 20), dtype=np.float32)
    target = _target("c_intrinsic_test", matrix_unit_op=mac_through_c)
    f = pbsdk.jit(lambda x, y: x @ y, target=target, spec=tiny, options=NO_CACHE)  # type: ignore[arg-type]
    out = f(a, b)
    counts = f.kernel(f.signatures[0])[0].executable.last_counters
    g = pbsdk.jit(lambda x, y: x @ y, target="template", spec=tiny, options=NO_CACHE)
    np.testing.assert_array_equal(out, g(a, b))
    assert counts == g.kernel(g.signatures[0])[0].executable.last_counters
    assert calls.value == counts["matrix_unit:mac8"] > 0


# ------------------------------------------------------------------------- what hooks may build

def test_a_hook_may_count_twice_and_in_loops() -> None:
    """Counters build fresh values: two counts in one hook both land (no fixed SSA names to clash)."""

    def twice(op: emulated.UnitOp, a: ir.Value, b: ir.Value, c: ir.Value, spec: ChipSpec) -> None:
        emulated.matrix_unit_op(op, a, b, c, spec)
        op.count(arith.constant(ir.IndexType.get(), 2))
        op.count(arith.constant(ir.IntegerType.get_signless(32), 3))

    def bytes_twice(copy: emulated.DmaCopy, src: ir.Value, dst: ir.Value, spec: ChipSpec) -> None:
        emulated.dma_copy(copy, src, dst, spec)
        copy.count_bytes(copy.byte_count())

    a, b = _inputs((64, 64), (64, 64))
    _, counts = _matmul(_target("twice_test", matrix_unit_op=twice, dma_copy=bytes_twice), a, b)
    _, plain = _matmul("template", a, b)
    assert counts["matrix_unit:mxu"] == 6 * plain["matrix_unit:mxu"]
    assert {k: v for k, v in counts.items() if k.startswith("bytes:")} == \
        {k: 2 * v for k, v in plain.items() if k.startswith("bytes:")}


def test_a_unit_op_through_a_declared_function() -> None:
    """``op.declare`` gives a module-level function to call (an intrinsic wrapper); here it gets a body."""

    def via_call(op: emulated.UnitOp, a: ir.Value, b: ir.Value, c: ir.Value, spec: ChipSpec) -> None:
        fn = op.declare(f"my_mma_{abs(hash(str(a.type) + str(op.indexing_maps)))}", [a.type, b.type, c.type])
        if not fn.body.blocks:
            block = fn.add_entry_block()
            with ir.InsertionPoint(block):
                ta, tb, tc = block.arguments
                emulated.matrix_unit_op(op, ta, tb, tc, spec)
                func.ReturnOp([])
        func.CallOp(fn, [a, b, c])

    a, b = _inputs((33, 40), (40, 65))
    out, counts = _matmul(_target("declared_test", matrix_unit_op=via_call), a, b)
    ref, ref_counts = _matmul("template", a, b)
    np.testing.assert_array_equal(out, ref)
    assert counts == ref_counts


def scratchpad_in_one_global_per_level(alloc: emulated.ScratchpadAlloc, spec: ChipSpec) -> ir.Value:
    """The scaffold's example: a view at ``alloc.offset`` into one global per level."""
    pad = f"test_{alloc.level.name}"
    capacity = alloc.level.max_size_bytes or alloc.level.size_bytes
    if alloc.offset + alloc.size > capacity:
        raise ValueError(f"{alloc.type} at offset {alloc.offset} does not fit {alloc.level.name} ({capacity} B)")
    pad_type = ir.MemRefType.get([capacity], ir.IntegerType.get_signless(8), memory_space=alloc.type.memory_space)
    if pad not in ir.SymbolTable(alloc.module.operation):
        with alloc.at_module_level():
            memref.GlobalOp(sym_name=pad, type_=ir.TypeAttr.get(pad_type), sym_visibility="private")
    offset = arith.constant(ir.IndexType.get(), alloc.offset)
    return memref.view(alloc.type, memref.get_global(pad_type, pad), offset, [])


@pytest.mark.parametrize("shape", [(33, 40, 65), (129, 65, 257)])
def test_scratchpad_buffers_from_the_hook(shape: tuple[int, int, int]) -> None:
    """``scratchpad_alloc`` may build the buffers: views into one global per level, at the offsets given."""
    m, k, n = shape
    a, b = _inputs((m, k), (k, n))
    out, counts = _matmul(_target("globals_test", scratchpad_alloc=scratchpad_in_one_global_per_level), a, b)
    ref, ref_counts = _matmul("template", a, b)
    np.testing.assert_array_equal(out, ref)
    assert counts == ref_counts


def test_scratchpad_offsets_keep_live_buffers_apart_in_every_op_family(npu: ChipSpec) -> None:
    wanted = ("softmax/f32/(", "layernorm/f16/(", "elementwise/f32/gelu-chain", "reduction/f32/sum-rows/",
              "attention/f16/2x35x16", "matmul/f16/batched/", "conv2d/f32/nchw-3x3-pad1")
    cases = [c for c in generate_cases(npu) if c.name.startswith(wanted) and not c.skip]
    assert len(cases) == len(wanted)
    target = _target("offsets_test", scratchpad_alloc=scratchpad_in_one_global_per_level)
    for r in run_cases(cases, target=target, spec=npu):  # type: ignore[arg-type]
        assert r.status == "pass", (r.name, r.message)


# ------------------------------------------------------------------------ wrong hooks fail early

def _compile_error(target: TemplateTarget) -> CompileError:
    a, b = _inputs((33, 40), (40, 65))
    with pytest.raises(CompileError) as err:
        _matmul(target, a, b)
    return err.value


def test_an_ill_typed_unit_op_is_a_compile_error_naming_the_hook() -> None:
    def ill_typed(op: emulated.UnitOp, a: ir.Value, b: ir.Value, c: ir.Value, spec: ChipSpec) -> None:
        # f16 operands stored into the f32 accumulator without conversion: does not verify.
        zero = arith.constant(ir.IndexType.get(), 0)
        memref.store(memref.load(a, [zero, zero]), c, [zero, zero])

    err = _compile_error(_target("ill_typed_test", matrix_unit_op=ill_typed))
    assert err.stage == "matrix-unit" and "hook matrix_unit_op built IR that does not verify" in str(err)


def test_a_raising_hook_is_a_compile_error_naming_it() -> None:
    def broken(copy: emulated.DmaCopy, src: ir.Value, dst: ir.Value, spec: ChipSpec) -> None:
        arith.addf(src, dst)  # memrefs are not floats: the builder or the verifier refuses

    err = _compile_error(_target("raising_test", dma_copy=broken))
    assert err.stage == "dma" and "hook dma_copy" in str(err)


def test_a_hook_returning_text_is_a_compile_error() -> None:
    def old_style(op: emulated.UnitOp, a: ir.Value, b: ir.Value, c: ir.Value, spec: ChipSpec) -> str:
        return "func.func private @f() { return }"

    err = _compile_error(_target("text_test", matrix_unit_op=old_style))
    assert err.stage == "matrix-unit" and "hook matrix_unit_op returned a str" in str(err)


def test_a_scratchpad_buffer_of_the_wrong_type_is_a_compile_error() -> None:
    def wrong(alloc: emulated.ScratchpadAlloc, spec: ChipSpec) -> ir.Value:
        return memref.alloc(ir.MemRefType.get([4], ir.F32Type.get()), [], [])

    err = _compile_error(_target("wrong_buffer_test", scratchpad_alloc=wrong))
    assert err.stage == "scratchpad" and "hook scratchpad_alloc built IR that does not verify" in str(err)


def test_no_hook_output_is_parsed_from_text() -> None:
    root = Path(emulated.__file__).parent
    for name in ("hooks.py", "emulation.py", "counters.py", "scaffold/package/hooks.py.j2"):
        text = (root / name).read_text()
        assert "Module.parse" not in text and "Operation.parse" not in text, name


def test_the_ir_each_stage_leaves() -> None:
    """After ``dma``: one private function per distinct unit op / copy signature, holding what the hook
    built (counter increments included), called where the ops were; after ``scratchpad`` all inlined."""
    from pbsdk.core.compiler import compile_text, resolve

    text = """
func.func @main(%a: tensor<33x40xf16>, %b: tensor<40x65xf16>) -> tensor<33x65xf32> {
  %e = tensor.empty() : tensor<33x65xf32>
  %z = arith.constant 0.0 : f32
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<33x65xf32>) -> tensor<33x65xf32>
  %r = linalg.matmul ins(%a, %b : tensor<33x40xf16>, tensor<40x65xf16>) outs(%f : tensor<33x65xf32>)
      -> tensor<33x65xf32>
  return %r : tensor<33x65xf32>
}"""
    request = resolve("template", None, NO_CACHE)
    module = compile_text(text, request, stop_after="dma")
    fns = {f.attributes["sym_name"].value: f for f in module.body.operations if f.operation.name == "func.func"}
    units = [n for n in fns if n.startswith("__pbsdk_mxu_")]
    dmas = [n for n in fns if n.startswith("__pbsdk_dma_")]
    assert len(units) == 1 and len(dmas) >= 4
    assert str(module.body.operations[0]).startswith("memref.global @__pbsdk_counters : memref<64xi64> = dense<0>")
    unit = str(fns[units[0]])
    assert "memref.get_global @__pbsdk_counters" in unit and "arith.extf" in unit and "linalg.generic" in unit
    assert all("linalg.copy" in str(fns[n]) and "memref.store" in str(fns[n]) for n in dmas)
    assert "pbsdk.matrix_unit" not in str(module) and "pbsdk.dma" not in str(module)
    module = compile_text(text, request, stop_after="scratchpad")
    assert "__pbsdk_mxu_" not in str(module) and "__pbsdk_dma_" not in str(module)


# --------------------------------------------------------------------------- the vector-unit hook

def test_a_vector_tile_hook_builds_its_own_code_in_place() -> None:
    """A target's vector_tile_op replaces the emulation of fills with a call to an external routine (a
    C function in a library loaded into the process) and counts one per op; the rest stays emulated."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler")
    lib = Path(os.environ.get("TMPDIR", "/tmp")) / f"pbsdk_vfill_{os.getpid()}.so"
    src = lib.with_suffix(".c")
    src.write_text("#include <stdint.h>\nvoid vfill_f32(float *p, int64_t n, float v) {"
                   " for (int64_t i = 0; i < n; i++) p[i] = v; }\n")
    subprocess.run(["cc", "-shared", "-fPIC", "-O2", "-o", str(lib), str(src)], check=True)
    ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
    seen: list[str] = []

    def vector_tile_op(op, operands, spec):  # type: ignore[no-untyped-def]
        seen.append(op.op_name)
        out = ir.MemRefType(operands[-1].type)
        if op.op_name != "linalg.fill" or not out.has_static_shape or str(out.element_type) != "f32":
            return emulated.vector_tile_op(op, operands, spec)
        # The fill's value is its first operand; the tile is contiguous (a whole scratchpad buffer).
        index = ir.IndexType.get()
        n = arith.index_cast(ir.IntegerType.get_signless(64), arith.constant(index, int(np.prod(out.shape))))
        ptr = emulated.address(operands[-1])
        fn = op.declare("vfill_f32", [ptr.type, n.type, operands[0].type])
        func.CallOp(fn, [ptr, n, operands[0]])
        op.count_elements(1)
        return None

    target = _target("vfill", vector_tile_op=vector_tile_op)
    x = np.random.default_rng(2).standard_normal((6, 50_000)).astype(np.float32)  # rows wider than edge's spm
    f = pbsdk.jit(lambda v: pbsdk.ops.sum(v, axis=-1), target=target,  # type: ignore[arg-type]
                  spec=str(Path(__file__).parent / "data" / "edge_npu.yaml"), options=NO_CACHE)
    got = f(x)
    np.testing.assert_allclose(got, x.sum(axis=-1), rtol=1e-4, atol=1e-3)
    assert "linalg.fill" in seen and "linalg.generic" in seen
    counters = f.kernel(f.signatures[0])[0].executable.last_counters
    assert counters["vector:spm"] > 0 and counters["bytes:dram->spm"] >= x.nbytes


def _stores_an_f16_into_an_f32_tile(op, operands, spec):  # type: ignore[no-untyped-def]
    zero = arith.constant(ir.IndexType.get(), 0)
    memref.store(arith.constant(ir.F16Type.get(), 0.0), operands[-1], [zero] * ir.MemRefType(operands[-1].type).rank)


@pytest.mark.parametrize("bad, message", [
    (lambda op, operands, spec: 1 / 0, "hook vector_tile_op failed: ZeroDivisionError"),
    (lambda op, operands, spec: "linalg.generic ...", "hook vector_tile_op returned a str"),
    (_stores_an_f16_into_an_f32_tile, "hook vector_tile_op built IR that does not verify"),
])
def test_a_wrong_vector_tile_hook_is_a_compile_error_naming_it(bad: object, message: str) -> None:
    target = _target("badvec", vector_tile_op=bad)
    x = np.ones((4, 64), np.float32)
    f = pbsdk.jit(lambda v: v * 2.0, target=target, options=NO_CACHE)  # type: ignore[arg-type]
    with pytest.raises(CompileError, match=message) as err:
        f(x)
    assert err.value.stage == "vector-unit"
