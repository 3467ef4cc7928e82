"""Splitting a kernel's LLVM IR into parts that LLVM optimises and compiles at the same time.

LLVM's O3 pipeline and back end are most of a large model's cold compile (ResNet-50: ≈8 s of ≈14 s,
one thread), and they work function by function. A kernel's LLVM IR (the module the cpu target
translates, plus the fork glue) is cut into ``n`` parts of about equal size, each a complete module: its
own functions, the private constants they use, every declaration, and ``declare`` lines for the
functions of other parts it calls. Each part becomes one object file; MCJIT links them (its dynamic
linker resolves calls between loaded objects).

What must stay together (one *group*, never cut):
- a function and a callee LLVM might inline: one that is neither ``noinline`` nor larger than
  `INLINE_BYTES` of text (beyond that the O3 inliner's threshold rules inlining out) — so splitting
  cannot change what is inlined;
- a function and a callee with local linkage (``internal``/``private``), which another object cannot see;
- the functions using one global that is not a private constant (a duplicated copy would be a second
  symbol or a second, diverging variable). Private constants are copied into every part using them.

`scan` reads the texts (the analysis, no LLVM needed); `plan_parts` is the pure planner over what it
found; `part_texts` writes one part's module. Anything `scan` does not recognise makes it return None,
and the kernel is compiled as one module, as before.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Sequence

#: A callee larger than this (characters of LLVM IR text, ≈ 60 per instruction) is never inlined at O3.
INLINE_BYTES = 24_000
#: Kernels with less function text than this are compiled as one module (a worker costs ≈0.3 s).
SPLIT_MIN_BYTES = 400_000

_NAME = r"[-a-zA-Z$._][-a-zA-Z$._0-9]*"
_DEFINE = re.compile(rf"define\s+(.*?)@({_NAME})\(")
_GLOBAL = re.compile(rf"@({_NAME})\s*=\s*(.*)")
_REF = re.compile(rf"@({_NAME})")
_LOCAL = ("private", "internal")


@dataclasses.dataclass(frozen=True)
class Definition:
    """One ``define`` of one text."""

    name: str
    text: int                       # which of the texts
    start: int                      # character span of the definition (header line to closing brace)
    end: int
    header: str                     # its first line
    local: bool                     # internal/private linkage
    noinline: bool
    refs: frozenset[str]            # the @names its body mentions

    @property
    def size(self) -> int:
        return self.end - self.start


@dataclasses.dataclass(frozen=True)
class Global:
    """One global variable or constant (one line) of one text."""

    name: str
    text: int
    line: str
    shareable: bool                 # a private/internal constant: copied into every part that uses it


@dataclasses.dataclass(frozen=True)
class ModuleScan:
    """What `scan` found: every definition and global, and each text's other lines (declarations,
    attribute groups, metadata, the triple), which every part keeps."""

    definitions: tuple[Definition, ...]
    globals: tuple[Global, ...]
    rest: tuple[str, ...]           # per text: its lines that are neither definitions nor globals

    @property
    def size(self) -> int:
        return sum(d.size for d in self.definitions)


def scan(texts: Sequence[str]) -> ModuleScan | None:
    """The definitions and globals of LLVM IR ``texts`` as the cpu target writes them (a definition
    from a line starting ``define`` to a line ``}``, a global on one line), or None where a text has
    something else at the top level that this does not understand."""
    definitions: list[Definition] = []
    globals_: list[Global] = []
    rest: list[str] = []
    for index, text in enumerate(texts):
        groups: dict[int, str] = {}
        for m in re.finditer(r"^attributes #(\d+) = \{(.*)\}$", text, re.MULTILINE):
            groups[int(m.group(1))] = m.group(2)
        others: list[str] = []
        pos = 0
        while pos < len(text):
            eol = text.find("\n", pos)
            eol = len(text) if eol < 0 else eol
            line = text[pos:eol]
            if line.startswith("define "):
                close = text.find("\n}", eol)
                if close < 0:
                    return None
                end = close + 2
                header = _DEFINE.match(line)
                if header is None:
                    return None
                prefix = header.group(1).split()
                after = line[line.rfind(")"):]
                attrs = " ".join(groups.get(int(g), "") for g in re.findall(r"#(\d+)", after))
                definitions.append(Definition(
                    name=header.group(2), text=index, start=pos, end=end, header=line,
                    local=any(p in _LOCAL for p in prefix),
                    noinline="noinline" in after.split() or "noinline" in attrs.split(),
                    refs=frozenset(_REF.findall(text, eol, end))))
                pos = end + 1
                continue
            if line.startswith("@"):
                var = _GLOBAL.match(line)
                if var is None:
                    return None
                words = var.group(2).split()
                kind = next((w for w in words if w in ("global", "constant")), None)
                if kind is None:
                    return None  # an alias or ifunc
                if set(_REF.findall(line)) != {var.group(1)}:
                    return None  # an initializer naming other symbols
                shareable = kind == "constant" and any(w in _LOCAL for w in words)
                globals_.append(Global(var.group(1), index, line, shareable))
            elif line.startswith(("$", "module asm", "uselistorder")):
                return None  # comdats, inline assembly, use-list orders: not worth splitting around
            elif "@" in line and not line.startswith(("declare ", ";")):
                return None  # metadata or another top-level line naming a symbol: every part would keep it
            else:
                others.append(line)
            pos = eol + 1
        rest.append("\n".join(others))
    names = [d.name for d in definitions] + [g.name for g in globals_]
    if len(set(names)) != len(names):
        return None  # the same name defined in two texts: leave it to the linker of one module
    return ModuleScan(tuple(definitions), tuple(globals_), tuple(rest))


def plan_parts(found: ModuleScan, n: int, *, inline_bytes: int = INLINE_BYTES) -> tuple[frozenset[str], ...]:
    """The definitions' names in ``n`` parts (fewer if there are fewer groups), of about equal text size:
    the groups (see the module's docstring), largest first, each to the smallest part so far."""
    parent = {d.name: d.name for d in found.definitions}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    def union(a: str, b: str) -> None:
        parent[root(a)] = root(b)

    by_name = {d.name: d for d in found.definitions}
    users: dict[str, list[str]] = {}
    unshareable = {g.name for g in found.globals if not g.shareable}
    for d in found.definitions:
        for ref in d.refs:
            callee = by_name.get(ref)
            if callee is not None and (callee.local or (not callee.noinline and callee.size <= inline_bytes)):
                union(d.name, ref)
            if ref in unshareable:
                users.setdefault(ref, []).append(d.name)
    for names in users.values():
        for other in names[1:]:
            union(names[0], other)
    sizes: dict[str, int] = {}
    members: dict[str, list[str]] = {}
    for d in found.definitions:
        r = root(d.name)
        sizes[r] = sizes.get(r, 0) + d.size
        members.setdefault(r, []).append(d.name)
    parts: list[list[str]] = [[] for _ in range(max(1, min(n, len(members))))]
    loads = [0] * len(parts)
    for r in sorted(members, key=lambda r: (-sizes[r], r)):
        i = loads.index(min(loads))
        parts[i].extend(members[r])
        loads[i] += sizes[r]
    return tuple(frozenset(p) for p in parts if p)


def external_functions(found: ModuleScan) -> list[str]:
    """The functions the texts declare and none of them defines (the process must provide them)."""
    defined = {d.name for d in found.definitions}
    names = re.findall(rf"^declare [^@]*@({_NAME})\(", "\n".join(found.rest), re.MULTILINE)
    return sorted(set(names) - defined)


def _declaration(header: str) -> str:
    """A definition's first line as a declaration of the same function (an external one: functions with
    local linkage never cross parts)."""
    return "declare " + header[len("define "):].rstrip().removesuffix("{").rstrip()


def part_texts(texts: Sequence[str], found: ModuleScan, part: frozenset[str], *, first: bool) -> list[str]:
    """The texts of one part, to be linked into one module (texts without any of its definitions left out,
    the first kept). A global that is not a private constant goes to the part using it (one part: see
    `plan_parts`), or to the ``first`` part when no function uses it."""
    unused = {g.name for g in found.globals} - set().union(*(d.refs for d in found.definitions))
    out: list[str] = []
    for index, text in enumerate(texts):
        mine = [d for d in found.definitions if d.text == index and d.name in part]
        if not mine and index > 0:
            continue
        used = set().union(*(d.refs for d in mine)) if mine else set()
        lines = [found.rest[index]]
        lines += [g.line for g in found.globals
                  if g.text == index and (g.name in used or (first and not g.shareable and g.name in unused))]
        lines += [_declaration(d.header) for d in found.definitions
                  if d.text == index and d.name not in part and d.name in used]
        lines += [text[d.start:d.end] for d in mine]
        out.append("\n".join(lines) + "\n")
    return out
