"""The instrumentation hook: how ``multigpu verify``, ``bench scaling`` and the hang tools attach.

A ``Context`` calls its hooks at the points below and knows nothing else of them; ``init()``
chooses them from the variables the launcher set (``initialize.choose_hooks``). ``ctx`` is
the Context (typed ``Any``: this module sits below it). A hook inherits a no-op for what it ignores.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn


class Hook:
    """One instrument of a Context: override the points it needs."""

    def on_setup(
        self, ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        """``ctx.setup`` wrapped ``model``; ``optimizers`` are the ones given with it."""

    def on_loader(self, ctx: Any, loader: Any) -> None:
        """``ctx.loader`` made ``loader`` (a ``DistributedLoader``)."""

    def wrap_backward(self, ctx: Any, backward: Callable[..., None]) -> Callable[..., None]:
        """What ``ctx.backward(loss, **kwargs)`` runs instead of ``backward`` (made once)."""
        return backward

    def before_step(self, ctx: Any, optimizers: Sequence[torch.optim.Optimizer]) -> bool:
        """``ctx.step(*optimizers)`` is about to step them (the last micro-batch of a step):
        False stops it (``ctx.step`` then returns False and leaves every gradient to the hook),
        as a replica group does for a share that is not the step's last, or a step the groups
        did not commit."""
        return True

    def counts_step(self, ctx: Any) -> bool:
        """Whether the optimizer step just taken counts (a ``Checkpointer.step()`` counts it):
        False after a step the hook stopped (see ``before_step``), when the loop still calls
        ``ckpt.step()``."""
        return True

    def writes_outputs(self, ctx: Any) -> bool:
        """Whether this rank 0 is the one ``ctx.is_main`` names (False: another process of the
        job writes the user's files and prints, e.g. another replica group's rank 0)."""
        return True

    def on_checkpointer(self, ctx: Any, checkpointer: Any) -> None:
        """``ctx.checkpointer`` made ``checkpointer`` (a ``Checkpointer``), before it resumes."""

    def on_step(self, ctx: Any) -> None:
        """An optimizer step ended (``ctx.step`` stepped: also the last micro-batch of an
        accumulated step, and after a pipeline's ``forward_backward``; or the script stepped
        the first optimizer given to ``setup`` itself)."""

    def on_log(self, ctx: Any, metrics: Mapping[str, Any], step: int) -> float | None:
        """``ctx.log(metrics, step=step)`` was called (the trackers attach here, on rank 0).
        Returns the seconds of it that were no part of training, which ``ctx.throughput()``
        leaves out of the step they fell in (a tracker's start-up), or None."""
        return None

    def on_save(self, ctx: Any) -> None:
        """A checkpoint is about to be saved (a ``Checkpointer``'s or ``ctx.save``'s; every rank:
        do nothing collective). The trackers write what they keep, so it holds the saved steps."""

    def on_exit(self, ctx: Any, error: BaseException | None) -> None:
        """The ``with`` block ends, by ``error`` or normally (None); the group still exists."""

    def on_teardown(self, ctx: Any) -> None:
        """The Context is torn down (once: after ``on_exit``, by ``ctx.teardown()`` or at exit)."""
