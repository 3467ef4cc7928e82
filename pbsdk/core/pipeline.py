"""Named, ordered compilation stages.

A pipeline is a flat list of `Stage`s: the core's target-independent stages first, then the target's.
A stage either runs an upstream MLIR pass pipeline given as text (``passes``) or calls a Python function
(``fn``) that rewrites the module in place, or turns it into something that is no longer MLIR (LLVM IR
text, PTX, an `Artifact`). The module is verified after every MLIR stage, and so are its ``pbsdk.*``
attributes (`pbsdk.core.ir.attributes.verify`) after a stage that hands decisions on through them
(``marks=True``). ``PBSDK_DUMP_DIR`` writes what every stage produced; ``stop_after`` ends the run after any
stage (``pbsdk compile --emit STAGE``). A failure raises `CompileError` naming the stage, the op MLIR blamed
and the reason. A target whose own toolchain takes the module before the end of its stages (a C compiler,
its assembler) ends the pipeline at a stage of its choice (`Target.emit_after`, applied by `end_after`).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from mlir import ir, passmanager

from pbsdk.core.errors import CompileError, PbsdkError
from pbsdk.core.ir import attributes
from pbsdk.core.options import DEFAULT, Options, as_options

# What a stage function receives besides the IR: the spec, the options and anything earlier stages
# recorded for later ones (e.g. the kernel signature).
StageFn = Callable[[Any, "StageContext"], Any]


@dataclasses.dataclass
class StageContext:
    """Mutable notes shared by the stages of one compilation. ``constants``: the entry function's
    constant operands (numpy arrays, by their ``pbsdk.constant`` index), handed to the driver next to
    the module; the final stage puts them in its `Artifact` (or builds them into its payload)."""

    spec: Any
    options: Options = DEFAULT
    notes: dict[str, Any] = dataclasses.field(default_factory=dict)
    constants: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        # A mapping of core option keys (tools, tests) is parsed; a target's keys need `Target.parse_options`.
        self.options = as_options(self.options)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One named step. Exactly one of ``passes`` (upstream textual pipeline, anchored on the module)
    and ``fn`` (Python; returns the new IR, or None when it rewrote the module in place). ``marks``: the
    stage sets or reads ``pbsdk.*`` attributes (the tiled form), so the pipeline verifies them after it
    (a walk over every op: too slow to do after every stage of a fully lowered module)."""

    name: str
    passes: str | None = None
    fn: StageFn | None = None
    description: str = ""
    marks: bool = False

    def __post_init__(self) -> None:
        if (self.passes is None) == (self.fn is None):
            raise ValueError(f"stage '{self.name}' needs exactly one of passes= or fn=")


_OP_IN_DIAG = re.compile(r"'([a-z_][\w]*\.[\w.]+)' op")
_OP_AT_LOC = re.compile(r"see current operation: (?:%[\w#:, ]+= )?\"?([a-z_][\w]*\.[\w.]+)")


def _blamed_op(message: str) -> str | None:
    """The op MLIR's diagnostics blame, e.g. "'linalg.generic' op ..." -> "linalg.generic"."""
    for pattern in (_OP_IN_DIAG, _OP_AT_LOC):
        match = pattern.search(message)
        if match:
            return match.group(1)
    return None


def _dump(directory: str, index: int, name: str, ir_obj: Any) -> None:
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    if hasattr(ir_obj, "payload"):  # an Artifact: dump what it carries
        ir_obj = ir_obj.payload
    text: str | bytes
    if isinstance(ir_obj, ir.Module):
        text, suffix = str(ir_obj), ".mlir"
    elif isinstance(ir_obj, (str, bytes)):
        text, suffix = ir_obj, ".txt"
    else:
        text, suffix = repr(ir_obj), ".txt"
    mode = "wb" if isinstance(text, bytes) else "w"
    with open(path / f"{index:02d}-{name}{suffix}", mode) as f:
        f.write(text)


#: The stage after which every kernel is in the tiled form (docs/architecture.md): the earliest stage a
#: target's toolchain may take the module at (`Target.emit_after`) in a pipeline that has it.
TILED_FORM = "promote-vector"


def end_after(stages: Sequence[Stage], last: str, *, final: Stage) -> tuple[Stage, ...]:
    """``stages`` up to and including ``last``, then ``final`` (the stage that hands the module to the
    target's toolchain and returns the `Artifact`). Raises `PbsdkError` when ``last`` is not a stage, or
    comes before `TILED_FORM` in a pipeline that has it."""
    names = [s.name for s in stages]
    if last not in names:
        raise PbsdkError(f"the pipeline cannot end after unknown stage '{last}'; stages are: {', '.join(names)}")
    end = names.index(last)
    if TILED_FORM in names and end < names.index(TILED_FORM):
        raise PbsdkError(f"the pipeline cannot end after stage '{last}': a target's toolchain takes the tiled form "
                         f"(stage '{TILED_FORM}') or a later stage")
    kept = tuple(s for s in stages[:end + 1] if s.name != final.name)
    return (*kept, final)


@dataclasses.dataclass(frozen=True)
class Pipeline:
    """An ordered list of stages with unique names."""

    stages: tuple[Stage, ...]

    def __post_init__(self) -> None:
        names = [s.name for s in self.stages]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"duplicate stage names: {sorted(dupes)}")

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.stages)

    def run(self, module: ir.Module, ctx: StageContext, *, stop_after: str | None = None,
            dump_dir: str | None = None) -> Any:
        """Run the stages in order on ``module``; returns what the last stage run produced."""
        if stop_after is not None and stop_after not in self.names:
            raise PbsdkError(f"unknown stage '{stop_after}'; stages are: {', '.join(self.names)}")
        dump_dir = dump_dir if dump_dir is not None else os.environ.get("PBSDK_DUMP_DIR") or None
        current: Any = module
        for index, stage in enumerate(self.stages):
            current = self._run_stage(stage, current, ctx)
            if dump_dir:
                _dump(dump_dir, index, stage.name, current)
            if stage.name == stop_after:
                break
        return current

    @staticmethod
    def _run_stage(stage: Stage, current: Any, ctx: StageContext) -> Any:
        try:
            if stage.passes is not None:
                if not isinstance(current, ir.Module):
                    raise CompileError("expects an MLIR module", stage=stage.name)
                with current.context:
                    pm = passmanager.PassManager.parse(f"builtin.module({stage.passes})")
                    pm.run(current.operation)
                result = current
            else:
                assert stage.fn is not None
                out = stage.fn(current, ctx)
                result = current if out is None else out
            if isinstance(result, ir.Module):
                result.operation.verify()
                if stage.marks:
                    attributes.verify(result)  # every pbsdk.* attribute known and well-formed
            return result
        except CompileError as err:
            if err.stage is None:  # keep the subclass (UnsupportedError stays UnsupportedError)
                raise type(err)(err.reason, stage=stage.name, op=err.op) from err
            raise
        except PbsdkError:
            raise
        except Exception as exc:  # MLIR raises plain exceptions carrying its diagnostics
            message = str(exc)
            raise CompileError(message.strip(), stage=stage.name, op=_blamed_op(message)) from exc
