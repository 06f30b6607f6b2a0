"""Choose this rank's device, the backend for it, and move data to it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import torch

from multigpu.common.choices import BACKENDS
from multigpu.common.variables import Settings
from multigpu.env.types import ClusterEnv
from multigpu.errors import DeviceError

T = TypeVar("T")


def rank_device(env: ClusterEnv, accelerator: str, settings: Settings) -> torch.device:
    """Return ``cuda:local_rank`` when CUDA is there (and wanted), else ``cpu``; in a Ray Train
    worker the device Ray gave it (``ray_device``).

    ``accelerator``: ``"auto"`` (CUDA if available), ``"cuda"`` (error without it) or ``"cpu"``;
    ``MULTIGPU_DEVICE=cpu`` (``settings.device``) forces the CPU.

    Raises:
        DeviceError: CUDA was asked for but is missing, or there are fewer visible GPUs than
            processes on this node.
    """
    if accelerator not in ("auto", "cuda", "gpu", "cpu"):
        raise DeviceError(
            f"accelerator={accelerator!r} is not known; expected 'auto', 'cuda' or 'cpu'"
        )
    forced_cpu = settings.device == "cpu"
    if forced_cpu and accelerator in ("cuda", "gpu"):
        raise DeviceError(
            f"accelerator={accelerator!r} was asked for in code, but MULTIGPU_DEVICE=cpu (set by "
            "`multigpu run --cpu`) asks for CPU processes; drop one of the two"
        )
    if accelerator == "cpu" or forced_cpu:
        return torch.device("cpu")
    if env.source == "ray":
        return ray_device(accelerator)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if count == 0:
        if accelerator in ("cuda", "gpu"):
            raise DeviceError(
                "accelerator='cuda' was asked for but torch sees no CUDA device "
                f"(torch {torch.__version__}, CUDA build: {torch.version.cuda}); "
                "use accelerator='cpu' or install a CUDA build of torch"
            )
        return torch.device("cpu")
    if env.local_rank >= count:
        raise DeviceError(
            f"local rank {env.local_rank} needs GPU {env.local_rank} but only {count} are visible "
            f"(CUDA_VISIBLE_DEVICES={settings.cuda_visible_devices or '<unset>'}); "
            f"start at most {count} processes per node, or use --cpu for CPU processes"
        )
    return torch.device("cuda", env.local_rank)


def ray_device(accelerator: str) -> torch.device:
    """A Ray Train worker's device: Ray's own (``ray.train.torch.get_device()``), not
    ``cuda:LOCAL_RANK``. Ray sets each worker's ``CUDA_VISIBLE_DEVICES`` to the GPUs it gave that
    worker, so local rank 1 may see one GPU, ``cuda:0``, or none (``use_gpu=False``).

    Raises:
        DeviceError: ``accelerator="cuda"`` but Ray gave this worker no GPU.
    """
    from ray.train.torch import get_device  # in a Ray Train worker: ray is there

    device = get_device()
    if accelerator in ("cuda", "gpu") and device.type != "cuda":
        raise DeviceError(
            f"accelerator={accelerator!r} was asked for but Ray gave this worker no GPU (its "
            f"device is {device}); give TorchTrainer ScalingConfig(use_gpu=True), or "
            "accelerator='cpu'"
        )
    return device


def backend_for(device: torch.device, requested: str | None = None) -> str:
    """Return the process-group backend for ``device``: ``requested``, else nccl for CUDA and
    gloo for CPU (DeviceError for an unknown one, or nccl on a CPU device)."""
    if requested in (None, "", "auto"):
        return "nccl" if device.type == "cuda" else "gloo"
    if requested not in BACKENDS:
        raise DeviceError(f"backend={requested!r} is not known; expected one of {BACKENDS}")
    if requested == "nccl" and device.type != "cuda":
        raise DeviceError(
            "backend='nccl' was asked for but this rank runs on the CPU (no CUDA device); "
            "use backend='gloo' or run on a machine with NVIDIA GPUs"
        )
    return requested


def move_to_device(obj: T, device: torch.device | str, non_blocking: bool = False) -> T:
    """Move every tensor and module in ``obj`` to ``device``, keeping the structure (see
    ``map_tensors``)."""
    target = torch.device(device)

    def move(leaf: Any) -> Any:
        if isinstance(leaf, torch.Tensor) and leaf.device == target:
            return leaf
        return leaf.to(target, non_blocking=non_blocking)

    return map_tensors(obj, move, (torch.Tensor, torch.nn.Module))


def map_tensors(
    obj: Any, fn: Callable[[Any], Any], leaves: tuple[type, ...] = (torch.Tensor,)
) -> Any:
    """``obj`` with ``fn(leaf)`` for each of its ``leaves``, rebuilt through dicts (and other
    mappings), lists, tuples, named tuples and dataclasses; anything else is kept as it is."""
    if isinstance(obj, leaves):
        return fn(obj)
    if isinstance(obj, Mapping):
        return type(obj)({k: map_tensors(v, fn, leaves) for k, v in obj.items()})  # type: ignore[call-arg]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(map_tensors(v, fn, leaves) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(map_tensors(v, fn, leaves) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: map_tensors(getattr(obj, f.name), fn, leaves)
            for f in dataclasses.fields(obj)
            if f.init
        }
        return dataclasses.replace(obj, **changes)
    return obj
