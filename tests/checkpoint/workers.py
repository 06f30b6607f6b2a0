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
        return _train(ctx, directory, stop_at, dropout, every, async_save)


def train_runs(runs: list[tuple[Any, ...]]) -> list[dict[str, Any]]:
    """``train(*run)`` for each run, one after the other in this process (saves a process start).

    The runs share one context: a second ``multigpu.init`` in the same process could meet the
    previous group's store, still served by a slower rank 0. Each run reseeds as ``init(seed=0)``
    does and builds its own model, optimizer, loader and checkpointer, so it is the same run as
    in a process of its own. Resumes are left to fresh processes by the tests.
    """
    import multigpu
    from multigpu.runtime.seed import seed_everything

    with multigpu.init(seed=0) as ctx:
        results = []
        for run in runs:
            seed_everything(0)
            results.append(_train(ctx, *run))
        return results


def _train(
    ctx: Any,
    directory: str,
    stop_at: int | None,
    dropout: float,
    every: int,
    async_save: bool = False,
) -> dict[str, Any]:
    """One run of ``train`` on an existing context."""
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
