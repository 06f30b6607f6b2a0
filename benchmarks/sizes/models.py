"""The models of ``benchmarks/sizes.py``: a stack of Linear layers and a small transformer.

Each is an ``nn.Sequential`` of identical blocks (the units FSDP shards one by one, found by
multigpu's ``fsdp_units`` as repeated modules and given to ``fully_shard`` by hand), built from
seed 0 on every rank, with a few pre-made input batches per rank (the same in every variant).

- linear: 12 Linear+ReLU blocks, 8 rows per rank per step; 512 features: 3.15M parameters,
  2048: 50.4M, 4096: 201.4M.
- transformer: pre-norm ``nn.TransformerEncoderLayer`` blocks (heads of 64, feed-forward
  4 x d_model, no dropout), 4 sequences of 32 tokens per rank per step, float inputs; 4 layers
  of d_model 256: 3.16M parameters, 10 of 640: 49.2M, 16 of 1024: 201.5M.
"""

from __future__ import annotations

import torch
from torch import nn

LINEAR = {"3M": 512, "50M": 2048, "200M": 4096}
"""Features of each of the 12 Linear blocks."""
LINEAR_BLOCKS = 12
LINEAR_ROWS = 8
TRANSFORMER = {"3M": (256, 4), "50M": (640, 10), "200M": (1024, 16)}
"""(d_model, layers); heads = d_model / 64, feed-forward 4 x d_model."""
TOKENS = (4, 32)
"""(sequences, tokens) per rank per step."""
BATCHES = 4
"""Pre-made batches per rank, used in turn."""
SIZES = tuple(LINEAR)
KINDS = ("linear", "transformer")


def build(kind: str, size: str, rank: int) -> tuple[nn.Module, list[nn.Module], list[torch.Tensor]]:
    """(model, its blocks, this rank's input batches); the weights depend on nothing but seed 0."""
    torch.manual_seed(0)
    blocks: list[nn.Module]
    if kind == "linear":
        width = LINEAR[size]
        blocks = [nn.Sequential(nn.Linear(width, width), nn.ReLU()) for _ in range(LINEAR_BLOCKS)]
        shape: tuple[int, ...] = (LINEAR_ROWS, width)
    elif kind == "transformer":
        d_model, layers = TRANSFORMER[size]
        blocks = [
            nn.TransformerEncoderLayer(
                d_model, d_model // 64, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
            )
            for _ in range(layers)
        ]
        shape = (*TOKENS, d_model)
    else:
        raise SystemExit(f"--kind {kind!r}; expected one of {', '.join(KINDS)}")
    gen = torch.Generator().manual_seed(1000 + rank)
    inputs = [torch.randn(shape, generator=gen) for _ in range(BATCHES)]
    return nn.Sequential(*blocks), blocks, inputs
