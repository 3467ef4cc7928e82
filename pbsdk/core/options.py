"""Compile options: frozen dataclasses, parsed once from the user's mapping, hashed into the cache key.

Every option pbsdk reads is a field here (`Options`, the core's) or in a target's own dataclass (a
`TargetOptions` subclass named by ``Target.options_type``, reached as ``options.target``). `parse_options`
turns the mapping a user passes (``pbsdk.jit(options={...})``, ``torch.compile(..., options={
"compile_options": {...}})``, ``pbsdk compile --option``) into these: an unknown key is an `OptionsError`
naming the key and every known one, a value of the wrong type names the field and the type it wants. The
parsed options are what stages read (``ctx.options.threads``, ``ctx.options.target.ptxas``) and what the
compilation cache keys on (`Options.cache_key`), so a misspelt key can neither be ignored nor change the
key.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, Literal, TypeVar

from pbsdk.core.errors import OptionsError

T = TypeVar("T")
TO = TypeVar("TO", bound="TargetOptions")

#: Field metadata key: a function that turns the user's value into the field's (frozen, hashable) value.
CONVERT = "convert"


def _count(value: Any, what: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"must be a non-negative int, got {value!r}")
    return value


@dataclasses.dataclass(frozen=True)
class TargetOptions:
    """Base class of a target's options (a target without options uses it as is). A subclass is a frozen
    dataclass whose fields are the target's options, each with a default.

    The methods are what the core's own stages ask a target (the core never imports one): a subclass
    overrides those that its options decide. The defaults are the core's behaviour."""

    def isolate_contractions(self) -> bool:
        """Whether the core stage ``isolate-contractions`` moves each named contraction into its own
        function, so that fusion cannot generalise it before the target's stages see it (the cpu target:
        not when its option ``pack`` turns its packed kernels off)."""
        return True

    def isolate_epilogues(self) -> bool:
        """Whether ``isolate-contractions`` moves a contraction's elementwise epilogue into its function too,
        for the target's kernel to apply in its final store (the cpu target: its option ``fuse_epilogues``)."""
        return True


@dataclasses.dataclass(frozen=True)
class Options:
    """The core's options; ``target`` holds the target's (see the module docstring)."""

    #: The entry function's name, when the module has more than one public function.
    entry: str | None = None
    #: Use the on-disk compilation cache (not part of the cache key).
    cache: bool = True
    #: Cores to use; 0: every core of the spec's outermost compute level.
    threads: int = dataclasses.field(default=0, metadata={CONVERT: lambda v: _count(v, "threads")})
    #: Precision policy for f32 matmuls: "exact" keeps f32; "tf32" lets tf32 units serve f32; "mixed" also
    #: f16/bf16 units (f32 accumulation).
    matmul_precision: Literal["exact", "tf32", "mixed"] = "exact"
    #: Use a scratchpad level's opt-in maximum (``max_size_bytes``) rather than ``size_bytes``.
    optin_scratchpad: bool = True
    #: Let the planner double-buffer tiles in software-managed levels.
    double_buffer: bool = True
    #: Map contractions onto the spec's matrix units (False: vector/scalar code only).
    matrix_units: bool = True
    #: Fuse matmul -> softmax -> matmul into one attention kernel.
    fuse_attention: bool = True
    #: The next four force what the core's planners (`pbsdk.core.plan`) otherwise decide from the spec.
    #: Pack B of a matrix-vector-like product: None lets the planner decide (experiments, tests).
    pack_b: bool | None = None
    #: Pack A of a product with few columns per thread: None lets the planner decide (experiments, tests).
    pack_a: bool | None = None
    #: Compute a packed matmul transposed, C^T = B^T A^T, so that its rows fill the vector registers
    #: instead of its columns: None lets the planner decide (few columns, many rows), True/False force it
    #: where the kernel can.
    transpose_gemm: bool | None = None
    #: Query rows per vector in the lanes attention kernel; 0 lets the planner decide (experiments).
    attention_q_vectors: int = dataclasses.field(default=0, metadata={CONVERT: lambda v: _count(v, "q")})
    #: Run NCHW convolutions that need patches (not 1x1 stride 1) in NHWC: transposes around one NHWC
    #: contraction (weights transposed at compile time when constant).
    conv_nhwc: bool = True
    #: Let the planner run an f32 convolution as a direct kernel where it finds one cheaper than a contraction
    #: (narrow groups, few input channels: `pbsdk.core.plan.direct_conv`; only with ``conv_nhwc``).
    direct_conv: bool = True
    #: Keep activations in NHWC between NCHW convolutions that run in NHWC, and the ops between them
    #: (`pbsdk.core.ir.layout`), instead of transposing around each convolution.
    channels_last: bool = True
    #: The target's options.
    target: TargetOptions = TargetOptions()

    def cache_key(self) -> str:
        """A stable text of every option that changes the output (all but ``cache``), the target's too."""
        core = [(f.name, repr(getattr(self, f.name))) for f in dataclasses.fields(self)
                if f.name not in ("cache", "target")]
        tgt = [(f.name, repr(getattr(self.target, f.name))) for f in dataclasses.fields(self.target)]
        return repr((sorted(core), type(self.target).__qualname__, sorted(tgt)))

    def target_as(self, cls: type[TO]) -> TO:
        """The target's options as ``cls`` (its defaults when no target options were parsed, e.g. for a
        context built from core options only); another target's options are an `OptionsError`."""
        if isinstance(self.target, cls):
            return self.target
        if type(self.target) is TargetOptions:
            return cls()
        raise OptionsError(f"options were parsed for {type(self.target).__qualname__}, not {cls.__qualname__}")

    def replace(self, **changes: Any) -> Options:
        """A copy with ``changes``, checked like parsed options: core fields, and the fields of the target's
        options as parsed (``ctx.options.replace(pack=False)`` with the cpu target's)."""
        return parse_options(changes, base=self)


DEFAULT = Options()


def known_keys(cls: type) -> tuple[str, ...]:
    return tuple(f.name for f in dataclasses.fields(cls))


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " or ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    return "None" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return value in typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is bool:
        return isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if origin is not None:
        return isinstance(value, origin)
    return isinstance(value, tp)


def _check(cls: type, name: str, value: Any, owner: str) -> Any:
    field = next(f for f in dataclasses.fields(cls) if f.name == name)
    convert: Callable[[Any], Any] | None = field.metadata.get(CONVERT)
    if convert is not None:
        try:
            return convert(value)
        except (TypeError, ValueError) as exc:
            raise OptionsError(f"{owner} option '{name}': {exc}") from exc
    tp = typing.get_type_hints(cls)[name]
    if not _matches(value, tp):
        raise OptionsError(f"{owner} option '{name}' must be {_type_name(tp)}, got {value!r}")
    return value


def parse_dataclass(cls: type[T], values: Mapping[str, Any], *, owner: str, base: T | None = None) -> T:
    """``cls`` (a frozen options dataclass) from ``values``; every key must be a field of ``cls``."""
    names = known_keys(cls)
    unknown = sorted(str(k) for k in values if k not in names)
    if unknown:
        known = ", ".join(sorted(set(names) - {"target"}))
        raise OptionsError(f"unknown {owner} option{'s' if len(unknown) > 1 else ''} "
                           f"{', '.join(repr(k) for k in unknown)}; known options: {known}")
    checked = {k: _check(cls, k, v, owner) for k, v in values.items()}
    return dataclasses.replace(base, **checked) if base is not None else cls(**checked)  # type: ignore[type-var]


def parse_options(values: Options | Mapping[str, Any] | None, *, target_options: type[TargetOptions] | None = None,
                  target_name: str | None = None, base: Options | None = None) -> Options:
    """`Options` from a user's mapping: core keys to the core's fields, the rest to ``target_options``
    (the target's dataclass; None: the target has no options). Already-parsed `Options` pass through."""
    if isinstance(values, Options):
        return values
    values = dict(values or {})
    base = base if base is not None else DEFAULT
    core_names = set(known_keys(Options)) - {"target"}
    tcls = target_options or type(base.target)
    tnames = known_keys(tcls)
    core = {k: v for k, v in values.items() if k in core_names}
    rest = {k: v for k, v in values.items() if k not in core_names}
    unknown = sorted(str(k) for k in rest if k not in tnames)
    if unknown:
        whose = (f"pbsdk's and the {target_name} target's" if target_name
                 else f"pbsdk's and the target's, {tcls.__qualname__}" if tnames else "pbsdk's")
        known = ", ".join(sorted(core_names | set(tnames)))
        raise OptionsError(f"unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
                           f"known options ({whose}): {known}")
    owner = f"target '{target_name}'" if target_name else "target"
    tgt_base = base.target if isinstance(base.target, tcls) else None
    tgt = parse_dataclass(tcls, rest, owner=owner, base=tgt_base) if rest or tgt_base is None else base.target
    return parse_dataclass(Options, {**core, "target": tgt}, owner="pbsdk", base=base)


def as_options(options: Options | Mapping[str, Any] | None) -> Options:
    """The core options of ``options`` (None: the defaults; a mapping: parsed, core keys only) — what the
    pure planners accept, so they can be called with ``{"threads": 1}`` in tests and tools."""
    if options is None:
        return DEFAULT
    if isinstance(options, Options):
        return options
    return parse_options(options)
