"""When a replica group's optimizers step: at a step's last batch, once the groups committed it.

The user's objects are not patched. Both ways a loop steps reach ``StepGate.decide``:
``ctx.step(optimizer)`` asks it first (the Context's ``before_step`` hook), and
``optimizer.step()`` through a step pre-hook (torch's public ``register_step_pre_hook``), which
cannot skip the step itself; so a step the gate stops leaves no gradient behind (``grad = None``:
torch's optimizers skip a parameter without one, their state untouched) and the scheduler that
wraps ``optimizer.step`` is not told it was overridden.

A survivor runs an absent group's share of a step as extra batches (``multigpu.replicas.shares``):
at the end of each share but the last the gate sets the share's gradients aside (summed, on the
side) and stops the step; at the last it adds them back, the groups sum their gradients and vote
(``Coordinator.finish_step``), and the optimizers step only when the step is committed. Each
share's gradient is thereby what its own group's would be in an uninterrupted run (also under a
clip between backward and step). With ``precision="16-mixed"`` the gradients set aside may be
unscaled already (a clip unscales them): the scaler is made to forget it, and after the groups'
sum every group's scaler sees the same infs (``torch_compat.scaler_*``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from multigpu.errors import UsageError
from multigpu.replicas.coordinator import Coordinator, local_tensor
from multigpu.torch_compat import scaler_forget_unscale, scaler_set_found_inf, scaler_unscaled


class StepGate:
    """The step decisions of one worker of a replica group."""

    def __init__(self, coordinator: Coordinator) -> None:
        self.coordinator = coordinator
        self.parameters: list[torch.Tensor] = []
        self.optimizers: list[torch.optim.Optimizer] = []
        self.scaler: Any = None
        self._aside: list[torch.Tensor | None] | None = None
        self.ends_share = True
        """The batch handed out last is the last of its share (DDP syncs it, the step is asked)."""
        self.ends_step = True
        """It is the last batch of the step's last share: the step is decided there."""
        self._decided: bool | None = None  # for the batch handed out last: go on, or stopped
        self._handles: list[Any] = []

    def attach(
        self, parameters: Sequence[torch.Tensor], optimizers: Sequence[torch.optim.Optimizer]
    ) -> None:
        """Decide the steps of ``optimizers`` over ``parameters`` (the union given to setup)."""
        self.parameters = list(parameters)
        self.optimizers = list(optimizers)
        for optimizer in optimizers:
            self._handles.append(optimizer.register_step_pre_hook(self._pre_hook))

    def detach(self) -> None:
        """Remove the pre-hooks from the optimizers (the Context's teardown)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()

    def new_batch(self, *, ends_share: bool, ends_step: bool) -> None:
        """A training loader hands out a batch: its step is not decided yet."""
        self.ends_share, self.ends_step, self._decided = ends_share, ends_step, None

    def new_step(self) -> None:
        """A step begins: nothing set aside."""
        self._aside = None

    @property
    def counts(self) -> bool:
        """Whether the last decision let the optimizers step (a Checkpointer counts it)."""
        return self._decided is not False

    # ---- the decision ----------------------------------------------------------------------------
    def decide(self, optimizers: Sequence[torch.optim.Optimizer]) -> bool:
        """True: the optimizers step now. False: they must not (their gradients are gone)."""
        if self._decided is not None:
            return self._decided
        c = self.coordinator
        if not c.in_step:
            if not any(o.state for o in optimizers):
                # Before any step, with no state yet: a checkpoint restore making the optimizer's
                # state (torch.distributed.checkpoint steps it with zero gradients), not training.
                return True
            raise UsageError(
                "optimizer.step() under --replicas outside a step of ctx.loader(...): the "
                "groups agree on each step at its first batch; iterate a training loader made "
                "by ctx.loader (drop_last) and step inside the loop"
            )
        if not self.ends_step:
            self._set_aside()
            self._decided = False
            return False
        self._take_back()
        committed = c.finish_step(self.parameters)
        if committed and self.scaler is not None:
            self._agree_on_infs()
        if not committed:
            self._drop_gradients()
        self._decided = committed
        return committed

    def _pre_hook(self, optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        if not self.decide([optimizer]):
            self._drop_gradients()  # torch's optimizers skip a parameter without a gradient

    # ---- gradients set aside ---------------------------------------------------------------------
    def _set_aside(self) -> None:
        """This share's gradients join the ones set aside; the parameters keep none."""
        aside = self._aside or [None] * len(self.parameters)
        for i, p in enumerate(self.parameters):
            if p.grad is None:
                continue
            grad, kept = p.grad.detach(), aside[i]
            # A copy: DDP's gradient is a view into its bucket, which the next backward fills.
            aside[i] = grad.clone() if kept is None else kept.add_(grad)
            p.grad = None
        self._aside = aside
        if self.scaler is not None:
            for optimizer in self.optimizers:
                if scaler_unscaled(self.scaler, optimizer):
                    scaler_forget_unscale(self.scaler, optimizer)

    def _take_back(self) -> None:
        """The step's last share: add what was set aside to its gradients."""
        aside, self._aside = self._aside, None
        for p, grad in zip(self.parameters, aside or (), strict=False):
            if grad is None:
                continue
            if p.grad is None:
                p.grad = grad
            else:
                p.grad.add_(grad)

    def _drop_gradients(self) -> None:
        for p in self.parameters:
            p.grad = None

    def _agree_on_infs(self) -> None:
        """After the groups' sum: an inf in any group's share is in every group's gradient."""
        found = any(
            not bool(torch.isfinite(local_tensor(p.grad)).all())
            for p in self.parameters
            if p.grad is not None
        )
        for optimizer in self.optimizers:
            if scaler_unscaled(self.scaler, optimizer):
                scaler_set_found_inf(self.scaler, optimizer, found)
