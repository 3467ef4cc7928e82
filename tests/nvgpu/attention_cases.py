"""Fused-attention test cases for nvgpu: ``ops.attention`` calls (shapes, causal, additive mask, grouped
heads, (b, s, h, d) layouts), the module the core emits for them with nvgpu's options (the attention fused
into the core's scratchpad kernel, which nvgpu maps like every other staged kernel), inputs and the
numpy reference."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

F64 = np.float64


@dataclasses.dataclass(frozen=True)
class AttnCase:
    """(b, h, sq, d) queries; K/V with ``kv_heads`` heads (GQA when fewer than h); optional causal offset
    and additive (b, h, sq, sk) mask. All operands contiguous (row-major) base tensors."""

    b: int
    h: int
    sq: int
    sk: int
    d: int
    dv: int
    dtype: str
    causal_offset: int | None = None
    mask: bool = False
    kv_heads: int | None = None
    bshd: bool = False  # Q/K/V stored (b, s, h, d) (rows strided by heads x d), as many models keep them

    @property
    def name(self) -> str:
        return (f"{self.dtype}_b{self.b}h{self.h}_q{self.sq}k{self.sk}_d{self.d}"
                f"{'' if self.dv == self.d else f'v{self.dv}'}"
                f"{'' if self.causal_offset is None else f'_causal{self.causal_offset}'}"
                f"{'_mask' if self.mask else ''}{f'_gqa{self.kv_heads}' if self.kv_heads else ''}"
                f"{'_bshd' if self.bshd else ''}")

    @property
    def hk(self) -> int:
        return self.kv_heads or self.h

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        out: dict[str, tuple[int, ...]] = {"q": (self.b, self.h, self.sq, self.d), "k": (self.b, self.hk, self.sk, self.d),
                                           "v": (self.b, self.hk, self.sk, self.dv)}
        if self.bshd:
            out = {n: (b, r, h, c) for n, (b, h, r, c) in out.items()}
        if self.mask:
            out["mask"] = (self.b, self.h, self.sq, self.sk)
        return out

    def module_text(self, spec: str = "nvidia/h100") -> str:
        """The core's module for this call on ``spec`` with nvgpu's options (raises if the core did not fuse
        the attention: these cases exist to test the fused kernel)."""
        from pbsdk import ops
        from pbsdk.core.ir.emit import emit_graph
        from pbsdk.core.ir.graph import TensorType
        from pbsdk.core.spec import load_spec
        from pbsdk.frontends.jit import trace
        from pbsdk.targets.nvgpu import NvgpuTarget

        causal = self.causal_offset is not None
        if causal and self.causal_offset != self.sk - self.sq:
            raise ValueError(f"{self.name}: ops.attention's causal mask has offset sk - sq")

        def fn(q: Any, k: Any, v: Any, m: Any = None) -> Any:
            if self.bshd:
                q, k, v = (ops.transpose(x, (0, 2, 1, 3)) for x in (q, k, v))
            return ops.attention(q, k, v, causal=causal, mask=m)

        types = tuple(TensorType(shape, self.dtype) for shape in self.shapes.values())
        graph, _ = trace(fn, types)
        text = emit_graph(graph, spec=load_spec(spec), forms=NvgpuTarget.attention_forms,
                          options=NvgpuTarget().parse_options(None))
        if "pbsdk.attention" not in text:
            raise ValueError(f"{self.name}: the core did not fuse this attention for {spec}")
        return text

    def inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random inputs (bf16 as float32 values already rounded to bf16); masks hold -inf here and there."""
        from pbsdk.targets.nvgpu.emulate import round_bf16

        rng = np.random.default_rng(seed)
        out = []
        for n, shape in self.shapes.items():
            x = rng.standard_normal(shape).astype(np.float32)
            if n == "mask" and self.sk > 1:
                x[..., -1] = -np.inf  # the last key is padding for every query (never the only key seen)
                x[..., ::3, 0] = -1e4  # a large finite bias on the first key for every third query
            out.append(round_bf16(x) if self.dtype == "bf16" else x.astype({"f16": np.float16, "f32": np.float32}[self.dtype]))
        if self.mask and self.sk == 1:
            out[-1][...] = 0
        return out

    def reference(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, mask: np.ndarray | None = None) -> np.ndarray:
        g = self.h // self.hk
        if self.bshd:
            q, k, v = (np.swapaxes(x, 1, 2) for x in (q, k, v))
        kk, vv = np.repeat(k.astype(F64), g, axis=1), np.repeat(v.astype(F64), g, axis=1)
        s = q.astype(F64) @ np.swapaxes(kk, -1, -2) / math.sqrt(self.d)
        if self.causal_offset is not None:
            i, j = np.arange(self.sq)[:, None], np.arange(self.sk)[None, :]
            s = np.where(j > i + self.causal_offset, -np.inf, s)
        if mask is not None:
            s = s + mask.astype(F64)
        s = s - s.max(-1, keepdims=True)
        p = np.exp(s)
        return (p / p.sum(-1, keepdims=True)) @ vv
