"""Deploy artifacts on the command line (docs/deploy.md):

- ``pbsdk compile model.onnx -o model.pbsdk``: export an ONNX model (`pbsdk.deploy.export`);
- ``pbsdk inspect model.pbsdk [--inputs x.npy ...]``: check a file as the runtime loads it, print its
  manifest, and with inputs run it (`pbsdk.runtime`, no compiler).
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np

from pbsdk.core.errors import ArgumentError, PbsdkError


def exports(args: argparse.Namespace) -> bool:
    """Whether ``pbsdk compile`` was asked for a deploy artifact (``-o NAME.pbsdk`` of an ONNX model)."""
    return bool(args.output) and str(args.output).endswith(".pbsdk") and args.file.endswith(".onnx") \
        and not args.emit and not args.list_stages


def export_onnx(args: argparse.Namespace, options: dict[str, Any]) -> int:
    from pbsdk.cli_onnx import _input_shapes
    from pbsdk.deploy import export
    from pbsdk.onnx import load

    if getattr(args, "fallback", False):
        raise PbsdkError("--fallback cannot be exported: the deploy runtime has no onnx.reference")
    model = load(args.file, target=args.target, spec=args.spec, options=options or None,
                 input_shapes=_input_shapes(args.input_shape))
    path = export(model, (), args.output)
    print(f"wrote {path} ({path.stat().st_size / 2**20:.1f} MiB): {model!r}")
    return 0


def _cmd_inspect(args: argparse.Namespace) -> int:
    import pbsdk.runtime

    try:
        model = pbsdk.runtime.load(args.file, verify=not args.no_verify)
    except pbsdk.runtime.DeployError as exc:
        raise PbsdkError(f"{args.file}: {type(exc).__name__}: {exc}") from None
    m = model.manifest
    print(f"{args.file}: format {m.format}, target {m.target} ({m.machine} {m.system}), spec {m.spec_name} "
          f"[{m.spec_hash[:12]}], compiler {', '.join(f'{k} {v}' for k, v in m.compiler.items())}")
    print(f"  CPU features: {' '.join(m.cpu_features) or '(none)'}")
    for e in m.entries:
        weights = sum(m.sections[c].size for c in e.constants)
        print(f"  entry {e.name}: code {m.sections[e.code].size / 1024:.0f} KiB, {len(e.constants)} weights "
              f"({weights / 2**20:.1f} MiB), workspace {e.workspace / 2**20:.1f} MiB")
        for kind, tensors in (("in ", e.inputs), ("out", e.outputs)):
            for t in tensors:
                print(f"    {kind} {t.name}: {t.dtype}{list(t.shape)}")
    if args.inputs:
        arrays = []
        for path in args.inputs:
            try:
                arrays.append(np.load(path, allow_pickle=False))
            except (OSError, ValueError) as exc:
                raise ArgumentError(f"cannot read input {path}: {exc}") from None
        try:
            outs = model(*arrays)
        except pbsdk.runtime.DeployError as exc:
            raise PbsdkError(f"{type(exc).__name__}: {exc}") from None
        for t, out in zip(model.manifest.entries[0].outputs, outs if isinstance(outs, tuple) else (outs,)):
            flat = out.reshape(-1)
            print(f"  {t.name}: {out.dtype}{list(out.shape)} "
                  f"{np.array2string(flat[:8], precision=5, separator=', ')}{' ...' if flat.size > 8 else ''}")
    return 0


def register(sub: Any) -> None:
    p = sub.add_parser("inspect", help="check a deploy artifact (.pbsdk) as the runtime loads it, print its "
                                       "manifest; with --inputs, run it without the compiler")
    p.add_argument("file", help="a .pbsdk file written by pbsdk.export or `pbsdk compile model.onnx -o m.pbsdk`")
    p.add_argument("--inputs", nargs="+", action="extend", metavar="FILE.npy", help="one .npy per entry input")
    p.add_argument("--no-verify", action="store_true", help="skip the weights' checksums (the code's are kept)")
    p.set_defaults(func=_cmd_inspect)
