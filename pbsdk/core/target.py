"""The target contract and entry-point discovery.

A target is a plugin: a `Target` subclass registered in the ``pbsdk.targets`` entry-point group. The
built-in targets (cpu, nvgpu, template) register there exactly as a third party's would. Discovery is lazy
(nothing is imported until asked), a plugin that fails to import is reported and skipped, two plugins with
one name are an error, and the contract's API version is checked.
"""

from __future__ import annotations

import abc
import dataclasses
import importlib.metadata
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from pbsdk.core.errors import OptionsError, TargetError
from pbsdk.core.options import Options, TargetOptions, known_keys, parse_options

if TYPE_CHECKING:
    from pbsdk.core.pipeline import Stage
    from pbsdk.core.spec import ChipSpec

#: Version of the contract below. A plugin declares the version it was written against; a plugin whose
#: major version differs is refused with a clear message instead of failing somewhere deep inside.
#: Version 2: options are typed (`pbsdk.core.options.Options`, ``Target.options_type``) and stages read
#: ``ctx.options.<field>``; the template hooks build IR with the bindings instead of returning MLIR text.
API_VERSION = 2
ENTRY_POINT_GROUP = "pbsdk.targets"


@dataclasses.dataclass(frozen=True)
class Artifact:
    """What a pipeline hands to a target's loader: the final payload plus the kernel's signature.

    ``kind`` names the payload format (``"llvm-ir"``, ``"object"``, ``"ptx"``, ``"cubin"``, ``"c"``, ...);
    ``payload`` is its text or bytes. ``entry`` is the symbol to call. ``inputs``/``outputs`` are the
    (shape, dtype-name) of each argument in call order: inputs first, then outputs (destination-passing
    style, static shapes, bare pointers).

    ``constants`` are the entry's constant operands (frozen weights: C-order, read-only numpy arrays
    of the argument's dtype), which the code reads through pointers rather than holding them in its
    payload: the entry symbol takes ``inputs``, then ``constants``, then ``outputs``, and the loader binds
    the constants once, so a caller passes inputs and outputs only. A target that builds them into its
    payload instead (nvgpu's bundle) leaves this empty. When a stage changed them (the cpu target packs
    weights for its kernels), ``metadata[DERIVED_CONSTANTS]`` is true: they are no longer the arrays the
    compilation was given, so a cache hit returns the stored ones.

    A dynamic dimension in ``inputs``/``outputs`` is a size expression (`pbsdk.core.dims`, e.g. ``"a0d0"`` or
    ``"a0d0 + 1"``) instead of an int. Such an entry takes one more buffer after its outputs (before the
    workspace): the int64 values of ``metadata[DYNAMIC_SIZES]``'s expressions evaluated for the call
    (`pbsdk.core.passes.dynamic_sizes`).

    ``metadata[WORKSPACE]``, when positive, is the size in bytes of a workspace the entry takes after its
    outputs (`pbsdk.core.passes.plan_workspace`): scratch memory the loader allocates, 64-byte aligned,
    and passes to every call, one buffer per call in flight.
    """

    kind: str
    payload: str | bytes
    entry: str
    inputs: tuple[tuple[tuple[int, ...], str], ...]
    outputs: tuple[tuple[tuple[int, ...], str], ...]
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    #: Not compared by ``==`` (numpy arrays have no truth value); the cache key hashes their bytes.
    constants: tuple[Any, ...] = dataclasses.field(default=(), compare=False)


#: `Artifact.metadata` key: the artifact's constants are not the ones it was compiled from (see `Artifact`).
DERIVED_CONSTANTS = "derived_constants"
#: `Artifact.metadata` key: the size expressions whose values a dynamic entry takes in its sizes buffer (see
#: `Artifact`), in order.
DYNAMIC_SIZES = "dynamic_sizes"
#: `Artifact.metadata` key: bytes of the workspace the entry takes as its last argument (0 or absent: none).
WORKSPACE = "workspace"


class Executable(abc.ABC):
    """A loaded artifact. ``run`` takes contiguous numpy arrays, inputs then preallocated outputs.

    ``run_pointers``, where not None, is the same call on raw host addresses of contiguous buffers of
    the artifact's shapes and dtypes (executables that run in host memory set it; frontends holding
    their own tensors, e.g. torch's, call it without building numpy views)."""

    run_pointers: Any = None

    @abc.abstractmethod
    def run(self, buffers: Sequence[Any]) -> None: ...


class Target(abc.ABC):
    """Contract every target plugin fulfils.

    Class attributes:
      name          -- the name users pass as ``target=`` (must equal the entry-point name).
      api_version   -- the contract version the plugin was written against (``API_VERSION``).
      default_spec  -- preset name (or path) of the chip spec used when the user gives none.
      description   -- one line for ``pbsdk targets``.
      implemented   -- False for a registered target whose code generation has not landed yet; it is
                       listed but compiling for it raises a clear `TargetError`.
      attention_forms -- the fused-attention kernel forms the target's stages lower
                       (`pbsdk.core.plan.attention.FORMS`): ``"scratchpad"``, the core's tiled form
                       (tiles staged in a software-managed level with ``pbsdk.dma`` copies,
                       ``pbsdk.matrix_unit`` and ``pbsdk.compute`` ops: the core builds the kernel);
                       ``"lanes"``, for cache hierarchies: the core emits a declaration carrying the
                       plan (``pbsdk.attention``) and the target must build its body (the cpu target's
                       ``attention`` stage does). The planner picks the form from the chip spec; one the
                       target does not list runs unfused. Default: the scratchpad form only.
      dynamic_shapes -- the target's stages compile entry functions with dynamic (``?``) dimensions
                       (`pbsdk.core.dims`; the artifact's signature then holds size expressions and the
                       executable takes the sizes, see `Artifact`). Default False: the ``input`` stage
                       refuses them with a `DynamicShapeError`.
      options_type  -- the frozen dataclass (a `TargetOptions` subclass) of the target's own options;
                       `parse_options` splits a user's mapping between it and the core's `Options`.
      emit_after    -- None (the default: every stage runs), or the name of the stage after which the
                       pipeline ends and the module goes to the target's own toolchain (a C compiler,
                       an assembler): the tiled form (`pbsdk.core.pipeline.TILED_FORM`) or any later
                       stage. The target's last stage then runs on the module as that stage left it
                       (`pbsdk.core.pipeline.end_after`); a target built on the template hands it to the
                       ``toolchain_emission`` hook (`pbsdk.core.hooks.HOOKS`).
      hooks         -- where the target's lowering hooks come from (`pbsdk.core.hooks`): a module, a class
                       or an object implementing part of the contract, checked by
                       `pbsdk.core.hook_contract.check_hooks` when the plugin is discovered (a misspelt hook or a
                       wrong signature makes the plugin unusable, with the reason). None: the target's
                       own lowering (the template target: its emulation of every hook).

    The compile cache keys a target on `fingerprint`: by default a hash of every ``.py`` file of the
    top-level package that defines the class (and of the one defining ``hooks``), so that editing any
    module of a plugin invalidates its cached kernels.
    """

    name: ClassVar[str]
    api_version: ClassVar[int] = API_VERSION
    default_spec: ClassVar[str]
    description: ClassVar[str] = ""
    implemented: ClassVar[bool] = True
    attention_forms: ClassVar[tuple[str, ...]] = ("scratchpad",)
    dynamic_shapes: ClassVar[bool] = False
    options_type: ClassVar[type[TargetOptions]] = TargetOptions
    emit_after: ClassVar[str | None] = None
    hooks: ClassVar[Any] = None

    @classmethod
    def implemented_hooks(cls) -> frozenset[str]:
        """The names of the hooks of the contract (`pbsdk.core.hooks.HOOKS`) that ``hooks`` implements
        (empty without ``hooks``). Raises `TargetError` for a name in ``hooks`` that is not a hook or a
        hook whose signature is not the contract's."""
        if cls.hooks is None:
            return frozenset()
        from pbsdk.core.hook_contract import check_hooks  # MLIR-free, like discovery

        return check_hooks(cls.hooks, target=cls.name)

    @classmethod
    def fingerprint(cls) -> str | None:
        """A string that changes whenever this target's code generation may change, for the compile
        cache's key; None (the default) lets the cache hash the sources of the target's top-level package
        (and of the package defining ``hooks``). Override it where the code lives elsewhere (generated
        modules, a native library the stages call)."""
        return None

    def parse_options(self, values: Options | Mapping[str, Any] | None) -> Options:
        """The typed options of a compilation for this target: the core's fields and, as ``.target``, an
        ``options_type``. An unknown key or a mistyped value raises `OptionsError` naming it (and, for a key
        that another installed target takes, that target: `options_elsewhere`)."""
        try:
            return parse_options(values, target_options=self.options_type, target_name=self.name)
        except OptionsError as err:
            if isinstance(values, Options) or not values:
                raise
            known = set(known_keys(Options)) | set(known_keys(self.options_type))
            hint = options_elsewhere([k for k in values if k not in known], besides=self.name)
            if not hint:
                raise
            raise OptionsError(f"{err} ({hint})") from None

    def check_spec(self, spec: ChipSpec) -> None:
        """Raise `TargetError` if this target cannot generate code for ``spec``. Default: accept."""

    def planning_spec(self, spec: ChipSpec, options: Options) -> ChipSpec:
        """The spec this target's contractions are planned with under ``options``: ``spec`` less what the
        target cannot, or is told not to, use (the cpu target leaves out the matrix units it does not lower
        for the spec's machine code and its ``amx`` option). `explain` shows those plans. Default: ``spec``."""
        return spec

    @abc.abstractmethod
    def stages(self, spec: ChipSpec, options: Options) -> Sequence[Stage]:
        """The target's stages, run after the core's. The last one must produce an `Artifact`."""

    @abc.abstractmethod
    def load(self, artifact: Artifact, spec: ChipSpec) -> Executable:
        """Load a compiled artifact for execution. Raise `DeviceUnavailableError` without the device."""

    def supported_ops(self) -> frozenset[str] | None:
        """Names of pbsdk ops this target handles, or None for "everything the core lowers"."""
        return None

    def emulate(self, text: str, spec: ChipSpec, options: Options) -> Callable[..., Any] | None:
        """Where the device is missing: the target's own schedule of ``text`` (linalg on tensors) run on
        the host, as a callable of numpy arrays returning numpy arrays, or None when the target cannot
        (the default). Conformance uses it to check tiling and staging numerically without the device."""
        return None


@dataclasses.dataclass(frozen=True)
class TargetInfo:
    """One discovered entry point: its target class, or why it could not be loaded."""

    name: str
    value: str  # "module:attr" as written in the entry point
    distribution: str | None
    cls: type[Target] | None
    error: str | None


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def _load_entry_point(ep: importlib.metadata.EntryPoint) -> TargetInfo:
    dist = getattr(getattr(ep, "dist", None), "name", None)
    try:
        obj = ep.load()
    except Exception as exc:  # noqa: BLE001 - a broken plugin must not take the others down
        return TargetInfo(ep.name, ep.value, dist, None, f"import failed: {type(exc).__name__}: {exc}")
    if not (isinstance(obj, type) and issubclass(obj, Target)):
        return TargetInfo(ep.name, ep.value, dist, None, f"{ep.value} is not a pbsdk Target subclass")
    if getattr(obj, "name", None) != ep.name:
        return TargetInfo(
            ep.name, ep.value, dist, None,
            f"entry point '{ep.name}' names class {obj.__name__} whose name is {getattr(obj, 'name', None)!r}",
        )
    if obj.api_version != API_VERSION:
        return TargetInfo(
            ep.name, ep.value, dist, None,
            f"written for target API {obj.api_version}, this pbsdk provides API {API_VERSION}",
        )
    try:
        obj.implemented_hooks()  # a misspelt hook or a wrong signature: unusable, with the reason
    except TargetError as exc:
        return TargetInfo(ep.name, ep.value, dist, None, str(exc).removeprefix(f"target '{ep.name}': "))
    except Exception as exc:  # noqa: BLE001 - as for an import failure
        return TargetInfo(ep.name, ep.value, dist, None, f"checking its hooks failed: {type(exc).__name__}: {exc}")
    return TargetInfo(ep.name, ep.value, dist, obj, None)


def discover(*, entry_points: Callable[[], list[importlib.metadata.EntryPoint]] | None = None) -> list[TargetInfo]:
    """Load every entry point of the ``pbsdk.targets`` group; never raises for a broken plugin.

    Two entry points with one name (from different distributions or values) are reported on both
    entries as a clash; `get_target` refuses such a name.
    """
    eps = (entry_points or _entry_points)()
    # importlib.metadata can list the same distribution twice (e.g. an editable install seen through
    # two sys.path entries); identical (name, value) pairs are one plugin, not a clash.
    unique: dict[tuple[str, str], importlib.metadata.EntryPoint] = {}
    for ep in eps:
        unique.setdefault((ep.name, ep.value), ep)
    by_name: dict[str, list[importlib.metadata.EntryPoint]] = {}
    for ep in unique.values():
        by_name.setdefault(ep.name, []).append(ep)
    infos: list[TargetInfo] = []
    for name in sorted(by_name):
        group = by_name[name]
        if len(group) > 1:
            where = ", ".join(f"{e.value} ({getattr(getattr(e, 'dist', None), 'name', '?')})" for e in group)
            infos.append(TargetInfo(name, group[0].value, None, None, f"name clash: '{name}' is registered by {where}"))
            continue
        infos.append(_load_entry_point(group[0]))
    return infos


def options_elsewhere(keys: Sequence[str], *, besides: str | None = None) -> str:
    """Which installed targets (other than ``besides``) take each of ``keys`` as an option of their own, as
    text for an unknown-option error (``"'pack' is an option of target 'cpu'"``; empty when none does).
    Loads the installed targets (`discover`): for error messages only."""
    parts = []
    infos = [i for i in discover() if i.cls is not None and i.name != besides]
    for key in keys:
        owners = [i.name for i in infos if i.cls is not None and key in known_keys(i.cls.options_type)]
        if owners:
            parts.append(f"'{key}' is an option of target{'s' if len(owners) > 1 else ''} "
                         f"{', '.join(repr(o) for o in owners)}")
    return "; ".join(parts)


_cache: dict[str, Target] = {}


def get_target(name: str | Target) -> Target:
    """The target instance for ``name``, found through entry points. Raises `TargetError` with the known
    names, or with the reason a plugin could not be loaded."""
    if isinstance(name, Target):
        return name
    if name in _cache:
        return _cache[name]
    infos = {i.name: i for i in discover()}
    info = infos.get(name)
    if info is None:
        known = ", ".join(sorted(i for i in infos)) or "none"
        raise TargetError(f"unknown target '{name}' (installed targets: {known})")
    if info.cls is None:
        raise TargetError(f"target '{name}' cannot be used: {info.error}")
    target = info.cls()
    _cache[name] = target
    return target
