"""The main job (``make demo`` / ``pbsdk demo``): compile and run a small program on a target and compare
it with numpy — max error against a float64 numpy reference, and time against numpy (float32), as the
median of several repeats measured in the same process."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import pbsdk
from pbsdk import ops


def mlp_layer(x: Any, w: Any, b: Any) -> Any:
    """An MLP layer with bias and GELU (tanh form), then a softmax over features."""
    return ops.softmax(ops.gelu(x @ w + b, approximate="tanh"), axis=-1)


def mlp_layer_numpy(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    h = x @ w + b
    g = 0.5 * h * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h**3)))
    e = np.exp(g - g.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def _median_time(fn: Callable[[], Any], repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main(*, target: str = "cpu", spec: str | None = None, repeats: int = 20,
         shape: tuple[int, int, int] = (64, 256, 256)) -> int:
    batch, d_in, d_out = shape
    rng = np.random.default_rng(0)
    x = rng.standard_normal((batch, d_in), dtype=np.float32)
    w = (rng.standard_normal((d_in, d_out), dtype=np.float32) / math.sqrt(d_in)).astype(np.float32)
    b = rng.standard_normal(d_out, dtype=np.float32)

    t0 = time.perf_counter()
    layer = pbsdk.jit(mlp_layer, target=target, spec=spec)
    out = layer(x, w, b)
    compile_s = time.perf_counter() - t0

    ref = mlp_layer_numpy(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64))
    abs_err = float(np.max(np.abs(out - ref)))
    rel_err = float(np.max(np.abs(out - ref) / np.maximum(np.abs(ref), 1e-30)))
    t_pbsdk = _median_time(lambda: layer(x, w, b), repeats)
    t_numpy = _median_time(lambda: mlp_layer_numpy(x, w, b), repeats)
    spec_name = layer.request.spec.name

    print(f"pbsdk demo: softmax(gelu(x @ w + b)) with x {x.shape}, w {w.shape}, f32")
    print(f"  target         {target} (spec {spec_name})")
    print(f"  compile        {compile_s * 1e3:9.1f} ms (trace + pipeline + JIT, first call)")
    print(f"  max abs error  {abs_err:9.2e} vs float64 numpy")
    print(f"  max rel error  {rel_err:9.2e}")
    print(f"  time pbsdk     {t_pbsdk * 1e3:9.3f} ms (median of {repeats})")
    print(f"  time numpy     {t_numpy * 1e3:9.3f} ms (median of {repeats}, float32)")
    print(f"  speed          {t_numpy / t_pbsdk:9.3f}x numpy")
    ok = abs_err < 1e-5
    print("  result         " + ("OK" if ok else "WRONG: error above 1e-5"))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
