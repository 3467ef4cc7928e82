"""A corpus of traced `pbsdk.ops` programs covering every op form `pbsdk.core.ir.emit` produces.

Used by ``test_emit_builders.py`` (every program builds, verifies and prints stably) and, as a script, to
check that a change to the emitter keeps the emitted program identical::

    python tests/unit/emit_corpus.py dump DIR    # DIR/<name>.mlir: each program's module, printed
    python tests/unit/emit_corpus.py check DIR   # the same again, compared byte for byte

``dump DIR attention`` / ``check DIR attention`` use the attention corpus instead (`attention_cases`: the
attention programs above plus fused attention in every variant the kernel generators distinguish, on
lanes and scratchpad specs). A ``"lanes"`` fused attention prints as a private declaration carrying the
plan's ``pbsdk.attention`` descriptor: its kernel is the cpu target's to build (its ``attention`` stage,
`pbsdk.targets.cpu.attention_kernel`), so a change to that kernel shows in the cpu artifact's LLVM IR,
not here (this corpus's lanes programs changed text when the kernel moved out of emission).

The printed form is the module as the bindings print it (SSA values renumbered), so the comparison is of
the program, not of its spelling.
"""

from __future__ import annotations

import functools
import math
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from pbsdk import ops
from pbsdk.core.ir.graph import Graph, TensorType

F32, F16, F64 = "f32", "f16", "f64"

#: (name, function, argument types, emit_graph keyword arguments (spec: a preset name))
Case = tuple[str, Callable[..., Any], tuple[TensorType, ...], dict[str, Any]]


def _t(*shape: int, dtype: str = F32) -> TensorType:
    return TensorType(tuple(shape), dtype)


def _rng(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape)


def cases() -> Iterator[Case]:
    # Constants: splats, dense arrays, non-finite values; f16/f64 constants.
    yield "const", lambda a: a + np.arange(6.0).reshape(2, 3) + 2.5, (_t(2, 3),), {}
    yield "const-nonfinite", lambda a: ops.maximum(a, -math.inf) + ops.minimum(a, math.inf) + math.nan, \
        (_t(4),), {}
    yield "const-f16", lambda a: a * np.array([1.5, -2.0, 3.25], np.float16) + 0.1, (_t(2, 3, dtype=F16),), {}
    yield "const-f64", lambda a: a - _rng(3, 4) + 1e-300, (_t(3, 4, dtype=F64),), {}
    # Elementwise: every binary op, broadcasting, scalars on either side, every unary op, comparisons, where.
    for op in ("add", "sub", "mul", "div", "maximum", "minimum", "pow"):
        yield f"binary-{op}", getattr(ops, op), (_t(3, 1, 5), _t(4, 1)), {}
    yield "binary-scalars", lambda a: 2.0 - a / 3.0 + (a ** 2.0) * 0.5, (_t(7),), {}
    yield "binary-rank0", lambda a, b: a * b, (_t(), _t(2, 2)), {}
    for op in ("neg", "exp", "log", "tanh", "sigmoid", "relu", "erf", "sqrt", "rsqrt", "abs"):
        yield f"unary-{op}", getattr(ops, op), (_t(4, 5),), {}
    yield "gelu", lambda a: ops.gelu(a), (_t(4, 5),), {}
    yield "gelu-tanh", lambda a: ops.gelu(a, approximate="tanh"), (_t(4, 5),), {}
    yield "unary-f16", lambda a: ops.gelu(ops.exp(a) + a), (_t(8, dtype=F16),), {}
    yield "unary-f64", lambda a: ops.sigmoid(ops.tanh(a)), (_t(8, dtype=F64),), {}
    for op in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
        yield f"compare-{op}", getattr(ops, op), (_t(3, 4), _t(4)), {}
    yield "where", lambda c, a, b: ops.where(c, a, b), (_t(3, 1), _t(1, 4), _t(3, 4)), {}
    yield "where-const", lambda a: ops.where(np.array([1.0, 0.0, 1.0]), a, 0.0), (_t(2, 3),), {}
    yield "mixed-dtypes", lambda a, b: a + b, (_t(3, dtype=F16), _t(3)), {}
    yield "broadcast-to", lambda a: ops.broadcast_to(a, (2, 3, 4)) * 1.0, (_t(3, 1),), {}
    # Casts both ways.
    yield "astype-f16-f32", lambda a: ops.astype(ops.astype(a, "f32") * 2.0, "f16"), (_t(5, 6, dtype=F16),), {}
    yield "astype-f32-f64", lambda a: ops.astype(ops.astype(a, "f64"), "f32"), (_t(5,),), {}
    # Reductions.
    for name in ("sum", "max", "min", "mean"):
        yield f"reduce-{name}", getattr(ops, name), (_t(3, 4, 5),), {}
        yield f"reduce-{name}-axes", functools.partial(getattr(ops, name), axis=(0, 2)), \
            (_t(3, 4, 5),), {}
        yield f"reduce-{name}-keep", functools.partial(getattr(ops, name), axis=-1, keepdims=True), \
            (_t(3, 4, 5),), {}
    yield "reduce-f16", lambda a: ops.sum(a, axis=1) + ops.max(a, axis=1), (_t(4, 6, dtype=F16),), {}
    # Matmuls.
    yield "matmul-2d", lambda a, b: a @ b, (_t(5, 7), _t(7, 3)), {}
    yield "matmul-batch", lambda a, b: a @ b, (_t(2, 5, 7), _t(2, 7, 3)), {}
    yield "matmul-batch2", lambda a, b: a @ b, (_t(2, 3, 5, 7), _t(2, 3, 7, 4)), {}
    yield "matmul-bcast-batch", lambda a, b: a @ b, (_t(1, 5, 7), _t(2, 7, 3)), {}
    yield "matmul-bcast-batch2", lambda a, b: a @ b, (_t(2, 1, 5, 7), _t(3, 7, 4)), {}
    yield "matmul-rows", lambda a, b: a @ b, (_t(2, 5, 7), _t(7, 3)), {}
    yield "matmul-rows-bt", lambda a, b: ops.matmul(a, b, transpose_b=True), (_t(2, 5, 7), _t(3, 7)), {}
    yield "matmul-ta", lambda a, b: ops.matmul(a, b, transpose_a=True), (_t(7, 5), _t(7, 3)), {}
    yield "matmul-tb", lambda a, b: ops.matmul(a, b, transpose_b=True), (_t(5, 7), _t(3, 7)), {}
    yield "matmul-tab-batch", lambda a, b: ops.matmul(a, b, transpose_a=True, transpose_b=True), \
        (_t(2, 7, 5), _t(2, 3, 7)), {}
    yield "matmul-ta-bcast", lambda a, b: ops.matmul(a, b, transpose_a=True), (_t(2, 7, 5), _t(1, 7, 3)), {}
    yield "matmul-const-tb", lambda a: ops.matmul(a, _rng(3, 7), transpose_b=True), (_t(5, 7),), {}
    yield "matmul-const-tb-batch", lambda a: ops.matmul(a, _rng(2, 3, 7), transpose_b=True), (_t(2, 5, 7),), {}
    yield "matmul-1d-left", lambda a, b: a @ b, (_t(7), _t(7, 3)), {}
    yield "matmul-1d-right", lambda a, b: a @ b, (_t(5, 7), _t(7)), {}
    yield "matmul-1d-both", lambda a, b: a @ b, (_t(7), _t(7)), {}
    yield "matmul-1d-batch", lambda a, b: a @ b, (_t(2, 5, 7), _t(7)), {}
    yield "matmul-f16", lambda a, b: a @ b, (_t(4, 8, dtype=F16), _t(8, 2, dtype=F16)), {}
    yield "matmul-f16-bcast", lambda a, b: a @ b, (_t(1, 4, 8, dtype=F16), _t(2, 8, 2, dtype=F16)), {}
    yield "matmul-f64", lambda a, b: a @ b, (_t(4, 8, dtype=F64), _t(8, 2, dtype=F64)), {}
    # Convolutions: the conv-as-matmul path (ungrouped, f32/f64) and the generic grouped path.
    conv = ops.conv2d
    yield "conv-nchw", lambda x, w: conv(x, w), (_t(1, 3, 8, 8), _t(4, 3, 3, 3)), {}
    yield "conv-nchw-batch", lambda x, w: conv(x, w, stride=2, padding=1), (_t(2, 3, 9, 9), _t(4, 3, 3, 3)), {}
    yield "conv-nchw-dil-pad", lambda x, w: conv(x, w, padding=((1, 2), (0, 1)), dilation=(2, 1)), \
        (_t(1, 3, 10, 10), _t(4, 3, 3, 2)), {}
    yield "conv-nchw-1x1", lambda x, w: conv(x, w), (_t(1, 8, 5, 5), _t(4, 8, 1, 1)), {}
    yield "conv-nchw-1x1-batch", lambda x, w: conv(x, w), (_t(2, 8, 5, 5), _t(4, 8, 1, 1)), {}
    yield "conv-nchw-1x1-stride", lambda x, w: conv(x, w, stride=2), (_t(1, 8, 5, 5), _t(4, 8, 1, 1)), {}
    yield "conv-nhwc", lambda x, w: conv(x, w, layout="NHWC"), (_t(1, 8, 8, 3), _t(3, 3, 3, 4)), {}
    yield "conv-nhwc-strided", lambda x, w: conv(x, w, stride=(2, 1), padding=1, dilation=2, layout="NHWC"), \
        (_t(2, 9, 9, 3), _t(3, 3, 3, 4)), {}
    yield "conv-nhwc-1x1", lambda x, w: conv(x, w, layout="NHWC"), (_t(2, 5, 5, 8), _t(1, 1, 8, 4)), {}
    yield "conv-groups-nchw", lambda x, w: conv(x, w, groups=2, padding=1), (_t(1, 4, 6, 6), _t(6, 2, 3, 3)), {}
    yield "conv-depthwise-nchw", lambda x, w: conv(x, w, groups=4, stride=2), (_t(2, 4, 7, 7), _t(4, 1, 3, 3)), {}
    yield "conv-groups-nhwc", lambda x, w: conv(x, w, groups=2, dilation=2, layout="NHWC"), \
        (_t(1, 7, 7, 4), _t(2, 2, 2, 6)), {}
    yield "conv-depthwise-nhwc", lambda x, w: conv(x, w, groups=4, padding=1, layout="NHWC"), \
        (_t(1, 6, 6, 4), _t(3, 3, 1, 4)), {}
    yield "conv-f16", lambda x, w: conv(x, w, padding=1), (_t(1, 3, 6, 6, dtype=F16), _t(4, 3, 3, 3, dtype=F16)), {}
    yield "conv-f64", lambda x, w: conv(x, w, padding=1), (_t(1, 3, 6, 6, dtype=F64), _t(4, 3, 3, 3, dtype=F64)), {}
    yield "conv-const-weight", lambda x: conv(x, _rng(4, 3, 3, 3)), (_t(1, 3, 6, 6),), {}
    # Layout and data movement.
    yield "transpose", lambda a: ops.transpose(a, (2, 0, 1)) + 0.0, (_t(2, 3, 4),), {}
    yield "transpose-T", lambda a: a.T * 1.0, (_t(3, 4),), {}
    yield "reshape", lambda a: ops.reshape(a, (4, 6)) * 2.0, (_t(2, 3, 4),), {}
    yield "reshape-to-1d", lambda a: ops.reshape(a, (24,)) * 2.0, (_t(2, 3, 4),), {}
    yield "reshape-from-1d", lambda a: ops.reshape(a, (2, 3)) * 2.0, (_t(6),), {}
    yield "reshape-rank0", lambda a: ops.reshape(ops.reshape(a, ()), (1, 1)) * 2.0, (_t(1),), {}
    yield "reshape-from-rank0", lambda a: ops.reshape(a, (1, 1, 1)) * 2.0, (_t(),), {}
    yield "slice", lambda a: ops.slice(a, 1, 1, 7, 2) + ops.slice(ops.slice(a, 1, 0, 3), 0, 0, 1), (_t(2, 8),), {}
    yield "concat", lambda a, b: ops.concatenate([a, b, a], axis=1) * 1.0, (_t(2, 3), _t(2, 1)), {}
    yield "take", lambda a, i: ops.take(a, i, axis=1), (_t(3, 5, 2), _t(2, 4)), {}
    yield "take-const", lambda a: ops.take(a, np.array([[0, 4], [2, 1]]), axis=0), (_t(5, 3),), {}
    yield "take-last-axis", lambda a, i: ops.take(a, i, axis=2), (_t(3, 5, 6), _t(4)), {}
    yield "take-f16", lambda a, i: ops.take(a, i, axis=0), (_t(5, 3, dtype=F16), _t(2, dtype=F16)), {}
    # Composites.
    yield "softmax", lambda a: ops.softmax(a, -1), (_t(4, 16),), {}
    yield "log-softmax", lambda a: ops.log_softmax(a, 0), (_t(4, 16),), {}
    yield "layernorm", lambda a, w, b: ops.layernorm(a, w, b), (_t(4, 16), _t(16), _t(16)), {}
    yield "layernorm-f16", lambda a: ops.layernorm(a), (_t(4, 16, dtype=F16),), {}
    yield "multi-output", lambda a, b: (a + b, a * b, a), (_t(3), _t(3)), {}
    # Attention: unfused, and fused by specs whose planner fuses it (lanes and scratchpad kernels).
    qkv = (_t(1, 2, 64, 32),) * 3
    yield "attention-unfused", lambda q, k, v: ops.attention(q, k, v, causal=True), qkv, {}
    yield "attention-off", lambda q, k, v: ops.attention(q, k, v), qkv, \
        {"spec": "intel/xeon-avx512", "options": {"fuse_attention": False}}
    for spec in ("intel/xeon-avx512", "example/npu"):
        tag = spec.replace("/", "-")
        yield f"attention-{tag}", lambda q, k, v: ops.attention(q, k, v), qkv, {"spec": spec}
        yield f"attention-causal-{tag}", lambda q, k, v: ops.attention(q, k, v, causal=True) * 2.0, qkv, \
            {"spec": spec}
        yield f"attention-mask-{tag}", lambda q, k, v, m: ops.attention(q, k, v, mask=m), (*qkv, _t(64, 64)), \
            {"spec": spec}
        yield f"attention-gqa-{tag}", lambda q, k, v: ops.attention(q, k, v), \
            (_t(1, 4, 64, 32), _t(1, 2, 64, 32), _t(1, 2, 64, 32)), {"spec": spec}
        yield f"attention-two-{tag}", lambda q, k, v: ops.attention(ops.attention(q, k, v), k, v), qkv, \
            {"spec": spec}
    yield "attention-lanes-only", lambda q, k, v: ops.attention(q, k, v), qkv, \
        {"spec": "example/npu", "forms": ("lanes",)}
    yield "attention-f16-xeon", lambda q, k, v: ops.attention(q, k, v), (_t(1, 2, 64, 32, dtype=F16),) * 3, \
        {"spec": "intel/xeon-avx512"}


_BRINGUP = Path(__file__).resolve().parents[1] / "bringup" / "data"
#: The specs fusing attention: lanes (cache hierarchy) and scratchpad (with and without matrix units).
ATTENTION_SPECS: tuple[tuple[str, str, dict[str, Any]], ...] = (
    ("xeon", "intel/xeon-avx512", {}),
    ("npu", "example/npu", {}),
    ("npu-nomu", "example/npu", {"matrix_units": False}),
    ("edge", str(_BRINGUP / "edge_npu.yaml"), {}),
    ("edge-nomu", str(_BRINGUP / "edge_npu.yaml"), {"matrix_units": False}),
    ("tiny", str(_BRINGUP / "tiny_npu.yaml"), {}),
    ("tiny-nomu", str(_BRINGUP / "tiny_npu.yaml"), {"matrix_units": False}),
)


def _causal_mask(sq: int, sk: int, offset: int) -> np.ndarray:
    """The additive mask hiding keys j > i + offset (recognised as a causal pattern with that offset)."""
    i, j = np.arange(sq)[:, None], np.arange(sk)[None, :]
    return np.where(j > i + offset, -np.inf, 0.0).astype(np.float32)


def _strided(x: Any, kt: Any, v: Any) -> Any:
    # (B, S, H, D) activations transposed to heads, K given as (B, H, D, S), V of another head dim.
    q = ops.transpose(x, (0, 2, 1, 3))
    return ops.softmax(ops.matmul(q, kt) / np.float32(np.sqrt(32.0)), axis=-1) @ v


def attention_cases() -> Iterator[Case]:
    """The attention programs of `cases` and fused attention in every variant the kernels distinguish
    (causal, causal offset, masks, GQA, transposed and strided operands, dtypes, d != dv, one query,
    sequences not a multiple of the block), on every spec of `ATTENTION_SPECS`."""
    yield from (c for c in cases() if c[0].startswith("attention"))
    att = ops.attention
    variants: list[tuple[str, Callable[..., Any], tuple[TensorType, ...]]] = []
    for dt in (F32, F16, "bf16"):
        variants.append((f"plain-{dt}", lambda q, k, v: att(q, k, v), (_t(1, 2, 64, 32, dtype=dt),) * 3))
    variants += [
        ("causal", lambda q, k, v: att(q, k, v, causal=True), (_t(2, 3, 50, 32),) * 3),
        ("causal-f16", lambda q, k, v: att(q, k, v, causal=True), (_t(1, 2, 40, 32, dtype=F16),) * 3),
        ("causal-offset", lambda q, k, v: att(q, k, v, mask=_causal_mask(24, 56, 32)),
         (_t(1, 2, 24, 32), _t(1, 2, 56, 32), _t(1, 2, 56, 32))),
        ("causal-offset-neg", lambda q, k, v: att(q, k, v, mask=_causal_mask(40, 30, -10)),
         (_t(1, 1, 40, 16), _t(1, 1, 30, 16), _t(1, 1, 30, 16))),
        ("mask-padding", lambda q, k, v, m: att(q, k, v, mask=m),
         (_t(2, 3, 21, 32), _t(2, 3, 45, 32), _t(2, 3, 45, 32), _t(2, 1, 1, 45))),
        ("mask-full", lambda q, k, v, m: att(q, k, v, mask=m),
         (_t(2, 3, 21, 32), _t(2, 3, 45, 32), _t(2, 3, 45, 32), _t(2, 3, 21, 45))),
        ("mask-transposed-causal", lambda q, k, v, mt: att(q, k, v, causal=True, mask=ops.transpose(mt)),
         (_t(37, 64), _t(37, 64), _t(37, 64), _t(37, 37))),
        ("mask-f16", lambda q, k, v, m: att(q, k, v, mask=m),
         (_t(1, 2, 33, 32, dtype=F16),) * 3 + (_t(33, 33, dtype=F16),)),
        ("gqa", lambda q, k, v: att(q, k, v), (_t(2, 8, 40, 32), _t(2, 2, 40, 32), _t(2, 2, 40, 32))),
        ("gqa-causal", lambda q, k, v: att(q, k, v, causal=True),
         (_t(1, 6, 33, 16), _t(1, 3, 33, 16), _t(1, 3, 33, 16))),
        ("strided-kt-dv", _strided, (_t(2, 19, 4, 32), _t(2, 4, 32, 23), _t(2, 4, 23, 48))),
        ("kt-matmul", lambda q, k, v: ops.softmax(ops.matmul(q, k, transpose_b=True) * 0.125, -1) @ v,
         (_t(3, 30, 64), _t(3, 30, 64), _t(3, 30, 64))),
        ("d-ne-dv", lambda q, k, v: att(q, k, v), (_t(1, 2, 48, 32), _t(1, 2, 48, 32), _t(1, 2, 48, 80))),
        ("one-query", lambda q, k, v: att(q, k, v), (_t(1, 2, 1, 32), _t(1, 2, 50, 32), _t(1, 2, 50, 32))),
        ("one-query-causal", lambda q, k, v: att(q, k, v, causal=True), (_t(2, 1, 32), _t(2, 1, 32), _t(2, 1, 32))),
        ("odd-seq", lambda q, k, v: att(q, k, v), (_t(1, 1, 37, 24), _t(1, 1, 53, 24), _t(1, 1, 53, 24))),
        ("batch-merged", lambda q, k, v: att(q, k, v), (_t(6, 70, 32),) * 3),
        ("batch-2d", lambda q, k, v: att(q, k, v, causal=True), (_t(2, 2, 3, 20, 32),) * 3),
        ("bf16-dv", lambda q, k, v: att(q, k, v),
         (_t(1, 2, 35, 32, dtype="bf16"), _t(1, 2, 35, 32, dtype="bf16"), _t(1, 2, 35, 16, dtype="bf16"))),
    ]
    for tag, spec, options in ATTENTION_SPECS:
        for name, fn, types in variants:
            kwargs: dict[str, Any] = {"spec": spec}
            if options:
                kwargs["options"] = options
            yield f"fused-{name}-{tag}", fn, types, kwargs


def traced(case: Case) -> tuple[Graph, dict[str, Any]]:
    """The case's graph and the keyword arguments for `emit_graph` (spec loaded)."""
    from pbsdk.core.spec.loader import load_spec
    from pbsdk.frontends.jit import trace

    _, fn, types, kwargs = case
    graph, _ = trace(fn, types)
    kwargs = dict(kwargs)
    if "spec" in kwargs:
        kwargs["spec"] = load_spec(kwargs["spec"])
    return graph, kwargs


def printed(case: Case) -> str:
    """The case's module as the bindings print it."""
    from mlir import ir

    from pbsdk.core.ir import emit

    graph, kwargs = traced(case)
    build = getattr(emit, "build_graph", None)
    if build is not None:
        return str(build(graph, **kwargs))
    with ir.Context() as ctx:
        return str(ir.Module.parse(emit.emit_graph(graph, **kwargs), ctx))


def main(argv: list[str]) -> int:
    mode, folder = argv[1], Path(argv[2])
    folder.mkdir(parents=True, exist_ok=True)
    bad = 0
    all_cases = list(attention_cases() if argv[3:] == ["attention"] else cases())
    for case in all_cases:
        try:
            text = printed(case)
        except Exception as exc:  # noqa: BLE001 - a refusal is part of what the corpus records
            text = f"error: {type(exc).__name__}: {exc}\n"
        path = folder / f"{case[0]}.mlir"
        if mode == "dump":
            path.write_text(text)
        elif path.read_text() != text:
            bad += 1
            (folder / f"{case[0]}.new.mlir").write_text(text)
            print(f"DIFFERS: {case[0]}")
    print(f"{len(all_cases)} programs, {bad} differ")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
