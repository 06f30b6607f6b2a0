"""Module-level worker functions for run_distributed (importable by spawned children)."""

from __future__ import annotations

import os

import torch
from torch.utils.data import TensorDataset

from multigpu.data import make_loader


def two_epochs(num_samples: int, batch_size: int, shuffle: bool) -> list[list[list[int]]]:
    """Iterate this rank's loader for two epochs; return the index lists of each epoch."""
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dataset = TensorDataset(torch.arange(num_samples))
    loader = make_loader(
        dataset, batch_size=batch_size, rank=rank, world_size=world_size, shuffle=shuffle, seed=7
    )
    return [[batch[0].tolist() for batch in loader] for _ in range(2)]
