"""The compilation cache's bound: the cap, eviction of the least recently hit, weights stored once and
removed with their last entry, old or broken entries as misses, ``pbsdk cache prune``, and a reader that
keeps hitting while another process forces eviction."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from pbsdk.core.runtime import cache as cache_mod
from pbsdk.core.runtime.cache import (
    DEFAULT_MAX_BYTES,
    CacheWarning,
    CompileCache,
    get_cache,
    max_bytes_from_env,
    parse_size,
)
from pbsdk.core.target import Artifact

W = np.arange(4096, dtype=np.float32).reshape(64, 64)  # 16 KiB of "weights"


def _key(i: int, salt: str = "") -> str:
    return hashlib.sha256(f"{salt}{i}".encode()).hexdigest()


def _artifact(i: int, *constants: np.ndarray, size: int = 2000) -> Artifact:
    return Artifact("llvm-ir", f"{i:08d}" + "x" * size, "main", (((4, 8), "f32"),), (((4, 8), "f32"),),
                    {"i": i}, constants=tuple(constants))


def _same(got: Artifact | None, want: Artifact) -> bool:
    return (got is not None and got.payload == want.payload and got.metadata == want.metadata
            and len(got.constants) == len(want.constants)
            and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(got.constants, want.constants)))


def _age(path: Path, seconds_ago: float) -> None:
    t = time.time_ns() - int(seconds_ago * 1e9)
    os.utime(path, ns=(t, t))


def test_a_workload_of_twice_the_cap_stays_under_it(tmp_path: Path) -> None:
    cap = 64 << 10
    c = CompileCache(tmp_path, max_bytes=cap)
    written = 0
    for i in range(64):  # ~2 KiB entries and ~2 KiB object files: about twice the cap
        assert c.put(_key(i), _artifact(i))
        assert c.put_object(_key(i, "obj"), os.urandom(2000))
        written += c.path(_key(i)).stat().st_size + 2032
        assert c.usage() <= cap
    assert written >= 2 * cap
    info = c.info()
    assert info["max_bytes"] == cap and 0 < info["bytes"] <= cap and c.stats.evicted > 0
    assert info["objects"] > 0 and info["entries"] > 0  # both kinds count, both kinds are evicted
    # the most recent survive, whole
    assert _same(c.get(_key(63)), _artifact(63)) and c.get(_key(0)) is None


def test_the_most_recently_hit_entries_survive(tmp_path: Path) -> None:
    c = CompileCache(tmp_path, max_bytes=1 << 30)
    for i in range(10):
        assert c.put(_key(i), _artifact(i))
        _age(c.path(_key(i)), 1000 - i)  # stored in order 0..9, each a second after the last
    assert _same(c.get(_key(0)), _artifact(0))  # the oldest store, but now the latest hit
    size = c.path(_key(1)).stat().st_size
    removed, freed = c.prune(5 * size)  # room for 5 of the 10
    assert removed == 5 and freed == 5 * size
    kept = [i for i in range(10) if c.path(_key(i)).exists()]
    assert kept == [0, 6, 7, 8, 9]


def test_shared_weights_are_stored_once_and_removed_with_their_last_entry(tmp_path: Path) -> None:
    c = CompileCache(tmp_path, max_bytes=1 << 30)
    own = np.full((16,), 7, np.int8)
    assert c.put(_key(1), _artifact(1, W, own))
    assert c.put(_key(2), _artifact(2, W))
    weights = sorted(p.name for p in (tmp_path / "weights").iterdir())
    assert len(weights) == 2 and hashlib.sha256(W.tobytes()).hexdigest() in weights
    assert c.info()["weight_bytes"] == W.nbytes + own.nbytes
    for i, consts in ((1, (W, own)), (2, (W,))):  # read back from the store, verified, read-only
        got = c.get(_key(i))
        assert _same(got, _artifact(i, *consts)) and got is not None and not got.constants[0].flags.writeable
    _age(c.path(_key(1)), 100)
    _age(c.path(_key(2)), 50)
    entry = c.path(_key(2)).stat().st_size
    c.prune(entry + W.nbytes)  # entry 1 goes, and only its own weight: W is still named by entry 2
    assert not c.path(_key(1)).exists()
    assert [p.name for p in (tmp_path / "weights").iterdir()] == [hashlib.sha256(W.tobytes()).hexdigest()]
    assert _same(c.get(_key(2)), _artifact(2, W))
    c.prune(1)
    assert not any((tmp_path / "weights").iterdir()) and c.usage() == 0


def test_an_old_format_or_broken_entry_is_a_miss(tmp_path: Path) -> None:
    c = CompileCache(tmp_path)
    old = c.path(_key(1))
    tmp_path.mkdir(exist_ok=True)
    body = b'{"constants": [{"offset": 512, "sha256": "00", "shape": [4], "size": 16}]}\npayload'
    old.write_bytes(b"PBSDKCACHE 2 %s %d\n" % (hashlib.sha256(body).hexdigest().encode(), len(body)) + body)
    with pytest.warns(CacheWarning, match="format version 2"):
        assert c.get(_key(1)) is None
    assert not old.exists()
    # an entry whose weight is gone (evicted by another process between the two reads): a quiet miss
    assert c.put(_key(2), _artifact(2, W))
    for p in (tmp_path / "weights").iterdir():
        p.unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert c.get(_key(2)) is None
        assert _same(c.get(_key(2), (W,)), _artifact(2, W))  # the caller's weights need no store
    # and a weight whose bytes are wrong is removed with the entry
    assert c.put(_key(3), _artifact(3, W))
    (weight,) = (tmp_path / "weights").iterdir()
    weight.write_bytes(b"\0" * W.nbytes)
    with pytest.warns(CacheWarning, match="fails its checksum"):
        assert c.get(_key(3)) is None
    assert not weight.exists()


def test_the_cap_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert parse_size("65536") == 65536 and parse_size("64K") == parse_size("64KiB") == 65536
    assert parse_size("4G") == 4 << 30 and parse_size("512MB") == 512 << 20
    for bad in ("", "-1", "0", "1.5G", "lots"):
        with pytest.raises(ValueError):
            parse_size(bad)
    monkeypatch.delenv("PBSDK_CACHE_MAX_BYTES", raising=False)
    assert max_bytes_from_env() == DEFAULT_MAX_BYTES
    monkeypatch.setenv("PBSDK_CACHE_MAX_BYTES", "8K")
    cache = get_cache()
    assert cache is not None and cache.max_bytes == 8192
    for i in range(10):
        cache.put(_key(i), _artifact(i))
    assert cache.usage() <= 8192
    monkeypatch.setenv("PBSDK_CACHE_MAX_BYTES", "a few")
    monkeypatch.setattr(cache_mod, "_reported", set())  # it is reported once per process
    with pytest.warns(CacheWarning, match="PBSDK_CACHE_MAX_BYTES='a few'"):
        assert cache.max_bytes == DEFAULT_MAX_BYTES
    assert cache.put(_key(99), _artifact(99))  # a store never fails on it


def _cli(*args: str, directory: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pbsdk.cli", *args], capture_output=True, text=True, check=False,
                          env={**os.environ, "PBSDK_CACHE_DIR": str(directory)}, timeout=120)


def test_cli_prune_and_info(tmp_path: Path) -> None:
    c = CompileCache(tmp_path, max_bytes=1 << 30)
    for i in range(8):
        c.put(_key(i), _artifact(i, W))
    total = c.usage()
    r = _cli("cache", "info", directory=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "weights  1 " in r.stdout and f"bytes    {total} of at most" in r.stdout
    r = _cli("cache", "prune", "--max-bytes", str(W.nbytes + 3 * c.path(_key(0)).stat().st_size),
             directory=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("removed 5 entries and object files, ")
    assert json.loads(_cli("cache", "info", "--json", directory=tmp_path).stdout)["entries"] == 3
    r = _cli("cache", "prune", "--max-bytes", "nope", directory=tmp_path)
    assert r.returncode == 2 and "--max-bytes 'nope'" in r.stdout
    r = _cli("cache", "prune", directory=tmp_path)  # down to the default cap: nothing to do
    assert r.returncode == 0 and r.stdout.startswith("removed 0 entries")


WRITER = """
import os, sys, warnings
import numpy as np
sys.path.insert(0, {tests!r})
from test_cache_bound import W, _artifact, _key
from pbsdk.core.runtime.cache import CompileCache
warnings.simplefilter("error")
c = CompileCache({directory!r}, max_bytes={cap})
for i in range(300):
    assert c.put(_key(i, "writer"), _artifact(i, W + i % 7))
    c.put_object(_key(i, "writer-obj"), os.urandom(1500))
print(c.stats.evicted)
"""


def test_a_reader_keeps_hitting_while_another_process_evicts(tmp_path: Path) -> None:
    """One process stores far more than a small cap (evicting entries and weights all the time) while
    this one keeps hitting its own entries (re-storing on a miss; they share the writer's weights) and
    reading the writer's, which are evicted under it: every read is a whole, correct artifact or a clean
    miss, never an error or a warning."""
    cap = 96 << 10
    writer = subprocess.Popen(
        [sys.executable, "-c", WRITER.format(tests=str(Path(__file__).parent), directory=str(tmp_path), cap=cap)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    c = CompileCache(tmp_path, max_bytes=cap)
    want = {i: _artifact(i, W + i % 3) for i in range(4)}
    hits = misses = theirs = 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        j = 0
        while writer.poll() is None or hits + misses < 200:
            j += 1
            got = c.get(_key(j % 300, "writer"))
            if got is not None:
                theirs += 1
                assert _same(got, _artifact(j % 300, W + j % 300 % 7))
            for i, art in want.items():
                got = c.get(_key(i, "reader"))
                if got is None:
                    misses += 1
                    assert c.put(_key(i, "reader"), art)
                else:
                    hits += 1
                    assert _same(got, art)
    out, err = writer.communicate(timeout=60)
    assert writer.returncode == 0, err
    assert int(out) > 0, "the writer never evicted"
    assert hits > 0 and theirs > 0 and c.stats.corrupt == 0
    assert c.usage() <= cap
    assert not list(tmp_path.glob(".*.tmp"))
