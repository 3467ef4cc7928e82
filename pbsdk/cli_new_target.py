"""``pbsdk new-target NAME --spec FILE [--out DIR] [--force]``: scaffold a target plugin."""

from __future__ import annotations

import argparse
from typing import Any


def _cmd_new_target(args: argparse.Namespace) -> int:
    from pbsdk.targets.template.newtarget import new_target

    done = new_target(args.name, args.spec, args.out, force=args.force, toolchain=args.toolchain)
    print(f"created target '{done.name}' (package {done.package}) in {done.out}:")
    for f in done.files:
        print(f"  {f.relative_to(done.out)}")
    print("next:")
    for cmd in done.next_commands():
        print(f"  {cmd}")
    return 0


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("new-target", help="scaffold a pip-installable target plugin from a chip spec "
                                                 "(works end to end on the template emulation)")
    p.add_argument("name", help="target name: a lower-case identifier, e.g. mynpu")
    p.add_argument("--spec", required=True, help="YAML chip spec file (copied into the plugin)")
    p.add_argument("--out", default=None, help="output directory (default: ./pbsdk-NAME)")
    p.add_argument("--toolchain", choices=("llvm", "c"), default="llvm",
                   help="the chip's toolchain: llvm (kernels JIT-compiled through LLVM) or c (kernels printed as "
                        "portable C calling the chip's intrinsics, compiled by the host's C compiler to emulate)")
    p.add_argument("--force", action="store_true", help="write into an existing, non-empty directory")
    p.set_defaults(func=_cmd_new_target)
