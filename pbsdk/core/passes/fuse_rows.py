"""Pass ``fuse-rows``: run chains of row-local ops row by row, and spread the rows over the cores.

Softmax, layernorm, logsumexp and their elementwise neighbours arrive as a sequence of whole-array ops
(max, subtract-and-exp, sum, divide): four passes over the data, each too large to stay in cache. When
every op of a consecutive run of ``linalg`` ops on buffers

- has the same leading extent R and a parallel first loop, and
- indexes every operand that has that leading dimension with ``d0`` first (so row r only ever reads and
  writes row r of those buffers), other operands being read-only and not written in the run, and
- does not read the row's index (``linalg.index 0``, an ``iota`` over a dynamic row count),

the run moves into ``@__pbsdk_rows<N>(buffers..., %t)``, which loops over this thread's rows and applies
every op to a one-row view of each buffer; one row's intermediate results stay in L1 from one op to the
next. The rows are split across the outermost compute level (``scf.forall`` over calls, which the target
lowers like the contraction kernels' parts) when there is enough work.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from mlir import ir
from mlir.dialects import func

from pbsdk.core.ir.builder import call_parts, if_then
from pbsdk.core.passes import defining_op, layout_at_run_time, ops_named, row_major
from pbsdk.core.passes.dedupe_functions import merge_identical
from pbsdk.core.passes.isolate_contractions import _captures


def _unpassable(t: ir.Type) -> bool:
    """A buffer no row function can take under bare pointers: a static view whose strides or offset are known
    only at run time, or a dynamic one other than whole rows at offset 0 (`dynamic-sizes` passes those only)."""
    memref_t = ir.MemRefType(t)
    return layout_at_run_time(t) if memref_t.has_static_shape else not row_major(t)


_FUSIBLE = ("linalg.generic", "linalg.fill", "linalg.map", "linalg.copy")
#: Side-effect-free ops that may sit between fused ops; they move in front of the run.
_MOVABLE = ("memref.expand_shape", "memref.collapse_shape", "memref.cast", "arith.constant")
_D0 = re.compile(r"\bd0\b")
#: Least elements touched per extra thread.
MIN_ELEMENTS_PER_THREAD = 1 << 15


def _memrefs(op: ir.Operation) -> list[ir.Value]:
    return [v for v in op.operands if isinstance(v.type, ir.MemRefType)]


def _reads_row_index(op: ir.Operation) -> bool:
    """Whether the body reads the first loop's index (``linalg.index 0``: an ``iota`` over the rows), which
    a one-row view would turn into 0 on every row."""
    return any(inner.operation.name == "linalg.index" and ir.IntegerAttr(inner.operation.attributes["dim"]).value == 0
               for region in op.regions for block in region.blocks for inner in block.operations)


def _first_dim_maps(op: ir.Operation) -> list[ir.AffineMap] | None:
    if _reads_row_index(op):
        return None
    if op.name == "linalg.generic":
        its = [str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])]
        if not its or "parallel" not in its[0]:
            return None
        return [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    return []  # fill / map / copy: every memref operand is indexed by the identity


def _row_operands(op: ir.Operation, rows: int) -> tuple[dict[int, int], list[int]] | None:
    """({operand index: the dimension indexed by the row} for the operands a row reads or writes one slice
    of, [the others]), or None if ``op`` is not row-local. Outputs are sliced along their first dimension;
    an input may be sliced along another (a transpose reads row ``r`` of its result from column ``r``)."""
    maps = _first_dim_maps(op)
    if maps is None:
        return None
    operands = list(op.operands)
    n_out = 1 if op.name != "linalg.generic" else len(operands) - _num_inputs(op)
    row_idx: dict[int, int] = {}
    other: list[int] = []
    memref_pos = [i for i, v in enumerate(operands) if isinstance(v.type, ir.MemRefType)]
    for i in memref_pos:
        t = ir.MemRefType(operands[i].type)
        is_output = i >= len(operands) - n_out
        if op.name == "linalg.generic":
            results = [str(r) for r in maps[i].results]
            uses_d0 = [bool(_D0.search(r)) for r in results]
            at = [p for p, r in enumerate(results) if r == "d0"]
            if len(at) == 1 and sum(uses_d0) == 1 and t.shape[at[0]] == rows and (at[0] == 0 or not is_output):
                row_idx[i] = at[0]
            elif is_output or any(uses_d0):
                return None
            else:
                other.append(i)
        else:
            if not t.rank or t.shape[0] != rows:
                return None
            row_idx[i] = 0
    if not any(i >= len(operands) - n_out for i in row_idx):
        return None
    return row_idx, other


#: Ops whose result is a view of their first operand's buffer.
_VIEWS = ("memref.expand_shape", "memref.collapse_shape", "memref.cast", "memref.subview",
          "memref.reinterpret_cast", "memref.transpose")


def _root(v: ir.Value) -> ir.Value:
    """The buffer ``v`` is a view of (``v`` itself when it is not a view)."""
    while not isinstance(v.owner, ir.Block) and v.owner.name in _VIEWS:
        v = v.owner.operands[0]
    return v


def _num_inputs(op: ir.Operation) -> int:
    seg = op.attributes["operandSegmentSizes"]
    return int(ir.DenseI32ArrayAttr(seg)[0])


def _row_view_type(t: ir.MemRefType, dim: int) -> tuple[ir.MemRefType, list[int]]:
    """The type of a one-row subview of ``t`` along ``dim`` (``[.., r, ..][.., 1, ..]``, dynamic offset),
    and its shape."""
    strides, _ = t.get_strides_and_offset()
    shape = list(t.shape)
    shape[dim] = 1
    layout = ir.StridedLayoutAttr.get(ir.ShapedType.get_dynamic_stride_or_offset(), list(strides))
    return ir.MemRefType.get(shape, t.element_type, layout=layout, memory_space=t.memory_space), shape


@dataclasses.dataclass(frozen=True)
class FuseRows:
    name = "fuse-rows"
    #: False: the pass does nothing (the cpu target sets it from its option ``fuse_rows``).
    enabled: bool = True

    def apply(self, module: ir.Module, ctx: Any) -> None:
        if not self.enabled:
            return
        count = 0
        cores = ctx.spec.compute[0].count
        threads_opt = ctx.options.threads
        for fn in ops_named(module, "func.func"):
            if not len(fn.regions[0].blocks) or ir.StringAttr(fn.attributes["sym_name"]).value.startswith("__pbsdk"):
                continue
            block = fn.regions[0].blocks[0]
            sizes = _entry_sizes(ctx, len(block.arguments)) if ir.StringAttr(fn.attributes["sym_name"]).value \
                == ctx.notes.get("entry") else {}
            for run in self._runs(block, sizes):
                if len(run) < 2 and _threads_for(run, cores, threads_opt) < 2:
                    continue  # one op on one core: nothing to gain
                self._outline(module, fn, run, f"__pbsdk_rows{count}", cores, threads_opt)
                count += 1
        if count:
            # Repeated layers make the same row function again and again (ResNet-50: each block's
            # residual add + ReLU): one copy of each, or LLVM optimises every copy (0.2-0.4 s each).
            with module.context:
                merge_identical(module, lambda op: ir.StringAttr(op.attributes["sym_name"]).value.startswith(
                    "__pbsdk_rows") and len(op.regions[0].blocks) > 0)

    def _runs(self, block: ir.Block, sizes: dict[tuple[int, int], Any]) -> list[list[ir.Operation]]:
        runs: list[list[ir.Operation]] = []
        cur: list[ir.Operation] = []
        rows = None
        written: list[ir.Value] = []
        others: list[ir.Value] = []
        sliced: list[ir.Value] = []
        dims: list[int] = []

        def flush() -> None:
            nonlocal cur, rows, written, others, sliced, dims
            if cur:
                runs.append(cur)
            cur, rows, written, others, sliced, dims = [], None, [], [], [], []

        for o in list(block.operations):
            op = o.operation
            if op.name in _MOVABLE and cur and all(not isinstance(r.type, ir.MemRefType) or True for r in op.results):
                op.move_before(cur[0])  # a view or constant: define it before the run and keep going
                continue
            if op.name not in _FUSIBLE or not _only_constant_captures(op):
                flush()
                continue
            mems = _memrefs(op)
            if not mems or any(_unpassable(m.type) for m in mems):
                # (A view whose strides are known at run time, of a dynamic buffer, or a dynamic view that is not
                # whole rows at offset 0, cannot pass to a row function under bare pointers: the op stays.)
                flush()
                continue
            r = ir.MemRefType(mems[-1].type).shape[0] if ir.MemRefType(mems[-1].type).rank else None
            split = _row_operands(op, r) if r else None
            if r == _DYNAMIC:  # a dynamic row count: the run's ops must provably share it
                key = _size_key(mems[-1], 0, sizes)
                r = None if key is None else (_DYNAMIC, key)  # type: ignore[assignment]
            if split is None or r is None or (isinstance(r, int) and r < 2):
                flush()
                continue
            if rows is not None and r != rows:
                flush()
                split = _row_operands(op, _extent(r))
                if split is None:
                    continue
            row_idx, other = split
            ops_vals = list(op.operands)
            n_out = 1 if op.name != "linalg.generic" else len(ops_vals) - _num_inputs(op)
            outs = [ops_vals[i] for i in row_idx if i >= len(ops_vals) - n_out]
            # Read whole, or across rows: an input sliced along another dimension reads every row's writes.
            reads = [ops_vals[i] for i in other] + [ops_vals[i] for i, d in row_idx.items() if d != 0]
            # A whole-buffer operand must not be written in the run, and a row operand must not be read whole
            # (compared by the buffer under any views: a reshape of a written buffer is that buffer); one
            # buffer is sliced along one dimension in the whole run.
            if any(any(_root(v) == _root(w) for w in written) for v in reads) or \
               any(any(_root(v) == _root(x) for x in others) for v in outs) or \
               any(any(ops_vals[i] == b and dims[k] != d for k, b in enumerate(sliced)) for i, d in row_idx.items()):
                flush()
                split = _row_operands(op, _extent(r))
                if split is None:
                    continue
                row_idx, other = split
                reads = [ops_vals[i] for i in other] + [ops_vals[i] for i, d in row_idx.items() if d != 0]
            rows = r
            cur.append(op)
            written += outs
            others += reads
            for i, d in row_idx.items():
                sliced.append(ops_vals[i])
                dims.append(d)
        flush()
        return runs

    def _outline(self, module: ir.Module, fn: ir.Operation, run: list[ir.Operation], name: str, cores: int,
                 threads_opt: int) -> None:
        buffers: list[ir.Value] = []
        for op in run:
            for v in op.operands:
                if isinstance(v.type, ir.MemRefType) and not any(v == b for b in buffers):
                    buffers.append(v)
        rows = ir.MemRefType(_memrefs(run[0])[-1].type).shape[0]
        threads = _threads_for(run, cores, threads_opt)
        dynamic = rows == _DYNAMIC
        row_bufs: dict[int, int] = {}  # buffer -> the dimension its rows are sliced along
        for op in run:
            split = _row_operands(op, rows)
            assert split is not None
            for i, d in split[0].items():
                row_bufs[next(j for j, b in enumerate(buffers) if b == op.operands[i])] = d
        out_arg = next(j for j, b in enumerate(buffers) if b == _memrefs(run[0])[-1])
        ctxt = module.context
        with ctxt, run[0].location:
            from mlir.dialects import arith, memref

            if dynamic and threads > 1:
                # Few rows run in one part, on the calling thread (no fork): `{name}_one`.
                self._part_function(module, f"{name}_one", run, buffers, row_bufs, rows, 1, out_arg)
            self._part_function(module, f"{name}_part", run, buffers, row_bufs, rows, threads, out_arg)
            with ir.InsertionPoint(run[0]):
                if dynamic and threads > 1:
                    idx = ir.IndexType.get()
                    count = memref.dim(buffers[out_arg], arith.ConstantOp(idx, 0).result)
                    per_row = _row_elements(run)
                    enough = arith.cmpi(arith.CmpIPredicate.sge, count,
                                        arith.ConstantOp(idx, -(-2 * MIN_ELEMENTS_PER_THREAD // per_row)).result)
                    if_then(enough, lambda: call_parts(f"{name}_part", list(buffers), threads),
                            lambda: call_parts(f"{name}_one", list(buffers), 1))
                else:
                    call_parts(f"{name}_part", list(buffers), threads)
        for op in reversed(run):
            op.erase()

    @staticmethod
    def _part_function(module: ir.Module, fname: str, run: list[ir.Operation], buffers: list[ir.Value],
                       row_bufs: dict[int, int], rows: int, threads: int, out_arg: int) -> None:
        """``@fname(buffers..., t)``: part ``t`` of ``threads`` of the run, row by row (a dynamic row count
        read from the first op's output)."""
        from mlir.dialects import arith, memref, scf

        types = [b.type for b in buffers] + [ir.IndexType.get()]
        with ir.InsertionPoint(module.body):
            part = func.FuncOp(fname, ir.FunctionType.get(types, []))
            entry = part.add_entry_block()
        with ir.InsertionPoint(entry):
            idx = ir.IndexType.get()
            t = entry.arguments[len(buffers)]
            if rows == _DYNAMIC:  # ceil(rows / threads) rows a part
                c_rows = memref.dim(entry.arguments[out_arg], arith.ConstantOp(idx, 0).result)
                c_per = arith.DivUIOp(arith.AddIOp(c_rows, arith.ConstantOp(idx, threads - 1).result).result,
                                      arith.ConstantOp(idx, threads).result).result
            else:
                c_per = arith.ConstantOp(idx, -(-rows // threads)).result
                c_rows = arith.ConstantOp(idx, rows).result
            c1 = arith.ConstantOp(idx, 1).result
            lo = arith.MulIOp(t, c_per).result
            hi = arith.MinSIOp(arith.AddIOp(lo, c_per).result, c_rows).result
            loop = scf.ForOp(lo, hi, c1)
            with ir.InsertionPoint(loop.body):
                r = loop.induction_variable
                views = {}
                for j, b in enumerate(buffers):
                    arg = entry.arguments[j]
                    if j in row_bufs:
                        mt = ir.MemRefType(b.type)
                        dim = row_bufs[j]
                        vt, shape = _row_view_type(mt, dim)
                        offsets = [0] * mt.rank
                        offsets[dim] = ir.ShapedType.get_dynamic_stride_or_offset()
                        # A dynamic size beside the row's (a softmax over a key length) is read from the buffer.
                        widths = [memref.dim(arg, arith.ConstantOp(idx, d).result)
                                  for d, n in enumerate(shape) if n == _DYNAMIC]
                        views[j] = memref.SubViewOp(
                            vt, arg, [r], widths, [], ir.DenseI64ArrayAttr.get(offsets),
                            ir.DenseI64ArrayAttr.get(shape),
                            ir.DenseI64ArrayAttr.get([1] * mt.rank)).result
                    else:
                        views[j] = arg
                for op in run:
                    clone = op.clone()
                    for i, v in enumerate(list(op.operands)):
                        found = next((k for k, b in enumerate(buffers) if b == v), None)
                        if found is not None:
                            clone.operands[i] = views[found]
                        else:
                            clone.operands[i] = _rematerialise(v, clone)
                    if clone.regions and len(clone.regions[0].blocks):
                        for user, i, v in _captures(clone):
                            user.operands[i] = _rematerialise(v, clone)
                scf.YieldOp([])
            func.ReturnOp([])


def _threads_for(run: list[ir.Operation], cores: int, threads_opt: int) -> int:
    """Threads worth using: every one gets at least MIN_ELEMENTS_PER_THREAD elements, and a row. A dynamic
    row count plans for many rows (the call runs few in one part: `FuseRows._outline`)."""
    rows = ir.MemRefType(_memrefs(run[0])[-1].type).shape[0]
    if rows == _DYNAMIC:
        return max(1, threads_opt or cores)
    elements = sum(_numel(ir.MemRefType(v.type)) for op in run for v in _memrefs(op))
    return max(1, min(threads_opt or cores, rows, elements // MIN_ELEMENTS_PER_THREAD))


def _row_elements(run: list[ir.Operation]) -> int:
    """Elements the run touches per row (its buffers' static sizes; a dynamic dimension counts as 1)."""
    return max(1, sum(_numel(ir.MemRefType(v.type)) for op in run for v in _memrefs(op)))


_DYNAMIC = ir.ShapedType.get_dynamic_size()



def _extent(rows: Any) -> int:
    """A run's row count as `_row_operands` compares it: the dynamic size marker for a dynamic one."""
    return _DYNAMIC if isinstance(rows, tuple) else rows


def _entry_sizes(ctx: Any, n_args: int) -> dict[tuple[int, int], Any]:
    """(argument, dimension) -> the size expression the entry's signature gives it (`pbsdk.core.dims`, from
    the ``input`` stage: the inputs, the constants, the outputs), for its dynamic dimensions."""
    inputs, outputs = ctx.notes.get("inputs"), ctx.notes.get("outputs")
    if inputs is None or outputs is None:
        return {}
    shapes = [s for s, _ in inputs] + [()] * len(ctx.constants) + [s for s, _ in outputs]
    if len(shapes) != n_args:
        return {}
    return {(i, d): n for i, shape in enumerate(shapes) for d, n in enumerate(shape) if isinstance(n, str)}


def _size_key(buffer: ir.Value, dim: int, sizes: dict[tuple[int, int], Any]) -> Any:
    """What provably fixes dimension ``dim`` of ``buffer``, so that two buffers with equal keys have equal
    sizes there at run time: the entry signature's size expression of an argument's dimension (``sizes``),
    another argument's dimension, or the size value a ``memref.alloc`` was given (followed through
    ``memref.dim``); None when neither."""
    owner = buffer.owner
    if isinstance(owner, ir.Block):
        number = ir.BlockArgument(buffer).arg_number
        return ("size", sizes[(number, dim)]) if (number, dim) in sizes else ("arg", number, dim)
    op = owner.operation if hasattr(owner, "operation") else owner
    if op.name != "memref.alloc":
        return None
    t = ir.MemRefType(buffer.type)
    dynamic = [d for d, n in enumerate(t.shape) if n == _DYNAMIC]
    if dim not in dynamic:
        return ("static", t.shape[dim])
    size = op.operands[dynamic.index(dim)]
    producer = defining_op(size)
    if producer is not None and producer.name == "memref.dim":
        at = defining_op(producer.operands[1])
        if at is not None and at.name == "arith.constant":
            return _size_key(producer.operands[0], ir.IntegerAttr(at.attributes["value"]).value, sizes)
    return ("value", size)


def _only_constant_captures(op: ir.Operation) -> bool:
    """Whether every value ``op``'s body uses from outside is a constant (which can be re-created)."""
    if not op.regions or not len(op.regions[0].blocks):
        return True
    for _, _, v in _captures(op):
        owner = defining_op(v)
        if owner is None or owner.name != "arith.constant":
            return False
    return True


def _numel(t: ir.MemRefType) -> int:
    n = 1
    for d in t.shape:
        n *= d if d != _DYNAMIC else 1
    return n


def _rematerialise(v: ir.Value, before: ir.Operation) -> ir.Value:
    """A scalar operand (a constant) of a fused op, re-created inside the outlined function."""
    owner = v.owner
    owner = owner if isinstance(owner, ir.Operation) else getattr(owner, "operation", None)
    if owner is None or owner.name != "arith.constant":
        raise ValueError(f"operand {v} is neither a buffer nor a constant")
    fresh = owner.clone()
    fresh.move_before(before)
    return fresh.results[0]
