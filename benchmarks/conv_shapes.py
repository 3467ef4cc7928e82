"""Convolutions of every shape (issue #33 item 3) beyond the suite's rows: grouped 3x3 convolutions of
every group width (`pbsdk.ops`, NHWC) and the suite's shapes as torch modules through
``torch.compile(module, backend="pbsdk")``, each against torch eager in channels_last (oneDNN).

Same process, contenders interleaved: per round each runs a block of calls and keeps the block's minimum
(``time.thread_time`` at 1 thread, so other jobs on a shared machine count less; wall time at more); the
median over rounds and the ratio's range over rounds are printed. After torch.compile's first call the
script waits (``--settle``) before timing: torch's compile workers keep a core busy for seconds after it.

    PYTHONPATH=. .venv/bin/python benchmarks/conv_shapes.py --threads 1 [--only widths|compile]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _timed(fns: dict[str, Callable[[], Any]], rounds: int, repeats: int, clock: Callable[[], float]) -> dict[str, list[float]]:
    for f in fns.values():
        f()
        f()
    mins: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(rounds):
        for k, f in fns.items():
            best = math.inf
            for _ in range(repeats):
                t = clock()
                f()
                best = min(best, clock() - t)
            mins[k].append(best)
    return mins


def _line(name: str, mins: dict[str, list[float]], err: float) -> str:
    ratios = sorted(t / p for t, p in zip(mins["torch"], mins["pbsdk"]))
    return (f"| {name} | {statistics.median(mins['pbsdk']) * 1e3:.3f} | {statistics.median(mins['torch']) * 1e3:.3f} | "
            f"{statistics.median(ratios):.2f} [{ratios[0]:.2f}-{ratios[-1]:.2f}] | {err:.1e} |")


def widths(torch: Any, threads: int, rounds: int, clock: Callable[[], float]) -> None:
    import pbsdk
    from pbsdk import ops
    from pbsdk.core.ir.emit import direct_conv_route
    from pbsdk.core.options import parse_options
    from pbsdk.core.spec import load_spec
    from pbsdk.frontends.jit import trace

    rng = np.random.default_rng(0)
    print("| grouped 3x3, 28x28, NHWC (channels, groups: in -> out a group) | route | pbsdk ms | torch ms | ratio [range] | max err |")
    print("|---|---|---|---|---|---|")
    for c, g, o in [(64, 64, 128), (128, 64, 128), (128, 32, 128), (128, 16, 128), (128, 8, 128), (128, 4, 128),
                    (256, 8, 256), (256, 4, 256)]:
        x = rng.standard_normal((1, 28, 28, c), dtype=np.float32)
        w = rng.standard_normal((3, 3, c // g, o), dtype=np.float32)
        f = pbsdk.jit(lambda a, b, g=g: ops.conv2d(a, b, padding=1, groups=g, layout="NHWC"), options={"threads": threads})
        graph, _ = trace(f.fn, f._signature((x, w)))
        (node,) = [n for n in graph.live_nodes() if n.op == "conv2d"]
        route = direct_conv_route(node, load_spec("host"), parse_options({}))
        tw = torch.from_numpy(w).permute(3, 2, 0, 1).contiguous(memory_format=torch.channels_last)
        tx = torch.from_numpy(x).permute(0, 3, 1, 2)
        got = np.asarray(f(x, w))
        want = torch.nn.functional.conv2d(tx, tw, padding=1, groups=g).permute(0, 2, 3, 1).numpy()
        mins = _timed({"pbsdk": lambda f=f, x=x, w=w: f(x, w),
                       "torch": lambda tx=tx, tw=tw, g=g: torch.nn.functional.conv2d(tx, tw, padding=1, groups=g)},
                      rounds, 15, clock)
        line = _line(f"{c}->{o}, {g} groups ({c // g} -> {o // g})", mins, float(np.abs(got - want).max()))
        print(line.replace(" | ", f" | {route.route if route else 'contraction'} | ", 1), flush=True)


def compiled(torch: Any, threads: int, rounds: int, clock: Callable[[], float], settle: float) -> None:
    import pbsdk.frontends.torch  # noqa: F401 - registers backend "pbsdk"

    nn = torch.nn

    class Block(nn.Module):
        def __init__(self, c: int, width: int) -> None:
            super().__init__()
            self.a = nn.Sequential(nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c), nn.ReLU(),
                                   nn.Conv2d(c, c, 3, padding=1, groups=c // width, bias=False), nn.BatchNorm2d(c),
                                   nn.ReLU(), nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c))

        def forward(self, x: Any) -> Any:
            return torch.relu(self.a(x) + x)

    torch.manual_seed(0)
    regnet = nn.Sequential(nn.Conv2d(3, 64, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                           nn.Conv2d(64, 128, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(128), nn.ReLU(),
                           Block(128, 16), Block(128, 16), Block(128, 16))
    modules = {
        "grouped 3x3 128ch 8 groups 28^2": (nn.Conv2d(128, 128, 3, padding=1, groups=8, bias=False), (1, 128, 28, 28)),
        "depthwise 7x7 96ch 56^2": (nn.Conv2d(96, 96, 7, padding=3, groups=96, bias=False), (1, 96, 56, 56)),
        "transposed 3x3 s2 64->32 28^2": (nn.ConvTranspose2d(64, 32, 3, stride=2, padding=1, output_padding=1,
                                                             bias=False), (1, 64, 28, 28)),
        "3->16 3x3 on 128 x 32^2": (nn.Conv2d(3, 16, 3, padding=1, bias=False), (128, 3, 32, 32)),
        "RegNet-style stage (112^2 input)": (regnet, (1, 3, 112, 112)),
    }
    print("| torch.compile(backend='pbsdk'), channels_last module and input | pbsdk ms | torch eager ms | ratio [range] | max err |")
    print("|---|---|---|---|---|")
    for name, (m, shape) in modules.items():
        m = m.eval().to(memory_format=torch.channels_last)  # built outside inference mode: frozen weights
        x = torch.randn(shape).contiguous(memory_format=torch.channels_last)
        with torch.inference_mode():
            c = torch.compile(m, backend="pbsdk", dynamic=False,
                              options={"compile_options": {"threads": threads}})
            err = float((c(x) - m(x)).abs().max())
            time.sleep(settle)
            mins = _timed({"pbsdk": lambda c=c, x=x: c(x), "torch": lambda m=m, x=x: m(x)}, rounds, 10, clock)
        print(_line(name, mins, err), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--settle", type=float, default=8.0, help="seconds to wait after torch.compile's first call")
    ap.add_argument("--only", choices=["widths", "compile"])
    args = ap.parse_args()
    import os

    import torch

    from pbsdk.bench import cpu_model

    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"{cpu_model()}, {args.threads} thread(s), load average {os.getloadavg()[0]:.1f}; ratio = torch / pbsdk")
    if args.only in (None, "widths"):
        with torch.inference_mode():
            widths(torch, args.threads, args.rounds, clock)
    if args.only in (None, "compile"):
        compiled(torch, args.threads, args.rounds, clock, args.settle)


if __name__ == "__main__":
    main()
