"""Two machines, one Redis (issue #35): the second compiles a model's kernels from the remote tier.

Starts a ``redis-server`` on a free loopback port and runs `compile_weights.child` (build the model, the
first call through ``torch.compile(backend="pbsdk")``, then a second call) in fresh processes, each with its
own empty local cache directory and ``PBSDK_CACHE_URL`` pointing at that server:

- ``cold``: machine A, the server empty: everything compiled (and stored locally and remotely);
- ``remote``: machine B, its own empty directory: kernels come from the server;
- ``down``: machine C, the server stopped: everything compiled locally, one warning;
- ``damaged``: machine D, every entry on the server with a flipped byte: compiled locally, one warning.

Reported per run: the first call's seconds, the cache counters, the output's digest (identical across runs
means bit-identical results) and the warnings about the remote tier. Example::

    .venv/bin/python benchmarks/remote_cache.py --model resnet50 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import compile_weights


def _server(tmp: str) -> tuple[subprocess.Popen[bytes], str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
                             "no", "--dir", tmp], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc, f"redis://127.0.0.1:{port}/0"


def _run(model: str, url: str, tmp: str, name: str) -> dict[str, Any]:
    os.environ["PBSDK_CACHE_URL"] = url
    env_cmd = [sys.executable, compile_weights.__file__, "--child", model]
    cache = str(Path(tmp) / name)
    env = dict(os.environ, PBSDK_CACHE_DIR=cache, PYTHONWARNINGS="always")
    done = subprocess.run(env_cmd, env=env, capture_output=True, text=True, timeout=3600, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        return {"run": name, "error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    warned = [ln.strip() for ln in done.stderr.splitlines() if "remote tier" in ln]
    return json.loads(lines[-1]) | {"run": name, "remote_warnings": warned}


def _damage(url: str) -> int:
    import redis

    client = redis.Redis.from_url(url)
    keys = client.keys("*")
    for key in keys:
        blob = bytearray(client.get(key))
        blob[len(blob) // 2] ^= 0xFF
        client.set(key, bytes(blob))
    return len(keys)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet50", choices=compile_weights.MODELS)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found (Debian: apt-get install redis-server)")
    results = []
    with tempfile.TemporaryDirectory(prefix="pbsdk-remote-") as tmp:
        proc, url = _server(tmp)
        try:
            results.append(_run(args.model, url, tmp, "cold"))
            results.append(_run(args.model, url, tmp, "remote"))
            damaged = _damage(url)
            results.append(_run(args.model, url, tmp, "damaged") | {"entries_damaged": damaged})
        finally:
            proc.terminate()
            proc.wait()
        results.append(_run(args.model, url, tmp, "down"))
    cold = results[0].get("first_call_s", float("nan"))
    print(f"{'run':8} {'first call s':>12} {'vs cold':>8} {'remote hits':>11} {'stores':>6} {'same output':>11}  warnings")
    for r in results:
        if "error" in r:
            print(f"{r['run']:8} error: {r['error']}")
            continue
        stats = r.get("cache_stats") or {}
        same = r["output_sha256"] == results[0].get("output_sha256")
        print(f"{r['run']:8} {r['first_call_s']:12.2f} {cold / r['first_call_s']:7.2f}x {stats.get('remote_hits', 0):11d} "
              f"{stats.get('stores', 0):6d} {same!s:>11}  {len(r['remote_warnings'])}")
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
