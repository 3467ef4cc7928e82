"""The official ONNX node tests (``onnx.backend.test``, one small model per operator and attribute variant,
with reference inputs and outputs) through `pbsdk.onnx.Backend` on each selected target: ``--pbsdk-target
NAME`` or ``PBSDK_ONNX_TARGETS``, default ``cpu,template`` (tests/onnx/conftest.py).

The cases run are those whose every op pbsdk converts (`pbsdk.onnx.nodesuite.select`): by default those of
the exported models' ops, the long tail with ``--runslow``. A variant a converter refuses with a typed
`UnsupportedError` is skipped with that error as the reason. ``PBSDK_ONNX_REPORT=path.json`` writes
passed/failed/skipped per operator (docs/onnx.md).
"""

from __future__ import annotations

import os
import unittest
from typing import Any

import numpy as np
import pytest

pytest.importorskip("onnx")

import onnx.backend.test

from pbsdk.core.errors import UnsupportedError
from pbsdk.onnx.backend import Backend, BackendRep
from pbsdk.onnx.nodesuite import MODEL_OPS, official_selection

SELECTION = official_selection()
TARGETS = [t for t in os.environ.get("PBSDK_ONNX_TARGETS", "cpu,template").split(",") if t]


def _skipping(backend: type[Backend]) -> type[Backend]:
    """The backend, with a typed refusal (an op variant pbsdk does not support) turned into a skip."""
    class SkippingRep(BackendRep):
        def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
            try:  # a model specialised on its shape inputs compiles (and may refuse a variant) when run
                return super().run(inputs, **kwargs)
            except UnsupportedError as exc:
                raise unittest.SkipTest(f"unsupported: {exc}") from None

    class Skipping(backend):  # type: ignore[valid-type,misc]
        @classmethod
        def prepare(cls, model: Any, device: str = "CPU", **kwargs: Any) -> Any:
            try:
                return SkippingRep(super().prepare(model, device, **kwargs).model)
            except UnsupportedError as exc:
                raise unittest.SkipTest(f"unsupported: {exc}") from None
    return Skipping


class _NodeTests(onnx.backend.test.BackendTest):
    """The official runner, with float16 outputs compared at two float16 ulps of relative tolerance, as it
    already compares bfloat16 ones at two bfloat16 ulps: the expected outputs come from numpy rounding every
    step to float16, and a kernel that keeps f32 partial results differs from them by an ulp while being
    closer to the exact result (the f16 Attention cases on the template target: max error 3.0e-4 against
    the float64 result, the reference's own 4.7e-4)."""

    @classmethod
    def assert_similar_outputs(cls, ref_outputs: Any, outputs: Any, rtol: float, atol: float,
                               model_dir: str | None = None) -> None:
        if any(getattr(r, "dtype", None) == np.float16 for r in ref_outputs):
            rtol = max(rtol, 2**-9)
        super().assert_similar_outputs(ref_outputs, outputs, rtol, atol, model_dir=model_dir)


_core = {n for n in SELECTION.run if SELECTION.op_of[n] in MODEL_OPS and "_expanded" not in n}
for _target in TARGETS:
    _suite = _NodeTests(_skipping(Backend.for_target(_target)), __name__)
    _all = vars(_suite.test_cases["OnnxBackendNodeModelTest"])
    # only the selected cases, on the host device (the runner would list every other case as skipped); the
    # cases of the exported models' ops (not their function expansions) by default, the long tail with --runslow
    # (not even collected without it, so the default run does not list hundreds of skips)
    _groups = [("", _core)] + ([("LongTail", set(SELECTION.run) - _core)] if os.environ.get("PBSDK_ONNX_LONG_TAIL")
                               else [])
    for _label, _names in _groups:
        _cls = type(f"TestOnnxNode{_label}_{_target}", (unittest.TestCase,),
                    {f"{n}_cpu": _all[f"{n}_cpu"] for n in sorted(_names)})
        _cls.__module__ = __name__
        globals()[_cls.__name__] = pytest.mark.slow(_cls) if _label else _cls
del _suite, _all, _cls
