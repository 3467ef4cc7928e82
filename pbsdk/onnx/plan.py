"""How an imported ONNX graph runs: compiled segments between the nodes left to the reference evaluator.

Pure analysis (no ONNX protos, no IR): nodes are given as their input and output names, in topological
order. Without fallback nodes the plan is one compiled segment.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence


@dataclasses.dataclass(frozen=True)
class Step:
    """Nodes run together: ``compiled`` (one pbsdk kernel) or ``reference`` (one node through
    ``onnx.reference``). ``inputs``: the names it reads from earlier steps or the graph's inputs;
    ``outputs``: the names it makes that later steps or the graph's outputs read."""

    kind: str
    nodes: tuple[int, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    steps: tuple[Step, ...]

    @property
    def compiled(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind == "compiled")

    @property
    def reference(self) -> tuple[Step, ...]:
        return tuple(s for s in self.steps if s.kind == "reference")


def plan_steps(nodes: Sequence[tuple[Sequence[str], Sequence[str]]], fallback: Collection[int],
               known: Collection[str], outputs: Sequence[str]) -> Plan:
    """Split ``nodes`` (each ``(inputs, outputs)``, topologically ordered) into steps: every node in
    ``fallback`` alone as a reference step, maximal runs of the others as compiled steps. Names in
    ``known`` (initializers, folded values) are not passed between steps; the empty name (an omitted
    optional input) is never a step input."""
    groups: list[tuple[str, list[int]]] = []
    for i in range(len(nodes)):
        kind = "reference" if i in fallback else "compiled"
        if groups and kind == "compiled" and groups[-1][0] == "compiled":
            groups[-1][1].append(i)
        else:
            groups.append((kind, [i]))
    steps = []
    for g, (kind, members) in enumerate(groups):
        made = {o for i in members for o in nodes[i][1] if o}
        needed: list[str] = []
        for i in members:
            for name in nodes[i][0]:
                if name and name not in made and name not in known and name not in needed:
                    needed.append(name)
        later = {n for kind2, m2 in groups[g + 1:] for i in m2 for n in nodes[i][0]} | set(outputs)
        produced = [o for i in members for o in nodes[i][1] if o and o in later and o not in known]
        steps.append(Step(kind, tuple(members), tuple(needed), tuple(produced)))
    return Plan(tuple(steps))
