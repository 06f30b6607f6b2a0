"""An allocation that fails in a training step, said in one line with what would fit.

torch says ``DefaultCPUAllocator: can't allocate memory: you tried to allocate N bytes`` (or
CUDA's ``OutOfMemoryError``) from wherever the allocation happened. The Context turns it into a
``DeviceError`` naming the rank, the step it was in, the model's estimated training state under
the strategy in use against what the rank has, and the ways out.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from multigpu.errors import DeviceError
from multigpu.estimate import device_capacity, estimate_memory
from multigpu.estimate.capacity import GIB
from multigpu.estimate.memory import PRECISIONS

_SIZE = re.compile(r"tried to allocate ([0-9.]+ ?[KMGT]?i?B|\d+ bytes)")


def is_out_of_memory(error: BaseException) -> bool:
    """Whether ``error`` is torch failing to allocate memory (CPU or CUDA)."""
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error)
    return isinstance(error, RuntimeError) and (
        "can't allocate memory" in text  # torch's CPU allocator
        or "std::bad_alloc" in text  # C++ new, inside autograd or gloo
        or "out of memory" in text.lower()
    )


def explain(
    error: BaseException,
    where: str,
    ctx: Any,
    model: nn.Module | None,
    optimizers: Sequence[torch.optim.Optimizer],
) -> DeviceError:
    """The one-line error for an allocation that failed in ``where`` (see the module doc)."""
    size = _SIZE.search(str(error))
    tried = f" (it tried to allocate {size.group(1)})" if size else ""
    strategy, precision = ctx.strategy.name, ctx.precision.name
    need = ""
    if model is not None:
        capacity = device_capacity(ctx.device, ctx.local_world_size)
        est = estimate_memory(
            model,
            world_size=ctx.world_size,
            optimizer=optimizers[0] if optimizers else "adamw",  # unknown classes: measured
            precision=precision if precision in PRECISIONS else "32",
            capacity=capacity,
            device=ctx.device,
        )
        name = strategy if strategy in ("ddp", "fsdp") else "ddp"
        need = (
            f": the model's training state under {strategy} needs ~"
            f"{est.of(name).device / GIB:.2f} GiB per rank (fsdp: "
            f"~{est.of('fsdp').device / GIB:.2f} GiB), with {capacity} left on this rank"
        )
    advice = (
        "use strategy='fsdp' (or 'auto'), more processes, precision='bf16-mixed' or a smaller batch"
        if strategy != "fsdp"
        else "use more processes, precision='bf16-mixed', activation checkpointing or a smaller "
        "batch"
    )
    return DeviceError(
        f"rank {ctx.rank} ({socket.gethostname()}) ran out of memory in {where}{tried}{need}; "
        + advice
    )
