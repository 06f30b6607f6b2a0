"""What the built-in jobs send to their trackers (``--log-to``): a record per optimizer step and
one per evaluation, through ``ctx.log`` (rank 0; a no-op elsewhere and without ``--log-to``).

Per step: ``loss`` (rank 0's loss, the mean of its micro-batches: no collective is spent on it),
``lr``, ``step_time_s`` (from the end of the previous step: data, forward, backward, optimizer;
an evaluation or a log call is not counted), ``samples_per_s`` and, where the job knows tokens,
``tokens_per_s``. Per evaluation: what the job's progress line shows (``test_accuracy``,
``val_loss``, the all-rank mean training loss).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Mapping
from typing import Any

import torch

from multigpu.examples import job_cli

NOT_HYPERPARAMETERS = frozenset({"log_to", "progress", "resume", "out", "save", "checkpoint_dir"})
"""Job options that say where files go or how it shows, not what is trained."""


def instruments(args: argparse.Namespace) -> dict[str, Any]:
    """``multigpu.init``'s keyword arguments for ``--compile``, ``--profile`` (steps traced into
    OUT/profile) and ``--log-to`` (trackers writing in ``--out``; None: ``MULTIGPU_LOG_TO`` and
    ``MULTIGPU_LOG_DIR``)."""
    return {
        "profile": f"{args.profile[0]}:{args.profile[1]}" if args.profile else None,
        "profile_dir": job_cli.profile_dir(args),
        "log_to": args.log_to,
        "log_dir": args.out,
        "config": hyperparameters(args),
        "compile": args.compile,  # --compile; None: MULTIGPU_COMPILE
    }


def hyperparameters(args: argparse.Namespace) -> dict[str, Any]:
    """The job's options as the run's hyperparameters (``init(config=)``)."""
    return {k: v for k, v in vars(args).items() if k not in NOT_HYPERPARAMETERS}


class TrackedSteps:
    """Times the job's optimizer steps and logs them (rank 0 only keeps anything)."""

    def __init__(
        self, ctx: Any, *, samples_per_step: int, tokens_per_step: int | None = None
    ) -> None:
        self.ctx = ctx
        self.samples_per_step = samples_per_step
        self.tokens_per_step = tokens_per_step
        self._losses: list[torch.Tensor] = []
        self._clock = time.perf_counter()

    def micro_batch(self, loss: torch.Tensor) -> None:
        """Keep one micro-batch's (detached) loss of the step in progress."""
        if self.ctx.is_main:
            self._losses.append(loss.detach())

    def stepped(self, step: int, lr: float) -> None:
        """Log optimizer step ``step`` (the job's global step count, 1 for the first)."""
        seconds = max(time.perf_counter() - self._clock, 1e-9)
        if self.ctx.is_main and self._losses:
            values: dict[str, Any] = {
                "loss": torch.stack(self._losses).float().mean(),
                "lr": lr,
                "step_time_s": seconds,
                "samples_per_s": self.samples_per_step / seconds,
            }
            if self.tokens_per_step is not None:
                values["tokens_per_s"] = self.tokens_per_step / seconds
            self.ctx.log(values, step=step)
        self._losses = []
        self._clock = time.perf_counter()

    def evaluated(self, step: int, values: Mapping[str, Any]) -> None:
        """Log an evaluation's ``values`` at ``step`` (but ``step`` itself, and those not known:
        None); its time is not the next step's."""
        known = {k: v for k, v in values.items() if v is not None and k != "step"}
        self.ctx.log(known, step=step)
        self._clock = time.perf_counter()
