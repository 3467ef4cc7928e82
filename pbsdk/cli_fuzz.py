"""``pbsdk fuzz --count N --seed S``: differential fuzzing of random ops programs against numpy."""

from __future__ import annotations

import argparse
import time
from typing import Any


def _cmd_fuzz(args: argparse.Namespace) -> int:
    from pbsdk import fuzz

    if args.count < 0:
        from pbsdk.core.errors import PbsdkError
        raise PbsdkError(f"--count must be >= 0, got {args.count}")
    if args.show:
        print(fuzz.generate(args.seed))
        return 0
    options = None if args.cache else {"cache": False}
    start = time.perf_counter()
    failures = 0
    unsupported = 0
    ran = 0
    for program, failure in fuzz.fuzz(args.count, args.seed, target=args.target, options=options):
        ran += 1
        if failure is not None and failure.kind == "unsupported":
            unsupported += 1
            if args.verbose:
                print(f"skip seed {program.seed}: {failure.error.splitlines()[0]}")
        elif failure is not None:
            failures += 1
            print(f"FAIL {failure}\n")
        elif args.verbose:
            print(f"ok   seed {program.seed}: {program.n_ops} ops, inputs "
                  f"{[a.shape for a in program.inputs]}")
    skipped = f", refused as unsupported by the spec: {unsupported}" if unsupported else ""
    print(f"programs run: {ran}, failures: {failures}{skipped} (seeds {args.seed}..{args.seed + args.count - 1}, "
          f"{time.perf_counter() - start:.1f} s)")
    return 1 if failures else 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("fuzz", help="compile random small ops programs and compare with numpy")
    p.add_argument("--count", type=int, default=100, help="number of programs (default 100)")
    p.add_argument("--seed", type=int, default=0, help="first seed; program i uses seed+i")
    p.add_argument("--target", default="cpu")
    p.add_argument("--show", action="store_true", help="print the program for --seed and exit")
    p.add_argument("--no-cache", dest="cache", action="store_false", help="bypass the compilation cache")
    p.add_argument("-v", "--verbose", action="store_true", help="a line per passing program too")
    p.set_defaults(func=_cmd_fuzz)
