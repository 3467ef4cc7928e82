"""The ``pbsdk`` command line.

Every deliberate failure is a `PbsdkError`: printed as ``pbsdk: error: ...`` on stderr with exit code 2,
never a traceback. Anything else is a bug in pbsdk: exit 3 with a one-line summary (``PBSDK_DEBUG=1``
shows the traceback).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pbsdk.core.errors import PbsdkError


def _cmd_targets(args: argparse.Namespace) -> int:
    from pbsdk.core.target import discover

    infos = discover()
    width = max([len(i.name) for i in infos] + [4])
    for info in infos:
        if info.cls is None:
            print(f"{info.name:<{width}}  BROKEN   {info.error}  [{info.value}]")
            continue
        status = "ready" if info.cls.implemented else "planned"
        print(f"{info.name:<{width}}  {status:<8} spec={info.cls.default_spec:<14} {info.cls.description}")
    broken = [i for i in infos if i.cls is None]
    if broken and args.strict:
        return 1
    return 0


def _field_value(data: Any, path: str) -> Any:
    """The value at a provenance path (``memory.l2.bandwidth_gbps``: list entries by their ``name``)."""
    for part in path.split("."):
        data = next((d for d in data if d.get("name") == part), None) if isinstance(data, list) else data.get(part)
    return data


def _cmd_spec(args: argparse.Namespace) -> int:
    from pbsdk.core import spec as specs

    if args.spec_cmd == "validate":
        for path in args.files:
            chip = specs.load_spec(Path(path))
            print(f"{path}: ok ({chip.name}: {chip.kind}, {len(chip.compute)} compute levels, "
                  f"{len(chip.memory)} memory levels, {len(chip.matrix_units)} matrix units)")
        return 0
    if args.spec_cmd == "show":
        chip = specs.load_spec(args.name)
        data = chip.model_dump(mode="json")
        if args.format == "json":
            print(json.dumps(data, indent=2))
        else:
            import yaml
            print(yaml.safe_dump(data, sort_keys=False), end="")
        return 0
    if args.spec_cmd == "schema":
        print(json.dumps(specs.spec_json_schema(), indent=2))
        return 0
    if args.spec_cmd == "calibrate":
        from pbsdk.core.spec.host import recalibrate

        chip = recalibrate()
        measured = {k: v for k, v in chip.provenance.items() if v.startswith("measured")}
        if not measured:
            raise PbsdkError("host calibration failed or is off (PBSDK_CALIBRATE=0); the host spec keeps its "
                             "estimates (run with --log-level info for why)")
        print(f"host: {chip.description}")
        for field, how in measured.items():
            print(f"  {field} = {_field_value(chip.model_dump(mode='json'), field)}  [{how}]")
        return 0
    if args.spec_cmd == "list":
        for name, path in sorted(specs.list_presets().items()):
            print(f"{name:<22} {path}")
        print(f"{'host':<22} (detected from this machine)")
        return 0
    raise AssertionError(args.spec_cmd)


def _read_mlir(path: str) -> str:
    """The text of an MLIR file (``-``: standard input); a `PbsdkError` saying why it cannot be read."""
    try:
        return Path(path).read_text() if path != "-" else sys.stdin.read()
    except OSError as exc:
        raise PbsdkError(f"cannot read {path}: {exc.strerror}") from None
    except UnicodeDecodeError as exc:
        raise PbsdkError(f"{path} is not UTF-8 text (byte {exc.start}): MLIR files are text") from None


def _cmd_compile(args: argparse.Namespace) -> int:
    from pbsdk.core.compiler import compile_text, pipeline_for, resolve

    options = _parse_options(args.options)
    if args.entry:
        options["entry"] = args.entry
    from pbsdk import cli_deploy

    if cli_deploy.exports(args):
        return cli_deploy.export_onnx(args, options)
    if args.file.endswith(".onnx") and not args.list_stages:
        from pbsdk.cli_onnx import compile_onnx

        return compile_onnx(args, options)
    request = resolve(args.target, args.spec, options)  # the target parses them: an unknown key is an error
    if args.list_stages:
        for stage in pipeline_for(request).stages:
            print(f"{stage.name:<14} {stage.description}")
        return 0
    text = _read_mlir(args.file)
    result = compile_text(text, request, stop_after=args.emit)
    payload = getattr(result, "payload", result)
    out = payload if isinstance(payload, (str, bytes)) else str(payload)
    if args.output:
        Path(args.output).write_bytes(out if isinstance(out, bytes) else out.encode())
    elif isinstance(out, bytes):
        sys.stdout.buffer.write(out)
    else:
        print(out, end="" if out.endswith("\n") else "\n")
    return 0


def _parse_options(items: Sequence[str] | None) -> dict[str, Any]:
    """Compile options from ``--options``: JSON objects and/or ``key=value`` items (a value is read as JSON
    where it parses — ``pack=false``, ``threads=2``, ``tiles={"spm": [64, 64, 64]}`` — else as a string);
    later items win, ``-`` in keys becomes ``_``."""
    options: dict[str, Any] = {}
    for item in items or ():
        if item.lstrip().startswith("{"):
            try:
                value = json.loads(item)
            except json.JSONDecodeError as exc:
                raise PbsdkError(f"--options {item!r} is not valid JSON: {exc.msg} at character {exc.pos + 1}") \
                    from None
            if not isinstance(value, dict):
                raise PbsdkError(f"--options {item!r} must be a JSON object")
            options.update({str(k).replace("-", "_"): v for k, v in value.items()})
            continue
        key, eq, text = item.partition("=")
        if not eq or not key.strip():
            raise PbsdkError(f"--options {item!r}: expected KEY=VALUE or a JSON object")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        options[key.strip().replace("-", "_")] = value
    return options


def _split_input(text: str) -> list[str]:
    """The chunks of an input split at ``// -----`` lines (mlir-opt's ``--split-input-file``)."""
    chunks: list[str] = []
    current: list[str] = []
    for line in text.splitlines(keepends=True):
        if line.strip() == "// -----":
            chunks.append("".join(current))
            current = []
        else:
            current.append(line)
    chunks.append("".join(current))
    return chunks


def _cmd_opt(args: argparse.Namespace) -> int:
    from mlir import ir

    from pbsdk.core.errors import CompileError
    from pbsdk.core.passes.registry import (
        context_for,
        describe_passes,
        resolve_pass,
        run_passes,
        split_pipeline,
    )

    raw = _parse_options(args.options)
    target_stages: Sequence[Any] = ()
    if args.target:
        from pbsdk.core.compiler import pipeline_for, resolve

        request = resolve(args.target, args.spec, raw)  # the target's options type parses them
        spec, options = request.spec, request.options
        target_stages = pipeline_for(request).stages
    else:
        from pbsdk.core.errors import OptionsError
        from pbsdk.core.options import Options, known_keys, parse_options
        from pbsdk.core.spec import load_spec
        from pbsdk.core.target import options_elsewhere

        try:
            options = parse_options(raw)
        except OptionsError as err:  # a target's own option: name the target, for --target
            hint = options_elsewhere([k for k in raw if k not in known_keys(Options)])
            if not hint:
                raise
            raise OptionsError(f"{err} ({hint}: give --target)") from None
        spec = load_spec(args.spec or "host")
    if args.list_passes:
        for name, description in describe_passes():
            print(f"{name:<22} {description}")
        own = [s for s in target_stages if s.name not in dict(describe_passes())]
        for stage in own:
            print(f"{stage.name:<22} [{args.target}] {stage.description}")
        return 0
    if args.file is None:
        raise PbsdkError("opt needs an input .mlir file ('-' for stdin)")
    stages = [resolve_pass(element, target_stages=target_stages, target=args.target)
              for group in args.passes or () for element in split_pipeline(group)]
    text = _read_mlir(args.file)
    chunks = _split_input(text) if args.split_input_file else [text]
    failed = False
    for index, chunk in enumerate(chunks):
        if index:
            print("// -----")
        try:
            try:
                module = ir.Module.parse(chunk, ir.Context())
            except Exception as exc:  # noqa: BLE001 - the bindings raise plain Exception
                raise CompileError(f"cannot parse the input MLIR: {str(exc).strip()}", stage="parse") from None
            result = run_passes(module, stages, context_for(module, spec, options))
        except PbsdkError as err:
            if len(chunks) == 1:
                raise
            sys.stdout.flush()
            print(f"pbsdk: error: {err}", file=sys.stderr)
            sys.stderr.flush()
            failed = True
            continue
        payload = getattr(result, "payload", result)
        out = payload if isinstance(payload, (str, bytes)) else str(payload)
        if isinstance(out, bytes):
            sys.stdout.flush()
            sys.stdout.buffer.write(out)
        else:
            print(out, end="" if out.endswith("\n") else "\n")
    return 2 if failed else 0


def _size_or_dynamic(text: str) -> str:
    """An argparse type: a positive size, or ``?`` (a dynamic one)."""
    if text == "?" or (text.isdigit() and int(text) > 0):
        return text
    raise argparse.ArgumentTypeError(f"expected a positive size or '?', got {text!r}")


def _contractions_in_mlir(text: str) -> list[tuple[str, Any]]:
    """(title, Contraction) for each named matmul-like op of an MLIR module."""
    from mlir import ir

    from pbsdk.core.errors import CompileError
    from pbsdk.core.plan import Contraction

    found: list[tuple[str, Any]] = []
    with ir.Context():
        try:
            module = ir.Module.parse(text)
        except Exception as exc:  # noqa: BLE001 - the bindings raise plain Exception
            raise CompileError(f"cannot parse the input MLIR: {str(exc).strip()}", stage="parse") from None

        def visit(op: ir.Operation) -> ir.WalkResult:
            if op.name in ("linalg.matmul", "linalg.batch_matmul"):
                a, _ = (ir.ShapedType(v.type) for v in list(op.operands)[:2])
                out = ir.ShapedType(list(op.operands)[2].type)
                batch = a.shape[0] if op.name == "linalg.batch_matmul" else 1
                if out.shape[-2] == ir.ShapedType.get_dynamic_size():  # a dynamic row count: its buckets
                    found.append((f"{op.name} {out}", ("dynamic", out.shape[-1], a.shape[-1], batch,
                                                       str(a.element_type))))
                else:
                    found.append((f"{op.name} {out}", Contraction(out.shape[-2], out.shape[-1], a.shape[-1], batch,
                                                                   str(a.element_type), str(out.element_type))))
            return ir.WalkResult.ADVANCE

        module.operation.walk(visit)
    return found


def _cmd_explain(args: argparse.Namespace) -> int:
    from pbsdk.core.plan import Contraction, format_plan, plan_contraction
    from pbsdk.core.spec import load_spec

    if args.file and args.file.endswith(".onnx"):  # the model compiled for cpu: symbols, kernels, plans
        from pbsdk.cli_onnx import explain_onnx

        return explain_onnx(args)
    spec = load_spec(args.spec or "host")
    options = {"matmul_precision": args.precision}
    if args.attention:
        from pbsdk.core.plan.attention import Attention, format_attention_plan, plan_attention

        b, sq, sk, d = args.attention
        attn = Attention(b, sq, sk, d, d, args.dtype, causal_offset=0 if args.causal else None)
        print(f"spec {spec.name}")
        print(format_attention_plan(f"attention {b}x{sq}x{sk}x{d}", plan_attention(spec, attn, options)))
        if args.modelled:
            from pbsdk import ops as pops

            types = [((b, sq, d), args.dtype), ((b, sk, d), args.dtype), ((b, sk, d), args.dtype)]
            _print_modelled(lambda q, k, v: pops.attention(q, k, v, causal=args.causal), types, spec, options)
        return 0
    if args.matmul and "?" in args.matmul[1:]:
        raise PbsdkError("explain --matmul: only M (the row count) may be '?'")
    if args.matmul and args.matmul[0] == "?":
        if args.modelled:
            raise PbsdkError("explain --modelled runs one shape; give M as a size")
        n, k = (int(d) for d in args.matmul[1:])
        ops: list[tuple[str, Any]] = [(f"matmul ?x{n}x{k}", ("dynamic", n, k, args.batch, args.dtype))]
    elif args.matmul:
        m, n, k = (int(d) for d in args.matmul)
        stored = ("A^T " if args.transpose_a else "") + ("B^T " if args.transpose_b else "")
        ops = [(f"matmul {m}x{n}x{k}" + (f" ({stored.strip()} stored)" if stored else ""),
                Contraction(m, n, k, args.batch, args.dtype, a_layout="km" if args.transpose_a else "mk",
                            b_layout="nk" if args.transpose_b else "kn"))]
    elif args.file:
        try:
            text = Path(args.file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise PbsdkError(f"cannot read {args.file}: {exc}") from None
        ops = _contractions_in_mlir(text)
        if not ops:
            print(f"{args.file}: no contractions to plan (elementwise and reduction ops are memory-bound "
                  "and run as fused loops)")
    else:
        raise PbsdkError("explain needs an MLIR file or --matmul M N K")
    print(f"spec {spec.name}")
    for title, op in ops:
        if isinstance(op, tuple):  # ("dynamic", n, k, batch, dtype): the row count is known at call time
            from pbsdk.core.plan.dynamic import plan_dynamic_contraction
            from pbsdk.core.plan.explain import format_dynamic_plan

            _, n, k, batch, dtype = op
            dyn = plan_dynamic_contraction(spec, n=n, k=k, batch=batch, dtype=dtype, options=options)
            print(format_dynamic_plan(title, dyn, spec, options) if dyn is not None else
                  f"{title}: a size bucket has no packed blocking; the generic lowering runs it")
            continue
        print(format_plan(title, plan_contraction(spec, op, options)))
    if args.modelled:
        if args.matmul:
            from pbsdk import ops as pops

            m, n, k = (int(d) for d in args.matmul)
            lead: tuple[int, ...] = (args.batch,) if args.batch > 1 else ()
            operand_types: list[tuple[tuple[int, ...], str]] = [
                (lead + ((k, m) if args.transpose_a else (m, k)), args.dtype),
                (lead + ((n, k) if args.transpose_b else (k, n)), args.dtype)]
            _print_modelled(lambda a, b: pops.matmul(a, b, transpose_a=args.transpose_a,
                                                     transpose_b=args.transpose_b), operand_types, spec, options)
        else:
            _print_modelled(None, text, spec, options)
    return 0


def _print_modelled(fn: Any, what: Any, spec: Any, options: dict[str, Any]) -> None:
    """Run the program on ``spec``'s emulation (template target) and print its modelled time next to the
    planner's prediction."""
    from pbsdk.emulation import emulate, emulate_mlir

    run = emulate(fn, what, spec=spec, options=options) if fn is not None else \
        emulate_mlir(what, spec=spec, options=options)
    t = run.modelled
    terms = ", ".join(f"{name} {sec * 1e6:.2f} us" for name, sec in t.terms)
    print(f"modelled on {spec.name} (template emulation, {t.cores} core(s), "
          f"{'copies under compute' if t.overlapped else 'copies then compute'}): {t.seconds * 1e6:.2f} us, "
          f"bound by {t.bound}; matrix units busy {t.matrix_unit_utilisation:.0%}")
    print(f"  terms          {terms}")
    if run.planner_estimate_seconds is not None:
        print(f"  planner        {run.planner_estimate_seconds * 1e6:.2f} us "
              f"(modelled / planner = {t.seconds / max(run.planner_estimate_seconds, 1e-15):.2f})")


def _read_report(path: Path) -> dict[str, Any] | None:
    """An earlier (partial) report to resume from; None (said so) where there is none."""
    try:
        return dict(json.loads(path.read_text()))
    except FileNotFoundError:
        print(f"pbsdk dse: --resume: no report at {path}; starting the sweep from the beginning", file=sys.stderr)
        return None
    except (OSError, ValueError) as exc:
        raise PbsdkError(f"--resume: cannot read the report {path}: {exc}") from None


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _streamed(path: Path, partial: dict[str, Any], total: int) -> None:
    """A finished variant: the report so far written (an interrupted sweep resumes from it) and the
    progress bar redrawn on stderr."""
    _write_atomic(path, json.dumps(partial, indent=2))
    done = len(partial["variants"])
    width = 30
    filled = width * done // max(1, total)
    print(f"\r  [{'#' * filled}{'.' * (width - filled)}] {done}/{total} variants", end="", file=sys.stderr,
          flush=True)


def _cmd_dse(args: argparse.Namespace) -> int:
    from pbsdk import dse

    out = Path(args.out)
    if args.merge:
        reports = []
        for f in args.merge:
            try:
                reports.append(json.loads(Path(f).read_text()))
            except (OSError, ValueError) as exc:
                raise PbsdkError(f"cannot read the report {f}: {exc}") from None
        report = dse.merge_reports(reports)
    else:
        if not args.spec or not args.model or not args.vary:
            raise PbsdkError("dse needs --spec, --model and at least one --vary FIELD=V1,V2,... (or --merge)")
        try:
            index, count = (int(x) for x in args.shard.split("/"))
        except ValueError:
            raise PbsdkError(f"--shard {args.shard!r}: expected I/N, e.g. 0/4") from None
        out.mkdir(parents=True, exist_ok=True)
        resume = _read_report(out / "dse.json") if args.resume else None
        from pbsdk.core.spec import load_spec

        total = sum(v.index % count == index for v in dse.variants(load_spec(args.spec),
                                                                    [dse.parse_vary(v) for v in args.vary]))
        report = dse.explore(args.spec, [dse.parse_vary(v) for v in args.vary], args.model, jobs=args.jobs,
                             shard=(index, count), engine=args.engine, address=args.address, resume=resume,
                             on_row=lambda partial: _streamed(out / "dse.json", partial, total))
        print(file=sys.stderr)
    out.mkdir(parents=True, exist_ok=True)
    _write_atomic(out / "dse.json", json.dumps(report, indent=2))
    print(dse.format_table(report))
    print(f"wrote {out / 'dse.json'}", end="")
    if report["shard"][1] == 1:
        try:
            print(f" and {dse.plot(report, out / 'dse.png')}")
        except ImportError:
            print(" (no plot: matplotlib is not installed)")
    else:
        print(f" (shard {report['shard'][0]}/{report['shard'][1]}: merge the shards' reports with --merge)")
    return 0 if all("error" not in r for r in report["variants"]) else 1


def _conform_results(args: argparse.Namespace, request: Any, families: list[str], cases: Sequence[Any]) -> Any:
    """Each case's result as it finishes: here in order, or on an engine (`pbsdk.engines`), where each
    worker generates the suite again and runs the case it is named."""
    from pbsdk.conformance import run_cases
    from pbsdk.conformance.runner import run_named_case
    from pbsdk.engines import run_unordered

    emulate = not args.no_emulate
    if args.engine == "local" and args.jobs <= 1:
        for case in cases:
            yield run_cases([case], target=request.target.name, spec=request.spec, emulate=emulate)[0]
        return
    data = request.spec.model_dump(mode="json", exclude_none=True)
    items = [(c.name, (request.target.name, data, families or None, args.full, c.name, emulate)) for c in cases]
    for _, result in run_unordered(run_named_case, items, engine=args.engine, jobs=args.jobs, address=args.address):
        yield result


def _cmd_conform(args: argparse.Namespace) -> int:
    from pbsdk.conformance import generate_cases, junit_xml, summary
    from pbsdk.conformance.runner import EMULATED, report, resource_summary
    from pbsdk.core.compiler import resolve

    request = resolve(args.target, args.spec, None)
    families = [f for f in (args.ops or "").split(",") if f]
    cases = generate_cases(request.spec, ops_filter=families or None, full=args.full)
    print(f"conformance: target {request.target.name}, spec {request.spec.name}, {len(cases)} cases"
          + (f" on {args.engine} ({args.jobs} jobs)" if args.engine != "local" or args.jobs > 1 else ""))
    results = []
    for result in _conform_results(args, request, families, cases):
        results.append(result)
        err = f" max abs {result.max_abs_error:.2e}" if result.max_abs_error is not None else ""
        if result.message.startswith(EMULATED):
            err += " (emulated)"
        detail = f"  ({result.message.splitlines()[0]})" if result.status != "pass" and result.message else ""
        used = resource_summary(result) if result.resources is not None else ""
        print(f"  {result.status.upper():<5} {result.name}{err}{detail}{f'  [{used}]' if used else ''}", flush=True)
    order = {c.name: i for i, c in enumerate(cases)}
    results.sort(key=lambda r: order[r.name])  # the report in the suite's order, whatever finished first
    counts = summary(results)
    print(" ".join(f"{k}={v}" for k, v in counts.items()))
    if args.report:
        Path(args.report).write_text(json.dumps(report(results, target=request.target.name, spec=request.spec),
                                                indent=2))
    if args.junit:
        Path(args.junit).write_text(junit_xml(results, target=request.target.name, spec=request.spec))
    return 0 if counts["fail"] == 0 and counts["error"] == 0 else 1


def _cmd_demo(args: argparse.Namespace) -> int:
    from pbsdk.demo import main as demo_main

    return demo_main(target=args.target, spec=args.spec, repeats=args.repeats)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pbsdk", description="pbsdk: a retargetable MLIR compiler SDK for AI chips")
    sub = parser.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("targets", help="list installed target plugins (and broken ones)")
    p.add_argument("--strict", action="store_true", help="exit 1 if any plugin failed to load")
    p.set_defaults(func=_cmd_targets)

    p = sub.add_parser("spec", help="chip specs: validate, show, schema, list, calibrate")
    ssub = p.add_subparsers(dest="spec_cmd", required=True)
    v = ssub.add_parser("validate", help="validate YAML chip spec files")
    v.add_argument("files", nargs="+")
    s = ssub.add_parser("show", help="print a preset (or file) after validation")
    s.add_argument("name", help="preset name or alias (e.g. h100), 'host', or a YAML path")
    s.add_argument("--format", choices=["yaml", "json"], default="yaml")
    ssub.add_parser("schema", help="print the JSON Schema of chip specs (for editors)")
    ssub.add_parser("list", help="list presets")
    ssub.add_parser("calibrate", help="measure this machine's clock, FMA and matrix-instruction issue rates and "
                                      "memory bandwidths again (cached per machine; used by the 'host' spec)")
    p.set_defaults(func=_cmd_spec)

    p = sub.add_parser("compile", help="compile an MLIR file (linalg on tensors) and print the IR after a stage, "
                                       "or an ONNX model (.onnx) and print what it became")
    p.add_argument("file", help="input .mlir file ('-' for stdin) or .onnx model")
    p.add_argument("--target", default="cpu")
    p.add_argument("--spec", default=None, help="preset name or YAML path (default: the target's)")
    p.add_argument("--emit", default=None, metavar="STAGE", help="stop after STAGE and print its IR (see --list-stages)")
    p.add_argument("--entry", default=None, help="function to compile when the module has several")
    p.add_argument("--options", nargs="+", action="extend", metavar="OPT",
                   help="compile options (docs/targets.md): KEY=VALUE items (VALUE read as JSON where it parses) "
                        "or a JSON object, e.g. --options threads=1 'tiles={\"spm\": [32, 32, 32]}'")
    p.add_argument("--list-stages", action="store_true", help="print the pipeline's stages and exit")
    p.add_argument("-o", "--output", default=None, help="write to a file instead of stdout; for an ONNX model, "
                                                        "NAME.pbsdk writes a deploy artifact (docs/deploy.md)")
    from pbsdk import cli_onnx
    cli_onnx.add_model_arguments(p)
    p.set_defaults(func=_cmd_compile)

    p = sub.add_parser("opt", help="run named passes (pbsdk's or upstream MLIR's) on an MLIR file and print the IR",
                       description="Run exactly the named passes, in order, on the parsed module and print the "
                                   "result (mlir-opt style). A name is looked up in the --target's pipeline "
                                   "(bare names), then pbsdk's passes (see --list-passes), then upstream MLIR.")
    p.add_argument("file", nargs="?", help="input .mlir file ('-' for stdin)")
    p.add_argument("-p", "--passes", action="append", metavar="PASS,PASS",
                   help="comma-separated passes, e.g. isolate-contractions,fuse or 'math-approx{ops=exp}', "
                        "canonicalize, 'func.func(cse)' (may repeat)")
    p.add_argument("--target", default=None, help="also find this target's stages (e.g. template: promote, dma)")
    p.add_argument("--spec", default=None, help="preset name or YAML path (default: the target's, else host)")
    p.add_argument("--options", nargs="+", action="extend", metavar="OPT",
                   help="compile options: KEY=VALUE items (VALUE read as JSON where it parses) or a JSON object")
    p.add_argument("--split-input-file", action="store_true",
                   help="compile each '// -----' chunk separately; join the outputs with '// -----'")
    p.add_argument("--list-passes", action="store_true", help="print pbsdk's passes (and the target's) and exit")
    p.set_defaults(func=_cmd_opt)

    p = sub.add_parser("explain", help="the plan (tiles per memory level, compute unit, parallel mapping, "
                                       "estimate and bound) chosen for each contraction")
    p.add_argument("file", nargs="?", help="MLIR file (named linalg.matmul / batch_matmul ops are planned), or an "
                                          "ONNX model (.onnx: compiled for cpu; its symbolic dimensions, kernels "
                                          "and their plans)")
    p.add_argument("--matmul", nargs=3, type=_size_or_dynamic, metavar=("M", "N", "K"),
                   help="plan one matmul of this shape (M '?': a row count known at call time, its size buckets)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--transpose-a", action="store_true", help="with --matmul: A stored [k, m] (a.T @ b)")
    p.add_argument("--transpose-b", action="store_true", help="with --matmul: B stored [n, k] (x @ w.T)")
    p.add_argument("--attention", nargs=4, type=int, metavar=("BH", "SQ", "SK", "D"),
                   help="plan one fused attention (batch x heads, query and key lengths, head dim)")
    p.add_argument("--causal", action="store_true", help="with --attention: causal mask")
    p.add_argument("--dtype", default="f32")
    p.add_argument("--precision", choices=["exact", "tf32", "mixed"], default="exact",
                   help="matmul precision policy: which operand dtypes f32 contractions may use")
    p.add_argument("--spec", default=None, help="preset name or YAML path (default: host)")
    p.add_argument("--modelled", action="store_true",
                   help="also run the program on the spec's emulation (template target) and print the time "
                        "the chip would take, from its counters, next to the planner's prediction")
    cli_onnx.add_model_arguments(p)
    p.set_defaults(func=_cmd_explain)

    p = sub.add_parser("dse", help="design-space exploration: a program on variants of a spec, through the "
                                   "emulation (modelled time, bytes per level, matrix-unit use); docs/dse.md")
    p.add_argument("--spec", help="preset name or YAML path of the base spec")
    p.add_argument("--vary", action="append", default=[], metavar="FIELD=V1,V2,...",
                   help="a spec field and its values, e.g. memory.spm.size_bytes=131072,262144 (repeatable: "
                        "every combination runs)")
    p.add_argument("--model", help="gpt2-block, resnet-block (NAME:key=value,... overrides, e.g. "
                                   "gpt2-block:seq=256), matmul:M,N,K[,dtype], or a .mlir file")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="variants run in parallel (processes)")
    p.add_argument("--shard", default="0/1", metavar="I/N", help="run every N-th variant from the I-th (to split "
                   "a sweep over machines; --merge joins the reports)")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="merge shard reports of one sweep instead of running")
    p.add_argument("--out", default="dse-out", help="directory for dse.json and dse.png (default dse-out)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="where variants run: local processes (--jobs), or Ray tasks (pip install 'pbsdk[ray]'): a "
                        "local Ray of --jobs CPUs, or the cluster at --address")
    p.add_argument("--address", default=None, help="with --engine ray: the Ray cluster to use (e.g. ray://host:10001)")
    p.add_argument("--resume", action="store_true",
                   help="keep the finished variants of the (partial) report in --out and run only the others")
    p.set_defaults(func=_cmd_dse)

    p = sub.add_parser("conform", help="run the spec-driven conformance suite on a target")
    p.add_argument("--target", default="cpu")
    p.add_argument("--spec", default=None, help="preset name or YAML path (default: the target's)")
    p.add_argument("--ops", default=None, help="comma-separated families: matmul, conv2d, elementwise, "
                                               "reduction, softmax, layernorm, attention, quantized_linear")
    p.add_argument("--full", action="store_true", help="include large capacity-straddling cases")
    p.add_argument("--report", default=None, help="write a JSON report here")
    p.add_argument("--junit", default=None, help="write JUnit XML here")
    p.add_argument("--no-emulate", action="store_true",
                   help="without the device, only compile (default: run on the target's host emulation "
                        "where it has one, e.g. nvgpu)")
    p.add_argument("--engine", choices=["local", "ray"], default="local",
                   help="where cases run: here (--jobs processes), or as Ray tasks (pip install 'pbsdk[ray]')")
    p.add_argument("--jobs", type=int, default=1, help="cases run in parallel (processes; with --engine ray: the "
                                                       "local Ray's CPUs)")
    p.add_argument("--address", default=None, help="with --engine ray: the Ray cluster to use")
    p.set_defaults(func=_cmd_conform)

    p = sub.add_parser("demo", help="compile and run an MLP layer (bias+GELU) and a softmax; compare with numpy")
    p.add_argument("--target", default="cpu")
    p.add_argument("--spec", default=None)
    p.add_argument("--repeats", type=int, default=20)
    p.set_defaults(func=_cmd_demo)
    from pbsdk import cli_cache, cli_fuzz
    cli_cache.register(sub); cli_fuzz.register(sub)
    from pbsdk import cli_new_target
    cli_new_target.register(sub)
    from pbsdk import cli_bench
    cli_bench.register(sub)
    cli_onnx.register(sub)
    from pbsdk import cli_deploy
    cli_deploy.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except PbsdkError as err:
        print(f"pbsdk: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # noqa: BLE001 - a bug in pbsdk: say so, briefly
        if os.environ.get("PBSDK_DEBUG"):
            traceback.print_exc()
        print(f"pbsdk: internal error: {type(exc).__name__}: {exc} (set PBSDK_DEBUG=1 for a traceback)",
              file=sys.stderr)
        return 3


if __name__ == "__main__":
    sys.exit(main())
