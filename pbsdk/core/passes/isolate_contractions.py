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
(``tensor.empty``) tensor of the same shape without reading its initial value, the generic moves into
the function too (its other operands become arguments). Inside, fusion merges the chain into one
generic, which ``pack-contractions`` folds into the kernel's final store.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir
from mlir.dialects import func

from pbsdk.core.passes import defining_op, ops_named

CONTRACTIONS = ("linalg.matmul", "linalg.batch_matmul")
#: The isolated functions are named this plus a number.
PREFIX = "__pbsdk_contraction"


#: Longest elementwise chain moved in with a contraction (fusion merges it into one op there).
MAX_EPILOGUE = 4


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


def _epilogue_user(value: ir.Value) -> ir.Operation | None:
    """The one elementwise consumer of ``value`` that may be fused as an epilogue, or None."""
    uses = list(value.uses)
    if len(uses) != 1:
        return None
    user = uses[0].owner
    if not isinstance(user, ir.Operation):
        user = user.operation
    if user.name != "linalg.generic" or len(user.results) != 1:
        return None
    its = [str(a) for a in ir.ArrayAttr(user.attributes["iterator_types"])]
    if any("parallel" not in i for i in its):
        return None
    maps = [ir.AffineMapAttr(m).value for m in ir.ArrayAttr(user.attributes["indexing_maps"])]
    n_in = len(user.operands) - 1
    out = user.operands[n_in]
    if not isinstance(out.type, ir.RankedTensorType) or out.type != value.type:
        return None
    owner = out.owner
    if not isinstance(owner, ir.Operation):
        owner = owner.operation
    if owner.name != "tensor.empty":
        return None
    ident = ir.AffineMap.get_identity(len(its), context=value.type.context)
    reads = [i for i in range(n_in) if user.operands[i] == value]
    if len(reads) != 1 or maps[reads[0]] != ident or maps[n_in] != ident:
        return None
    body = user.regions[0].blocks[0]
    if list(body.arguments[n_in].uses):
        return None
    for _, _, v in _captures(user):  # only constants may come from outside (they are cloned in)
        owner = defining_op(v)
        if owner is None or owner.name != "arith.constant":
            return None
    return user


def _clone_into(op: ir.Operation, mapping: dict, block: ir.Block, args: list[ir.Value]) -> ir.Operation:
    """Clone ``op`` at the end of ``block`` (before nothing: callers set the insertion point), remapping
    operands through ``mapping``; operands not yet mapped become new block arguments (or, for
    ``tensor.empty``, are cloned)."""
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
        if not ctx.options.pack:
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
                while len(chain) <= MAX_EPILOGUE + 1 and ctx.options.fuse_epilogues:
                    user = _epilogue_user(chain[-1].results[0])
                    if user is None:
                        break
                    chain.append(user)
                last = chain[-1]
                with module.context, op.location:
                    with ir.InsertionPoint(module.body):
                        fn = func.FuncOp(name, ir.FunctionType.get([], []))
                        fn.attributes["sym_visibility"] = ir.StringAttr.get("private")
                        block = fn.regions[0].blocks.append()
                    args: list[ir.Value] = []
                    mapping: dict = {}
                    with ir.InsertionPoint(block):
                        clones = []
                        for o in chain:
                            clones.append(_clone_into(o, mapping, block, args))
                            mapping[o.results[0]] = clones[-1].results[0]
                        func.ReturnOp([clones[-1].results[0]])
                    fn.attributes["function_type"] = ir.TypeAttr.get(
                        ir.FunctionType.get([a.type for a in args], [last.results[0].type]))
                    with ir.InsertionPoint(last):
                        call = func.CallOp([last.results[0].type], ir.FlatSymbolRefAttr.get(name), args)
                last.results[0].replace_all_uses_with(call.results[0])
                for o in reversed(chain):
                    o.erase()

