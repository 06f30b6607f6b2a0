"""Gradient compression for DDP: torch's communication hooks, chosen by name (docs/strategies.md).

- ``"fp16"`` / ``"bf16"``: each gradient bucket is divided by the world size (so the sum cannot
  overflow), cast, all-reduced and cast back. torch refuses its ``bf16_compress_hook`` on a build
  without CUDA/NCCL (a ``TypeError`` naming CUDA 11+ and NCCL 2.10+) although gloo all-reduces
  bfloat16 correctly; on gloo the same few lines run under another name (``_bf16_gloo_hook``).
- ``"powersgd"``: ``powerSGD_hook``, each gradient matrix sent as two rank-r factors, with error
  feedback and warm start; the first ``start_iter`` steps go uncompressed (torch needs at least 2:
  DDP rebuilds its buckets after the first). torch's ``batched_powerSGD_hook`` is not offered: in
  torch 2.13 it fails on every device with an ``AssertionError`` in ``_orthogonalize``.

PowerSGD's error feedback and warm start live in the hook's state, which checkpoints do not hold:
a resumed run starts them afresh, so it ends close to, not bitwise equal to, an uninterrupted run.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as tdist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from multigpu.common.choices import COMPRESSIONS
from multigpu.errors import UsageError
from multigpu.torch_compat import powersgd_hook_for

log = logging.getLogger(__name__)

COMPRESSION_ENV = "MULTIGPU_COMPRESSION"
"""The environment variable that turns compression on without code (for ``ddp`` strategies)."""


def parse_compression(value: str | None, *, given_as: str = "compression") -> str:
    """The canonical name of a compression (case and spaces ignored); None and ``""`` mean none.

    ``given_as`` names where the value came from in the error message.

    Example:
        >>> parse_compression(" BF16 "), parse_compression(None)
        ('bf16', 'none')
    """
    name = (value or "none").strip().lower()
    if name not in COMPRESSIONS:
        raise UsageError(
            f"{given_as}={value!r} is not a gradient compression; expected one of "
            f"{', '.join(COMPRESSIONS)} (e.g. {given_as}=fp16)"
        )
    return name


def register_compression(
    ddp: DistributedDataParallel,
    name: str,
    *,
    powersgd_rank: int = 1,
    powersgd_start_iter: int = 10,
    backend: str | None = None,
) -> powerSGD_hook.PowerSGDState | None:
    """Register the hook of compression ``name`` on a freshly wrapped ``ddp``; return its state.

    Called right after wrapping (``ctx.setup``), so a combination torch refuses on this build or
    backend (default: that of ``ddp``'s group) is refused before the first step. The state is
    the ``PowerSGDState`` for ``"powersgd"`` (``compression_stats()``), else None.
    """
    name = parse_compression(name)
    if name == "none":
        return None
    group = ddp.process_group
    backend = backend or str(tdist.get_backend(group))
    hook: Callable[..., Any] = default_hooks.fp16_compress_hook  # for "fp16"
    state: Any = None
    if name == "bf16":
        hook = _bf16_gloo_hook if backend == "gloo" else default_hooks.bf16_compress_hook
    elif name == "powersgd":
        hook = powersgd_hook_for(next(ddp.module.parameters()).device)
        state = powerSGD_hook.PowerSGDState(
            process_group=group,
            matrix_approximation_rank=powersgd_rank,
            start_powerSGD_iter=powersgd_start_iter,
            random_seed=0,  # every rank draws the same initial Q
        )
    try:
        ddp.register_comm_hook(state, hook)
    except (TypeError, RuntimeError, ValueError) as e:
        raise UsageError(
            f"compression={name!r} cannot run on backend {backend} with this torch build: {e}; "
            "use another compression (fp16 or powersgd) or none"
        ) from e
    log.debug("gradient compression %s registered (backend %s)", name, backend)
    return state


def _bf16_gloo_hook(
    process_group: tdist.ProcessGroup | None, bucket: tdist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """torch's ``bf16_compress_hook`` under another name, for gloo (see the module docstring)."""
    group = process_group if process_group is not None else tdist.group.WORLD
    buffer = bucket.buffer()
    # Divide before the sum, as torch does: the reduced value is then the mean.
    compressed = buffer.to(torch.bfloat16).div_(tdist.get_world_size(group))
    work = tdist.all_reduce(compressed, group=group, async_op=True)
    assert work is not None  # for mypy: async_op=True always returns the work

    def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        buffer.copy_(fut.value()[0])  # in place: no second float32 copy of the bucket
        return buffer

    return work.get_future().then(decompress)


# DDP checks a hook's annotations against the real objects (``GradBucket``, ``Future[Tensor]``);
# under ``from __future__ import annotations`` they are strings, which it would refuse.
_bf16_gloo_hook.__annotations__["bucket"] = tdist.GradBucket
_bf16_gloo_hook.__annotations__["return"] = torch.futures.Future[torch.Tensor]
