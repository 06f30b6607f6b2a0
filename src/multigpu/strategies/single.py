"""``single``: one process, one device, no wrapper."""

from __future__ import annotations

from torch import nn

from multigpu.errors import UsageError
from multigpu.strategies.base import Strategy
from multigpu.strategies.compose import block_units, compose
from multigpu.strategies.materialize import place


class SingleDeviceStrategy(Strategy):
    """Run on this process's device only; the model is moved, not wrapped."""

    name = "single"

    def validate(self) -> None:
        if self.world_size > 1:
            raise UsageError(
                f"strategy='single' was asked for with world_size={self.world_size}; it trains one "
                "process alone and the ranks would diverge; use strategy='ddp' (or 'auto')"
            )

    def wrap(self, module: nn.Module) -> nn.Module:
        module = place(module, self.device)
        self.composed = compose(  # compile per block (init(compile=)); no checkpointing option
            module,
            block_units(module),
            checkpointing=self.checkpointing,
            backend=self.compile,
        )
        return module
