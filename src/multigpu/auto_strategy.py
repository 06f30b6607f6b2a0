"""``strategy="auto"`` with several processes: DDP when the model fits a rank, else FSDP."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from multigpu.strategies import Strategy


def choose_for_memory(
    ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
) -> Strategy:
    """The strategy ``auto`` settles on for ``model``."""
    strategy: Strategy = ctx.strategy
    return strategy
