"""Module-level worker functions for the checkpoint tests (run_distributed pickles them)."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.data import TensorDataset

SAMPLES = 203  # prime: the last partial global batch is dropped, as in real data
BATCH = 16
EPOCHS = 2


def dataset() -> TensorDataset:
    g = torch.Generator().manual_seed(1)
    x = torch.randn(SAMPLES, 8, generator=g)
    return TensorDataset(x, torch.arange(SAMPLES), (x.sum(1) > 0).long())


def train(
    directory: str,
    stop_at: int | None,
    dropout: float,
    every: int,
    async_save: bool = False,
) -> dict[str, Any]:
    """Train EPOCHS epochs resuming from ``directory``; stop (as if killed) after ``stop_at`` steps.

    Returns the final parameters, the step resumed from and every sample index this rank trained
    on, per epoch.
    """
    import multigpu

    with multigpu.init(seed=0) as ctx:
        model = torch.nn.Sequential(
            torch.nn.Linear(8, 32),
            torch.nn.ReLU(),
            torch.nn.Dropout(dropout),
            torch.nn.Linear(32, 2),
        )
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.7)
        model, optimizer = ctx.setup(model, optimizer)
        loader = ctx.loader(dataset(), batch_size=BATCH)
        ckpt = ctx.checkpointer(
            directory, every_steps=every, keep=2, async_save=async_save,
            model=model, optimizer=optimizer, scheduler=scheduler, loader=loader,
        )  # fmt: skip
        resumed = ckpt.resume()
        seen: dict[int, list[int]] = {}
        while loader.epoch < EPOCHS:
            epoch = loader.epoch
            for x, index, y in loader:
                seen.setdefault(epoch, []).extend(index.tolist())
                ctx.backward(F.cross_entropy(model(x), y))
                ctx.step(optimizer)
                scheduler.step()
                ckpt.step()
                if stop_at is not None and ckpt.steps == stop_at:
                    ckpt.wait()
                    return {"stopped": True, "seen": seen}
        state = {k: v.detach().clone() for k, v in ctx.unwrap(model).state_dict().items()}
        return {"state": state, "resumed": resumed, "seen": seen, "steps": ckpt.steps}


def save_then_resume_missing(directory: str) -> str:
    """Save model+optimizer, then resume tracking one more object: must raise CheckpointError."""
    import multigpu

    with multigpu.init(seed=0) as ctx:
        model = torch.nn.Linear(2, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = ctx.setup(model, optimizer)
        ctx.checkpointer(directory, model=model).save()
        again = ctx.checkpointer(directory, model=model, optimizer=optimizer)
        try:
            again.resume()
        except multigpu.CheckpointError as e:
            return str(e)
        return "no error"


def save_ddp_state_dict(path: str) -> list[str]:
    """Rank 0 saves a DDP-wrapped model's state dict, as users of plain DDP do."""
    import multigpu

    with multigpu.init(seed=0) as ctx:
        model = ctx.setup(torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2)))
        assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
        if ctx.is_main:
            torch.save(model.state_dict(), path)
        ctx.barrier()
        return list(model.state_dict())
