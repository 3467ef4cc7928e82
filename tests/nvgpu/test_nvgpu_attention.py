"""Fused attention on nvgpu: the mapping (no MLIR), the kernel's schedule emulated on the host against numpy
(f16/bf16 with f32 accumulation, f32 SIMT), PTX/cubin for sm_80 and sm_90 within the spec's resources, and
— with a GPU (marker ``gpu``) — the kernel itself.

The modules come from `attention_cases.AttnCase`: the form the core emits for a scratchpad spec (an entry
function calling a ``pbsdk.attention`` function), with descriptors built here."""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pbsdk.core.errors import CompileError
from pbsdk.core.spec import load_spec
from pbsdk.testing import assert_close, tolerance

sys.path.insert(0, str(Path(__file__).parent))
from attention_cases import AttnCase


def _mapping(case: AttnCase, spec: str = "nvidia/h100", **options: Any) -> Any:
    from pbsdk.targets.nvgpu.attention import attention_mapping, parse_descriptor

    return attention_mapping(load_spec(spec), parse_descriptor(json.dumps(case.descriptor())), options)


# ------------------------------------------------------------------------------------------- mapping (pure)

@pytest.mark.parametrize("spec", ["nvidia/a100", "nvidia/h100"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_half_precision_uses_mma_for_both_matmuls(spec: str, dtype: str) -> None:
    am = _mapping(AttnCase(1, 8, 1024, 1024, 64, 64, dtype, causal_offset=0), spec)
    assert am.compute == "mma" and am.unit.startswith("mma.sync.m16n8k16")
    assert am.block_q == 16 * am.warps and am.threads == 32 * am.warps
    assert am.block_k % 16 == 0 and am.d_pad % 16 == 0 and am.dv_pad % 8 == 0
    assert am.shared_bytes <= load_spec(spec).scratchpads()[0].size_bytes
    assert am.grid == (1024 // am.block_q, 8)
    assert am.row_threads == 2  # both warps' lanes share the softmax rows
    assert any("O += P·V" in r for r in am.reasons)


def test_f32_takes_the_simt_path() -> None:
    am = _mapping(AttnCase(1, 2, 100, 100, 64, 64, "f32"))
    assert am.compute == "thread" and am.unit == "fma" and am.threads == 128
    assert am.block_q == 16 * am.tm and am.block_k == 8 * am.tn_s and am.dv_pad == 8 * am.tn_o
    assert am.row_threads * am.block_q <= am.threads and am.block_k % am.row_threads == 0 and am.row_threads > 1
    assert _mapping(AttnCase(1, 2, 100, 100, 64, 64, "f16"), matrix_units=False).compute == "thread"


@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", ["f16", "f32"])
def test_tiles_shrink_to_static_shared_memory(d: int, dtype: str) -> None:
    case = AttnCase(1, 1, 4096, 4096, d, d, dtype, block_q=128, block_k=128)
    if d == 256 and dtype == "f32":  # 16 rows of f32 Q and O alone are 32 KiB: no tile fits 48 KiB
        with pytest.raises(CompileError, match="without opt-in"):
            _mapping(case)
        return
    am = _mapping(case)
    assert am.shared_bytes <= am.budget == 49152
    if d == 64 and dtype == "f16":
        assert (am.block_q, am.block_k) == (64, 32)
    if d == 128:
        assert am.block_q * am.block_k < 128 * 128 and any("->" in r for r in am.reasons)


def test_tiles_never_larger_than_the_problem() -> None:
    am = _mapping(AttnCase(1, 1, 1, 7, 64, 64, "f16"))
    assert (am.block_q, am.block_k, am.q_blocks, am.k_tiles) == (16, 16, 1, 1)


def test_head_dims_are_padded_to_the_unit() -> None:
    am = _mapping(AttnCase(1, 1, 64, 64, 40, 20, "bf16"))
    assert (am.d_pad, am.dv_pad) == (48, 24)


def test_tile_loads_are_16_byte_vectors_where_aligned() -> None:
    from pbsdk.targets.nvgpu.attention import attention_mapping, parse_descriptor, vector_width

    am = _mapping(AttnCase(1, 8, 128, 128, 64, 64, "f16"))
    assert (am.vec_q, am.vec_k, am.vec_v) == (8, 8, 8)
    assert _mapping(AttnCase(1, 8, 128, 128, 64, 64, "f32")).vec_k == 4
    assert _mapping(AttnCase(2, 8, 128, 128, 64, 64, "bf16", bshd=True)).vec_q == 8
    am = _mapping(AttnCase(1, 2, 50, 70, 40, 24, "f16"))  # d padded to 48: scalar Q/K; dv 24 is 3 vectors
    assert (am.vec_q, am.vec_k, am.vec_v) == (1, 1, 8)
    raw = AttnCase(1, 1, 64, 64, 64, 64, "f16").descriptor()
    raw["operands"]["k"].update(row_stride=1, col_stride=64)  # K stored transposed (d, sk)
    desc = parse_descriptor(raw)
    assert vector_width(desc.k, 64, 64, "f16") == 1
    assert attention_mapping(load_spec("nvidia/h100"), desc).vec_k == 1


@pytest.mark.parametrize("bt", [False, True])
def test_warp_strip_keeps_each_accumulator_fragment_in_registers(bt: bool) -> None:
    from mlir import ir

    from pbsdk.targets.nvgpu.attention_kernel import mma_types
    from pbsdk.targets.nvgpu.mma import mma_gpu_function

    with ir.Context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            types = list(mma_types("f16", 64, 32, b_transposed=bt))
            mma_gpu_function("strip", types, "mma.sync.m16n8k16", b_transposed=bt)
        assert module.operation.verify()
        text = str(module)  # arguments print as %arg0 (A), %arg1 (B), %arg2 (C)
    steps = (32 // 8) * (64 // 16)
    assert text.count("nvvm.mma.sync") == steps
    # C: 4 lane elements per 16x8 fragment, loaded and stored once (not once per k step)
    assert text.count("memref.load %arg2[") == text.count("memref.store") == 4 * (32 // 8)
    # B: two registers per step, each one 2-element load from Bᵀ, or two element loads from B
    assert text.count("vector.load %arg1[") == (2 * steps if bt else 0)
    assert text.count("memref.load %arg1[") == (0 if bt else 4 * steps)


def test_padding_removes_bank_conflicts_where_it_costs_no_tile() -> None:
    full = _mapping(AttnCase(1, 8, 4096, 4096, 64, 64, "f16", block_q=32, block_k=256))  # the core's h100 tile
    assert (full.block_q, full.block_k) == (32, 64) and dict(full.pads) == {"ss": 2, "sp": 8, "sq": 8, "sk": 8,
                                                                             "sv": 8, "so": 4}
    lanes = range(32)

    def banks(word_of_lane: Any) -> int:
        """How many lanes share the busiest bank (1: conflict-free)."""
        words = {word_of_lane(x) for x in lanes}  # lanes reading the same word are one access
        return max(sum(1 for w in words if w % 32 == b) for b in range(32))

    # fragments read as vector<2xf16> at [g, 2t]: A of Q and P, B of S from the K tile (Bᵀ); V's B
    # fragments are halves at [2t, g]
    for pitch in (full.pitch("sq"), full.pitch("sp"), full.pitch("sk")):
        assert banks(lambda x, p=pitch: (x // 4 * p + 2 * (x % 4)) // 2) == 1
    assert banks(lambda x: (2 * (x % 4) * full.pitch("sv") + x // 4) // 2) == 1
    # the softmax update: lane = (row, part), reading S[row, part + 2 jj] (f32)
    assert banks(lambda x: x // 2 * full.pitch("ss") + x % 2) == 1
    assert full.pitch("ss") == 66 and banks(lambda x: x // 2 * 64 + x % 2) == 16  # what the padding avoids
    # where full padding would shrink the tile, only the softmax tiles are padded
    rows = _mapping(AttnCase(1, 8, 4096, 4096, 64, 64, "f16", block_q=64, block_k=64))
    assert (rows.block_q, rows.block_k) == (64, 32) and dict(rows.pads) == {"ss": 2, "sp": 8}


def test_causal_skips_tiles_above_the_diagonal() -> None:
    am = _mapping(AttnCase(1, 1, 1024, 1024, 64, 64, "f16", causal_offset=0))
    bq, bk = am.block_q, am.block_k
    assert am.key_tiles(0) == -(-bq // bk)
    assert am.key_tiles(am.q_blocks - 1) == am.k_tiles
    visited = sum(am.key_tiles(qb) for qb in range(am.q_blocks))
    assert visited < 0.6 * am.q_blocks * am.k_tiles  # about half the tiles are skipped
    # only the tiles crossing the block's diagonal need the per-(row, key) mask
    assert all(len(am.diagonal_tiles(qb)) <= -(-bq // bk) for qb in range(am.q_blocks))
    assert am.diagonal_tiles(1) == tuple(range(bq // bk, 2 * bq // bk))
    full = _mapping(AttnCase(1, 1, 1024, 1024, 64, 64, "f16"))
    assert full.key_tiles(0) == full.k_tiles and full.diagonal_tiles(0) == ()
    shifted = _mapping(AttnCase(1, 1, 16, 1024, 64, 64, "f16", causal_offset=1008))
    assert shifted.key_tiles(0) == shifted.k_tiles  # the bottom-right-aligned diagonal reaches every key


def test_too_large_head_dim_is_refused_with_the_budget() -> None:
    with pytest.raises(CompileError, match="49152 B"):
        _mapping(AttnCase(1, 1, 64, 64, 1024, 1024, "f32"))


def test_malformed_descriptor_is_a_compile_error() -> None:
    from pbsdk.targets.nvgpu.attention import parse_descriptor

    good = AttnCase(1, 1, 8, 8, 64, 64, "f16").descriptor()
    with pytest.raises(CompileError, match="malformed"):
        parse_descriptor(json.dumps({k: v for k, v in good.items() if k != "sq"}))
    with pytest.raises(CompileError, match="version"):
        parse_descriptor(json.dumps({**good, "version": 2}))


@pytest.mark.parametrize("bshd", [False, True])
def test_operand_layout_offsets_follow_the_descriptor(bshd: bool) -> None:
    from pbsdk.targets.nvgpu.attention import parse_descriptor

    case = AttnCase(2, 8, 5, 6, 64, 64, "f16", kv_heads=2, bshd=bshd)
    desc = parse_descriptor(json.dumps(case.descriptor()))
    k = np.arange(np.prod(case.shapes["k"])).reshape(case.shapes["k"])
    for beta in range(16):
        b, h = divmod(beta, 8)
        assert desc.k.offset(beta, 3, 5) == (k[b, 3, h // 4, 5] if bshd else k[b, h // 4, 3, 5])


# ------------------------------------------------------------------------------------ emulated numerics

EMULATED = [
    AttnCase(1, 2, 1, 1, 64, 64, "f16"),
    AttnCase(1, 2, 7, 7, 64, 64, "f16", causal_offset=0),
    AttnCase(1, 2, 7, 7, 128, 128, "bf16"),
    AttnCase(1, 2, 128, 128, 64, 64, "f16"),
    AttnCase(1, 2, 128, 128, 128, 128, "bf16", causal_offset=0),
    AttnCase(1, 2, 128, 128, 128, 128, "f16", causal_offset=0),
    AttnCase(1, 2, 128, 128, 64, 64, "bf16"),
    AttnCase(1, 1, 300, 300, 64, 64, "f16", causal_offset=0),
    AttnCase(1, 1, 1024, 1024, 64, 64, "f16", causal_offset=0, block_q=32, block_k=256),  # the core's h100 tile
    AttnCase(1, 1, 2048, 2048, 128, 128, "bf16", block_q=32, block_k=256),
    AttnCase(2, 8, 33, 40, 64, 64, "f16", kv_heads=2),
    AttnCase(2, 4, 37, 29, 64, 64, "bf16", kv_heads=2, causal_offset=0, bshd=True),
    AttnCase(2, 3, 21, 45, 64, 64, "bf16", mask=True),
    AttnCase(1, 2, 7, 7, 64, 64, "f16", mask=True, causal_offset=0),
    AttnCase(1, 2, 50, 70, 40, 24, "f16"),
    AttnCase(1, 2, 1, 1, 64, 64, "f32", mask=True),
    AttnCase(1, 2, 7, 7, 128, 128, "f32", causal_offset=0),
    AttnCase(1, 2, 128, 128, 64, 64, "f32", causal_offset=0),
    AttnCase(2, 4, 33, 40, 128, 128, "f32", kv_heads=1, mask=True),
]


def _emulate_and_check(case: AttnCase, spec: str = "nvidia/h100", **options: Any) -> Any:
    from pbsdk.targets.nvgpu.emulate import emulate

    kernel = emulate(case.module_text(), spec=spec, options={"cache": False, **options})
    args = case.inputs()
    got = np.asarray(kernel(*args))
    expected = case.reference(*args)
    # f16 comes back as float16, bf16 widened to float32: compared at the operand dtype's tolerance
    tol = tolerance("attention", case.dtype, reduction_size=case.sk + case.d)
    assert_close(got, expected.astype(got.dtype), op="attention", tol=tol)
    return kernel


@pytest.mark.parametrize("case", EMULATED, ids=lambda c: c.name)
def test_emulated_attention_matches_numpy(case: AttnCase) -> None:
    kernel = _emulate_and_check(case, "nvidia/a100" if case.sq == 300 else "nvidia/h100")
    (rec,) = [k for k in kernel.kernels if k["kind"] == "attention"]
    assert rec["mapping"]["compute"] == ("thread" if case.dtype == "f32" else "mma")
    assert "pbsdk.matrix_unit" in kernel.scheduled or case.dtype == "f32"
    assert "pbsdk.attention" not in kernel.scheduled  # the core's neutral function is gone


def test_emulated_simt_path_for_half_precision() -> None:
    kernel = _emulate_and_check(AttnCase(1, 2, 40, 40, 64, 64, "f16", causal_offset=0), matrix_units=False)
    assert "pbsdk.matrix_unit" not in kernel.scheduled


def test_emulation_detects_a_skipped_key_tile(monkeypatch: pytest.MonkeyPatch) -> None:
    """A schedule bug (the key loop one tile short) must show up as a numerical failure."""
    from pbsdk.targets.nvgpu import attention

    real = attention.AttentionMapping.k_tiles.fget  # type: ignore[attr-defined]
    monkeypatch.setattr(attention.AttentionMapping, "k_tiles", property(lambda self: max(1, real(self) - 1)))
    with pytest.raises(AssertionError):
        _emulate_and_check(AttnCase(1, 1, 64, 96, 64, 64, "f16", block_k=32))


# ------------------------------------------------------------------------------------- PTX and cubins

def _compile(case: AttnCase, spec: str, **options: Any) -> Any:
    from pbsdk.core.compiler import compile_text, resolve

    return compile_text(case.module_text(), resolve("nvgpu", spec, {"cache": False, **options}))


COMPILED = [AttnCase(1, 8, 1024, 1024, 64, 64, "f16", causal_offset=0), AttnCase(1, 8, 1024, 1024, 128, 128, "bf16"),
            AttnCase(2, 8, 333, 333, 64, 64, "f16", kv_heads=2, mask=True),
            AttnCase(1, 8, 1024, 1024, 64, 64, "f32", causal_offset=0)]


@pytest.mark.parametrize("spec", ["nvidia/a100", "nvidia/h100"])
@pytest.mark.parametrize("case", COMPILED, ids=lambda c: c.name)
def test_attention_compiles_within_the_spec(spec: str, case: AttnCase) -> None:
    from pbsdk.targets.nvgpu.ptxas import find_ptxas
    from pbsdk.targets.nvgpu.runtime import read

    if find_ptxas() is None:
        pytest.skip("ptxas not available")
    chip = load_spec(spec)
    header, blobs = read(_compile(case, spec).payload)
    ptx = blobs["ptx"].decode()
    assert f".target {chip.codegen['arch']}" in ptx and blobs["cubin"][:4] == b"\x7fELF"
    assert ("mma.sync.aligned.m16n8k16" in ptx) == (case.dtype != "f32")
    am = _mapping(case, spec)
    if am.compute == "mma":  # each warp's strips unrolled: S (bk/8 x d/16 steps), then O (dv/8 x bk/16)
        steps = am.block_k // 8 * am.d_pad // 16 + am.dv_pad // 8 * am.block_k // 16
        assert ptx.count("mma.sync.aligned.m16n8k16") == steps
    (launch,) = header["launches"]
    assert launch["grid"] == [case.b * case.h, am.q_blocks, 1] and launch["block"] == [am.threads, 1, 1]
    (res,) = header["kernels"].values()
    assert res["spill_loads"] == 0 and res["spill_stores"] == 0  # ptxas -v reports them; the stage refuses spills
    assert res["registers"] <= chip.compute[-1].limits["max_registers"]
    assert res["registers"] * am.threads <= chip.compute[0].limits["max_registers_per_block"]
    assert am.shared_bytes <= res["shared_bytes"] <= chip.scratchpads()[0].size_bytes


def test_schedule_records_the_attention_mapping() -> None:
    from mlir import ir

    from pbsdk.core.compiler import pipeline_for, resolve
    from pbsdk.core.pipeline import StageContext

    case = AttnCase(1, 2, 64, 64, 64, 64, "bf16", causal_offset=0)

    request = resolve("nvgpu", "nvidia/h100", {"cache": False})
    ctx = StageContext(request.spec, request.options)
    module = pipeline_for(request).run(ir.Module.parse(case.module_text(), ir.Context()), ctx, stop_after="schedule")
    (rec,) = [k for k in ctx.notes["nvgpu.kernels"] if k["kind"] == "attention"]
    assert rec["mapping"] == {k: v for k, v in dataclasses.asdict(_mapping(case)).items() if k != "desc"}
    text = str(module)
    assert "#gpu.warp<linear_dim_0>" in text and "#gpu.address_space<workgroup>" in text
    assert text.count("__pbsdk_mma_attn_m16n8k16_bf16") >= 2


# ------------------------------------------------------------------ end to end from the core's fusion

def _core_text(fn: Any, types: Sequence[tuple[tuple[int, ...], str]], spec: str = "nvidia/h100") -> str:
    """The core's linalg for ``fn`` on a scratchpad spec, with attention fused in the form nvgpu lowers."""
    from pbsdk.core.ir.emit import emit_graph
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.frontends.jit import trace
    from pbsdk.targets.nvgpu import NvgpuTarget

    graph, _ = trace(fn, tuple(TensorType(shape, dt) for shape, dt in types))
    text = emit_graph(graph, spec=load_spec(spec), forms=NvgpuTarget.attention_forms)
    assert "pbsdk.attention" in text, "the core did not fuse this attention for nvgpu"
    return text


def _rand(shape: tuple[int, ...], dtype: str, rng: np.random.Generator) -> np.ndarray:
    from pbsdk.targets.nvgpu.emulate import round_bf16

    x = rng.standard_normal(shape).astype(np.float32)
    return round_bf16(x) if dtype == "bf16" else x.astype({"f16": np.float16, "f32": np.float32}[dtype])


CORE = [  # (q shape, kv heads, dtype, causal, padding mask)
    ((1, 8, 100, 64), 8, "f16", True, False),
    ((1, 4, 64, 128), 2, "bf16", False, False),
    ((2, 4, 37, 64), 1, "f16", True, False),
    ((2, 3, 21, 64), 3, "f16", False, True),
]


@pytest.mark.parametrize("qshape,kvh,dtype,causal,pad", CORE,
                         ids=[f"{dt}-{'x'.join(map(str, q))}-kv{h}{'-causal' if c else ''}{'-pad' if p else ''}"
                              for q, h, dt, c, p in CORE])
def test_core_fused_attention_emulated(qshape: tuple[int, ...], kvh: int, dtype: str, causal: bool,
                                       pad: bool) -> None:
    from pbsdk import ops
    from pbsdk.targets.nvgpu.emulate import emulate
    from pbsdk.testing import reference as ref

    b, _, s, d = qshape
    kv = (b, kvh, s + 5, d)
    types = [(qshape, dtype), (kv, dtype), (kv, dtype)] + ([((b, 1, 1, s + 5), dtype)] if pad else [])
    def masked(q: Any, k: Any, v: Any, m: Any) -> Any:
        return ops.attention(q, k, v, mask=m)

    def plain(q: Any, k: Any, v: Any) -> Any:
        return ops.attention(q, k, v, causal=causal)

    fn = masked if pad else plain
    rng = np.random.default_rng(7)
    args = [_rand(shape, dt, rng) for shape, dt in types]
    if pad:
        args[3][...] = 0
        args[3][0, ..., -3:] = -np.inf  # the last three keys of sequence 0 are padding
    kernel = emulate(_core_text(fn, types), spec="nvidia/h100", options={"cache": False})
    assert [k["kind"] for k in kernel.kernels] == ["attention"]  # one kernel: nothing unfused around it
    got = np.asarray(kernel(*args))
    expected = ref.attention(*args[:3], causal=causal, mask=args[3] if pad else None, dtype=np.float64)
    tol = tolerance("attention", dtype, reduction_size=s + 5 + d)
    assert_close(got, expected.astype(got.dtype), op="attention", tol=tol)


def test_core_fused_attention_with_transposed_keys_emulated() -> None:
    """K given as (b, h, d, sk): the descriptor reads it through strides (scalar tile loads)."""
    from pbsdk import ops
    from pbsdk.targets.nvgpu.emulate import emulate
    from pbsdk.testing import reference as ref

    types = [((1, 2, 45, 64), "f16"), ((1, 2, 64, 50), "f16"), ((1, 2, 50, 64), "f16")]
    rng = np.random.default_rng(3)
    q, kt, v = (_rand(shape, dt, rng) for shape, dt in types)
    kernel = emulate(_core_text(lambda q, kt, v: ops.attention(q, ops.transpose(kt, (0, 1, 3, 2)), v), types),
                     spec="nvidia/h100", options={"cache": False})
    (rec,) = kernel.kernels
    assert rec["kind"] == "attention" and rec["mapping"]["vec_k"] == 1 and rec["mapping"]["vec_q"] == 8
    got = np.asarray(kernel(q, kt, v))
    expected = ref.attention(q, np.swapaxes(kt, -1, -2), v, dtype=np.float64)
    assert_close(got, expected.astype(got.dtype), op="attention", tol=tolerance("attention", "f16", reduction_size=114))


@pytest.mark.parametrize("spec", ["a100", "h100"])
def test_jit_attention_compiles_to_a_cubin_with_mma(spec: str) -> None:
    import pbsdk
    from pbsdk import ops
    from pbsdk.core.compiler import compile_text
    from pbsdk.targets.nvgpu.ptxas import find_ptxas
    from pbsdk.targets.nvgpu.runtime import read

    if find_ptxas() is None:
        pytest.skip("ptxas not available")
    q = np.zeros((1, 8, 1024, 64), np.float16)
    jf = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v, causal=True), target="nvgpu", spec=spec,
                   options={"cache": False})
    text = jf.lower(q, q, q)
    assert "pbsdk.attention" in text
    header, blobs = read(compile_text(text, jf.request).payload)
    (launch,) = header["launches"]
    assert "mma.sync.aligned.m16n8k16" in blobs["ptx"].decode() and blobs["cubin"][:4] == b"\x7fELF"
    # one block per (query block, head), a warp (32 threads) per 16 query rows
    assert launch["grid"][0] == 8 and launch["grid"][1] * launch["block"][0] // 2 == 1024
    (res,) = header["kernels"].values()
    assert res["spill_stores"] == 0 and res["shared_bytes"] <= 49152


# --------------------------------------------------------------------------------------------- on a GPU

#: What the gpu-marked test runs (``scripts/gpu_check.py prepare`` writes their artifacts too).
GPU_CASES = (*COMPILED[:3], AttnCase(1, 1, 300, 300, 64, 64, "f16", causal_offset=0),
             AttnCase(2, 3, 21, 45, 64, 64, "bf16", mask=True),
             AttnCase(2, 4, 37, 29, 64, 64, "bf16", kv_heads=2, causal_offset=0, bshd=True),
             AttnCase(1, 2, 64, 64, 64, 64, "f16"))


def _gpu_artifact(case: AttnCase) -> bytes:
    directory = os.environ.get("PBSDK_GPU_ARTIFACTS")
    if directory:  # the GPU machine has no MLIR: artifacts prepared elsewhere
        path = Path(directory) / f"{case.name}.pbsdk"
        if not path.is_file():
            pytest.skip(f"{path} was not prepared")
        return path.read_bytes()
    pytest.importorskip("mlir")
    return _compile(case, os.environ.get("PBSDK_GPU_SPEC", "nvidia/h100")).payload  # type: ignore[no-any-return]


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=lambda c: c.name)
def test_attention_on_gpu_matches_numpy(case: AttnCase) -> None:
    from pbsdk.targets.nvgpu.emulate import from_bf16_bits, to_bf16_bits
    from pbsdk.targets.nvgpu.runtime import load

    kernel = load(_gpu_artifact(case))
    args = case.inputs()
    got = kernel(*[to_bf16_bits(a) if case.dtype == "bf16" else a for a in args])
    got = from_bf16_bits(got) if case.dtype == "bf16" else np.asarray(got)
    tol = tolerance("attention", case.dtype, reduction_size=case.sk + case.d)
    assert_close(got, case.reference(*args).astype(got.dtype), op="attention", tol=tol)


@pytest.mark.gpu
def test_attention_on_gpu_with_misaligned_torch_views() -> None:
    """A contiguous torch view that starts off a 16-byte boundary is copied before the vector loads."""
    torch = pytest.importorskip("torch")
    from pbsdk.targets.nvgpu.runtime import load

    case = AttnCase(1, 2, 64, 64, 64, 64, "f16")
    kernel = load(_gpu_artifact(case))
    args = case.inputs()
    views = []
    for a in args:
        flat = torch.zeros(a.size + 1, dtype=torch.float16, device="cuda")
        flat[1:] = torch.from_numpy(a.reshape(-1)).cuda()
        views.append(flat[1:].view(a.shape))  # contiguous, 2 bytes past an aligned start
    got = kernel(*views).cpu().numpy()
    tol = tolerance("attention", "f16", reduction_size=case.sk + case.d)
    assert_close(got, case.reference(*args).astype(got.dtype), op="attention", tol=tol)
