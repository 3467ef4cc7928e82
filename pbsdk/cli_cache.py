"""``pbsdk cache info|clear``: inspect or empty the on-disk compilation cache."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _cmd_cache(args: argparse.Namespace) -> int:
    from pbsdk.core.runtime.cache import CompileCache, cache_dir, get_cache

    cache = get_cache()
    enabled = cache is not None
    if cache is None:  # disabled for compilations, but still inspectable and clearable
        cache = CompileCache(cache_dir())
    if args.cache_cmd == "info":
        info: dict[str, Any] = {**cache.info(), "enabled": enabled}
        if args.json:
            print(json.dumps(info))
        else:
            print(f"dir      {info['dir']}")
            print(f"enabled  {'yes' if enabled else 'no (PBSDK_CACHE=0 or PBSDK_DISABLE_CACHE=1)'}")
            print(f"entries  {info['entries']}")
            print(f"objects  {info['objects']} (host JIT machine code)")
            print(f"bytes    {info['bytes']}")
        return 0
    if args.cache_cmd == "clear":
        removed = cache.clear()
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {cache.dir}")
        return 0
    raise AssertionError(args.cache_cmd)


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("cache", help="the on-disk compilation cache: info, clear")
    csub = p.add_subparsers(dest="cache_cmd", required=True)
    i = csub.add_parser("info", help="where the cache is, how many entries and bytes")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    csub.add_parser("clear", help="remove every cached artifact")
    p.set_defaults(func=_cmd_cache)
