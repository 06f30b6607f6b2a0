"""Module-level worker functions for the compression tests (importable by spawned children)."""

from __future__ import annotations

import os
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

import multigpu
from multigpu.strategies import DDPStrategy
from multigpu.strategies.compression import register_compression

STEPS = 60
START = 2  # PowerSGD's first compressed step (torch's minimum): most of the run is compressed

# (label, DDPStrategy options); "fp16 (env)" is the Context's own strategy, set by the variable.
RUNS: list[tuple[str, dict[str, Any]]] = [
    ("none", {"compression": "none"}),
    ("fp16", {"compression": "fp16"}),
    ("bf16", {"compression": "bf16"}),
    ("powersgd", {"compression": "powersgd", "powersgd_start_iter": START}),
    ("powersgd r4", {"compression": "powersgd", "powersgd_rank": 4, "powersgd_start_iter": START}),
    ("fp16 (env)", {}),
]


def _model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights for every run
    return nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4))


def _flat_grad(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.grad.detach().reshape(-1).clone() for p in model.parameters()])


def compressed_training() -> dict[str, Any]:
    """Train the same model from the same start under each compression; report what happened.

    Each rank has its own half of a separable 4-class problem, so the ranks' gradients differ
    and only the all-reduce makes the replicas agree.
    """
    environ = {**os.environ, "MULTIGPU_COMPRESSION": "fp16"}  # the no-code way, through init
    with multigpu.init(seed=0, environ=environ) as ctx:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(512, 32, generator=gen)
        y = (x @ torch.randn(32, 4, generator=gen)).argmax(1)
        mine = slice(ctx.rank, None, ctx.world_size)
        x_rank, y_rank = x[mine], y[mine]
        out: dict[str, Any] = {"rank": ctx.rank, "env_strategy": ctx.strategy.describe()}
        for label, options in RUNS:
            strategy: multigpu.Strategy = ctx.strategy
            if options:
                strategy = DDPStrategy(**options)
                strategy.bind(ctx.device, ctx.world_size)
            model = strategy.wrap(_model())
            opt = torch.optim.SGD(model.parameters(), lr=0.5)
            losses, first_grad = [], None
            for step in range(STEPS):
                batch = slice((step * 32) % 256, (step * 32) % 256 + 32)
                loss = F.cross_entropy(model(x_rank[batch]), y_rank[batch])
                opt.zero_grad()
                ctx.backward(loss)
                if first_grad is None:
                    first_grad = _flat_grad(model)
                opt.step()
                losses.append(float(ctx.all_reduce(loss.detach())))
            states = getattr(strategy, "hook_states", [])
            out[label] = {
                "first_grad": first_grad,
                "losses": losses,
                "params": torch.cat([p.detach().reshape(-1) for p in model.parameters()]),
                "stats": states[0].compression_stats() if states else None,
                "accuracy": float((model(x).argmax(1) == y).float().mean()),
                "numel": sum(p.numel() for p in model.parameters()),
            }
            if strategy is not ctx.strategy:
                strategy.teardown()  # its reducers go before the process group does
        out["nccl_bf16_error"] = _nccl_bf16_error()
        return out


def _nccl_bf16_error() -> str | None:
    """The error of choosing torch's own bf16 hook (the one for NCCL) on this build, if any."""
    ddp = nn.parallel.DistributedDataParallel(_model())
    try:
        register_compression(ddp, "bf16", backend="nccl")
    except multigpu.UsageError as e:
        return str(e)
    finally:
        del ddp.reducer, ddp.logger  # before the process group goes (the exit-deadlock trap)
    return None
