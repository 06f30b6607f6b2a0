"""Strategies: how a model is placed and wrapped (single, dp, ddp, fsdp, tp) and how ``auto`` picks.

``resolve_strategy`` reads ``MULTIGPU_COMPRESSION`` and ``MULTIGPU_MESH`` for the strategies whose
code did not set them; a strategy object the script made is never changed by them (a copy is).
"""

from __future__ import annotations

import copy
import logging
import os
from collections.abc import Callable, Mapping
from typing import TypeVar

from multigpu.common import variables
from multigpu.common.choices import STRATEGY_NAMES
from multigpu.common.mesh import MeshShape
from multigpu.errors import UsageError
from multigpu.strategies.auto import AutoStrategy
from multigpu.strategies.base import Strategy, unwrap_module
from multigpu.strategies.compression import COMPRESSION_ENV
from multigpu.strategies.ddp import DDPStrategy
from multigpu.strategies.dp import DataParallelStrategy
from multigpu.strategies.fsdp import FSDPStrategy
from multigpu.strategies.pipeline import PipelineStrategy
from multigpu.strategies.single import SingleDeviceStrategy
from multigpu.strategies.tensor_parallel import TensorParallelStrategy

log = logging.getLogger(__name__)

S = TypeVar("S", bound=Strategy)


def resolve_strategy(
    strategy: str | Strategy, world_size: int, environ: Mapping[str, str] | None = None
) -> Strategy:
    """Turn a name (or an instance) into a Strategy; ``auto`` is ``ddp`` above one process.

    ``auto`` never picks ``dp``: DataParallel is legacy and must be asked for by name. Above one
    process it is an ``AutoStrategy``: ``ctx.setup`` has it switch to ``fsdp`` when the model's
    training state does not fit a rank's memory under DDP (``multigpu.estimate``), the same
    object throughout.
    ``MULTIGPU_COMPRESSION`` (in ``environ``, default ``os.environ``) sets the gradient
    compression of a ``ddp`` strategy whose code did not choose one; it is checked whatever the
    strategy, and has nothing to compress without DDP (one process, or ``dp``). A strategy
    object given is returned as it is, or, when a variable changes it, as a changed copy.

    Example:
        >>> resolve_strategy("auto", 2, {"MULTIGPU_COMPRESSION": "fp16"}).describe()["compression"]
        'fp16'
    """
    env = os.environ if environ is None else environ
    compression = variables.compression(env)
    if isinstance(strategy, Strategy):
        if isinstance(strategy, DDPStrategy) and strategy.compression is None and compression:
            strategy = _copy(strategy)
            strategy.compression = compression
        return _with_env_mesh(strategy, world_size, env)
    name = str(strategy).lower()
    auto = name == "auto"
    if auto:
        name = "ddp" if world_size > 1 else "single"
    if name in ("single", "dp", "fsdp") and compression not in (None, "none"):
        log.debug(
            "%s=%s ignored: strategy %s has no DDP all-reduce", COMPRESSION_ENV, compression, name
        )
    factories: dict[str, Callable[[], Strategy]] = {
        "single": SingleDeviceStrategy,
        "dp": DataParallelStrategy,
        "ddp": lambda: DDPStrategy(compression=compression),
        "fsdp": FSDPStrategy,
        "pipeline": PipelineStrategy,  # split evenly; setup asks for the example batch
    }
    if name not in factories:
        raise UsageError(
            f"strategy={strategy!r} is not known; expected one of {STRATEGY_NAMES} "
            "or a Strategy instance"
        )
    chosen = factories[name]()
    # One process has nothing to choose between: auto is single there.
    decides = auto and world_size > 1
    return _with_env_mesh(AutoStrategy(chosen) if decides else chosen, world_size, env)


def _copy(strategy: S) -> S:
    """A copy of a strategy not used yet, to change without touching the script's object (its
    lists and dicts copied too: what one wraps must not show in the other)."""
    clone = copy.copy(strategy)
    for key, value in vars(clone).items():
        if isinstance(value, list | dict | set):
            setattr(clone, key, copy.copy(value))
    return clone


def _with_env_mesh(strategy: Strategy, world_size: int, env: Mapping[str, str]) -> Strategy:
    """``strategy`` with ``MULTIGPU_MESH`` applied: the mesh of an FSDP strategy whose code gave
    none; one whose code gave a mesh must agree with it; a strategy without a mesh refuses it."""
    spec = variables.mesh(env)
    if spec is None:
        return strategy
    raw = env["MULTIGPU_MESH"].strip()
    if not isinstance(strategy, FSDPStrategy):
        raise UsageError(
            f"MULTIGPU_MESH={raw} (from the environment) shapes a device mesh, but strategy "
            f"{strategy.name!r} uses none; unset MULTIGPU_MESH, or use strategy='fsdp' "
            "(MULTIGPU_STRATEGY=fsdp) or TensorParallelStrategy"
        )
    if not strategy.shape_given:
        sized = _copy(strategy)
        sized.set_mesh_shape(spec, given_as="MULTIGPU_MESH")
        return sized
    from_env = MeshShape.parse(spec).resolve(world_size)
    from_code = strategy.shape.resolve(world_size)
    if from_env != from_code:
        axes = zip(from_code.axis_names, from_code.sizes, strict=True)
        raise UsageError(
            f"MULTIGPU_MESH={raw} (from the environment) differs from the mesh the script's "
            f"strategy sets ({','.join(f'{a}={n}' for a, n in axes)}); unset MULTIGPU_MESH or "
            "make them equal"
        )
    return strategy


__all__ = [
    "AutoStrategy",
    "DDPStrategy",
    "DataParallelStrategy",
    "FSDPStrategy",
    "MeshShape",
    "PipelineStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "TensorParallelStrategy",
    "resolve_strategy",
    "unwrap_module",
]
