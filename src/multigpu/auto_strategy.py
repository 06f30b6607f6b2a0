"""``strategy="auto"`` with several processes: DDP when the model fits a rank, else FSDP.

Decided at ``ctx.setup``, when the model is known: the memory estimate of its training state
(``multigpu.estimate``) against what this rank has (its GPU's free memory, or its share of RAM
and any memory limit). The ranks agree — one rank short of memory makes every rank use FSDP —
and rank 0 says in one line what was chosen and why.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from multigpu import dist
from multigpu.estimate import device_capacity, estimate_memory
from multigpu.estimate.memory import PRECISIONS
from multigpu.strategies import FSDPStrategy, Strategy


def choose_for_memory(
    ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
) -> Strategy:
    """The strategy ``auto`` settles on for ``model`` (collective: every rank calls it)."""
    current: Strategy = ctx.strategy
    precision = ctx.precision.name
    if precision not in PRECISIONS:  # 16-mixed: FSDP has no scaler for it here; DDP it is
        ctx.print(
            f"multigpu: strategy auto chose {current.name}: precision {precision} rules out fsdp",
            file=sys.stderr,
        )
        return current
    estimate = estimate_memory(
        model,
        world_size=ctx.world_size,
        optimizer=optimizers[0] if optimizers else "adamw",  # unknown classes: measured
        precision=precision,
        capacity=device_capacity(ctx.device, ctx.local_world_size),
        device=ctx.device,
    )
    name, why = estimate.choose()
    anyone = dist.all_reduce(1.0 if name == "fsdp" else 0.0, op="max", device=ctx._comm_device())
    if anyone and name != "fsdp":
        name, why = "fsdp", f"another rank has too little memory for ddp (here: {why})"
    ctx.print(f"multigpu: strategy auto chose {name}: {why}", file=sys.stderr)
    if name != "fsdp":
        return current
    sharded = FSDPStrategy()
    sharded.bind(
        current.device,
        current.world_size,
        sync_batchnorm=current.sync_batchnorm,
        precision=current.precision,
    )
    sharded.auto = True
    return sharded
