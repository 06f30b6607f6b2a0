"""Choose this rank's device, the backend for it, and move data to it.

Environment variables read: ``CUDA_VISIBLE_DEVICES`` (through torch), ``MULTIGPU_DEVICE``
(``cpu`` forces CPU even where CUDA is available; ``auto`` or unset: CUDA when present; anything
else is a UsageError).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

import torch

from multigpu.choices import BACKENDS
from multigpu.env.types import ClusterEnv
from multigpu.errors import DeviceError
from multigpu.settings import Settings

T = TypeVar("T")


def cuda_count() -> int:
    """Number of CUDA devices visible to this process (0 without CUDA)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def rank_device(env: ClusterEnv, accelerator: str, settings: Settings) -> torch.device:
    """Return ``cuda:local_rank`` when CUDA is there (and wanted), else ``cpu``.

    Args:
        env: where this process sits in the job.
        accelerator: ``"auto"`` (CUDA if available), ``"cuda"`` (error without it) or ``"cpu"``.
        settings: the environment's values (``MULTIGPU_DEVICE``, ``CUDA_VISIBLE_DEVICES``).

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
    count = cuda_count()
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


def backend_for(device: torch.device, requested: str | None = None) -> str:
    """Return the process-group backend for ``device``: nccl for CUDA, gloo for CPU.

    Raises:
        DeviceError: ``requested`` is unknown, or nccl was asked for on a CPU device.
    """
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
    """Move every tensor in ``obj`` to ``device``, keeping the structure.

    Handles tensors, modules, dicts (and other mappings), lists, tuples, named tuples and
    dataclasses; anything else is returned unchanged.

    Example:
        >>> move_to_device({"x": torch.ones(2), "n": 3}, "cpu")["x"].device
        device(type='cpu')
    """
    target = torch.device(device)
    return _move(obj, target, non_blocking)


def _move(obj: Any, device: torch.device, non_blocking: bool) -> Any:
    if isinstance(obj, torch.Tensor | torch.nn.Module):
        if isinstance(obj, torch.Tensor) and obj.device == device:
            return obj
        return obj.to(device, non_blocking=non_blocking)
    if isinstance(obj, Mapping):
        return type(obj)({k: _move(v, device, non_blocking) for k, v in obj.items()})  # type: ignore[call-arg]
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_move(v, device, non_blocking) for v in obj))
    if isinstance(obj, list | tuple):
        return type(obj)(_move(v, device, non_blocking) for v in obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        changes = {
            f.name: _move(getattr(obj, f.name), device, non_blocking)
            for f in dataclasses.fields(obj)
            if f.init
        }
        return dataclasses.replace(obj, **changes)
    return obj
