"""nvgpu decisions and file formats without IR: mappings, ptxas report parsing and limits, the artifact
format, and the runtime's behaviour without a GPU or MLIR."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pbsdk.core.errors import ArgumentError, CompileError, DeviceUnavailableError
from pbsdk.core.spec import load_spec
from pbsdk.targets.nvgpu import bundle, runtime
from pbsdk.targets.nvgpu.mapping import (
    MAX_GRID_YZ,
    loop_mapping,
    static_shared_bytes,
    thread_split,
    warp_share,
)
from pbsdk.targets.nvgpu.ptxas import KernelResources, check_resources, parse_resources

SPECS = ("nvidia/a100", "nvidia/h100", "nvidia/h200")


# ---------------------------------------------------------------------------------------------- mapping

def test_loop_mapping_maps_innermost_parallel_loops_x_first() -> None:
    lm = loop_mapping((100, 70), ["parallel", "parallel"])
    assert lm.dims == (0, 1)
    assert lm.tile == (3, 70)  # 70 threads along x, 256 // 70 rows along y
    assert lm.block_xyz() == (70, 3, 1)
    assert lm.grid_xyz() == (1, 34, 1)
    assert lm.threads <= 256


def test_loop_mapping_leaves_reductions_inside_threads() -> None:
    lm = loop_mapping((37, 100), ["parallel", "reduction"])
    assert lm.dims == (0,)
    assert lm.tile == (37,)
    assert lm.grid_xyz() == (1, 1, 1)


def test_loop_mapping_at_most_three_dims_and_grid_limit() -> None:
    lm = loop_mapping((2, 3, 4, 5, 6), ["parallel"] * 5)
    assert lm.dims == (2, 3, 4)
    with pytest.raises(CompileError, match="grid y extent"):
        loop_mapping((MAX_GRID_YZ * 2, 1), ["parallel", "parallel"], threads=1)


def test_loop_mapping_spreads_small_grids_over_the_chip() -> None:
    rows = loop_mapping((4096, 4096), ["parallel", "reduction"], units=132)
    assert rows.threads == 32 and rows.grid_xyz() == (128, 1, 1)  # not 16 blocks of 256 rows
    big = loop_mapping((4096, 4096), ["parallel", "parallel"], units=132)
    assert big.threads == 256
    tiny = loop_mapping((8,), ["parallel"], units=132)
    assert tiny.threads == 8 and tiny.grid_xyz() == (1, 1, 1)


def test_loop_mapping_without_parallel_loops_is_one_thread() -> None:
    lm = loop_mapping((30, 20), ["reduction", "reduction"])
    assert lm.dims == () and lm.threads == 1


def test_thread_split_takes_the_innermost_parallel_loops_first() -> None:
    # a 16 x 64 copy on 128 threads: 64 along the rows' elements, 2 across rows
    assert thread_split((16, 64), ["parallel", "parallel"], 128) == (2, 64)
    # a loop no longer than its extent; reductions stay sequential in each thread
    assert thread_split((37, 100), ["parallel", "reduction"], 128) == (37, 0)
    assert thread_split((30, 20), ["reduction", "reduction"], 128) == (0, 0)
    # an unknown (dynamic, unbounded) extent may take every thread
    assert thread_split((8, None), ["parallel", "parallel"], 128) == (0, 128)


def test_warp_share_never_exceeds_the_tiles_or_the_block() -> None:
    assert warp_share(64, 128, 32) == 4
    assert warp_share(2, 128, 32) == 2
    assert warp_share(1, 32, 32) == 1


@pytest.mark.parametrize("spec_name", SPECS)
def test_static_shared_memory_is_the_levels_size(spec_name: str) -> None:
    spec = load_spec(spec_name)
    assert static_shared_bytes(spec) == spec.scratchpads()[0].size_bytes


@pytest.mark.parametrize("key", ["optin_scratchpad", "double_buffer"])
def test_nvgpu_refuses_options_it_cannot_honour(key: str) -> None:
    from pbsdk.core.errors import OptionsError
    from pbsdk.targets.nvgpu import NvgpuTarget

    opts = NvgpuTarget().parse_options(None)
    assert not opts.optin_scratchpad and not opts.double_buffer
    with pytest.raises(OptionsError, match=key):
        NvgpuTarget().parse_options({key: True})


# ---------------------------------------------------------------------------------------------- ptxas

PTXAS_LOG = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'main_kernel' for 'sm_80'
ptxas info    : Function properties for main_kernel
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 1 barriers, 368 bytes cmem[0]
ptxas info    : Compiling entry function 'main_kernel_0' for 'sm_80'
ptxas info    : Function properties for main_kernel_0
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 6144 bytes smem, 384 bytes cmem[0]
"""


def test_parse_ptxas_report() -> None:
    res = parse_resources(PTXAS_LOG)
    assert res["main_kernel"] == KernelResources("main_kernel", registers=8, barriers=1)
    assert res["main_kernel_0"] == KernelResources("main_kernel_0", registers=40, shared_bytes=6144, stack_bytes=16,
                                                   spill_stores=8, spill_loads=4, barriers=1)


def test_resource_limits_name_the_kernel_and_the_limit() -> None:
    res = parse_resources(PTXAS_LOG)
    kw = {"threads": {"main_kernel_0": 128}, "max_registers": 255, "max_registers_per_block": 65536,
          "max_shared": 49152}
    with pytest.raises(CompileError, match="main_kernel_0.*spills"):
        check_resources(res, **kw)  # type: ignore[arg-type]
    check_resources(res, **kw, allow_spills=True)  # type: ignore[arg-type]
    with pytest.raises(CompileError, match=r"main_kernel_0' uses 40 registers per thread; the spec allows 32"):
        check_resources(res, **{**kw, "max_registers": 32}, allow_spills=True)  # type: ignore[arg-type]
    with pytest.raises(CompileError, match=r"40 x 128 = 5120 registers per block; the spec allows 4096"):
        check_resources(res, **{**kw, "max_registers_per_block": 4096}, allow_spills=True)  # type: ignore[arg-type]
    with pytest.raises(CompileError, match=r"6144 B of shared memory; the spec allows 4096 B") as err:
        check_resources(res, **{**kw, "max_shared": 4096}, allow_spills=True)  # type: ignore[arg-type]
    assert err.value.stage == "cubin" and err.value.op == "main_kernel_0"


# ---------------------------------------------------------------------------------------------- artifact format

HEADER = {"target": "nvgpu", "arch": "sm_90", "entry": "main", "inputs": [[[4], "f32"]], "outputs": [[[4], "f32"]],
          "buffers": [{"shape": [4], "dtype": "f32", "role": "arg"}] * 2,
          "launches": [{"kernel": "k", "grid": [1, 1, 1], "block": [4, 1, 1], "shared_bytes": 0,
                        "args": [{"buffer": 0, "offset": 0}, {"buffer": 1, "offset": 0}]}]}


def test_bundle_round_trip() -> None:
    data = bundle.pack(HEADER, {"ptx": b".version 8.0", "cubin": b"\x7fELF..."})
    assert data.startswith(b"PBSDK-ARTIFACT 1 ")
    header, blobs = bundle.unpack(data)
    assert blobs == {"ptx": b".version 8.0", "cubin": b"\x7fELF..."}
    assert header["version"] == bundle.VERSION and header["launches"] == HEADER["launches"]


@pytest.mark.parametrize("mutate, message", [
    (lambda d: b"GARBAGE" + d, "bad magic"),
    (lambda d: d.replace(b"PBSDK-ARTIFACT 1", b"PBSDK-ARTIFACT 9", 1), "version 9"),
    (lambda d: d[:-3], "truncated"),
    (lambda d: d[:-1] + bytes([d[-1] ^ 1]), "checksum"),
    (lambda d: b"", "no header line"),
])
def test_bundle_rejects_bad_files(mutate, message) -> None:  # type: ignore[no-untyped-def]
    data = bundle.pack(HEADER, {"ptx": b".version 8.0"})
    with pytest.raises(bundle.BundleError, match=message):
        bundle.unpack(mutate(data))
    with pytest.raises(ArgumentError):
        runtime.read(mutate(data))


def test_bundle_header_must_describe_launches() -> None:
    data = bundle.pack({k: v for k, v in HEADER.items() if k != "launches"}, {})
    with pytest.raises(bundle.BundleError, match="launches"):
        bundle.unpack(data)


# ---------------------------------------------------------------------------------------------- runtime, no GPU

@pytest.mark.skipif(runtime.available(), reason="a GPU is present")
def test_load_without_a_gpu_is_device_unavailable() -> None:
    with pytest.raises(DeviceUnavailableError, match="libcuda|GPU"):
        runtime.load(bundle.pack(HEADER, {"ptx": b".version 8.0"}))


def test_runtime_reads_artifacts_without_mlir(tmp_path) -> None:  # type: ignore[no-untyped-def]
    path = tmp_path / "k.pbsdk"
    path.write_bytes(bundle.pack(HEADER, {"ptx": b".version 8.0"}))
    code = f"""
import sys
BLOCKED = ("mlir", "llvmlite", "pydantic", "yaml")  # none of these are on the GPU machine
class _NoMlir:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked in this test (the runtime needs numpy only): " + name)
        return None
sys.meta_path.insert(0, _NoMlir())
from pbsdk.core.errors import DeviceUnavailableError
from pbsdk.targets.nvgpu import runtime
header, blobs = runtime.read(open({str(path)!r}, "rb").read())
assert header["entry"] == "main" and blobs["ptx"] == b".version 8.0"
try:
    runtime.load_file({str(path)!r})
except DeviceUnavailableError as exc:
    print("no device:", exc)
except Exception as exc:  # a GPU is present: the fake PTX is refused by the driver, which is fine here
    print("device present:", type(exc).__name__)
assert not [m for m in sys.modules if m.split(".")[0] in BLOCKED]
print("mlir-free")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "mlir-free" in out.stdout
    assert ("no device" in out.stdout) != runtime.available()


def test_header_is_plain_json() -> None:
    data = bundle.pack(HEADER, {"ptx": b"x"})
    first, rest = data.split(b"\n", 1)
    length = int(first.split()[2])
    assert json.loads(rest[:length])["format"] == "pbsdk-artifact"


# ---------------------------------------------------------------------------------------------- runtime, fake driver

FAKE_DRIVER = Path(__file__).parent / "data" / "fake_cuda.c"


@pytest.fixture(scope="module")
def fake_libcuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import shutil

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fake CUDA driver")
    lib = tmp_path_factory.mktemp("fakecuda") / "libfakecuda.so"
    subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(FAKE_DRIVER)], check=True, timeout=120)
    return lib


def _with_fake_driver(lib: Path, code: str, **env: str) -> str:
    import os

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False,
                         env={**os.environ, "PBSDK_LIBCUDA": str(lib), **env})
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def test_runtime_launch_sequence_through_the_driver(fake_libcuda: Path, tmp_path: Path) -> None:
    header = dict(HEADER, buffers=HEADER["buffers"] + [{"shape": [8], "dtype": "f32", "role": "temp"}],
                  launches=[dict(HEADER["launches"][0], kernel="first", grid=[3, 2, 1], block=[64, 1, 1]),
                            dict(HEADER["launches"][0], kernel="second", args=[{"buffer": 2, "offset": 0},
                                                                               {"buffer": 1, "offset": 8}])])
    path = tmp_path / "k.pbsdk"
    path.write_bytes(bundle.pack(header, {"ptx": b".version 8.0", "cubin": b"\x7fELF"}))
    code = f"""
import ctypes, os, numpy as np
from pbsdk.targets.nvgpu import runtime
k = runtime.load_file({str(path)!r})
print("image", k.image_kind)
out = k(np.arange(4, dtype=np.float32))
print("out", out.tolist())
log = ctypes.CDLL(os.environ["PBSDK_LIBCUDA"]).fake_log
log.restype = ctypes.c_char_p
print(log().decode())
"""
    stdout = _with_fake_driver(fake_libcuda, code, FAKE_CUDA_NARGS="2", FAKE_CUDA_COPY="16", FAKE_CUDA_CC="90")
    assert "image cubin" in stdout  # sm_90 artifact on a 9.0 device: the cubin
    # launch 1 copies the input into the output; launch 2 copies the (zeroed) temporary to output + 8 bytes
    assert "out [0.0, 1.0, 0.0, 0.0]" in stdout
    lines = [ln.split() for ln in stdout.splitlines() if ln.startswith(("first", "second"))]
    assert [ln[:4] for ln in lines] == [["first", "3,2,1", "64,1,1", "0"], ["second", "1,1,1", "4,1,1", "0"]]
    (_, _, _, _, in0, out0), (_, _, _, _, tmp, out8) = lines
    assert int(out8) == int(out0) + 8 and len({in0, out0, tmp}) == 3


def test_runtime_falls_back_to_ptx_and_checks_capability(fake_libcuda: Path, tmp_path: Path) -> None:
    path = tmp_path / "k.pbsdk"
    path.write_bytes(bundle.pack(HEADER, {"ptx": b".version 8.0", "cubin": b"\x7fELF"}))
    code = f"""
from pbsdk.core.errors import DeviceUnavailableError
from pbsdk.targets.nvgpu import runtime
print("image", runtime.load_file({str(path)!r}).image_kind)
"""
    # a driver that refuses the cubin: the PTX is JIT-compiled instead
    assert "image ptx" in _with_fake_driver(fake_libcuda, code, FAKE_CUDA_CC="90", FAKE_CUDA_REJECT="cubin")
    # a newer device than the artifact's arch: the PTX (forward compatible)
    assert "image ptx" in _with_fake_driver(fake_libcuda, code, FAKE_CUDA_CC="91")
    # an older device: refused with the reason
    old = f"""
from pbsdk.core.errors import DeviceUnavailableError
from pbsdk.targets.nvgpu import runtime
try:
    runtime.load_file({str(path)!r})
except DeviceUnavailableError as exc:
    print("refused", exc)
"""
    assert "refused artifact compiled for sm_90 cannot run on this GPU (compute capability 8.0)" in \
        _with_fake_driver(fake_libcuda, old, FAKE_CUDA_CC="80")


def test_runtime_checks_arguments(fake_libcuda: Path, tmp_path: Path) -> None:
    path = tmp_path / "k.pbsdk"
    path.write_bytes(bundle.pack(HEADER, {"ptx": b".version 8.0"}))
    code = f"""
import numpy as np
from pbsdk.core.errors import ArgumentError
from pbsdk.targets.nvgpu import runtime
k = runtime.load_file({str(path)!r})
for args in [(), (np.zeros(5, np.float32),), (np.zeros(4, np.float64),)]:
    try:
        k(*args)
    except ArgumentError as exc:
        print("refused:", exc)
"""
    out = _with_fake_driver(fake_libcuda, code, FAKE_CUDA_CC="90")
    assert "expected 1 arguments, got 0" in out and "shape (5,), expected (4,)" in out
    assert "dtype float64, expected f32" in out
