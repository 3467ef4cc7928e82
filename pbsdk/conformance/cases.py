"""Conformance cases generated from a chip spec (no MLIR here)."""

from __future__ import annotations

import dataclasses
import math
import zlib
from collections.abc import Callable, Sequence
from typing import Any

import ml_dtypes
import numpy as np

from pbsdk import ops
from pbsdk.core.plan import Contraction, plan_contraction
from pbsdk.core.spec import ChipSpec
from pbsdk.testing import reference as ref

#: dtypes the host can feed in and read back (bf16 through ml_dtypes, the numpy extension JAX uses).
HOST_DTYPES = {"f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16, "i8": np.int8}
#: Largest dimension a generated case may use by default; bigger capacity-straddling cases need --full.
DEFAULT_MAX_DIM = 512


@dataclasses.dataclass(frozen=True)
class Case:
    """One generated check: ``fn`` (written with pbsdk.ops) vs ``reference`` on inputs of ``shapes``."""

    name: str
    op: str  # tolerance key (pbsdk.testing.tolerances)
    dtype: str
    shapes: tuple[tuple[int, ...], ...]
    fn: Callable[..., Any]
    reference: Callable[..., Any]
    reduction_size: int = 1
    why: str = ""
    positive: bool = False  # inputs drawn away from zero and positive (log, sqrt, ...)
    skip: str | None = None
    #: The matrix unit the planner picks for this case's contraction(s), if any: the resource check
    #: then requires that the target issued matrix-unit ops (where the target reports them).
    matrix_unit: str | None = None
    #: The dtype a contraction accumulates in (the planner's compute tile: a matrix unit's accumulator, or
    #: f32 for f16/bf16 operands on vectors): its tolerance follows it (`pbsdk.testing.tolerance`).
    accumulator: str | None = None

    #: "close" (within the op's tolerance) or "exact" (bit for bit: integer arithmetic against numpy).
    compare: str = "close"
    #: Inputs drawn as floats (a quantizing case's float operands) instead of in ``dtype``.
    float_inputs: tuple[int, ...] = ()
    #: Each input's dtype where they differ from ``dtype`` (an i8 contraction followed by an i32 op).
    input_dtypes: tuple[str, ...] = ()

    def inputs(self, seed: int = 0) -> list[np.ndarray]:
        # A stable hash of the name (str hashes change per process): the same inputs in every run.
        rng = np.random.default_rng(seed + (zlib.crc32(self.name.encode()) & 0xFFFF))
        out = []
        for i, s in enumerate(self.shapes):
            dtype = self.input_dtypes[i] if self.input_dtypes else self.dtype
            if dtype == "i8" and i not in self.float_inputs:
                out.append(rng.integers(-128, 128, s).astype(np.int8))
                continue
            if dtype == "i32":  # small enough that products and row sums stay within i32
                out.append(rng.integers(-1000, 1001, s).astype(np.int32))
                continue
            x = rng.standard_normal(s)
            if self.positive:
                x = np.abs(x) + 0.5
            out.append(x.astype(np.float32 if self.dtype == "i8" else HOST_DTYPES.get(self.dtype, np.float32)))
        return out


def _matmul_cases(spec: ChipSpec, dtype: str, max_dim: int) -> list[Case]:
    plan = plan_contraction(spec, Contraction(1024, 1024, 1024, dtype=dtype))
    u = plan.compute
    base = (u.m, u.n, u.k)
    shapes: list[tuple[str, tuple[int, int, int], str]] = [
        ("unit", base, f"exactly the compute tile {u.kind} {u.name}"),
        ("unit-x2x3", (2 * u.m, 3 * u.n, 4 * u.k), "multiples of the compute tile"),
        ("unit+1", (u.m + 1, u.n + 1, u.k + 1), "one past the compute tile: partial tiles in every dim"),
        ("unit-1", (max(1, u.m - 1), max(1, u.n - 1), max(1, u.k - 1)), "one short of the compute tile"),
    ]
    inner = plan.levels[0] if plan.levels else None
    if inner is not None:
        t = (min(inner.m, max_dim), min(inner.n, max_dim), min(inner.k, max_dim))
        shapes.append((f"tile@{inner.level}", t, f"the planner's {inner.level} tile"))
        shapes.append((f"tile@{inner.level}+1", tuple(d + 1 for d in t), f"one past the {inner.level} tile"))  # type: ignore[arg-type]
    unit = u.name if u.kind == "matrix-unit" else None
    acc = u.accumulator_dtype
    cases = []
    for label, (m, n, k), why in shapes:
        cases.append(Case(f"matmul/{dtype}/{label}/{m}x{n}x{k}", "matmul", dtype, ((m, k), (k, n)),
                          lambda a, b: a @ b, ref.matmul, k, why, matrix_unit=unit, accumulator=acc))
    m, n, k = base
    cases.append(Case(f"matmul/{dtype}/batched/2x{m + 1}x{n}x{k + 1}", "matmul", dtype,
                      ((2, m + 1, k + 1), (2, k + 1, n)), lambda a, b: a @ b, ref.matmul, k + 1, "batched",
                      matrix_unit=unit, accumulator=acc))
    cases.append(Case(f"matmul/{dtype}/transposed-b/{m}x{n + 1}x{k}", "matmul", dtype, ((m, k), (n + 1, k)),
                      lambda a, b: ops.matmul(a, b, transpose_b=True),
                      lambda a, b: ref.matmul(a, b, transpose_b=True), k, "B read transposed", matrix_unit=unit,
                      accumulator=acc))
    # Working sets that straddle each cache/scratchpad capacity: square matmuls just under and over.
    nbytes = np.dtype(HOST_DTYPES[dtype]).itemsize
    for level in spec.memory[1:]:
        side = int(math.sqrt(level.size_bytes / (3 * nbytes)))
        for tag, s in (("under", max(1, side - 1)), ("over", side + 2)):
            name = f"matmul/{dtype}/straddle-{level.name}-{tag}/{s}x{s}x{s}"
            skip = None if s <= max_dim else f"side {s} > {max_dim} (run with --full)"
            cases.append(Case(name, "matmul", dtype, ((s, s), (s, s)), lambda a, b: a @ b, ref.matmul, s,
                              f"3 operands of {s}x{s} {'just fit' if tag == 'under' else 'just exceed'} "
                              f"{level.name} ({level.size_bytes} B)", skip=skip, matrix_unit=unit,
                              accumulator=acc))
    return cases


def _vector_width(spec: ChipSpec, dtype: str) -> int:
    vec = spec.vector
    if vec is not None and dtype in vec.dtypes:
        return vec.lanes(dtype)
    return 16


def _conv_unit(spec: ChipSpec, dtype: str, x: tuple[int, ...], w: tuple[int, ...], groups: int, nhwc: bool
               ) -> str | None:
    """The matrix unit a conv2d case should issue: the planner's unit for its per-group contraction
    (output pixels x output channels x input channels); none for a depthwise-like group with one input or
    one output channel, whose reduction is the kernel taps alone (a vector op)."""
    o, cg = (w[3], w[2]) if nhwc else (w[0], w[1])
    og = o // groups
    if og == 1 or cg == 1:
        return None
    return _unit_for(spec, Contraction(x[2] if nhwc else x[3], og, cg, 1, dtype))


def _conv_cases(spec: ChipSpec, dtype: str) -> list[Case]:
    acc = _sum_accumulator(dtype)  # emitted convs accumulate as sums do
    variants: list[tuple[str, tuple[int, ...], tuple[int, ...], dict[str, Any]]] = [
        ("3x3-pad1", (1, 8, 9, 9), (16, 8, 3, 3), {"padding": 1}),
        ("3x3-stride2", (2, 5, 11, 10), (7, 5, 3, 3), {"stride": 2}),
        ("1x1", (1, 13, 7, 7), (11, 13, 1, 1), {}),
        ("dilation2-asym-pad", (1, 4, 12, 12), (6, 4, 3, 3), {"dilation": 2, "padding": ((1, 0), (0, 2))}),
        ("groups2", (1, 8, 8, 8), (6, 4, 3, 3), {"groups": 2, "padding": 1}),
        ("depthwise", (1, 6, 9, 9), (6, 1, 3, 3), {"groups": 6, "padding": 1}),
    ]
    cases = []
    for label, xs, ws, kw in variants:
        red = ws[1] * ws[2] * ws[3]
        cases.append(Case(f"conv2d/{dtype}/nchw-{label}", "conv2d", dtype, (xs, ws),
                          lambda x, w, kw=kw: ops.conv2d(x, w, **kw),
                          lambda x, w, kw=kw: ref.conv2d(x, w, **kw), red, f"NCHW {label}",
                          matrix_unit=_conv_unit(spec, dtype, xs, ws, int(kw.get("groups", 1)), False),
                          accumulator=acc))
    nhwc_x, nhwc_w = (1, 9, 9, 8), (3, 3, 8, 16)
    cases.append(Case(f"conv2d/{dtype}/nhwc-3x3-pad1", "conv2d", dtype, (nhwc_x, nhwc_w),
                      lambda x, w: ops.conv2d(x, w, padding=1, layout="NHWC"),
                      lambda x, w: ref.conv2d(x, w, padding=1, layout="NHWC"), 72, "NHWC",
                      matrix_unit=_conv_unit(spec, dtype, nhwc_x, nhwc_w, 1, True), accumulator=acc))
    return cases


def _sum_accumulator(dtype: str) -> str:
    """What a sum in ``dtype`` accumulates in (pbsdk.ops: half precision in f32)."""
    return Contraction(1, 1, 1, dtype=dtype).accumulator


def _vector_cases(spec: ChipSpec, dtype: str) -> list[Case]:
    acc = _sum_accumulator(dtype)
    v = _vector_width(spec, dtype)
    shape = (7, 3 * v + 1)  # rows not a multiple of anything, a partial vector at the end of each row
    cols = shape[1]
    cases = [
        Case(f"elementwise/{dtype}/gelu-chain/{shape}", "gelu", dtype, (shape, (cols,)),
             lambda x, b: ops.gelu(x * 2.0 + b), lambda x, b: ref.gelu(ref.add(ref.mul(x, 2.0), b)),
             why="bias broadcast, scale, GELU fused"),
        Case(f"elementwise/{dtype}/sigmoid-tanh-exp/{shape}", "exp", dtype, (shape,),
             lambda x: ops.sigmoid(x) * ops.tanh(x) + ops.exp(-x),
             lambda x: ref.add(ref.mul(ref.sigmoid(x), ref.tanh(x)), ref.exp(ref.neg(x))), why="transcendentals"),
        Case(f"elementwise/{dtype}/log-sqrt-rsqrt/{shape}", "log", dtype, (shape,),
             lambda x: ops.log(x) + ops.sqrt(x) * ops.rsqrt(x + 1.0),
             lambda x: ref.add(ref.log(x), ref.mul(ref.sqrt(x), ref.rsqrt(ref.add(x, 1.0)))),
             why="positive-domain ops", positive=True),
        Case(f"elementwise/{dtype}/broadcast-3d/(3,1,{v + 3})+(4,1)", "add", dtype, ((3, 1, v + 3), (4, 1)),
             lambda a, b: ops.maximum(a, b) - ops.minimum(a, b), lambda a, b: ref.sub(ref.maximum(a, b), ref.minimum(a, b)),
             why="rank-expanding broadcast"),
        Case(f"reduction/{dtype}/sum-rows/{shape}", "sum", dtype, (shape,), lambda x: ops.sum(x, axis=-1),
             lambda x: ref.sum(x, axis=-1), cols, accumulator=acc),
        Case(f"reduction/{dtype}/max-cols/{shape}", "max", dtype, (shape,), lambda x: ops.max(x, axis=0),
             lambda x: ref.max(x, axis=0)),
        Case(f"reduction/{dtype}/mean-all-keepdims/{shape}", "mean", dtype, (shape,),
             lambda x: ops.mean(x, keepdims=True), lambda x: ref.mean(x, keepdims=True), shape[0] * cols,
             accumulator=acc),
        Case(f"softmax/{dtype}/{shape}", "softmax", dtype, (shape,), lambda x: ops.softmax(x, axis=-1),
             lambda x: ref.softmax(x, axis=-1), cols),
        Case(f"layernorm/{dtype}/{shape}", "layernorm", dtype, (shape, (cols,), (cols,)),
             lambda x, w, b: ops.layernorm(x, w, b), lambda x, w, b: ref.layernorm(x, w, b), cols),
    ]
    seq, d = 2 * v + 3, v
    scale = 1.0 / math.sqrt(d)
    cases.append(Case(f"attention/{dtype}/2x{seq}x{d}", "softmax", dtype, ((2, seq, d),) * 3,
                      lambda q, k, w: ops.softmax(ops.matmul(q, k, transpose_b=True) * scale, axis=-1) @ w,
                      lambda q, k, w: ref.matmul(ref.softmax(ref.mul(ref.matmul(q, k, transpose_b=True), scale),
                                                             axis=-1), w),
                      max(seq, d), "unfused attention: QK^T, scale, softmax, .V",
                      matrix_unit=_unit_for(spec, Contraction(seq, seq, d, 2, dtype))))
    return cases


def _wide_row_cases(spec: ChipSpec, dtype: str) -> list[Case]:
    """Softmax, layernorm and a row sum over rows whose bytes exceed the innermost software-managed
    level's capacity: the rows cannot be staged whole, so the plan must stream them in chunks (a
    multi-pass reduction), not reject them. None on a spec without such a level."""
    from pbsdk.core.plan.contraction import scratchpad_capacity
    from pbsdk.core.plan.vector_tiles import innermost_scratchpad

    found = innermost_scratchpad(spec)
    if found is None:
        return []
    level, _ = found
    nbytes = np.dtype(HOST_DTYPES[dtype]).itemsize
    cols = scratchpad_capacity(level, {}) // nbytes + 2 * _vector_width(spec, dtype) + 3
    shape = (3, cols)
    why = f"a row of {cols * nbytes} B, wider than {level.name} ({scratchpad_capacity(level, {})} B)"
    return [
        Case(f"softmax/{dtype}/wide-{level.name}/{shape}", "softmax", dtype, (shape,),
             lambda x: ops.softmax(x, axis=-1), lambda x: ref.softmax(x, axis=-1), cols, why),
        Case(f"layernorm/{dtype}/wide-{level.name}/{shape}", "layernorm", dtype, (shape, (cols,), (cols,)),
             lambda x, w, b: ops.layernorm(x, w, b), lambda x, w, b: ref.layernorm(x, w, b), cols, why,
             # The composite computes its statistics in the op's dtype: in f16, 1/n is a subnormal with
             # few bits past 65536 columns and the mean loses its precision (on every target, the cpu's too).
             skip=f"f16 layernorm over {cols} > 65536 columns loses precision in 1/n (frontend)"
             if dtype == "f16" and cols > 65536 else None),
        Case(f"reduction/{dtype}/sum-rows-wide-{level.name}/{shape}", "sum", dtype, (shape,),
             lambda x: ops.sum(x, axis=-1), lambda x: ref.sum(x, axis=-1), cols, why,
             accumulator=_sum_accumulator(dtype)),
    ]


def _attention_cases(spec: ChipSpec, dtype: str) -> list[Case]:
    """Attention at the fused schedule's edges (query block, key block and one past them), causal,
    grouped-query and masked; on specs whose planner does not fuse, the same cases check the unfused path."""
    from pbsdk.core.plan.attention import Attention, plan_attention

    d = 4 * _vector_width(spec, dtype)
    plan = plan_attention(spec, Attention(2, 256, 256, d, d, dtype))
    bq, bk = (plan.block_q, plan.block_k) if plan.fused else (16, 32)
    why = f"fused blocks {bq}x{bk}" if plan.fused else f"not fused: {plan.reasons[0]}"
    cases = []
    for label, sq, sk, causal, hkv, masked in (
            ("one-query", 1, bk + 1, False, 2, False),
            ("blocks", bq, bk, False, 2, False),
            ("blocks+1-causal", bq + 1, bk + 1, True, 2, False),
            ("gqa-causal", 2 * bq + 3, 2 * bq + 3, True, 1, False),
            ("mask", bq - 1, 2 * bk + 5, False, 2, True)):
        shapes = ((1, 2, sq, d), (1, hkv, sk, d), (1, hkv, sk, d)) + (((1, 1, sq, sk),) if masked else ())

        def fn(q: Any, k: Any, v: Any, *m: Any, causal: bool = causal) -> Any:
            return ops.attention(q, k, v, causal=causal, mask=m[0] if m else None)

        def reference(q: Any, k: Any, v: Any, *m: Any, causal: bool = causal) -> Any:
            return ref.attention(q, k, v, causal=causal, mask=m[0] if m else None)

        cases.append(Case(f"attention/{dtype}/{label}/{sq}x{sk}x{d}", "attention", dtype, shapes, fn, reference,
                          sk + d, why))
    return cases


def _unit_for(spec: ChipSpec, op: Contraction) -> str | None:
    compute = plan_contraction(spec, op).compute
    return compute.name if compute.kind == "matrix-unit" else None


def _i8_cases(spec: ChipSpec) -> list[Case]:
    """For every i8 matrix unit of the spec (none: the vector/scalar path): i8 matmuls at the unit's tile,
    one past it, multiples, batched and transposed, with exact i32 results; and the quantized linear layer
    (quantize, i8 contraction, requantize) per tensor and per channel. numpy is the oracle, bit for bit."""
    plan = plan_contraction(spec, Contraction(1024, 1024, 1024, dtype="i8"))
    u = plan.compute
    unit = u.name if u.kind == "matrix-unit" else None
    m, n, k = u.m, u.n, u.k
    exact = {"compare": "exact", "matrix_unit": unit, "accumulator": "i32"}

    def mm(a: Any, b: Any) -> Any:
        return a.astype(np.int32) @ b.astype(np.int32)

    cases = [Case(f"matmul/i8/{label}/{mm_}x{nn}x{kk}", "matmul", "i8", ((mm_, kk), (kk, nn)),
                  lambda a, b: a @ b, mm, kk, why, **exact)  # type: ignore[arg-type]
             for label, (mm_, nn, kk), why in (
                 ("unit", (m, n, k), f"exactly the compute tile {u.kind} {u.name}"),
                 ("unit+1", (m + 1, n + 1, k + 1), "one past the compute tile: partial tiles in every dim"),
                 ("unit-x2x3", (2 * m, 3 * n, 2 * k), "multiples of the compute tile"))]
    cases.append(Case(f"matmul/i8/batched/2x{m + 1}x{n}x{k + 1}", "matmul", "i8", ((2, m + 1, k + 1), (2, k + 1, n)),
                      lambda a, b: a @ b, mm, k + 1, "batched", **exact))  # type: ignore[arg-type]
    cases.append(Case(f"matmul/i8/transposed-b/{m}x{n + 1}x{k}", "matmul", "i8", ((m, k), (n + 1, k)),
                      lambda a, b: ops.matmul(a, b, transpose_b=True), lambda a, b: mm(a, b.T), k,
                      "B read transposed", **exact))  # type: ignore[arg-type]
    rows, cols, out = m + 3, 2 * k + 5, n + 7
    for label, channel in (("per-tensor", False), ("per-channel", True)):
        ws = np.linspace(0.01, 0.03, out) if channel else np.array([0.02])

        def fn(x: Any, w: Any, b: Any, channel: bool = channel, ws: np.ndarray = ws) -> Any:
            wq = ops.quantize(w, ws, 0, axis=0 if channel else None)
            return ops.quantized_linear(ops.quantize(x, 0.03, -5), 0.03, -5, wq, ws, b, out_scale=0.08,
                                        out_zero_point=4)

        def oracle(x: Any, w: Any, b: Any, channel: bool = channel, ws: np.ndarray = ws) -> Any:
            wq = ref.quantize(w, ws, 0, axis=0 if channel else None)
            return ref.quantized_linear(ref.quantize(x, 0.03, -5), 0.03, -5, wq, ws, b, out_scale=0.08,
                                        out_zero_point=4)

        cases.append(Case(f"quantized_linear/i8/{label}/{rows}x{out}x{cols}", "matmul", "i8",
                          ((rows, cols), (out, cols), (out,)), fn, oracle, cols,
                          f"quantize, i8 contraction with i32 accumulation, requantize ({label} weights)",
                          float_inputs=(0, 1, 2), **exact))  # type: ignore[arg-type]
    return cases


def _i32_cases(spec: ChipSpec) -> list[Case]:
    """For a spec that lists i32: elementwise add, subtract, multiply, max and min on i32 operands (rows of
    three vectors of the spec's i32 width plus one: a partial vector; a row and a rank-expanding
    broadcast) and, where it also lists i8, an i8 x i8 -> i32 matmul whose i32 result feeds i32 ops (a bias
    added, then a max with zero). No i32 reductions: `pbsdk.ops` has none on integers
    (`pbsdk.core.quant.INT_OPS`). Integer arithmetic: numpy is the oracle, bit for bit."""
    v = _vector_width(spec, "i32")
    shape = (7, 3 * v + 1)
    exact = {"compare": "exact"}
    cases = [
        Case(f"elementwise/i32/add-mul-max/{shape}", "add", "i32", (shape, shape),
             lambda a, b: ops.maximum(a + b, a * b), lambda a, b: np.maximum(a + b, a * b),
             why="i32 add, multiply and max", **exact),  # type: ignore[arg-type]
        Case(f"elementwise/i32/bias-broadcast/{shape}+({shape[1]},)", "add", "i32", (shape, (shape[1],)),
             lambda a, b: ops.maximum(a - b, b), lambda a, b: np.maximum(a - b, b),
             why="i32 row-broadcast subtract and max", **exact),  # type: ignore[arg-type]
        Case(f"elementwise/i32/broadcast-3d/(3,1,{v + 3})+(4,1)", "add", "i32", ((3, 1, v + 3), (4, 1)),
             lambda a, b: ops.maximum(a, b) - ops.minimum(a, b), lambda a, b: np.maximum(a, b) - np.minimum(a, b),
             why="i32 rank-expanding broadcast, max, min, subtract", **exact),  # type: ignore[arg-type]
    ]
    if "i8" in spec.dtypes:
        plan = plan_contraction(spec, Contraction(1024, 1024, 1024, dtype="i8"))
        u = plan.compute
        m, n, k = u.m + 1, u.n + 3, max(2 * u.k + 1, 19)
        cases.append(Case(
            f"matmul/i32/i8-matmul-bias-max/{m}x{n}x{k}", "matmul", "i32", ((m, k), (k, n), (n,)),
            lambda a, b, c: ops.maximum(a @ b + c, 0),
            lambda a, b, c: np.maximum(a.astype(np.int32) @ b.astype(np.int32) + c, 0), k,
            "i8 x i8 contraction into i32, then an i32 bias and a max on its result",
            matrix_unit=u.name if u.kind == "matrix-unit" else None, accumulator="i32",
            input_dtypes=("i8", "i8", "i32"), **exact))  # type: ignore[arg-type]
    return cases


FAMILIES = ("matmul", "conv2d", "elementwise", "reduction", "softmax", "layernorm", "attention", "quantized_linear")


def generate_cases(spec: ChipSpec, *, ops_filter: Sequence[str] | None = None, full: bool = False) -> list[Case]:
    """Every case for ``spec`` (optionally only the families in ``ops_filter``)."""
    max_dim = 4096 if full else DEFAULT_MAX_DIM
    cases: list[Case] = []
    for dtype in spec.dtypes:
        if dtype == "i8":
            cases += _i8_cases(spec)
            continue
        if dtype == "i32":
            cases += _i32_cases(spec)
            continue
        if dtype not in HOST_DTYPES:
            continue
        cases += _matmul_cases(spec, dtype, max_dim) + _conv_cases(spec, dtype) + _vector_cases(spec, dtype)
        cases += _wide_row_cases(spec, dtype)
        cases += _attention_cases(spec, dtype)
    if ops_filter:
        wanted = set(ops_filter)
        cases = [c for c in cases if c.name.split("/")[0] in wanted or c.op in wanted]
    return cases
