"""Workers of test_exit_report.py (module level: spawned children import them)."""

from __future__ import annotations

import time
from typing import Any

import torch

import multigpu


def rank1_ends_late(timeout_s: float, late_s: float, by_error: bool) -> dict[str, Any]:
    """Rank 0 ends its block normally; rank 1 stays ``late_s`` longer, inside its block or (after
    an error it catches) outside it: either way in no collective."""
    try:
        with multigpu.init(timeout=timeout_s) as ctx:
            model = ctx.setup(torch.nn.Linear(2, 1))
            ctx.backward(model(torch.ones(4, 2)).sum())  # a step: the straggler monitor has data
            rank = ctx.rank
            if rank == 1 and by_error:
                raise ValueError("rank 1 leaves its block")
            if rank == 1:
                time.sleep(late_s)
            ended = time.monotonic()
    except ValueError:
        time.sleep(late_s)
        return {"rank": 1}
    return {"rank": rank, "exit_s": time.monotonic() - ended}
