"""FSDP2, DTensor, a module's own tensors, the process groups FSDP2 and the mesh keep, and
DTensor's redistribution logger (see ``multigpu.torch_compat``)."""

from __future__ import annotations

import contextlib
import importlib
import logging
from collections.abc import Iterator
from typing import Any

import torch

from multigpu.torch_compat.version import TORCH_VERSION

FSDP_MIN_VERSION = (2, 4)
"""The first torch with FSDP2 (``fully_shard`` on a DeviceMesh)."""


SHARDED_TENSOR_MODULE = "torch.distributed._shard.sharded_tensor"
"""torch's ShardedTensor (private, deprecated): imported by FSDP and DCP."""


def import_before_process_groups() -> None:
    """Import ``SHARDED_TENSOR_MODULE`` now, before any process group exists.

    FSDP and DCP import it; multigpu imports them only when a run uses them (about 1.5 s of
    CPU per process saved otherwise). Imported after the default group was created, it leaves
    that group's gloo threads alive past ``destroy_process_group`` under DDP, where one reaching
    for the GIL at interpreter finalization aborts the worker (``test_teardown_threads``: found
    by importing each of FSDP's imports before the group, with torch 2.13; the cause inside
    torch is unknown). Importing it first costs about 0.2 s of CPU.
    """
    importlib.import_module(SHARDED_TENSOR_MODULE)


def _fsdp() -> Any:
    if TORCH_VERSION >= (2, 6):
        return importlib.import_module("torch.distributed.fsdp")
    return importlib.import_module("torch.distributed._composable.fsdp")  # 2.4, 2.5: private


def fully_shard(module: torch.nn.Module | list[torch.nn.Module], **kwargs: Any) -> Any:
    """FSDP2's ``fully_shard`` (``torch.distributed.fsdp.fully_shard``); a list of modules (one
    unit for all of them) only where ``fully_shard_takes_module_lists()``."""
    return _fsdp().fully_shard(module, **kwargs)


def fully_shard_takes_module_lists() -> bool:
    """Whether ``fully_shard([a, b])`` shards several modules as one unit: torch >= 2.5 (2.4's
    takes one module). Tied weights in different modules need it."""
    return TORCH_VERSION >= (2, 5)


def fsdp_module_class() -> type:
    """FSDP2's ``FSDPModule``: every module ``fully_shard`` was applied to is an instance."""
    return _fsdp().FSDPModule


def mixed_precision_policy(**kwargs: Any) -> Any:
    """FSDP2's ``MixedPrecisionPolicy(param_dtype=..., reduce_dtype=..., output_dtype=...)``."""
    return _fsdp().MixedPrecisionPolicy(**kwargs)


def cpu_offload_policy() -> Any:
    """FSDP2's ``CPUOffloadPolicy()`` (parameters, gradients and optimizer state in CPU RAM)."""
    return _fsdp().CPUOffloadPolicy()


def is_dtensor(value: object) -> bool:
    """Whether ``value`` is a DTensor (a sharded or replicated distributed tensor)."""
    if TORCH_VERSION >= (2, 5):
        from torch.distributed.tensor import DTensor
    else:
        from torch.distributed._tensor import DTensor
    return isinstance(value, DTensor)


def distribute_like(full: torch.Tensor, like: Any) -> torch.Tensor:
    """This rank's shard of ``full`` laid out as the DTensor ``like`` (no communication).

    Every rank holds the same ``full`` tensor; the local piece is cut out, as
    ``distribute_tensor(..., src_data_rank=None)`` does (torch >= 2.5).
    """
    if TORCH_VERSION >= (2, 5):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(
            full, like.device_mesh, like.placements, src_data_rank=None
        ).to_local()
    from torch.distributed._tensor import distribute_tensor as old_distribute

    return old_distribute(full, like.device_mesh, like.placements).to_local()


def dtensor_from_local_like(local: torch.Tensor, like: Any) -> Any:
    """A DTensor whose piece on this rank is ``local``, laid out as the DTensor ``like`` (its
    mesh, placements, global shape and stride; no communication, no check)."""
    if TORCH_VERSION >= (2, 5):
        from torch.distributed.tensor import DTensor
    else:
        from torch.distributed._tensor import DTensor
    return DTensor.from_local(
        local,
        like.device_mesh,
        like.placements,
        run_check=False,
        shape=like.shape,
        stride=like.stride(),
    )


def own_tensor_tables(module: torch.nn.Module) -> dict[str, dict[str, Any]]:
    """``{"param": ..., "buffer": ...}``: the live tables of ``module``'s own parameters and
    buffers (``nn.Module._parameters``, ``_buffers``); entries may be None."""
    return {"param": module._parameters, "buffer": module._buffers}


def drop_fsdp_process_groups(module: torch.nn.Module) -> int:
    """Let go of the process groups FSDP2's state keeps for ``module`` and its submodules (set to
    None); returns how many references were dropped.

    For teardown only (the module cannot communicate afterwards): held there, a destroyed gloo
    group keeps its threads until interpreter finalization.
    """
    import torch.distributed as tdist

    dropped = 0
    for sub in module.modules():
        if not isinstance(sub, fsdp_module_class()):
            continue
        state = sub._get_fsdp_state()  # type: ignore[operator]
        groups = getattr(state, "_fsdp_param_groups", None)
        if groups is None:
            one = getattr(state, "_fsdp_param_group", None)
            groups = [] if one is None else [one]
        for group in groups:
            for info in (group.mesh_info, getattr(group, "post_forward_mesh_info", None)):
                for name, value in list(vars(info).items()) if info is not None else []:
                    if isinstance(value, tdist.ProcessGroup):
                        setattr(info, name, None)
                        dropped += 1
    return dropped


def drop_mesh_process_groups(mesh: Any) -> int:
    """Let go of the process groups a ``DeviceMesh`` keeps by name (``_pg_registry``); returns
    how many. For teardown only, like ``drop_fsdp_process_groups``."""
    registry = getattr(mesh, "_pg_registry", None)
    if not isinstance(registry, dict):
        return 0  # a torch whose meshes resolve their groups through c10d's own table
    dropped = len(registry)
    registry.clear()
    return dropped


REDISTRIBUTE_LOGGER = "torch.distributed.tensor._redistribute"


def _not_sequential(record: logging.LogRecord) -> bool:
    return "sequential" not in str(record.msg)


@contextlib.contextmanager
def quiet_sequential_redistribution() -> Iterator[None]:
    """Within the block, DTensor does not warn about sequential collectives (other messages
    pass)."""
    logger = logging.getLogger(REDISTRIBUTE_LOGGER)
    logger.addFilter(_not_sequential)
    try:
        yield
    finally:
        logger.removeFilter(_not_sequential)
