"""The nvgpu target's code for a deploy artifact: its kernel bundle taken apart into sections and a plan.

The target's artifact (`pbsdk.targets.nvgpu.bundle`) holds one PTX module (and, where ``ptxas`` ran, its
cubin for the spec's ``codegen.arch``), the launch plan its host function was read into (buffers,
launches: kernel, grid, block, dynamic shared memory, arguments) and the constants' bytes. The deploy file
keeps the same facts in its own terms: each image and each constant a section (constants are the entry's
weights, uploaded once at load), the plan a `pbsdk.runtime.format.DevicePlan` in the entry's manifest.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pbsdk.core.errors import PbsdkError
from pbsdk.core.ir.graph import DTYPE_TO_NUMPY
from pbsdk.core.target import Artifact
from pbsdk.runtime import format as fmt


@dataclasses.dataclass(frozen=True)
class DeviceCode:
    """An nvgpu entry ready to write: its payloads (section name, bytes) in order, and its plan, whose
    section indices count from the first of those payloads (`DevicePlan` after `placed`)."""

    arch: str
    payloads: tuple[tuple[str, bytes], ...]
    plan: fmt.DevicePlan

    def placed(self, first: int) -> fmt.DevicePlan:
        """The plan with its sections numbered from ``first`` (where the payloads land in the file)."""
        p = self.plan
        return dataclasses.replace(
            p, images=tuple((k, first + i) for k, i in p.images),
            buffers=tuple(dataclasses.replace(b, section=first + b.section) if b.role == "weight" else b
                          for b in p.buffers))


def _buffer(b: dict[str, Any], payloads: list[tuple[str, bytes]], blobs: dict[str, bytes],
            entry: str) -> fmt.DeviceBuffer:
    shape, dtype = tuple(int(d) for d in b["shape"]), DTYPE_TO_NUMPY[str(b["dtype"])]
    if b["role"] == "arg":
        return fmt.DeviceBuffer(shape, dtype, "arg")
    if b["role"] == "temp":
        return fmt.DeviceBuffer(shape, dtype, "temp")
    if b["role"] != "const" or str(b.get("blob")) not in blobs:
        raise PbsdkError(f"nvgpu bundle of {entry}: buffer {b} is not an argument, temporary or constant with bytes")
    payloads.append((f"{entry}.weight{sum(1 for n, _ in payloads if '.weight' in n)}", blobs[str(b["blob"])]))
    return fmt.DeviceBuffer(shape, dtype, "weight", len(payloads) - 1)


def device_code(artifact: Artifact, entry: str) -> DeviceCode:
    """Take ``artifact`` (kind ``nvgpu-artifact``) apart for the entry named ``entry`` (see the module)."""
    from pbsdk.targets.nvgpu import ARTIFACT_KIND, bundle

    if artifact.kind != ARTIFACT_KIND:
        raise PbsdkError(f"the nvgpu export takes an {ARTIFACT_KIND} artifact, got {artifact.kind!r}")
    payload = artifact.payload if isinstance(artifact.payload, bytes) else artifact.payload.encode()
    header, blobs = bundle.unpack(payload)
    n_args = len(header["inputs"]) + len(header["outputs"])
    roles = [b["role"] for b in header["buffers"]]
    if roles[:n_args] != ["arg"] * n_args or "arg" in roles[n_args:]:
        raise PbsdkError(f"nvgpu bundle of {entry}: its first {n_args} buffers must be the arguments, got {roles}")
    payloads: list[tuple[str, bytes]] = []
    images = []
    for kind in ("cubin", "ptx"):  # the cubin first: loaded as is where the device is exactly its arch
        if kind in blobs:
            payloads.append((f"{entry}.{kind}", blobs[kind]))
            images.append((kind, len(payloads) - 1))
    buffers = tuple(_buffer(b, payloads, blobs, entry) for b in header["buffers"])
    launches = tuple(fmt.KernelLaunch(str(k["kernel"]), tuple(k["grid"]), tuple(k["block"]),  # type: ignore[arg-type]
                                      int(k.get("shared_bytes", 0)),
                                      tuple((int(a["buffer"]), int(a["offset"])) for a in k["args"]))
                     for k in header["launches"])
    plan = fmt.DevicePlan(str(header["arch"]), tuple(images), buffers, launches)
    return DeviceCode(str(header["arch"]), tuple(payloads), plan)


__all__ = ["DeviceCode", "device_code"]
