"""Pass ``promote``: tile each contraction by its plan's memory-level tiles and stage the tiles in scratchpads.

For every contraction (a ``linalg.matmul``/``linalg.batch_matmul``, or a ``linalg.generic`` of the same
form: parallel batch/m/n loops, one reduction loop, a multiply-accumulate body, operands read through
projected permutations, possibly broadcast) the pass asks the core planner (`plan_contraction`) for the
tiles of each memory level, then replaces the op by a call to a private function that

1. allocates, once, one buffer per operand and level (``A_spm``, ``B_spm``, ``C_spm``) with
   ``memref.alloc`` in the memory space of that level — memory space ``i`` is ``spec.memory[i]``, so
   main memory is the default space 0 — aligned as the level asks;
2. loops over the level's tiles in the plan's loop order and moves every tile with an explicit
   ``linalg.copy`` (marked ``pbsdk.dma``) from the level outside into the level's buffer, the
   accumulator tile back out after its k-step; a partial tile at the problem's edge is zero-padded, so
   every inner level and the compute step see full, static tiles;
3. computes each innermost tile as ``linalg.generic`` ops: with a matrix-unit plan, one per unit
   instruction, of exactly the unit's m x n x k and marked ``pbsdk.matrix_unit = "<name>"`` (a target
   replaces these with its instruction); otherwise one op over the whole innermost tile, marked
   ``pbsdk.compute = "<kind>"``.

Before rewriting, it checks that the buffers live together in each level fit the level's capacity
(``size_bytes``, or the opt-in ``max_size_bytes``): an overflow is a `CompileError` naming the buffer
that overflows and the level. Hardware-managed cache levels are not promoted (the plan's cache tiles are
a loop-tiling matter). What was decided is recorded in ``ctx.notes["promote"]`` (one `Promotion` per
contraction), so a target can report scratchpad use without reading the IR.

The analysis is `analyse`/`promotion_for` (pure given the op's shapes); the rewrite only prints the
function those decisions describe, parses it and calls it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from mlir import ir
from mlir.dialects import func

from pbsdk.core.errors import CompileError, UnsupportedError
from pbsdk.core.ir import attributes as attrs
from pbsdk.core.options import Options
from pbsdk.core.passes import ops_named
from pbsdk.core.plan import Contraction, ContractionPlan, plan_contraction
from pbsdk.core.plan.contraction import scratchpad_capacity
from pbsdk.core.spec import ChipSpec, MemoryLevel, dtype_bits

_MAC_OPS = {"arith.extf", "arith.mulf", "arith.addf", "linalg.yield"}


@dataclasses.dataclass(frozen=True)
class ContractionOp:
    """A contraction read off a linalg op: loop extents, what each loop is, operand maps and dtypes.

    ``maps[i][j]`` is the loop index operand ``i`` reads in its dimension ``j``, or -1 for a broadcast
    (constant 0) index."""

    extents: tuple[int, ...]
    roles: tuple[str, ...]  # per loop: "batch", "m", "n" or "k"
    maps: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]
    dtypes: tuple[str, str, str]

    def extent(self, role: str) -> int:
        return self.extents[self.roles.index(role)]

    @property
    def batch(self) -> int:
        out = 1
        for e, r in zip(self.extents, self.roles):
            if r == "batch":
                out *= e
        return out

    def contraction(self) -> Contraction:
        return Contraction(self.extent("m"), self.extent("n"), self.extent("k"), self.batch, self.dtypes[0],
                           self.dtypes[2])


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One scratchpad buffer: ``name`` (e.g. ``A_spm``), its level and memory space, shape and bytes."""

    name: str
    level: str
    space: int
    shape: tuple[int, ...]
    dtype: str
    alignment: int

    @property
    def bytes(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n * dtype_bits(self.dtype) // 8


@dataclasses.dataclass(frozen=True)
class Promotion:
    """What the pass decided for one contraction: the plan, each promoted level's tile per loop, and the
    buffers (outermost level first)."""

    function: str
    op: ContractionOp
    plan: ContractionPlan
    levels: tuple[tuple[str, tuple[int, ...]], ...]  # (level, tile per loop), outermost promoted first
    buffers: tuple[Buffer, ...]
    notes: tuple[str, ...] = ()

    def bytes_per_level(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for b in self.buffers:
            out[b.level] = out.get(b.level, 0) + b.bytes
        return out

    @property
    def uses_matrix_unit(self) -> bool:
        return self.plan.compute.kind == "matrix-unit"


def analyse(op: ir.Operation) -> ContractionOp | None:
    """The contraction ``op`` performs, or None when it is not one this pass can tile."""
    if op.name != "linalg.generic" or len(op.operands) != 3:
        return None
    iterators = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
    if sum("reduction" in i for i in iterators) != 1:
        return None
    body = op.regions[0].blocks[0]
    names = [o.operation.name for o in body.operations]
    if not set(names) <= _MAC_OPS or names.count("arith.mulf") != 1 or names.count("arith.addf") != 1:
        return None
    if not _is_mac(body):
        return None
    maps: list[tuple[int, ...]] = []
    for attr in ir.ArrayAttr(op.attributes["indexing_maps"]):
        amap = ir.AffineMapAttr(attr).value
        idx: list[int] = []
        for e in amap.results:
            if isinstance(e, ir.AffineDimExpr):
                idx.append(e.position)
            elif isinstance(e, ir.AffineConstantExpr) and e.value == 0:
                idx.append(-1)
            else:
                return None
        maps.append(tuple(idx))
    a_map, b_map, c_map = maps
    n_loops = len(iterators)
    red = next(i for i, it in enumerate(iterators) if "reduction" in it)
    types = [ir.MemRefType(v.type) for v in op.operands]
    if not all(t.has_static_shape for t in types) or sorted(c_map) != [d for d in range(n_loops) if d != red]:
        return None
    extents = [0] * n_loops
    for t, mp in zip(types, maps):
        for j, d in enumerate(mp):
            if d >= 0:
                extents[d] = t.shape[j]
            elif t.shape[j] != 1:
                return None
    roles: list[str] = []
    for d in range(n_loops):
        in_a, in_b = d in a_map, d in b_map
        if d == red:
            roles.append("k" if in_a and in_b else "?")
        elif in_a and not in_b:
            roles.append("m")
        elif in_b and not in_a:
            roles.append("n")
        else:
            roles.append("batch")
    if roles.count("m") != 1 or roles.count("n") != 1 or "?" in roles:
        return None
    if any(_strides(t) is None for t in types):
        return None
    return ContractionOp(tuple(extents), tuple(roles), (a_map, b_map, c_map),
                         tuple(str(t.element_type) for t in types))  # type: ignore[arg-type]


def _is_mac(body: ir.Block) -> bool:
    """Whether the body yields ``out + x * y`` where x, y are the input arguments (possibly extended)."""
    args = list(body.arguments)
    ops = {o.operation.name: o.operation for o in body.operations}
    add, mul = ops["arith.addf"], ops["arith.mulf"]
    if _origin(ops["linalg.yield"].operands[0], args) != "add":
        return False
    return (sorted(_origin(v, args) for v in add.operands) == ["mul", "out"]
            and sorted(_origin(v, args) for v in mul.operands) == ["in0", "in1"])


def _origin(v: ir.Value, args: list[ir.Value]) -> str:
    """'in0', 'in1', 'out' for a block argument (seen through arith.extf), 'mul'/'add' for those ops."""
    owner = v.owner
    if not isinstance(owner, ir.Block):
        op = owner.operation
        if op.name == "arith.extf":
            return _origin(op.operands[0], args)
        return {"arith.mulf": "mul", "arith.addf": "add"}.get(op.name, "?")
    for i, a in enumerate(args):
        if a == v:
            return ("in0", "in1", "out")[i]
    return "?"


def capacity(level: MemoryLevel, options: Options | Mapping[str, Any] | None) -> int:
    """Bytes a level may hold (`pbsdk.core.plan.contraction.scratchpad_capacity`)."""
    return scratchpad_capacity(level, options)


def check_capacity(level: str, live: Sequence[Buffer], cap: int, op: str = "linalg.generic") -> None:
    """Raise `CompileError` naming the first of ``live`` (buffers of ``level`` live together) that does
    not fit the level's capacity ``cap``."""
    total = 0
    for b in live:
        total += b.bytes
        if total > cap:
            listing = ", ".join(f"{x.name} {'x'.join(map(str, x.shape))} {x.dtype} ({x.bytes} B)" for x in live)
            raise CompileError(
                f"scratchpad overflow: buffer {b.name} does not fit in level '{level}': the level's live "
                f"buffers need {sum(x.bytes for x in live)} B ({listing}), its capacity is {cap} B", op=op)


def promotion_for(spec: ChipSpec, cop: ContractionOp, *, function: str, options: Options | Mapping[str, Any] | None,
                  tiles: Mapping[str, tuple[int, int, int]] | None = None) -> Promotion:
    """Plan ``cop`` and derive its level tiles and buffers; raise `CompileError` when a level overflows.

    ``tiles`` overrides the plan's (m, n, k) tile of the named levels. A level's tile is rounded up to a
    multiple of the tile inside it (the compute tile for the innermost), so that tiles nest; each
    adjustment is recorded in `Promotion.notes`."""
    plan = plan_contraction(spec, cop.contraction(), options)
    unit = plan.compute
    inner: tuple[int, int, int] = (unit.m, unit.n, unit.k)
    chosen: list[tuple[str, tuple[int, int, int], bool]] = []
    notes: list[str] = []
    for t in plan.levels:  # innermost first
        if t.managed != "software":
            continue
        wanted = tuple(int(v) for v in (tiles or {}).get(t.level, (t.m, t.n, t.k)))
        if len(wanted) != 3 or min(wanted) < 1:
            raise CompileError(f"tile {wanted} for level '{t.level}' must be three positive sizes (m, n, k)",
                               op="linalg.generic")
        # Each level's tile holds whole tiles of the level inside it: round up to a multiple.
        mnk = tuple(-(-v // i) * i for v, i in zip(wanted, inner))
        if mnk != wanted:
            notes.append(f"{t.level}: tile {'x'.join(map(str, wanted))} rounded up to "
                         f"{'x'.join(map(str, mnk))} to hold whole {'x'.join(map(str, inner))} tiles")
        chosen.append((t.level, mnk, t.holds_accumulator))  # type: ignore[arg-type]
        inner = mnk  # type: ignore[assignment]
    if not chosen:
        raise UnsupportedError("no software-managed level to promote into", op="linalg.generic")
    chosen.reverse()  # outermost first
    levels: list[tuple[str, tuple[int, ...]]] = []
    buffers: list[Buffer] = []
    for name, (tm, tn, tk), holds_acc in chosen:
        per_loop = tuple({"m": tm, "n": tn, "k": tk, "batch": 1}[r] for r in cop.roles)
        levels.append((name, per_loop))
        level = spec.memory_level(name)
        space = [m.name for m in spec.memory].index(name)
        for role, mp, dtype in zip("ABC", cop.maps, cop.dtypes):
            if role == "C" and not holds_acc:
                continue
            shape = tuple(per_loop[d] if d >= 0 else 1 for d in mp)
            buffers.append(Buffer(f"{role}_{name}", name, space, shape, dtype, level.alignment_bytes))
        # Capacity: the buffers of one level are live together for the whole contraction.
        check_capacity(name, [b for b in buffers if b.level == name], capacity(level, options))
    return Promotion(function, cop, plan, tuple(levels), tuple(buffers), tuple(notes))


# ------------------------------------------------------------------------------------------ printing


def _strides(t: ir.MemRefType) -> tuple[list[int], int | None] | None:
    """(strides, offset or None when dynamic) of a memref type; None when a stride is dynamic."""
    strides, offset = t.get_strides_and_offset()
    dyn = ir.ShapedType.get_dynamic_stride_or_offset()
    if any(s == dyn for s in strides):
        return None
    return list(strides), (None if offset == dyn else offset)


@dataclasses.dataclass
class _View:
    """A memref value being printed: SSA name, shape (None: dynamic), strides, offset (None: dynamic)."""

    name: str
    shape: list[int | None]
    strides: list[int]
    offset: int | None
    dtype: str
    space: int
    text: str | None = None  # the exact type text, when known (function arguments, fresh buffers)

    def type(self) -> str:
        if self.text is not None:
            return self.text
        dims = "".join(f"{'?' if d is None else d}x" for d in self.shape)
        space = f", {self.space}" if self.space else ""
        off = "?" if self.offset is None else str(self.offset)
        return f"memref<{dims}{self.dtype}, strided<[{', '.join(map(str, self.strides))}], offset: {off}>{space}>"


def _row_major(shape: Sequence[int]) -> list[int]:
    out, running = [], 1
    for d in reversed(shape):
        out.append(running)
        running *= d
    return list(reversed(out))


class _Printer:
    """Prints the promoted function of one contraction: allocations, per-level loops with their copies,
    the compute ops, deallocations."""

    def __init__(self, p: Promotion, arg_types: Sequence[ir.MemRefType], level_names: Sequence[str]) -> None:
        self.p = p
        self.level_names = list(level_names)
        self.lines: list[str] = []
        self.indent = 1
        self.counter = 0
        self.consts: set[int] = set()
        self.args: list[_View] = []
        for i, t in enumerate(arg_types):
            st = _strides(t)
            assert st is not None
            self.args.append(_View(f"%{'ABC'[i]}", list(t.shape), st[0], st[1], str(t.element_type), 0, str(t)))

    def emit(self, line: str) -> None:
        self.lines.append("  " * self.indent + line)

    def fresh(self, hint: str) -> str:
        self.counter += 1
        return f"%{hint}{self.counter}"

    def const(self, v: int) -> str:
        self.consts.add(v)
        return f"%c{v}"

    def subview(self, src: _View, offsets: Sequence[int | str], sizes: Sequence[int | str], hint: str) -> _View:
        """A subview of ``src`` at ``offsets`` (ints or SSA index names) of ``sizes`` (ditto), unit steps."""
        if all(o == 0 for o in offsets) and list(sizes) == list(src.shape):
            return src
        static_off = src.offset
        for o, s in zip(offsets, src.strides):
            static_off = None if (isinstance(o, str) or static_off is None) else static_off + o * s
        view = _View(self.fresh(hint), [s if isinstance(s, int) else None for s in sizes], list(src.strides),
                     static_off, src.dtype, src.space)
        ones = ", ".join("1" for _ in sizes)
        self.emit(f"{view.name} = memref.subview {src.name}[{', '.join(map(str, offsets))}] "
                  f"[{', '.join(map(str, sizes))}] [{ones}] : {src.type()} to {view.type()}")
        return view

    def copy(self, src: _View, dst: _View) -> None:
        direction = f"{self.level_names[src.space]}->{self.level_names[dst.space]}"
        self.emit(f'linalg.copy {{pbsdk.dma = "{direction}"}} ins({src.name} : {src.type()}) '
                  f"outs({dst.name} : {dst.type()})")

    def compute(self, views: Sequence[_View], attr: str) -> None:
        """One multiply-accumulate ``linalg.generic`` over ``views`` (A, B, C) with the op's maps."""
        p = self.p
        dims = ", ".join(f"d{i}" for i in range(len(p.op.roles)))
        maps = ", ".join(f"affine_map<({dims}) -> ({', '.join('0' if d < 0 else f'd{d}' for d in mp)})>"
                         for mp in p.op.maps)
        its = ", ".join('"reduction"' if r == "k" else '"parallel"' for r in p.op.roles)
        a, b, c = views
        acc = c.dtype
        self.emit(f"linalg.generic {{indexing_maps = [{maps}], iterator_types = [{its}], {attr}}} "
                  f"ins({a.name}, {b.name} : {a.type()}, {b.type()}) outs({c.name} : {c.type()}) {{")
        self.emit(f"^bb0(%a: {a.dtype}, %b: {b.dtype}, %acc: {acc}):")
        xs = []
        for v, dt in (("%a", a.dtype), ("%b", b.dtype)):
            if dt != acc:
                self.emit(f"  {v}x = arith.extf {v} : {dt} to {acc}")
            xs.append(f"{v}x" if dt != acc else v)
        self.emit(f"  %p = arith.mulf {xs[0]}, {xs[1]} : {acc}")
        self.emit(f"  %s = arith.addf %acc, %p : {acc}")
        self.emit(f"  linalg.yield %s : {acc}")
        self.emit("}")

    def loops(self, order: Sequence[str], extent: Sequence[int], tile: Sequence[int], tag: str
              ) -> tuple[dict[int, int | str], int]:
        """Open one ``scf.for`` per loop (in the order of ``order``'s roles) whose extent exceeds its tile;
        returns the offset of each loop (0 or an induction variable) and how many loops were opened."""
        offsets: dict[int, int | str] = {d: 0 for d in range(len(tile))}
        opened = 0
        for role in order:
            for d, r in enumerate(self.p.op.roles):
                if r != role or extent[d] <= tile[d]:
                    continue
                iv = f"%{r}{d}_{tag}"
                self.emit(f"scf.for {iv} = {self.const(0)} to {self.const(extent[d])} step {self.const(tile[d])} {{")
                self.indent += 1
                offsets[d] = iv
                opened += 1
        return offsets, opened

    def close(self, count: int) -> None:
        for _ in range(count):
            self.indent -= 1
            self.emit("}")

    def run(self) -> str:
        p = self.p
        self.orders: dict[str, list[str]] = {}
        for item in p.plan.loop_order:
            if "@" in item:
                role, level = item.split("@")
                self.orders.setdefault(level, []).append(role)
        self.buffers: dict[str, _View] = {}
        for b in p.buffers:
            view = _View(f"%{b.name}", list(b.shape), _row_major(b.shape), 0, b.dtype, b.space)
            view.text = f"memref<{''.join(f'{d}x' for d in b.shape)}{b.dtype}{f', {b.space}' if b.space else ''}>"
            self.buffers[b.name] = view
            self.emit(f"%{b.name} = memref.alloc() {{alignment = {b.alignment} : i64}} : {view.type()} "
                      f'loc("{b.name}")')
        self.level(0, self.args, list(p.op.extents))
        for view in self.buffers.values():
            self.emit(f"memref.dealloc {view.name} : {view.type()}")
        self.emit("return")
        head = (f"func.func private @{p.function}(%A: {self.args[0].type()}, %B: {self.args[1].type()}, "
                f"%C: {self.args[2].type()}) {{")
        consts = [f"    %c{v} = arith.constant {v} : index" for v in sorted(self.consts)]
        return "\n".join(["module {", "  " + head, *consts, *["  " + ln for ln in self.lines], "  }", "}"])

    def level(self, li: int, parent: list[_View], extent: list[int]) -> None:
        """The loops, copies and inner work of promoted level ``li`` inside views ``parent`` of ``extent``."""
        p = self.p
        if li == len(p.levels):
            self.innermost(parent, extent)
            return
        name, tile = p.levels[li]
        order = ["batch"] + [r for r in self.orders.get(name, ["n", "k", "m"]) if r != "batch"]
        offsets, opened = self.loops(order, extent, tile, name)
        # This level's tile size in each loop: partial only at the problem's edge (the outermost promoted
        # level); inner levels see full tiles of zero-padded buffers.
        sizes: dict[int, int | str] = {}
        partial: set[int] = set()
        for d, (e, t) in enumerate(zip(extent, tile)):
            if e % t == 0:
                sizes[d] = min(t, e)
            elif e < t:
                sizes[d] = e
                partial.add(d)
            else:
                sizes[d] = self.fresh("sz")
                self.emit(f"{sizes[d]} = affine.min affine_map<(d0) -> ({t}, {e} - d0)>({offsets[d]})")
                partial.add(d)
        inner: list[_View] = []
        writeback: tuple[_View, _View] | None = None
        for i, (role, mp) in enumerate(zip("ABC", p.op.maps)):
            offs = [offsets[d] if d >= 0 else 0 for d in mp]
            szs = [sizes[d] if d >= 0 else 1 for d in mp]
            buf = self.buffers.get(f"{role}_{name}")
            if buf is None:  # the accumulator stays where it is (the compute level's registers hold it)
                inner.append(self.subview(parent[i], offs, szs, "acc"))
                continue
            src = self.subview(parent[i], offs, szs, f"{role.lower()}src")
            dst = buf
            if any(d in partial for d in mp if d >= 0):
                zero = self.fresh("zero")
                self.emit(f"{zero} = arith.constant 0.0 : {buf.dtype}")
                self.emit(f"linalg.fill ins({zero} : {buf.dtype}) outs({buf.name} : {buf.type()})")
                dst = self.subview(buf, [0] * len(mp), szs, f"{role.lower()}dst")
            self.copy(src, dst)
            if role == "C":
                writeback = (dst, src)
            inner.append(buf)
        self.level(li + 1, inner, list(tile))
        if writeback is not None:
            self.copy(*writeback)
        self.close(opened)

    def innermost(self, parent: list[_View], extent: list[int]) -> None:
        """The compute of one innermost tile: unit-sized ops for a matrix unit, else one op."""
        u = self.p.plan.compute
        if u.kind != "matrix-unit":
            self.compute(parent, f'pbsdk.compute = "{u.kind}"')
            return
        unit = [{"m": u.m, "n": u.n, "k": u.k, "batch": 1}[r] for r in self.p.op.roles]
        offsets, opened = self.loops(["batch", "m", "n", "k"], extent, unit, "unit")
        views = [self.subview(parent[i], [offsets[d] if d >= 0 else 0 for d in mp],
                              [unit[d] if d >= 0 else 1 for d in mp], f"{'abc'[i]}u")
                 for i, mp in enumerate(self.p.op.maps)]
        self.compute(views, f'pbsdk.matrix_unit = "{u.name}", pbsdk.unit_operand = "{u.operand_dtype}", '
                            f'pbsdk.unit_accumulator = "{u.accumulator_dtype}"')
        self.close(opened)


def print_promotion(p: Promotion, arg_types: Sequence[ir.MemRefType], level_names: Sequence[str]) -> str:
    """The MLIR text of the promoted function (a module holding one private ``func.func``)."""
    return _Printer(p, arg_types, level_names).run()


@dataclasses.dataclass(frozen=True)
class PromoteToScratchpad:
    """Pass ``promote``: plan, tile and stage every contraction (see the module docstring).

    Options: ``tiles`` overrides the planner's (m, n, k) tile per level name (for experiments and tests);
    the compile options (``ctx.options``) reach the planner (``matmul_precision``, ``matrix_units``,
    ``optin_scratchpad``, ...)."""

    name = "promote"
    tiles: tuple[tuple[str, tuple[int, int, int]], ...] = ()

    def apply(self, module: ir.Module, ctx: Any) -> None:
        from mlir import passmanager

        spec: ChipSpec = ctx.spec
        options = ctx.options
        # Kernels the core already staged (fused attention: ``pbsdk.attention`` functions) keep their
        # marked copies and unit ops as they are.
        with module.context:
            pm = passmanager.PassManager.parse("func.func(linalg-generalize-named-ops)")
            for f in module.body.operations:
                if f.operation.name == "func.func" and not attrs.has(f.operation, attrs.ATTENTION):
                    pm.run(f.operation)
        records: list[Promotion] = ctx.notes.setdefault("promote", [])
        level_names = [m.name for m in spec.memory]
        for op in ops_named(module, "linalg.generic"):
            if attrs.has(op, attrs.MATRIX_UNIT) or attrs.has(op, attrs.COMPUTE):
                continue
            cop = analyse(op)
            if cop is None:
                continue
            name = f"__pbsdk_promoted_{len(records)}"
            try:
                promo = promotion_for(spec, cop, function=name, options=options, tiles=dict(self.tiles))
            except UnsupportedError:
                continue
            text = print_promotion(promo, [ir.MemRefType(v.type) for v in op.operands], level_names)
            try:
                parsed = ir.Module.parse(text, module.context)
            except Exception as exc:  # a bug here, not the user's: say which contraction
                raise CompileError(f"promoted function for {cop} does not parse: {exc}", op="linalg.generic") from exc
            fn = parsed.body.operations[0]
            module.body.append(fn.operation)
            with ir.InsertionPoint(op), op.location:
                func.CallOp([], ir.FlatSymbolRefAttr.get(name), list(op.operands))
            op.erase()
            records.append(promo)
