"""Input writes of an inference graph, done in place (issue #31: a static KV cache written a row a step).

AOTAutograd, asked to keep an inference graph's input mutations in the graph
(``keep_inference_input_mutations``), ends the graph with ``copy_(x, new_x)`` for each mutated input ``x``.
A static cache's update is ``copy_(cache, index_put(cache, [None, None, position], rows))``: functional, the
kernel writes the whole cache anew and the ``copy_`` copies it back — each layer's keys and values twice a
decode step, however short the step. `write_in_place` turns that pair into the write it stands for,
``index_put_(cache, [None, None, position], rows)`` at the ``index_put``'s place, which torch runs on the
rows alone; the ops that read the updated cache read ``cache`` itself after it.

That is exact only where nothing reads the input's old value: the rewrite applies when the input's only
users are the functional update and its ``copy_``. Any other ``copy_`` stays where AOTAutograd put it
(the graph's end, after every read) and torch runs it, as its runtime wrapper would have.

Pure FX: no MLIR, no pbsdk kernels (`tests/frontends/test_torch_static_cache.py` checks it on small graphs).
"""

from __future__ import annotations

import dataclasses

import torch
import torch.fx

from pbsdk.frontends.torch.convert import op_name

#: Functional updates of their first operand, and the in-place op each stands for (same operands).
_IN_PLACE_OF = {
    "aten.index_put.default": torch.ops.aten.index_put_.default,
    "aten.index_copy.default": torch.ops.aten.index_copy_.default,
}

#: Ops that write a graph input (the rewritten updates and the remaining ``copy_``s): torch runs them,
#: between the kernels, in graph order.
INPUT_WRITES = frozenset({"aten.copy_.default", *(op_name(write) for write in _IN_PLACE_OF.values())})


@dataclasses.dataclass(frozen=True)
class InputWrites:
    """What `write_in_place` found: the inputs the graph writes (placeholder names) and how many of the
    writes it made in place (the rest are whole-tensor ``copy_``s at the graph's end)."""

    written: frozenset[str] = frozenset()
    in_place: int = 0
    copies: int = 0


def _update_in_place(copy: torch.fx.Node) -> torch.fx.Node | None:
    """The functional update ``copy`` copies back, when it can be done in place instead; else None."""
    dst, src = copy.args[0], copy.args[1]
    if not (isinstance(dst, torch.fx.Node) and isinstance(src, torch.fx.Node) and src.op == "call_function"):
        return None
    if op_name(src.target) not in _IN_PLACE_OF or src.args[0] is not dst or src.kwargs.get("accumulate"):
        return None
    if op_name(src.target) == "aten.index_put.default" and len(src.args) > 3 and src.args[3]:
        return None  # accumulate=True: a sum, not a write (kept functional)
    if set(dst.users) != {src, copy}:
        return None  # the old value is read elsewhere: writing it early would change what that reads
    return src


def write_in_place(gm: torch.fx.GraphModule) -> InputWrites:
    """Rewrite ``gm`` (AOTAutograd's inference graph with its input mutations kept) so each placeholder
    updated by ``copy_(x, index_put(x, ...))`` (or ``index_copy``) is written in place by ``index_put_``
    at the update's place, its readers reading ``x``; returns what the graph writes."""
    written: set[str] = set()
    in_place = copies = 0
    for copy in [n for n in gm.graph.nodes if n.op == "call_function" and op_name(n.target) == "aten.copy_.default"]:
        dst = copy.args[0]
        if not (isinstance(dst, torch.fx.Node) and dst.op == "placeholder"):
            continue
        written.add(dst.name)
        src = _update_in_place(copy)
        if src is None:
            copies += 1
            continue
        with gm.graph.inserting_before(src):
            write = gm.graph.call_function(_IN_PLACE_OF[op_name(src.target)], tuple(src.args), dict(src.kwargs))
        write.meta.update(src.meta)
        src.replace_all_uses_with(write)
        # The copy_ now copies x onto itself: gone (its result, x, is never read: AOTAutograd returns
        # mutated inputs through the wrapper, not the graph).
        copy.replace_all_uses_with(dst)
        gm.graph.erase_node(copy)
        gm.graph.erase_node(src)
        in_place += 1
    if in_place:
        gm.graph.lint()
        gm.recompile()
    return InputWrites(frozenset(written), in_place, copies)


__all__ = ["INPUT_WRITES", "InputWrites", "write_in_place"]
