"""Model inputs that carry shapes, axes or indices: which inputs they are, and a model's compiled
specialisations on their values.

pbsdk compiles static shapes, so a value that decides a shape or an index pattern (Reshape's shape,
Slice's starts, a reduction's axes, Range's bounds: `pbsdk.onnx.convert.VALUE_OPERANDS`) must be known
when the graph is converted. When such a value is a model input, the model is compiled once per distinct
value of those inputs, the values being constants of that compile; the other inputs stay run-time
tensors. `value_inputs` decides which inputs (pure: op types and names, no protos); `Specialisations` keeps
the compiled models, keyed by the values, in a bounded LRU that logs what it evicts.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Generic, TypeVar

from pbsdk.onnx.convert import TYPE_ONLY, VALUE_OPERANDS

log = logging.getLogger("pbsdk.onnx")

#: A value input holds at most this many elements (a shape or axes of rank <= 64; a scalar bound): a larger
#: tensor reaching a value operand is data, and compiling per distinct value of it would never hit.
MAX_VALUES = 64

#: The default bound on the specialisations a model keeps compiled (`ImportOptions.specialisations`).
DEFAULT_LIMIT = 8

#: (op type, input names, output names) of one node, in topological order; "" is an omitted input.
Node = tuple[str, Sequence[str], Sequence[str]]


@dataclasses.dataclass(frozen=True)
class Decision:
    """``specialised``: model inputs compiled per value, with the operand each reaches (``"Reshape's
    shape"``); ``refused``: inputs that reach such an operand but cannot be specialised on, with why."""

    specialised: Mapping[str, str]
    refused: Mapping[str, str]


def value_inputs(nodes: Sequence[Node], inputs: Mapping[str, tuple[int, ...] | None], *,
                 max_values: int = MAX_VALUES) -> Decision:
    """Which of the model inputs ``inputs`` (name -> static shape, None when dynamic; initializers are not
    inputs) must be known values to convert ``nodes``: those that reach a value operand of a node,
    directly or through the nodes computing it (all of whose inputs must be known then, but for the
    inputs only their type is read of: `TYPE_ONLY`). Such an input is specialised on when its shape is
    static and it holds at most ``max_values`` elements; otherwise it is refused."""
    need: dict[str, str] = {}  # name -> the value operand it reaches (the first found)
    for op, ins, _ in nodes:
        for pos, operand in VALUE_OPERANDS.get(op, {}).items():
            if pos < len(ins) and ins[pos]:
                need.setdefault(ins[pos], f"{op}'s {operand}")
    # backwards: a node's consumers come after it, so its outputs' needs are complete when it is reached
    for op, ins, outs in reversed(nodes):
        why = next((need[o] for o in outs if o in need), None)
        if why is None:
            continue
        for pos, name in enumerate(ins):
            if name and pos not in TYPE_ONLY.get(op, ()):
                need.setdefault(name, why)
    specialised, refused = {}, {}
    for name, shape in inputs.items():
        if name not in need:
            continue
        if shape is None:
            refused[name] = f"it feeds {need[name]} and its shape is dynamic"
        elif math.prod(shape) > max_values:
            refused[name] = (f"it feeds {need[name]} and holds {math.prod(shape)} values (at most {max_values} "
                             "are specialised on)")
        else:
            specialised[name] = need[name]
    return Decision(specialised, refused)


V = TypeVar("V")


class Specialisations(Generic[V]):
    """At most ``limit`` compiled specialisations, least recently used evicted first (logged: a model that
    evicts keeps recompiling, the hint to raise the limit). ``build`` runs on a miss; when it raises,
    nothing is kept."""

    def __init__(self, limit: int, *, what: str) -> None:
        if limit < 1:
            raise ValueError(f"a specialisation limit must be positive, got {limit}")
        self.limit = limit
        self.what = what
        self._items: OrderedDict[Hashable, tuple[str, V]] = OrderedDict()
        self.hits = self.misses = self.evictions = 0

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: Hashable, build: Callable[[], V], *, describe: Callable[[], str]) -> V:
        """The specialisation for ``key``, built on a miss; ``describe``: the values, for the log."""
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
            self.hits += 1
            return found[1]
        self.misses += 1
        label = describe()
        value = build()
        self._items[key] = (label, value)
        log.info("%s: compiled for %s (%d of at most %d kept)", self.what, label, len(self._items), self.limit)
        if len(self._items) > self.limit:
            _, (old, _) = self._items.popitem(last=False)
            self.evictions += 1
            log.warning("%s: more than %d distinct values of its shape inputs; evicting the least recently used "
                        "specialisation (%s), which recompiles when it comes back (raise specialisations= to "
                        "keep more)", self.what, self.limit, old)
        return value
