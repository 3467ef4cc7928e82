"""Every conformance-style kernel compiles to PTX for sm_80 and sm_90, assembles with ptxas, uses mma.sync for
f16/bf16 contractions and stays within the spec's resources; the CLI emits PTX, cubins and artifacts."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from pbsdk.core.errors import CompileError, TargetError
from pbsdk.core.spec import load_spec
from pbsdk.targets.nvgpu.ptxas import find_ptxas
from pbsdk.targets.nvgpu.runtime import read

sys.path.insert(0, str(Path(__file__).parent))
from gpu_cases import CASES, ELEMENTWISE, GpuCase

pytestmark = pytest.mark.skipif(find_ptxas() is None, reason="ptxas not available")

SPECS = ("nvidia/a100", "nvidia/h100")


def _compile(text: str, spec: str, **options: Any) -> Any:
    from pbsdk.core.compiler import compile_text, resolve

    return compile_text(text, resolve("nvgpu", spec, {"cache": False, **options}))


@pytest.fixture(scope="module")
def compiled() -> dict[tuple[str, str], tuple[Any, dict[str, Any], dict[str, bytes]]]:
    """(spec, case) -> (artifact, header, blobs), compiled once for the module."""
    out = {}
    for spec in SPECS:
        for case in CASES:
            art = _compile(case.text(), spec)
            header, blobs = read(art.payload)
            out[(spec, case.name)] = (art, header, blobs)
    return out


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_kernel_compiles_to_ptx_and_cubin(compiled, spec: str, case: GpuCase) -> None:  # type: ignore[no-untyped-def]
    art, header, blobs = compiled[(spec, case.name)]
    chip = load_spec(spec)
    ptx = blobs["ptx"].decode()
    assert f".target {chip.codegen['arch']}" in ptx
    assert blobs["cubin"][:4] == b"\x7fELF"
    assert header["arch"] == chip.codegen["arch"] and header["spec"] == chip.name
    for launch in header["launches"]:
        assert f".entry {launch['kernel']}(" in ptx
        assert math.prod(launch["block"]) <= chip.compute[0].limits["max_threads_per_block"]
        assert all(0 <= a["buffer"] < len(header["buffers"]) for a in launch["args"])
    n_args = len(art.inputs) + len(art.outputs)
    assert [b["role"] for b in header["buffers"][:n_args]] == ["arg"] * n_args


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_mma_sync_exactly_for_half_contractions(compiled, spec: str, case: GpuCase) -> None:  # type: ignore[no-untyped-def]
    _, _, blobs = compiled[(spec, case.name)]
    ptx = blobs["ptx"].decode()
    found = re.findall(r"mma\.sync\.aligned\.m16n8k16\.row\.col\.f32\.(\w+)\.\w+\.f32", ptx)
    if case.matmul_dtype is not None:
        assert found and set(found) == {case.matmul_dtype}
    else:
        assert not found


@pytest.mark.parametrize("spec", SPECS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_resources_within_spec(compiled, spec: str, case: GpuCase) -> None:  # type: ignore[no-untyped-def]
    _, header, _ = compiled[(spec, case.name)]
    chip = load_spec(spec)
    kernels = header["kernels"]
    assert set(kernels) == {launch["kernel"] for launch in header["launches"]}
    for name, r in kernels.items():
        assert 0 < r["registers"] <= chip.compute[-1].limits["max_registers"], name
        assert r["shared_bytes"] <= chip.scratchpads()[0].size_bytes, name
        assert r["spill_stores"] == r["spill_loads"] == 0, name
    if case.matmul_dtype is not None:  # the operand and accumulator tiles really are in shared memory
        assert max(r["shared_bytes"] for r in kernels.values()) > 0


def test_every_elementwise_and_layout_op_compiles() -> None:
    from pbsdk.core.ir.emit import emit_graph
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.frontends.jit import trace

    for name, fn, arity in ELEMENTWISE:
        graph, _ = trace(fn, tuple(TensorType((15, 20), "f32") for _ in range(arity)))
        art = _compile(emit_graph(graph), "nvidia/h100", ptxas=False)
        header, blobs = read(art.payload)
        assert header["launches"], name
        assert "cubin" not in blobs and b".entry" in blobs["ptx"], name


def test_f32_precision_and_options_are_part_of_compilation() -> None:
    case = next(c for c in CASES if c.name == "matmul_f16_128x128x64")
    art = _compile(case.text(), "nvidia/a100", matrix_units=False, ptxas=False)
    _, blobs = read(art.payload)
    assert b"mma.sync" not in blobs["ptx"]


# ------------------------------------------------------------------------------------------ stages and CLI

MM = next(c for c in CASES if c.name == "matmul_f16_100x70x50")


@pytest.fixture(scope="module")
def mm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("nvgpu") / "mm.mlir"
    path.write_text(MM.text())
    return path


def _cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "pbsdk.cli", *args], capture_output=True, timeout=300, check=False,
                          env={**__import__("os").environ, "PBSDK_CACHE": "0"})


def test_schedule_stage_shows_blocks_warps_and_shared_memory() -> None:
    from pbsdk.core.compiler import compile_text, resolve

    text = str(compile_text(MM.text(), resolve("nvgpu", "a100", {"cache": False}), stop_after="schedule"))
    assert "#gpu.block<" in text and 'pbsdk.compute_level = "sm"' in text
    assert "#gpu.warp<linear_dim_0>" in text and "#gpu.thread<linear_dim_0>" in text
    assert "#gpu.address_space<workgroup>" in text
    assert 'pbsdk.matrix_unit = "mma.sync.m16n8k16"' in text
    mapped = str(compile_text(MM.text(), resolve("nvgpu", "a100", {"cache": False}), stop_after="map-gpu"))
    assert "gpu.launch" in mapped and "scf.forall" not in mapped and "gpu.barrier" in mapped


def test_cli_emits_ptx_cubin_and_artifact(mm_file: Path, tmp_path: Path) -> None:
    ptx = _cli("compile", str(mm_file), "--target", "nvgpu", "--spec", "h100", "--emit", "ptx")
    assert ptx.returncode == 0, ptx.stderr
    assert b".target sm_90" in ptx.stdout and b"mma.sync.aligned.m16n8k16" in ptx.stdout
    cubin = tmp_path / "k.cubin"
    r = _cli("compile", str(mm_file), "--target", "nvgpu", "--spec", "h100", "--emit", "cubin", "-o", str(cubin))
    assert r.returncode == 0, r.stderr
    assert cubin.read_bytes()[:4] == b"\x7fELF"
    art = tmp_path / "k.pbsdk"
    r = _cli("compile", str(mm_file), "--target", "nvgpu", "--spec", "a100", "--emit", "artifact", "-o", str(art))
    assert r.returncode == 0, r.stderr
    header, blobs = read(art.read_bytes())
    assert header["arch"] == "sm_80" and set(blobs) == {"ptx", "cubin"}
    listing = _cli("compile", str(mm_file), "--target", "nvgpu", "--list-stages")
    names = [line.split()[0] for line in listing.stdout.decode().splitlines()]
    assert names[-7:] == ["schedule", "map-gpu", "outline", "nvvm", "ptx", "cubin", "artifact"]


def test_cli_bad_spec_kind_is_a_clean_error(mm_file: Path) -> None:
    r = _cli("compile", str(mm_file), "--target", "nvgpu", "--spec", "host", "--emit", "ptx")
    assert r.returncode == 2 and b"Traceback" not in r.stderr
    assert b"needs a chip spec of kind 'gpu'" in r.stderr


def test_missing_ptxas_is_a_compile_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PBSDK_PTXAS", "/nonexistent/ptxas")
    with pytest.raises(CompileError, match="ptxas not found") as err:
        _compile(MM.text(), "a100")
    assert err.value.stage == "cubin"


def test_register_limit_from_spec_is_enforced() -> None:
    chip = load_spec("a100")
    levels = list(chip.compute)
    levels[-1] = levels[-1].model_copy(update={"limits": {"max_registers": 16}})
    tight = chip.model_copy(update={"compute": levels})
    with pytest.raises(CompileError, match=r"kernel 'main_kernel(_\d+)?' uses \d+ registers per thread; the spec "
                                           r"allows 16") as err:
        _compile(MM.text(), tight)
    assert err.value.stage == "cubin"


def test_spec_without_arch_is_refused() -> None:
    chip = load_spec("a100").model_copy(update={"codegen": {}})
    with pytest.raises(TargetError, match="codegen.arch"):
        _compile(MM.text(), chip)


def test_nvgpu_is_listed_ready() -> None:
    r = _cli("targets")
    line = next(ln for ln in r.stdout.decode().splitlines() if ln.startswith("nvgpu"))
    assert "ready" in line


def test_jit_compiles_then_needs_a_device() -> None:
    import numpy as np

    import pbsdk
    from pbsdk.core.errors import DeviceUnavailableError
    from pbsdk.targets.nvgpu.runtime import available

    if available():
        pytest.skip("a GPU is present (the gpu-marked tests run instead)")
    fn = pbsdk.jit(lambda a, b: pbsdk.ops.relu(a @ b), target="nvgpu", spec="a100", options={"ptxas": False})
    with pytest.raises(DeviceUnavailableError, match="GPU|driver"):
        fn(np.ones((16, 16), np.float16), np.ones((16, 16), np.float16))


def test_artifact_survives_the_compile_cache(compiled) -> None:  # type: ignore[no-untyped-def]
    from pbsdk.core.runtime.cache import decode, encode

    art, header, blobs = compiled[("nvidia/a100", MM.name)]
    blob = encode(art)
    assert blob is not None
    again = decode(blob)
    assert again.payload == art.payload and again.kind == art.kind
    assert read(again.payload) == (header, blobs)


def test_constant_tensors_travel_in_the_artifact() -> None:
    """A constant the kernels read (here a frozen weight and the causal mask's index tables) becomes a
    'const' buffer whose bytes are a blob, uploaded once by the runtime."""
    import numpy as np

    from pbsdk import ops
    from pbsdk.core.ir.emit import emit_graph
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.frontends.jit import trace

    w = np.arange(15 * 20, dtype=np.float32).reshape(15, 20) / 7
    graph, _ = trace(lambda a: ops.add(a, w), (TensorType((15, 20), "f32"),))
    header, blobs = read(_compile(emit_graph(graph), "nvidia/h100", ptxas=False).payload)
    consts = [b for b in header["buffers"] if b["role"] == "const"]
    assert len(consts) == 1 and consts[0]["shape"] == [15, 20]
    assert np.array_equal(np.frombuffer(blobs[consts[0]["blob"]], np.float32).reshape(15, 20), w)
    used = {a["buffer"] for launch in header["launches"] for a in launch["args"]}
    assert header["buffers"].index(consts[0]) in used

    # A large weight is a constant operand of the entry (never printed); the bundle carries its bytes
    # as a 'const' blob, and the bundle's arguments are the input and the output alone.
    from pbsdk.core.compiler import compile_text, resolve
    from pbsdk.core.ir.emit import emit_program

    big = np.random.default_rng(0).standard_normal((64, 48)).astype(np.float32)
    graph, _ = trace(lambda a: ops.add(a, big) * 2.0, (TensorType((64, 48), "f32"),))
    program = emit_program(graph)
    assert len(program.constants) == 1 and len(program.text) < 3000
    art = compile_text(program.text, resolve("nvgpu", "nvidia/h100", {"cache": False, "ptxas": False}),
                       constants=program.constants)
    assert art.constants == () and art.inputs == (((64, 48), "f32"),)
    header, blobs = read(art.payload)
    assert [b["role"] for b in header["buffers"][:2]] == ["arg", "arg"]
    consts = [b for b in header["buffers"] if b["role"] == "const"]
    assert len(consts) == 1 and np.array_equal(np.frombuffer(blobs[consts[0]["blob"]], np.float32).reshape(64, 48), big)
    used = {a["buffer"] for launch in header["launches"] for a in launch["args"]}
    assert {0, 1, header["buffers"].index(consts[0])} <= used

    q = TensorType((1, 2, 17, 64), "f16")
    graph, _ = trace(lambda x, y, z: ops.attention(x, y, z, causal=True), (q, q, q))
    header, blobs = read(_compile(emit_graph(graph), "nvidia/h100", ptxas=False).payload)
    assert [b for b in header["buffers"] if b["role"] == "const"]


def test_index_width_follows_the_largest_buffer() -> None:
    """32-bit index arithmetic in kernels when every buffer has fewer than 2**31 elements, else 64."""
    from mlir import ir

    from pbsdk.targets.nvgpu.lower import index_bits

    def module(n: int) -> ir.Module:
        return ir.Module.parse(f"func.func @f(%a: memref<{n}xf16>) {{\n  %v = memref.subview %a[0] [16] [1] : "
                               f"memref<{n}xf16> to memref<16xf16, strided<[1]>>\n  return\n}}", ir.Context())

    assert index_bits(module(2**31 - 1)) == 32
    assert index_bits(module(2**31)) == 64


def test_a_transposed_convolution_with_weights_as_inputs_compiles() -> None:
    """Its phases' sub-kernels are flips of the weight (no constant to fold them into): the flips run on one
    thread (upstream tiling cannot take their maps), the phases are interleaved into the output."""
    import numpy as np

    from pbsdk import ops
    from pbsdk.core.compiler import compile_text, resolve
    from pbsdk.core.ir.emit import emit_graph
    from pbsdk.core.ir.graph import TensorType
    from pbsdk.frontends.jit import trace

    graph, _ = trace(lambda x, w: ops.conv_transpose(x, w, stride=2, padding=1, output_padding=1, layout="NHWC"),
                     (TensorType((1, 5, 5, 8), "f32"), TensorType((8, 4, 3, 3), "f32")))
    assert [n.op for n in graph.live_nodes()].count("interleave") == 1
    request = resolve("nvgpu", "nvidia/h100", {"cache": False, "ptxas": False})
    art = compile_text(emit_graph(graph), request)
    header, blobs = read(art.payload)
    assert header["launches"] and b".entry" in blobs["ptx"]
    assert np.prod(header["buffers"][len(art.inputs)]["shape"]) == 10 * 10 * 4
