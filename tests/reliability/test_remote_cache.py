"""The compile cache's remote tier (``PBSDK_CACHE_URL``) against a real ``redis-server`` on a loopback port:
two machines (two local directories) sharing one server, and the faults — the server stopped mid-run, a
server that never answers, a damaged entry — each degrading to a local compile with one warning."""

from __future__ import annotations

import hashlib
import shutil
import socket
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from pbsdk.core.runtime import remote as remote_mod
from pbsdk.core.runtime.cache import CacheWarning, CompileCache
from pbsdk.core.target import Artifact

redis = pytest.importorskip("redis", reason="the remote tier needs the redis package (pip install pbsdk[remote])")
pytestmark = pytest.mark.skipif(shutil.which("redis-server") is None,
                                reason="redis-server not found (Debian: apt-get install redis-server; .ci/run installs it)")

W = np.arange(1 << 16, dtype=np.float32)  # 256 KiB of weights: they must not travel


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class _Server:
    def __init__(self, tmp: Path) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.exceptions.ConnectionError:
                time.sleep(0.05)
        self.client = client

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[_Server]:
    s = _Server(tmp_path)
    yield s
    s.stop()


def _tier(url: str, **kw: float) -> remote_mod.RedisTier:
    return remote_mod.RedisTier(url, f"test{time.monotonic_ns()}", **kw)


def _key(i: int) -> str:
    return hashlib.sha256(str(i).encode()).hexdigest()


def _artifact(i: int, *constants: np.ndarray) -> Artifact:
    return Artifact("llvm-ir", f"kernel {i} " + "x" * 1000, "main", (((4,), "f32"),), (((4,), "f32"),), {"i": i},
                    constants=tuple(constants))


def test_two_machines_share_code_not_weights(server: _Server, tmp_path: Path) -> None:
    tier = _tier(server.url)
    a, b = CompileCache(tmp_path / "a", remote=tier), CompileCache(tmp_path / "b", remote=tier)
    assert a.put(_key(1), _artifact(1, W)) and a.put_object(_key(2), b"\x7fELF machine code")
    stored = [k for k in server.client.keys("*")]
    assert len(stored) == 2 and max(len(server.client.get(k)) for k in stored) < 4096  # no weight bytes
    got = b.get(_key(1), constants=(W,))  # machine b has the weights: they are its caller's
    assert got is not None and got.payload == _artifact(1).payload and got.constants[0] is W
    assert b.stats.remote_hits == 1 and b.path(_key(1)).exists()  # now local too
    assert b.get_object(_key(2)) == b"\x7fELF machine code" and b.stats.remote_hits == 2
    c = CompileCache(tmp_path / "c", remote=tier)
    assert c.get(_key(1)) is None  # no weights here, none given: a miss, not a failure


def test_weights_the_compiler_packed_travel_by_digest(server: _Server, tmp_path: Path) -> None:
    from pbsdk.core.target import DERIVED_CONSTANTS

    tier = _tier(server.url)
    packed = np.arange(1 << 14, dtype=np.float32).reshape(128, 128)  # made at compile time from the caller's
    art = Artifact("llvm-ir", "k", "main", (((4,), "f32"),), (((4,), "f32"),), {DERIVED_CONSTANTS: True},
                   constants=(packed,))
    assert CompileCache(tmp_path / "a", remote=tier).put(_key(7), art)
    assert any(k.startswith(b"test") and b":weight:" in k for k in server.client.keys("*"))
    b = CompileCache(tmp_path / "b", remote=tier)
    got = b.get(_key(7))  # no constants passed: they are the compiler's, fetched by digest and checked
    assert got is not None and np.array_equal(got.constants[0], packed) and (b.weights).is_dir()
    for k in server.client.keys("*:weight:*"):  # a damaged packed weight: a miss, not a wrong kernel
        blob = bytearray(server.client.get(k))
        blob[0] ^= 1
        server.client.set(k, bytes(blob))
    c = CompileCache(tmp_path / "c", remote=tier)
    with pytest.warns(CacheWarning, match="damaged"):
        assert c.get(_key(7)) is None
    assert server.client.keys("*") == [] and not any(c.weights.glob("*"))  # removed there and here


def test_a_server_stopped_mid_run_degrades_to_local_with_one_warning(server: _Server, tmp_path: Path) -> None:
    tier = _tier(server.url, retry_s=60)
    cache = CompileCache(tmp_path / "a", remote=tier)
    assert cache.put(_key(1), _artifact(1))
    server.stop()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        for i in range(2, 6):  # stores and lookups go on locally
            assert cache.put(_key(i), _artifact(i))
            assert cache.get(_key(i)) is not None and cache.get(_key(100 + i)) is None
    remote_warnings = [w for w in seen if "remote tier" in str(w.message)]
    assert len(remote_warnings) == 1 and issubclass(remote_warnings[0].category, CacheWarning)
    assert "unreachable" in str(remote_warnings[0].message) and tier.failures == 1


def test_a_server_that_never_answers_costs_one_timeout(tmp_path: Path) -> None:
    with socket.socket() as silent:  # accepts connections, never replies
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        tier = _tier(f"redis://127.0.0.1:{silent.getsockname()[1]}/0", timeout_s=0.3)
        cache = CompileCache(tmp_path, remote=tier)
        start = time.monotonic()
        with pytest.warns(CacheWarning, match="remote tier"):
            assert cache.get(_key(1)) is None
        for i in range(20):
            assert cache.get(_key(i)) is None and cache.put(_key(i), _artifact(i))
        assert time.monotonic() - start < 3.0 and tier.failures == 1


def test_a_damaged_entry_is_a_miss_and_removed_there(server: _Server, tmp_path: Path) -> None:
    tier = _tier(server.url, retry_s=0)
    a, b = CompileCache(tmp_path / "a", remote=tier), CompileCache(tmp_path / "b", remote=tier)
    assert a.put(_key(1), _artifact(1)) and a.put_object(_key(2), b"code")
    for key in server.client.keys("*"):
        blob = bytearray(server.client.get(key))
        blob[-3] ^= 0xFF  # a flipped byte in the payload: the checksum fails
        server.client.set(key, bytes(blob))
    with pytest.warns(CacheWarning, match="damaged"):
        assert b.get(_key(1)) is None
    with pytest.warns(CacheWarning, match="damaged"):
        assert b.get_object(_key(2)) is None
    assert server.client.keys("*") == [] and b.stats.corrupt == 1 and not b.path(_key(1)).exists()


def test_a_jit_compile_on_a_second_machine_comes_from_the_server(server: _Server, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import pbsdk
    from pbsdk import ops
    from pbsdk.core.runtime import cache as cache_mod

    monkeypatch.setenv("PBSDK_CACHE_URL", server.url)
    x = np.arange(64, dtype=np.float32).reshape(8, 8)
    results, stats = [], []
    for machine in ("a", "b"):
        monkeypatch.setenv("PBSDK_CACHE_DIR", str(tmp_path / machine))
        fn = pbsdk.jit(lambda t: ops.tanh(ops.matmul(t, t) * 0.01))
        results.append(fn(x))
        cache = cache_mod.get_cache()
        assert cache is not None and cache.remote is not None
        stats.append(cache.stats)
    assert stats[0].remote_hits == 0 and stats[0].stores >= 1
    assert stats[1].remote_hits >= 1 and stats[1].stores == 0  # nothing compiled on machine b
    np.testing.assert_array_equal(results[0], results[1])


def test_urls_the_tier_cannot_use_are_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PBSDK_CACHE_URL", "memcached://127.0.0.1:11211")
    with pytest.warns(CacheWarning, match="only redis://"):
        assert remote_mod.remote_from_env("ns-unknown-scheme") is None
