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

Issue #32's ten more architectures, each from its library's default constructor or config (224x224 images,
128-token sequences):

=====================  ==========================================================================
family                 models
=====================  ==========================================================================
torchvision CNN        ``regnet_y_400mf`` (grouped convs, squeeze-excite), ``convnext_tiny`` (7x7
                       depthwise, LayerNorm, layer scale), ``efficientnet_b0``, ``mobilenet_v2``,
                       ``shufflenet_v2_x1_0`` (channel shuffle)
vision transformers    ``swin_t`` (torchvision: shifted windows, relative position bias),
                       ``clip_vit_b_32`` (``CLIPVisionConfig()``: ViT-B/32, 12 layers, quick-GELU)
encoders               ``distilbert`` (``DistilBertConfig()``: 6 layers), ``roberta_base``
                       (``RobertaConfig()``: 12 layers), ``t5_encoder`` (``T5Config()``: T5-small's
                       6-layer encoder, relative position bias, no SDPA path); small: ``t5_small``
speech                 ``whisper_encoder`` (``WhisperConfig()``'s 4-layer audio encoder on 80x3000
                       log-mel frames); small: ``whisper_small`` (2 layers, d 64, 16x64 frames)
decoders               ``opt_125m`` (``OPTConfig()``: 12 layers, d 768, ReLU MLP), ``phi_2l``
                       (``PhiConfig()`` with 2 of its 24 layers: d 2048, partial rotary, parallel
                       attention + MLP; 24 layers are 1.4B parameters); small: ``phi_small``
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
    family: str       # "cnn" | "vit" | "bert" | "gpt2" | "llama" | "encoder" | "speech" | "decoder"
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


def _encoder(config: str, model: str, seq: int, *, mask: bool = True,
             **fields: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    """A transformers encoder (``config``/``model`` class names) with SDPA attention where it has one,
    returning its last hidden state for ``seq`` random token ids (and, with ``mask``, a mask of ones)."""
    def make(batch: int) -> tuple[Any, tuple[Any, ...]]:
        import torch

        t = _transformers()
        cfg = getattr(t, config)(attn_implementation="sdpa", **fields)
        ids = _ids(batch, seq, cfg.vocab_size)
        inputs = (ids, torch.ones(batch, seq, dtype=torch.long)) if mask else (ids,)
        return _first_output(getattr(t, model)(cfg)), inputs

    return make


def _t5_encoder(seq: int, **fields: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    """T5's encoder stack (``T5EncoderModel``; T5 has no SDPA path: its attention adds a learned relative
    position bias and does not scale the scores)."""
    def make(batch: int) -> tuple[Any, tuple[Any, ...]]:
        import torch

        t = _transformers()
        cfg = t.T5Config(**fields)
        return (_first_output(t.T5EncoderModel(cfg)),
                (_ids(batch, seq, cfg.vocab_size), torch.ones(batch, seq, dtype=torch.long)))

    return make


def _whisper_encoder(frames: int, **fields: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    """Whisper's audio encoder (two 1-D convolutions over log-mel frames, then a transformer encoder) on
    random log-mel features of ``frames`` frames (the encoder requires 2 x ``max_source_positions``)."""
    def make(batch: int) -> tuple[Any, tuple[Any, ...]]:
        import torch

        t = _transformers()
        from transformers.models.whisper.modeling_whisper import WhisperEncoder

        cfg = t.WhisperConfig(attn_implementation="sdpa", max_source_positions=frames // 2, **fields)
        return _first_output(WhisperEncoder(cfg)), (torch.randn(batch, cfg.num_mel_bins, frames),)

    return make


def _clip_vision(side: int, **fields: Any) -> Callable[[int], tuple[Any, tuple[Any, ...]]]:
    """CLIP's vision tower (``CLIPVisionModel``; the default config is ViT-B/32: 12 layers, d 768, quick-GELU,
    a pre-LayerNorm before the encoder), returning its last hidden state."""
    def make(batch: int) -> tuple[Any, tuple[Any, ...]]:
        import torch

        t = _transformers()
        cfg = t.CLIPVisionConfig(attn_implementation="sdpa", image_size=side, **fields)
        return _first_output(t.CLIPVisionModel(cfg)), (torch.randn(batch, 3, side, side),)

    return make

MODELS: dict[str, RealModel] = {m.name: m for m in (
    RealModel("resnet18", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("resnet18", IMAGE)),
    RealModel("resnet50", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("resnet50", IMAGE)),
    RealModel("mobilenet_v3_small", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("mobilenet_v3_small", IMAGE)),
    RealModel("vit_b_16", "vit", False, f"3x{IMAGE}x{IMAGE}", _vision("vit_b_16", IMAGE)),
    RealModel("bert_base", "bert", False, f"seq {SEQ}", _bert(SEQ)),
    RealModel("gpt2", "gpt2", False, f"seq {SEQ}", _gpt2(SEQ)),
    RealModel("llama", "llama", False, f"seq {SEQ}", _llama(SEQ, **_LLAMA)),
    # issue #32: ten more architectures, each from its library's default constructor or config
    RealModel("regnet_y_400mf", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("regnet_y_400mf", IMAGE)),
    RealModel("convnext_tiny", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("convnext_tiny", IMAGE)),
    RealModel("efficientnet_b0", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("efficientnet_b0", IMAGE)),
    RealModel("mobilenet_v2", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("mobilenet_v2", IMAGE)),
    RealModel("shufflenet_v2_x1_0", "cnn", False, f"3x{IMAGE}x{IMAGE}", _vision("shufflenet_v2_x1_0", IMAGE)),
    RealModel("swin_t", "vit", False, f"3x{IMAGE}x{IMAGE}", _vision("swin_t", IMAGE)),
    RealModel("clip_vit_b_32", "vit", False, f"3x{IMAGE}x{IMAGE}", _clip_vision(IMAGE)),
    RealModel("distilbert", "encoder", False, f"seq {SEQ}", _encoder("DistilBertConfig", "DistilBertModel", SEQ)),
    RealModel("roberta_base", "encoder", False, f"seq {SEQ}", _encoder("RobertaConfig", "RobertaModel", SEQ)),
    RealModel("t5_encoder", "encoder", False, f"seq {SEQ}", _t5_encoder(SEQ)),
    RealModel("whisper_encoder", "speech", False, "80x3000 log-mel", _whisper_encoder(3000)),
    RealModel("opt_125m", "decoder", False, f"seq {SEQ}", _causal_lm("OPTConfig", "OPTForCausalLM", SEQ)),
    RealModel("phi_2l", "decoder", False, f"seq {SEQ}",
              _causal_lm("PhiConfig", "PhiForCausalLM", SEQ, num_hidden_layers=2)),
    RealModel("resnet_small", "cnn", True, "3x64x64", _resnet_small),
    RealModel("vit_small", "vit", True, "3x32x32", _vit_small),
    RealModel("bert_small", "bert", True, "seq 16",
              _bert(16, hidden_size=64, intermediate_size=128, max_position_embeddings=64, **_TINY_TEXT)),
    RealModel("gpt2_small", "gpt2", True, "seq 16",
              _gpt2(16, n_embd=64, n_layer=2, n_head=4, n_positions=64, vocab_size=256)),
    RealModel("llama_small", "llama", True, "seq 16", _llama(16, **_LLAMA_SMALL)),
    RealModel("t5_small", "encoder", True, "seq 16",
              _t5_encoder(16, vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4)),
    RealModel("whisper_small", "speech", True, "16x64 log-mel",
              _whisper_encoder(64, num_mel_bins=16, d_model=64, encoder_layers=2, encoder_attention_heads=4,
                               encoder_ffn_dim=128)),
    RealModel("phi_small", "decoder", True, "seq 16",
              _causal_lm("PhiConfig", "PhiForCausalLM", 16, vocab_size=256, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, max_position_embeddings=64)),
)}

FULL = tuple(n for n, m in MODELS.items() if not m.small)
#: Issue #32's architectures (a group name of benchmarks/real_models.py's ``--models``).
ISSUE32 = ("regnet_y_400mf", "convnext_tiny", "efficientnet_b0", "mobilenet_v2", "shufflenet_v2_x1_0", "swin_t",
           "clip_vit_b_32", "distilbert", "roberta_base", "t5_encoder", "whisper_encoder", "opt_125m", "phi_2l")
SMALL = tuple(n for n, m in MODELS.items() if m.small)


#: Families whose every layer's attention must run as one fused kernel (issue #15: the transformers'
#: causal masks are proven causal by folding them; BERT's padding mask is a kernel input; issue #32: the
#: encoders' (T5's unscaled, position-biased attention included), Whisper's and the decoders').
FUSED_FAMILIES = ("bert", "gpt2", "llama", "encoder", "speech", "decoder")


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
