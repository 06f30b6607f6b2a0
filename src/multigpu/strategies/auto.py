"""``auto``: one strategy object that decides at ``ctx.setup`` and delegates to the one it chose.

Above one process (alone, auto is simply single) it starts as DDP; ``ctx.setup`` asks once, when
the first model is known, whether the model's training state fits a rank under DDP
(``multigpu.session.rank_memory``), and switches to FSDP when it does not. Everything the Context,
its loaders, ``OptimizerStep`` and the checkpointers made before ``setup`` call goes through this
object, so they all follow the choice: ``ctx.strategy`` is the same object from
``multigpu.init`` to the end, and a manifest names the strategy that wrote it (``describe``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn

from multigpu.runtime.precision import Precision
from multigpu.strategies.base import Strategy
from multigpu.strategies.fsdp import FSDPStrategy


class AutoStrategy(Strategy):
    """``strategy="auto"`` above one process: ``first`` (DDP) until ``decide`` settles on FSDP;
    every call is the chosen strategy's.

    Example:
        >>> from multigpu.strategies import resolve_strategy
        >>> auto = resolve_strategy("auto", 2, {})
        >>> auto.name, auto.decided, auto.describe()["strategy"]
        ('ddp', False, 'ddp')
        >>> auto.decide(lambda: "fsdp")
        >>> auto.name, auto.decided, auto.forward_is_collective
        ('fsdp', True, True)
    """

    def __init__(self, first: Strategy) -> None:
        super().__init__()
        self.chosen = first
        """The strategy every call goes to: ``first`` until ``decide`` picks FSDP."""
        self.decided = False
        """True once ``decide`` ran (the first model decides; a second one joins it)."""

    # What the Context reads of a strategy: the chosen one's.
    @property
    def name(self) -> str:  # type: ignore[override]
        return self.chosen.name

    @property
    def handles_precision(self) -> bool:  # type: ignore[override]
        return self.chosen.handles_precision

    @property
    def needs_process_group(self) -> bool:  # type: ignore[override]
        return self.chosen.needs_process_group

    @property
    def forward_is_collective(self) -> bool:  # type: ignore[override]
        return self.chosen.forward_is_collective

    def bind(
        self,
        device: torch.device,
        world_size: int,
        *,
        sync_batchnorm: bool = False,
        precision: Precision | None = None,
        compile: str | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {
            "sync_batchnorm": sync_batchnorm,
            "precision": precision,
            "compile": compile,
        }
        super().bind(device, world_size, **kwargs)
        self.chosen.bind(device, world_size, **kwargs)

    def decide(self, pick: Callable[[], str]) -> None:
        """Once: ``pick()`` names the strategy to use (``"fsdp"``, or the current one's name).

        ``pick`` is collective (the ranks agree on the choice), so every rank calls ``decide``.
        """
        if self.decided:
            return
        self.decided = True
        if pick() != "fsdp" or isinstance(self.chosen, FSDPStrategy):
            return
        sharded = FSDPStrategy()
        sharded.bind(
            self.device,
            self.world_size,
            sync_batchnorm=self.sync_batchnorm,
            precision=self.precision,
            compile=self.compile,
        )
        self.chosen = sharded  # nothing wrapped yet: the first model is the one deciding

    # ---- every other call: the chosen strategy's ----------------------------------------------
    def __getattr__(self, name: str) -> Any:
        """The chosen strategy's own attributes (``compression``, ``hook_states``, ``blocks``):
        only names this object lacks get here."""
        if name.startswith("_") or name == "chosen":  # not set yet (a copy being made)
            raise AttributeError(name)
        return getattr(self.chosen, name)

    def forward_backward(
        self, model: nn.Module, inputs: tuple[Any, ...], target: Any, loss_fn: Any
    ) -> torch.Tensor | None:
        return self.chosen.forward_backward(model, inputs, target, loss_fn)

    def wrap(self, module: nn.Module) -> nn.Module:
        return self.chosen.wrap(module)

    def setup(self, module: nn.Module, optimizers: Sequence[torch.optim.Optimizer]) -> nn.Module:
        return self.chosen.setup(module, optimizers)

    def unwrap(self, module: nn.Module) -> nn.Module:
        return self.chosen.unwrap(module)

    def no_sync(self, module: nn.Module) -> contextlib.AbstractContextManager[None]:
        return self.chosen.no_sync(module)

    def join(self, module: nn.Module) -> contextlib.AbstractContextManager[Any]:
        return self.chosen.join(module)

    def clip_grad_norm(
        self, module: nn.Module, max_norm: float, norm_type: float = 2.0
    ) -> torch.Tensor:
        return self.chosen.clip_grad_norm(module, max_norm, norm_type)

    def model_state(self, module: nn.Module) -> dict[str, Any]:
        return self.chosen.model_state(module)

    def full_model_state(self, module: nn.Module) -> dict[str, Any]:
        return self.chosen.full_model_state(module)

    def tied_names(self, module: nn.Module) -> dict[str, str]:
        return self.chosen.tied_names(module)

    def optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, *, initialise: bool = False
    ) -> dict[str, Any]:
        return self.chosen.optimizer_state(module, optimizer, initialise=initialise)

    def load_model_state(self, module: nn.Module, saved: Mapping[str, Any]) -> None:
        self.chosen.load_model_state(module, saved)

    def load_optimizer_state(
        self, module: nn.Module, optimizer: torch.optim.Optimizer, saved: Mapping[str, Any]
    ) -> None:
        self.chosen.load_optimizer_state(module, optimizer, saved)

    @property
    def mesh(self) -> Any:
        return self.chosen.mesh

    def data_shard(self, rank: int, world_size: int) -> tuple[int, int]:
        return self.chosen.data_shard(rank, world_size)

    def teardown(self) -> None:
        self.chosen.teardown()

    def describe(self) -> dict[str, Any]:
        """The chosen strategy's description (what a checkpoint's manifest records)."""
        return self.chosen.describe()


def in_use(strategy: Strategy) -> Strategy:
    """The strategy that does the work: the one ``auto`` chose, or ``strategy`` itself."""
    return strategy.chosen if isinstance(strategy, AutoStrategy) else strategy
