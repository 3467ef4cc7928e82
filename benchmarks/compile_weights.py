"""Compile time and compiler memory against the bytes of frozen weights (issue #15, "weights never as text").

Builds torch models with random weights from their definitions (no downloads: ResNet-18/50 with the
torchvision layer shapes, a 12-layer GPT-2 of 124M parameters, written here in plain torch), compiles each
with ``torch.compile(backend="pbsdk")`` (frozen weights, cpu target) and reports, per model:

- ``cold``: the first call in a fresh process with an empty on-disk cache (Dynamo, tracing, the whole
  MLIR pipeline, the LLVM JIT);
- ``cached``: the first call in another fresh process on the cache the cold run filled;
- ``pbsdk``: the part of the first call spent in pbsdk's backend after torch's tracing (the sum of
  `CompileReport.seconds`: partitioning, lowering, compiling or the cache hit, loading);
- the peak resident set (VmHWM) of each process, and the resident set right after the model was built
  (before compiling), so the compiler's own share is the difference.

Every measurement runs in its own subprocess. ``--pbsdk PATH`` measures another checkout (e.g. main before
the change) on the same models. Example:

    .venv/bin/python benchmarks/compile_weights.py --models resnet50 gpt2 [--pbsdk /path/to/checkout] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODELS = ("resnet18", "resnet50", "gpt2", "mlp16")


def _build(name: str) -> tuple[Any, Any]:
    """(model in eval mode with random weights, example input)."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    torch.manual_seed(0)

    class Basic(nn.Module):
        expansion = 1

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            self.conv1 = nn.Conv2d(cin, width, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.down = None
            if stride != 1 or cin != width:
                self.down = nn.Sequential(nn.Conv2d(cin, width, 1, stride, bias=False), nn.BatchNorm2d(width))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.bn2(self.conv2(F.relu(self.bn1(self.conv1(x)))))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class Bottleneck(nn.Module):
        expansion = 4

        def __init__(self, cin: int, width: int, stride: int) -> None:
            super().__init__()
            out = width * 4
            self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, out, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(out)
            self.down = None
            if stride != 1 or cin != out:
                self.down = nn.Sequential(nn.Conv2d(cin, out, 1, stride, bias=False), nn.BatchNorm2d(out))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = F.relu(self.bn1(self.conv1(x)))
            y = F.relu(self.bn2(self.conv2(y)))
            y = self.bn3(self.conv3(y))
            return F.relu(y + (x if self.down is None else self.down(x)))

    class ResNet(nn.Module):
        """torchvision's ResNet layer shapes (stem, four stages, average pool, 1000-way classifier)."""

        def __init__(self, block: Any, layers: list[int]) -> None:
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
                                      nn.MaxPool2d(3, 2, 1))
            blocks: list[nn.Module] = []
            cin = 64
            for i, n in enumerate(layers):
                width = 64 * 2 ** i
                for j in range(n):
                    blocks.append(block(cin, width, 2 if j == 0 and i > 0 else 1))
                    cin = width * block.expansion
            self.blocks = nn.Sequential(*blocks)
            self.fc = nn.Linear(cin, 1000)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            y = self.blocks(self.stem(x))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(y, 1), 1))

    class GPT2Block(nn.Module):
        def __init__(self, d: int, heads: int) -> None:
            super().__init__()
            self.heads = heads
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc, self.out = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            b, t, d = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
            q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
            x = x + self.proj(a)
            return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))

    class GPT2(nn.Module):
        """GPT-2 small: 12 layers, d=768, 12 heads, 50257-token vocabulary (tied output), 1024 positions."""

        def __init__(self, layers: int = 12, d: int = 768, heads: int = 12, vocab: int = 50257) -> None:
            super().__init__()
            self.wte, self.wpe = nn.Embedding(vocab, d), nn.Embedding(1024, d)
            self.h = nn.ModuleList(GPT2Block(d, heads) for _ in range(layers))
            self.ln_f = nn.LayerNorm(d)

        def forward(self, idx: torch.Tensor) -> torch.Tensor:
            x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1]))
            for block in self.h:
                x = block(x)
            return self.ln_f(x) @ self.wte.weight.t()

    if name == "resnet18":
        model: nn.Module = ResNet(Basic, [2, 2, 2, 2])
        x = torch.randn(1, 3, 224, 224)
    elif name == "resnet50":
        model = ResNet(Bottleneck, [3, 4, 6, 3])
        x = torch.randn(1, 3, 224, 224)
    elif name == "gpt2":
        model = GPT2()
        x = torch.randint(0, 50257, (1, 32))
    elif name == "mlp16":  # 16 MB of weights: small enough to measure the printed-constants path too
        model = nn.Sequential(nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024), nn.GELU(),
                              nn.Linear(1024, 1024), nn.GELU(), nn.Linear(1024, 1024))
        x = torch.randn(8, 1024)
    else:
        raise SystemExit(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    for m in model.modules():  # BatchNorm statistics that are not the identity
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.uniform_(-0.1, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    return model.eval(), x


def _hwm_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(name: str) -> None:
    """One measurement: build, compile on the first call, check against eager, print JSON (with a digest of
    the output and the compile cache's counters)."""
    import torch

    torch.set_num_threads(max(1, os.cpu_count() or 1))
    model, x = _build(name)
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    params += sum(b.numel() * b.element_size() for b in model.buffers())
    with torch.no_grad():
        expected = model(x)
        built_mb = _rss_mb()
        compiled = torch.compile(model, backend="pbsdk")
        start = time.perf_counter()
        got = compiled(x)
        first = time.perf_counter() - start
        start = time.perf_counter()
        compiled(x)
        second = time.perf_counter() - start
    err = float((got - expected).abs().max() / expected.abs().max().clamp(min=1e-30))
    import hashlib

    import pbsdk.frontends.torch as pt
    from pbsdk.core.runtime.cache import get_cache

    reports = pt.reports()
    print(json.dumps({"model": name, "weights_mb": params / 2**20, "first_call_s": first, "second_call_s": second,
                      "built_rss_mb": built_mb, "peak_rss_mb": _hwm_mb(), "relative_error": err,
                      "pbsdk_s": sum(r.seconds for r in reports), "partitions": sum(r.partitions for r in reports),
                      "fallback_ops": sorted({o for r in reports for o in r.fallback_ops}),
                      "output_sha256": hashlib.sha256(got.contiguous().numpy().tobytes()).hexdigest(),
                      "cache_stats": vars(cache.stats) if (cache := get_cache()) is not None else None}))


def _run(name: str, cache: str, pbsdk: str | None, timeout: float) -> dict[str, Any]:
    env = dict(os.environ, PBSDK_CACHE_DIR=cache)  # PBSDK_CACHE_URL passes through
    env.pop("PBSDK_CACHE", None)
    env.pop("PBSDK_DISABLE_CACHE", None)
    root = pbsdk or str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    try:
        done = subprocess.run([sys.executable, __file__, "--child", name], check=False, env=env, capture_output=True,
                              text=True, timeout=timeout, cwd=root)
    except subprocess.TimeoutExpired:
        return {"model": name, "error": f"timed out after {timeout:.0f} s"}
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"model": name, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(lines[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=["resnet50", "gpt2"], choices=MODELS)
    parser.add_argument("--pbsdk", help="checkout to measure (default: this one)")
    parser.add_argument("--timeout", type=float, default=1800)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child)
        return
    results = []
    print(f"{'model':10} {'weights':>9} {'run':7} {'first call':>11} {'pbsdk':>7} {'built RSS':>10} "
          f"{'peak RSS':>9} {'compiler':>9} {'rel err':>8}")
    for name in args.models:
        with tempfile.TemporaryDirectory(prefix="pbsdk-weights-cache-") as cache:
            for run in ("cold", "cached"):
                r = _run(name, cache, args.pbsdk, args.timeout) | {"run": run}
                results.append(r)
                if "error" in r:
                    print(f"{name:10} {'':>9} {run:7} error: {r['error']}")
                    continue
                print(f"{name:10} {r['weights_mb']:7.1f}MB {run:7} {r['first_call_s']:10.2f}s "
                      f"{r.get('pbsdk_s', float('nan')):6.2f}s {r['built_rss_mb']:8.0f}MB {r['peak_rss_mb']:7.0f}MB "
                      f"{r['peak_rss_mb'] - r['built_rss_mb']:7.0f}MB {r['relative_error']:8.1e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
