"""The runtime's GPU path: an nvgpu entry run through the CUDA driver API, reached with ctypes.

Needs numpy, ctypes and the standard library only (``libcuda.so.1`` comes with the NVIDIA driver; no CUDA
toolkit, no compiler). Loading an entry picks its module image — the cubin when the device's compute
capability equals the code's architecture, else the PTX, which the driver JIT-compiles for a device of
that architecture or newer — loads it (``cuModuleLoadData``), finds its kernels (``cuModuleGetFunction``),
uploads its weights once from the file's map and allocates its temporaries once. A call copies the
inputs in (``cuMemcpyHtoD``), launches every kernel of the plan in order (``cuLaunchKernel``; every
argument a bare device pointer), synchronises and copies the outputs back.

A host without a driver, whose driver finds no device (``cuInit`` fails) or whose device is older than
the code is refused with `DeviceUnavailableError` (a `TargetMismatchError`, C status ``PBSDK_ERR_TARGET``)
saying which. ``PBSDK_LIBCUDA`` names another driver library (the tests use a fake one that records launches).
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
from collections.abc import Sequence
from typing import Any

import numpy as np

from pbsdk.runtime import format as fmt
from pbsdk.runtime.entry import Entry, _numpy_dtype
from pbsdk.runtime.errors import DeviceError, DeviceUnavailableError, FormatError

_CC_MAJOR, _CC_MINOR = 75, 76  # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_{MAJOR,MINOR}
_SIGNATURES: dict[str, list[Any]] = {
    "cuMemAlloc_v2": [ctypes.POINTER(ctypes.c_uint64), ctypes.c_size_t],
    "cuMemFree_v2": [ctypes.c_uint64],
    "cuMemcpyHtoD_v2": [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t],
    "cuMemcpyDtoH_v2": [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_size_t],
    "cuModuleLoadData": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p],
    "cuModuleGetFunction": [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p],
    "cuLaunchKernel": [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p],
}


class Driver:
    """The driver entry points pbsdk uses, from ``libcuda.so.1`` (or ``$PBSDK_LIBCUDA``), initialised. Shared
    by this runtime and the nvgpu target's in-process runtime (`pbsdk.targets.nvgpu.runtime`), which
    raises its own error types by overriding `unavailable` and `failed`."""

    def __init__(self) -> None:
        name = os.environ.get("PBSDK_LIBCUDA", "libcuda.so.1")
        try:
            self.lib = ctypes.CDLL(name)
        except OSError as exc:
            raise self.unavailable(f"no NVIDIA driver on this host ({name}: {exc}): GPU code (nvgpu) runs only "
                                   "where a GPU and its driver are", reason="no-driver") from None
        rc = self._symbol(name, "cuInit")(0)
        if rc != 0:
            raise self.unavailable(f"the CUDA driver found no usable GPU for GPU code (nvgpu) (cuInit returned {rc}: "
                                   f"{self.error_name(rc)})", reason="no-device", code=rc)
        for fn, argtypes in _SIGNATURES.items():
            self._symbol(name, fn).argtypes = argtypes
        count = ctypes.c_int(0)
        rc = self.lib.cuDeviceGetCount(ctypes.byref(count))
        if rc != 0 or count.value == 0:
            raise self.unavailable("the CUDA driver reports no GPU for GPU code (nvgpu)", reason="no-device",
                                   code=rc or None)
        self.count = count.value
        self._contexts: dict[int, tuple[ctypes.c_int, ctypes.c_void_p]] = {}
        self._lock = threading.Lock()

    def unavailable(self, message: str, *, reason: str, code: int | None = None) -> Exception:
        """The error for a host that cannot run GPU code."""
        return DeviceUnavailableError(message, reason=reason, code=code)

    def failed(self, message: str, *, call: str, code: int) -> Exception:
        """The error for a driver call that failed on a host with a GPU."""
        return DeviceError(message, call=call, code=code)

    def _symbol(self, library: str, fn: str) -> Any:
        try:
            return getattr(self.lib, fn)
        except AttributeError:
            raise self.unavailable(f"{library} is not a CUDA driver pbsdk can use for GPU code (nvgpu): it lacks "
                                   f"{fn}", reason="no-driver") from None

    def error_name(self, rc: int) -> str:
        s = ctypes.c_char_p()
        if self.lib.cuGetErrorString(rc, ctypes.byref(s)) != 0 or not s.value:
            return "?"
        return s.value.decode(errors="replace")

    def check(self, rc: int, call: str) -> None:
        if rc != 0:
            raise self.failed(f"{call} failed: CUDA error {rc} ({self.error_name(rc)})", call=call, code=rc)

    def _device(self, device: int) -> tuple[ctypes.c_int, ctypes.c_void_p]:
        """GPU ``device``'s handle and retained primary context."""
        with self._lock:
            if device not in self._contexts:
                if not 0 <= device < self.count:
                    raise self.unavailable(f"GPU {device} requested; this host has {self.count}", reason="no-device")
                dev, ctx = ctypes.c_int(), ctypes.c_void_p()
                self.check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
                self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
                self._contexts[device] = (dev, ctx)
            return self._contexts[device]

    def context(self, device: int = 0) -> ctypes.c_void_p:
        """Make GPU ``device``'s primary context current on the calling thread, and return it."""
        ctx = self._device(device)[1]
        self.check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        return ctx

    def capability(self, device: int = 0) -> tuple[int, int]:
        dev = self._device(device)[0]
        major, minor = ctypes.c_int(), ctypes.c_int()
        for value, attr in ((major, _CC_MAJOR), (minor, _CC_MINOR)):
            self.check(self.lib.cuDeviceGetAttribute(ctypes.byref(value), attr, dev), "cuDeviceGetAttribute")
        return major.value, minor.value

    def alloc(self, nbytes: int) -> int:
        ptr = ctypes.c_uint64()
        self.check(self.lib.cuMemAlloc_v2(ctypes.byref(ptr), max(1, nbytes)), "cuMemAlloc")
        return ptr.value

    def free(self, ptr: int) -> None:
        self.lib.cuMemFree_v2(ptr)


_driver: Driver | None = None
_driver_lock = threading.Lock()


def driver() -> Driver:
    """The process's driver (made on first use); `DeviceUnavailableError` without a driver or a GPU."""
    global _driver
    with _driver_lock:
        if _driver is None:
            _driver = Driver()
        return _driver


def sm_version(arch: str) -> tuple[int, int]:
    """``"sm_90"`` -> (9, 0); ``"sm_86"`` -> (8, 6)."""
    digits = "".join(ch for ch in arch.split("_")[-1] if ch.isdigit())
    return int(digits[:-1] or 0), int(digits[-1:] or 0)


def _buffer_bytes(buffer: fmt.DeviceBuffer) -> int:
    return math.prod(buffer.shape) * _numpy_dtype(buffer.dtype).itemsize


class CudaEntry(Entry):
    """An nvgpu entry loaded on the GPU (see the module docstring). Calls are serialised per entry (its
    temporaries are shared by its launches)."""

    def __init__(self, desc: fmt.EntryDesc, data: np.ndarray, manifest: fmt.Manifest) -> None:
        super().__init__(desc)
        assert desc.device is not None
        self.plan = desc.device
        self._drv = driver()
        self._drv.context()
        self._device_memory: list[int] = []
        self.module = ctypes.c_void_p()
        self.image_kind = self._load_module(data, manifest)
        self._functions: dict[str, ctypes.c_void_p] = {}
        for launch in self.plan.launches:
            if launch.kernel not in self._functions:
                fn = ctypes.c_void_p()
                self._drv.check(self._drv.lib.cuModuleGetFunction(ctypes.byref(fn), self.module,
                                                                  launch.kernel.encode()),
                                f"cuModuleGetFunction({launch.kernel})")
                self._functions[launch.kernel] = fn
        self._resident = self._upload(data, manifest)
        self._lock = threading.Lock()

    def _images(self) -> list[tuple[str, int]]:
        have, want = self._drv.capability(), sm_version(self.plan.arch)
        chosen = [(k, s) for k, s in self.plan.images if (k == "cubin" and have == want) or (k == "ptx" and have >= want)]
        if not chosen:
            raise DeviceUnavailableError(f"entry {self.name!r} was compiled for {self.plan.arch}; this GPU has compute "
                                         f"capability {have[0]}.{have[1]}", reason="arch")
        return sorted(chosen, key=lambda c: c[0] != "cubin")  # the cubin first: no JIT at load

    def _load_module(self, data: np.ndarray, manifest: fmt.Manifest) -> str:
        errors, rc = [], 0
        for kind, index in self._images():
            s = manifest.sections[index]
            image = bytes(data[s.offset:s.offset + s.size]) + (b"\0" if kind == "ptx" else b"")
            self._image = ctypes.create_string_buffer(image, len(image))
            rc = self._drv.lib.cuModuleLoadData(ctypes.byref(self.module), self._image)
            if rc == 0:
                return kind
            errors.append(f"{kind}: CUDA error {rc} ({self._drv.error_name(rc)})")
        raise DeviceError(f"entry {self.name!r}: the driver refused every image ({'; '.join(errors)})",
                          call="cuModuleLoadData", code=rc)

    def _upload(self, data: np.ndarray, manifest: fmt.Manifest) -> dict[int, int]:
        """Device memory for every weight (copied from the file's map) and temporary, by buffer index."""
        resident = {}
        for i, buffer in enumerate(self.plan.buffers):
            if buffer.role == "arg":
                continue
            ptr = self._drv.alloc(_buffer_bytes(buffer))
            self._device_memory.append(ptr)
            resident[i] = ptr
            if buffer.role == "weight":
                s = manifest.sections[buffer.section]
                if s.size != _buffer_bytes(buffer):
                    raise FormatError(f"entry {self.name!r}: weight {s.name!r} holds {s.size} bytes, its buffer "
                                      f"{_buffer_bytes(buffer)}")
                self._drv.check(self._drv.lib.cuMemcpyHtoD_v2(ptr, data.ctypes.data + s.offset, s.size),
                                "cuMemcpyHtoD")
        return resident

    def launch(self, pointers: Sequence[int], *, stream: int = 0) -> None:
        """Launch every kernel of the plan in order on the device addresses of the inputs then outputs."""
        base = list(pointers)
        for launch in self.plan.launches:
            values = [ctypes.c_uint64((base[b] if b < len(base) else self._resident[b]) + offset)
                      for b, offset in launch.args]
            params = (ctypes.c_void_p * len(values))(*[ctypes.addressof(v) for v in values])
            self._drv.check(self._drv.lib.cuLaunchKernel(self._functions[launch.kernel], *launch.grid, *launch.block,
                                                         launch.shared_bytes, stream, params, None),
                            f"cuLaunchKernel({launch.kernel})")

    def _run(self, arrays: list[np.ndarray], outs: list[np.ndarray]) -> None:
        drv = self._drv
        with self._lock:
            drv.context()
            ptrs: list[int] = []
            try:
                for a in (*arrays, *outs):
                    ptrs.append(drv.alloc(a.nbytes))
                for a, p in zip(arrays, ptrs):
                    drv.check(drv.lib.cuMemcpyHtoD_v2(p, a.ctypes.data, a.nbytes), "cuMemcpyHtoD")
                self.launch(ptrs)
                drv.check(drv.lib.cuCtxSynchronize(), "cuCtxSynchronize")
                for o, p in zip(outs, ptrs[len(arrays):]):
                    drv.check(drv.lib.cuMemcpyDtoH_v2(o.ctypes.data, p, o.nbytes), "cuMemcpyDtoH")
            finally:
                for p in ptrs:
                    drv.free(p)

    def close(self) -> None:
        """Free the entry's device memory and unload its module (also done when it is collected)."""
        for ptr in self._device_memory:
            self._drv.free(ptr)
        self._device_memory.clear()
        if self.module.value:
            self._drv.lib.cuModuleUnload(self.module)
            self.module = ctypes.c_void_p()

    def __del__(self) -> None:
        with contextlib.suppress(Exception):  # interpreter shutdown: the driver may be gone already
            self.close()


__all__ = ["CudaEntry", "Driver", "driver", "sm_version"]
