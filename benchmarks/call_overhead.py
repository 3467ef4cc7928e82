"""Per-call cost of a compiled graph (issue #32): a one-op graph through pbsdk, Inductor and eager torch.

``x * 2 + 1`` on 8 floats does almost no work, so a call's time is the cost of getting into and out of the
compiled code. Two figures per contender, measured in one process:

- ``compiled fn``: the callable the Dynamo backend returned, called directly with the graph's inputs —
  torch tensors in, torch tensors out, Dynamo's guards aside (what the backend itself costs);
- ``torch.compile``: the user's call through ``torch.compile`` (guards, frame evaluation, then the above).

Eager is the same function uncompiled. Contenders run in interleaved blocks of calls; each round keeps a
block's mean per call, the report the median over rounds and its min-max. Run on a quiet machine::

    .venv/bin/python benchmarks/call_overhead.py --json benchmarks/results/call_overhead.json \\
        --md benchmarks/results/call_overhead.md
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pbsdk.bench import cpu_model


def _graph(x: Any) -> Any:
    return x * 2 + 1


def _captured(backend: Callable[..., Any], into: dict[str, Any], name: str) -> Callable[..., Any]:
    """A Dynamo backend that records the callable ``backend`` returns for the graph."""

    def capture(gm: Any, example_inputs: Any) -> Any:
        into[name] = backend(gm, example_inputs)
        return into[name]

    return capture


def contenders(size: int) -> tuple[dict[str, Callable[[], Any]], Any]:
    """The calls to time (each a closure over its input) and the input."""
    import torch

    from pbsdk.frontends.torch.dynamo_backend import backend as pbsdk_backend

    torch._dynamo.reset()
    x = torch.randn(size)
    compiled: dict[str, Any] = {}
    whole = {"pbsdk": torch.compile(_graph, backend=_captured(pbsdk_backend, compiled, "pbsdk")),
             "inductor": torch.compile(_graph, backend=_captured(torch._dynamo.lookup_backend("inductor"),
                                                                 compiled, "inductor"))}
    want = _graph(x)
    for name, f in whole.items():
        torch.testing.assert_close(f(x), want)
        torch.testing.assert_close(_call(compiled[name], x), want)
    calls: dict[str, Callable[[], Any]] = {"eager": lambda: _graph(x)}
    for name in whole:
        fn, f = compiled[name], whole[name]
        calls[f"{name} compiled fn"] = lambda fn=fn: _call(fn, x)
        calls[f"{name} torch.compile"] = lambda f=f: f(x)
    return calls, x


def _call(fn: Any, x: Any) -> Any:
    """The backend's callable as Dynamo calls it: the graph's inputs as positional arguments (a graph of
    one output gives a one-element tuple or list)."""
    out = fn(x)
    return out[0] if isinstance(out, (tuple, list)) else out


def measure(size: int, rounds: int, calls: int) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    fns, _ = contenders(size)
    per: dict[str, list[float]] = {n: [] for n in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            per[name].append((time.perf_counter() - t0) / calls * 1e6)
    return {"cpu": cpu_model(), "size": size, "rounds": rounds, "calls_per_block": calls, "torch": torch.__version__,
            "us": {n: {"median": statistics.median(v), "min": min(v), "max": max(v)} for n, v in per.items()}}


def table(result: dict[str, Any]) -> str:
    lines = [f"CPU: {result['cpu']}. `x * 2 + 1` on {result['size']} floats, 1 thread, torch {result['torch']}; "
             f"median of {result['rounds']} rounds of {result['calls_per_block']} calls per contender "
             "(interleaved), min-max over rounds.", "",
             "| contender | us per call (min-max) |", "|---|---|"]
    for name, v in result["us"].items():
        lines.append(f"| {name} | {v['median']:.2f} ({v['min']:.2f}-{v['max']:.2f}) |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--json", help="write the result here (JSON)")
    parser.add_argument("--md", help="write the markdown table here")
    args = parser.parse_args()
    result = measure(args.size, args.rounds, args.calls)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1) + "\n")
    text = table(result)
    if args.md:
        Path(args.md).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
