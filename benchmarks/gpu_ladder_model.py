"""A small Llama-style decoder for ``gpu_ladder.py``: RMSNorm, rotary embeddings, a SwiGLU MLP
and causal attention through ``scaled_dot_product_attention`` (flash or memory-efficient
kernels on a GPU), in the shape of torchtitan's Llama 3 (no grouped-query attention, no weight
tying: the output layer has its own weights).

Two sizes: ``GPU`` (~270M parameters, 2,048-token sequences: one GPU's worth, bf16-mixed) and
``TINY`` (~0.1M parameters: seconds on a CPU, for the dry run and the tests).

Environment variables read: none.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True, kw_only=True)
class LlamaConfig:
    """The decoder's shape."""

    vocab: int
    """Tokens in the vocabulary (the synthetic batches draw from it)."""
    dim: int
    """The model width."""
    layers: int
    """Decoder blocks (each one FSDP unit, checkpointed and compiled on its own)."""
    heads: int
    """Attention heads; ``dim`` must divide by it, and the head width must be even (rotary)."""
    ffn: int
    """The SwiGLU MLP's hidden width (Llama: about 8/3 x ``dim``, rounded up to 256)."""
    seq_len: int
    """Tokens per sample; the rotary table covers this many positions."""
    rope_theta: float = 10_000.0
    """The rotary embeddings' base."""
    norm_eps: float = 1e-5
    """RMSNorm's epsilon."""


GPU = LlamaConfig(vocab=32_000, dim=1024, layers=16, heads=16, ffn=2816, seq_len=2048)
"""~272M parameters (65.5M of them the embedding and the output layer)."""

TINY = LlamaConfig(vocab=256, dim=64, layers=2, heads=4, ffn=176, seq_len=64)
"""~0.13M parameters: for CPUs, the dry run and the tests."""


def rotary_table(config: LlamaConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of each position's rotation angles, shape (seq_len, head width / 2)."""
    half = config.dim // config.heads // 2
    inverse = config.rope_theta ** (-torch.arange(half, dtype=torch.float32) / half)
    angles = torch.outer(torch.arange(config.seq_len, dtype=torch.float32), inverse)
    return angles.cos(), angles.sin()


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding of ``x`` (batch, heads, seq, head width), its halves as the pairs."""
    first, second = x.float().chunk(2, dim=-1)
    turned = torch.cat((first * cos - second * sin, first * sin + second * cos), dim=-1)
    return turned.type_as(x)


class Attention(nn.Module):
    """Causal multi-head self-attention with rotary positions."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.heads = config.heads
        self.wq = nn.Linear(config.dim, config.dim, bias=False)
        self.wk = nn.Linear(config.dim, config.dim, bias=False)
        self.wv = nn.Linear(config.dim, config.dim, bias=False)
        self.wo = nn.Linear(config.dim, config.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = (
            w(x).view(batch, seq, self.heads, dim // self.heads).transpose(1, 2)
            for w in (self.wq, self.wk, self.wv)
        )
        q, k = rotate(q, cos[:seq], sin[:seq]), rotate(k, cos[:seq], sin[:seq])
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, dim))


class FeedForward(nn.Module):
    """SwiGLU: w2(silu(w1 x) * w3 x)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(config.dim, config.ffn, bias=False)
        self.w2 = nn.Linear(config.ffn, config.dim, bias=False)
        self.w3 = nn.Linear(config.dim, config.ffn, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    """One pre-norm decoder block: x + attention(norm x), then + mlp(norm x)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        self.attention_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.attention = Attention(config)
        self.ffn_norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.feed_forward = FeedForward(config)
        # The rotary table travels with each block (not a parameter: FSDP leaves it whole), so
        # that a compiled or checkpointed block needs nothing from outside but its input.
        cos, sin = rotary_table(config)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.attention_norm(x), self.cos, self.sin)
        return x + self.feed_forward(self.ffn_norm(x))


class Llama(nn.Module):
    """Token embedding, ``layers`` blocks, a final RMSNorm and the output layer (float32 logits)."""

    def __init__(self, config: LlamaConfig) -> None:
        super().__init__()
        if config.dim % config.heads or (config.dim // config.heads) % 2:
            raise ValueError(
                f"LlamaConfig(dim={config.dim}, heads={config.heads}): expected a dim that "
                "divides into heads of even width (rotary embeddings turn pairs)"
            )
        self.config = config
        self.tok_embeddings = nn.Embedding(config.vocab, config.dim)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.layers))
        self.norm = nn.RMSNorm(config.dim, eps=config.norm_eps)
        self.output = nn.Linear(config.dim, config.vocab, bias=False)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Llama's initialisation: normal(0, 0.02), the residual outputs scaled by depth."""
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue  # the norms' weights stay 1
            std = 0.02
            if name.endswith(("wo.weight", "w2.weight")):
                std = 0.02 / math.sqrt(2 * self.config.layers)
            nn.init.trunc_normal_(p, std=std, a=-3 * std, b=3 * std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens)
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h)).float()


def matmul_parameters(model: Llama) -> int:
    """The parameters that take part in matmuls: all but the token embedding (a lookup), as
    torchtitan counts them for its FLOPs per token."""
    return sum(p.numel() for p in model.parameters()) - model.tok_embeddings.weight.numel()
