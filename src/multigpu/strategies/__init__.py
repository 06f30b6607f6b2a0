"""Strategies: how a model is placed and wrapped (single, dp, ddp) and how ``auto`` picks one."""

from __future__ import annotations

from multigpu.errors import UsageError
from multigpu.strategies.base import Strategy, unwrap_module
from multigpu.strategies.ddp import DDPStrategy
from multigpu.strategies.dp import DataParallelStrategy
from multigpu.strategies.single import SingleDeviceStrategy

STRATEGY_NAMES = ("auto", "single", "dp", "ddp")


def resolve_strategy(strategy: str | Strategy, world_size: int) -> Strategy:
    """Turn a name (or an instance) into a Strategy; ``auto`` is ``ddp`` above one process.

    ``auto`` never picks ``dp``: DataParallel is legacy and must be asked for by name.
    """
    if isinstance(strategy, Strategy):
        return strategy
    name = str(strategy).lower()
    if name == "auto":
        name = "ddp" if world_size > 1 else "single"
    if name == "single":
        return SingleDeviceStrategy()
    if name == "dp":
        return DataParallelStrategy()
    if name == "ddp":
        return DDPStrategy()
    raise UsageError(
        f"strategy={strategy!r} is not known; expected one of {STRATEGY_NAMES} "
        "or a Strategy instance"
    )


__all__ = [
    "STRATEGY_NAMES",
    "DDPStrategy",
    "DataParallelStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "resolve_strategy",
    "unwrap_module",
]
