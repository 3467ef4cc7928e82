"""Small reference models the torch-backend tests and ``benchmarks/models.py`` run: an MLP, a GPT-2-style
transformer block, a ResNet basic block and a small CNN. Plain ``torch.nn``; nothing pbsdk-specific."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    """Linear-GELU-Linear-ReLU-Linear."""

    def __init__(self, d_in: int = 256, hidden: int = 512, d_out: int = 128) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, d_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(F.relu(self.fc2(F.gelu(self.fc1(x)))))


class GPT2Block(nn.Module):
    """Pre-norm transformer block: causal multi-head attention (SDPA) and a GELU MLP, with residuals."""

    def __init__(self, d: int = 128, heads: int = 4) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class BasicBlock(nn.Module):
    """ResNet basic block: 3x3 conv-BN-ReLU-3x3 conv-BN plus the identity, then ReLU."""

    def __init__(self, channels: int = 16) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.bn1(self.conv1(x)))
        return F.relu(self.bn2(self.conv2(y)) + x)


class SmallCNN(nn.Module):
    """conv-ReLU-conv(stride 2)-BN-SiLU-global average pool-linear-log_softmax."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.silu(self.bn(self.conv2(F.relu(self.conv1(x)))))
        return F.log_softmax(self.fc(F.adaptive_avg_pool2d(y, 1).flatten(1)), dim=-1)


def randomise_batchnorm(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every BatchNorm non-trivial running statistics and affine parameters (so tests see them)."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert m.running_mean is not None and m.running_var is not None
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(m.num_features, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.weight.copy_(torch.rand(m.num_features, generator=g) + 0.5)
                m.bias.copy_(torch.randn(m.num_features, generator=g) * 0.1)
    return model


#: name -> (constructor, input shape for a batch of n)
MODELS: dict[str, tuple[Callable[[], nn.Module], Callable[[int], tuple[int, ...]]]] = {
    "mlp": (MLP, lambda n: (n, 256)),
    "gpt2_block": (GPT2Block, lambda n: (n, 64, 128)),
    "resnet_block": (lambda: randomise_batchnorm(BasicBlock()), lambda n: (n, 16, 16, 16)),
    "small_cnn": (lambda: randomise_batchnorm(SmallCNN()), lambda n: (n, 3, 32, 32)),
}
