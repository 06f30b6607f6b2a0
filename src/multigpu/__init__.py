"""multigpu: run a one-device PyTorch training script on every GPU, CPU process or machine.

Example:
    >>> import multigpu
    >>> ctx = multigpu.init()            # doctest: +SKIP
"""

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
from multigpu.env import ClusterEnv, detect
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
from multigpu.estimate import MemoryEstimate, estimate_memory
from multigpu.initialize import init
from multigpu.metrics import Accuracy, Mean, Metric, Sum, gather_all, gather_in_dataset_order
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

__version__ = "0.1.0"

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
    "seed_everything",
    "unwrap_module",
    "verify_checkpoint",
]
