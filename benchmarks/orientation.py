"""Packed matmuls as given against computed transposed (``C^T = B^T A^T``), per shape, with the planner's
choice: the measurements behind `TRANSPOSE_MARGIN` and `TRANSPOSE_PACK_FMAS`
(`pbsdk.core.plan.contraction`, docs/optimising.md section 3).

    .venv/bin/python benchmarks/orientation.py --threads 1 --rounds 7
    .venv/bin/python benchmarks/orientation.py --shapes 512x49x2048 1000x10x1000 --threads 2

Each shape (M x N x K: A is M x K, B K x N) is compiled twice (``transpose_gemm`` false and true, cache off);
the two run in interleaved blocks of calls (about 50 ms each), the minimum per block, the median over
rounds. A ratio below 1 means the transposed kernel is faster; "model" is what the planner picks by itself.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import numpy as np

from pbsdk.bench import best_of

DEFAULT_SHAPES = ("512x49x2048", "64x49x576", "512x33x512", "2048x49x512", "2048x49x2048", "4096x8x4096",
                  "1024x24x1024", "512x196x512", "256x196x1024", "1024x196x256", "256x40x256", "1024x100x1024",
                  "1000x10x1000")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), help="MxNxK (default: the docs')")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args(argv)

    import pbsdk
    from pbsdk import ops
    from pbsdk.core.plan.contraction import Contraction, plan_contraction
    from pbsdk.core.spec import load_spec

    spec = load_spec("host")
    rng = np.random.default_rng(0)
    print("| shape (MxNxK) | threads | given ms | transposed ms | transposed / given (rounds) | model |")
    print("|---|--:|--:|--:|--:|:-:|")
    for text in args.shapes:
        m, n, k = (int(v) for v in text.split("x"))
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        want = a.astype(np.float64) @ b
        fns = []
        for flag in (False, True):
            f = pbsdk.jit(lambda x, y: ops.matmul(x, y),
                          options={"threads": args.threads, "cache": False, "transpose_gemm": flag})
            got = f(a, b)
            if not np.allclose(got, want, rtol=1e-3, atol=1e-3 * np.sqrt(k)):
                print(f"{text}: wrong result with transpose_gemm={flag}", file=sys.stderr)
                return 1
            fns.append(lambda f=f, a=a, b=b: f(a, b))
        calls = max(3, min(200, int(0.05 / max(best_of(fns[0], (), 3), 1e-6))))
        times: list[list[float]] = [[], []]
        for _ in range(args.rounds):
            for i, fn in enumerate(fns):
                times[i].append(best_of(fn, (), calls))
        given, transposed = (statistics.median(t) for t in times)
        ratios = [t / g for g, t in zip(*times)]
        chosen = plan_contraction(spec, Contraction(m, n, k), {"threads": args.threads}).blocking
        model = "transposed" if chosen is not None and chosen.transposed else "given"
        print(f"| {text} | {args.threads} | {given * 1e3:.3f} | {transposed * 1e3:.3f} | {transposed / given:.2f} "
              f"({min(ratios):.2f}-{max(ratios):.2f}) | {model} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
