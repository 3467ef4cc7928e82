"""A DCGAN-style generator (a 100-vector to a 3x32x32 image: ConvTranspose2d 4x4 from the 1x1 input, then
three 4x4 stride-2 ones, BatchNorm, ReLU, tanh), batch 1 and 8, default and channels-last layout, through
``torch.compile(backend="pbsdk")`` against Inductor and eager: wall time per call, the best of 10 calls a
round, 7 interleaved rounds, median; the ratio's range over rounds in brackets; max error against eager.

    PYTHONPATH=. .venv/bin/python benchmarks/dcgan.py [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

from pbsdk.bench import cpu_model


def generator() -> Any:
    from torch import nn

    return nn.Sequential(
        nn.ConvTranspose2d(100, 256, 4, 1, 0, bias=False), nn.BatchNorm2d(256), nn.ReLU(True),
        nn.ConvTranspose2d(256, 128, 4, 2, 1, bias=False), nn.BatchNorm2d(128), nn.ReLU(True),
        nn.ConvTranspose2d(128, 64, 4, 2, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU(True),
        nn.ConvTranspose2d(64, 3, 4, 2, 1, bias=False), nn.Tanh()).eval()


def _best(fn: Callable[[], Any], calls: int) -> float:
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def row(torch: Any, batch: int, channels_last: bool, threads: int, rounds: int) -> str:
    torch.manual_seed(0)
    model, x = generator(), torch.randn(batch, 100, 1, 1)
    if channels_last:
        model, x = model.to(memory_format=torch.channels_last), x.contiguous(memory_format=torch.channels_last)
    with torch.inference_mode():
        contenders = {"pbsdk": torch.compile(model, backend="pbsdk", dynamic=False,
                                             options={"compile_options": {"threads": threads}}),
                      "inductor": torch.compile(model, dynamic=False), "eager": model}
        want = model(x)
        err = float((contenders["pbsdk"](x) - want).abs().max())
        contenders["inductor"](x)
        time.sleep(5)  # Inductor's compile workers settle
        times: dict[str, list[float]] = {k: [] for k in contenders}
        for _ in range(rounds):
            for name, fn in contenders.items():
                times[name].append(_best(lambda fn=fn: fn(x), 10))
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    ratios = sorted(a / b for a, b in zip(times["inductor"], times["pbsdk"]))
    return (f"| {batch} | {'channels last' if channels_last else 'default'} | {med['pbsdk']:.3f} | "
            f"{med['inductor']:.3f} | {med['eager']:.3f} | {statistics.median(ratios):.2f} "
            f"[{ratios[0]:.2f}-{ratios[-1]:.2f}] | {err:.1e} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    print(f"{cpu_model()}, {args.threads} thread(s)")
    print("| batch | layout | pbsdk ms | Inductor ms | eager ms | x Inductor [range] | max err |")
    print("|---|---|---|---|---|---|---|")
    for batch in (1, 8):
        for channels_last in (False, True):
            print(row(torch, batch, channels_last, args.threads, args.rounds), flush=True)


if __name__ == "__main__":
    main()
