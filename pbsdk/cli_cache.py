"""``pbsdk cache info|prune|clear``: inspect, bound or empty the on-disk compilation cache."""

from __future__ import annotations

import argparse
import json
from typing import Any


def _cmd_cache(args: argparse.Namespace) -> int:
    from pbsdk.core.runtime.cache import CompileCache, cache_dir, get_cache, parse_size

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
            print(f"weights  {info['weights']} ({info['weight_bytes']} bytes, each stored once for all entries)")
            print(f"bytes    {info['bytes']} of at most {info['max_bytes']} ({_human(info['bytes'])} of "
                  f"{_human(info['max_bytes'])}; PBSDK_CACHE_MAX_BYTES)")
        return 0
    if args.cache_cmd == "prune":
        try:
            limit = None if args.max_bytes is None else parse_size(args.max_bytes)
        except ValueError:
            print(f"pbsdk cache prune: --max-bytes {args.max_bytes!r} is not a positive byte count (e.g. 512M, 4G)")
            return 2
        removed, freed = cache.prune(limit)
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} and object files, {freed} bytes "
              f"({_human(freed)}) from {cache.dir}; {cache.usage()} bytes remain")
        return 0
    if args.cache_cmd == "clear":
        removed = cache.clear()
        print(f"removed {removed} entr{'y' if removed == 1 else 'ies'} from {cache.dir}")
        return 0
    raise AssertionError(args.cache_cmd)


def _human(n: int) -> str:
    size, unit = float(n), "B"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            break
        size /= 1024
    return f"{n} B" if unit == "B" else f"{size:.1f} {unit}"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser("cache", help="the on-disk compilation cache: info, prune, clear")
    csub = p.add_subparsers(dest="cache_cmd", required=True)
    i = csub.add_parser("info", help="where the cache is, how many entries and bytes, its cap")
    i.add_argument("--json", action="store_true", help="print one JSON object")
    pr = csub.add_parser("prune", help="remove the least recently used entries down to the cap")
    pr.add_argument("--max-bytes", default=None,
                    help="the size to prune down to (bytes, or 512M, 4G; default: the cap, PBSDK_CACHE_MAX_BYTES)")
    csub.add_parser("clear", help="remove every cached artifact")
    p.set_defaults(func=_cmd_cache)
