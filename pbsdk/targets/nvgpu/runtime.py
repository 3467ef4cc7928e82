"""Loading and launching nvgpu artifacts through the CUDA driver API — no MLIR needed.

Imports only the standard library, numpy and (lazily) torch; the driver is reached with ctypes on
``libcuda.so.1`` through `pbsdk.runtime.cuda.Driver` (the deploy runtime's: one binding in pbsdk), so the machine that runs kernels needs the NVIDIA driver and nothing from pbsdk's
compiler side. Usage::

    from pbsdk.targets.nvgpu.runtime import load
    k = load(open("k.pbsdk", "rb").read())      # or load_file("k.pbsdk")
    c = k(a, b)                                 # numpy in, numpy out (copies to and from the device)
    c = k(ta, tb)                               # torch CUDA tensors in, torch CUDA tensors out, no copies

Without a driver or a device, `load` raises `DeviceUnavailableError` saying which is missing; reading an
artifact (`read`) works anywhere.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import ml_dtypes  # noqa: F401  (registers numpy's "bfloat16": bf16 results come back as ml_dtypes.bfloat16)
import numpy as np

from pbsdk.core.errors import ArgumentError, DeviceUnavailableError, PbsdkError
from pbsdk.runtime import cuda
from pbsdk.targets.nvgpu import bundle

#: Byte alignment every kernel argument must have (cuMemAlloc gives 256; the widest kernel access is 16).
ALIGNMENT = 16
_ITEMSIZE = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1}
_NUMPY_OK = {"f64": ("float64",), "f32": ("float32",), "f16": ("float16",), "bf16": ("bfloat16", "uint16"),
             "i64": ("int64",), "i32": ("int32",), "i16": ("int16",), "i8": ("int8",)}
_NUMPY_OUT = {"f64": "float64", "f32": "float32", "f16": "float16", "bf16": "bfloat16", "i64": "int64",
              "i32": "int32", "i16": "int16", "i8": "int8"}
_TORCH = {"torch.float64": "f64", "torch.float32": "f32", "torch.float16": "f16", "torch.bfloat16": "bf16",
          "torch.int64": "i64", "torch.int32": "i32", "torch.int16": "i16", "torch.int8": "i8"}


class CudaError(PbsdkError):
    """A CUDA driver call failed on a machine that has a device (the message names the call)."""


def read(data: bytes) -> tuple[dict[str, Any], dict[str, bytes]]:
    """Parse an artifact's bytes: (header, blobs). Works without a GPU; raises `ArgumentError` if malformed."""
    try:
        return bundle.unpack(data)
    except bundle.BundleError as exc:
        raise ArgumentError(str(exc)) from None


class _Driver(cuda.Driver):
    """The deploy runtime's driver (`pbsdk.runtime.cuda.Driver`: one ctypes binding of ``libcuda`` in
    pbsdk), raising this module's errors: `DeviceUnavailableError` and `CudaError`."""

    def unavailable(self, message: str, *, reason: str, code: int | None = None) -> Exception:
        return DeviceUnavailableError(message)

    def failed(self, message: str, *, call: str, code: int) -> Exception:
        return CudaError(message)


_driver: _Driver | None = None
_driver_lock = threading.Lock()


def driver() -> _Driver:
    """The process's driver handle; `DeviceUnavailableError` without a driver or a GPU."""
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = _Driver()
        return _driver


def available() -> bool:
    """Whether a CUDA device can be used here."""
    try:
        driver()
        return True
    except PbsdkError:
        return False


class LoadedArtifact:
    """An artifact's module loaded on one GPU; call it with numpy arrays or torch CUDA tensors."""

    def __init__(self, data: bytes, *, device: int = 0) -> None:
        self.header, self.blobs = read(data)
        self.device = device
        drv = driver()
        drv.context(device)
        cc = drv.capability(device)
        want = cuda.sm_version(str(self.header.get("arch", "sm_0")))
        # The cubin when it was built for exactly this device; otherwise (or when this driver cannot load a
        # cubin from a newer ptxas) the PTX, which the driver JIT-compiles for the device.
        images = []
        if "cubin" in self.blobs and cc == want:
            images.append(("cubin", self.blobs["cubin"]))
        if "ptx" in self.blobs and cc >= want:
            images.append(("ptx", self.blobs["ptx"] + b"\0"))
        if not images:
            raise DeviceUnavailableError(f"artifact compiled for {self.header.get('arch')} cannot run on this GPU "
                                         f"(compute capability {cc[0]}.{cc[1]})")
        self.module = ctypes.c_void_p()
        errors = []
        for kind, image in images:
            self._image = ctypes.create_string_buffer(image, len(image))
            rc = drv.lib.cuModuleLoadData(ctypes.byref(self.module), self._image)
            if rc == 0:
                self.image_kind = kind
                break
            errors.append(f"{kind}: CUDA error {rc} ({drv.error_name(rc)})")
        else:
            raise CudaError(f"cuModuleLoadData failed for every image in the artifact: {'; '.join(errors)}")
        self.load_errors = errors
        self.functions: dict[str, ctypes.c_void_p] = {}
        for launch in self.header["launches"]:
            name = launch["kernel"]
            if name not in self.functions:
                fn = ctypes.c_void_p()
                drv.check(drv.lib.cuModuleGetFunction(ctypes.byref(fn), self.module, name.encode()),
                          f"cuModuleGetFunction({name})")
                self.functions[name] = fn
        self.buffers = self.header["buffers"]
        self.inputs = [(tuple(s), d) for s, d in self.header["inputs"]]
        self.outputs = [(tuple(s), d) for s, d in self.header["outputs"]]
        self._temps: dict[int, int] = {}
        for i, buf in enumerate(self.buffers):  # constants: uploaded once, read by every launch
            if buf.get("role") == "const":
                blob = self.blobs.get(str(buf.get("blob")))
                if blob is None or len(blob) != self._bytes(buf):
                    raise CudaError(f"artifact: constant buffer {i} has no blob of {self._bytes(buf)} bytes")
                ptr = self._temp(i)
                host = ctypes.create_string_buffer(blob, len(blob))
                drv.check(drv.lib.cuMemcpyHtoD_v2(ctypes.c_uint64(ptr), host, len(blob)), "cuMemcpyHtoD")

    # ----------------------------------------------------------------------------------------- memory
    @staticmethod
    def _bytes(buf: dict[str, Any]) -> int:
        return math.prod(buf["shape"]) * _ITEMSIZE[buf["dtype"]]

    def _alloc(self, nbytes: int) -> int:
        drv = driver()
        ptr = ctypes.c_uint64()
        drv.check(drv.lib.cuMemAlloc_v2(ctypes.byref(ptr), max(1, nbytes)), "cuMemAlloc")
        return ptr.value

    def _temp(self, index: int) -> int:
        if index not in self._temps:
            self._temps[index] = self._alloc(self._bytes(self.buffers[index]))
        return self._temps[index]

    def close(self) -> None:
        """Free device temporaries and unload the module (also done when the object is collected)."""
        if _driver is None:
            return
        for ptr in self._temps.values():
            _driver.lib.cuMemFree_v2(ptr)
        self._temps.clear()
        if getattr(self, "module", None) is not None and self.module.value:
            _driver.lib.cuModuleUnload(self.module)
            self.module = ctypes.c_void_p()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the driver may be gone already
            self.close()

    # ----------------------------------------------------------------------------------------- launching
    def launch(self, pointers: Sequence[int], *, stream: int = 0) -> None:
        """Launch every kernel in order on device pointers (inputs then outputs), asynchronously."""
        drv = driver()
        drv.context(self.device)
        n_args = len(self.inputs) + len(self.outputs)
        if len(pointers) != n_args:
            raise ArgumentError(f"{self.header['entry']}: expected {n_args} device pointers, got {len(pointers)}")
        base = [int(p) for p in pointers] + [0] * (len(self.buffers) - n_args)
        for launch in self.header["launches"]:
            values = []
            for a in launch["args"]:
                i = int(a["buffer"])
                ptr = base[i] if i < n_args else self._temp(i)
                values.append(ctypes.c_uint64(ptr + int(a["offset"])))
            params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
            gx, gy, gz = launch["grid"]
            bx, by, bz = launch["block"]
            drv.check(drv.lib.cuLaunchKernel(self.functions[launch["kernel"]], gx, gy, gz, bx, by, bz,
                                             int(launch.get("shared_bytes", 0)), ctypes.c_void_p(stream), params,
                                             None), f"cuLaunchKernel({launch['kernel']})")

    def synchronize(self) -> None:
        drv = driver()
        drv.check(drv.lib.cuCtxSynchronize(), "cuCtxSynchronize")

    def _check(self, i: int, shape: tuple[int, ...], dtype: str, got_shape: Any, got_dtype: str) -> None:
        if tuple(got_shape) != tuple(shape):
            raise ArgumentError(f"{self.header['entry']}: argument {i} has shape {tuple(got_shape)}, expected {shape}")
        if got_dtype != dtype:
            raise ArgumentError(f"{self.header['entry']}: argument {i} has dtype {got_dtype}, expected {dtype}")

    def run(self, arrays: Sequence[np.ndarray]) -> None:
        """numpy buffers, inputs then preallocated outputs (contiguous): copy in, launch, copy out."""
        drv = driver()
        drv.context(self.device)
        ptrs = []
        try:
            for arr in arrays:
                ptr = self._alloc(arr.nbytes)
                ptrs.append(ptr)
            for arr, ptr in zip(arrays[:len(self.inputs)], ptrs):
                drv.check(drv.lib.cuMemcpyHtoD_v2(ptr, arr.ctypes.data, arr.nbytes), "cuMemcpyHtoD")
            self.launch(ptrs)
            self.synchronize()
            for arr, ptr in zip(arrays[len(self.inputs):], ptrs[len(self.inputs):]):
                drv.check(drv.lib.cuMemcpyDtoH_v2(arr.ctypes.data, ptr, arr.nbytes), "cuMemcpyDtoH")
        finally:
            for ptr in ptrs:
                drv.lib.cuMemFree_v2(ptr)

    def __call__(self, *args: Any) -> Any:
        if len(args) != len(self.inputs):
            raise ArgumentError(f"{self.header['entry']}: expected {len(self.inputs)} arguments, got {len(args)}")
        if args and all(getattr(a, "is_cuda", False) for a in args):
            return self._call_torch(args)
        arrays = []
        for i, (a, (shape, dtype)) in enumerate(zip(args, self.inputs)):
            a = np.ascontiguousarray(a)
            if a.dtype.name not in _NUMPY_OK[dtype]:
                raise ArgumentError(f"{self.header['entry']}: argument {i} has dtype {a.dtype}, expected {dtype}")
            self._check(i, shape, dtype, a.shape, dtype)
            arrays.append(a)
        outs = [np.empty(shape, _NUMPY_OUT[dtype]) for shape, dtype in self.outputs]
        self.run(arrays + outs)
        return outs[0] if len(outs) == 1 else tuple(outs)

    def _call_torch(self, args: Sequence[Any]) -> Any:
        import torch  # only when torch tensors are passed

        for i, (t, (shape, dtype)) in enumerate(zip(args, self.inputs)):
            self._check(i, shape, dtype, t.shape, _TORCH.get(str(t.dtype), str(t.dtype)))
        # Kernels may load 16-byte vectors (the attention tiles): a contiguous view that does not start on a
        # 16-byte boundary (e.g. x[1:]) is copied, like a non-contiguous one.
        args = [t if t.is_contiguous() and t.data_ptr() % ALIGNMENT == 0
                else t.clone(memory_format=torch.contiguous_format) for t in args]
        device = args[0].device
        rev = {v: k for k, v in _TORCH.items()}
        outs = [torch.empty(shape, dtype=getattr(torch, rev[dtype].split(".")[1]), device=device)
                for shape, dtype in self.outputs]
        stream = torch.cuda.current_stream(device).cuda_stream
        self.launch([t.data_ptr() for t in list(args) + outs], stream=stream)
        return outs[0] if len(outs) == 1 else tuple(outs)


def load(data: bytes, *, device: int = 0) -> LoadedArtifact:
    """Load an artifact's bytes onto GPU ``device``; `DeviceUnavailableError` without one."""
    read(data)  # a malformed file is an ArgumentError even where there is no GPU
    return LoadedArtifact(data, device=device)


def load_file(path: str | Path, *, device: int = 0) -> LoadedArtifact:
    return load(Path(path).read_bytes(), device=device)
