"""The fused attention kernel of a ``"scratchpad"`` `AttentionPlan`, as MLIR text on buffers.

For chips whose innermost memory is software-managed (`pbsdk.core.plan.attention.ScratchpadTiles`),
the kernel is written in the same target-neutral form the ``promote`` pass gives contractions, so a
target lowers it with the hooks it already has:

- scratchpad buffers are ``memref.alloc`` in memory space ``tiles.space`` (one set per core: they
  are allocated inside the ``scf.forall`` over the outermost compute level);
- every move between main memory and the scratchpad is a ``linalg.copy`` marked ``pbsdk.dma`` (Q's
  tile once per work item, K's and V's (and the mask's) once per key block, O's once at the end —
  the score matrix never moves);
- the two matmuls are ``linalg.generic`` ops of exactly the matrix unit's m x n x k marked
  ``pbsdk.matrix_unit`` (or, without a unit, one ``pbsdk.compute = "vector"`` op per tile);
- the online softmax (scale, masks, running maximum and sum, rescaling) is ``linalg.generic`` ops
  on scratchpad buffers marked ``pbsdk.compute = "vector"``, in f32; P is rounded to the op's dtype
  before P·V, as the unit reads it.

One function, ``@{name}(Q, K, V[, M], O)``, on the operands' base buffers (read at the match's
strides through ``memref.reinterpret_cast``: GQA and transposed operands are strides). It carries the
plan and operand layouts as a JSON ``pbsdk.attention`` attribute (`descriptor`), so a target with its
own attention mapping (e.g. a GPU's blocks and warps) can replace the body.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pbsdk.core.ir import attributes as attrs
from pbsdk.core.ir.attention import Operand
from pbsdk.core.ir.attention_kernel import IndexText, KernelOperands, _f, batch_offset, memref_type
from pbsdk.core.plan.attention import AttentionPlan, ScratchpadTiles


def _operand_json(opnd: Operand | None, shape: tuple[int, ...] | None) -> dict[str, Any] | None:
    if opnd is None or shape is None:
        return None
    return {"shape": list(shape), "batch": [list(f) for f in opnd.batch], "row_stride": opnd.row_stride,
            "col_stride": opnd.col_stride}


def descriptor(plan: AttentionPlan, ops: KernelOperands) -> dict[str, Any]:
    """The plan and operand layouts as plain data (the ``pbsdk.attention`` attribute, version 1)."""
    op, t = plan.op, plan.tiles
    assert t is not None
    u = t.unit
    return {"version": 1, "batch": op.batch, "sq": op.sq, "sk": op.sk, "d": op.d, "dv": op.dv, "dtype": op.dtype,
            "causal_offset": op.causal_offset, "mask": op.mask, "kv_groups": op.kv_groups, "scale": ops.scale,
            "mask_scale": ops.mask_scale, "block_q": t.block_q, "block_k": t.block_k,
            "unit": None if u is None else {"name": u.name, "m": u.m, "n": u.n, "k": u.k,
                                            "operand_dtype": u.operand_dtype, "accumulator_dtype": u.accumulator_dtype},
            "level": t.level, "space": t.space,
            "operands": {"q": _operand_json(ops.q, ops.q_shape), "k": _operand_json(ops.k, ops.k_shape),
                         "v": _operand_json(ops.v, ops.v_shape), "mask": _operand_json(ops.mask, ops.mask_shape)}}


def _mlir_string(text: str) -> str:
    return '"' + text.replace("\\", "\\5C").replace('"', "\\22") + '"'


def _round_up(e: IndexText, v: str, multiple: int) -> str:
    if multiple == 1:
        return v
    q = e.op("ru", f"arith.addi {v}, {e.c(multiple - 1)} : index")
    q = e.op("ru", f"arith.divui {q}, {e.c(multiple)} : index")
    return e.mul(q, multiple)


class _Tiles:
    """Prints one scratchpad attention kernel (see the module docstring)."""

    def __init__(self, plan: AttentionPlan, ops: KernelOperands) -> None:
        assert plan.tiles is not None
        self.plan, self.ops, self.t = plan, ops, plan.tiles
        self.op = plan.op
        self.dt = ops.dtype
        self.e = IndexText()

    # -- types ----------------------------------------------------------------------------------------
    def sp(self, shape: tuple[int, ...], dtype: str, strides: tuple[int, ...] | None = None,
           dynamic: tuple[bool, ...] | None = None, offset: bool = False) -> str:
        """A memref type in the scratchpad space: static ``shape`` (``dynamic[i]``: ``?``), optionally strided."""
        dims = "".join(f"{'?' if dynamic and dynamic[i] else s}x" for i, s in enumerate(shape))
        layout = ""
        if strides is not None:
            layout = f"strided<[{', '.join(map(str, strides))}]{', offset: ?' if offset else ''}>, "
        return f"memref<{dims}{dtype}, {layout}{self.t.space}>"

    def buffer(self, name: str) -> tuple[str, tuple[int, ...], str]:
        for b in self.t.buffers:
            if b[0] == name:
                return b
        raise KeyError(name)

    def buf_type(self, name: str) -> str:
        _, shape, dtype = self.buffer(name)
        return self.sp(shape, dtype)

    def view(self, name: str, offsets: list[str], sizes: list[str | int]) -> tuple[str, str]:
        """``memref.subview`` of scratchpad buffer ``name``; returns (SSA name, type)."""
        e = self.e
        _, shape, dtype = self.buffer(name)
        strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
        static_off = all(o == e.c(0) for o in offsets)
        ty = self.sp(tuple(s if isinstance(s, int) else 0 for s in sizes), dtype, strides,
                     tuple(not isinstance(s, int) for s in sizes), offset=not static_off)
        if static_off:
            ty = ty.replace(", offset: ?", "")
        v = e.fresh(name.lower())
        offs = ["0" if o == e.c(0) else o for o in offsets]
        e(f"{v} = memref.subview %{name}[{', '.join(offs)}] [{', '.join(map(str, sizes))}] "
          f"[{', '.join('1' for _ in sizes)}] : {self.buf_type(name)} to {ty}")
        return v, ty

    def main_view(self, flat: str, flat_t: str, offset: str, sizes: list[str | int], strides: tuple[int, int],
                  dtype: str) -> tuple[str, str]:
        """A 2-D strided view of a flattened main-memory buffer."""
        e = self.e
        dims = "".join(f"{'?' if not isinstance(s, int) else s}x" for s in sizes)
        ty = f"memref<{dims}{dtype}, strided<[{strides[0]}, {strides[1]}], offset: ?>>"
        v = e.fresh("mv")
        e(f"{v} = memref.reinterpret_cast {flat} to offset: [{offset}], sizes: [{', '.join(map(str, sizes))}], "
          f"strides: [{strides[0]}, {strides[1]}] : {flat_t} to {ty}")
        return v, ty

    def dma(self, src: tuple[str, str], dst: tuple[str, str], direction: str) -> None:
        self.e(f'linalg.copy {{{attrs.DMA} = "{direction}"}} ins({src[0]} : {src[1]}) outs({dst[0]} : {dst[1]})')

    def generic(self, ins: list[tuple[str, str, str]], outs: list[tuple[str, str, str]], loops: int,
                reductions: tuple[int, ...], body: list[str], yields: list[str], attr: str) -> None:
        """``linalg.generic`` over ``loops`` dims; ``ins``/``outs`` are (value, type, map results)."""
        e = self.e
        dims = ", ".join(f"d{i}" for i in range(loops))
        maps = ", ".join(f"affine_map<({dims}) -> ({r})>" for _, _, r in ins + outs)
        its = ", ".join('"reduction"' if i in reductions else '"parallel"' for i in range(loops))
        head = f"linalg.generic {{indexing_maps = [{maps}], iterator_types = [{its}], {attr}}}"
        if ins:
            head += f" ins({', '.join(v for v, _, _ in ins)} : {', '.join(t for _, t, _ in ins)})"
        head += f" outs({', '.join(v for v, _, _ in outs)} : {', '.join(t for _, t, _ in outs)}) {{"
        e.open(head)
        args = [f"%x{i}: {_elt(t)}" for i, (_, t, _) in enumerate(ins)]
        args += [f"%y{i}: {_elt(t)}" for i, (_, t, _) in enumerate(outs)]
        e.depth -= 1
        e(f"^bb0({', '.join(args)}):")
        e.depth += 1
        for line in body:
            e(line)
        e(f"linalg.yield {', '.join(yields)} : {', '.join(_elt(t) for _, t, _ in outs)}")
        e.close()

    def mac(self, a: tuple[str, str], b: tuple[str, str], c: tuple[str, str], b_transposed: bool, attr: str) -> None:
        """C += A · B (B read as (n, k) when ``b_transposed``), accumulating in C's dtype."""
        adt, cdt = _elt(a[1]), _elt(c[1])
        body = []
        xa, xb = "%x0", "%x1"
        if adt != cdt:
            body += [f"%xa = arith.extf %x0 : {adt} to {cdt}", f"%xb = arith.extf %x1 : {adt} to {cdt}"]
            xa, xb = "%xa", "%xb"
        body += [f"%p = arith.mulf {xa}, {xb} : {cdt}", f"%s = arith.addf %y0, %p : {cdt}"]
        self.generic([(a[0], a[1], "d0, d2"), (b[0], b[1], "d1, d2" if b_transposed else "d2, d1")],
                     [(c[0], c[1], "d0, d1")], 3, (2,), body, ["%s"], attr)

    # -- the kernel -----------------------------------------------------------------------------------
    def text(self, name: str) -> str:
        e, op, t, ops, dt = self.e, self.op, self.t, self.ops, self.dt
        BR, BC, DP, DVP, D, DV, SQ, SK = t.block_q, t.block_k, t.d_padded, t.dv_padded, op.d, op.dv, op.sq, op.sk
        u = t.unit
        vec = f'{attrs.COMPUTE} = "vector"'
        unit_attr = (f'{attrs.MATRIX_UNIT} = "{u.name}", {attrs.UNIT_OPERAND} = "{u.operand_dtype}", '
                     f'{attrs.UNIT_ACCUMULATOR} = "{u.accumulator_dtype}"') if u else vec
        into, out_of = f"{t.main_level}->{t.level}", f"{t.level}->{t.main_level}"
        items, T, nqb = self.plan.work_items, self.plan.threads, self.plan.q_blocks

        names = ["Q", "K", "V"] + (["M"] if ops.mask is not None else []) + ["O"]
        shapes = [ops.q_shape, ops.k_shape, ops.v_shape] + ([ops.mask_shape] if ops.mask_shape else []) + [ops.out_shape]
        types = [memref_type(s, dt) for s in shapes]  # type: ignore[arg-type]
        flat, ft = {}, {}
        for nm, shape, ty in zip(names, shapes, types):
            assert shape is not None
            ft[nm] = f"memref<{math.prod(shape)}x{dt}>"
            flat[nm] = f"%{nm}0" if len(shape) == 1 else e.op(
                nm.lower(), f"memref.collapse_shape %{nm}0 [[{', '.join(map(str, range(len(shape))))}]] : "
                            f"{ty} into {ft[nm]}")
        e(f"%zero_t = arith.constant 0.0 : {dt}")
        e("%zero = arith.constant 0.0 : f32")
        e(f"%ninf = arith.constant {_f(-math.inf)} : f32")
        e(f"%scale = arith.constant {_f(ops.scale)} : f32")
        if ops.mask is not None:
            e(f"%mscale = arith.constant {_f(ops.mask_scale)} : f32")

        par = T > 1
        if par:
            e.open(f"scf.forall (%t) in ({T}) {{")
            tid = "%t"
        else:
            tid = e.c(0)
        for bname, _shape, _dtype in t.buffers:  # this core's scratchpad tiles
            e(f"%{bname} = memref.alloc() {{alignment = {t.alignment} : i64}} : {self.buf_type(bname)}")
        for bname in ("Qs", "Ks", "Vs"):  # zero padding (copies never write past d, dv, rows, cols)
            e(f"linalg.fill {{{vec}}} ins(%zero_t : {dt}) outs(%{bname} : {self.buf_type(bname)})")

        e.open(f"scf.for %it = {tid} to {e.c(items)} step {e.c(T)} {{")
        beta = e.op("beta", f"arith.divui %it, {e.c(nqb)} : index")
        qb = e.op("qb", f"arith.remui %it, {e.c(nqb)} : index")
        q0 = e.mul(qb, BR)
        rows = e.min(e.c(BR), e.sub(e.c(SQ), q0))
        rows_u = _round_up(e, rows, u.m if u else 1)
        qoff, koff, voff = batch_offset(e, beta, ops.q), batch_offset(e, beta, ops.k), batch_offset(e, beta, ops.v)

        # Q's tile, once per work item.
        qsrc = self.main_view(flat["Q"], ft["Q"], e.add(qoff, e.mul(q0, ops.q.row_stride)), [rows, D],
                              (ops.q.row_stride, ops.q.col_stride), dt)
        self.dma(qsrc, self.view("Qs", [e.c(0), e.c(0)], [rows, D]), into)
        e(f"linalg.fill {{{vec}}} ins(%zero : f32) outs(%O : {self.buf_type('O')})")
        e(f"linalg.fill {{{vec}}} ins(%ninf : f32) outs(%m : {self.buf_type('m')})")
        e(f"linalg.fill {{{vec}}} ins(%zero : f32) outs(%l : {self.buf_type('l')})")

        if op.causal_offset is None:
            kend = e.c(SK)
        else:
            qend = e.min(e.add(q0, e.c(BR)), e.c(SQ))
            kend = e.min(e.max(e.add(qend, e.c(op.causal_offset)), e.c(0)), e.c(SK))
        e.open(f"scf.for %j0 = {e.c(0)} to {kend} step {e.c(BC)} {{")
        cols = e.min(e.c(BC), e.sub(kend, "%j0"))
        cols_n = _round_up(e, cols, u.n if u else 1)
        cols_k = _round_up(e, cols, u.k if u else 1)
        ksrc = self.main_view(flat["K"], ft["K"], e.add(koff, e.mul("%j0", ops.k.row_stride)), [cols, D],
                              (ops.k.row_stride, ops.k.col_stride), dt)
        self.dma(ksrc, self.view("Ks", [e.c(0), e.c(0)], [cols, D]), into)
        vsrc = self.main_view(flat["V"], ft["V"], e.add(voff, e.mul("%j0", ops.v.row_stride)), [cols, DV],
                              (ops.v.row_stride, ops.v.col_stride), dt)
        self.dma(vsrc, self.view("Vs", [e.c(0), e.c(0)], [cols, DV]), into)
        if ops.mask is not None:
            moff = e.add(e.add(batch_offset(e, beta, ops.mask), e.mul(q0, ops.mask.row_stride)),
                         e.mul("%j0", ops.mask.col_stride))
            msrc = self.main_view(flat["M"], ft["M"], moff, [rows, cols], (ops.mask.row_stride, ops.mask.col_stride), dt)
            self.dma(msrc, self.view("Ms", [e.c(0), e.c(0)], [rows, cols]), into)

        # S = Q · Kᵀ
        e(f"linalg.fill {{{vec}}} ins(%zero : f32) outs(%S : {self.buf_type('S')})")
        if u is not None:
            e.open(f"scf.for %mi = {e.c(0)} to {rows_u} step {e.c(u.m)} {{")
            e.open(f"scf.for %ni = {e.c(0)} to {cols_n} step {e.c(u.n)} {{")
            e.open(f"scf.for %ki = {e.c(0)} to {e.c(DP)} step {e.c(u.k)} {{")
            self.mac(self.view("Qs", ["%mi", "%ki"], [u.m, u.k]), self.view("Ks", ["%ni", "%ki"], [u.n, u.k]),
                     self.view("S", ["%mi", "%ni"], [u.m, u.n]), True, unit_attr)
            e.close()
            e.close()
            e.close()
        else:
            self.mac(self.view("Qs", [e.c(0), e.c(0)], [rows, D]), self.view("Ks", [e.c(0), e.c(0)], [cols, D]),
                     self.view("S", [e.c(0), e.c(0)], [rows, cols]), True, vec)

        # Online softmax over the rows_u x cols_k scores the P·V step reads.
        sv = self.view("S", [e.c(0), e.c(0)], [rows_u, cols_k])
        body = ["%r = linalg.index 0 : index", "%c = linalg.index 1 : index",
                "%s = arith.mulf %y0, %scale : f32"]
        ins = []
        if ops.mask is not None:
            ins.append((*self.view("Ms", [e.c(0), e.c(0)], [rows_u, cols_k]), "d0, d1"))
            if dt != "f32":
                body.append(f"%mx = arith.extf %x0 : {dt} to f32")
            body += [f"%mm = arith.mulf {'%mx' if dt != 'f32' else '%x0'}, %mscale : f32", "%s1 = arith.addf %s, %mm : f32"]
        else:
            body.append("%s1 = arith.addf %s, %zero : f32")
        # Masked: keys past this block's end (padding), and causal j > i + offset.
        body.append(f"%pad = arith.cmpi uge, %c, {cols} : index")
        if ops.mask is not None:  # padding rows of the mask tile were not copied
            body += [f"%padr = arith.cmpi uge, %r, {rows} : index", "%pad1 = arith.ori %pad, %padr : i1"]
        else:
            body.append("%pad1 = arith.ori %pad, %pad : i1")
        if op.causal_offset is not None:
            body += ["%j = arith.addi %j0, %c : index", f"%i = arith.addi {q0}, %r : index",
                     f"%io = arith.addi %i, {e.c(op.causal_offset)} : index",
                     "%cz = arith.cmpi sgt, %j, %io : index", "%msk = arith.ori %pad1, %cz : i1"]
        else:
            body.append("%msk = arith.ori %pad1, %pad1 : i1")
        body.append("%s2 = arith.select %msk, %ninf, %s1 : f32")
        self.generic(ins, [(*sv, "d0, d1")], 2, (), body, ["%s2"], vec)
        mv = self.view("m", [e.c(0)], [rows_u])
        mnv = self.view("mn", [e.c(0)], [rows_u])
        alv = self.view("al", [e.c(0)], [rows_u])
        lv = self.view("l", [e.c(0)], [rows_u])
        self.generic([(*mv, "d0")], [(*mnv, "d0")], 1, (), [], ["%x0"], vec)
        self.generic([(*sv, "d0, d1")], [(*mnv, "d0")], 2, (1,), ["%mx = arith.maximumf %x0, %y0 : f32"], ["%mx"], vec)
        # al = 2^... = exp(m - mn) (0 while m is still -inf); l *= al; m = mn
        self.generic([(*mnv, "d0")], [(*mv, "d0"), (*alv, "d0"), (*lv, "d0")], 1, (),
                     ["%df = arith.subf %y0, %x0 : f32", "%ex = math.exp %df : f32",
                      "%first = arith.cmpf oeq, %y0, %ninf : f32", "%a = arith.select %first, %zero, %ex : f32",
                      "%ln = arith.mulf %y2, %a : f32"], ["%x0", "%a", "%ln"], vec)
        # P = exp(S - mn) (0 where masked), l += Σ P
        outs = [(*sv, "d0, d1")]
        yields = ["%p"]
        pbody = ["%df = arith.subf %y0, %x0 : f32", "%ex = math.exp %df : f32",
                 "%dead = arith.cmpf oeq, %y0, %ninf : f32", "%p = arith.select %dead, %zero, %ex : f32"]
        if dt != "f32":
            outs.append((*self.view("P", [e.c(0), e.c(0)], [rows_u, cols_k]), "d0, d1"))
            pbody.append(f"%pt = arith.truncf %p : f32 to {dt}")
            yields.append("%pt")
        self.generic([(*mnv, "d0")], outs, 2, (), pbody, yields, vec)
        self.generic([(*sv, "d0, d1")], [(*lv, "d0")], 2, (1,), ["%sum = arith.addf %y0, %x0 : f32"], ["%sum"], vec)
        # O *= al
        self.generic([(*alv, "d0")], [(*self.view("O", [e.c(0), e.c(0)], [rows_u, DVP]), "d0, d1")], 2, (),
                     ["%o = arith.mulf %y0, %x0 : f32"], ["%o"], vec)

        # O += P · V
        pname = "P" if dt != "f32" else "S"
        if u is not None:
            e.open(f"scf.for %mi = {e.c(0)} to {rows_u} step {e.c(u.m)} {{")
            e.open(f"scf.for %ni = {e.c(0)} to {e.c(DVP)} step {e.c(u.n)} {{")
            e.open(f"scf.for %ki = {e.c(0)} to {cols_k} step {e.c(u.k)} {{")
            self.mac(self.view(pname, ["%mi", "%ki"], [u.m, u.k]), self.view("Vs", ["%ki", "%ni"], [u.k, u.n]),
                     self.view("O", ["%mi", "%ni"], [u.m, u.n]), False, unit_attr)
            e.close()
            e.close()
            e.close()
        else:
            self.mac(self.view(pname, [e.c(0), e.c(0)], [rows, cols]), self.view("Vs", [e.c(0), e.c(0)], [cols, DV]),
                     self.view("O", [e.c(0), e.c(0)], [rows, DV]), False, vec)
        e.close()  # key blocks

        # O / l, rounded to the output dtype, copied out.
        oname = "Oo" if dt != "f32" else "O"
        lfin = self.view("l", [e.c(0)], [rows])
        ofin = self.view(oname, [e.c(0), e.c(0)], [rows, DV])
        ins_o = [(*lfin, "d0")]
        if dt != "f32":
            ins_o.insert(0, (*self.view("O", [e.c(0), e.c(0)], [rows, DV]), "d0, d1"))
            self.generic(ins_o, [(*ofin, "d0, d1")], 2, (),
                         ["%q = arith.divf %x0, %x1 : f32", f"%qt = arith.truncf %q : f32 to {dt}"], ["%qt"], vec)
        else:
            self.generic(ins_o, [(*ofin, "d0, d1")], 2, (), ["%q = arith.divf %y0, %x0 : f32"], ["%q"], vec)
        ooff = e.add(e.mul(beta, SQ * DV), e.mul(q0, DV))
        self.dma(ofin, self.main_view(flat["O"], ft["O"], ooff, [rows, DV], (DV, 1), dt), out_of)
        e.close()  # work items
        # (the core's buffer-deallocation pipeline frees this core's tiles at the end of its body)
        if par:
            e.close()
        e("return")

        sig = ", ".join(f"%{nm}0: {ty}" for nm, ty in zip(names, types))
        desc = _mlir_string(json.dumps(descriptor(self.plan, ops), sort_keys=True))
        out = [f"func.func private @{name}({sig}) attributes {{{attrs.ATTENTION} = {desc}}} {{"]
        out += [f"  {v} = arith.constant {k} : index" for k, v in sorted(e.consts.items())]
        out += e.lines
        out.append("}")
        return "\n".join(out) + "\n"


def _elt(memref_t: str) -> str:
    """The element type of a memref type string."""
    inner = memref_t[len("memref<"):]
    dims_and_type = inner.split(",")[0].rstrip(">")
    return dims_and_type.split("x")[-1]


def tiles_kernel_text(name: str, plan: AttentionPlan, ops: KernelOperands) -> str:
    """``@{name}(Q, K, V[, M], O)``: the scratchpad attention kernel of ``plan`` (see the module docstring)."""
    if plan.tiles is None:
        raise ValueError("tiles_kernel_text needs a plan with the scratchpad schedule")
    return _Tiles(plan, ops).text(name)


__all__ = ["ScratchpadTiles", "descriptor", "tiles_kernel_text"]
