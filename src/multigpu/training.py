"""What happens around one optimizer step: gradient accumulation, loss scaling, the step itself.

``ctx.accumulate(model)`` decides, from the loader's position, whether the current micro-batch
ends an optimizer step. On every micro-batch but the last it enters DDP's ``no_sync`` (no
gradient all-reduce) and ``ctx.step`` does nothing; on the last, gradients are all-reduced once
and ``ctx.step`` steps. Inside it ``ctx.backward`` divides the loss by the number of micro-steps,
so the accumulated gradient is the mean over the global batch — the same as one big step.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from multigpu.data import DistributedLoader
from multigpu.log import warn_once
from multigpu.precision import Precision
from multigpu.strategies import Strategy

log = logging.getLogger(__name__)


class StepControl:
    """Accumulation state and precision, shared by Context's step methods."""

    def __init__(self, strategy: Strategy, precision: Precision) -> None:
        self.strategy = strategy
        self.precision = precision
        self.active_loader: DistributedLoader | None = None
        self._micro_steps = 1  # > 1 only inside accumulate() on an accumulating loader
        # False on a micro-batch that does not end its step, from accumulate() until the
        # loader's next batch: step() after the block skips as it does inside.
        self.sync_step = True

    def note_batch(self, loader: DistributedLoader) -> None:
        """Called by a Context-made loader as it hands out a batch (a new micro-batch)."""
        self.active_loader = loader
        self.sync_step = True  # the next accumulate() decides for this micro-batch

    @contextlib.contextmanager
    def accumulate(self, model: nn.Module, sync: bool | None = None) -> Iterator[None]:
        loader = self.active_loader
        steps = loader.accumulation_steps if loader is not None else 1
        if sync is None:
            sync = loader is None or loader.ends_step
        self._micro_steps, self.sync_step = steps, sync
        try:
            with contextlib.nullcontext() if sync else self.strategy.no_sync(model):
                yield
        finally:
            # sync_step stays until the next batch: `with ctx.accumulate(model): ...` then
            # ctx.step(opt) after the block (Accelerate's habit) must not step a micro-batch
            # whose gradient was not all-reduced (the ranks would silently diverge).
            self._micro_steps = 1

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:
        loader = self.active_loader
        if self._micro_steps == 1 and loader is not None and loader.accumulation_steps > 1:
            warn_once(
                log,
                "the loader has accumulation_steps=%d but ctx.backward ran outside "
                "ctx.accumulate(model): gradients are all-reduced and scaled as full steps; wrap "
                "the step in `with ctx.accumulate(model):` and call ctx.step(optimizer)",
                loader.accumulation_steps,
            )
        if self._micro_steps > 1:
            loss = loss / self._micro_steps
        self.precision.backward(loss, **kwargs)

    def step(self, *optimizers: torch.optim.Optimizer, zero_grad: bool = True) -> bool:
        if not self.sync_step:
            return False
        self.precision.step(*optimizers)
        if zero_grad:
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
        return True

    def clip_grad_norm(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
    ) -> torch.Tensor | None:
        if not self.sync_step:
            return None  # the gradient is not complete before the last micro-step
        self.precision.unscale(optimizer)
        return self.strategy.clip_grad_norm(model, max_norm, norm_type)
