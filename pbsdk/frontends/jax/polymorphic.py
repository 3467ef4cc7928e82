"""Shape polymorphism for ``pbsdk.jax.jit(fn, polymorphic_shapes=...)``: a function traced once with symbolic
dimensions, as ``jax.export`` does, and compiled to one kernel set for every value of them.

``polymorphic_shapes`` takes ``jax.export.symbolic_args_specs``'s ``shapes_specs`` (jax2tf's
``polymorphic_shapes``): None, one string for every positional argument, or one entry per positional
argument (a string such as ``"(b, 768)"``, ``"(b, _)"``, ``"b, ..."``, or None for static shapes; a pytree
prefix of the argument). ``_`` and ``...`` take the first call's sizes. Keyword arguments and
``static_argnums`` arguments keep static shapes. Here: the call's leaves as ``jax.ShapeDtypeStruct``s with
those symbolic dimensions (`symbolic_leaves`), their shapes as `pbsdk.core.dims` forms (`declared_shapes`), a
call's symbol values from its inputs (`bind_call`) and the XLA side of a symbolic plan (`export_stage`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax import export as jax_export

from pbsdk.core import dims
from pbsdk.core.dims import Dim
from pbsdk.core.errors import ArgumentError, PbsdkError, UnsupportedError
from pbsdk.frontends.jax.convert import as_dim

log = logging.getLogger("pbsdk.jax")


def check_spec(polymorphic_shapes: Any) -> Any:
    """``polymorphic_shapes`` as given to `pbsdk.jax.jit`, checked for its form (the strings are parsed by
    JAX at the first call, which sees the arguments)."""
    if polymorphic_shapes is None or isinstance(polymorphic_shapes, str):
        return polymorphic_shapes
    if isinstance(polymorphic_shapes, (list, tuple)):
        return tuple(polymorphic_shapes)
    raise PbsdkError("pbsdk.jax.jit: polymorphic_shapes must be None, a string or a sequence with one entry per "
                     f"positional argument, got {type(polymorphic_shapes).__name__}")


def symbolic_leaves(spec: Any, args: Sequence[Any], kwargs: Mapping[str, Any], static_argnums: Sequence[int],
                    leaves: Sequence[Any], *, what: str) -> list[Any]:
    """The call's traced leaves (``leaves``: those of ``(dynamic args, kwargs)``, in that order) as
    ``jax.ShapeDtypeStruct``s whose shapes hold the symbolic dimensions ``spec`` gives (one scope for all),
    dtypes and weak types as the call's. A spec JAX cannot parse or apply is an `ArgumentError`."""
    static = set(static_argnums)
    dynamic = tuple(a for i, a in enumerate(args) if i not in static)
    if spec is None or isinstance(spec, str):
        dyn_spec: Any = spec
    else:
        if len(spec) != len(args):
            raise ArgumentError(f"{what}: polymorphic_shapes has {len(spec)} entries for {len(args)} positional "
                                "arguments (one each, None for a static one)")
        if any(spec[i] is not None for i in static if i < len(spec)):
            raise ArgumentError(f"{what}: polymorphic_shapes gives a shape for a static argument")
        dyn_spec = [s for i, s in enumerate(spec) if i not in static]
    try:
        specs = jax_export.symbolic_args_specs(dynamic, dyn_spec)
    except Exception as exc:  # noqa: BLE001 - JAX's parse or pytree-matching error, whatever its type
        raise ArgumentError(f"{what}: polymorphic_shapes {spec!r}: {type(exc).__name__}: {exc}") from None
    sym_leaves = jax.tree_util.tree_leaves(specs) + [None] * len(jax.tree_util.tree_leaves(kwargs))
    if len(sym_leaves) != len(leaves):
        raise ArgumentError(f"{what}: polymorphic_shapes {spec!r} does not match the arguments' structure")
    out = []
    for sym, leaf in zip(sym_leaves, leaves):
        aval = jax.typeof(leaf)
        shape = aval.shape if sym is None else sym.shape
        out.append(jax.ShapeDtypeStruct(shape, aval.dtype, weak_type=aval.weak_type))
    return out


def declared_shapes(specs: Sequence[Any]) -> list[tuple[int | str, ...]]:
    """The leaves' shapes as `pbsdk.core.dims` declares them: ints, and each symbolic size as its `Dim`
    form (``"b"``, ``"2*b + 1"``). A size that is no such form (`convert.as_dim`), or a variable no leaf
    has as a whole dimension (only ``2*b``), is an `UnsupportedError`: the call cannot bind it the way the
    kernels read it."""
    shapes: list[tuple[int | str, ...]] = []
    lone: set[str] = set()
    named: set[str] = set()
    for s in specs:
        shape: list[int | str] = []
        for d in s.shape:
            form = as_dim(d)
            if isinstance(form, Dim):
                named.update(form.symbols)
                if form.const == 0 and form.coeffs and len(form.coeffs) == 1 and form.coeffs[0][1] == 1:
                    lone.update(form.symbols)
                shape.append(str(form))
            else:
                shape.append(form)
        shapes.append(tuple(shape))
    if named - lone:
        raise UnsupportedError(f"dimension variable(s) {', '.join(sorted(named - lone))} are no argument's whole "
                               "dimension")
    return shapes


def bind_call(declared: Sequence[Sequence[int | str]], leaves: Sequence[Any], *, what: str) -> dict[str, int]:
    """The dimension variables' values in a call with ``leaves``: a variable met twice must have one value,
    and every static size must be the declared one (an `ArgumentError` naming the flattened argument)."""
    return dims.bind(declared, [np.shape(x) for x in leaves], what=what)


def symbols_of(specs: Sequence[Any]) -> dict[str, Any]:
    """Each dimension variable of the leaves' shapes, as JAX's lone symbolic dimension (in their scope)."""
    found: dict[str, Any] = {}
    for s in specs:
        for d in s.shape:
            if jax_export.is_symbolic_dim(d):
                for name in sorted(d.get_vars()):
                    if name not in found:
                        found[name] = jax_export.symbolic_shape(name, scope=d.scope)[0]
    return found


def export_stage(evaluate: Callable[..., list[Any]], in_avals: Sequence[Any],
                 symbols: Mapping[str, Any]) -> tuple[Callable[..., Any], tuple[str, ...]]:
    """An XLA stage of a symbolic plan: its equations (``evaluate``) exported once with symbolic input
    shapes (``jax.export``, as the shape-polymorphism docs do), and the ``jax.jit`` of the exported
    function's ``call``, which XLA compiles once per concrete shape it meets. Returns that function and the
    dimension variables that need a carrier argument: where some equation's sizes name a variable that no
    input of the stage has (an ``iota`` of the batch's length), the stage takes one ``int8`` vector of that
    length per variable (`XlaStage.run` passes them). Raises what ``jax.export`` raises when it cannot."""
    specs = [jax.ShapeDtypeStruct(a.shape, a.dtype, weak_type=getattr(a, "weak_type", False)) for a in in_avals]
    try:
        exported = jax_export.export(jax.jit(evaluate))(*specs)
        return jax.jit(exported.call), ()
    except Exception as exc:  # noqa: BLE001 - e.g. a variable that is not solvable from the inputs
        log.debug("pbsdk: an XLA stage exports with carriers of its sizes: %s: %s", type(exc).__name__, exc)
    carriers = tuple(sorted(symbols))
    n = len(specs)

    def with_carriers(*values: Any) -> list[Any]:
        return evaluate(*values[:n])

    specs += [jax.ShapeDtypeStruct((symbols[s],), np.int8) for s in carriers]
    exported = jax_export.export(jax.jit(with_carriers))(*specs)
    return jax.jit(exported.call), carriers


__all__ = ["bind_call", "check_spec", "declared_shapes", "export_stage", "symbolic_leaves", "symbols_of"]
