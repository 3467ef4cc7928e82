"""Real models from their *definitions*, with random weights and nothing downloaded (issue #15, item 3).

Each `RealModel` builds (eager model in eval mode, example inputs) for a batch size, with a fixed seed:

=====================  ==========================================================================
family                 models (full size; ``*_small`` are tiny configs of the same definition)
=====================  ==========================================================================
torchvision CNN        ``resnet18``, ``resnet50``, ``mobilenet_v3_small`` (224x224 RGB images);
                       small: ``resnet_small`` (ResNet of 1 BasicBlock per stage, 64x64 images)
torchvision ViT        ``vit_b_16`` (224x224, 16x16 patches); small: ``vit_small`` (32x32, 2 layers)
Hugging Face BERT      ``bert_base`` (``BertConfig()``: 12 layers, d 768, seq 128);
                       small: ``bert_small`` (2 layers, d 64, seq 16)
Hugging Face GPT-2     ``gpt2`` (``GPT2Config()``: 12 layers, d 768, 124M parameters, seq 128);
                       small: ``gpt2_small`` (2 layers, d 64, seq 16)
Llama-style            ``llama`` (4 layers, d 512, 8 heads with 2 key/value heads (GQA), RoPE,
                       RMSNorm, SwiGLU, seq 128); small: ``llama_small`` (2 layers, d 64, 4/2 heads)
=====================  ==========================================================================

The transformers models use ``attn_implementation="sdpa"`` (pbsdk fuses the SDPA pattern into one
attention kernel), ``use_cache=False`` and return one tensor (the logits, or BERT's last hidden state)
through `_first_output`. Token ids are drawn from the vocabulary with the same seed; BERT gets an
attention mask of ones (no padding) as a real call does.

Needs the ``models`` extra (torchvision, transformers); importing this module imports neither.
Core never imports it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

SEED = 0
IMAGE = 224      # image side of the full-size vision models
SEQ = 128        # sequence length of the full-size language models


@dataclasses.dataclass(frozen=True)
class RealModel:
    """One model of the tier: ``build(batch)`` -> (eval-mode model, tuple of example inputs)."""

    name: str
    family: str       # "cnn" | "vit" | "bert" | "gpt2" | "llama"
    small: bool       # a tiny config for the default test run
    shape: str        # the input, in words (for tables)
    make: Callable[[int], tuple[Any, tuple[Any, ...]]]

    def build(self, batch: int) -> tuple[Any, tuple[Any, ...]]:
        import torch

        torch.manual_seed(SEED)
        model, inputs = self.make(batch)
        return model.eval(), inputs


def _first_output(model: Any) -> Any:
    """Wrap a transformers model so that it returns its first output as one tensor."""
    from torch import nn

    class FirstOutput(nn.Module):
        def __init__(self, inner: nn.Module) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, *args: Any) -> Any:
            return self.inner(*args, return_dict=False)[0]

    return FirstOutput(model)


def _vision(builder: str, side: int, **kwargs: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    def make(batch: int) -> tuple[Any, tuple[Any, ...]]:
        import torch

        from pbsdk.testing.torchvision import import_torchvision

        tv = import_torchvision()
        model = getattr(tv.models, builder)(weights=None, **kwargs)
        _randomise_norms(model)
        _randomise_head(model)
        return model, (torch.randn(batch, 3, side, side),)

    return make


def _randomise_norms(model: Any) -> None:
    """Give batch norms non-trivial running statistics (fresh ones are 0/1: an identity would hide bugs)."""
    import torch
    from torch import nn

    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d) and m.running_mean is not None and m.running_var is not None:
            with torch.no_grad():
                m.running_mean.uniform_(-0.1, 0.1)
                m.running_var.uniform_(0.5, 1.5)


def _randomise_head(model: Any) -> None:
    """torchvision's ViT starts its classifier at zero (every output 0: a test could not fail)."""
    import torch

    head = getattr(getattr(model, "heads", None), "head", None)
    if head is not None:
        with torch.no_grad():
            torch.nn.init.normal_(head.weight, std=0.02)
            torch.nn.init.normal_(head.bias, std=0.02)


def _resnet_small(batch: int) -> tuple[Any, tuple[Any, ...]]:
    import torch

    from pbsdk.testing.torchvision import import_torchvision

    tv = import_torchvision()
    from torchvision.models.resnet import BasicBlock, ResNet

    assert tv is not None
    model = ResNet(BasicBlock, [1, 1, 1, 1], num_classes=10, width_per_group=64)
    _randomise_norms(model)
    return model, (torch.randn(batch, 3, 64, 64),)


def _vit_small(batch: int) -> tuple[Any, tuple[Any, ...]]:
    import torch

    from pbsdk.testing.torchvision import import_torchvision

    import_torchvision()
    from torchvision.models.vision_transformer import VisionTransformer

    model = VisionTransformer(image_size=32, patch_size=8, num_layers=2, num_heads=4, hidden_dim=64,
                              mlp_dim=128, num_classes=10)
    _randomise_head(model)
    return model, (torch.randn(batch, 3, 32, 32),)


def _transformers() -> ModuleType:
    """``transformers``, imported after `import_torchvision`: transformers imports torchvision when it is
    installed, and the CPU-torch + CUDA-torchvision pair fails that import (see pbsdk.testing.torchvision)."""
    from pbsdk.testing.torchvision import import_torchvision

    try:
        import_torchvision()
    except ImportError:  # no torchvision: transformers does not need it
        pass
    import transformers

    return transformers


def _ids(batch: int, seq: int, vocab: int) -> Any:
    import torch

    return torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(SEED))


def _bert(seq: int, **config: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    def make(batch: int) -> tuple[Any, tuple[Any, ...]]:
        import torch
        t = _transformers()
        BertConfig, BertModel = t.BertConfig, t.BertModel

        cfg = BertConfig(attn_implementation="sdpa", **config)
        model = _first_output(BertModel(cfg, add_pooling_layer=False))
        ids = _ids(batch, seq, cfg.vocab_size)
        return model, (ids, torch.ones(batch, seq, dtype=torch.long))

    return make


def _causal_lm(config: str, model: str, seq: int, **fields: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    """A transformers causal LM (``config``/``model`` class names, e.g. GPT2Config/GPT2LMHeadModel) with
    SDPA attention and no KV cache, returning its logits for ``seq`` random token ids."""
    def make(batch: int) -> tuple[Any, tuple[Any, ...]]:
        t = _transformers()
        cfg = getattr(t, config)(attn_implementation="sdpa", use_cache=False, **fields)
        return _first_output(getattr(t, model)(cfg)), (_ids(batch, seq, cfg.vocab_size),)

    return make


def _gpt2(seq: int, **fields: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    return _causal_lm("GPT2Config", "GPT2LMHeadModel", seq, **fields)


def _llama(seq: int, **fields: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    return _causal_lm("LlamaConfig", "LlamaForCausalLM", seq, **fields)


_LLAMA = {"vocab_size": 32000, "hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 1024}
_LLAMA_SMALL = {"vocab_size": 256, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2,
                "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
_TINY_TEXT = {"vocab_size": 256, "num_hidden_layers": 2, "num_attention_heads": 4}

MODELS: dict[str, RealModel] = {m.name: m for m in (
    RealModel("resnet18", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("resnet18", IMAGE)),
    RealModel("resnet50", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("resnet50", IMAGE)),
    RealModel("mobilenet_v3_small", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("mobilenet_v3_small", IMAGE)),
    RealModel("vit_b_16", "vit", False, f"3x{IMAGE}x{IMAGE}", _vision("vit_b_16", IMAGE)),
    RealModel("bert_base", "bert", False, f"seq {SEQ}", _bert(SEQ)),
    RealModel("gpt2", "gpt2", False, f"seq {SEQ}", _gpt2(SEQ)),
    RealModel("llama", "llama", False, f"seq {SEQ}", _llama(SEQ, **_LLAMA)),
    RealModel("resnet_small", "cnn", True, "3x64x64", _resnet_small),
    RealModel("vit_small", "vit", True, "3x32x32", _vit_small),
    RealModel("bert_small", "bert", True, "seq 16",
              _bert(16, hidden_size=64, intermediate_size=128, max_position_embeddings=64, **_TINY_TEXT)),
    RealModel("gpt2_small", "gpt2", True, "seq 16",
              _gpt2(16, n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=256)),
    RealModel("llama_small", "llama", True, "seq 16", _llama(16, **_LLAMA_SMALL)),
)}

FULL = tuple(n for n, m in MODELS.items() if not m.small)
SMALL = tuple(n for n, m in MODELS.items() if m.small)


#: Families whose every layer's attention must run as one fused kernel (issue #15: the transformers'
#: causal masks are proven causal by folding them; BERT's padding mask is a kernel input).
FUSED_FAMILIES = ("bert", "gpt2", "llama")


def assert_fully_compiled(reports: Sequence[Any], model: RealModel, built: Any) -> None:
    """The torch backend's ``reports`` of one compiled ``model`` (``built``: the module it built): something
    compiled, no op or partition left to torch, every graph frozen, and, for a family whose attention fuses,
    one fused attention per layer."""
    assert reports, "nothing was compiled by pbsdk"
    for report in reports:
        assert report.fallback_ops == (), report
        assert report.failed_partitions == 0, report
        assert report.compiled_ops == report.graph_ops and report.frozen, report
    if model.family in FUSED_FAMILIES:
        layers = built.inner.config.num_hidden_layers
        assert sum(r.fused_attention for r in reports) == layers, reports
