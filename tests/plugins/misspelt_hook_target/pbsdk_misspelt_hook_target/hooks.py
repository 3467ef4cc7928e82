"""Hooks of the test plugin 'misspelt': ``matrix_unit_opp`` is meant to be ``matrix_unit_op``."""

from __future__ import annotations

from mlir import ir

from pbsdk.core.hooks import DmaCopy, UnitOp
from pbsdk.core.spec import ChipSpec
from pbsdk.targets.template import hooks as emulated

__pbsdk_helpers__ = ("tile_bytes",)


def matrix_unit_opp(op: UnitOp, a: ir.Value, b: ir.Value, c: ir.Value, spec: ChipSpec) -> None:
    emulated.matrix_unit_op(op, a, b, c, spec)


def dma_copy(copy: DmaCopy, src: ir.Value, dst: ir.Value, spec: ChipSpec) -> None:
    emulated.dma_copy(copy, src, dst, spec)


def tile_bytes(copy: DmaCopy) -> ir.Value:
    """A public helper, declared in ``__pbsdk_helpers__``: not a hook, and not an error."""
    return copy.byte_count()
