"""`pbsdk.targets.cpu.split_llvm`: what may be cut apart, and the parts' texts (no LLVM needed)."""

from __future__ import annotations

from pbsdk.targets.cpu.split_llvm import external_functions, part_texts, plan_parts, scan

BIG = "  %x = fadd float 1.0, 2.0\n" * 2000  # ≈ 50 KB: above INLINE_BYTES


def _fn(name: str, body: str = "", *, header: str = "define void", attrs: str = "") -> str:
    return f"{header} @{name}(ptr %0){attrs} {{\n{body}  ret void\n}}\n"


TEXT = (
    "; ModuleID = 'LLVMDialectModule'\n"
    "source_filename = \"LLVMDialectModule\"\n"
    "@table = private constant [2 x float] [float 1.0, float 2.0]\n"
    "@state = internal global i64 0\n"
    "@unused = global i64 7\n"
    "declare ptr @malloc(i64)\n"
    + _fn("entry", "  call void @big_a(ptr %0)\n  call void @big_b(ptr %0)\n  call void @helper(ptr %0)\n"
                   "  call void @nest(ptr %0)\n")
    + _fn("big_a", BIG + "  %t = load float, ptr @table\n  call void @local(ptr %0)\n")
    + _fn("big_b", BIG + "  %s = load i64, ptr @state\n  %t = load float, ptr @table\n")
    + _fn("helper", "  %s = load i64, ptr @state\n")
    + _fn("local", "", header="define internal void")
    + _fn("nest", BIG, attrs=" #0")
    + "attributes #0 = { noinline }\n"
)
GLUE = ("declare void @big_a(ptr)\n"
        + _fn("fork_body", "  call void @big_a(ptr %0)\n", header="define internal void")
        + _fn("fork", "  call void @GOMP_parallel(ptr @fork_body, ptr %0, i32 2, i32 0)\n")
        + "declare void @GOMP_parallel(ptr, ptr, i32, i32)\n")


def test_scan_finds_definitions_globals_and_linkage() -> None:
    found = scan([TEXT, GLUE])
    assert found is not None
    by = {d.name: d for d in found.definitions}
    assert set(by) == {"entry", "big_a", "big_b", "helper", "local", "nest", "fork_body", "fork"}
    assert by["local"].local and by["fork_body"].local and not by["big_a"].local
    assert by["nest"].noinline and not by["big_a"].noinline
    assert by["big_a"].refs == {"table", "local"} and by["fork"].text == 1
    shareable = {g.name: g.shareable for g in found.globals}
    assert shareable == {"table": True, "state": False, "unused": False}
    assert external_functions(found) == ["GOMP_parallel", "malloc"]  # big_a is declared, and defined


def test_what_stays_together() -> None:
    found = scan([TEXT, GLUE])
    assert found is not None
    parts = plan_parts(found, 8)
    where = {name: i for i, p in enumerate(parts) for name in p}
    assert where["entry"] == where["helper"]              # a small callee stays with its caller
    assert where["big_a"] == where["local"]               # a local callee too, however small or large
    assert where["fork"] == where["fork_body"]            # a function pointer to a local is a reference
    assert where["big_b"] == where["helper"]              # both use the mutable @state
    assert where["nest"] != where["entry"] and where["big_a"] != where["entry"]  # noinline / too large
    assert sorted(n for p in parts for n in p) == sorted(d.name for d in found.definitions)
    assert plan_parts(found, 1) == (frozenset(d.name for d in found.definitions),)


def test_a_part_declares_what_it_calls_elsewhere_and_copies_private_constants() -> None:
    found = scan([TEXT, GLUE])
    assert found is not None
    parts = plan_parts(found, 8)
    texts = {name: (i, part_texts([TEXT, GLUE], found, p, first=i == 0)) for i, p in enumerate(parts) for name in p}
    _, entry_texts = texts["entry"]
    joined = "".join(entry_texts)
    assert "declare void @big_a(ptr %0)" in joined and "declare void @nest(ptr %0)" in joined
    assert "define void @big_a(" not in joined
    _, a_texts = texts["big_a"]
    assert "define internal void @local(" in a_texts[0]
    # the private constant is copied into each part using it (big_a's, and entry's through big_b), only
    assert "@table = private constant" in a_texts[0] and "@table = private constant" in joined
    assert "@table" not in "".join(texts["nest"][1])
    # the mutable global is defined once, where it is used; the unused one in the first part only
    all_texts = ["".join(part_texts([TEXT, GLUE], found, p, first=k == 0)) for k, p in enumerate(parts)]
    assert sum(t.count("@state = internal global") for t in all_texts) == 1
    assert sum(t.count("@unused = global") for t in all_texts) == 1 and "@unused = global" in all_texts[0]


def test_what_scan_does_not_understand_is_not_split() -> None:
    assert scan(["@a = alias i32, ptr @b\n"]) is None
    assert scan(["$c = comdat any\n"]) is None
    assert scan(["@p = global ptr @q\n"]) is None  # an initializer naming another symbol
    assert scan([_fn("f"), _fn("f")]) is None      # one name defined twice
