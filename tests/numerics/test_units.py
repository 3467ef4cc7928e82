"""bf16 and int8 contractions on the host's matrix units in the vector registers (AVX512-BF16's vdpbf16ps,
VNNI's vpdpbusd) through the cpu target's unit kernels: numerics against numpy where this host has the
unit, and, on any host, the machine code for a CPU that has it (LLVM targets any x86 from any host)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.plan import Contraction, plan_contraction
from pbsdk.core.spec import load_spec
from pbsdk.targets.cpu.pack_contractions import lowers_unit, unit_spec
from pbsdk.testing import assert_close

BF16 = np.dtype(ml_dtypes.bfloat16)


needs_bf16_unit = pytest.mark.skipif(not lowers_unit(load_spec("host"), "vdpbf16ps"), reason="this host has no AVX512-BF16 "
                                     "(vdpbf16ps): its machine code is checked by test_code_for_a_cpu_with_units")
#: The host's i8 unit in the vector registers, its group of k (as packed) and the intrinsic its steps call:
#: VNNI's vpdpbusd (u8 x i8 quads), else AVX2's / AVX512-BW's vpmaddwd (i8 widened to i16 pairs).
I8_UNIT, I8_GROUP, I8_INTRINSIC = next(
    ((u, g, i) for u, g, i in (("vpdpbusd", 4, "vpdpbusd"), ("vpmaddwd", 2, "pmadd")) if lowers_unit(load_spec("host"), u)),
    ("", 4, ""))
needs_i8_unit = pytest.mark.skipif(not I8_UNIT, reason="this host has no i8 unit (VNNI's vpdpbusd, AVX2's vpmaddwd): "
                                   "its machine code is checked by test_code_for_a_cpu_with_units")

#: (M, N, K): whole tiles, edges in every dimension, K not a multiple of the unit's depth, several k blocks;
#: few rows and many columns (B packed several panels a pass, split over the threads by columns).
SHAPES = [(64, 64, 64), (37, 45, 29), (1, 100, 3), (130, 17, 1100), (96, 160, 4100), (12, 4000, 1000)]


#: The options that keep bf16 and i8 on the units in the vector registers (an AMX host's tiles off), for the
#: tests of those kernels.
VEC = {"amx": "off"}


def _bf16(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(BF16)


def _matmul_text(m: int, n: int, k: int, dtype: str) -> str:
    """A zero-filled ``linalg.matmul`` of ``dtype`` operands (bf16 -> f32, i8 -> i32) as a compile input."""
    acc, zero = {"bf16": ("f32", "0.0"), "i8": ("i32", "0")}[dtype]
    return f"""
    func.func @mm(%a: tensor<{m}x{k}x{dtype}>, %b: tensor<{k}x{n}x{dtype}>) -> tensor<{m}x{n}x{acc}> {{
      %z = arith.constant {zero} : {acc}
      %e = tensor.empty() : tensor<{m}x{n}x{acc}>
      %f = linalg.fill ins(%z : {acc}) outs(%e : tensor<{m}x{n}x{acc}>) -> tensor<{m}x{n}x{acc}>
      %r = linalg.matmul ins(%a, %b : tensor<{m}x{k}x{dtype}>, tensor<{k}x{n}x{dtype}>) outs(%f : tensor<{m}x{n}x{acc}>)
        -> tensor<{m}x{n}x{acc}>
      return %r : tensor<{m}x{n}x{acc}>
    }}"""


def _packed(fn: pbsdk.JitFunction, *args: np.ndarray) -> str:
    """The IR after ``pack-contractions`` for these arguments."""
    from pbsdk.core.compiler import compile_text

    return str(compile_text(fn.lower(*args), fn.request, stop_after="pack-contractions"))


@needs_bf16_unit
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_bf16_matmul_on_vdpbf16ps(m: int, n: int, k: int, threads: int) -> None:
    a, b = _bf16((m, k), 0), _bf16((k, n), 1)
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", options={"threads": threads, "cache": False, **VEC})
    got = fn(a, b)
    assert got.dtype == BF16
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(BF16)
    assert_close(got, want, op="matmul", dtype="bf16", reduction_size=k, accumulator="f32")
    assert 'llvm.call_intrinsic "llvm.x86.avx512bf16.dpbf16ps' in _packed(fn, a, b)


@needs_bf16_unit
@pytest.mark.parametrize("threads", [1, 2])
def test_bf16_batched_matmul_with_bias_and_gelu(threads: int) -> None:
    a, b, bias = _bf16((3, 40, 70), 2), _bf16((3, 70, 50), 3), _bf16((50,), 4)
    fn = pbsdk.jit(lambda x, w, c: ops.gelu(x @ w + c), target="cpu", options={"threads": threads, "cache": False, **VEC})
    got = fn(a, b, bias)
    acc = (a.astype(np.float32) @ b.astype(np.float32)).astype(BF16).astype(np.float32)
    pre = (acc + bias.astype(np.float32)).astype(BF16).astype(np.float64)
    from scipy.special import erf

    want = (0.5 * pre * (1 + erf(pre / np.sqrt(2)))).astype(BF16)
    assert_close(got, want, op="gelu", dtype="bf16")
    packed = _packed(fn, a, b, bias)
    assert "dpbf16ps" in packed and "linalg.generic" not in packed and "math.erf" in packed  # folded in


@needs_i8_unit
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, n, k", SHAPES)
def test_i8_matmul_on_the_unit_is_exact(m: int, n: int, k: int, threads: int) -> None:
    rng = np.random.default_rng(5)
    a = rng.integers(-128, 128, (m, k), dtype=np.int8)
    b = rng.integers(-128, 128, (k, n), dtype=np.int8)
    a[0, :] = -128  # the extremes: -128 * -128 summed over k
    b[:, 0] = -128
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", options={"threads": threads, "cache": False, **VEC})
    got = fn(a, b)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, a.astype(np.int32) @ b.astype(np.int32))
    assert I8_INTRINSIC in _packed(fn, a, b)


@needs_i8_unit
@pytest.mark.parametrize("threads", [1, 2])
def test_i8_batched_matmul_on_the_unit_is_exact(threads: int) -> None:
    rng = np.random.default_rng(8)
    a = rng.integers(-128, 128, (3, 41, 70), dtype=np.int8)
    b = rng.integers(-128, 128, (3, 70, 37), dtype=np.int8)
    a[:, 0, :] = -128
    b[:, :, 0] = -128
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", options={"threads": threads, "cache": False, **VEC})
    np.testing.assert_array_equal(fn(a, b), a.astype(np.int32) @ b.astype(np.int32))
    assert I8_INTRINSIC in _packed(fn, a, b)


@needs_i8_unit
def test_i8_requantize_epilogue_is_fused_and_exact() -> None:
    rng = np.random.default_rng(6)
    a = rng.integers(-128, 128, (50, 300), dtype=np.int8)
    b = rng.integers(-128, 128, (300, 70), dtype=np.int8)
    scale = np.float32(1 / 3000)

    def requant(x, w):
        acc = ops.astype(x @ w, "f32")
        return ops.astype(ops.minimum(ops.maximum(ops.round(acc * float(scale)) + 3.0, -128.0), 127.0), "i8")

    fn = pbsdk.jit(requant, target="cpu", options={"threads": 2, "cache": False, **VEC})
    got = fn(a, b)
    acc = (a.astype(np.int32) @ b.astype(np.int32)).astype(np.float32)
    want = np.clip(np.round(acc * scale) + 3, -128, 127).astype(np.int8)
    np.testing.assert_array_equal(got, want)
    packed = _packed(fn, a, b)
    assert I8_INTRINSIC in packed and "linalg.generic" not in packed


@pytest.mark.parametrize("spec, dtype, instruction", [("amd/zen4", "bf16", "vdpbf16ps"),
                                                      ("amd/zen4", "i8", "vpdpbusd"),
                                                      ("amd/zen3", "i8", "vpmaddwd"),
                                                      ("intel/xeon-amx", "bf16", "vdpbf16ps")])
def test_code_for_a_cpu_with_units(spec: str, dtype: str, instruction: str) -> None:
    """Compiled for a preset's CPU (from whatever host runs the test): the instruction is in the machine code
    (the AMX preset's tiles off: they are `test_amx_code_for_an_amx_xeon`'s)."""
    from pbsdk.core.compiler import compile_text, resolve
    from pbsdk.targets.cpu import parse_llvm_ir, target_machine

    text = _matmul_text(64, 80, 96, dtype)
    chip = load_spec(spec)
    artifact = compile_text(text, resolve("cpu", chip, {"cache": False, "amx": "off"}))
    tm = target_machine(chip)
    asm = tm.emit_assembly(parse_llvm_ir(artifact.payload))
    assert instruction in asm


def test_vpmaddwd_code_for_an_avx512_cpu_without_vnni() -> None:
    """An AVX-512 CPU without VNNI (a Skylake-X: the portable Xeon preset) whose detection lists AVX512-BW's
    512-bit vpmaddwd: its i8 product is a register tile of zmm vpmaddwd + vpaddd, i8 widened as packed."""
    from pbsdk.core.compiler import compile_text, resolve
    from pbsdk.core.spec import MatrixUnit
    from pbsdk.core.spec.host import host_units
    from pbsdk.targets.cpu import parse_llvm_ir, target_machine

    (unit,) = host_units({"avx512f": True, "avx512bw": True}, 512, 2)
    chip = load_spec("intel/xeon-avx512").model_copy(update={"matrix_units": [MatrixUnit(**unit)]})
    artifact = compile_text(_matmul_text(64, 80, 96, "i8"), resolve("cpu", chip, {"cache": False}))
    asm = target_machine(chip).emit_assembly(parse_llvm_ir(artifact.payload))
    assert "vpmaddwd" in asm and "%zmm" in asm.split("vpmaddwd", 1)[1].split("\n", 1)[0]


@needs_bf16_unit
@pytest.mark.parametrize("m, k, n", [(128, 768, 300), (1, 70, 50), (33, 1100, 64)])
def test_bf16_constant_weights_are_packed_at_compile_time(m: int, k: int, n: int) -> None:
    """A frozen weight (torch.compile of an nn.Linear in bf16) is packed into the unit's interleaved panels
    once, at compile time: the kernel reads it in place, the bias and the rounding are folded in."""
    import torch

    from pbsdk.frontends import torch as pbsdk_torch

    torch.manual_seed(0)
    lin = torch.nn.Linear(k, n).eval().to(torch.bfloat16)
    x = torch.randn(m, k).to(torch.bfloat16)
    pbsdk_torch.clear_reports()
    with torch.no_grad():
        got = torch.compile(lin, backend="pbsdk", options={"target": "cpu"})(x)
        want = lin(x)
    assert sum(len(r.fallback_ops) for r in pbsdk_torch.reports()) == 0
    assert_close(got.float().numpy().astype(BF16), want.float().numpy().astype(BF16), op="matmul", dtype="bf16",
                 reduction_size=k, accumulator="f32")


@needs_i8_unit
def test_i8_constant_weights_are_packed_at_compile_time() -> None:
    """An i8 weight packed at compile time: for vpdpbusd the kernel computes B's column sums (the u8
    correction) from the prepacked panels on every k block; for vpmaddwd the panels hold it widened to i16."""
    from pbsdk.targets.cpu.unit_kernel import pack_unit_panels, unit_packed_shape

    rng = np.random.default_rng(7)
    b = rng.integers(-128, 128, (70, 50), dtype=np.int8)
    packed = pack_unit_panels(b, 32, 4, 16)
    assert packed.shape == unit_packed_shape(70, 50, 32, 4) == (2, 18, 128)
    # panel 1, group 3, vector 0, lane 5, t 2 -> b[3*4 + 2, 32 + 5]
    assert packed[1, 3, 5 * 4 + 2] == b[14, 37]
    assert packed[1, 17, 4 * 18 + 3] == 0 and packed[1, 0, 18 * 4] == 0  # past k, past n: zero
    a = rng.integers(-128, 128, (45, 70), dtype=np.int8)
    for threads in (1, 2):
        fn = pbsdk.jit(lambda x: x @ b, target="cpu", options={"threads": threads, "cache": False, **VEC})
        np.testing.assert_array_equal(fn(a), a.astype(np.int32) @ b.astype(np.int32))
        kernel = fn.kernel(fn._signature((a,)))[0]
        nr = plan_contraction(unit_spec(load_spec("host"), "off")[0], Contraction(45, 50, 70, dtype="i8"), {"threads": threads}).blocking.nr
        # the constant reaches the kernel packed for the planned tile's nr, in the type the unit reads
        (const,) = kernel.artifact.constants
        assert const.shape == unit_packed_shape(70, 50, nr, I8_GROUP)
        assert const.dtype == (np.int8 if I8_UNIT == "vpdpbusd" else np.int16)



# --------------------------------------------------------------------------------------------- AMX tiles

def _with_amx(spec_name: str = "host") -> object:
    """``spec_name`` with the AMX preset's tile units listed first (what an AMX host's detection gives)."""
    base = load_spec(spec_name)
    tiles = [u for u in load_spec("intel/xeon-amx").matrix_units if u.registers == "tile"]
    return base.model_copy(update={"matrix_units": tiles + list(base.matrix_units)})


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (37, 45, 29), (70, 33, 600), (1, 20, 3)])
def test_amx_kernels_emulated(m: int, n: int, k: int, threads: int) -> None:
    """The AMX tile kernels (option amx="emulate": the tile instructions' arithmetic on host buffers, any
    machine) pack, address, step and update C correctly: bf16 within bf16 tolerance, i8 exactly."""
    spec = _with_amx()
    opts = {"threads": threads, "amx": "emulate", "cache": False}
    a, b = _bf16((m, k), 11), _bf16((k, n), 12)
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", spec=spec, options=opts)
    want = (a.astype(np.float64) @ b.astype(np.float64)).astype(BF16)
    assert_close(fn(a, b), want, op="matmul", dtype="bf16", reduction_size=k, accumulator="f32")
    rng = np.random.default_rng(13)
    ai, bi = rng.integers(-128, 128, (m, k), dtype=np.int8), rng.integers(-128, 128, (k, n), dtype=np.int8)
    gi = pbsdk.jit(lambda x, w: x @ w, target="cpu", spec=spec, options=opts)
    np.testing.assert_array_equal(gi(ai, bi), ai.astype(np.int32) @ bi.astype(np.int32))


def test_amx_kernels_emulated_with_epilogue_and_constant_weights() -> None:
    """A bias + GELU epilogue through the tile kernel's C update, and an i8 weight packed at compile time
    for whole k blocks (the unrolled steps read them all)."""
    spec = _with_amx()
    opts = {"threads": 2, "amx": "emulate", "cache": False}
    a, b, bias = _bf16((50, 700), 14), _bf16((700, 40), 15), _bf16((40,), 16)
    fn = pbsdk.jit(lambda x, w, c: ops.gelu(x @ w + c), target="cpu", spec=spec, options=opts)
    from scipy.special import erf

    pre = ((a.astype(np.float32) @ b.astype(np.float32)).astype(BF16).astype(np.float32)
           + bias.astype(np.float32)).astype(BF16).astype(np.float64)
    assert_close(fn(a, b, bias), (0.5 * pre * (1 + erf(pre / np.sqrt(2)))).astype(BF16), op="gelu", dtype="bf16")
    rng = np.random.default_rng(17)
    w = rng.integers(-128, 128, (300, 70), dtype=np.int8)
    x = rng.integers(-128, 128, (45, 300), dtype=np.int8)
    gi = pbsdk.jit(lambda v: v @ w, target="cpu", spec=spec, options=opts)
    np.testing.assert_array_equal(gi(x), x.astype(np.int32) @ w.astype(np.int32))
    kernel = gi.kernel(gi._signature((x,)))[0]
    assert [c.shape for c in kernel.artifact.constants] == [(3, 80, 128)]  # 3 panels of 32 columns, k 300 -> 320


@pytest.mark.parametrize("threads", [1, 2])
def test_amx_kernels_emulated_keep_c_in_the_accumulators_over_k_blocks(threads: int) -> None:
    """An i8 product (i32 result, no epilogue) with several k blocks: a tile inside the part loads its
    accumulators from C after the first block and stores them back (a tile at the edge goes through the
    masked update), exactly."""
    spec = _with_amx()
    m, n, k = 48, 40, 3500
    plan = plan_contraction(spec, Contraction(m, n, k, dtype="i8"), {"threads": threads})
    assert plan.blocking is not None and plan.blocking.kc < k  # several k blocks
    rng = np.random.default_rng(19)
    a, b = rng.integers(-128, 128, (m, k), dtype=np.int8), rng.integers(-128, 128, (k, n), dtype=np.int8)
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", spec=spec, options={"threads": threads, "amx": "emulate",
                                                                         "cache": False})
    np.testing.assert_array_equal(fn(a, b), a.astype(np.int32) @ b.astype(np.int32))
    packed = _packed(fn, a, b)
    assert "scf.if" in packed and packed.count("memref.load %arg2") >= 1  # C read into the slots


def test_explain_shows_the_unit_the_cpu_target_lowers() -> None:
    """`explain` plans with the spec as the target lowers it (`Target.planning_spec`): the AMX preset's tile
    unit where the option allows it, its dot-product unit with amx="off" (the kernel's unit either way)."""
    a, b = _bf16((256, 512), 21), _bf16((512, 256), 22)
    for amx, unit, op in (("on", "tdpbf16ps", "amx.tile_mulf"), ("off", "vdpbf16ps", "avx512bf16.dpbf16ps")):
        fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", spec="intel/xeon-amx", options={"amx": amx, "cache": False})
        assert f"matrix-unit {unit}" in fn.explain(a, b), (amx, fn.explain(a, b))
        assert op in _packed(fn, a, b)


def test_amx_packed_b_holds_whole_packing_passes() -> None:
    """B's packing buffer holds whole packing passes of panels: where the panels are no whole number of
    passes (640 columns: 20 panels of 32, packed 8 a pass on an AMX Xeon), the buffer has the last pass's
    panels too (it had 20, the last pass wrote past it and an AMX host's heap broke)."""
    import re

    spec = _with_amx()
    for n in (640, 608, 672, 544, 736, 96, 160):  # a column count whose panels end in a partial pass here
        blk = plan_contraction(spec, Contraction(64, n, 64, dtype="i8"), {"threads": 1}).blocking
        assert blk is not None and blk.unit == "tdpbssd"
        if (-(-min(blk.nc, n) // blk.nr)) % blk.pass_panels:
            break
    else:
        pytest.skip(f"this host's plans pack {blk.pass_panels} panel(s) a pass: no partial pass among the shapes")
    a, b = np.ones((64, 64), np.int8), np.ones((64, n), np.int8)
    fn = pbsdk.jit(lambda x, w: x @ w, target="cpu", spec=spec, options={"threads": 1, "amx": "emulate", "cache": False})
    allocs = re.findall(r"memref\.alloc\(\) \{alignment = 64 : i64\} : memref<(\d+)x(\d+)x128xi8>", _packed(fn, a, b))
    assert allocs, "no packed B buffer"
    want = -(-blk.nc // blk.nr // blk.pass_panels) * blk.pass_panels
    assert all(int(p) == want for p, _ in allocs), (allocs, want)
    np.testing.assert_array_equal(fn(a, b), a.astype(np.int32) @ b.astype(np.int32))


@pytest.mark.parametrize("dtype, instruction", [("bf16", "tdpbf16ps"), ("i8", "tdpbssd")])
def test_amx_code_for_an_amx_xeon(dtype: str, instruction: str) -> None:
    """With amx="on", the machine code for the AMX preset's CPU (made on any host) holds the tile loads,
    products and stores in a loop over k, and the tile configuration LLVM adds; the artifact asks for AMX's
    state."""
    from pbsdk.core.compiler import compile_text, resolve
    from pbsdk.targets.cpu import parse_llvm_ir, target_machine

    text = _matmul_text(100, 70, 300, dtype)
    chip = load_spec("intel/xeon-amx")
    artifact = compile_text(text, resolve("cpu", chip, {"cache": False, "amx": "on"}))
    asm = target_machine(chip).emit_assembly(parse_llvm_ir(artifact.payload))
    # The steps are a loop carrying the 4 accumulators in tile registers (LLVM may unroll it): 4 products and 4
    # loads a step, and the only tile stores are the accumulators' after the loop (no spills).
    products = asm.count(instruction)
    assert products >= 4 and products % 4 == 0 and asm.count("tileloadd") == products
    # a tile inside the part keeps C in its accumulators (4 stores straight to C); an edge tile goes through
    # a buffer to the masked C update (4 stores there)
    assert asm.count("tilestored") == 8 and asm.count("tilezero") == 8
    assert "ldtilecfg" in asm and "tilerelease" in asm
    assert artifact.metadata["amx"]
    off = compile_text(text, resolve("cpu", chip, {"cache": False, "amx": "off"}))  # the dot-product units
    assert instruction not in target_machine(chip).emit_assembly(parse_llvm_ir(off.payload))
    auto = compile_text(text, resolve("cpu", chip, {"cache": False}))  # the default, "auto": the tiles
    assert auto.metadata["amx"] == artifact.metadata["amx"] and auto.payload == artifact.payload


@pytest.mark.skipif(not lowers_unit(load_spec("host"), "tdpbf16ps", "on"), reason="this host has no AMX: the AMX kernels are checked by emulation "
                    "(test_amx_kernels_emulated) and by their machine code (test_amx_code_for_an_amx_xeon)")
def test_amx_kernels_on_this_hosts_tiles() -> None:
    """Where the host has AMX: the kernels run on its tiles (in a subprocess: a fault fails this test only)."""
    import subprocess
    import sys

    script = """
import numpy as np, ml_dtypes, pbsdk
BF = np.dtype(ml_dtypes.bfloat16)
rng = np.random.default_rng(0)
# (64, 640, 64), (64, 768, 1024) on 2 threads: a block of panels that is not whole packing passes (B's
# buffer once held only nc / nr panels, and the last pass wrote past it)
# (48, 40, 3500): several k blocks, C kept in the accumulators of the tiles inside the part
for m, n, k, t in ((64, 64, 64, 1), (37, 45, 29, 2), (70, 33, 600, 1), (64, 640, 64, 1), (64, 768, 1024, 2),
                   (48, 40, 3500, 2)):
    opts = {"amx": "on", "cache": False, "threads": t}
    a, b = rng.standard_normal((m, k)).astype(BF), rng.standard_normal((k, n)).astype(BF)
    y = pbsdk.jit(lambda x, w: x @ w, target="cpu", options=opts)(a, b)
    want = a.astype(np.float64) @ b.astype(np.float64)
    assert np.abs(y.astype(np.float64) - want).max() <= 2 ** -7 * (np.abs(want).max() + 1) + 1e-3 * k, (m, n, k)
    ai, bi = rng.integers(-128, 128, (m, k), dtype=np.int8), rng.integers(-128, 128, (k, n), dtype=np.int8)
    yi = pbsdk.jit(lambda x, w: x @ w, target="cpu", options=opts)(ai, bi)
    assert np.array_equal(yi, ai.astype(np.int32) @ bi.astype(np.int32)), (m, n, k)
# implicit GEMM: the tile kernel packs A from an NHWC input (stride 2, dilation 2, padding 1)
from pbsdk import ops
from pbsdk.testing import reference as ref
conv = lambda x, w: ops.conv2d(x, w, stride=2, padding=1, dilation=2, layout="NHWC")
xf, wf = rng.standard_normal((2, 11, 13, 64)), rng.standard_normal((3, 3, 64, 40))
want = ref.conv2d(xf.astype(BF).astype(np.float64), wf.astype(BF).astype(np.float64), stride=2, padding=1,
                  dilation=2, layout="NHWC")
y = pbsdk.jit(conv, options={"amx": "on", "cache": False})(xf.astype(BF), wf.astype(BF)).astype(np.float64)
assert np.abs(y - want).max() <= 2 ** -7 * np.abs(want).max() + 1e-2, np.abs(y - want).max()
xi, wi = rng.integers(-128, 128, (2, 11, 13, 64), dtype=np.int8), rng.integers(-128, 128, (3, 3, 64, 40), dtype=np.int8)
want = ref.conv2d(xi.astype(np.float64), wi.astype(np.float64), stride=2, padding=1, dilation=2, layout="NHWC")
assert np.array_equal(pbsdk.jit(conv, options={"amx": "on", "cache": False})(xi, wi), want.astype(np.int64))
print("ok")
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stderr[-3000:]
