"""The packed, register-tiled matmul kernels (`pack-contractions`) against numpy.

Shapes are chosen against the blocking: equal to, one less and one more than the register tile, the
packed blocks and the thread split; primes; degenerate rows and columns; batches; 1 and 2 threads."""

from __future__ import annotations

import numpy as np
import pytest

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text, resolve
from pbsdk.core.plan.contraction import Blocking, Contraction, plan_contraction
from pbsdk.core.spec import load_spec
from pbsdk.testing import assert_close
from pbsdk.testing import reference as ref

RNG = np.random.default_rng(7)


def _operands(*shapes: tuple[int, ...], dtype: str = "float32") -> list[np.ndarray]:
    return [RNG.standard_normal(s).astype(dtype) for s in shapes]


def _mm(options: dict | None = None) -> pbsdk.frontends.jit.JitFunction:  # type: ignore[name-defined]
    return pbsdk.jit(lambda a, b: ops.matmul(a, b), options=options)


# A small forced blocking so the block edges are crossed at test sizes: the options reach the planner.
SMALL = {"threads": 2}


@pytest.mark.parametrize("mkn", [(1, 1, 1), (1, 64, 64), (64, 1, 64), (64, 64, 1), (14, 32, 16), (13, 31, 17),
                                 (15, 33, 15), (97, 89, 101), (256, 256, 256), (300, 520, 390), (29, 1000, 7)])
@pytest.mark.parametrize("threads", [1, 2])
def test_packed_matmul_matches_numpy(mkn: tuple[int, int, int], threads: int) -> None:
    m, k, n = mkn
    a, b = _operands((m, k), (k, n))
    got = _mm({"threads": threads})(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=k)


def test_packed_matmul_f64() -> None:
    a, b = _operands((70, 45), (45, 37), dtype="float64")
    assert_close(_mm()(a, b), ref.matmul(a, b), op="matmul", reduction_size=45)


@pytest.mark.parametrize("bmkn", [(3, 17, 9, 33), (16, 64, 64, 32), (1, 40, 40, 40)])
def test_packed_batch_matmul(bmkn: tuple[int, int, int, int]) -> None:
    bs, m, k, n = bmkn
    a, b = _operands((bs, m, k), (bs, k, n))
    got = _mm()(a, b)
    assert_close(got, ref.matmul(a, b), op="matmul", reduction_size=k)


def test_packed_matmul_with_epilogue_and_prologue() -> None:
    a, b, bias = _operands((65, 48), (48, 70), (70,))

    def f(x, y, z):
        return ops.relu(ops.add(ops.matmul(ops.mul(x, 2.0), y), z))

    expected = np.maximum(ref.matmul(a * 2, b) + bias, 0)
    assert_close(pbsdk.jit(f)(a, b, bias), expected, op="matmul", reduction_size=48)


def test_blocks_smaller_than_the_problem_are_crossed() -> None:
    """With a spec whose caches are tiny, kc/mc/nc are smaller than the problem, so every loop of the
    nest runs more than once and the k blocks accumulate."""
    from pbsdk.core.spec import load_spec
    spec = load_spec("host").model_copy(deep=True)  # runs on any host
    data = spec.model_dump()
    for level in data["memory"]:
        if level["managed"] == "cache":
            level["size_bytes"] = 8192
    tiny = type(spec).model_validate(data)
    f = pbsdk.jit(lambda a, b: ops.matmul(a, b), spec=tiny)
    a, b = _operands((200, 300), (300, 150))
    from pbsdk.core.plan.contraction import Contraction, plan_contraction
    blk = plan_contraction(tiny, Contraction(200, 150, 300)).blocking
    assert blk is not None and blk.kc < 300 and blk.mc < 200 and blk.nc < 150
    assert_close(f(a, b), ref.matmul(a, b), op="matmul", reduction_size=300)


def test_the_pass_replaces_the_matmul_and_says_so() -> None:
    text = """
    func.func @main(%a: tensor<64x48xf32>, %b: tensor<48x80xf32>) -> tensor<64x80xf32> {
      %z = arith.constant 0.0 : f32
      %e = tensor.empty() : tensor<64x80xf32>
      %f = linalg.fill ins(%z : f32) outs(%e : tensor<64x80xf32>) -> tensor<64x80xf32>
      %r = linalg.matmul ins(%a, %b : tensor<64x48xf32>, tensor<48x80xf32>) outs(%f : tensor<64x80xf32>) -> tensor<64x80xf32>
      return %r : tensor<64x80xf32>
    }"""
    request = resolve("cpu", None, {"threads": 1})
    ir_text = str(compile_text(text, request, stop_after="pack-contractions"))
    assert "linalg.matmul" not in ir_text
    assert "vector.fma" in ir_text and "call @__pbsdk_mm0(" in ir_text
    off = resolve("cpu", None, {"pack": False})
    assert "linalg.matmul" in str(compile_text(text, off, stop_after="pack-contractions"))


def test_two_threads_fork_and_every_part_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fewer OpenMP threads than parts (OMP_THREAD_LIMIT-like): the glue loops, so no part is lost."""
    from pbsdk.targets.cpu.parallel import fork_glue
    glue = fork_glue([{"fork": "f", "part": "p", "args": 3, "threads": 4}], threaded=True)
    assert "GOMP_parallel" in glue and "%next = add i64 %p, %nt" in glue
    serial = fork_glue([{"fork": "f", "part": "p", "args": 3, "threads": 4}], threaded=False)
    assert "GOMP_parallel" not in serial and "icmp eq i64 %next, 4" in serial
    a, b = _operands((260, 64), (64, 64))
    monkeypatch.setattr("pbsdk.targets.cpu._openmp", False)  # the serial fallback, numerically
    f = _mm({"threads": 2, "cache": False})
    assert_close(f(a, b), ref.matmul(a, b), op="matmul", reduction_size=64)


def test_blocking_rejects_inconsistent_sizes() -> None:
    with pytest.raises(ValueError, match="multiple"):
        Blocking(mr=14, nv=2, lanes=16, mc=20, nc=64, kc=8)


def _fused_ir(fn, *args) -> str:
    f = pbsdk.jit(fn)
    return str(compile_text(f.lower(*args), f.request, stop_after="pack-contractions"))


@pytest.mark.parametrize("threads", [1, 2])
def test_epilogues_are_fused_into_the_kernel(threads: int) -> None:
    """bias + GELU, residual add, scaling: each ends in the kernel's final store, not a separate loop."""
    a, b, bias, res = _operands((67, 45), (45, 90), (90,), (67, 90))
    opts = {"threads": threads}

    def gelu_bias(x, y, z):
        return ops.gelu(ops.add(ops.matmul(x, y), z))

    def residual(x, y, r):
        return ops.add(ops.mul(ops.matmul(x, y), 0.5), r)

    y = ref.matmul(a, b)
    got = pbsdk.jit(gelu_bias, options=opts)(a, b, bias)
    assert_close(got, ref.gelu(y + bias), op="matmul", reduction_size=45)
    got = pbsdk.jit(residual, options=opts)(a, b, res)
    assert_close(got, y * 0.5 + res, op="matmul", reduction_size=45)
    for fn, args in ((gelu_bias, (a, b, bias)), (residual, (a, b, res))):
        text = _fused_ir(fn, *args)
        kernel_free = text.split("func.func private @__pbsdk_mm0_part")[0] if "private @__pbsdk_mm0_part" in text \
            else text
        assert "linalg.generic" not in kernel_free, "the epilogue should be inside the packed kernel"


def test_batched_epilogue_and_k_blocks() -> None:
    """A batched contraction whose k is split in blocks: only the last block applies the epilogue."""
    from pbsdk.core.spec import load_spec
    spec = load_spec("host")  # runs on any host
    data = spec.model_dump()
    for level in data["memory"]:
        if level["managed"] == "cache":
            level["size_bytes"] = 8192
    tiny = type(spec).model_validate(data)
    a, b, bias = _operands((3, 40, 300), (3, 300, 70), (70,))
    f = pbsdk.jit(lambda x, y, z: ops.relu(ops.add(ops.matmul(x, y), z)), spec=tiny)
    assert_close(f(a, b, bias), np.maximum(ref.matmul(a, b) + bias, 0), op="matmul", reduction_size=300)


def test_epilogue_fusion_can_be_switched_off() -> None:
    a, b, bias = _operands((20, 30), (30, 40), (40,))
    f = pbsdk.jit(lambda x, y, z: ops.add(ops.matmul(x, y), z), options={"fuse_epilogues": False})
    assert_close(f(a, b, bias), ref.matmul(a, b) + bias, op="matmul", reduction_size=30)
    text = str(compile_text(f.lower(a, b, bias), f.request, stop_after="pack-contractions"))
    assert "linalg.generic" in text


@pytest.mark.parametrize(("ta", "tb"), [(False, True), (True, False), (True, True)])
@pytest.mark.parametrize("shape", [(1, 96, 130), (37, 64, 50), (130, 257, 33)])
def test_transposed_operands_take_the_packed_kernel(ta: bool, tb: bool, shape: tuple[int, int, int]) -> None:
    """x @ w.T (nn.Linear) and friends: the packed kernel reads the transposed operand from the transpose's
    source (through its packing), and the transpose goes."""
    m, k, n = shape
    a = RNG.standard_normal((k, m) if ta else (m, k)).astype(np.float32)
    b = RNG.standard_normal((n, k) if tb else (k, n)).astype(np.float32)
    f = pbsdk.jit(lambda x, y: ops.matmul(x, y, transpose_a=ta, transpose_b=tb))
    want = ref.matmul(a.T if ta else a, b.T if tb else b)
    assert_close(f(a, b), want, op="matmul", reduction_size=k)
    ir_text = _fused_ir(lambda x, y: ops.matmul(x, y, transpose_a=ta, transpose_b=tb), a, b)
    assert "call @__pbsdk_mm0(" in ir_text and "linalg.transpose" not in ir_text


def test_a_transposed_constant_is_folded() -> None:
    w = RNG.standard_normal((48, 64)).astype(np.float32)
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    fn = lambda a: ops.matmul(a, w, transpose_b=True)
    assert_close(pbsdk.jit(fn)(x), ref.matmul(x, w.T), op="matmul", reduction_size=64)
    ir_text = _fused_ir(fn, x)
    assert "call @__pbsdk_mm0(" in ir_text and "linalg.transpose" not in ir_text


@pytest.mark.parametrize("tb", [False, True])
def test_four_dimensional_batches_are_collapsed_into_one(tb: bool) -> None:
    q = RNG.standard_normal((2, 3, 17, 24)).astype(np.float32)
    k = RNG.standard_normal((2, 3, 19, 24) if tb else (2, 3, 24, 19)).astype(np.float32)
    fn = lambda x, y: ops.matmul(x, y, transpose_b=tb)
    want = np.einsum("bhmk,bhnk->bhmn" if tb else "bhmk,bhkn->bhmn", q.astype(np.float64), k.astype(np.float64))
    assert_close(pbsdk.jit(fn)(q, k), want.astype(np.float32), op="matmul", reduction_size=24)
    ir_text = _fused_ir(fn, q, k)
    # k^T is read through the packing: the collapse of its batch dimensions views k itself.
    assert "call @__pbsdk_mm0(" in ir_text and "linalg.transpose" not in ir_text


@pytest.mark.parametrize("m", [1, 3])
def test_gemv_like_shapes_read_b_in_place(m: int) -> None:
    a, b = _operands((m, 200), (200, 333))
    f = _mm({"threads": 1})
    assert_close(f(a, b), ref.matmul(a, b), op="matmul", reduction_size=200)
    ir_text = str(compile_text(f.lower(a, b), f.request, stop_after="pack-contractions"))
    assert ir_text.count("memref.alloc()") == 1  # the A block only
    packed = _mm({"threads": 1, "pack_b": True})
    packed_ir = str(compile_text(packed.lower(a, b), packed.request, stop_after="pack-contractions"))
    assert packed_ir.count("memref.alloc()") == 2  # A block and B panel
    assert_close(packed(a, b), ref.matmul(a, b), op="matmul", reduction_size=200)


@pytest.mark.parametrize("tb", [False, True])
def test_batched_rows_times_a_matrix_is_one_matmul(tb: bool) -> None:
    x = RNG.standard_normal((2, 3, 17, 40)).astype(np.float32)
    w = RNG.standard_normal((33, 40) if tb else (40, 33)).astype(np.float32)
    fn = lambda a, b: ops.matmul(a, b, transpose_b=tb)
    want = x.astype(np.float64) @ (w.T if tb else w).astype(np.float64)
    assert_close(pbsdk.jit(fn)(x, w), want.astype(np.float32), op="matmul", reduction_size=40)
    ir_text = _fused_ir(fn, x, w)
    assert "call @__pbsdk_mm0(" in ir_text and "linalg.batch_matmul" not in ir_text


def test_layout_ops_on_constants_are_folded() -> None:
    """A frozen weight's transpose or reshape (what the frontends' graphs do) becomes a new constant at
    trace time instead of a copy on every call."""
    w = RNG.standard_normal((48, 64)).astype(np.float32)
    x = RNG.standard_normal((5, 64)).astype(np.float32)
    fn = lambda a: a @ ops.reshape(ops.transpose(ops._const(w, "f32")), (64, 48))
    f = pbsdk.jit(fn)
    assert_close(f(x), ref.matmul(x, w.T), op="matmul", reduction_size=64)
    text = f.lower(x)
    assert "linalg.transpose" not in text and "tensor.collapse_shape" not in text


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("mkn", [(130, 1100, 49), (29, 300, 17), (512, 64, 64), (7, 2100, 33)])
def test_narrow_outputs_read_a_in_place(mkn: tuple[int, int, int], threads: int, pack_notes) -> None:
    """At most `A_IN_PLACE_PANELS` register tiles of columns per thread: A is broadcast from its rows, not
    packed; rows past the last whole register tile (130, 29, 7 rows) are clamped and never stored, and k
    runs over several blocks (1100, 2100). As given (``transpose_gemm`` off: 29 x 17 would be computed
    transposed, tests/numerics/test_transposed_matmul.py)."""
    m, k, n = mkn
    a, b = _operands((m, k), (k, n))
    opts: dict = {"threads": threads, "transpose_gemm": False}
    blk = plan_contraction(load_spec("host"), Contraction(m, n, k), opts).blocking
    if blk is not None and blk.pack_a:  # more column tiles than the rule reads A in place for (narrow
        opts["pack_a"] = False          # vectors: 8 lanes on AVX2): the in-place path asked for
    notes = pack_notes(lambda x, y: ops.matmul(x, y), opts, a, b)
    assert any("A read in place" in s for s in notes), notes
    assert_close(_mm({**opts, "cache": False})(a, b), ref.matmul(a, b), op="matmul", reduction_size=k)


def test_narrow_batched_and_fused_outputs_read_a_in_place(pack_notes) -> None:
    a, b = _operands((3, 45, 300), (3, 300, 20))
    bias = RNG.standard_normal((20,)).astype(np.float32)

    def layer(x, y):
        return ops.relu(ops.add(ops.matmul(x, y), bias))

    opts = {"threads": 2, "transpose_gemm": False}  # as given (the planner would transpose 45 x 20)
    notes = pack_notes(layer, opts, a, b)
    assert any("A read in place" in s and "epilogue" in s for s in notes), notes
    got = pbsdk.jit(layer, options={**opts, "cache": False})(a, b)
    assert_close(got, ref.relu(ref.add(ref.matmul(a, b), bias)), op="matmul", reduction_size=300)


def test_wide_outputs_still_pack_a(pack_notes) -> None:
    a, b = _operands((64, 128), (128, 300))
    notes = pack_notes(lambda x, y: ops.matmul(x, y), {"threads": 1}, a, b)
    assert notes and not any("A read in place" in s for s in notes), notes
