"""Exports for the template target and nvgpu (issue #34).

template: the emulation's host code in the file, run by pbsdk.runtime (and the C API: test_c_api.py) with
outputs identical to the JIT's template run; from the API, the CLI (ONNX) and a target scaffolded by
``pbsdk new-target``. nvgpu: cubin and PTX sections and a launch plan; on a host without a GPU, loading is
a `DeviceUnavailableError` (a `TargetMismatchError`, C status PBSDK_ERR_TARGET) saying why; through a fake
driver (tests/nvgpu/data/fake_cuda.c) the launches, weights and copies follow the plan; on a GPU (marker
``gpu``) the outputs match numpy."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import pbsdk
import pbsdk.runtime
from pbsdk.runtime import format as fmt

REPO = Path(__file__).resolve().parents[2]
FAKE_DRIVER = REPO / "tests" / "nvgpu" / "data" / "fake_cuda.c"


def _manifest(path: Path) -> fmt.Manifest:
    data = path.read_bytes()
    return fmt.read_manifest(data, fmt.read_header(data))


# ------------------------------------------------------------------------------------------------- template

def test_template_export_equals_the_jit(exported_template) -> None:  # type: ignore[no-untyped-def]
    from pbsdk.core.spec import load_spec
    from pbsdk.deploy.cpu import spec_hash

    model = pbsdk.runtime.load(exported_template.path)
    np.testing.assert_array_equal(model(*exported_template.inputs), exported_template.expected[0])
    m = model.manifest
    assert (m.target, m.target_name, m.spec_name) == ("template", "", "example/npu")
    assert m.spec_hash == spec_hash(load_spec("example/npu"))
    assert (m.machine, m.system) == (platform.machine(), "Linux")  # the emulation runs on the host
    (entry,) = m.entries
    assert entry.device is None and len(entry.constants) >= 1


def test_template_export_from_the_cli(tmp_path: Path) -> None:
    from test_frontends import _onnx_model

    import pbsdk.onnx
    from pbsdk.cli import main

    model_file = _onnx_model(tmp_path / "tiny.onnx")
    out = tmp_path / "tiny.pbsdk"
    assert main(["compile", str(model_file), "--target", "template", "-o", str(out)]) == 0
    x = np.random.default_rng(8).standard_normal((4, 64)).astype(np.float32)
    model = pbsdk.runtime.load(out)
    assert model.manifest.target == "template"
    np.testing.assert_array_equal(model(x), pbsdk.onnx.load(str(model_file), target="template")(x))


def test_template_export_runs_without_the_compiler(exported_template, runtime_python,  # type: ignore[no-untyped-def]
                                                   tmp_path) -> None:
    from test_isolated import run_in_venv

    outs = run_in_venv(runtime_python, exported_template.path, list(exported_template.inputs), tmp_path)
    np.testing.assert_array_equal(outs[0], exported_template.expected[0])


_SCAFFOLDED = r'''
import sys
import numpy as np, pbsdk, pbsdk.runtime
from pbsdk import ops
w = np.random.default_rng(0).standard_normal((32, 16)).astype(np.float32)
f = pbsdk.jit(lambda x: ops.relu(x @ w), target=sys.argv[1])
x = np.random.default_rng(1).standard_normal((8, 32)).astype(np.float32)
m = pbsdk.runtime.load(pbsdk.export(f, (x,), sys.argv[2]))
assert (m.manifest.target, m.manifest.target_name) == ("template", sys.argv[1]), m.manifest
assert np.array_equal(m(x), f(x))
print("identical")
'''


def test_scaffolded_target_exports(tmp_path: Path) -> None:
    """A target rendered by ``pbsdk new-target`` (a TemplateTarget subclass) exports as the template does."""
    from pbsdk.targets.template.newtarget import new_target

    done = new_target("dplnpu", REPO / "tests" / "bringup" / "data" / "tiny_npu.yaml", tmp_path / "dplnpu")
    site = tmp_path / "site"
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
           "--disable-pip-version-check", "--no-index", "--target", str(site), str(done.out)]
    installed = subprocess.run(pip, capture_output=True, text=True, timeout=300, check=False)
    assert installed.returncode == 0, installed.stderr[-3000:]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-c", _SCAFFOLDED, "dplnpu", str(tmp_path / "s.pbsdk")], env=env,
                         capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0 and "identical" in run.stdout, run.stdout[-3000:] + run.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------- nvgpu

def test_nvgpu_export_holds_kernels_plan_and_weights(exported_nvgpu) -> None:  # type: ignore[no-untyped-def]
    from pbsdk.targets.nvgpu import bundle

    m = _manifest(exported_nvgpu.path)
    header, blobs = bundle.unpack(exported_nvgpu.jit.payload)  # what the target compiled
    assert (m.target, m.machine, m.system, m.cpu_features) == ("nvgpu", header["arch"], "cuda", ())
    (entry,) = m.entries
    plan = entry.device
    assert plan is not None and plan.arch == header["arch"]
    data = exported_nvgpu.path.read_bytes()

    def section(i: int) -> bytes:
        return data[m.sections[i].offset:m.sections[i].offset + m.sections[i].size]

    images = dict(plan.images)
    assert section(images["cubin"]) == blobs["cubin"] and section(images["cubin"])[:4] == b"\x7fELF"
    assert section(images["ptx"]) == blobs["ptx"] and b".target " + header["arch"].encode() in blobs["ptx"]
    assert [(k.kernel, list(k.grid), list(k.block), k.shared_bytes) for k in plan.launches] == \
        [(k["kernel"], k["grid"], k["block"], k.get("shared_bytes", 0)) for k in header["launches"]]
    assert [list(map(list, k.args)) for k in plan.launches] == \
        [[[a["buffer"], a["offset"]] for a in k["args"]] for k in header["launches"]]
    weights = [b for b in plan.buffers if b.role == "weight"]
    assert len(weights) == 1 and tuple(entry.constants) == (weights[0].section,)
    # the bundle's constant bytes are the file's weight section
    assert section(weights[0].section) == blobs[next(b["blob"] for b in header["buffers"] if b["role"] == "const")]
    assert fmt.Manifest.from_json(m.to_json()) == m  # the plan round-trips through the manifest


def _gpu_present() -> bool:
    from pbsdk.runtime import cuda

    try:
        cuda.driver()
        return True
    except pbsdk.runtime.DeviceUnavailableError:
        return False


def test_nvgpu_load_without_a_gpu_is_a_typed_refusal(exported_nvgpu, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    if _gpu_present():
        pytest.skip("a GPU is present here: test_nvgpu_export_on_gpu_matches_numpy runs instead")
    with pytest.raises(pbsdk.runtime.DeviceUnavailableError) as info:
        pbsdk.runtime.load(exported_nvgpu.path)
    assert isinstance(info.value, pbsdk.runtime.TargetMismatchError)
    assert info.value.status == "PBSDK_ERR_TARGET" and info.value.reason in ("no-driver", "no-device")
    assert "GPU code (nvgpu)" in str(info.value)
    monkeypatch.setenv("PBSDK_LIBCUDA", "/nonexistent/libcuda.so.1")
    with pytest.raises(pbsdk.runtime.DeviceUnavailableError, match="no NVIDIA driver") as info:
        pbsdk.runtime.load(exported_nvgpu.path)
    assert info.value.reason == "no-driver"


@pytest.fixture(scope="module")
def fake_drivers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The recording fake driver, and one whose cuInit fails with CUDA_ERROR_NO_DEVICE (100)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler for the fake CUDA drivers")
    out = tmp_path_factory.mktemp("fakecuda")
    nodev = out / "nodevice.c"
    nodev.write_text("int cuInit(unsigned f) { (void)f; return 100; }\n"
                     "int cuGetErrorString(int rc, const char **s) { (void)rc; *s = \"no CUDA-capable device\"; return 0; }\n")
    libs = {"recording": out / "libfakecuda.so", "no-device": out / "libnodevice.so"}
    for src, lib in ((FAKE_DRIVER, libs["recording"]), (nodev, libs["no-device"])):
        subprocess.run([cc, "-shared", "-fPIC", "-O1", "-o", str(lib), str(src)], check=True, timeout=120)
    return libs


_THROUGH_FAKE = r'''
import ctypes, os, sys
import numpy as np, pbsdk.runtime
model = pbsdk.runtime.load(sys.argv[1])
entry = model.entry(model.manifest.entries[0].name)
print("image", entry.image_kind)
y = model(np.load(sys.argv[2]))
print("out", y.dtype, y.shape)
log = ctypes.CDLL(os.environ["PBSDK_LIBCUDA"]).fake_log
log.restype = ctypes.c_char_p
plan = entry.plan
for line, launch in zip(log().decode().splitlines(), plan.launches):
    name, grid, block, shared, *ptrs = line.split()
    print("launch", name, grid, block, shared)
    for (b, offset), ptr in zip(launch.args, ptrs):  # a weight's device copy holds the file's bytes
        if plan.buffers[b].role == "weight":
            s = model.manifest.sections[plan.buffers[b].section]
            same = ctypes.string_at(int(ptr) - offset, s.size) == open(sys.argv[1], "rb").read()[s.offset:s.offset + s.size]
            print("weight", b, "uploaded" if same else "differs")
'''


def test_nvgpu_runs_through_the_driver(exported_nvgpu, fake_drivers, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The runtime's CUDA path on a fake driver (host memory, launches recorded): the cubin is loaded on a
    device of its arch, kernels are launched in the plan's order with its grid, block and shared memory,
    and the weight arguments point at device copies of the file's weights."""
    np.save(tmp_path / "x.npy", exported_nvgpu.inputs[0])
    plan = _manifest(exported_nvgpu.path).entries[0].device
    assert plan is not None
    # the fake logs the first FAKE_CUDA_NARGS arguments of every launch: no more than the fewest any has
    nargs = min(len(k.args) for k in plan.launches)
    env = {**os.environ, "PBSDK_LIBCUDA": str(fake_drivers["recording"]), "FAKE_CUDA_NARGS": str(nargs),
           "FAKE_CUDA_CC": "".join(map(str, _sm(plan.arch)))}
    run = subprocess.run([sys.executable, "-c", _THROUGH_FAKE, str(exported_nvgpu.path), str(tmp_path / "x.npy")],
                         env=env, capture_output=True, text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    assert "image cubin" in lines and "out float16 (16, 32)" in lines
    launched = [ln.split()[1:] for ln in lines if ln.startswith("launch ")]
    assert launched == [[k.kernel, ",".join(map(str, k.grid)), ",".join(map(str, k.block)), str(k.shared_bytes)]
                        for k in plan.launches]
    assert any(ln.startswith("weight") for ln in lines) and not any(ln.endswith("differs") for ln in lines)


def _sm(arch: str) -> tuple[int, int]:
    from pbsdk.runtime.cuda import sm_version

    return sm_version(arch)


_LOAD = r'''
import sys, pbsdk.runtime
try:
    m = pbsdk.runtime.load(sys.argv[1])
except pbsdk.runtime.DeviceUnavailableError as exc:
    print("refused", exc.reason, exc.code, exc.status, exc)
else:
    print("image", next(iter(m.entries.values())).image_kind)
'''


@pytest.mark.parametrize("case", ["no-device", "older-gpu", "newer-gpu"])
def test_nvgpu_refusals_and_fallback(case: str, exported_nvgpu, fake_drivers) -> None:  # type: ignore[no-untyped-def]
    env = dict(os.environ)
    if case == "no-device":
        env["PBSDK_LIBCUDA"] = str(fake_drivers["no-device"])
    else:
        env.update(PBSDK_LIBCUDA=str(fake_drivers["recording"]), FAKE_CUDA_CC="70" if case == "older-gpu" else "99")
    run = subprocess.run([sys.executable, "-c", _LOAD, str(exported_nvgpu.path)], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    if case == "no-device":
        assert run.stdout.startswith("refused no-device 100 PBSDK_ERR_TARGET"), run.stdout
        assert "cuInit returned 100: no CUDA-capable device" in run.stdout
    elif case == "older-gpu":
        assert run.stdout.startswith("refused arch None PBSDK_ERR_TARGET"), run.stdout
        assert "compute capability 7.0" in run.stdout
    else:  # a newer GPU than the cubin's: the driver JIT-compiles the PTX
        assert run.stdout.startswith("image ptx"), run.stdout


@pytest.mark.parametrize("where", ["cubin", "ptx", "weight0"])
def test_damaged_kernel_blob_is_a_checksum_error(where: str, exported_nvgpu, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """Damage inside a kernel image or a weight is found before any driver is asked (so also here)."""
    path = tmp_path / "d.pbsdk"
    data = bytearray(exported_nvgpu.path.read_bytes())
    s = next(s for s in _manifest(exported_nvgpu.path).sections if s.name.endswith("." + where))
    data[s.offset + s.size // 2] ^= 0x40
    path.write_bytes(bytes(data))
    with pytest.raises(pbsdk.runtime.ChecksumError) as info:
        pbsdk.runtime.load(path)
    assert info.value.section == s.name and info.value.status == "PBSDK_ERR_CHECKSUM"


def test_nvgpu_file_damage_and_mismatch(exported_nvgpu, exported_mlp, tmp_path) -> None:  # type: ignore[no-untyped-def]
    truncated = tmp_path / "t.pbsdk"
    truncated.write_bytes(exported_nvgpu.path.read_bytes()[:1000])
    with pytest.raises(pbsdk.runtime.TruncatedError):
        pbsdk.runtime.load(truncated)
    # a cpu file claiming to be GPU code has no launch plan; a GPU file claiming to be host code has one
    for src, target in ((exported_mlp.path, "nvgpu"), (exported_nvgpu.path, "cpu")):
        path = tmp_path / f"as-{target}.pbsdk"
        shutil.copy(src, path)
        fmt.rewrite_manifest(str(path), lambda m, t=target: {**m, "target": t, "machine": platform.machine(),
                                                               "system": "Linux"})
        with pytest.raises(pbsdk.runtime.FormatError, match="device plan"):
            pbsdk.runtime.load(path)
    # the target's own kernel bundle is not a deploy artifact, and says what to do with it
    bundle_file = tmp_path / "k.pbsdk"
    bundle_file.write_bytes(exported_nvgpu.jit.payload)
    with pytest.raises(pbsdk.runtime.FormatError, match="nvgpu kernel bundle"):
        pbsdk.runtime.load(bundle_file)


_ISOLATED_NVGPU = r'''
import pbsdk.runtime
try:
    pbsdk.runtime.load(sys.argv[1])
    print("loaded")
except pbsdk.runtime.DeviceUnavailableError as exc:
    print("refused", exc.reason)
'''


def test_nvgpu_path_imports_nothing_of_the_compiler(exported_nvgpu, runtime_python,  # type: ignore[no-untyped-def]
                                                    tmp_path) -> None:
    """pbsdk.runtime.cuda in the runtime's own environment (`test_isolated`: the pbsdk-runtime wheel and
    numpy, nothing of the compiler, MLIR or ml_dtypes to be found): an nvgpu file loads where a GPU is and
    is refused with its reason otherwise."""
    from test_isolated import CHECKS

    script = tmp_path / "run.py"
    script.write_text(CHECKS + _ISOLATED_NVGPU)
    done = subprocess.run([str(runtime_python), "-I", str(script), str(exported_nvgpu.path)],
                          check=False, capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("loaded" if _gpu_present() else "refused"), done.stdout


@pytest.mark.gpu
def test_nvgpu_export_on_gpu_matches_numpy(exported_nvgpu) -> None:  # type: ignore[no-untyped-def]
    """On a GPU host: the file loads through the driver (cubin on the spec's arch, PTX on a newer one) and
    its output matches numpy (set PBSDK_GPU_SPEC to the GPU's spec to load the cubin)."""
    from pbsdk.testing import assert_close, tolerance

    model = pbsdk.runtime.load(exported_nvgpu.path)
    got = model(*exported_nvgpu.inputs)
    assert got.dtype == np.float16 and got.shape == exported_nvgpu.expected[0].shape
    assert_close(got.astype(np.float32), exported_nvgpu.expected[0], op="matmul",
                 tol=tolerance("matmul", "f16", reduction_size=64))
    again = model(*exported_nvgpu.inputs)  # weights and temporaries stay resident between calls
    np.testing.assert_array_equal(again, got)
