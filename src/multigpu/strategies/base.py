"""The Strategy interface: how a model is placed, wrapped and unwrapped."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from multigpu.device import move_to_device
from multigpu.wrappers import unwrap_module

__all__ = ["Strategy", "unwrap_module"]


class Strategy(ABC):
    """Places a model on this rank's device and wraps it for data parallelism.

    Subclasses are configured in their constructor and bound to a device and world by
    ``bind`` (done by ``multigpu.init``).
    """

    name: str = "base"

    def __init__(self) -> None:
        self.device = torch.device("cpu")
        self.world_size = 1
        self.sync_batchnorm = False

    def bind(self, device: torch.device, world_size: int, *, sync_batchnorm: bool = False) -> None:
        """Attach the strategy to this rank's device and the job's world size."""
        self.device = device
        self.world_size = world_size
        self.sync_batchnorm = sync_batchnorm
        self.validate()

    def validate(self) -> None:  # noqa: B027 - optional hook
        """Raise a UsageError when the strategy cannot run in the bound world."""

    @abstractmethod
    def wrap(self, module: nn.Module) -> nn.Module:
        """Move ``module`` to the device and wrap it; return what the training loop calls."""

    def setup_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """Move loaded optimizer state to the device; the parameters move with the model."""
        for state in optimizer.state.values():
            for key, value in list(state.items()):
                # "step" stays where torch keeps it (CPU for most optimizers).
                if isinstance(value, torch.Tensor) and key != "step":
                    state[key] = move_to_device(value, self.device)
        return optimizer

    def unwrap(self, module: nn.Module) -> nn.Module:
        """Return the plain module (no ``module.``/``_orig_mod.`` prefixes in its state dict)."""
        return unwrap_module(module)

    @contextlib.contextmanager
    def no_sync(self, module: nn.Module) -> Iterator[None]:
        """Skip gradient synchronisation inside the block (no-op unless the wrapper supports it)."""
        yield

    def join(self, module: nn.Module) -> contextlib.AbstractContextManager[Any]:
        """Context for uneven inputs across ranks (no-op unless the wrapper supports it)."""
        return contextlib.nullcontext()

    def teardown(self) -> None:  # noqa: B027 - optional hook
        """Release what the strategy holds before the process group goes away."""

    def describe(self) -> dict[str, Any]:
        """A short JSON-able description (for logs and metrics)."""
        return {"strategy": self.name}
