"""``pbsdk bench``: the kernel benchmark suite (`pbsdk.bench`; also ``benchmarks/suite.py``)."""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_bench(args: argparse.Namespace) -> int:
    from pbsdk.bench import run

    return run(args)  # bad options raise PbsdkError: the CLI prints it and exits 2


def register(subparsers: Any) -> None:
    from pbsdk.bench import add_arguments

    p = subparsers.add_parser("bench", help="kernel benchmarks vs numpy, torch eager and Inductor "
                                            "(results.json, table.md, benchmarks.png)")
    add_arguments(p)
    p.set_defaults(func=_cmd_bench)
