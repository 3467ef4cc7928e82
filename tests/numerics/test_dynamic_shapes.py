"""Kernels with a dynamic (``?``) dimension against numpy, at sizes they were not compiled for: one row,
odd counts across the register tile and the size buckets (`pbsdk.core.plan.dynamic`), large. One compiled
kernel serves every size; a target without dynamic shapes refuses them with a typed error."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk.core.errors import ArgumentError, DynamicShapeError
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(11)
SIZES = (1, 2, 5, 7, 8, 13, 31, 32, 100, 128, 333, 511, 512, 1000, 2049)

MATMUL = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#col = affine_map<(d0, d1) -> (d1)>
func.func @f(%x: tensor<?x{K}xf32>, %w: tensor<{K}x{N}xf32>, %bias: tensor<{N}xf32>) -> tensor<?x{N}xf32> {
  %c0 = arith.constant 0 : index
  %m = tensor.dim %x, %c0 : tensor<?x{K}xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty(%m) : tensor<?x{N}xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<?x{N}xf32>) -> tensor<?x{N}xf32>
  %p = linalg.matmul ins(%x, %w : tensor<?x{K}xf32>, tensor<{K}x{N}xf32>) outs(%f : tensor<?x{N}xf32>) -> tensor<?x{N}xf32>
  %e2 = tensor.empty(%m) : tensor<?x{N}xf32>
  %r = linalg.generic {indexing_maps = [#id, #col, #id], iterator_types = ["parallel", "parallel"]}
      ins(%p, %bias : tensor<?x{N}xf32>, tensor<{N}xf32>) outs(%e2 : tensor<?x{N}xf32>) {
  ^bb0(%a: f32, %b: f32, %o: f32):
    %s = arith.addf %a, %b : f32
    %zero = arith.constant 0.0 : f32
    %y = arith.maximumf %s, %zero : f32
    linalg.yield %y : f32
  } -> tensor<?x{N}xf32>
  return %r : tensor<?x{N}xf32>
}
"""

BATCH_MATMUL = """
func.func @f(%q: tensor<4x?x64xf32>, %k: tensor<4x64x96xf32>) -> tensor<4x?x96xf32> {
  %c1 = arith.constant 1 : index
  %m = tensor.dim %q, %c1 : tensor<4x?x64xf32>
  %z = arith.constant 0.0 : f32
  %e = tensor.empty(%m) : tensor<4x?x96xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<4x?x96xf32>) -> tensor<4x?x96xf32>
  %p = linalg.batch_matmul ins(%q, %k : tensor<4x?x64xf32>, tensor<4x64x96xf32>) outs(%f : tensor<4x?x96xf32>) -> tensor<4x?x96xf32>
  return %p : tensor<4x?x96xf32>
}
"""

#: Layer normalisation over rows of 768 (no affine part), the row count dynamic.
LAYERNORM = """
#id = affine_map<(d0, d1) -> (d0, d1)>
#row = affine_map<(d0, d1) -> (d0)>
func.func @f(%x: tensor<?x768xf32>) -> tensor<?x768xf32> {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %x, %c0 : tensor<?x768xf32>
  %z = arith.constant 0.0 : f32
  %inv = arith.constant 0.00130208337 : f32
  %eps = arith.constant 1.0e-5 : f32
  %e1 = tensor.empty(%n) : tensor<?xf32>
  %f1 = linalg.fill ins(%z : f32) outs(%e1 : tensor<?xf32>) -> tensor<?xf32>
  %sum = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%x : tensor<?x768xf32>) outs(%f1 : tensor<?xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %s = arith.addf %a, %acc : f32
    linalg.yield %s : f32
  } -> tensor<?xf32>
  %e2 = tensor.empty(%n) : tensor<?x768xf32>
  %c = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%x, %sum : tensor<?x768xf32>, tensor<?xf32>) outs(%e2 : tensor<?x768xf32>) {
  ^bb0(%a: f32, %s: f32, %o: f32):
    %mean = arith.mulf %s, %inv : f32
    %d = arith.subf %a, %mean : f32
    linalg.yield %d : f32
  } -> tensor<?x768xf32>
  %f2 = linalg.fill ins(%z : f32) outs(%e1 : tensor<?xf32>) -> tensor<?xf32>
  %ss = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}
      ins(%c : tensor<?x768xf32>) outs(%f2 : tensor<?xf32>) {
  ^bb0(%a: f32, %acc: f32):
    %sq = arith.mulf %a, %a : f32
    %s = arith.addf %sq, %acc : f32
    linalg.yield %s : f32
  } -> tensor<?xf32>
  %e3 = tensor.empty(%n) : tensor<?x768xf32>
  %y = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel"]}
      ins(%c, %ss : tensor<?x768xf32>, tensor<?xf32>) outs(%e3 : tensor<?x768xf32>) {
  ^bb0(%a: f32, %s: f32, %o: f32):
    %var = arith.mulf %s, %inv : f32
    %ve = arith.addf %var, %eps : f32
    %r = math.rsqrt %ve : f32
    %v = arith.mulf %a, %r : f32
    linalg.yield %v : f32
  } -> tensor<?x768xf32>
  return %y : tensor<?x768xf32>
}
"""

#: A result one row longer than the input (a cache growing by a step): its size is an expression.
APPEND = """
func.func @f(%cache: tensor<?x64xf32>, %new: tensor<1x64xf32>) -> tensor<?x64xf32> {
  %c0 = arith.constant 0 : index
  %c1 = arith.constant 1 : index
  %n = tensor.dim %cache, %c0 : tensor<?x64xf32>
  %n1 = arith.addi %n, %c1 : index
  %e = tensor.empty(%n1) : tensor<?x64xf32>
  %a = tensor.insert_slice %cache into %e[0, 0] [%n, 64] [1, 1] : tensor<?x64xf32> into tensor<?x64xf32>
  %b = tensor.insert_slice %new into %a[%n, 0] [1, 64] [1, 1] : tensor<1x64xf32> into tensor<?x64xf32>
  return %b : tensor<?x64xf32>
}
"""


#: A decoder step's attention, unfused, over a key length known at call time: scores Q @ K^T (a dynamic n),
#: softmax over them, P @ V (a dynamic k); 8 heads of 64, one query.
ATTENTION = """#id = affine_map<(d0, d1, d2) -> (d0, d1, d2)>
#row = affine_map<(d0, d1, d2) -> (d0, d1)>
func.func @f(%q: tensor<8x1x64xf32>, %kt: tensor<8x64x?xf32>, %v: tensor<8x?x64xf32>) -> tensor<8x1x64xf32> {
  %c2 = arith.constant 2 : index
  %s = tensor.dim %kt, %c2 : tensor<8x64x?xf32>
  %z = arith.constant 0.0 : f32
  %ninf = arith.constant -3.4e38 : f32
  %e = tensor.empty(%s) : tensor<8x1x?xf32>
  %f = linalg.fill ins(%z : f32) outs(%e : tensor<8x1x?xf32>) -> tensor<8x1x?xf32>
  %sc = linalg.batch_matmul ins(%q, %kt : tensor<8x1x64xf32>, tensor<8x64x?xf32>) outs(%f : tensor<8x1x?xf32>) -> tensor<8x1x?xf32>
  %em = tensor.empty() : tensor<8x1xf32>
  %fm = linalg.fill ins(%ninf : f32) outs(%em : tensor<8x1xf32>) -> tensor<8x1xf32>
  %mx = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%sc : tensor<8x1x?xf32>) outs(%fm : tensor<8x1xf32>) {
  ^bb0(%a: f32, %m: f32):
    %y = arith.maximumf %a, %m : f32
    linalg.yield %y : f32
  } -> tensor<8x1xf32>
  %ex = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%sc, %mx : tensor<8x1x?xf32>, tensor<8x1xf32>) outs(%e : tensor<8x1x?xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %d = arith.subf %a, %m : f32
    %y = math.exp %d : f32
    linalg.yield %y : f32
  } -> tensor<8x1x?xf32>
  %fs = linalg.fill ins(%z : f32) outs(%em : tensor<8x1xf32>) -> tensor<8x1xf32>
  %sm = linalg.generic {indexing_maps = [#id, #row], iterator_types = ["parallel", "parallel", "reduction"]}
      ins(%ex : tensor<8x1x?xf32>) outs(%fs : tensor<8x1xf32>) {
  ^bb0(%a: f32, %m: f32):
    %y = arith.addf %a, %m : f32
    linalg.yield %y : f32
  } -> tensor<8x1xf32>
  %p = linalg.generic {indexing_maps = [#id, #row, #id], iterator_types = ["parallel", "parallel", "parallel"]}
      ins(%ex, %sm : tensor<8x1x?xf32>, tensor<8x1xf32>) outs(%e : tensor<8x1x?xf32>) {
  ^bb0(%a: f32, %m: f32, %o: f32):
    %y = arith.divf %a, %m : f32
    linalg.yield %y : f32
  } -> tensor<8x1x?xf32>
  %eo = tensor.empty() : tensor<8x1x64xf32>
  %fo = linalg.fill ins(%z : f32) outs(%eo : tensor<8x1x64xf32>) -> tensor<8x1x64xf32>
  %o = linalg.batch_matmul ins(%p, %v : tensor<8x1x?xf32>, tensor<8x?x64xf32>) outs(%fo : tensor<8x1x64xf32>) -> tensor<8x1x64xf32>
  return %o : tensor<8x1x64xf32>
}
"""


def _operands(*shapes: tuple[int, ...]) -> list[np.ndarray]:
    return [RNG.standard_normal(s).astype(np.float32) for s in shapes]


@pytest.fixture(scope="module")
def matmul() -> pbsdk.Kernel:
    return pbsdk.compile_mlir(MATMUL.replace("{K}", "96").replace("{N}", "80"))


def test_the_signature_keeps_the_dynamic_size_as_a_symbol(matmul: pbsdk.Kernel) -> None:
    assert matmul.dynamic
    assert matmul.artifact.inputs[0] == (("a0d0", 96), "f32")
    assert matmul.artifact.outputs == ((("a0d0", 80), "f32"),)
    (record,) = matmul.executable.resources["contractions"]
    assert (record["m"], record["compute"]) == (-1, "vector-fma")  # the packed kernel, not the generic loops


@pytest.mark.parametrize("m", SIZES)
def test_dynamic_matmul_with_epilogue(matmul: pbsdk.Kernel, m: int) -> None:
    x, w, bias = _operands((m, 96), (96, 80), (80,))
    got = matmul(x, w, bias)
    assert got.shape == (m, 80)
    assert_close(got, np.maximum(ref.matmul(x, w) + bias, 0), op="matmul", reduction_size=96)


@pytest.mark.parametrize("m", (1, 3, 17, 130, 600))
def test_dynamic_batch_matmul(m: int) -> None:
    kernel = pbsdk.compile_mlir(BATCH_MATMUL)
    q, k = _operands((4, m, 64), (4, 64, 96))
    assert_close(kernel(q, k), ref.matmul(q, k), op="matmul", reduction_size=64)


@pytest.mark.parametrize("threads", [1, 2])
def test_dynamic_layernorm(threads: int) -> None:
    kernel = pbsdk.compile_mlir(LAYERNORM, options={"threads": threads})
    for n in (1, 3, 64, 257, 2049):
        (x,) = _operands((n, 768))
        mean = x.mean(-1, keepdims=True)
        want = (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + 1e-5)
        assert_close(kernel(x), want, op="layernorm", reduction_size=768)


def test_attention_over_a_dynamic_key_length() -> None:
    kernel = pbsdk.compile_mlir(ATTENTION)
    records = kernel.executable.resources["contractions"]
    assert [(r["m"], r["n"], r["k"], r["compute"]) for r in records] == [(1, -1, 64, "vector-fma"),
                                                                         (1, 64, -1, "vector-fma")]
    for s in (1, 7, 64, 129, 1000, 4097):
        q, kt, v = _operands((8, 1, 64), (8, 64, s), (8, s, 64))
        scores = q @ kt
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        assert_close(kernel(q, kt, v), p @ v, op="matmul", reduction_size=s)


@pytest.mark.parametrize("n, k", [(1, 40), (37, 40), (300, 40), (48, 1), (48, 333)])
def test_dynamic_columns_or_reduction(n: int, k: int) -> None:
    text = MATMUL.replace("tensor<{K}x{N}xf32>", "tensor<?x?xf32>").replace("{K}", "?").replace("{N}", "?")
    text = text.replace("%e = tensor.empty(%m)", "%c1 = arith.constant 1 : index\n  %n = tensor.dim %w, %c1 : "
                        "tensor<?x?xf32>\n  %e = tensor.empty(%m, %n)").replace("tensor.empty(%m) :", "tensor.empty(%m, %n) :")
    kernel = pbsdk.compile_mlir(text)
    (record,) = kernel.executable.resources["contractions"]
    assert (record["m"], record["n"], record["k"]) == (-1, -1, -1)
    for m in (1, 9, 200):
        x, w, bias = _operands((m, k), (k, n), (n,))
        assert_close(kernel(x, w, bias), np.maximum(ref.matmul(x, w) + bias, 0), op="matmul", reduction_size=k)


def test_a_result_size_that_is_an_expression_of_the_inputs() -> None:
    kernel = pbsdk.compile_mlir(APPEND)
    assert kernel.artifact.outputs == ((("a0d0 + 1", 64), "f32"),)
    for n in (1, 6, 300):
        cache, new = _operands((n, 64), (1, 64))
        np.testing.assert_array_equal(kernel(cache, new), np.concatenate([cache, new]))


def test_inconsistent_or_wrong_sizes_are_argument_errors(matmul: pbsdk.Kernel) -> None:
    x, w, bias = _operands((5, 95), (96, 80), (80,))
    with pytest.raises(ArgumentError, match="expected"):
        matmul(x, w, bias)


def test_a_target_without_dynamic_shapes_refuses_them() -> None:
    with pytest.raises(DynamicShapeError, match="argument 0 has dynamic shape"):
        pbsdk.compile_mlir(LAYERNORM, target="template")


def test_deploying_a_dynamic_kernel_is_refused(tmp_path, matmul: pbsdk.Kernel) -> None:  # type: ignore[no-untyped-def]
    from pbsdk.core.compiler import resolve
    from pbsdk.deploy import EntryArtifact, write_artifact

    entry = EntryArtifact("f", matmul.artifact, ("x", "w", "bias"), ("y",))
    with pytest.raises(DynamicShapeError, match="entry f has dynamic sizes"):
        write_artifact(tmp_path / "f.pbsdk", [entry], resolve("cpu", None, {}))
