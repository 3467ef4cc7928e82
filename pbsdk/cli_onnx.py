"""``pbsdk compile model.onnx`` and ``pbsdk run model.onnx --inputs a.npy ...``: ONNX models on the command
line (`pbsdk.onnx`). Failures are `PbsdkError`s, printed by the CLI as one paragraph."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

from pbsdk.core.errors import ArgumentError, PbsdkError


def _input_shapes(items: list[str] | None) -> dict[str, tuple[int, ...]]:
    """``NAME=D0,D1,...`` items."""
    shapes = {}
    for item in items or ():
        name, eq, dims = item.partition("=")
        try:
            shapes[name.strip()] = tuple(int(d) for d in dims.split(","))
        except ValueError:
            eq = ""
        if not eq or not name.strip():
            raise PbsdkError(f"--input-shape {item!r}: expected NAME=D0,D1,... (e.g. input_ids=1,128)")
    return shapes


def _load(args: argparse.Namespace, options: dict[str, Any]) -> Any:
    from pbsdk.onnx import load

    return load(args.file, target=args.target, spec=args.spec, options=options or None,
                fallback=bool(getattr(args, "fallback", False)), input_shapes=_input_shapes(args.input_shape))


def compile_onnx(args: argparse.Namespace, options: dict[str, Any]) -> int:
    """Compile an ONNX model: print what each node became and the kernels (or, with ``--emit STAGE``, each
    kernel's IR after that stage)."""
    model = _load(args, options)
    if model.value_inputs:  # nothing is compiled before the values of its shape inputs are known
        print(f"{model!r}\nno kernel yet: the model compiles when run, once per value of "
              + ", ".join(f"{n!r} ({why})" for n, why in model.value_inputs.items())
              + " (docs/onnx.md, 'Shape, axes and indices fed as inputs')")
        return 0
    if args.emit:
        from pbsdk.core.compiler import compile_text

        chunks = []
        for text in model.lower():
            result = compile_text(text, model.request, stop_after=args.emit)
            payload = getattr(result, "payload", result)
            chunks.append(payload if isinstance(payload, str) else str(payload))
        out = "\n// -----\n".join(chunks)
    else:
        lines = [repr(model), model.report.format()]
        for i, kernel in enumerate(model.kernels):
            lines.append(f"kernel {i}: {kernel!r}")
        out = "\n".join(lines)
    if args.output:
        Path(args.output).write_text(out if out.endswith("\n") else out + "\n")
    else:
        print(out, end="" if out.endswith("\n") else "\n")
    return 0


def explain_onnx(args: argparse.Namespace) -> int:
    """``pbsdk explain model.onnx``: the model compiled for cpu (``--spec``), its symbolic dimensions, the
    sizes each call checks, and each kernel's contractions as planned (`pbsdk.onnx.OnnxModel.explain`)."""
    args.target = "cpu"
    model = _load(args, {})
    print(model.explain())
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from pbsdk.cli import _parse_options

    model = _load(args, _parse_options(args.options))
    arrays = []
    for path in args.inputs or ():
        try:
            arrays.append(np.load(path, allow_pickle=False))
        except (OSError, ValueError) as exc:
            raise ArgumentError(f"cannot read input {path}: {exc}") from None
    outputs = model.run(dict(zip(model.input_names, arrays))) if len(arrays) == len(model.input_names) else \
        model(*arrays)  # the wrong count: the model's ArgumentError says what it takes
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    if args.output_dir:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    for name, array in zip(model.output_names, outputs):
        line = f"{name}: {array.dtype}{list(array.shape)}"
        if args.output_dir:
            path = Path(args.output_dir) / f"{_safe(name)}.npy"
            np.save(path, array)
            line += f" -> {path}"
        else:
            flat = array.reshape(-1)
            line += " " + np.array2string(flat[:8], precision=5, separator=", ") + (" ..." if flat.size > 8 else "")
        print(line)
    sys.stdout.flush()
    return 0


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "output"


def add_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fallback", action="store_true",
                   help="ONNX: run ops pbsdk cannot convert through onnx.reference (logged) instead of failing")
    p.add_argument("--input-shape", nargs="+", action="extend", metavar="NAME=D0,D1",
                   help="ONNX: static shapes for inputs with dynamic dimensions")


def register(sub: Any) -> None:
    p = sub.add_parser("run", help="compile an ONNX model and run it on .npy inputs",
                       description="Compile an ONNX model for a target and run it on numpy (.npy) inputs, in the "
                                   "model's input order; prints each output (or saves it with --output-dir).")
    p.add_argument("file", help="the .onnx model")
    p.add_argument("--inputs", nargs="+", action="extend", metavar="FILE.npy", help="one .npy per model input")
    p.add_argument("--target", default="cpu")
    p.add_argument("--spec", default=None, help="preset name or YAML path (default: the target's)")
    p.add_argument("--options", nargs="+", action="extend", metavar="OPT", help="compile options (KEY=VALUE or JSON)")
    p.add_argument("--output-dir", default=None, help="save each output as NAME.npy here")
    add_model_arguments(p)
    p.set_defaults(func=_cmd_run)
