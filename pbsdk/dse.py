"""Design-space exploration: one program on many variants of a chip spec, through the emulation.

``pbsdk dse --spec npu --vary memory.spm.size_bytes=131072,262144 --model gpt2-block`` builds a variant of
the spec for every combination of the varied fields' values, runs the program on each variant's emulation
(`pbsdk.emulation`: the template target's counters priced by `pbsdk.core.plan.chip_time`) and reports the
modelled time, the bytes each memory level served and the matrix units' utilisation per variant, as JSON and
a plot. Variants are independent: they run in parallel processes here (``jobs``) or as Ray tasks
(``engine="ray"``, `pbsdk.engines`), each finished one streamed into the report (``on_row``) so that an
interrupted sweep resumes from it; and ``shard=(i, n)`` runs every n-th variant from the i-th, so that n
machines can share one sweep without a cluster (docs/dse.md).

A field is a dotted path into the spec: ``clock_ghz``, ``peak_tflops.bf16``, ``vector.width_bits``;
list entries by name: ``memory.<level>.<field>``, ``compute.<level>.<field>``,
``compute.<level>.limits.<limit>``, and ``matrix_units.<name>.<field>`` (every unit of that name, e.g. the
bf16, f16 and i8 forms of one unit). Values are YAML scalars (``131072``, ``1.5``, ``true``). Each variant
is validated like a spec file; an invalid one is reported, with the field and the problem, not run.

The planning half (`parse_vary`, `variants`) is pure and tested without MLIR.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import yaml

from pbsdk.core.errors import PbsdkError, SpecError
from pbsdk.core.spec import ChipSpec, load_spec, validate_data

#: Fields of the spec whose list entries are addressed by their ``name``.
_NAMED_LISTS = ("memory", "compute", "matrix_units")


@dataclasses.dataclass(frozen=True)
class Vary:
    """One ``--vary FIELD=V1,V2,...``."""

    field: str
    values: tuple[Any, ...]


def parse_vary(text: str) -> Vary:
    """``FIELD=V1,V2,...`` (values as YAML scalars)."""
    field, sep, values = text.partition("=")
    field = field.strip()
    if not sep or not field or not values.strip():
        raise PbsdkError(f"--vary {text!r}: expected FIELD=V1,V2,... (e.g. memory.spm.size_bytes=131072,262144)")
    parsed = []
    for v in values.split(","):
        try:
            parsed.append(yaml.safe_load(v.strip()))
        except yaml.YAMLError as exc:
            raise PbsdkError(f"--vary {field}: value {v!r} is not a scalar: {exc}") from None
    if len(set(map(repr, parsed))) != len(parsed):
        raise PbsdkError(f"--vary {field}: a value is repeated ({values})")
    return Vary(field, tuple(parsed))


def _set(data: dict[str, Any], field: str, value: Any, spec_name: str) -> None:
    """Set ``field`` (a dotted path, list entries by name) to ``value`` in the spec's ``data``."""
    parts = field.split(".")
    targets: list[Any] = [data]
    i = 0
    while i < len(parts) - 1:
        key = parts[i]
        nxt: list[Any] = []
        for node in targets:
            if not isinstance(node, dict) or key not in node:
                raise SpecError(f"{spec_name}: --vary {field}: no field {'.'.join(parts[:i + 1])!r}",
                                source=spec_name, field=field)
            child = node[key]
            if key in _NAMED_LISTS and isinstance(child, list):
                i += 1
                named = [e for e in child if isinstance(e, dict) and e.get("name") == parts[i]]
                if not named:
                    names = ", ".join(sorted({str(e.get("name")) for e in child if isinstance(e, dict)}))
                    raise SpecError(f"{spec_name}: --vary {field}: no {key} entry named {parts[i]!r} "
                                    f"(there are: {names or 'none'})", source=spec_name, field=field)
                nxt.extend(named)
            else:
                nxt.append(child)
        targets = nxt
        i += 1
    leaf = parts[-1]
    for node in targets:
        if not isinstance(node, dict) or (leaf not in node and not _optional_leaf(parts)):
            raise SpecError(f"{spec_name}: --vary {field}: no field {field!r}", source=spec_name, field=field)
        node[leaf] = value


def _optional_leaf(parts: Sequence[str]) -> bool:
    """Fields a spec may leave out but a variant may set (dict-valued fields and optional scalars)."""
    return (len(parts) >= 2 and parts[-2] in ("peak_tflops", "limits", "codegen")) or \
        parts[-1] in ("clock_ghz", "max_size_bytes", "line_bytes", "banks", "fma_per_cycle", "loads_per_cycle")


@dataclasses.dataclass(frozen=True)
class Variant:
    """One point of the sweep: the varied fields' ``values`` and the resulting ``spec``, or the ``error``
    that made it invalid."""

    index: int
    values: tuple[tuple[str, Any], ...]
    spec: ChipSpec | None
    error: str | None = None


def variants(spec: ChipSpec, vary: Sequence[Vary]) -> list[Variant]:
    """Every combination of the varied values (the first ``--vary`` outermost), each validated."""
    if not vary:
        raise PbsdkError("dse needs at least one --vary FIELD=V1,V2,...")
    fields = [v.field for v in vary]
    if len(set(fields)) != len(fields):
        raise PbsdkError(f"--vary: a field is varied twice ({', '.join(fields)})")
    base = spec.model_dump(mode="json", exclude_none=True)
    out = []
    for index, combo in enumerate(itertools.product(*(v.values for v in vary))):
        data = json.loads(json.dumps(base))
        values = tuple(zip(fields, combo))
        for field, value in values:
            _set(data, field, value, spec.name)  # a path that does not exist is the user's error: raise
        label = ", ".join(f"{f}={v}" for f, v in values)
        try:
            out.append(Variant(index, values, validate_data(data, f"{spec.name} [{label}]")))
        except SpecError as exc:
            out.append(Variant(index, values, None, str(exc)))
    return out


def run_order(sizes: Sequence[int]) -> list[int]:
    """The order in which to start the variants of a grid of ``sizes`` (the fields' value counts, the first
    outermost as in `variants`): every index once, consecutive ones differing in every field where the
    sizes allow. Variants that differ only in a field that prices the run (a bandwidth, a clock) compile to
    the same code, which the compile cache then serves to all but the first; started side by side, each
    would compile it. Started in this order, the variants in flight at once differ in every field, so
    the ones sharing code run apart and the later ones find it cached. The report's order is the index's.

    The field with the most values, ``f``, turns fastest: position ``r``'s digit for ``f`` is
    ``r % sizes[f]``, the other fields' digits ``a[j]`` come from ``r // sizes[f]`` in their order, and
    field ``j`` takes value ``(a[j] + a[f]) % sizes[j]`` (a bijection: ``a[f]`` fixes the rest)."""
    if any(n < 1 for n in sizes):
        raise PbsdkError(f"run_order: every field needs at least one value, got sizes {list(sizes)}")
    if not sizes:
        return [0]
    fast = max(range(len(sizes)), key=lambda j: (sizes[j], j))
    others = [j for j in range(len(sizes)) if j != fast]
    order = []
    for r in range(math.prod(sizes)):
        turn, rest = r % sizes[fast], r // sizes[fast]
        values = [0] * len(sizes)
        values[fast] = turn
        for j in reversed(others):
            values[j] = (rest % sizes[j] + turn) % sizes[j]
            rest //= sizes[j]
        index = 0
        for v, n in zip(values, sizes):
            index = index * n + v
        order.append(index)
    return order


# ----------------------------------------------------------------------------------------- programs

def _gpt2_block(batch: int = 1, seq: int = 128, d: int = 256, heads: int = 4, dtype: str = "f16"
                ) -> tuple[Callable[..., Any], list[tuple[tuple[int, ...], str]]]:
    """A pre-norm GPT-2 block: layernorm, QKV projection, causal attention, output projection, residual,
    layernorm, 4x MLP with GELU, residual. Weights are inputs (random in the run)."""
    from pbsdk import ops

    hd = d // heads

    def block(x: Any, w_qkv: Any, w_o: Any, w_1: Any, w_2: Any, g1: Any, b1: Any, g2: Any, b2: Any) -> Any:
        h = ops.layernorm(x, g1, b1)
        qkv = ops.matmul(h, w_qkv)                                        # (B, S, 3D)
        q, k, v = (ops.transpose(ops.reshape(ops.slice(qkv, 2, i * d, (i + 1) * d), (batch, seq, heads, hd)),
                                 (0, 2, 1, 3)) for i in range(3))
        a = ops.attention(q, k, v, causal=True)                            # (B, H, S, hd)
        a = ops.reshape(ops.transpose(a, (0, 2, 1, 3)), (batch, seq, d))
        x = ops.add(x, ops.matmul(a, w_o))
        h = ops.layernorm(x, g2, b2)
        return ops.add(x, ops.matmul(ops.gelu(ops.matmul(h, w_1)), w_2))

    types = [((batch, seq, d), dtype), ((d, 3 * d), dtype), ((d, d), dtype), ((d, 4 * d), dtype),
             ((4 * d, d), dtype), ((d,), dtype), ((d,), dtype), ((d,), dtype), ((d,), dtype)]
    return block, types


def _resnet_block(batch: int = 1, size: int = 28, channels: int = 64, dtype: str = "f16"
                  ) -> tuple[Callable[..., Any], list[tuple[tuple[int, ...], str]]]:
    """A ResNet basic block in NHWC: two 3x3 convolutions (batch norm folded into a per-channel scale and
    bias), ReLU, and the identity shortcut."""
    from pbsdk import ops

    def block(x: Any, w1: Any, s1: Any, c1: Any, w2: Any, s2: Any, c2: Any) -> Any:
        h = ops.relu(ops.add(ops.mul(ops.conv2d(x, w1, padding=1, layout="NHWC"), s1), c1))
        h = ops.add(ops.mul(ops.conv2d(h, w2, padding=1, layout="NHWC"), s2), c2)
        return ops.relu(ops.add(h, x))

    w = (3, 3, channels, channels)
    c = (channels,)
    types = [((batch, size, size, channels), dtype), (w, dtype), (c, dtype), (c, dtype), (w, dtype), (c, dtype),
             (c, dtype)]
    return block, types


def _matmul(m: int, n: int, k: int, dtype: str = "f16") -> tuple[Callable[..., Any], list[Any]]:
    from pbsdk import ops

    return (lambda a, b: ops.matmul(a, b)), [((m, k), dtype), ((k, n), dtype)]


#: Built-in programs: name -> (builder, one-line description). Builders take keyword overrides.
BUILTIN: dict[str, tuple[Callable[..., tuple[Callable[..., Any], list[Any]]], str]] = {
    "gpt2-block": (_gpt2_block, "pre-norm GPT-2 block, batch 1, seq 128, d 256, 4 heads, f16"),
    "resnet-block": (_resnet_block, "ResNet basic block, NHWC 28x28x64, two 3x3 convs, f16"),
}


def _model_parts(model: str) -> tuple[str, dict[str, Any]]:
    """``name[:key=value,...]`` -> (name, overrides); ``matmul:M,N,K[,dtype]`` is also a built-in."""
    name, _, rest = model.partition(":")
    if name == "matmul":
        fields = [f.strip() for f in rest.split(",") if f.strip()]
        if len(fields) not in (3, 4) or not all(f.isdigit() for f in fields[:3]):
            raise PbsdkError(f"--model {model!r}: expected matmul:M,N,K[,dtype]")
        kw: dict[str, Any] = {"m": int(fields[0]), "n": int(fields[1]), "k": int(fields[2])}
        if len(fields) == 4:
            kw["dtype"] = fields[3]
        return name, kw
    overrides: dict[str, Any] = {}
    for item in filter(None, (s.strip() for s in rest.split(","))):
        key, sep, value = item.partition("=")
        if not sep:
            raise PbsdkError(f"--model {model!r}: expected NAME[:key=value,...]")
        overrides[key] = yaml.safe_load(value)
    return name, overrides


def resolve_model(model: str) -> str:
    """Check ``model`` (a built-in name with overrides, or a ``.mlir`` file) and return it unchanged."""
    if model.endswith(".mlir"):
        if not Path(model).is_file():
            raise PbsdkError(f"--model {model}: no such file")
        return model
    name, _ = _model_parts(model)
    if name != "matmul" and name not in BUILTIN:
        raise PbsdkError(f"--model {model!r}: not a .mlir file nor a built-in "
                         f"({', '.join([*BUILTIN, 'matmul:M,N,K[,dtype]'])})")
    return model


def run_variant(model: str, spec: ChipSpec, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Run ``model`` on ``spec``'s emulation; the `EmulatedRun` as a dict (an ``error`` entry if it
    failed to compile or run)."""
    from pbsdk.emulation import emulate, emulate_mlir

    try:
        if model.endswith(".mlir"):
            return emulate_mlir(Path(model).read_text(), spec=spec, options=options).as_dict()
        name, kw = _model_parts(model)
        build = _matmul if name == "matmul" else BUILTIN[name][0]
        fn, types = build(**kw)
        return emulate(fn, types, spec=spec, options=options).as_dict()
    except Exception as exc:  # noqa: BLE001 -- one variant's failure (a PbsdkError or a bug) is a result of the sweep
        return {"error": f"{type(exc).__name__}: {exc}"}


def _worker(args: tuple[str, dict[str, Any], dict[str, Any] | None]) -> dict[str, Any]:
    model, spec_data, options = args
    return run_variant(model, validate_data(spec_data, "dse variant"), options)


def explore(spec: str | ChipSpec, vary: Sequence[Vary], model: str, *, options: Mapping[str, Any] | None = None,
            jobs: int = 1, shard: tuple[int, int] = (0, 1), engine: str = "local", address: str | None = None,
            resume: Mapping[str, Any] | None = None,
            on_row: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """The sweep: every variant (of this ``shard``) run on ``engine`` (`pbsdk.engines`: ``local`` with
    ``jobs`` processes, or ``ray`` at ``address``); the report as a dict. ``resume``: an earlier
    (partial) report of the same sweep, whose finished variants are kept and not run again. ``on_row``:
    called with the report so far each time a variant finishes (rows in index order)."""
    from pbsdk.engines import run_unordered

    base = load_spec(spec)
    model = resolve_model(model)
    index, count = shard
    if not (count >= 1 and 0 <= index < count):
        raise PbsdkError(f"--shard {index}/{count}: expected I/N with 0 <= I < N")
    todo = [v for v in variants(base, vary) if v.index % count == index]
    head = {"spec": base.name, "model": model, "vary": {x.field: list(x.values) for x in vary}, "shard": [index, count]}
    rows = _resumed(resume, head) if resume is not None else {}
    for v in todo:
        if v.error:
            rows[v.index] = {"index": v.index, "values": dict(v.values), "error": v.error}
    t0 = time.perf_counter()
    opts = dict(options) if options else None
    position = {index: r for r, index in enumerate(run_order([len(x.values) for x in vary]))}
    items = [(v.index, (model, v.spec.model_dump(mode="json", exclude_none=True), opts))
             for v in sorted(todo, key=lambda v: position[v.index]) if v.spec is not None and v.index not in rows]
    values = {v.index: dict(v.values) for v in todo}

    def report() -> dict[str, Any]:
        return {**head, "seconds": time.perf_counter() - t0, "variants": [rows[i] for i in sorted(rows)]}

    for key, result in run_unordered(_worker, items, engine=engine, jobs=jobs, address=address):
        i = cast(int, key)
        rows[i] = {"index": i, "values": values[i], **result}
        if on_row is not None:
            on_row(report())
    return report()


def _resumed(previous: Mapping[str, Any], head: Mapping[str, Any]) -> dict[int, dict[str, Any]]:
    """The finished rows of ``previous``, a report of the same sweep (`PbsdkError` if it is another's);
    a variant that failed to run is run again."""
    if any(previous.get(k) != v for k, v in head.items()):
        raise PbsdkError("--resume: the report is of another sweep (spec, model, varied fields or shard differ)")
    return {int(r["index"]): dict(r) for r in previous.get("variants", []) if "error" not in r}


def merge_reports(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report from the shards' reports of one sweep (same spec, model and fields)."""
    if not reports:
        raise PbsdkError("no reports to merge")
    first = reports[0]
    for r in reports[1:]:
        if (r["spec"], r["model"], r["vary"]) != (first["spec"], first["model"], first["vary"]):
            raise PbsdkError("the reports are of different sweeps (spec, model or varied fields differ)")
    rows = sorted((row for r in reports for row in r["variants"]), key=lambda row: row["index"])
    return {**first, "shard": [0, 1], "seconds": sum(r["seconds"] for r in reports), "variants": rows}


def format_table(report: Mapping[str, Any]) -> str:
    """The sweep as a text table: varied values, modelled time, bound, matrix-unit utilisation, bytes per
    level."""
    fields = list(report["vary"])
    levels = sorted({lv for row in report["variants"] for lv in row.get("bytes_per_level", {})})
    head = fields + ["modelled us", "bound", "mxu busy"] + [f"{lv} MB" for lv in levels]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    for row in report["variants"]:
        vals = [str(row["values"][f]) for f in fields]
        if "error" in row:
            lines.append(" | ".join(vals + [f"error: {row['error'].splitlines()[0][:120]}"]))
            continue
        m = row["modelled"]
        lines.append(" | ".join(vals + [f"{m['seconds'] * 1e6:.2f}", m["bound"], f"{m['matrix_unit_utilisation']:.0%}"]
                                + [f"{row['bytes_per_level'].get(lv, 0) / 1e6:.3f}" for lv in levels]))
    return "\n".join(lines)


def plot(report: Mapping[str, Any], path: str | Path) -> Path:
    """Modelled time, bytes per level and matrix-unit utilisation against the first varied field (one line
    per value of the others), as an image at ``path`` (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fields = list(report["vary"])
    x_field, others = fields[0], fields[1:]
    ok = [r for r in report["variants"] if "error" not in r]
    groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
    for r in ok:
        groups.setdefault(tuple(r["values"][f] for f in others), []).append(r)
    levels = sorted({lv for r in ok for lv in r.get("bytes_per_level", {})})
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for key, rows in groups.items():
        rows.sort(key=lambda r: report["vary"][x_field].index(r["values"][x_field]))
        xs = [str(r["values"][x_field]) for r in rows]
        label = ", ".join(f"{f}={v}" for f, v in zip(others, key)) or None
        axes[0].plot(xs, [r["modelled"]["seconds"] * 1e6 for r in rows], marker="o", label=label)
        for lv in levels:
            axes[1].plot(xs, [r["bytes_per_level"].get(lv, 0) / 1e6 for r in rows], marker="o",
                         label=f"{lv}{' (' + label + ')' if label else ''}")
        axes[2].plot(xs, [100 * r["modelled"]["matrix_unit_utilisation"] for r in rows], marker="o", label=label)
    for ax, title, unit in zip(axes, ("modelled time", "bytes served per level", "matrix units busy"),
                               ("us", "MB", "%")):
        ax.set_title(title)
        ax.set_xlabel(x_field)
        ax.set_ylabel(unit)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.suptitle(f"{report['model']} on {report['spec']} variants")
    fig.tight_layout()
    out = Path(path)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out
