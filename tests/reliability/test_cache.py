"""The on-disk compilation cache: keys, hits that skip the pipeline, corruption, concurrency, the CLI."""

from __future__ import annotations

import multiprocessing
import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

import pbsdk
from pbsdk.core.compiler import compile_text, resolve
from pbsdk.core.errors import OptionsError
from pbsdk.core.runtime import cache as cache_mod
from pbsdk.core.runtime.cache import CacheWarning, CompileCache, cache_key, get_cache
from pbsdk.core.target import Artifact

ADD = """
func.func @add(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %e = tensor.empty() : tensor<4x8xf32>
  %r = linalg.add ins(%a, %b : tensor<4x8xf32>, tensor<4x8xf32>) outs(%e : tensor<4x8xf32>) -> tensor<4x8xf32>
  return %r : tensor<4x8xf32>
}
"""


def _check_add(kernel: pbsdk.core.runtime.kernel.Kernel) -> None:  # type: ignore[name-defined]
    a = np.arange(32, dtype=np.float32).reshape(4, 8)
    b = np.ones((4, 8), np.float32)
    np.testing.assert_array_equal(kernel(a, b), a + b)


def test_key_depends_on_what_determines_the_output() -> None:
    req = resolve("cpu", None, None)
    key = cache_key(ADD, req)
    assert len(key) == 64 and key == cache_key(ADD, resolve("cpu", None, None))
    assert cache_key(ADD + "\n", req) != key
    assert cache_key(ADD, resolve("cpu", None, {"entry": "add"})) != key
    assert cache_key(ADD, resolve("cpu", "avx512", None)) != key
    # the cache switch is not part of the key; option order does not matter
    assert cache_key(ADD, resolve("cpu", None, {"cache": False})) == key
    assert (cache_key(ADD, resolve("cpu", None, {"entry": "add", "threads": 1}))
            == cache_key(ADD, resolve("cpu", None, {"threads": 1, "entry": "add"})))
    # options are parsed before the key: a default spelt out is the same compilation, a changed one is not
    assert cache_key(ADD, resolve("cpu", None, {"threads": 0, "pack": True})) == key
    assert cache_key(ADD, resolve("cpu", None, {"pack": False})) != key
    # the target's own options are part of the key
    tiles = {"tiles": {"spm": (32, 32, 32)}}
    assert cache_key(ADD, resolve("template", None, tiles)) != cache_key(ADD, resolve("template", None, None))
    assert (cache_key(ADD, resolve("template", None, {"tiles": {"spm": [32, 32, 32]}}))
            == cache_key(ADD, resolve("template", None, tiles)))


def test_an_unknown_option_is_an_error_naming_it_and_the_known_ones() -> None:
    with pytest.raises(OptionsError, match=r"unknown option 'pak'; known options .*\bpack\b.*threads"):
        resolve("cpu", None, {"pak": False})
    with pytest.raises(OptionsError, match=r"the nvgpu target's\): .*allow_spills.*ptxas"):
        resolve("nvgpu", None, {"ptxass": False})
    with pytest.raises(OptionsError, match=r"option 'threads': must be a non-negative int, got '2'"):
        resolve("cpu", None, {"threads": "2"})
    with pytest.raises(OptionsError, match=r"'tiles': the tile of level 'spm' must be three positive ints"):
        resolve("template", None, {"tiles": {"spm": (32, 32)}})
    # a target's option is unknown to another target
    with pytest.raises(OptionsError, match="unknown option 'ptxas'"):
        resolve("cpu", None, {"ptxas": False})


#: The cpu target's own options (`pbsdk.targets.cpu.options.CpuOptions`), not the core's.
CPU_ONLY = ("pack", "prepack_b", "transposed_reads", "fuse_epilogues", "implicit_conv", "fuse_rows", "expose_rows",
            "fill_borders", "transpose_blocks", "workspace")


@pytest.mark.parametrize("target", ["template", "nvgpu"])
def test_a_cpu_option_is_unknown_to_another_target_which_names_the_cpu(target: str) -> None:
    with pytest.raises(OptionsError, match=rf"unknown option 'pack'; known options \(pbsdk's and the {target} "
                                           r"target's\): .*\bthreads\b.*\('pack' is an option of target 'cpu'\)"):
        resolve(target, None, {"pack": False})
    with pytest.raises(OptionsError, match="unknown option 'pack'"):
        pbsdk.jit(lambda a: a, target=target, options={"pack": False})
    for key in CPU_ONLY:
        with pytest.raises(OptionsError, match=rf"unknown option '{key}'.*is an option of target 'cpu'"):
            resolve(target, None, {key: False})
    listed = str(_unknown_error(target)).split("known options", 1)[1]  # the core's and the target's
    assert "threads" in listed and not any(re.search(rf"\b{key}\b", listed) for key in CPU_ONLY)


def _unknown_error(target: str) -> OptionsError:
    try:
        resolve(target, None, {"nope": 1})
    except OptionsError as err:
        return err
    raise AssertionError("no error")


def test_the_cpu_target_takes_its_options() -> None:
    from pbsdk.targets.cpu import CpuOptions

    options = resolve("cpu", None, {key: False for key in CPU_ONLY}).options
    assert options.target == CpuOptions(**{key: False for key in CPU_ONLY})
    assert not options.target.isolate_contractions() and not options.target.isolate_epilogues()
    assert resolve("cpu", None, None).options.target.isolate_contractions()
    assert "prepack_b" in str(_unknown_error("cpu")) and "'nope'" in str(_unknown_error("cpu"))
    with pytest.raises(OptionsError, match="target 'cpu' option 'pack' must be bool, got 1"):
        resolve("cpu", None, {"pack": 1})


def test_round_trip_of_str_and_bytes_payloads(tmp_path: Path) -> None:
    c = CompileCache(tmp_path)
    for payload in ("text\n with lines ünïcode", b"\x00\x01binary\n\xff"):
        art = Artifact("k", payload, "main", (((2, 3), "f32"),), (((), "f64"),), {"a": [1, 2], "b": "x"})
        key = "ab" * 32
        assert c.put(key, art)
        got = c.get(key)
        assert got == art and type(got.payload) is type(payload)
    assert c.info()["entries"] == 1
    assert c.clear() == 1 and c.info()["entries"] == 0
    # metadata JSON cannot hold: not stored, no error
    assert not c.put("cd" * 32, Artifact("k", "p", "e", (), (), {"obj": object()}))


def test_hit_skips_the_pipeline_and_runs(private_cache: Path, pipeline_runs: list[int]) -> None:
    runs = pipeline_runs
    k1 = pbsdk.compile_mlir(ADD)
    assert runs[0] == 1 and get_cache().info()["entries"] == 1
    k2 = pbsdk.compile_mlir(ADD)
    assert runs[0] == 1, "a warm compile must not run the MLIR pipeline"
    assert k2.artifact == k1.artifact
    _check_add(k2)
    # stop_after never uses the cache
    compile_text(ADD, resolve("cpu", None, None), stop_after="fuse")
    assert runs[0] == 2


@pytest.mark.parametrize("how", ["env0", "env_disable", "option", "dump"])
def test_cache_can_be_disabled(how: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                               private_cache: Path, pipeline_runs: list[int]) -> None:
    options = None
    if how == "env0":
        monkeypatch.setenv("PBSDK_CACHE", "0")
    elif how == "env_disable":
        monkeypatch.setenv("PBSDK_DISABLE_CACHE", "1")
    elif how == "option":
        options = {"cache": False}
    else:
        monkeypatch.setenv("PBSDK_DUMP_DIR", str(tmp_path / "dump"))
    runs = pipeline_runs
    for _ in range(2):
        _check_add(pbsdk.compile_mlir(ADD, options=options))
    assert runs[0] == 2
    assert not private_cache.exists() or not any(private_cache.iterdir())


def _corruptions() -> dict[str, object]:
    return {
        "truncated": lambda b: b[: len(b) // 2],
        "empty": lambda b: b"",
        "flipped": lambda b: b[:-10] + bytes([b[-10] ^ 0xFF]) + b[-9:],
        "garbage": lambda b: os.urandom(200),
        "header-only": lambda b: b.split(b"\n", 1)[0] + b"\n",
        "bad-json-valid-checksum": None,
    }


@pytest.mark.parametrize("kind", list(_corruptions()))
def test_corrupt_entry_is_reported_removed_and_rebuilt(kind: str, private_cache: Path,
                                                       pipeline_runs: list[int]) -> None:
    pbsdk.compile_mlir(ADD)
    (entry,) = list(private_cache.glob("*.pbsdk-artifact"))
    blob = entry.read_bytes()
    if kind == "bad-json-valid-checksum":
        import hashlib
        body = b"{not json\n" + b"payload"
        new = b"PBSDKCACHE 3 %s %d\n" % (hashlib.sha256(body).hexdigest().encode(), len(body)) + body
    else:
        new = _corruptions()[kind](blob)  # type: ignore[operator]
    entry.write_bytes(new)
    runs = pipeline_runs
    runs[0] = 0  # count from here: the compile above wrote the entry
    with pytest.warns(CacheWarning, match=str(entry.name)):
        kernel = pbsdk.compile_mlir(ADD)
    _check_add(kernel)
    assert runs[0] == 1  # rebuilt
    assert entry.read_bytes() == blob  # and stored again, whole
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pbsdk.compile_mlir(ADD)
    assert runs[0] == 1


def test_unwritable_cache_dir_warns_and_compiles(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PBSDK_CACHE_DIR", str(blocker / "cache"))
    with pytest.warns(CacheWarning, match="cannot write"):
        _check_add(pbsdk.compile_mlir(ADD))


def _compile_in_child(args: tuple[str, int]) -> str:
    directory, i = args
    os.environ["PBSDK_CACHE_DIR"] = directory
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        k = pbsdk.compile_mlir(ADD)
        a = np.full((4, 8), i, np.float32)
        assert np.array_equal(k(a, a), 2 * a)
    return k.artifact.payload  # type: ignore[return-value]


def test_processes_compiling_the_same_kernel_at_once(private_cache: Path) -> None:
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(4) as pool:
        payloads = pool.map(_compile_in_child, [(str(private_cache), i) for i in range(8)])
    assert len(set(payloads)) == 1
    assert len(list(private_cache.glob("*.pbsdk-artifact"))) == 1
    assert not list(private_cache.glob(".*.tmp")), "no temporary files left behind"
    assert CompileCache(private_cache).get(cache_key(ADD, resolve("cpu", None, None))) is not None


def test_concurrent_readers_never_see_partial_entries(private_cache: Path) -> None:
    """Readers racing a writer that keeps replacing one entry see the whole entry or nothing."""
    import threading

    c = CompileCache(private_cache)
    art = Artifact("llvm-ir", "x" * 200_000, "e", (), (((1,), "f32"),), {})
    key = "ef" * 32
    stop, ready = threading.Event(), threading.Event()
    seen: list[object] = []

    def writer() -> None:
        while not stop.is_set():
            c.put(key, art)
            ready.set()

    t = threading.Thread(target=writer)
    t.start()
    assert ready.wait(60), "writer never stored the entry"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(300):
                got = c.get(key)
                if got is not None:
                    seen.append(got)
    finally:
        stop.set()
        t.join()
    assert seen and all(s == art for s in seen)
    assert c.stats.corrupt == 0


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pbsdk.cli", *args], capture_output=True, text=True, check=False,
                          env={**os.environ, **env}, timeout=120)


def test_cli_cache_info_and_clear(private_cache: Path) -> None:
    pbsdk.compile_mlir(ADD)
    env = {"PBSDK_CACHE_DIR": str(private_cache)}
    r = _cli("cache", "info", env=env)
    assert r.returncode == 0, r.stderr
    assert str(private_cache) in r.stdout and "entries  1" in r.stdout
    r = _cli("cache", "info", "--json", env=env)
    import json
    info = json.loads(r.stdout)
    assert info["entries"] == 1 and info["bytes"] > 0 and info["enabled"] is True
    r = _cli("cache", "clear", env=env)
    assert r.returncode == 0 and "removed 1 entry" in r.stdout
    assert json.loads(_cli("cache", "info", "--json", env=env).stdout)["entries"] == 0


def test_jit_uses_the_cache_across_functions(pipeline_runs: list[int]) -> None:
    runs = pipeline_runs

    def f(x):  # type: ignore[no-untyped-def]
        return pbsdk.ops.softmax(x * 2.0, axis=-1)

    x = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    y1 = pbsdk.jit(f)(x)
    y2 = pbsdk.jit(f)(x)  # a new JitFunction: its in-memory table is empty, the disk cache is not
    assert runs[0] == 1
    np.testing.assert_array_equal(y1, y2)
    assert cache_mod.get_cache().stats.hits >= 1

