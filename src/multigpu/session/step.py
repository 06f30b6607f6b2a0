"""The optimizer step, one object: its micro-batches, their gradients' sync, the loss weighting,
the decision to step, and the events the meter and the hooks hear.

A step is the micro-batches a loader hands out between two optimizer steps. ``ctx.accumulate``
decides, from the loader's position, whether the current micro-batch ends the step. On every
micro-batch but the last it enters DDP's ``no_sync`` (no gradient all-reduce) and ``ctx.step``
does nothing; on the last, gradients are all-reduced once and the step is asked of the hooks
(``before_step``: a replica group commits it there, or holds it, never by patching the user's
optimizer) and then taken. Its events go to the ``StepMeter`` (``batch``, ``work_began``,
``backward_ended``, ``stepped``) and, once stepped, to the hooks (``after_step``); a step the
script takes itself (``optimizer.step()``, the README's loop) is heard through the first
optimizer's post-hook, so every loop shape is counted once.

Two ways to normalise the loss, both giving the gradient of one big step over the global batch:

- ``ctx.backward(loss)`` with a mean loss: inside ``accumulate`` the loss is divided by the
  number of micro-steps and DDP/FSDP average over ranks, so the gradient is the mean of the
  micro-batches' means. Exact when every micro-batch's mean is over the same number of items;
  no collective of its own.
- ``ctx.backward(loss_sum, num_items=n)``, for losses over a varying number of items (tokens
  of padded sequences, ``ignore_index``): the sums are backpropagated as they are and the
  counts added up on this rank; at the micro-batch that ends the step, after the gradient
  reduction, one all-reduce of (items, loss sum, micro-batches) gives the global count ``N`` and
  the gradients are multiplied by ``world_size / N`` (DDP and FSDP averaged over ranks). The
  gradient is then that of the global per-item mean, at any world size and accumulation — the
  normalisation torchtune and transformers (``num_items_in_batch``) adopted in 2024, with no
  look-ahead over the step's batches. The mean loss is the same as ``num_items=1`` on every
  micro-batch, for which dividing up front is exact and cheaper.
"""

from __future__ import annotations

import contextlib
import logging
import math
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from multigpu.common.log import warn_once
from multigpu.data import DistributedLoader, StreamLoader
from multigpu.errors import UsageError
from multigpu.runtime import dist
from multigpu.runtime.precision import Precision
from multigpu.strategies import Strategy
from multigpu.throughput.meter import StepMeter

log = logging.getLogger(__name__)

AGAIN = (
    "ctx.backward(num_items=...) ran again after the backward that ended the optimizer step: "
    "that one already rescaled the gradients to the step's mean, so this loss would be weighed "
    "apart; add the micro-batch's losses and their counts and call ctx.backward once per "
    "micro-batch"
)

MIXED = (
    "ctx.backward got num_items on {had} micro-batch of this optimizer step but not on {this}; "
    "pass num_items on every micro-batch of a step (its gradient is normalised by their total) "
    "or on none"
)


def _count(num_items: Any) -> torch.Tensor | float:
    """``num_items`` checked: a finite number >= 0, or a one-element tensor (not read: no sync)."""
    if isinstance(num_items, torch.Tensor):
        if num_items.numel() != 1 or num_items.is_complex():
            raise UsageError(
                f"ctx.backward(num_items=...) got a tensor of shape {tuple(num_items.shape)}; "
                "expected one number: the count of items the loss sums over, e.g. "
                "num_items=(labels != -100).sum()"
            )
        return num_items.detach().reshape(())
    if isinstance(num_items, bool) or not isinstance(num_items, int | float):
        raise UsageError(
            f"ctx.backward(num_items={num_items!r}) got a {type(num_items).__name__}; expected "
            "the count of items the loss sums over: an int, a float or a one-element tensor, "
            "e.g. num_items=(labels != -100).sum()"
        )
    if not math.isfinite(num_items) or num_items < 0:
        raise UsageError(
            f"ctx.backward(num_items={num_items!r}); expected a count >= 0 of the items the "
            "loss sums over"
        )
    return float(num_items)


class OptimizerStep:
    """One Context's optimizer steps (see the module doc)."""

    def __init__(
        self,
        strategy: Strategy,
        precision: Precision,
        comm_device: Callable[[], torch.device],
        meter: StepMeter,
        *,
        before_step: Callable[[Sequence[torch.optim.Optimizer]], bool] = lambda _: True,
        after_step: Callable[[], None] = lambda: None,
    ) -> None:
        self.strategy = strategy
        self.meter = meter
        self.before_step = before_step
        """Asked before the optimizers step: False stops the step (the Context's hooks)."""
        self.after_step = after_step
        """Told after a step stepped (the Context's hooks: a profiler's window, a tracker)."""
        self.run_backward: Callable[..., None] = self._backward
        """The backward, as the hooks wrapped it (``wrap_backward``)."""
        self._in_step = False  # inside step(): its optimizers' steps are noted there, once
        self._watching = False  # the first optimizer given to setup is heard (note_setup)
        self.precision = precision
        self.comm_device = comm_device
        """Where the count's all-reduce runs (the GPU under NCCL, else the CPU)."""
        self.active_loader: DistributedLoader | StreamLoader | None = None
        self._micro_steps = 1  # > 1 only inside accumulate() on an accumulating loader
        # False on a micro-batch that does not end its step, from accumulate() until the
        # loader's next batch: step() after the block skips as it does inside.
        self.sync_step = True
        self._trained: list[weakref.ref[Any]] = []  # models and optimizers given to setup
        # This step's (items, loss sum, micro-batches) on this rank; None: no num_items yet.
        self._totals: torch.Tensor | None = None
        self._plain_in_step = False  # a micro-batch of this step came without num_items
        self._prescale = 1.0  # see _weighted_backward
        # The step's gradients are rescaled: a weighted backward before the next batch, step or
        # optimizer step would be weighed apart. Set only where one of those will clear it.
        self._step_ended = False
        self._hooked = False  # an optimizer given to setup clears it as it steps
        self.last_loss: torch.Tensor | None = None
        """The global per-item mean loss of the last step whose losses came with num_items."""

    def wrap_backward(self, wrapper: Callable[[Callable[..., None]], Callable[..., None]]) -> None:
        """Put ``wrapper`` around the backward (a hook's ``wrap_backward``)."""
        self.run_backward = wrapper(self.run_backward)

    def note_setup(self, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> None:
        """``ctx.setup`` made ``model``: its gradients (and its optimizers') are rescaled, and
        the steps the script takes itself of the first optimizer are counted."""
        self._trained.extend(weakref.ref(obj) for obj in (model, *optimizers))
        for optimizer in optimizers:
            optimizer.register_step_post_hook(self._new_step)
            self._hooked = True
        if optimizers and not self._watching:
            # Without it, a loop calling optimizer.step() itself (the README's) had no step:
            # ctx.throughput() returned None for every figure and a profile window never opened.
            self._watching = True
            optimizers[0].register_step_post_hook(self._stepped_by_script)

    def _new_step(self, *_: Any) -> None:
        self._step_ended = False

    def _stepped_by_script(self, *_: Any) -> None:
        if not self._in_step:  # step() notes its own, once for all its optimizers
            self._stepped()

    def _stepped(self) -> None:
        """A step stepped: the meter counts it (with the loader's global batch), the hooks hear."""
        loader = self.active_loader
        samples = loader.global_batch_size if loader is not None else 0
        self.meter.stepped(samples, getattr(loader, "tokens_per_sample", None))
        self.after_step()

    def note_batch(self, loader: DistributedLoader | StreamLoader) -> None:
        """Called by a Context-made loader as it hands out a batch (a new micro-batch)."""
        self.active_loader = loader
        self.sync_step = True  # the next accumulate() decides for this micro-batch
        self._step_ended = False
        self.meter.batch()

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

    def backward(self, loss: torch.Tensor, num_items: Any = None, **kwargs: Any) -> None:
        """``ctx.backward``: the hooks' wrapped backward, timed by the meter."""
        self.meter.work_began()
        self.run_backward(loss, num_items=num_items, **kwargs)
        self.meter.backward_ended()

    def _backward(self, loss: torch.Tensor, num_items: Any = None, **kwargs: Any) -> None:
        loader = self.active_loader
        if self._micro_steps == 1 and loader is not None and loader.accumulation_steps > 1:
            warn_once(
                log,
                "the loader has accumulation_steps=%d but ctx.backward ran outside "
                "ctx.accumulate(model): gradients are all-reduced and scaled as full steps; wrap "
                "the step in `with ctx.accumulate(model):` and call ctx.step(optimizer)",
                loader.accumulation_steps,
            )
        if num_items is not None:
            self._weighted_backward(loss, _count(num_items), **kwargs)
            return
        if self._totals is not None:
            self._totals = None  # the step is abandoned: the next one starts afresh
            raise UsageError(MIXED.format(had="an earlier", this="this one"))
        self._plain_in_step = not self.sync_step
        if self._micro_steps > 1:
            loss = loss / self._micro_steps
        self.precision.backward(loss, **kwargs)

    def _weighted_backward(
        self, loss: torch.Tensor, items: torch.Tensor | float, **kwargs: Any
    ) -> None:
        if self._plain_in_step:
            self._plain_in_step = False
            raise UsageError(MIXED.format(had="this", this="an earlier one"))
        if self._step_ended:
            raise UsageError(AGAIN)
        if not self._trained:
            raise UsageError(
                "ctx.backward(num_items=...) rescales the gradients of the model given to "
                "ctx.setup once the step's items are counted, and no model was set up; call "
                "model, optimizer = ctx.setup(model, optimizer) first"
            )
        device = self.comm_device()
        here = torch.stack(
            [
                torch.as_tensor(items, dtype=torch.float64).to(device),
                loss.detach().to(device=device, dtype=torch.float64).sum(),
                torch.ones((), dtype=torch.float64, device=device),
            ]
        )
        self._totals = here if self._totals is None else self._totals + here
        # A sum over thousands of tokens has gradients that many times a mean's, which float16
        # overflows under the GradScaler's scale; divided by the last step's items per
        # micro-batch (the same number on every rank), it is a mean's size again, and the
        # final rescaling multiplies it back.
        self.precision.backward(loss / self._prescale if self._prescale != 1 else loss, **kwargs)
        if self.sync_step:
            self._end_weighted_step()

    def _end_weighted_step(self) -> None:
        """After the step's last backward (gradients reduced): the global count, the rescaling."""
        totals, self._totals = self._totals, None
        assert totals is not None  # set by the caller
        world = dist.world_size()
        if world > 1:
            totals = dist.all_reduce(totals, op="sum")
        items, loss_sum, micro = totals.unbind()
        # DDP and FSDP averaged over the ranks: undo it (x world) and divide by every rank's items.
        # (Also right on a tensor-parallel mesh: its tp ranks count the same items, which the
        # gradients' average over world / tp ranks divides out.)
        factor = torch.where(items > 0, world * self._prescale / items, torch.zeros_like(items))
        for grad in self._gradients():
            grad.mul_(factor.to(grad.device))
        self.last_loss = loss_sum / items
        self._step_ended = self._hooked or self.active_loader is not None
        if self.precision.scaler is not None:
            self._prescale = max(1.0, float(items / micro))

    def forward_backward(
        self,
        model: nn.Module,
        inputs: tuple[Any, ...],
        target: Any,
        loss_fn: Callable[[Any, Any], torch.Tensor],
        num_items: Any,
    ) -> torch.Tensor | None:
        """The strategy's own forward and backward (a pipeline's schedule runs its micro-batches)
        and its loss, or None: the strategy left them to the Context. With ``num_items`` the
        loss is summed over that many items in the whole batch, and the per-item mean returned."""
        self.meter.work_began()
        if num_items is None:
            return self.strategy.forward_backward(model, inputs, target, loss_fn)
        # The schedule averages its micro-batches' losses and gradients: each micro-batch's sum
        # times microbatches / num_items averages to the sum over the batch / num_items. Every
        # process holds the whole batch: num_items is already the global count.
        microbatches = getattr(self.strategy, "microbatches", 1)
        weight = microbatches / torch.as_tensor(_count(num_items), dtype=torch.float64)

        def weighted(output: Any, tgt: Any) -> torch.Tensor:
            loss = loss_fn(output, tgt)
            return loss * weight.to(device=loss.device, dtype=loss.dtype)

        done = self.strategy.forward_backward(model, inputs, target, weighted)
        if done is not None:
            self.last_loss = done.detach().to(torch.float64)
        return done

    def _parameters(self) -> list[torch.Tensor]:
        """The parameters of the models and optimizers given to ctx.setup, each once."""
        seen: dict[int, torch.Tensor] = {}
        for ref in self._trained:
            obj = ref()
            if isinstance(obj, nn.Module):
                params: Any = obj.parameters()
            elif isinstance(obj, torch.optim.Optimizer):
                params = (p for group in obj.param_groups for p in group["params"])
            else:
                continue  # freed
            for param in params:
                seen.setdefault(id(param), param)
        return list(seen.values())

    def _gradients(self) -> list[torch.Tensor]:
        return [p.grad for p in self._parameters() if p.grad is not None]

    def step(self, *optimizers: torch.optim.Optimizer, zero_grad: bool = True) -> bool:
        """``ctx.step``: True when the optimizers stepped."""
        if not self.sync_step:
            return False
        self._step_ended = False
        # Under replica groups a share that is not the step's last, or a step the groups did
        # not commit, stops here (multigpu.replicas.step_gate): the hook keeps the gradients.
        if not self.before_step(optimizers):
            return False
        self._in_step = True
        try:
            self.precision.step(*optimizers)
        finally:
            self._in_step = False
        if zero_grad:
            for optimizer in optimizers:
                optimizer.zero_grad(set_to_none=True)
        self._stepped()
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
