"""Small reference models in plain JAX that the JAX-frontend tests and ``benchmarks/models_jax.py`` run:
an MLP, a GPT-2-style transformer block, a ResNet basic block (NCHW) and a small CNN (NHWC). The same
architectures as `pbsdk.frontends.torch.examples`; parameters are a dict of numpy arrays passed as the
first argument (so they are kernel inputs, not constants). Nothing pbsdk-specific."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

Params = dict[str, Any]


def _dense(rng: np.random.Generator, d_in: int, d_out: int) -> tuple[np.ndarray, np.ndarray]:
    bound = 1.0 / math.sqrt(d_in)
    return (rng.uniform(-bound, bound, (d_in, d_out)).astype(np.float32),
            rng.uniform(-bound, bound, (d_out,)).astype(np.float32))


def batchnorm_init(rng: np.random.Generator, c: int, prefix: str) -> Params:
    """Non-trivial running statistics and affine parameters (so tests see them)."""
    return {f"{prefix}_mean": (rng.standard_normal(c) * 0.1).astype(np.float32),
            f"{prefix}_var": (rng.random(c) + 0.5).astype(np.float32),
            f"{prefix}_scale": (rng.random(c) + 0.5).astype(np.float32),
            f"{prefix}_bias": (rng.standard_normal(c) * 0.1).astype(np.float32)}


def batchnorm(p: Params, prefix: str, x: Any, axis: int, eps: float = 1e-5) -> jax.Array:
    """Inference batch norm over channel ``axis`` with running statistics."""
    shape = [1] * x.ndim
    shape[axis] = x.shape[axis]

    def c(name: str) -> jax.Array:
        return jnp.reshape(p[f"{prefix}_{name}"], shape)
    return (x - c("mean")) * lax.rsqrt(c("var") + eps) * c("scale") + c("bias")


def layernorm(x: Any, w: Any, b: Any, eps: float = 1e-5) -> jax.Array:
    mean = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mean), axis=-1, keepdims=True)
    return (x - mean) * lax.rsqrt(var + eps) * w + b


# --------------------------------------------------------------------------------------------- MLP

def mlp_init(rng: np.random.Generator, d_in: int = 256, hidden: int = 512, d_out: int = 128) -> Params:
    p: Params = {}
    for i, (a, b) in enumerate(((d_in, hidden), (hidden, hidden), (hidden, d_out)), start=1):
        p[f"w{i}"], p[f"b{i}"] = _dense(rng, a, b)
    return p


def mlp(p: Params, x: jax.Array) -> jax.Array:
    """Dense-GELU(exact)-Dense-ReLU-Dense."""
    h = jax.nn.gelu(x @ p["w1"] + p["b1"], approximate=False)
    h = jax.nn.relu(h @ p["w2"] + p["b2"])
    return h @ p["w3"] + p["b3"]


# ------------------------------------------------------------------------------------------- GPT-2

def gpt2_init(rng: np.random.Generator, d: int = 128, heads: int = 4) -> Params:
    p: Params = {"ln1_w": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
                 "ln1_b": (0.1 * rng.standard_normal(d)).astype(np.float32),
                 "ln2_w": (1 + 0.1 * rng.standard_normal(d)).astype(np.float32),
                 "ln2_b": (0.1 * rng.standard_normal(d)).astype(np.float32)}
    p["qkv_w"], p["qkv_b"] = _dense(rng, d, 3 * d)
    p["proj_w"], p["proj_b"] = _dense(rng, d, d)
    p["fc_w"], p["fc_b"] = _dense(rng, d, 4 * d)
    p["out_w"], p["out_b"] = _dense(rng, 4 * d, d)
    return p


def gpt2_block(p: Params, x: jax.Array, heads: int = 4) -> jax.Array:
    """Pre-norm block: causal multi-head attention and a GELU(tanh) MLP, with residuals."""
    b, t, d = x.shape
    dh = d // heads
    q, k, v = jnp.split(layernorm(x, p["ln1_w"], p["ln1_b"]) @ p["qkv_w"] + p["qkv_b"], 3, axis=-1)
    q, k, v = (z.reshape(b, t, heads, dh).transpose(0, 2, 1, 3) for z in (q, k, v))
    scores = (q @ k.swapaxes(-1, -2)) / math.sqrt(dh)
    causal = jnp.tril(jnp.ones((t, t), dtype=bool))
    probs = jax.nn.softmax(jnp.where(causal, scores, -jnp.inf), axis=-1)
    y = (probs @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
    x = x + y @ p["proj_w"] + p["proj_b"]
    h = jax.nn.gelu(layernorm(x, p["ln2_w"], p["ln2_b"]) @ p["fc_w"] + p["fc_b"], approximate=True)
    return x + h @ p["out_w"] + p["out_b"]


# ------------------------------------------------------------------------------------ convolutions

def _conv_weight(rng: np.random.Generator, shape: tuple[int, ...], fan_in: int) -> np.ndarray:
    return (rng.standard_normal(shape) * math.sqrt(2.0 / fan_in)).astype(np.float32)


def resnet_init(rng: np.random.Generator, channels: int = 16) -> Params:
    c = channels
    return {"conv1": _conv_weight(rng, (c, c, 3, 3), 9 * c), "conv2": _conv_weight(rng, (c, c, 3, 3), 9 * c),
            **batchnorm_init(rng, c, "bn1"), **batchnorm_init(rng, c, "bn2")}


def resnet_block(p: Params, x: jax.Array) -> jax.Array:
    """ResNet basic block in NCHW: 3x3 conv-BN-ReLU-3x3 conv-BN plus the identity, then ReLU."""
    dn = ("NCHW", "OIHW", "NCHW")

    def conv(w: jax.Array, z: jax.Array) -> jax.Array:
        return lax.conv_general_dilated(z, w, (1, 1), ((1, 1), (1, 1)), dimension_numbers=dn)
    y = jax.nn.relu(batchnorm(p, "bn1", conv(p["conv1"], x), axis=1))
    return jax.nn.relu(batchnorm(p, "bn2", conv(p["conv2"], y), axis=1) + x)


def cnn_init(rng: np.random.Generator, classes: int = 10) -> Params:
    p: Params = {"conv1": _conv_weight(rng, (3, 3, 3, 8), 27), "conv1_b": np.zeros(8, np.float32) + 0.01,
                 "conv2": _conv_weight(rng, (3, 3, 8, 16), 72), "conv2_b": np.zeros(16, np.float32) - 0.01,
                 **batchnorm_init(rng, 16, "bn")}
    p["fc_w"], p["fc_b"] = _dense(rng, 16, classes)
    return p


def small_cnn(p: Params, x: jax.Array) -> jax.Array:
    """NHWC: conv-ReLU-conv(stride 2)-BN-SiLU-global average pool-dense-log_softmax."""
    dn = ("NHWC", "HWIO", "NHWC")
    y = lax.conv_general_dilated(x, p["conv1"], (1, 1), "SAME", dimension_numbers=dn) + p["conv1_b"]
    y = jax.nn.relu(y)
    y = lax.conv_general_dilated(y, p["conv2"], (2, 2), ((1, 1), (1, 1)), dimension_numbers=dn) + p["conv2_b"]
    y = jax.nn.silu(batchnorm(p, "bn", y, axis=3))
    return jax.nn.log_softmax(jnp.mean(y, axis=(1, 2)) @ p["fc_w"] + p["fc_b"], axis=-1)


#: name -> (parameter initialiser, apply(params, x), input shape for a batch of n)
MODELS: dict[str, tuple[Callable[..., Params], Callable[[Params, jax.Array], jax.Array],
                        Callable[[int], tuple[int, ...]]]] = {
    "mlp": (mlp_init, mlp, lambda n: (n, 256)),
    "gpt2_block": (gpt2_init, gpt2_block, lambda n: (n, 64, 128)),
    "resnet_block": (resnet_init, resnet_block, lambda n: (n, 16, 16, 16)),
    "small_cnn": (cnn_init, small_cnn, lambda n: (n, 32, 32, 3)),
}
