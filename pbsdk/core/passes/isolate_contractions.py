"""Pass ``isolate-contractions``: move each named contraction on tensors into its own private function.

Upstream's elementwise fusion also folds ``tensor.collapse_shape``/``expand_shape`` and gather-like
producers into the ops that consume them, generalising a named ``linalg.matmul`` into an opaque
``linalg.generic`` (e.g. a matmul on a reshaped activation becomes a 4-loop generic). The planner and
``pack-contractions`` recognise the named ops, so before fusion each ``linalg.matmul`` /
``linalg.batch_matmul`` is replaced by a call to ``@__pbsdk_contraction<N>`` holding just that op;
fusion does not cross calls, bufferization rewrites the function with the rest of the module
(identity-layout arguments: a strided view passed in is copied), and the op arrives at the packing
stage intact.

The contraction's elementwise epilogue goes with it: while the result has exactly one use and that use
is an all-parallel ``linalg.generic`` reading it once at the identity map, writing a fresh
(``tensor.empty``) tensor of the same type (of any element type where the contraction's operands are
narrower than its accumulator: a bf16 product rounded back to bf16, an i32 one requantized to i8) without
reading its initial value, the generic moves into
the function too (its other operands become arguments). An operand of the epilogue made by elementwise
generics that only the epilogue reads, element for element (a dequantized residual: i8 -> f32, minus the
zero point, times the scale), moves in with its producers (`_producer`; a reshape between them is pushed
above the chain first, `_push_collapse`), so the function takes the narrow tensor they started from.
Where the result is read by several elementwise generics that meet again in one (an activation reading its
input more than once, traced op by op: leaky ReLU's ``where(x > 0, x, a * x)``, SiLU, GELU, Mish), that whole
region goes in as the epilogue (`_epilogue_region`), and the chain goes on from the op where it meets.
Inside, fusion merges the chain into one generic, which ``pack-contractions`` folds into the kernel's final
store.

The target decides whether either happens (`pbsdk.core.options.TargetOptions.isolate_contractions` and
``isolate_epilogues``: yes unless its options say otherwise; the cpu target's ``pack`` and
``fuse_epilogues``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from typing import Any

from mlir import ir
from mlir.dialects import func, linalg, tensor

from pbsdk.core.ir.builder import reassociation, reassociation_groups
from pbsdk.core.passes import defining_op, map_dims, ops_named, user_op

CONTRACTIONS = ("linalg.matmul", "linalg.batch_matmul")
#: The isolated functions are named this plus a number.
PREFIX = "__pbsdk_contraction"


#: Longest elementwise chain moved in with a contraction (fusion merges it into one op there).
MAX_EPILOGUE = 24


def _captures(op: ir.Operation) -> list[tuple[ir.Operation, int, ir.Value]]:
    """(user, operand index, value) for every use inside ``op``'s body of a value defined outside it."""
    body = op.regions[0].blocks[0]
    inside = list(body.arguments)
    found = []
    for inner in body.operations:
        inner = inner.operation
        for i, v in enumerate(inner.operands):
            if not any(v == x for x in inside):
                found.append((inner, i, v))
        inside.extend(inner.results)
    return found


def _fresh_parallel(op: ir.Operation) -> bool:
    """An all-parallel ``linalg.generic`` of one result, written at the identity map into a fresh tensor
    (``tensor.empty``) it does not read, whose body takes only constants from outside (they are cloned in):
    what moves into a contraction's function, as its epilogue or (`_elementwise`) an epilogue's producer."""
    if op.name != "linalg.generic" or len(op.results) != 1:
        return False
    if any("parallel" not in str(a) for a in ir.ArrayAttr(op.attributes["iterator_types"])):
        return False
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(op.attributes["indexing_maps"])]
    n_in = len(op.operands) - 1
    init = defining_op(op.operands[n_in])
    ident = ir.AffineMap.get_identity(maps[n_in].n_dims, context=op.context)
    if init is None or init.name != "tensor.empty" or maps[n_in] != ident:
        return False
    if list(op.regions[0].blocks[0].arguments[n_in].uses):
        return False
    return all((d := defining_op(v)) is not None and d.name == "arith.constant" for _, _, v in _captures(op))


def _epilogue_user(value: ir.Value, convert: bool = False) -> ir.Operation | None:
    """The one elementwise consumer of ``value`` that may be fused as an epilogue (`_fresh_parallel`, reading
    ``value`` once at the identity map), or None. Its result has ``value``'s type, or with ``convert`` (a
    contraction whose operands are narrower than its accumulator: bf16 -> f32, i8 -> i32) any element type of
    the same shape (the product rounded back, requantized)."""
    uses = list(value.uses)
    if len(uses) != 1:
        return None
    user = user_op(uses[0])
    if not _fresh_parallel(user):
        return None
    n_in = len(user.operands) - 1
    out = user.operands[n_in]
    if not isinstance(out.type, ir.RankedTensorType) or (
            out.type != value.type if not convert else ir.RankedTensorType(out.type).shape != value.type.shape):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(user.attributes["indexing_maps"])]
    reads = [i for i in range(n_in) if user.operands[i] == value]
    if len(reads) != 1 or maps[reads[0]] != maps[n_in]:  # the identity map (`_fresh_parallel`)
        return None
    return user


def _epilogue_region(value: ir.Value, convert: bool = False) -> list[ir.Operation] | None:
    """The elementwise ops after ``value`` (read by several of them) that meet again in one op, in program
    order, that op last: an activation that reads its input more than once (leaky ReLU's ``where(x > 0, x,
    a * x)``, SiLU's ``x * sigmoid(x)``, GELU, Mish), traced as separate generics. Each is `_elementwise`, of
    ``value``'s type, reads ``value`` and the others' results only at the identity map, in ``value``'s
    block; only the last one's result is read by anything else, and the region holds at most
    `MAX_EPILOGUE` ops. None where ``value`` has one use (`_epilogue_user`'s case) or no such region exists."""
    if convert or len(list(value.uses)) < 2:
        return None
    owner = defining_op(value)
    region: list[ir.Operation] = []

    def inside(op: ir.Operation) -> bool:
        return any(op == o for o in region)

    def add_users(v: ir.Value) -> bool:
        for use in v.uses:
            user = user_op(use)
            if inside(user):
                continue
            if (len(region) == MAX_EPILOGUE or not _elementwise(user) or user.results[0].type != value.type
                    or owner is None or user.block != owner.block):
                return False
            region.append(user)
        return True

    if not add_users(value):
        return None
    while True:
        escaping = [o for o in region if any(not inside(user_op(u)) for u in o.results[0].uses)]
        if not escaping:
            return None
        escaping = _in_block_order(escaping)
        if len(escaping) == 1:
            break
        # All but the last escaping op must be read inside the region: take in their users.
        if not all(add_users(o.results[0]) for o in escaping[:-1]):
            return None
    reads = [value, *(o.results[0] for o in region)]
    for o in region:
        maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(o.attributes["indexing_maps"])]
        if any(maps[i] != maps[-1] for i, v in enumerate(list(o.operands)[:-1]) if any(v == r for r in reads)):
            return None
    region = _in_block_order(region)
    return region if region[-1] == escaping[0] else None


def _in_block_order(ops: list[ir.Operation]) -> list[ir.Operation]:
    """``ops`` (of one block) sorted by their position in it."""
    def before(a: ir.Operation, b: ir.Operation) -> int:
        return -1 if a.is_before_in_block(b) else 1

    return sorted(ops, key=functools.cmp_to_key(before))


# ----------------------------------------------------------------- an epilogue after a reshape of the result

@dataclasses.dataclass(frozen=True)
class CollapsedRead:
    """How an epilogue input is read once its generic runs on the contraction's own (collapsed) loops:
    ``groups`` is the input's reassociation, its positions per dimension of the collapsed input (None: read
    as it is); ``loops`` the collapsed loops its new indexing map reads, in order."""

    groups: tuple[tuple[int, ...], ...] | None
    loops: tuple[int, ...]


def collapse_read(loop_groups: Sequence[Sequence[int]], extents: Sequence[int], results: Sequence[int | None],
                  shape: Sequence[int]) -> CollapsedRead | None:
    """The `CollapsedRead` of an input of an elementwise generic over the expanded loops ``loop_groups``
    (the reassociation of a ``tensor.expand_shape``: collapsed loop ``g`` is the expanded loops
    ``loop_groups[g]``, of ``extents``), whose indexing map's results are ``results`` (an expanded loop, or
    None for the constant 0) on an input of ``shape``; None where no collapsed map reads the same elements.

    Every group the input reads must be read whole (but for loops of extent 1, which read index 0 like a
    constant), its loops in order, each group once (a per-channel bias reads the last group, a residual
    all of them; groups in another order are a transposed read); a constant-0 result needs extent 1 and
    joins the group beside it. Pure: no IR."""
    owner = {d: g for g, dims in enumerate(loop_groups) for d in dims}
    if len(results) != len(shape):
        return None
    results = [None if r is not None and 0 <= r < len(extents) and extents[r] == 1 else r for r in results]
    if any(r is None and e != 1 for r, e in zip(results, shape)):
        return None
    segments: list[list[int]] = []
    loops: list[int] = []
    pending: list[int] = []  # unit positions before the first group read
    for p, r in enumerate(results):
        if r is None:
            (segments[-1] if segments else pending).append(p)
            continue
        g = owner.get(r)
        if g is None:
            return None
        if not loops or loops[-1] != g:
            if g in loops:
                return None
            loops.append(g)
            segments.append(pending + [p])
            pending = []
        else:
            segments[-1].append(p)
    for g, seg in zip(loops, segments):
        if [results[p] for p in seg if results[p] is not None] != [d for d in loop_groups[g] if extents[d] != 1]:
            return None
    if not loops:  # reads one element (all of its extents are 1)
        return CollapsedRead((), ()) if shape else CollapsedRead(None, ())
    if pending:
        return None
    groups = tuple(tuple(seg) for seg in segments)
    return CollapsedRead(None if all(len(seg) == 1 for seg in groups) else groups, tuple(loops))


def _on_collapsed_loops(gen: ir.Operation, loop_groups: Sequence[Sequence[int]], extents: Sequence[int],
                        expanded: ir.Value | None = None, value: ir.Value | None = None) -> linalg.GenericOp | None:
    """A copy of the elementwise ``gen`` (over loops of ``extents``) on the collapsed loops ``loop_groups``,
    built at the insertion point, its body moved in, each input read through `collapse_read` (collapsed by a
    ``tensor.collapse_shape`` where it must be); an input equal to ``expanded`` is read as ``value`` (at the
    identity map). None, building nothing, where some input cannot be read so."""
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(gen.attributes["indexing_maps"])]
    n_in = len(gen.operands) - 1
    reads: list[CollapsedRead | None] = []
    for i in range(n_in):
        if expanded is not None and gen.operands[i] == expanded:
            reads.append(None)
            continue
        t = gen.operands[i].type
        results = map_dims(maps[i])
        plan = (collapse_read(loop_groups, extents, results, ir.RankedTensorType(t).shape)
                if results is not None and isinstance(t, ir.RankedTensorType) and t.has_static_shape else None)
        if plan is None:
            return None
        reads.append(plan)
    rank = len(loop_groups)
    shape = [math.prod(extents[d] for d in g) for g in loop_groups]
    vt = ir.RankedTensorType.get(shape, ir.RankedTensorType(gen.results[0].type).element_type)
    inputs, new_maps = [], []
    for i, plan in enumerate(reads):
        if plan is None:
            assert value is not None
            inputs.append(value)
            new_maps.append(ir.AffineMap.get_identity(rank))
            continue
        v = gen.operands[i]
        if plan.groups is not None:
            st = ir.RankedTensorType(v.type)
            collapsed = [math.prod(st.shape[p] for p in g) for g in plan.groups]
            v = tensor.CollapseShapeOp(ir.RankedTensorType.get(collapsed, st.element_type), v,
                                       reassociation(plan.groups)).result
        inputs.append(v)
        new_maps.append(ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(d) for d in plan.loops]))
    new_maps.append(ir.AffineMap.get_identity(rank))
    empty = tensor.EmptyOp(vt.shape, vt.element_type).result
    parallel = ir.Attribute.parse("#linalg.iterator_type<parallel>")
    new = linalg.GenericOp([vt], inputs, [empty], ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in new_maps]),
                           ir.ArrayAttr.get([parallel] * rank))
    old_body = gen.regions[0].blocks[0]
    body = new.regions[0].blocks.append(*[a.type for a in old_body.arguments])
    for old_arg, new_arg in zip(old_body.arguments, body.arguments):
        old_arg.replace_all_uses_with(new_arg)
    for o in list(old_body.operations):
        body.append(o.operation)
    return new


def _collapse_epilogue(value: ir.Value, convert: bool = False) -> ir.Operation | None:
    """Where ``value`` (a contraction's result, or an epilogue's) is only reshaped by a
    ``tensor.expand_shape`` (a convolution's product viewed as its NHWC or NCHW output) for one elementwise
    generic, rewrite that generic onto ``value``'s own loops (`collapse_read` for each input), the expand
    moved after it, and return it (an epilogue `_epilogue_user` takes); None, changing nothing, otherwise."""
    uses = list(value.uses)
    if len(uses) != 1:
        return None
    view = user_op(uses[0])
    if view.name != "tensor.expand_shape" or len(list(view.results[0].uses)) != 1:
        return None
    expanded = view.results[0]
    if not ir.RankedTensorType(expanded.type).has_static_shape:  # sizes known at run time: left as it is
        return None
    gen = _epilogue_user(expanded, convert)
    if gen is None:
        return None
    loop_groups = reassociation_groups(view)
    with ir.InsertionPoint(gen), gen.location:
        new = _on_collapsed_loops(gen, loop_groups, ir.RankedTensorType(expanded.type).shape, expanded, value)
        if new is None:
            return None
        back = tensor.ExpandShapeOp(gen.results[0].type, new.result, view.attributes["reassociation"], [],
                                    list(ir.RankedTensorType(expanded.type).shape)).result
    gen.results[0].replace_all_uses_with(back)
    _erase_rewritten(gen, view)
    return new.operation


def _erase_rewritten(gen: ir.Operation, view: ir.Operation) -> None:
    """Erase a generic rewritten onto collapsed loops, its reshape ``view`` (first if it is ``gen``'s user),
    and ``gen``'s init tensor once nothing else uses it."""
    out = defining_op(gen.operands[len(gen.operands) - 1])
    for op in ((view, gen) if view.operands and view.operands[0] == gen.results[0] else (gen, view)):
        op.erase()
    if out is not None and not list(out.results[0].uses):
        out.erase()


def _producer(value: ir.Value, consumer: ir.Operation, index: int) -> ir.Operation | None:
    """The op making epilogue operand ``index`` of ``consumer`` that moves into the contraction's function
    with it, or None: an elementwise ``linalg.generic`` (`_elementwise`) whose result only ``consumer``
    reads, at its identity map (element for element). A dequantized residual (i8 -> f32, minus the zero
    point, times the scale) is then read by the kernel's epilogue as i8, not written and read back in f32
    by a pass of its own. A ``tensor.collapse_shape`` of such a producer (an epilogue on a convolution's
    collapsed product) is first pushed above it (`_push_collapse`)."""
    owner = defining_op(value)
    if owner is None or len(list(value.uses)) != 1 or consumer.name != "linalg.generic":
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(consumer.attributes["indexing_maps"])]
    if maps[index] != ir.AffineMap.get_identity(maps[index].n_dims, context=consumer.context):
        return None
    if owner.name == "tensor.collapse_shape":
        owner = _push_collapse(owner)
    return owner if owner is not None and _elementwise(owner) else None


def _push_collapse(collapse: ir.Operation) -> ir.Operation | None:
    """``collapse_shape(gen(x...))`` of a single-use elementwise ``gen`` as ``gen'(collapse(x)...)`` on the
    collapsed loops (`_on_collapsed_loops`), so that fusion in the contraction's function never meets a
    reshape (it would propagate it into the contraction and generalise it); returns ``gen'``, or None,
    changing nothing."""
    gen = defining_op(collapse.operands[0])
    if gen is None or len(list(collapse.operands[0].uses)) != 1 or not _elementwise(gen):
        return None
    extents = ir.RankedTensorType(gen.results[0].type).shape
    with ir.InsertionPoint(collapse), collapse.location:
        new = _on_collapsed_loops(gen, reassociation_groups(collapse), extents)
    if new is None:
        return None
    collapse.results[0].replace_all_uses_with(new.result)
    _erase_rewritten(gen, collapse)
    return new.operation


def _elementwise(op: ir.Operation) -> bool:
    """A `_fresh_parallel` generic whose body is arith and math ops only (what a kernel's epilogue builds on
    vectors), so that moving it into an epilogue never keeps the epilogue out of the kernel."""
    return _fresh_parallel(op) and all(o.operation.name.split(".")[0] in ("arith", "math")
                                       for o in list(op.regions[0].blocks[0].operations)[:-1])


def _clone_into(op: ir.Operation, mapping: dict, block: ir.Block, args: list[ir.Value],
                pulled: list[ir.Operation] | None = None) -> ir.Operation:
    """Clone ``op`` at the end of ``block`` (before nothing: callers set the insertion point), remapping
    operands through ``mapping``; operands not yet mapped become new block arguments (or, for
    ``tensor.empty``, are cloned). With ``pulled``, the elementwise producers of an epilogue's operands
    (`_producer`) are cloned first, recursively, and listed there (for the caller to erase).
    A ``tensor.empty`` with dynamic sizes is cloned too, its sizes becoming arguments (the caller of a
    function returning such a buffer allocates it: `pbsdk.core.passes.dynamic_results`)."""
    if pulled is not None and len(pulled) < MAX_EPILOGUE:
        for i, v in enumerate(list(op.operands)):
            producer = _producer(v, op, i) if v not in mapping else None
            if producer is not None:
                v = op.operands[i]  # a pushed collapse replaced the operand
                mapping[v] = _clone_into(producer, mapping, block, args, pulled).results[0]
                pulled.append(producer)
    clone = op.clone()
    for i, v in enumerate(list(op.operands)):
        if v in mapping:
            clone.operands[i] = mapping[v]
            continue
        owner = v.owner
        if isinstance(owner, ir.Operation) or hasattr(owner, "operation"):
            owner_op = owner if isinstance(owner, ir.Operation) else owner.operation
            if owner_op.name in ("tensor.empty", "arith.constant") and not owner_op.operands:
                fresh = owner_op.clone()
                fresh.move_before(clone)
                mapping[v] = fresh.results[0]
                clone.operands[i] = fresh.results[0]
                continue
            if owner_op.name == "tensor.empty":
                fresh = owner_op.clone()
                fresh.move_before(clone)
                for j, size in enumerate(list(owner_op.operands)):
                    if size not in mapping:
                        args.append(size)
                        mapping[size] = block.add_argument(size.type, op.location)
                    fresh.operands[j] = mapping[size]
                mapping[v] = fresh.results[0]
                clone.operands[i] = fresh.results[0]
                continue
        args.append(v)
        arg = block.add_argument(v.type, op.location)
        mapping[v] = arg
        clone.operands[i] = arg
    if clone.regions and len(clone.regions[0].blocks):
        for user, i, v in _captures(clone):
            if v not in mapping:
                const = defining_op(v)
                assert const is not None and const.name == "arith.constant"
                fresh = const.clone()
                fresh.move_before(clone)
                mapping[v] = fresh.results[0]
            user.operands[i] = mapping[v]
    return clone


@dataclasses.dataclass(frozen=True)
class IsolateContractions:
    name = "isolate-contractions"

    def apply(self, module: ir.Module, ctx: Any) -> None:
        if not ctx.options.target.isolate_contractions():
            return
        count = 0
        for opname in CONTRACTIONS:
            for op in ops_named(module, opname):
                if not all(isinstance(v.type, ir.RankedTensorType) for v in op.operands) or len(op.results) != 1:
                    continue
                name = f"{PREFIX}{count}"
                count += 1
                chain = [op]
                init = defining_op(op.operands[len(op.operands) - 1])
                if init is not None and init.name == "linalg.fill" and len(list(init.results[0].uses)) == 1:
                    chain.insert(0, init)  # the zero fill goes too: the kernel can skip it
                convert = (ir.ShapedType(op.operands[0].type).element_type
                           != ir.ShapedType(op.results[0].type).element_type)
                while len(chain) <= MAX_EPILOGUE + 1 and ctx.options.target.isolate_epilogues():
                    result = chain[-1].results[0]
                    user = _epilogue_user(result, convert) or _collapse_epilogue(result, convert)
                    if user is not None:
                        chain.append(user)
                        continue
                    region = _epilogue_region(result, convert)
                    if region is None or len(chain) + len(region) > MAX_EPILOGUE + 2:
                        break
                    chain.extend(region)
                last = chain[-1]
                with module.context, op.location:
                    with ir.InsertionPoint(module.body):
                        fn = func.FuncOp(name, ir.FunctionType.get([], []))
                        fn.attributes["sym_visibility"] = ir.StringAttr.get("private")
                        block = fn.regions[0].blocks.append()
                    args: list[ir.Value] = []
                    mapping: dict = {}
                    pulled: list[ir.Operation] = []
                    with ir.InsertionPoint(block):
                        clones = []
                        for o in chain:
                            clones.append(_clone_into(o, mapping, block, args, pulled if o is not op else None))
                            mapping[o.results[0]] = clones[-1].results[0]
                        func.ReturnOp([clones[-1].results[0]])
                    fn.attributes["function_type"] = ir.TypeAttr.get(
                        ir.FunctionType.get([a.type for a in args], [last.results[0].type]))
                    with ir.InsertionPoint(last):
                        call = func.CallOp([last.results[0].type], ir.FlatSymbolRefAttr.get(name), args)
                last.results[0].replace_all_uses_with(call.results[0])
                for o in reversed(chain):
                    o.erase()
                for o in reversed(pulled):  # consumers before their producers
                    o.erase()

