"""multigpu: run a one-device PyTorch training script on every GPU, CPU process or machine.

The names below are imported on first use (PEP 562): ``import multigpu`` costs nothing until
one is used, so the command line refuses bad input without importing torch (under a second).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
from typing import TYPE_CHECKING, Any

# The imports below are for type checkers only; at run time __getattr__ imports each name from
# _EXPORTS, which __all__ lists too.
# ruff: noqa: F401
if TYPE_CHECKING:
    from multigpu.checkpoint import (
        Checkpointer,
        CheckpointStatus,
        LoadReport,
        find_latest,
        load_weights,
        verify_checkpoint,
    )
    from multigpu.env import ClusterEnv, detect
    from multigpu.errors import (
        CheckpointError,
        CheckpointLockedError,
        CheckpointMismatchError,
        CheckpointUnreadableError,
        DataError,
        DeviceError,
        EnvError,
        LaunchError,
        MultiGPUError,
        UsageError,
    )
    from multigpu.estimate import MemoryEstimate, estimate_memory
    from multigpu.runtime.device import move_to_device
    from multigpu.runtime.seed import seed_everything
    from multigpu.session.context import Context
    from multigpu.session.initialize import init
    from multigpu.session.metrics import (
        Accuracy,
        Mean,
        Metric,
        Sum,
        gather_all,
        gather_in_dataset_order,
    )
    from multigpu.strategies import (
        DataParallelStrategy,
        DDPStrategy,
        FSDPStrategy,
        MeshShape,
        PipelineStrategy,
        SingleDeviceStrategy,
        Strategy,
        TensorParallelStrategy,
        unwrap_module,
    )
    from multigpu.strategies.model_parallel import place_stages

__version__ = "0.1.0"

_EXPORTS = {
    "multigpu.checkpoint": (
        "Checkpointer CheckpointStatus LoadReport find_latest load_weights verify_checkpoint"
    ),
    "multigpu.session.context": "Context",
    "multigpu.runtime.device": "move_to_device",
    "multigpu.env": "ClusterEnv detect",
    "multigpu.errors": (
        "CheckpointError CheckpointLockedError CheckpointMismatchError CheckpointUnreadableError "
        "DataError DeviceError EnvError LaunchError MultiGPUError UsageError"
    ),
    "multigpu.estimate": "MemoryEstimate estimate_memory",
    "multigpu.session.initialize": "init",
    "multigpu.session.metrics": "Accuracy Mean Metric Sum gather_all gather_in_dataset_order",
    "multigpu.runtime.seed": "seed_everything",
    "multigpu.strategies": (
        "DataParallelStrategy DDPStrategy FSDPStrategy MeshShape PipelineStrategy "
        "SingleDeviceStrategy Strategy TensorParallelStrategy unwrap_module"
    ),
    "multigpu.strategies.model_parallel": "place_stages",
}
"""The module that defines each public name."""
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}

__all__ = sorted(["__version__", *_WHERE])


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        # A subpackage (``multigpu.errors``), as when this module imported them all eagerly.
        if name.startswith("_") or importlib.util.find_spec(f"{__name__}.{name}") is None:
            raise AttributeError(f"module 'multigpu' has no attribute {name!r}")
        return importlib.import_module(f"{__name__}.{name}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))


if os.environ.get("MULTIGPU_AGENT_PID"):  # in a worker of `multigpu run`: Ctrl-C ends quietly
    from multigpu.common import worker_exit

    worker_exit.install()
