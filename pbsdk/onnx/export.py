"""The real models of `pbsdk.testing.real_models` (torchvision and transformers definitions, random weights,
nothing downloaded) exported to ONNX with ``torch.onnx.export``, for the import tests and
benchmarks/onnx_models.py.

The exporter: torch 2.13's default (``dynamo=True``) needs onnxscript, which the project does not install,
so this uses the TorchScript exporter (``dynamo=False``), opset 17, static shapes. Two transformers 4.57
paths do not trace with it, and are replaced during the export only (`_exportable_masks`):

- attention masks are built with ``torch.vmap`` (``RuntimeError: unordered_map::at``): the mask function
  is called on broadcast (b, h, q, kv) index vectors instead, which gives the same mask for the causal and
  padding mask functions these models use;
- without an attention mask (GPT-2, Llama) transformers looks for packed sequences in the position ids
  with ``aten::diff``, which does not export: the position ids of these calls are ``arange(seq)``, one
  sequence, so the search is skipped (it would find none).

transformers 5 builds masks by broadcasting already (only what a version has is replaced), and calls
``scaled_dot_product_attention`` with ``enable_gqa``, which the exporter does not convert: the key and value
heads are repeated to the query's during the export instead (`_gqa_expanded`).
"""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pbsdk.core.errors import PbsdkError


def input_names(name: str) -> tuple[str, ...]:
    """The ONNX input names of model ``name`` (of `pbsdk.testing.real_models.MODELS`)."""
    from pbsdk.testing.real_models import MODELS

    family = _model(name, MODELS).family
    return {"cnn": ("x",), "vit": ("x",), "bert": ("input_ids", "attention_mask")}.get(family, ("input_ids",))


def _model(name: str, models: Any) -> Any:
    if name not in models:
        raise PbsdkError(f"unknown model {name!r} (known: {', '.join(models)})")
    return models[name]


def build(name: str, *, batch: int = 1) -> tuple[Any, dict[str, np.ndarray]]:
    """The torch module (eval mode, seeded random weights) and its example inputs as numpy, by ONNX input name."""
    from pbsdk.testing.real_models import MODELS

    model, inputs = _model(name, MODELS).build(batch)
    return model, {n: t.numpy() for n, t in zip(input_names(name), inputs)}


def inputs_of(name: str, *, batch: int = 1) -> dict[str, np.ndarray]:
    """The example inputs of ``name`` (the factory's seeded ones) by ONNX input name."""
    return build(name, batch=batch)[1]


@contextlib.contextmanager
def _exportable_masks() -> Iterator[None]:
    """transformers' vmap mask builder replaced by broadcasting, and the packed-sequence search skipped."""
    try:
        from transformers import masking_utils
    except ImportError:
        yield
        return

    def broadcast(mask_function: Callable[..., Any], bh_indices: bool = True) -> Callable[..., Any]:
        def fn(b: Any, h: Any, q: Any, kv: Any) -> Any:
            if not bh_indices:
                return mask_function(None, None, q[:, None], kv[None, :])
            out = mask_function(b[:, None, None, None], h[None, :, None, None], q[None, None, :, None],
                                kv[None, None, None, :])
            return out.expand(b.shape[0], h.shape[0], q.shape[0], kv.shape[0])
        return fn

    def no_packed_sequences(position_ids: Any) -> None:
        return None

    # plain tensor indexing: the index transform exists for vmap, and the exporter cannot trace it either.
    # transformers 5 builds masks by broadcasting already (its vmap builder is only for custom patterns and
    # has another name): only what this version has is replaced.
    replacements = {"_vmap_for_bhqkv": broadcast, "TransformGetItemToIndex": contextlib.nullcontext,
                    "find_packed_sequence_indices": no_packed_sequences}
    replacements = {n: v for n, v in replacements.items() if hasattr(masking_utils, n)}
    real = {n: getattr(masking_utils, n) for n in replacements}
    for n, v in replacements.items():
        setattr(masking_utils, n, v)
    try:
        yield
    finally:
        for n, v in real.items():
            setattr(masking_utils, n, v)


@contextlib.contextmanager
def _mha_fastpath_off(torch: Any) -> Iterator[None]:
    """``nn.MultiheadAttention`` (torchvision's ViT) without its inference fast path, whose fused
    ``aten::_native_multi_head_attention`` has no ONNX export: the module's own matmuls and softmax instead."""
    was = torch.backends.mha.get_fastpath_enabled()
    torch.backends.mha.set_fastpath_enabled(False)
    try:
        yield
    finally:
        torch.backends.mha.set_fastpath_enabled(was)


@contextlib.contextmanager
def _gqa_expanded(torch: Any) -> Iterator[None]:
    """``scaled_dot_product_attention(..., enable_gqa=True)`` (transformers 5's Llama with fewer key/value
    heads than query heads), which the TorchScript exporter does not convert, called with the key and value
    heads repeated to the query's instead: the same attention."""
    functional = torch.nn.functional
    real = functional.scaled_dot_product_attention

    def sdpa(query: Any, key: Any, value: Any, *args: Any, enable_gqa: bool = False, **kwargs: Any) -> Any:
        if enable_gqa and key.shape[-3] != query.shape[-3]:
            groups = query.shape[-3] // key.shape[-3]
            key, value = key.repeat_interleave(groups, dim=-3), value.repeat_interleave(groups, dim=-3)
        return real(query, key, value, *args, **kwargs)

    functional.scaled_dot_product_attention = sdpa
    try:
        yield
    finally:
        functional.scaled_dot_product_attention = real


def export_module(module: Any, inputs: dict[str, np.ndarray], *, opset: int = 17,
                  dynamic_axes: dict[str, dict[int, str]] | None = None) -> bytes:
    """The serialized ONNX model of ``module`` called on ``inputs`` (positionally, named as given), one output
    named ``out``: static shapes, or with ``dynamic_axes`` (input or output name -> {axis: dim_param}) those
    dimensions symbolic (``dim_param``s). Initializers are stored as binary tensors in the protobuf."""
    import torch

    args = tuple(torch.from_numpy(v) for v in inputs.values())
    buf: Any = io.BytesIO()
    with (warnings.catch_warnings(), torch.no_grad(), _exportable_masks(), _mha_fastpath_off(torch),
          _gqa_expanded(torch)):
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, input_names=list(inputs), output_names=["out"], opset_version=opset,
                          dynamo=False, dynamic_axes=dynamic_axes)
    return buf.getvalue()


#: The dimensions a transformer's inputs and output vary in, as ``dim_param``s (`export`'s ``dynamic``).
TEXT_AXES = {0: "batch", 1: "seq"}


def export(name: str, *, batch: int = 1, opset: int = 17, dynamic: bool = False) -> bytes:
    """The serialized ONNX model of real model ``name`` (`pbsdk.testing.real_models.MODELS`); ``dynamic``:
    a text model's batch and sequence length as the ``dim_param``s ``batch`` and ``seq`` (`TEXT_AXES`)."""
    model, inputs = build(name, batch=batch)
    axes = {n: dict(TEXT_AXES) for n in (*inputs, "out")} if dynamic else None
    return export_module(model, inputs, opset=opset, dynamic_axes=axes)
