"""The planner for a contraction with a dynamic row count (`pbsdk.core.plan.dynamic`): pure, no IR."""

from __future__ import annotations

import dataclasses

import pytest

from pbsdk.core.options import DEFAULT
from pbsdk.core.plan.contraction import Contraction, plan_contraction
from pbsdk.core.plan.dynamic import (
    BUCKET_ENDS,
    EXACT_EDGE_ROWS,
    bucket_ends,
    edge_row_variants,
    plan_dynamic_contraction,
)
from pbsdk.core.spec import load_spec


@pytest.fixture(scope="module")
def spec():  # type: ignore[no-untyped-def]
    return load_spec("intel/xeon-avx512")


@pytest.mark.parametrize("n, k", [(768, 768), (3072, 768), (64, 1024), (48, 64)])
def test_buckets_cover_every_row_count_in_order(spec, n: int, k: int) -> None:  # type: ignore[no-untyped-def]
    plan = plan_dynamic_contraction(spec, n=n, k=k, batch=1, dtype="f32", options=DEFAULT)
    assert plan is not None
    assert plan.buckets[0].lo == 1 and plan.buckets[-1].hi is None
    for below, above in zip(plan.buckets, plan.buckets[1:]):
        assert below.hi is not None and above.lo == below.hi + 1
        assert below.blocking != above.blocking  # equal neighbours are merged
    for m in (1, 2, 7, 8, 100, 511, 512, 4096, 100000):
        assert plan.bucket_for(m).holds(m)


def test_each_bucket_is_the_static_plan_at_its_largest_size_untransposed(spec) -> None:  # type: ignore[no-untyped-def]
    plan = plan_dynamic_contraction(spec, n=768, k=768, batch=1, dtype="f32", options=DEFAULT)
    assert plan is not None
    opts = dataclasses.replace(DEFAULT, transpose_gemm=False)
    for bucket in plan.buckets:
        static = plan_contraction(spec, Contraction(bucket.at, 768, 768, 1, "f32"), opts).blocking
        assert bucket.blocking == static and not bucket.blocking.transposed
    # One row: the static GEMV tile (a decoder step at batch 1 runs the kernel it would run static).
    one = plan.bucket_for(1)
    assert (one.lo, one.hi, one.at) == (1, 1, 1)
    assert one.blocking == plan_contraction(spec, Contraction(1, 768, 768, 1, "f32"), opts).blocking


def test_small_buckets_are_one_and_two_tiles_of_the_large_plans_rows(spec) -> None:  # type: ignore[no-untyped-def]
    opts = dataclasses.replace(DEFAULT, transpose_gemm=False)
    mr = plan_contraction(spec, Contraction(4096, 768, 768, 1, "f32"), opts).blocking.mr
    assert bucket_ends(spec, n=768, k=768, batch=1, dtype="f32") == (1, mr, 2 * mr, *BUCKET_ENDS)
    plan = plan_dynamic_contraction(spec, n=768, k=768, batch=1, dtype="f32", options=DEFAULT)
    assert plan is not None
    one_tile = plan.bucket_for(mr)
    assert (one_tile.lo, one_tile.hi) == (2, mr) and one_tile.blocking.mr == mr


@pytest.mark.parametrize("mr, variants", [(1, ()), (2, (1,)), (7, (1, 2, 3, 4, 5, 6)),
                                          (14, tuple(range(1, 14))), (24, (1, 2, 4, 8, 16))])
def test_edge_row_variants_cover_every_remainder_within_twice(mr: int, variants: tuple[int, ...]) -> None:
    assert edge_row_variants(mr) == variants
    for r in range(1, mr):
        chosen = next((v for v in variants if v >= r), mr)
        assert r <= chosen < 2 * r or chosen == mr
        if mr <= EXACT_EDGE_ROWS:
            assert chosen == r  # small tiles: exactly the rows stored


def test_cli_explain_shows_the_buckets_of_a_dynamic_row_count(capsys: pytest.CaptureFixture[str]) -> None:
    from pbsdk.cli import main

    assert main(["explain", "--matmul", "?", "768", "768", "--spec", "intel/xeon-avx512"]) == 0
    out = capsys.readouterr().out
    assert "matmul ?x768x768: 1x ?x768x768 f32, rows known at call time" in out
    assert "  rows 1 (planned at 1): 1x 1x768x768" in out and "  rows 512.. (planned at 4096)" in out
    # The static plan of one size is unchanged, and only the rows may be '?'.
    assert main(["explain", "--matmul", "5", "768", "768", "--spec", "intel/xeon-avx512"]) == 0
    assert "matmul 5x768x768: 1x 5x768x768" in capsys.readouterr().out
    assert main(["explain", "--matmul", "5", "?", "768"]) == 2
    assert "only M (the row count) may be '?'" in capsys.readouterr().err


def test_static_rows_with_a_dynamic_n_or_k_is_one_bucket(spec) -> None:  # type: ignore[no-untyped-def]
    plan = plan_dynamic_contraction(spec, n=1024, k=64, batch=8, dtype="f32", m=1)
    assert plan is not None and len(plan.buckets) == 1
    (only,) = plan.buckets
    assert (only.lo, only.hi, only.at) == (1, 1, 1) and only.holds(1) and not only.holds(2)


def test_explain_a_graph_with_sizes_known_at_call_time(spec) -> None:  # type: ignore[no-untyped-def]
    """`explain_dynamic_contractions`: a dynamic row count shows its buckets, a dynamic n its planning size, a
    dynamic batch the generic lowering; `explain_graph` keeps only the static products."""
    from pbsdk import ops
    from pbsdk.core.dims import Dim
    from pbsdk.core.ir.graph import Graph, TensorType
    from pbsdk.core.plan.dynamic import DYNAMIC_EXTENT
    from pbsdk.core.plan.explain import explain_dynamic_contractions, explain_graph
    from pbsdk.frontends.tracing import Tensor, tracing

    b, s = Dim.parse("b"), Dim.parse("s")
    graph = Graph()
    with tracing(graph):
        def arg(*shape: object) -> Tensor:
            return Tensor(graph.add("input", [], TensorType(shape, "f32")), graph)  # type: ignore[arg-type]
        rows = ops.matmul(arg(b, 64), arg(64, 32))
        keys = ops.matmul(arg(4, 64), arg(s, 64), transpose_b=True)
        batched = ops.matmul(arg(b, 4, 8), arg(b, 8, 16))
        static = ops.matmul(arg(4, 8), arg(8, 16))
        flattened = ops.matmul(arg(b, s, 64), arg(64, 32))
    graph.outputs = [t.value for t in (rows, keys, batched, static, flattened)]
    lines = explain_dynamic_contractions(graph, spec, DEFAULT)
    assert len(lines) == 4
    assert ": 1x ?x32x64, known at call time: rows m = b: " in lines[0] and "  rows 1 (planned at 1)" in lines[0]
    assert f": 1x 4x?x64, known at call time: n = s planned at {DYNAMIC_EXTENT}: 1 kernel(s)" in lines[1]
    assert "a batch known at call time: one packed kernel looping over the batch" in lines[2]
    # (b, s, 64) @ (64, 32): the emitter flattens the leading sizes into b*s rows
    assert "(rows b * s): 1x ?x32x64, known at call time: rows m = b*s: " in lines[3]
    (title, _), = explain_graph(graph, spec, DEFAULT)
    assert title.endswith("matmul 4x16xf32")
