"""Large constants (frozen weights) never become IR text: they are `pbsdk.constant` operands whose bytes
travel in `Artifact.constants`, are bound by the loader, hashed into the cache key and stored binary in
the cache (on the cpu and template targets)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text, resolve
from pbsdk.core.errors import CompileError
from pbsdk.core.ir import attributes
from pbsdk.core.ir.emit import emit_program
from pbsdk.core.ir.graph import TensorType
from pbsdk.core.runtime.cache import cache_key, get_cache
from pbsdk.core.target import DERIVED_CONSTANTS
from pbsdk.frontends.jit import trace
from pbsdk.targets.cpu.matmul_kernel import pack_b_panels
from pbsdk.testing import reference
from pbsdk.testing.tolerances import assert_close

K = 1024  # a 1024 x 1024 f32 weight: 4 MB
RNG = np.random.default_rng(7)
W = RNG.standard_normal((K, 256)).astype(np.float32)
W4 = RNG.standard_normal((K, K)).astype(np.float32)
BIAS = RNG.standard_normal((256,)).astype(np.float32)
X = RNG.standard_normal((4, K)).astype(np.float32)


def _layer(w: np.ndarray) -> object:
    def layer(x: ops.Tensor) -> ops.Tensor:
        return ops.relu(ops.matmul(x, w) + BIAS)
    return layer


def test_a_4mb_weight_is_an_operand_not_text() -> None:
    graph, _ = trace(lambda x: ops.matmul(x, W4) + 1.0, (TensorType((4, K), "f32"),))
    program = emit_program(graph)
    assert len(program.text) < 4000, program.text[:4000]  # the weight alone would print as ~10 MB
    assert "dense<" not in program.text.replace("dense<1.0", "").replace("dense<0.0", "")
    (const,) = program.constants
    assert const.dtype == np.float32 and const.shape == (K, K) and not const.flags.writeable
    np.testing.assert_array_equal(const, W4)
    assert f"{attributes.CONSTANT} = 0 : i64" in program.text
    assert "bufferization.writable = false" in program.text


def test_small_and_splat_constants_stay_inline() -> None:
    small = np.arange(16, dtype=np.float32).reshape(4, 4)
    ones = np.full((K, 8), 2.5, np.float32)  # large but one value: a splat, foldable
    graph, _ = trace(lambda x, y: (ops.matmul(x, small), y * ones), (TensorType((2, 4), "f32"),
                                                                     TensorType((K, 8), "f32")))
    program = emit_program(graph)
    assert program.constants == ()
    assert "dense<2.500000e+00> : tensor<1024x8xf32>" in program.text
    assert "tensor<4x4xf32>" in program.text and attributes.CONSTANT not in program.text


def test_a_transposed_weight_is_folded_and_still_an_operand() -> None:
    # An nn.Linear weight read transposed: the row-major copy the packed kernel takes is made in numpy.
    graph, _ = trace(lambda x: ops.matmul(x, W, transpose_b=True), (TensorType((4, 256), "f32"),))
    program = emit_program(graph)
    (const,) = program.constants
    np.testing.assert_array_equal(const, W.T)
    assert len(program.text) < 4000


@pytest.mark.parametrize("target", ["cpu", "template"])
def test_numerics_with_constant_operands(target: str) -> None:
    f = pbsdk.jit(_layer(W), target=target, options={"cache": False})
    kernel, _ = f.kernel((TensorType((4, K), "f32"),))
    assert len(kernel.artifact.constants) == 1 and kernel.artifact.inputs == (((4, K), "f32"),)
    assert len(kernel.artifact.payload) < 2 * W.nbytes // 10  # the payload is code, not the weight
    expected = reference.relu(reference.add(reference.matmul(X, W), BIAS))
    assert_close(f(X), expected, op="matmul", reduction_size=K)
    # The torch path's raw entry: pointers to the inputs and outputs only.
    out = np.empty((4, 256), np.float32)
    kernel.executable.run_pointers([X.ctypes.data, out.ctypes.data])
    assert_close(out, expected, op="matmul", reduction_size=K)


@pytest.mark.parametrize("target", ["cpu", "template"])
def test_the_cache_keys_on_the_bytes_and_round_trips_them(target: str, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch,
                                                          pipeline_runs: list[int]) -> None:
    monkeypatch.setenv("PBSDK_CACHE_DIR", str(tmp_path))
    runs = pipeline_runs
    sig = (TensorType((4, K), "f32"),)
    request = resolve(target, None, None)
    graph, _ = trace(_layer(W), sig)
    program = emit_program(graph)
    key = cache_key(program.text, request, program.constants)
    changed = W.copy()
    changed[3, 7] = np.nextafter(changed[3, 7], np.float32(np.inf))  # one bit of one weight
    graph2, _ = trace(_layer(changed), sig)
    program2 = emit_program(graph2)
    assert program2.text == program.text
    assert cache_key(program2.text, request, program2.constants) != key

    first = compile_text(program.text, request, constants=program.constants)
    assert runs[0] == 1
    (entry,) = tmp_path.glob("*.pbsdk-artifact")
    # Stored binary: the weight's bytes once, in the weight store beside the entry (no text, no base64).
    assert entry.stat().st_size < 2 * len(first.payload) + 65536
    (weight,) = (tmp_path / "weights").iterdir()
    assert weight.stat().st_size == first.constants[0].nbytes
    cache = get_cache()
    assert cache is not None
    hit = cache.get(key)
    assert hit is not None and hit.inputs == first.inputs
    (stored,) = hit.constants
    assert not stored.flags.writeable
    # cpu packs the weight for its kernel at compile time (one 1024 x nr panel per nr columns)
    np.testing.assert_array_equal(stored, W if target == "template" else pack_b_panels(W, stored.shape[-1]))

    # A hit skips the pipeline and computes with the stored bytes; the changed weight is a miss.
    again = compile_text(program.text, request, constants=program.constants)
    assert runs[0] == 1
    expected = reference.relu(reference.add(reference.matmul(X, W), BIAS))
    out = np.empty((4, 256), np.float32)
    request.target.load(again, request.spec).run([X, out])
    assert_close(out, expected, op="matmul", reduction_size=K)
    other = compile_text(program2.text, request, constants=program2.constants)
    assert runs[0] == 2
    request.target.load(other, request.spec).run([X, out])
    assert_close(out, reference.relu(reference.add(reference.matmul(X, changed), BIAS)), op="matmul",
                 reduction_size=K)


def test_a_stored_constant_that_fails_its_digest_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PBSDK_CACHE_DIR", str(tmp_path))
    graph, _ = trace(_layer(W), (TensorType((4, K), "f32"),))
    program = emit_program(graph)
    request = resolve("cpu", None, {"prepack_b": False})  # the weight stays as given (see the next test)
    key = cache_key(program.text, request, program.constants)
    compile_text(program.text, request, constants=program.constants)
    (entry,) = tmp_path.glob("*.pbsdk-artifact")
    (weight,) = (tmp_path / "weights").iterdir()  # the weight's bytes, stored apart from the entry
    data = bytearray(weight.read_bytes())
    data[-5] ^= 0xFF
    weight.write_bytes(bytes(data))
    # A compilation has the weights it hashed: the stored copy is not even read.
    artifact = compile_text(program.text, request, constants=program.constants)
    assert artifact.constants[0] is program.constants[0]
    # Read without them, the stored copy is checked against its digest.
    cache = get_cache()
    assert cache is not None
    with pytest.warns(pbsdk.core.runtime.cache.CacheWarning, match="fails its checksum"):
        assert cache.get(key) is None
    assert not entry.exists() and not weight.exists()  # the bad weight would fail every entry naming it


def test_a_weight_packed_at_compile_time_comes_from_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             pipeline_runs: list[int]) -> None:
    """cpu packs a weight for its kernel when it compiles: the artifact's constant is the packed array
    (marked derived), and a cache hit returns the stored packed copy, checked against its digest, not the
    caller's unpacked one."""
    monkeypatch.setenv("PBSDK_CACHE_DIR", str(tmp_path))
    cols = 250  # not a multiple of any register tile width: the last panel is zero-padded
    w = W[:, :cols].copy()
    graph, _ = trace(lambda x: ops.matmul(x, w), (TensorType((4, K), "f32"),))
    program = emit_program(graph)
    request = resolve("cpu", None, None)
    first = compile_text(program.text, request, constants=program.constants)
    (packed,) = first.constants
    nr = packed.shape[-1]
    assert packed.shape == (-(-cols // nr), K, nr) and first.metadata[DERIVED_CONSTANTS]
    np.testing.assert_array_equal(packed, pack_b_panels(w, nr))
    assert not packed[-1, :, cols % nr:].any() and packed.ctypes.data % 64 == 0
    expected = reference.matmul(X, w)
    out = np.empty((4, cols), np.float32)
    request.target.load(first, request.spec).run([X, out])
    assert_close(out, expected, op="matmul", reduction_size=K)

    again = compile_text(program.text, request, constants=program.constants)
    assert pipeline_runs[0] == 1
    assert again.constants[0] is not program.constants[0]
    np.testing.assert_array_equal(again.constants[0], packed)
    out[:] = 0
    request.target.load(again, request.spec).run([X, out])
    assert_close(out, expected, op="matmul", reduction_size=K)

    # The stored packed copy is what a hit uses, so it is checked: a flipped byte is a rebuild, not a wrong result.
    (weight,) = (tmp_path / "weights").iterdir()
    data = bytearray(weight.read_bytes())
    data[-5] ^= 0xFF
    weight.write_bytes(bytes(data))
    with pytest.warns(pbsdk.core.runtime.cache.CacheWarning, match="fails its checksum"):
        rebuilt = compile_text(program.text, request, constants=program.constants)
    assert pipeline_runs[0] == 2
    np.testing.assert_array_equal(rebuilt.constants[0], packed)

    # Without the option the constant is the caller's array itself.
    plain = compile_text(program.text, resolve("cpu", None, {"prepack_b": False, "cache": False}),
                         constants=program.constants)
    assert plain.constants[0] is program.constants[0] and DERIVED_CONSTANTS not in plain.metadata


def test_constants_that_do_not_match_the_entry_are_refused() -> None:
    graph, _ = trace(_layer(W), (TensorType((4, K), "f32"),))
    program = emit_program(graph)
    request = resolve("cpu", None, {"cache": False})
    with pytest.raises(CompileError, match="do not match the 0 constant"):
        compile_text(program.text, request)
    with pytest.raises(CompileError, match="constant 0 is a f64 array"):
        compile_text(program.text, request, constants=(W.astype(np.float64),))


@pytest.mark.parametrize("target", ["cpu", "template"])
def test_a_second_load_maps_the_cached_machine_code(target: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from pbsdk.targets import cpu

    monkeypatch.setenv("PBSDK_CACHE_DIR", str(tmp_path))
    graph, _ = trace(_layer(W), (TensorType((4, K), "f32"),))
    program = emit_program(graph)
    request = resolve(target, None, None)
    artifact = compile_text(program.text, request, constants=program.constants)
    request.target.load(artifact, request.spec)
    assert len(list(tmp_path.glob("*.pbsdk-object"))) == 1

    def no_llvm(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the object cache was not used")

    monkeypatch.setattr(cpu, "jit_in_process", no_llvm)
    executable = request.target.load(compile_text(program.text, request, constants=program.constants), request.spec)
    out = np.empty((4, 256), np.float32)
    executable.run([X, out])
    assert_close(out, reference.relu(reference.add(reference.matmul(X, W), BIAS)), op="matmul", reduction_size=K)
    if target == "template":  # the counters global resolves in the mapped object too
        assert sum(executable.last_counters.values()) > 0  # type: ignore[attr-defined]
