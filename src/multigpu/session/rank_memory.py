"""The model's training memory on this rank: what ``strategy="auto"`` picks, and what an
allocation that fails in a training step says.

Both hold the memory estimate of the model's training state (``multigpu.estimate``) against what
this rank has (its GPU's free memory, or its share of RAM and any memory limit).

- ``choose_for_memory``: ``strategy="auto"`` with several processes is DDP when the model fits
  a rank, else FSDP; decided at ``ctx.setup``, when the model is known (the ``AutoStrategy``
  switches to the strategy named). The ranks agree — one rank short of memory makes every rank
  use FSDP — and rank 0 says in one line what was chosen and why.
- ``explain``: torch says ``DefaultCPUAllocator: can't allocate memory: you tried to allocate N
  bytes`` (or CUDA's ``OutOfMemoryError``) from wherever the allocation happened. The Context
  turns it into a ``DeviceError`` naming the rank, the step it was in, the estimate under the
  strategy in use against what the rank has, and the ways out.
"""

from __future__ import annotations

import contextlib
import re
import socket
import sys
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

from multigpu.errors import DeviceError
from multigpu.estimate import MemoryEstimate, device_capacity, estimate_memory
from multigpu.estimate.capacity import GIB
from multigpu.estimate.memory import PRECISIONS
from multigpu.runtime import dist
from multigpu.strategies import DDPStrategy, FSDPStrategy
from multigpu.strategies.auto import in_use

_SIZE = re.compile(r"tried to allocate ([0-9.]+ ?[KMGT]?i?B|\d+ bytes)")


def _estimate(
    ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer], precision: str
) -> MemoryEstimate:
    strategy = in_use(ctx.strategy)
    units: dict[str, Any] = {}
    if isinstance(strategy, FSDPStrategy):  # the units it shards into, not the default ones
        units = {"blocks": strategy.blocks, "min_block_params": strategy.min_block_params}
    elif isinstance(strategy, DDPStrategy):
        units = {"gradient_as_bucket_view": bool(strategy.options["gradient_as_bucket_view"])}
    return estimate_memory(
        model,
        world_size=ctx.world_size,
        optimizer=optimizers[0] if optimizers else "adamw",  # unknown classes: measured
        precision=precision,
        capacity=device_capacity(ctx.device, ctx.local_world_size),
        device=ctx.device,
        **units,
    )


def choose_for_memory(
    ctx: Any, model: nn.Module, optimizers: Sequence[torch.optim.Optimizer]
) -> str:
    """The name of the strategy ``auto`` settles on for ``model``: ``"fsdp"`` or the one it
    runs now (collective: every rank calls it)."""
    current: str = ctx.strategy.name
    precision = ctx.precision.name
    if precision not in PRECISIONS:  # 16-mixed: FSDP has no scaler for it here; DDP it is
        ctx.print(
            f"multigpu: strategy auto chose {current}: precision {precision} rules out fsdp",
            file=sys.stderr,
        )
        return current
    name, why = _estimate(ctx, model, optimizers, precision).choose()
    anyone = dist.all_reduce(1.0 if name == "fsdp" else 0.0, op="max", device=ctx._comm_device())
    if anyone and name != "fsdp":
        name, why = "fsdp", f"another rank has too little memory for ddp (here: {why})"
    ctx.print(f"multigpu: strategy auto chose {name}: {why}", file=sys.stderr)
    return "fsdp" if name == "fsdp" else current


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
        est = _estimate(ctx, model, optimizers, precision if precision in PRECISIONS else "32")
        name = strategy if strategy in ("ddp", "fsdp") else "ddp"
        need = (
            f": the model's training state under {strategy} needs ~"
            f"{est.of(name).device / GIB:.2f} GiB per rank (fsdp: "
            f"~{est.of('fsdp').device / GIB:.2f} GiB), with {est.capacity} left on this rank"
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


@contextlib.contextmanager
def said_in_one_line(
    where: str, ctx: Any, model: nn.Module | None, optimizers: Sequence[torch.optim.Optimizer]
) -> Iterator[None]:
    """Inside the block, a failed allocation is raised again as ``explain``'s one line."""
    try:
        yield
    except (RuntimeError, torch.OutOfMemoryError) as e:
        if not is_out_of_memory(e):
            raise
        raise explain(e, where, ctx, model, optimizers) from e
