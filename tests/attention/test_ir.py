"""The fused kernel's IR: no seq x seq buffer after bufferization, vector code, a parallel loop; the
unfused pipeline (the comparison) does allocate the score matrix; explain shows the plan."""

from __future__ import annotations

import re

import numpy as np

import pbsdk
from pbsdk import ops
from pbsdk.core.compiler import compile_text

SQ = SK = 96
SHAPE = (1, 2, SQ, 64)


def _buffers(text: str) -> list[int]:
    """Element counts of every memref.alloc / memref.alloca in ``text``."""
    sizes = []
    for m in re.finditer(r"memref\.alloca?\(\)(?: \{[^}]*\})? : memref<([0-9x]+)f32>", text):
        dims = [int(d) for d in m.group(1).split("x") if d]
        sizes.append(int(np.prod(dims)))
    return sizes


def _after(stage: str, **options):
    jf = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v, causal=True), options=options or None)
    q = np.zeros(SHAPE, np.float32)
    return compile_text(jf.lower(q, q, q), jf.request, stop_after=stage)


def test_fused_kernel_never_allocates_the_score_matrix():
    # The core leaves a declaration marked with the plan's descriptor; the cpu target's "attention" stage
    # (its first) builds the kernel.
    core = str(_after("out-params"))
    assert re.search(r"func\.func private @__pbsdk_attn0\(memref<[0-9x]+f32>, [^)]*\) attributes \{pbsdk\.attention", core)
    assert "vector.fma" not in core
    text = str(_after("attention"))
    assert "pbsdk.attention" not in text
    sizes = _buffers(text)
    assert sizes, "expected the kernel's scratch buffers"
    assert max(sizes) < SQ * SK, f"a buffer of {max(sizes)} elements (scores are {SQ * SK})"
    # The output is written in place into the caller's buffer: no alloc of the output either.
    assert "memref.alloc()" not in text
    assert "vector.fma" in text and "scf.forall" in text


def test_unfused_pipeline_allocates_it():
    sizes = _buffers(str(_after("out-params", fuse_attention=False)))
    assert max(sizes) >= 2 * SQ * SK


def test_kernel_is_forked_onto_the_cores():
    jf = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v), options={"threads": 2})
    q = np.zeros((1, 4, 64, 64), np.float32)
    artifact = compile_text(jf.lower(q, q, q), jf.request)
    forks = artifact.metadata.get("forks", [])
    assert any(f["part"].startswith("__pbsdk_attn") and f["threads"] == 2 for f in forks)


def test_explain_shows_the_plan_and_follows_the_spec():
    q = np.zeros((1, 8, 512, 64), np.float32)
    host = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v), spec="intel/xeon-avx512").explain(q, q, q)
    assert "online softmax" in host and "never stored" in host
    off = pbsdk.jit(lambda q, k, v: ops.attention(q, k, v), spec="intel/xeon-avx512",
                    options={"fuse_attention": False}).explain(q, q, q)
    assert "fused          no" in off
    block = re.search(r"query block (\d+), key block (\d+)", host)
    assert block is not None
