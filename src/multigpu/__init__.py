"""multigpu: run a one-device PyTorch training script on every GPU, CPU process or machine.

The names below are imported on first use (PEP 562): ``import multigpu`` costs nothing until
one is used, so the command line refuses bad input without importing torch (under a second).

Example:
    >>> import multigpu
    >>> ctx = multigpu.init()            # doctest: +SKIP
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from multigpu.checkpoint import (
        Checkpointer,
        CheckpointStatus,
        LoadReport,
        find_latest,
        load_weights,
        verify_checkpoint,
    )
    from multigpu.context import Context
    from multigpu.device import move_to_device
    from multigpu.env import (
        ClusterEnv,
        detect,
    )
    from multigpu.errors import (
        CheckpointError,
        CheckpointLockedError,
        CheckpointMismatchError,
        DeviceError,
        EnvError,
        LaunchError,
        MultiGPUError,
        UsageError,
    )
    from multigpu.estimate import (
        MemoryEstimate,
        estimate_memory,
    )
    from multigpu.initialize import init
    from multigpu.metrics import (
        Accuracy,
        Mean,
        Metric,
        Sum,
        gather_all,
        gather_in_dataset_order,
    )
    from multigpu.seed import seed_everything
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

_WHERE: dict[str, str] = {
    "Checkpointer": "multigpu.checkpoint",
    "CheckpointStatus": "multigpu.checkpoint",
    "LoadReport": "multigpu.checkpoint",
    "find_latest": "multigpu.checkpoint",
    "load_weights": "multigpu.checkpoint",
    "verify_checkpoint": "multigpu.checkpoint",
    "Context": "multigpu.context",
    "move_to_device": "multigpu.device",
    "ClusterEnv": "multigpu.env",
    "detect": "multigpu.env",
    "CheckpointError": "multigpu.errors",
    "CheckpointLockedError": "multigpu.errors",
    "CheckpointMismatchError": "multigpu.errors",
    "DeviceError": "multigpu.errors",
    "EnvError": "multigpu.errors",
    "LaunchError": "multigpu.errors",
    "MultiGPUError": "multigpu.errors",
    "UsageError": "multigpu.errors",
    "MemoryEstimate": "multigpu.estimate",
    "estimate_memory": "multigpu.estimate",
    "init": "multigpu.initialize",
    "Accuracy": "multigpu.metrics",
    "Mean": "multigpu.metrics",
    "Metric": "multigpu.metrics",
    "Sum": "multigpu.metrics",
    "gather_all": "multigpu.metrics",
    "gather_in_dataset_order": "multigpu.metrics",
    "seed_everything": "multigpu.seed",
    "place_stages": "multigpu.strategies.model_parallel",
    "DataParallelStrategy": "multigpu.strategies",
    "DDPStrategy": "multigpu.strategies",
    "FSDPStrategy": "multigpu.strategies",
    "MeshShape": "multigpu.strategies",
    "PipelineStrategy": "multigpu.strategies",
    "SingleDeviceStrategy": "multigpu.strategies",
    "Strategy": "multigpu.strategies",
    "TensorParallelStrategy": "multigpu.strategies",
    "unwrap_module": "multigpu.strategies",
}
"""Each public name -> the module that defines it."""

__all__ = [
    "Accuracy",
    "CheckpointError",
    "CheckpointLockedError",
    "CheckpointMismatchError",
    "CheckpointStatus",
    "Checkpointer",
    "ClusterEnv",
    "Context",
    "DDPStrategy",
    "DataParallelStrategy",
    "DeviceError",
    "EnvError",
    "FSDPStrategy",
    "LaunchError",
    "LoadReport",
    "Mean",
    "MemoryEstimate",
    "MeshShape",
    "Metric",
    "MultiGPUError",
    "PipelineStrategy",
    "SingleDeviceStrategy",
    "Strategy",
    "Sum",
    "TensorParallelStrategy",
    "UsageError",
    "__version__",
    "detect",
    "estimate_memory",
    "find_latest",
    "gather_all",
    "gather_in_dataset_order",
    "init",
    "load_weights",
    "move_to_device",
    "place_stages",
    "seed_everything",
    "unwrap_module",
    "verify_checkpoint",
]


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
