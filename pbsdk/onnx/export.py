"""Small real models exported to ONNX with ``torch.onnx.export`` (random weights; nothing downloaded), for
the import tests and benchmarks/onnx_models.py: resnet18 (torchvision) at 64x64, 2-layer GPT-2 and BERT
(transformers configs). Uses the TorchScript exporter (``dynamo=False``): the dynamo exporter needs
onnxscript, which the project does not install. transformers 4.57 builds attention masks with
``torch.vmap``, which that exporter cannot trace (``RuntimeError: unordered_map::at``); during the export
the mask is built by broadcasting the index vectors with plain indexing instead (`_broadcast_masks`), which gives the same mask
for the causal and padding mask functions these models use."""

from __future__ import annotations

import contextlib
import io
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from pbsdk.core.errors import PbsdkError

#: name -> (builder of (module, example inputs as numpy), input names)
MODELS = ("resnet18", "gpt2", "bert")


def build(name: str, *, batch: int = 1, seq: int = 32) -> tuple[Any, dict[str, np.ndarray]]:
    """The torch module (eval mode, seeded random weights) and numpy inputs by name."""
    import torch

    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    if name == "resnet18":
        from pbsdk.testing.torchvision import import_torchvision

        tv = import_torchvision()
        model = tv.models.resnet18(weights=None, num_classes=100).eval()
        return model, {"x": rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)}
    from pbsdk.testing.torchvision import import_torchvision

    import_torchvision()  # transformers imports torchvision when it is installed
    import transformers

    cfg: Any
    if name == "gpt2":
        cfg = transformers.GPT2Config(n_layer=2, n_head=4, n_embd=128, vocab_size=1000, n_positions=128)
        model = transformers.GPT2Model(cfg).eval()
    elif name == "bert":
        cfg = transformers.BertConfig(num_hidden_layers=2, num_attention_heads=4, hidden_size=128,
                                      intermediate_size=512, vocab_size=1000, max_position_embeddings=128)
        model = transformers.BertModel(cfg, add_pooling_layer=False).eval()
    else:
        raise PbsdkError(f"unknown model {name!r} (known: {', '.join(MODELS)})")
    model.config.use_cache = False
    model.config.return_dict = False
    return model, {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64)}


@contextlib.contextmanager
def _broadcast_masks() -> Iterator[None]:
    """transformers' ``_vmap_for_bhqkv`` replaced by broadcasting (b, h, q, kv) index vectors."""
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

    names = ("_vmap_for_bhqkv", "TransformGetItemToIndex")
    real = [getattr(masking_utils, n) for n in names]
    # plain tensor indexing: the index transform exists for vmap, and the exporter cannot trace it either
    for n, v in zip(names, (broadcast, contextlib.nullcontext)):
        setattr(masking_utils, n, v)
    try:
        yield
    finally:
        for n, v in zip(names, real):
            setattr(masking_utils, n, v)


def export(name: str, *, batch: int = 1, seq: int = 32, opset: int = 17) -> bytes:
    """The serialized ONNX model of ``build(name)``, static shapes."""
    import torch

    model, inputs = build(name, batch=batch, seq=seq)
    args = tuple(torch.from_numpy(v) for v in inputs.values())
    fn: Any = model
    if name != "resnet18":
        class First(torch.nn.Module):  # the last hidden state alone
            def __init__(self) -> None:
                super().__init__()
                self.inner = model

            def forward(self, ids: Any) -> Any:
                # an explicit all-ones mask: without one, transformers looks for packed sequences in the
                # position ids with aten::diff, which the exporter cannot export
                return self.inner(input_ids=ids, attention_mask=torch.ones_like(ids))[0]
        fn = First().eval()
    buf: Any = io.BytesIO()
    with warnings.catch_warnings(), torch.no_grad(), _broadcast_masks():
        warnings.simplefilter("ignore")
        torch.onnx.export(fn, args, buf, input_names=list(inputs), output_names=["out"], opset_version=opset,
                          dynamo=False)
    return buf.getvalue()


def inputs_of(name: str, *, batch: int = 1, seq: int = 32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    if name == "resnet18":
        return {"x": rng.standard_normal((batch, 3, 64, 64)).astype(np.float32)}
    return {"input_ids": rng.integers(0, 1000, (batch, seq)).astype(np.int64)}
