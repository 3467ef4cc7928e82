"""The kernel benchmark suite (issue #3 item 6): ``pbsdk bench`` and ``benchmarks/suite.py``.

Runs pbsdk (cpu target), numpy (OpenBLAS), torch CPU eager and, for the fused kernels, torch.compile
(Inductor) side by side on f32 matmuls, a batched matmul, ResNet-50 conv2d layers, matmul+bias+GELU,
softmax and layernorm, at each requested thread count, and writes ``results.json``, ``table.md`` and
``benchmarks.png`` under ``--out``.

Method (the machine is a noisy shared VM, so every choice favours stable ratios over absolute numbers):

* Each thread count runs in a fresh worker process whose ``OMP_NUM_THREADS``, ``OPENBLAS_NUM_THREADS``
  and ``MKL_NUM_THREADS`` are set to it; the worker also calls ``torch.set_num_threads(n)`` and compiles
  pbsdk with ``options={"threads": n}``. No thread pool outlives its thread count.
* pbsdk compiles cold (``options={"cache": False}``); the time to trace, run the pipeline and JIT is
  recorded per case. Inductor's compile time (its first call) is recorded too, with its own on-disk
  cache as found.
* Every contender is checked against a float64 numpy reference with `pbsdk.testing.assert_close` (the
  tolerances of the numerics tests); a wrong pbsdk result fails the case whatever its speed.
* Timing: warm-up calls, then ``rounds`` rounds; in each round every contender runs one block of
  ``repeats`` back-to-back calls (all of one contender, then the next, so OpenBLAS's and OpenMP's spinning
  threads never fight each other) and the block's minimum is kept. The reported time is the median of
  the per-round minimums; ratios are ``baseline time / pbsdk time`` (> 1: pbsdk is faster).
* Every call returns a freshly allocated output, for every contender (nothing reuses a buffer). For
  large outputs this includes the page faults of a fresh mapping; ``--malloc-reuse`` runs the workers
  with glibc told to keep freed memory, which removes most of them, for all contenders alike.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import fnmatch
import gc
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pbsdk.core.errors import PbsdkError
from pbsdk.core.spec.calibrate import clock_now

SCHEMA = "pbsdk-bench/1"
CONTENDERS = ("pbsdk", "numpy", "torch", "inductor")
BASELINES = ("numpy", "torch", "inductor")
DEFAULT_OUT = Path("benchmarks") / "results"
DOCS_START = "<!-- bench-kernels-table:start -->"
DOCS_END = "<!-- bench-kernels-table:end -->"
MALLOC_REUSE_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}


# ------------------------------------------------------------------------------------------------- cases

@dataclasses.dataclass(frozen=True)
class Target:
    """A bar from issue #3: ``baseline time / pbsdk time >= ratio`` (or compile time <= seconds)."""

    baseline: str
    ratio: float


@dataclasses.dataclass(frozen=True)
class Case:
    """One benchmark: a family (which builder makes its workload), full-size and ``--quick`` dims."""

    name: str
    family: str
    dims: dict[str, Any]
    quick: dict[str, Any]
    targets: tuple[Target, ...] = ()


_MM_NUMPY = (Target("numpy", 0.8),)
_MM_SHAPES = (Target("numpy", 0.7),)
_CONV = (Target("torch", 0.7),)
_FUSED = (Target("torch", 1.1), Target("inductor", 1.1))
_ROWS = (Target("torch", 1.2),)
_Q_MM = {"m": 24, "k": 40, "n": 36}
_Q_CONV = {"h": 6, "w": 6, "c": 8, "o": 12}
_Q_ROWS = {"rows": 8, "cols": 64}


def _conv(name: str, layout: str, k: int, hw: int, c: int, o: int, stride: int = 1,
          targets: tuple[Target, ...] = _CONV, *, groups: int = 1, n: int = 1) -> Case:
    dims = {"layout": layout, "kh": k, "kw": k, "h": hw, "w": hw, "c": c, "o": o, "stride": stride,
            "pad": k // 2}
    quick = {**dims, **_Q_CONV}
    if groups > 1 or n > 1:  # (the ResNet-50 rows keep their dims as recorded)
        dims = {**dims, "groups": groups, "n": n}
        # Quick: the same group width (depthwise stays depthwise), a few groups, a batch of 2.
        cg, og = c // groups, o // groups
        quick = {**quick, "c": cg * min(groups, 3), "o": og * min(groups, 3), "groups": min(groups, 3),
                 "n": min(n, 2)}
    return Case(name, "conv2d", dims, quick, targets)


#: Issue #33's bar for the convolutions of every shape: >= 0.9x torch channels_last (oneDNN).
_CONV_SHAPES = (Target("torch", 0.9),)


def _conv_transpose(name: str, layout: str, k: int, size: tuple[int, ...], c: int, o: int, stride: int) -> Case:
    dims = {"layout": layout, "k": k, "size": size, "c": c, "o": o, "stride": stride, "pad": k // 2,
            "output_padding": stride - 1}
    quick = {**dims, "size": (5,) * len(size), "c": 4, "o": 3}
    return Case(name, "conv_transpose", dims, quick, _CONV_SHAPES)


#: The suite. matmul dims are (m, k, n): A is m x k, B is k x n. conv2d: ResNet-50 layers, batch 1, with
#: 'same' padding; c/o input/output channels.
CASES: tuple[Case, ...] = (
    Case("matmul_256", "matmul", {"m": 256, "k": 256, "n": 256}, _Q_MM),
    Case("matmul_1024", "matmul", {"m": 1024, "k": 1024, "n": 1024}, _Q_MM, _MM_NUMPY),
    Case("matmul_2048", "matmul", {"m": 2048, "k": 2048, "n": 2048}, _Q_MM, _MM_NUMPY),
    Case("matmul_512x768x3072", "matmul", {"m": 512, "k": 768, "n": 3072}, _Q_MM, _MM_SHAPES),
    Case("matmul_128x4096x4096", "matmul", {"m": 128, "k": 4096, "n": 4096}, _Q_MM, _MM_SHAPES),
    Case("bmm_16x256x64x256", "bmm", {"b": 16, "m": 256, "k": 64, "n": 256}, {"b": 3, **_Q_MM}, _MM_SHAPES),
    _conv("conv3x3_56_64_nhwc", "NHWC", 3, 56, 64, 64),     # conv2_x 3x3
    _conv("conv3x3_56_64_nchw", "NCHW", 3, 56, 64, 64),
    _conv("conv1x1_56_64to256_nhwc", "NHWC", 1, 56, 64, 256),  # conv2_x expansion 1x1
    _conv("conv1x1_56_64to256_nchw", "NCHW", 1, 56, 64, 256),
    _conv("conv3x3_14_256_nhwc", "NHWC", 3, 14, 256, 256),   # conv4_x 3x3
    _conv("conv1x1_7_2048to512_nchw", "NCHW", 1, 7, 2048, 512),  # conv5_x reduction 1x1
    # Convolutions of every shape (issue #33 item 3), channels last against torch's channels_last (oneDNN):
    # grouped 3x3 of group width 16 and 8 (RegNet/ResNeXt-like), depthwise 3x3 (MobileNetV2) and 7x7
    # (ConvNeXt), a 3 -> 16-channel 3x3 on a batch of 128 32x32 images (a CIFAR stem), transposed 3x3
    # stride 2 in 2-D (a decoder's 2x upsampling) and 3x3x3 in 3-D (NCDHW; torch channels_last_3d).
    _conv("conv3x3_28_128_g8_nhwc", "NHWC", 3, 28, 128, 128, targets=_CONV_SHAPES, groups=8),
    _conv("conv3x3_28_128_g16_nhwc", "NHWC", 3, 28, 128, 128, targets=_CONV_SHAPES, groups=16),
    _conv("dwconv3x3_56_144_nhwc", "NHWC", 3, 56, 144, 144, targets=_CONV_SHAPES, groups=144),
    _conv("dwconv7x7_56_96_nhwc", "NHWC", 7, 56, 96, 96, targets=_CONV_SHAPES, groups=96),
    _conv("conv3x3_32_3to16_b128_nhwc", "NHWC", 3, 32, 3, 16, targets=_CONV_SHAPES, n=128),
    _conv_transpose("convT3x3s2_28_64to32_nhwc", "NHWC", 3, (28, 28), 64, 32, 2),
    _conv_transpose("convT3x3x3s2_8x16x16_32to16_ncdhw", "NCHW", 3, (8, 16, 16), 32, 16, 2),
    Case("matmul_bias_gelu_512x768x3072", "mlp", {"m": 512, "k": 768, "n": 3072}, _Q_MM, _FUSED),
    Case("softmax_4096x4096", "softmax", {"rows": 4096, "cols": 4096}, _Q_ROWS, _ROWS),
    Case("softmax_512x4096", "softmax", {"rows": 512, "cols": 4096}, _Q_ROWS),
    Case("layernorm_4096x4096", "layernorm", {"rows": 4096, "cols": 4096}, _Q_ROWS, _ROWS),
    Case("layernorm_512x4096", "layernorm", {"rows": 512, "cols": 4096}, _Q_ROWS),
)

#: pbsdk's JIT compile time of one kernel should stay under this (issue #3).
COMPILE_BAR_S = 2.0


@dataclasses.dataclass
class Workload:
    """What one case runs: inputs, the program per contender, the float64 reference, the tolerance."""

    shape: str                                   # human-readable operand shapes
    inputs: tuple[np.ndarray, ...]
    pbsdk: Callable[..., Any]                    # a pbsdk.ops program
    numpy: Callable[..., np.ndarray]             # the obvious numpy expression
    torch: Callable[..., Any]                    # torch eager (also what Inductor compiles)
    reference: Callable[[], np.ndarray]          # float64, rounded to f32 once
    op: str                                      # tolerance table entry
    reduction_size: int
    fused: bool                                  # also measured against Inductor
    flops: float
    torch_inputs: Callable[[Any, tuple[np.ndarray, ...]], tuple[Any, ...]] | None = None
    torch_output: Callable[[Any], np.ndarray] | None = None


def _rand(rng: np.random.Generator, *shape: int, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)).astype(np.float32)


def _gelu_tanh_np(h: np.ndarray) -> np.ndarray:
    c = np.float32(math.sqrt(2.0 / math.pi))
    return np.float32(0.5) * h * (np.float32(1.0) + np.tanh(c * (h + np.float32(0.044715) * h * h * h)))


def _build(case: Case, quick: bool) -> Workload:
    """The workload of ``case`` (deterministic inputs: seed 0)."""
    from pbsdk import ops
    from pbsdk.testing import reference as ref

    d = case.quick if quick else case.dims
    rng = np.random.default_rng(0)
    f64 = np.float64
    if case.family in ("matmul", "mlp"):
        m, k, n = d["m"], d["k"], d["n"]
        a, b = _rand(rng, m, k, scale=1 / math.sqrt(k) ** 0.5), _rand(rng, k, n, scale=1 / math.sqrt(k) ** 0.5)
        if case.family == "matmul":
            return Workload(f"({m},{k})@({k},{n})", (a, b), lambda x, y: x @ y, np.matmul,
                            lambda x, y: x @ y, lambda: ref.matmul(a, b), "matmul", k, False, 2.0 * m * n * k)
        bias = _rand(rng, n)

        def mlp_torch(x: Any, w: Any, bb: Any) -> Any:
            import torch
            return torch.nn.functional.gelu(torch.addmm(bb, x, w), approximate="tanh")

        return Workload(f"gelu_tanh(({m},{k})@({k},{n})+({n},))", (a, b, bias),
                        lambda x, w, bb: ops.gelu(x @ w + bb, approximate="tanh"),
                        lambda x, w, bb: _gelu_tanh_np(x @ w + bb), mlp_torch,
                        lambda: ref.gelu_tanh(ref.matmul(a, b, dtype=f64) + bias.astype(f64)).astype(np.float32),
                        "mlp", k, True, 2.0 * m * n * k)
    if case.family == "bmm":
        bt, m, k, n = d["b"], d["m"], d["k"], d["n"]
        a, b = _rand(rng, bt, m, k), _rand(rng, bt, k, n)
        return Workload(f"({bt},{m},{k})@({bt},{k},{n})", (a, b), lambda x, y: x @ y, np.matmul,
                        lambda x, y: x @ y, lambda: ref.matmul(a, b), "matmul", k, False, 2.0 * bt * m * n * k)
    if case.family == "conv2d":
        return _build_conv(d, rng)
    if case.family == "conv_transpose":
        return _build_conv_transpose(d, rng)
    rows, cols = d["rows"], d["cols"]
    x = _rand(rng, rows, cols)
    if case.family == "softmax":
        def softmax_np(v: np.ndarray) -> np.ndarray:
            e = np.exp(v - v.max(axis=-1, keepdims=True))
            return e / e.sum(axis=-1, keepdims=True)

        def softmax_torch(v: Any) -> Any:
            import torch
            return torch.softmax(v, dim=-1)

        return Workload(f"({rows},{cols}) axis -1", (x,), lambda v: ops.softmax(v, axis=-1), softmax_np,
                        softmax_torch, lambda: ref.softmax(x), "softmax", cols, True, 0.0)
    if case.family == "layernorm":
        w, b = _rand(rng, cols), _rand(rng, cols)

        def layernorm_np(v: np.ndarray, ww: np.ndarray, bb: np.ndarray) -> np.ndarray:
            mu = v.mean(axis=-1, keepdims=True)
            c = v - mu
            var = (c * c).mean(axis=-1, keepdims=True)
            return c / np.sqrt(var + np.float32(1e-5)) * ww + bb

        def layernorm_torch(v: Any, ww: Any, bb: Any) -> Any:
            import torch
            return torch.nn.functional.layer_norm(v, (v.shape[-1],), ww, bb, 1e-5)

        return Workload(f"({rows},{cols}) axis -1, weight+bias", (x, w, b),
                        lambda v, ww, bb: ops.layernorm(v, ww, bb, eps=1e-5), layernorm_np, layernorm_torch,
                        lambda: ref.layernorm(x, w, b, eps=1e-5), "layernorm", cols, True, 0.0)
    raise AssertionError(case.family)


def _build_conv(d: dict[str, Any], rng: np.random.Generator) -> Workload:
    from numpy.lib.stride_tricks import sliding_window_view

    from pbsdk import ops
    from pbsdk.testing import reference as ref

    layout, kh, kw, h, w, c, o = d["layout"], d["kh"], d["kw"], d["h"], d["w"], d["c"], d["o"]
    s, p, g, n = d["stride"], d["pad"], d.get("groups", 1), d.get("n", 1)
    cg = c // g
    scale = 1 / math.sqrt(cg * kh * kw) ** 0.5
    nhwc = layout == "NHWC"
    x = _rand(rng, n, h, w, c, scale=scale) if nhwc else _rand(rng, n, c, h, w, scale=scale)
    wt = _rand(rng, kh, kw, cg, o, scale=scale) if nhwc else _rand(rng, o, cg, kh, kw, scale=scale)
    oh, ow = ref.conv2d_output_shape(h, w, kh, kw, stride=s, padding=p)

    def conv_np(xx: np.ndarray, ww: np.ndarray) -> np.ndarray:
        # im2col as a strided window view, then one GEMM (tensordot copies the windows contiguously); grouped:
        # one einsum over the groups.
        if nhwc:
            xp = np.pad(xx, ((0, 0), (p, p), (p, p), (0, 0))) if p else xx
            win = sliding_window_view(xp, (kh, kw), axis=(1, 2))[:, ::s, ::s]      # N,OH,OW,C,KH,KW
            if g > 1:
                wins = win.reshape(*win.shape[:3], g, cg, kh, kw)
                return np.einsum("nhwgcij,ijcgo->nhwgo", wins, ww.reshape(kh, kw, cg, g, o // g),
                                 optimize=True).reshape(*win.shape[:3], o)
            return np.tensordot(win, ww, axes=([4, 5, 3], [0, 1, 2]))               # N,OH,OW,O
        xp = np.pad(xx, ((0, 0), (0, 0), (p, p), (p, p))) if p else xx
        win = sliding_window_view(xp, (kh, kw), axis=(2, 3))[:, :, ::s, ::s]        # N,C,OH,OW,KH,KW
        if g > 1:
            wins = win.reshape(win.shape[0], g, cg, *win.shape[2:])
            y = np.einsum("ngchwij,gocij->ngohw", wins, ww.reshape(g, o // g, cg, kh, kw), optimize=True)
            return np.ascontiguousarray(y.reshape(win.shape[0], o, *win.shape[2:4]))
        return np.ascontiguousarray(np.tensordot(ww, win, axes=([1, 2, 3], [1, 4, 5])).transpose(1, 0, 2, 3))

    def conv_torch(xx: Any, ww: Any) -> Any:
        import torch
        return torch.nn.functional.conv2d(xx, ww, stride=s, padding=p, groups=g)

    def torch_inputs(torch: Any, arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
        xx, ww = (torch.from_numpy(a) for a in arrays)
        if not nhwc:
            return xx, ww
        # NHWC is torch's channels_last: a zero-copy view of the input; the weight is converted once, as a
        # model's weights would be.
        return xx.permute(0, 3, 1, 2), ww.permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)

    def torch_output(y: Any) -> np.ndarray:
        return (y.permute(0, 2, 3, 1) if nhwc else y).numpy()

    wshape = f"({kh},{kw},{cg},{o})" if nhwc else f"({o},{cg},{kh},{kw})"
    xshape = "(" + ",".join(str(v) for v in x.shape) + ")"
    return Workload(f"{layout} x{xshape} w{wshape} s{s} p{p}" + (f" groups {g}" if g > 1 else ""),
                    (x, wt), lambda xx, ww: ops.conv2d(xx, ww, stride=s, padding=p, groups=g, layout=layout),
                    conv_np, conv_torch,
                    lambda: ref.conv2d(x, wt, stride=s, padding=p, groups=g, layout=layout), "conv2d",
                    cg * kh * kw, False, 2.0 * n * o * oh * ow * cg * kh * kw, torch_inputs, torch_output)


def _build_conv_transpose(d: dict[str, Any], rng: np.random.Generator) -> Workload:
    """A transposed convolution, 2-D (NCHW or NHWC) or 3-D (NCDHW), torch's weight layout (Cin, Cout, *K);
    torch runs it channels last (channels_last / channels_last_3d), as a model converted to it would."""
    from pbsdk import ops
    from pbsdk.testing import reference as ref

    layout, k, size, c, o = d["layout"], d["k"], tuple(d["size"]), d["c"], d["o"]
    s, p, e = d["stride"], d["pad"], d["output_padding"]
    dims = len(size)
    nhwc = layout == "NHWC"
    scale = 1 / math.sqrt(c * k ** dims / s ** dims) ** 0.5
    x = _rand(rng, 1, *size, c, scale=scale) if nhwc else _rand(rng, 1, c, *size, scale=scale)
    wt = _rand(rng, c, o, *(k,) * dims, scale=scale)
    kw = {"stride": s, "padding": p, "output_padding": e}

    def conv_np(xx: np.ndarray, ww: np.ndarray) -> np.ndarray:
        # By its definition: per kernel tap, the input times the tap's (Cin, Cout) matrix scattered to a
        # strided window of the output (one tensordot a tap), then cropped.
        xin = np.moveaxis(xx, -1, 1) if nhwc else xx
        full = [(n - 1) * s + k + e for n in size]
        y = np.zeros((xin.shape[0], o, *full), np.float32)
        for tap in np.ndindex(*(k,) * dims):
            win = tuple(slice(t, t + (n - 1) * s + 1, s) for t, n in zip(tap, size))
            y[(slice(None), slice(None)) + win] += np.moveaxis(
                np.tensordot(xin, ww[(slice(None), slice(None)) + tap], axes=([1], [0])), -1, 1)
        y = y[(slice(None), slice(None)) + tuple(slice(p, f - p) for f in full)]
        return np.ascontiguousarray(np.moveaxis(y, 1, -1) if nhwc else y)

    def conv_torch(xx: Any, ww: Any) -> Any:
        import torch
        f = torch.nn.functional.conv_transpose2d if dims == 2 else torch.nn.functional.conv_transpose3d
        return f(xx, ww, **kw)

    def torch_inputs(torch: Any, arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
        xx, ww = (torch.from_numpy(a) for a in arrays)
        fmt = torch.channels_last if dims == 2 else torch.channels_last_3d
        if nhwc:  # a zero-copy channels_last view of the NHWC input
            return xx.permute(0, 3, 1, 2), ww.contiguous(memory_format=fmt)
        return xx.contiguous(memory_format=fmt), ww.contiguous(memory_format=fmt)

    def torch_output(y: Any) -> np.ndarray:
        return (y.permute(0, 2, 3, 1) if nhwc else y).contiguous().numpy()

    out = [(n - 1) * s - 2 * p + k + e for n in size]
    xshape = "(" + ",".join(str(v) for v in x.shape) + ")"
    return Workload(f"{layout if dims == 2 else 'NCDHW'} x{xshape} w({c},{o}," + ",".join([str(k)] * dims)
                    + f") s{s} p{p} op{e}", (x, wt),
                    lambda xx, ww: ops.conv_transpose(xx, ww, **kw, layout=layout), conv_np, conv_torch,
                    lambda: ref.conv_transpose(x, wt, **kw, layout=layout), "conv2d", c * k ** dims // s ** dims,
                    False, 2.0 * c * o * math.prod(out) * k ** dims / s ** dims, torch_inputs, torch_output)


# ------------------------------------------------------------------------------------------------ timing

def best_of(fn: Callable[..., Any], args: tuple[Any, ...], repeats: int) -> float:
    """The fastest of ``repeats`` back-to-back calls (seconds); each output is dropped before the next."""
    best = math.inf
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn(*args)
        t1 = time.perf_counter()
        del out
        best = min(best, t1 - t0)
    return best


def interleaved_blocks(fns: dict[str, Callable[[], Any]], rounds: int, block_s: float) -> dict[str, list[float]]:
    """Per contender, its fastest call in each of ``rounds`` blocks of about ``block_s`` seconds of calls (a
    warm call first); the contenders' blocks interleaved, their order rotating each round. For same-process
    A/B scripts (`benchmarks/long_k.py`, `benchmarks/rows_ab.py`)."""
    names = list(fns)
    times: dict[str, list[float]] = {k: [] for k in names}
    for r in range(rounds):
        for k in names[r % len(names):] + names[:r % len(names)]:
            fns[k]()
            best, start = math.inf, time.perf_counter()
            while time.perf_counter() - start < block_s:
                t0 = time.perf_counter()
                fns[k]()
                best = min(best, time.perf_counter() - t0)
            times[k].append(best)
    return times


def host_line(threads: int, clocks: Sequence[float | None], rounds: int, block_s: float) -> str:
    """One line naming the host (its detected description and LLVM CPU), the threads, the clock measured
    before and after, and the rounds: the header of an A/B script's table."""
    from pbsdk.core.spec.host import host_spec_data

    data = host_spec_data(calibrate=False)
    return (f"{data.get('description', 'host')} LLVM cpu {data.get('codegen', {}).get('cpu')}; {threads} thread(s); "
            f"clock {clocks[0]} GHz before, {clocks[-1]} GHz after; {rounds} rounds of {block_s} s blocks")


def ab_parser(doc: str, flag: str, default: Sequence[str], what: str, block_s: float = 0.3) -> argparse.ArgumentParser:
    """The command line every same-process A/B script takes: its cases (``flag``, e.g. ``--shapes``, ``what``
    says their form), ``--threads``, ``--rounds``, ``--block-s`` and ``--json`` (`save_ab`)."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument(flag, nargs="+", default=list(default), help=what)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--block-s", type=float, default=block_s)
    p.add_argument("--json", type=Path, help="also write the rows here")
    return p


def run_ab(args: argparse.Namespace, cases: Sequence[str], measure: Callable[[str, int, int, float], dict[str, Any]],
           columns: tuple[str, str], row: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """An A/B script's run (`ab_parser`'s ``args``): ``measure(case, threads, rounds, block_s)`` per case between
    two clock probes, then the `host_line` header, the markdown table (``columns``: its head and rule lines;
    ``row`` formats a row) on stdout, and the rows as JSON (`save_ab`)."""
    from pbsdk.core.spec.calibrate import clock_now

    before = clock_now()
    rows = []
    for case in cases:
        rows.append(measure(case, args.threads, args.rounds, args.block_s))
        print(f"  {case} done", file=sys.stderr)
    after = clock_now()
    header = host_line(args.threads, [before, after], args.rounds, args.block_s)
    print("\n".join([header, *columns, *(row(r) for r in rows)]))
    save_ab(args.json, header, args.threads, [before, after], rows)
    return rows


def ratio_cell(row: dict[str, Any]) -> str:
    """An A/B row's median ratio and its spread over rounds, as a table cell: ``1.39 [1.19–1.46]``."""
    return f"{row['speedup']:.2f} [{row['spread'][0]:.2f}–{row['spread'][1]:.2f}]"


def save_ab(path: Path | None, header: str, threads: int, clocks: Sequence[float | None],
            rows: Sequence[dict[str, Any]]) -> None:
    """Write an A/B script's rows as JSON to ``path`` (nothing when None), with its `host_line` header."""
    if path is not None:
        path.write_text(json.dumps({"host": header, "threads": threads, "clock_ghz": list(clocks),
                                    "rows": list(rows)}, indent=1))


def _repeats_for(seconds: float, *, quick: bool, block_s: float = 0.25) -> int:
    """Calls per block: about ``block_s`` of work, at least 3 and at most 30 (1 in quick mode)."""
    if quick:
        return 1
    return max(3, min(30, int(block_s / max(seconds, 1e-6))))


def _check(got: Any, expect: np.ndarray, work: Workload) -> dict[str, Any]:
    from pbsdk.testing import assert_close, max_error

    got = np.asarray(got)
    out: dict[str, Any] = {"correct": True, "message": None, "max_abs_error": None, "max_rel_error": None}
    try:
        assert_close(got, expect, op=work.op, reduction_size=work.reduction_size)
    except AssertionError as exc:
        out["correct"] = False
        out["message"] = str(exc).splitlines()[0][:300]
    if got.shape == expect.shape:
        abs_err, rel_err = max_error(got.astype(np.float32, copy=False), expect)
        out["max_abs_error"], out["max_rel_error"] = _finite(abs_err), _finite(rel_err)
    return out


def _finite(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1e3


def _program(work: Workload) -> Any:
    """The case's program as the planner's graph (traced from its pbsdk function)."""
    from pbsdk.frontends.jit import trace
    from pbsdk.frontends.tracing import input_type

    graph, _ = trace(work.pbsdk, tuple(input_type(a, i) for i, a in enumerate(work.inputs)))
    return graph


def _predicted_ms(graph: Any, threads: int, clock_ghz: float | None = None) -> float | None:
    """The planner's predicted time of a case's program (`_program`) on the host (`pbsdk.core.plan.predict`);
    with ``clock_ghz``, on the host running at that clock (`spec_at_clock`; None where the spec has no clock)."""
    from pbsdk.core.plan.predict import predict_graph
    from pbsdk.core.spec import load_spec

    spec = load_spec("host")
    if clock_ghz is not None:
        spec = spec_at_clock(spec, clock_ghz)
        if spec is None:
            return None
    return predict_graph(graph, spec, {"threads": threads}).seconds * 1e3


def spec_at_clock(spec: Any, clock_ghz: float) -> Any:
    """``spec`` with its cores at ``clock_ghz``: the peak rates and the bandwidth of every per-core level
    (figures per cycle) scaled from its clock; chip-wide levels as they are. None without a clock."""
    if not spec.clock_ghz:
        return None
    f = clock_ghz / spec.clock_ghz
    memory = [lv if lv.scope == "device" else lv.model_copy(update={"bandwidth_gbps": lv.bandwidth_gbps * f})
              for lv in spec.memory]
    return spec.model_copy(update={"clock_ghz": clock_ghz, "memory": memory,
                                   "peak_tflops": {k: v * f for k, v in spec.peak_tflops.items()}})


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Spearman's rank correlation of two equally long samples (ties share their mean rank); None for
    fewer than three pairs or a constant sample."""
    if len(xs) != len(ys) or len(xs) < 3:
        return None

    def ranks(v: Sequence[float]) -> np.ndarray:
        order = np.argsort(v, kind="stable")
        r = np.empty(len(v))
        r[order] = np.arange(len(v), dtype=float)
        for value in set(v):  # ties: the mean of their ranks
            tied = np.asarray(v) == value
            r[tied] = r[tied].mean()
        return r

    rx, ry = ranks(xs), ranks(ys)
    if rx.std() == 0 or ry.std() == 0:
        return None
    return float(np.corrcoef(rx, ry)[0, 1])


def cost_model_check(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Per thread count: the planner's predicted vs measured pbsdk times of every case with both, their
    ratio (measured / predicted) and Spearman's rank correlation over the cases."""
    out: dict[str, Any] = {}
    for threads in sorted({r["threads"] for r in results}):
        rows = [{"case": r["case"], "predicted_ms": r["predicted_ms"], "measured_ms": r["times_ms"]["pbsdk"],
                 "ratio": r["times_ms"]["pbsdk"] / r["predicted_ms"],
                 "clock_ghz": r.get("clock_ghz"),
                 "ratio_at_clock": (r["times_ms"]["pbsdk"] / r["predicted_ms_at_clock"]
                                    if r.get("predicted_ms_at_clock") else None)}
                for r in results if r["threads"] == threads and r.get("predicted_ms")
                and r.get("times_ms", {}).get("pbsdk")]
        out[str(threads)] = {"spearman": spearman([r["predicted_ms"] for r in rows],
                                                  [r["measured_ms"] for r in rows]), "cases": rows}
    return out


def cost_model_table(check: dict[str, Any]) -> str:
    lines = []
    for threads, c in check.items():
        rho = c["spearman"]
        lines.append(f"Cost model at {threads} thread(s): Spearman rank correlation of predicted vs measured "
                     f"pbsdk time over {len(c['cases'])} cases = {'n/a' if rho is None else f'{rho:.3f}'}")
        lines.append("")
        clocked = any(r.get("ratio_at_clock") for r in c["cases"])
        lines.append("| case | predicted ms | measured ms | measured / predicted |"
                     + (" clock during the case, GHz | measured / predicted at that clock |" if clocked else ""))
        lines.append("|---|---|---|---|" + ("---|---|" if clocked else ""))
        for r in c["cases"]:
            row = f"| {r['case']} | {r['predicted_ms']:.4g} | {r['measured_ms']:.4g} | {r['ratio']:.2f} |"
            if clocked:
                clock = "–".join(f"{g:.2f}" for g in r.get("clock_ghz") or []) or "–"
                at = f"{r['ratio_at_clock']:.2f}" if r.get("ratio_at_clock") else "–"
                row += f" {clock} | {at} |"
            lines.append(row)
        lines.append("")
    if any(r.get("ratio_at_clock") for c in check.values() for r in c["cases"]):
        lines.append("The clock is measured before and after each case's rounds (the calibration's probe); the host "
                     "spec's is the calibrated one. The last column re-predicts at the measured clock (peak rates "
                     "and per-core bandwidths scaled, chip-wide levels as they are).")
        lines.append("")
    return "\n".join(lines)


def _run_case(case: Case, threads: int, *, quick: bool, rounds: int, contenders: Sequence[str],
              torch: Any, log: Callable[[str], None]) -> dict[str, Any]:
    """Measure one case at one thread count (inside a worker whose thread pools are set to ``threads``)."""
    import pbsdk
    from pbsdk.frontends.tracing import input_type

    work = _build(case, quick)
    expect = work.reference()
    result: dict[str, Any] = {
        "case": case.name, "threads": threads, "shape": work.shape, "flops": work.flops,
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "times_ms": {}, "round_minimums_ms": {}, "repeats": {}, "compile_s": {}, "checks": {}, "errors": {},
    }
    fns: dict[str, tuple[Callable[..., Any], tuple[Any, ...]]] = {}

    def fail(name: str, exc: BaseException) -> None:
        result["errors"][name] = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}"
        log(f"    {name}: {result['errors'][name]}")

    # pbsdk: a cold compile (no disk cache) for this thread count, timed apart from the first run.
    program = None  # the planner's graph of the case, predicted now and again at the clock measured
    if "pbsdk" in contenders:
        try:
            t0 = time.perf_counter()
            jf = pbsdk.jit(work.pbsdk, options={"threads": threads, "cache": False})
            jf.kernel(tuple(input_type(a, i) for i, a in enumerate(work.inputs)))
            result["compile_s"]["pbsdk"] = time.perf_counter() - t0
            program = _program(work)
            result["predicted_ms"] = _predicted_ms(program, threads)
            result["checks"]["pbsdk"] = _check(jf(*work.inputs), expect, work)
            fns["pbsdk"] = (jf, work.inputs)
        except Exception as exc:  # noqa: BLE001 - a compile failure is a result, not a crash
            fail("pbsdk", exc)
            result["checks"]["pbsdk"] = {"correct": False, "message": result["errors"]["pbsdk"],
                                         "max_abs_error": None, "max_rel_error": None}
    if "numpy" in contenders:
        result["checks"]["numpy"] = _check(work.numpy(*work.inputs), expect, work)
        fns["numpy"] = (work.numpy, work.inputs)
    if torch is not None and ("torch" in contenders or ("inductor" in contenders and work.fused)):
        targs = (work.torch_inputs(torch, work.inputs) if work.torch_inputs
                 else tuple(torch.from_numpy(a) for a in work.inputs))
        to_np = work.torch_output or (lambda y: y.numpy())
        if "torch" in contenders:
            result["checks"]["torch"] = _check(to_np(work.torch(*targs)), expect, work)
            fns["torch"] = (work.torch, targs)
        if "inductor" in contenders and work.fused:
            try:
                compiled = torch.compile(work.torch, dynamic=False)
                t0 = time.perf_counter()
                first = compiled(*targs)
                result["compile_s"]["inductor"] = time.perf_counter() - t0
                result["checks"]["inductor"] = _check(to_np(first), expect, work)
                fns["inductor"] = (compiled, targs)
            except Exception as exc:  # noqa: BLE001
                fail("inductor", exc)

    # Warm up, size the blocks, then rounds of one block per contender; keep each block's minimum.
    order = [c for c in CONTENDERS if c in fns]
    repeats: dict[str, int] = {}
    for name in order:
        fn, args = fns[name]
        warm = best_of(fn, args, 1 if quick else 2)
        repeats[name] = _repeats_for(warm, quick=quick)
    minima: dict[str, list[float]] = {name: [] for name in order}
    clock_before = None if quick else clock_now()
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for _ in range(rounds):
            for name in order:
                fn, args = fns[name]
                minima[name].append(best_of(fn, args, repeats[name]))
                if not quick:
                    time.sleep(0.02)  # let the previous library's spinning threads go idle
    finally:
        if gc_was_enabled:
            gc.enable()
    times = {name: statistics.median(v) for name, v in minima.items()}
    clocks = [g for g in (clock_before, None if quick else clock_now()) if g is not None]
    if clocks:  # the clock the rounds ran at (a shared or boosting host's moves), and the model at it
        result["clock_ghz"] = clocks
        if program is not None and result.get("predicted_ms"):
            result["predicted_ms_at_clock"] = _predicted_ms(program, threads, statistics.mean(clocks))
    result["times_ms"] = {name: t * 1e3 for name, t in times.items()}
    result["round_minimums_ms"] = {name: [t * 1e3 for t in v] for name, v in minima.items()}
    result["repeats"] = repeats
    pb = times.get("pbsdk")
    result["ratio"] = {b: (times[b] / pb if pb and b in times else None) for b in BASELINES if b in times}
    if work.flops and pb:
        result["pbsdk_gflops"] = work.flops / pb / 1e9
    result["correct"] = bool(result["checks"].get("pbsdk", {}).get("correct", False)) if "pbsdk" in contenders \
        else None
    shown = "  ".join(f"{n} {t * 1e3:8.3f} ms" for n, t in times.items())
    verdict = {True: "ok", False: "WRONG", None: "-"}[result["correct"]]
    log(f"  {case.name:<30} {threads}t  {shown}  [{verdict}]")
    return result


# ------------------------------------------------------------------------------------------ machine info

def cpu_model(*, cpuid: bool = False) -> str:
    """The CPU's model name (from /proc/cpuinfo), for the reports that must name the CPU beside figures.
    ``cpuid``: with its CPUID family and model beside it (``AMD EPYC (family 25, model 1)``), where the
    name alone does not tell the core's generation (a Zen 3 from a Zen 4)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().split("\n\n", 1)[0].splitlines()  # the first processor's
    except OSError:
        return platform.processor() or platform.machine()
    info = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    name = info.get("model name") or platform.processor() or platform.machine()
    return f"{name} (family {info.get('cpu family', '?')}, model {info.get('model', '?')})" if cpuid else name


def _git_commit() -> str | None:
    root = Path(__file__).resolve().parent.parent
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=False)
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode:
        return None
    return head.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


def machine_info() -> dict[str, Any]:
    """Where and with what the suite ran."""
    import pbsdk

    info: dict[str, Any] = {
        "cpu_model": cpu_model(), "cores": os.cpu_count(),
        "cores_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "platform": platform.platform(), "python": platform.python_version(), "numpy": np.__version__,
        "numpy_blas": None, "torch": None, "pbsdk": pbsdk.__version__, "pbsdk_commit": _git_commit(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "load_average_start": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
    }
    try:
        blas = np.show_config(mode="dicts")["Build Dependencies"]["blas"]  # type: ignore[func-returns-value]
        info["numpy_blas"] = f"{blas.get('name')} {blas.get('version')}"
    except Exception:  # noqa: BLE001 - older numpy: no dict mode
        info["numpy_blas"] = None
    try:
        import torch
        info["torch"] = torch.__version__
    except ImportError:
        pass
    return info


# ------------------------------------------------------------------------------------------------ worker

def _worker(args: argparse.Namespace) -> int:
    """Run the selected cases at one thread count; write a JSON list of results to ``--worker-out``."""
    threads = args.worker
    contenders = args.contenders
    log = (lambda s: print(s, file=sys.stderr, flush=True))
    torch: Any = None
    if "torch" in contenders or "inductor" in contenders:
        try:
            import torch as _torch
            torch = _torch
            torch.set_num_threads(threads)
        except ImportError:
            log("  torch is not installed: torch and Inductor are skipped")
    pools: list[dict[str, Any]] = []
    try:
        import threadpoolctl
        pools = [{k: p.get(k) for k in ("user_api", "internal_api", "num_threads", "version")}
                 for p in threadpoolctl.threadpool_info()]
    except ImportError:
        pass
    cases = [c for c in CASES if c.name in args.only]
    # One throwaway compile first, so that loading the MLIR libraries and the JIT's one-time set-up is
    # recorded apart and not charged to the first case's compile time.
    warm_compile_s = None
    if "pbsdk" in contenders and not args.quick:
        import pbsdk
        from pbsdk import ops

        t0 = time.perf_counter()
        pbsdk.jit(lambda v: ops.exp(v), options={"cache": False})(np.ones((4,), np.float32))
        warm_compile_s = time.perf_counter() - t0
    results = []
    ctx = torch.inference_mode() if torch is not None else _null()
    with ctx:
        for case in cases:
            try:
                results.append(_run_case(case, threads, quick=args.quick, rounds=args.rounds,
                                         contenders=contenders, torch=torch, log=log))
            except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others
                msg = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
                log(f"  {case.name:<30} {threads}t  FAILED: {msg}")
                results.append({"case": case.name, "threads": threads, "shape": "?", "times_ms": {}, "ratio": {},
                                "compile_s": {}, "checks": {}, "errors": {"suite": msg}, "correct": False})
    payload = {"threads": threads, "torch_threads": torch.get_num_threads() if torch is not None else None,
               "thread_pools": pools, "first_compile_s": warm_compile_s, "results": results}
    Path(args.worker_out).write_text(json.dumps(payload))
    return 0


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


# ------------------------------------------------------------------------------------------------ output

def _fmt_ms(v: float | None) -> str:
    if v is None:
        return "–"
    return f"{v:.3f}" if v < 1 else f"{v:.2f}" if v < 100 else f"{v:.0f}"


def _fmt_ratio(v: float | None) -> str:
    return "–" if v is None else f"{v:.2f}"


def target_verdicts(case: Case, row: dict[str, Any]) -> list[str]:
    """Issue #3's bars for this row, each as ``'torch ≥ 1.2: met'`` or ``'... missed (0.83)'``."""
    out = []
    for t in case.targets:
        r = row.get("ratio", {}).get(t.baseline)
        if r is None:
            out.append(f"{t.baseline} ≥ {t.ratio}: n/a")
        else:
            out.append(f"{t.baseline} ≥ {t.ratio}: {'met' if r >= t.ratio else 'missed'}")
    comp = row.get("compile_s", {}).get("pbsdk")
    if comp is not None and comp > COMPILE_BAR_S:
        out.append(f"compile ≤ {COMPILE_BAR_S:g} s: missed")
    return out


def _commit_text(commit: str | None) -> str:
    if not commit:
        return ""
    return f" @ {commit[:12]}{' (uncommitted changes)' if commit.endswith('+dirty') else ''}"


def markdown_table(report: dict[str, Any]) -> str:
    """The results as a markdown table (one row per case and thread count) with a header line."""
    m, cfg = report["machine"], report["config"]
    by_name = {c.name: c for c in CASES}
    lines = [
        f"Measured {m['date']} on {m['cpu_model']} ({m['cores']} cores), numpy {m['numpy']} "
        f"({m['numpy_blas'] or 'BLAS unknown'}), torch {m['torch'] or '–'}, pbsdk {m['pbsdk']}"
        f"{_commit_text(m.get('pbsdk_commit'))}; "
        f"load average at start {', '.join(f'{x:.1f}' for x in m['load_average_start'] or [])}. "
        f"Median of {cfg['rounds']} per-round minimums; ratio = baseline time / pbsdk time (> 1: pbsdk faster); "
        f"outputs freshly allocated for every call of every contender"
        f"{' (glibc told to reuse freed memory)' if cfg['malloc_reuse'] else ''}."
        + (" QUICK MODE: tiny shapes, one call — not a measurement." if cfg["quick"] else ""),
        "",
        ("| case | shape | thr | pbsdk ms | numpy ms | torch ms | Inductor ms | ×numpy | ×torch | ×Inductor "
         "| compile s | correct | issue #3 bar |"),
        "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|:-:|---|",
    ]
    for row in report["results"]:
        case = by_name[row["case"]]
        t, r = row["times_ms"], row.get("ratio", {})
        comp = row["compile_s"].get("pbsdk")
        ok = row.get("correct")
        mark = "✓" if ok else ("✗" if ok is False else "–")
        if row["errors"].get("pbsdk") or row["errors"].get("suite"):
            mark = "error"
        lines.append(
            f"| {case.name} | {row['shape']} | {row['threads']} | {_fmt_ms(t.get('pbsdk'))} | "
            f"{_fmt_ms(t.get('numpy'))} | {_fmt_ms(t.get('torch'))} | {_fmt_ms(t.get('inductor'))} | "
            f"{_fmt_ratio(r.get('numpy'))} | {_fmt_ratio(r.get('torch'))} | {_fmt_ratio(r.get('inductor'))} | "
            f"{'–' if comp is None else f'{comp:.2f}'} | {mark} | "
            f"{'–' if cfg['quick'] else '; '.join(target_verdicts(case, row))} |")
    return "\n".join(lines) + "\n"


def plot(report: dict[str, Any], path: Path) -> bool:
    """Grouped bars of pbsdk's speed ratio vs numpy and vs torch eager per case and thread count (log
    scale, a line at 1.0). False (and no file) when matplotlib is not installed."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    results = report["results"]
    names = list(dict.fromkeys(r["case"] for r in results))
    threads = sorted({r["threads"] for r in results})
    rows = {(r["case"], r["threads"]): r for r in results}
    fig, axes = plt.subplots(2, 1, figsize=(max(10.0, 0.75 * len(names) + 3), 9), sharex=True)
    width = 0.8 / max(len(threads), 1)
    for ax, baseline in zip(axes, ("numpy", "torch")):
        for j, n in enumerate(threads):
            xs, ys, bad = [], [], []
            for i, name in enumerate(names):
                row = rows.get((name, n))
                v = (row or {}).get("ratio", {}).get(baseline)
                if v is None:
                    continue
                xs.append(i + (j - (len(threads) - 1) / 2) * width)
                ys.append(v)
                bad.append(row is not None and row.get("correct") is False)
            bars = ax.bar(xs, ys, width, label=f"{n} thread{'s' if n > 1 else ''}")
            for bar, wrong in zip(bars, bad):
                top = (bar.get_x() + bar.get_width() / 2, bar.get_height())
                ax.annotate(f"{bar.get_height():.2f}" + (" wrong" if wrong else ""), top, ha="center",
                            va="bottom", fontsize=6, rotation=90, color="red" if wrong else "black")
                if wrong:
                    bar.set_hatch("xx")
        ax.axhline(1.0, color="black", linewidth=1)
        ax.set_yscale("log")
        ax.set_ylabel(f"{baseline} time / pbsdk time")
        ax.set_title(f"pbsdk speed vs {baseline}{' (OpenBLAS)' if baseline == 'numpy' else ' CPU eager'} "
                     "(> 1: pbsdk faster)")
        ax.grid(axis="y", which="both", alpha=0.3)
        ax.legend()
    axes[-1].set_xticks(range(len(names)))
    axes[-1].set_xticklabels(names, rotation=40, ha="right", fontsize=8)
    m = report["machine"]
    fig.suptitle(f"pbsdk kernel benchmarks — {m['cpu_model']}, {m['date'][:10]}"
                 + (" (QUICK MODE)" if report["config"]["quick"] else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def update_docs(report: dict[str, Any], table: str, png: Path | None, docs: Path) -> None:
    """Replace the table between the markers in ``docs`` and copy the plot to ``docs/../img``."""
    try:
        text = docs.read_text()
    except OSError as exc:
        raise PbsdkError(f"--update-docs: cannot read {docs}: {exc.strerror}") from None
    start, end = text.find(DOCS_START), text.find(DOCS_END)
    if start < 0 or end < start:
        raise PbsdkError(f"--update-docs: {docs} has no {DOCS_START} ... {DOCS_END} markers")
    docs.write_text(text[:start + len(DOCS_START)] + "\n" + table + text[end:])
    if png is not None:
        img = docs.parent / "img"
        img.mkdir(exist_ok=True)
        shutil.copyfile(png, img / "benchmarks.png")


# ---------------------------------------------------------------------------------------------- driver

def _threads(text: str) -> list[int]:
    out = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or not 1 <= int(part) <= 1024:
            raise PbsdkError(f"--threads: expected comma-separated thread counts >= 1 (e.g. 1,2), got {text!r}")
        out.append(int(part))
    return list(dict.fromkeys(out))


def select(patterns: Sequence[str] | None) -> list[str]:
    """Case names matching ``patterns`` (a case name, a family, or a glob such as ``conv*``)."""
    if not patterns:
        return [c.name for c in CASES]
    chosen = []
    for pat in patterns:
        hits = [c.name for c in CASES if c.name == pat or c.family == pat or fnmatch.fnmatchcase(c.name, pat)]
        if not hits:
            raise PbsdkError(f"--only: no case matches {pat!r}; cases: {', '.join(c.name for c in CASES)}; "
                             f"families: {', '.join(dict.fromkeys(c.family for c in CASES))}")
        chosen += hits
    return [c.name for c in CASES if c.name in chosen]


def _contenders(text: str | None, quick: bool) -> list[str]:
    if text is None:  # Inductor compiles for tens of seconds per kernel: not in the quick smoke run
        return [c for c in CONTENDERS if not (quick and c == "inductor")]
    out = [c.strip() for c in text.split(",") if c.strip()]
    bad = [c for c in out if c not in CONTENDERS]
    if bad or not out:
        raise PbsdkError(f"--contenders: expected a comma-separated subset of {','.join(CONTENDERS)}, got {text!r}")
    return [c for c in CONTENDERS if c in out]


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The suite's options (shared by ``benchmarks/suite.py`` and ``pbsdk bench``)."""
    p.add_argument("--quick", action="store_true",
                   help="tiny shapes, one round of one call, no Inductor: a smoke run, not a measurement")
    p.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    p.add_argument("--only", nargs="+", metavar="NAME", help="cases to run: names, families or globs")
    p.add_argument("--out", default=str(DEFAULT_OUT), help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--rounds", type=int, default=None, help="rounds per case (default 7; 1 with --quick)")
    p.add_argument("--contenders", default=None,
                   help=f"comma-separated subset of {','.join(CONTENDERS)} (default all; --quick: no inductor)")
    p.add_argument("--malloc-reuse", action="store_true",
                   help="run with glibc keeping freed memory (fewer page faults on big fresh outputs)")
    p.add_argument("--update-docs", default=None, metavar="MD",
                   help="also write the table into MD between its bench-kernels-table markers and the plot "
                        "to MD's img/benchmarks.png (e.g. docs/benchmarks.md)")
    p.add_argument("--list", action="store_true", help="list the cases and exit")
    p.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--worker-out", default=None, help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Validate the options, run one worker per thread count, write the outputs. 0: every pbsdk result
    correct; 1: a pbsdk result wrong or a worker failed; bad options raise `PbsdkError` (exit 2)."""
    names = select(args.only)
    quick = bool(args.quick)
    rounds = args.rounds if args.rounds is not None else (1 if quick else 7)
    if rounds < 1:
        raise PbsdkError(f"--rounds must be >= 1, got {rounds}")
    contenders = _contenders(args.contenders, quick)
    if args.worker is not None:
        args.only, args.rounds, args.contenders = names, rounds, contenders
        return _worker(args)
    if args.list:
        for c in CASES:
            print(f"{c.name:<32} {c.family:<10} {c.dims}")
        return 0
    threads = _threads(args.threads)
    out = Path(args.out)
    if out.exists() and not out.is_dir():
        raise PbsdkError(f"--out: {out} exists and is not a directory")
    docs = Path(args.update_docs) if args.update_docs else None
    if docs is not None and (not docs.is_file() or DOCS_START not in docs.read_text()):
        raise PbsdkError(f"--update-docs: {docs} is not a file with a {DOCS_START} marker")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PbsdkError(f"--out: cannot create {out}: {exc.strerror}") from None

    report: dict[str, Any] = {
        "schema": SCHEMA, "machine": machine_info(),
        "config": {"quick": quick, "rounds": rounds, "threads": threads, "contenders": contenders,
                   "cases": names, "malloc_reuse": bool(args.malloc_reuse),
                   "method": "median over rounds of the minimum of a block of back-to-back calls; contenders "
                             "run in blocks, one block per contender per round; fresh outputs every call",
                   "ratio": "baseline time / pbsdk time (> 1: pbsdk faster)"},
        "cases": [{"name": c.name, "family": c.family, "dims": c.quick if quick else c.dims,
                   "targets": [dataclasses.asdict(t) for t in c.targets]} for c in CASES if c.name in names],
        "workers": [], "results": [],
    }
    failed_workers = []
    print(f"pbsdk bench: {len(names)} cases x threads {threads}, contenders {', '.join(contenders)}"
          f"{' (quick)' if quick else ''}", file=sys.stderr, flush=True)
    for n in threads:
        env = {**os.environ, "OMP_NUM_THREADS": str(n), "OPENBLAS_NUM_THREADS": str(n),
               "MKL_NUM_THREADS": str(n), "TORCHINDUCTOR_COMPILE_THREADS": "1"}
        if args.malloc_reuse:
            env.update(MALLOC_REUSE_ENV)
        with tempfile.TemporaryDirectory(prefix="pbsdk-bench-") as tmp:
            part = Path(tmp) / "worker.json"
            cmd = [sys.executable, "-m", "pbsdk.bench", "--worker", str(n), "--worker-out", str(part),
                   "--rounds", str(rounds), "--contenders", ",".join(contenders), "--only", *names]
            if quick:
                cmd.append("--quick")
            print(f"-- {n} thread{'s' if n > 1 else ''}", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, env=env, check=False)
            if proc.returncode or not part.exists():
                failed_workers.append(n)
                print(f"pbsdk bench: the worker for {n} threads failed (exit {proc.returncode})", file=sys.stderr)
                continue
            payload = json.loads(part.read_text())
        report["workers"].append({k: v for k, v in payload.items() if k != "results"})
        report["results"] += payload["results"]
    report["machine"]["load_average_end"] = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    order = {name: i for i, name in enumerate(names)}
    report["results"].sort(key=lambda r: (order[r["case"]], r["threads"]))
    report["failed_workers"] = failed_workers

    report["cost_model"] = cost_model_check(report["results"])
    table = markdown_table(report) + "\n" + cost_model_table(report["cost_model"])
    png = out / "benchmarks.png"
    report["plot"] = png.name if plot(report, png) else None
    if report["plot"] is None:
        print("pbsdk bench: matplotlib is not installed (pip install 'pbsdk[bench]'): no plot", file=sys.stderr)
    (out / "table.md").write_text(table)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    if docs is not None:
        update_docs(report, table, png if report["plot"] else None, docs)
    wrong = [f"{r['case']}@{r['threads']}t" for r in report["results"] if r.get("correct") is False]
    print(table)
    print(f"wrote {out / 'results.json'}, {out / 'table.md'}" + (f", {png}" if report["plot"] else ""))
    if wrong:
        print(f"pbsdk bench: WRONG or failed pbsdk results: {', '.join(wrong)}", file=sys.stderr)
    return 1 if wrong or failed_workers else 0


def main(argv: Sequence[str] | None = None, prog: str = "benchmarks/suite.py") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0] if __doc__ else None)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except PbsdkError as err:
        print(f"{prog}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main(prog="pbsdk.bench"))


def variant_options(text: str) -> dict[str, Any]:
    """Compile options from a benchmark's ``--variant`` (``OPTION=VALUE,...``): a value is read as JSON where
    it parses (``false``, ``2``), else as a string."""
    import json

    options: dict[str, Any] = {}
    for item in (kv for kv in text.split(",") if kv):
        key, _, value = item.partition("=")
        try:
            options[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            options[key.strip()] = value
    return options


def child_json(script: str, args: list[str], env: dict[str, str], timeout: float) -> dict[str, Any]:
    """Run ``python script *args`` in a fresh process (a benchmark's child: a first call with empty caches,
    a latency run) and return the last JSON object it printed on stdout, or ``{"error": ...}``."""
    import json
    import subprocess

    try:
        done = subprocess.run([sys.executable, script, *args], check=False, env=env, capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1][:300]}
    result: dict[str, Any] = json.loads(lines[-1])
    return result
