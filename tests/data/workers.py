"""Module-level worker functions for run_distributed (importable by spawned children)."""

from __future__ import annotations

import os
from typing import Any

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


def epochs_and_resume(
    num_samples: int,
    batch_size: int,
    stop_after: int,
    resume_state: dict[str, Any] | None,
) -> dict[str, Any]:
    """Through ``multigpu.init()`` and ``ctx.loader``: two whole shuffled epochs (each rank's
    index lists per step), then a fresh loader run for one epoch plus ``stop_after`` steps of
    the next, returning its ``state_dict()``; with ``resume_state``, also a loader that loads it
    and runs the rest of that epoch.
    """
    import multigpu

    with multigpu.init(seed=3) as ctx:
        dataset = TensorDataset(torch.arange(num_samples))

        def loader() -> Any:
            return ctx.loader(dataset, batch_size=batch_size, shuffle=True, drop_last=False)

        def steps(batches: Any) -> list[list[int]]:
            return [batch[0].tolist() for batch in batches]

        whole = loader()
        out: dict[str, Any] = {"epochs": [steps(whole) for _ in range(2)]}
        # Training-style loader (drop_last by default when shuffling): same global order.
        dropping = ctx.loader(dataset, batch_size=batch_size, shuffle=True)
        out["dropping"] = [steps(dropping) for _ in range(2)]

        interrupted = loader()
        steps(interrupted)  # epoch 0 in full
        before = []
        for batch in interrupted:
            before.append(batch[0].tolist())
            if len(before) == stop_after:
                break
        out["before"], out["state"] = before, interrupted.state_dict()
        if resume_state is not None:
            resumed = loader()
            resumed.load_state_dict(resume_state)
            out["after"] = steps(resumed)
            out["after_epoch"] = resumed.epoch
        return out
