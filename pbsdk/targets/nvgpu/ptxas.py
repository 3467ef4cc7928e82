"""Assembling PTX with ``ptxas`` and checking its resource report against the chip spec. MLIR-free.

``ptxas -v`` reports, per kernel, e.g.::

    ptxas info    : Compiling entry function 'main_kernel' for 'sm_80'
    ptxas info    : Function properties for main_kernel
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 32 registers, used 0 barriers, 6144 bytes smem, 368 bytes cmem[0]

`parse_resources` reads that into one `KernelResources` per kernel; `check_resources` raises a
`CompileError` naming the kernel and the limit when a kernel needs more registers per thread, registers
per block or shared memory per block than the spec allows, or spills (unless spills are allowed).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from pbsdk.core.errors import CompileError


@dataclasses.dataclass(frozen=True)
class KernelResources:
    """What ``ptxas -v`` reports for one kernel."""

    kernel: str
    registers: int = 0
    shared_bytes: int = 0
    stack_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    barriers: int = 0


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_PROPS = re.compile(r"Function properties for (\S+)")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BAR = re.compile(r"used (\d+) barriers")


def parse_resources(text: str) -> dict[str, KernelResources]:
    """Per-kernel resources from ``ptxas -v`` output (stderr)."""
    out: dict[str, dict[str, Any]] = {}
    current: str | None = None
    for line in text.splitlines():
        m = _ENTRY.search(line) or _PROPS.search(line)
        if m:
            current = m.group(1)
            out.setdefault(current, {"kernel": current})
            continue
        if current is None:
            continue
        f = _FRAME.search(line)
        if f:
            out[current].update(stack_bytes=int(f.group(1)), spill_stores=int(f.group(2)),
                                spill_loads=int(f.group(3)))
        u = _USED.search(line)
        if u:
            out[current]["registers"] = int(u.group(1))
            s = _SMEM.search(line)
            if s:
                out[current]["shared_bytes"] = int(s.group(1))
            b = _BAR.search(line)
            if b:
                out[current]["barriers"] = int(b.group(1))
    return {k: KernelResources(**v) for k, v in out.items()}


def check_resources(resources: Mapping[str, KernelResources], *, threads: Mapping[str, int],
                    max_registers: int, max_registers_per_block: int, max_shared: int,
                    allow_spills: bool = False) -> None:
    """Raise `CompileError` (stage ``cubin``, naming kernel and limit) for a kernel over a limit."""
    for name, r in resources.items():
        if max_registers and r.registers > max_registers:
            raise CompileError(f"kernel '{name}' uses {r.registers} registers per thread; the spec allows "
                               f"{max_registers}", stage="cubin", op=name)
        n = threads.get(name, 0)
        if max_registers_per_block and n and r.registers * n > max_registers_per_block:
            raise CompileError(f"kernel '{name}' needs {r.registers} x {n} = {r.registers * n} registers per block; "
                               f"the spec allows {max_registers_per_block}", stage="cubin", op=name)
        if max_shared and r.shared_bytes > max_shared:
            raise CompileError(f"kernel '{name}' uses {r.shared_bytes} B of shared memory; the spec allows "
                               f"{max_shared} B per block", stage="cubin", op=name)
        if not allow_spills and (r.spill_stores or r.spill_loads):
            raise CompileError(f"kernel '{name}' spills registers ({r.spill_stores} B stores, {r.spill_loads} B "
                               "loads); pass options={'allow_spills': True} to accept", stage="cubin", op=name)


def find_ptxas() -> str | None:
    """``PBSDK_PTXAS``, else ``ptxas`` on PATH, else the one in the ``nvidia-cuda-nvcc`` wheel."""
    env = os.environ.get("PBSDK_PTXAS")
    if env:
        return env if Path(env).is_file() else None
    found = shutil.which("ptxas")
    if found:
        return found
    try:
        import nvidia.cuda_nvcc as wheel  # type: ignore[import-not-found]

        for root in getattr(wheel, "__path__", []):
            p = Path(root) / "bin" / "ptxas"
            if p.is_file():
                return str(p)
    except ImportError:
        pass
    return None


def assemble(ptx: str, arch: str, *, ptxas: str | None = None, opt: int = 3,
             extra: Sequence[str] = ()) -> tuple[bytes, dict[str, KernelResources], str]:
    """(cubin, resources, ptxas log). Raises `CompileError` when ptxas is missing or rejects the PTX."""
    exe = ptxas or find_ptxas()
    if exe is None:
        raise CompileError("ptxas not found (put CUDA's bin/ on PATH, set PBSDK_PTXAS, or pip install "
                           "nvidia-cuda-nvcc); pass options={'ptxas': False} for a PTX-only artifact",
                           stage="cubin")
    with tempfile.TemporaryDirectory(prefix="pbsdk-ptxas-") as tmp:
        src, dst = Path(tmp) / "kernels.ptx", Path(tmp) / "kernels.cubin"
        src.write_text(ptx)
        cmd = [exe, f"-arch={arch}", f"-O{opt}", "-v", *extra, str(src), "-o", str(dst)]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise CompileError(f"running ptxas failed: {exc}", stage="cubin") from exc
        log = proc.stderr + proc.stdout
        if proc.returncode != 0:
            raise CompileError(f"ptxas rejected the PTX: {log.strip()[:2000]}", stage="cubin")
        return dst.read_bytes(), parse_resources(log), log
