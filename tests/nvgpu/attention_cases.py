"""Fused-attention test inputs for nvgpu: modules in the form the core emits for a scratchpad spec (an
entry function calling ``@__pbsdk_attn0`` whose ``pbsdk.attention`` descriptor the target compiles), built
here from a descriptor so the target is tested independently of the core's emitter, and the numpy
reference the descriptor means."""

from __future__ import annotations

import dataclasses
import json
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
    block_q: int = 64
    block_k: int = 64
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

    def descriptor(self) -> dict[str, Any]:
        g = self.h // self.hk

        def opnd(shape: tuple[int, ...], heads: int, group: int, bshd: bool = False) -> dict[str, Any]:
            # flat β = bi * h + hi; the head read is hi // group
            if bshd:
                _, rows, _, cols = shape
                return {"shape": list(shape), "batch": [[self.b, heads * rows * cols, self.h],
                                                        [self.h // group, cols, group]],
                        "row_stride": heads * cols, "col_stride": 1}
            _, _, rows, cols = shape
            return {"shape": list(shape), "batch": [[self.b, heads * rows * cols, self.h],
                                                    [self.h // group, rows * cols, group]],
                    "row_stride": cols, "col_stride": 1}

        s = self.shapes
        unit = None
        if self.dtype in ("f16", "bf16"):
            unit = {"name": "mma.sync.m16n8k16", "m": 16, "n": 8, "k": 16, "operand_dtype": self.dtype,
                    "accumulator_dtype": "f32"}
        return {"version": 1, "batch": self.b * self.h, "sq": self.sq, "sk": self.sk, "d": self.d, "dv": self.dv,
                "dtype": self.dtype, "causal_offset": self.causal_offset, "mask": self.mask, "kv_groups": g,
                "scale": 1.0 / math.sqrt(self.d), "mask_scale": 1.0, "block_q": self.block_q,
                "block_k": self.block_k, "unit": unit, "level": "smem", "space": 2,
                "operands": {"q": opnd(s["q"], self.h, 1, self.bshd), "k": opnd(s["k"], self.hk, g, self.bshd),
                             "v": opnd(s["v"], self.hk, g, self.bshd),
                             "mask": opnd(s["mask"], self.h, 1) if self.mask else None}}

    def module_text(self) -> str:
        """Linalg-on-tensors input: the entry function calls the attention function on the operands' buffers
        (the core's form); the attention function's body is trivial (the target ignores it)."""
        names = ["q", "k", "v"] + (["mask"] if self.mask else [])
        out = (self.b, self.h, self.sq, self.dv)

        def mt(s: tuple[int, ...]) -> str:
            return f"memref<{'x'.join(map(str, s))}x{self.dtype}>"

        def tt(s: tuple[int, ...]) -> str:
            return f"tensor<{'x'.join(map(str, s))}x{self.dtype}>"

        s = self.shapes
        attr = json.dumps(self.descriptor()).replace('"', '\\"')
        params = ", ".join(f"%{n}: {mt(s[n])}" for n in names) + f", %o: {mt(out)}"
        lines = ["module {",
                 f"  func.func private @__pbsdk_attn0({params}) attributes {{pbsdk.attention = \"{attr}\"}} {{",
                 "    return", "  }",
                 (f"  func.func @main({', '.join(f'%{n}t: {tt(s[n])}' for n in names)}) -> {tt(out)} "
                  "attributes {llvm.emit_c_interface} {")]
        for n in names:
            lines.append(f"    %{n}b = bufferization.to_buffer %{n}t read_only : {tt(s[n])} to {mt(s[n])}")
        lines.append(f"    %ob = memref.alloc() {{alignment = 64 : i64}} : {mt(out)}")
        types = ", ".join(mt(s[n]) for n in names) + f", {mt(out)}"
        lines.append(f"    func.call @__pbsdk_attn0({', '.join(f'%{n}b' for n in names)}, %ob) : ({types}) -> ()")
        lines.append(f"    %r = bufferization.to_tensor %ob restrict writable : {mt(out)} to {tt(out)}")
        lines.append(f"    return %r : {tt(out)}")
        lines += ["  }", "}"]
        return "\n".join(lines)

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
