"""``ctx.forward_backward``: one training batch's forward and backward, the same call under every
strategy — a pipeline's schedule included — so the loop never asks which stage it runs.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

from multigpu.errors import UsageError

if TYPE_CHECKING:
    from torch import nn

    from multigpu.strategies import Strategy


class ForwardBackward:
    """The Context's ``forward_backward`` (a mixin: it needs ``strategy`` and ``backward``)."""

    strategy: Strategy

    def backward(self, loss: torch.Tensor, **kwargs: Any) -> None:  # pragma: no cover - Context's
        raise NotImplementedError

    def forward_backward(
        self,
        model: nn.Module,
        *inputs: Any,
        target: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
    ) -> torch.Tensor:
        """``loss_fn(model(*inputs), target)`` and its backward; the loss (detached) on every rank.

        Under ``strategy="pipeline"`` the batch runs through the schedule in micro-batches (the
        first stage reads ``inputs``, the last computes ``loss_fn``) and the returned loss is the
        mean over the micro-batches, broadcast from the last stage. Under any other strategy it
        is the model's forward, ``loss_fn`` and ``ctx.backward`` (inside ``ctx.accumulate`` the
        loss is divided there), returning this rank's loss. Step with ``ctx.step`` after it.
        """
        if not callable(loss_fn):
            raise UsageError(
                f"forward_backward(loss_fn={loss_fn!r}): expected a function of (output, "
                "target) returning the loss, e.g. loss_fn=torch.nn.functional.cross_entropy"
            )
        done = self.strategy.forward_backward(model, inputs, target, loss_fn)
        if done is not None:
            return done
        loss = loss_fn(model(*inputs), target)
        self.backward(loss)
        return loss.detach()
