"""DCP metadata unpickling: the globals a ``.metadata`` file written by torch names; an
optimizer step without its hooks (see ``multigpu.torch_compat``)."""

from __future__ import annotations

from typing import Any

import torch

DCP_METADATA_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    {
        ("pathlib", "PosixPath"),
        ("pathlib", "WindowsPath"),
        ("collections", "OrderedDict"),
        ("torch", "Size"),
        ("torch.serialization", "_get_layout"),
        ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
        ("torch.distributed.checkpoint.metadata", "BytesStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "ChunkStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "Metadata"),
        ("torch.distributed.checkpoint.metadata", "MetadataIndex"),
        ("torch.distributed.checkpoint.metadata", "StorageMeta"),
        ("torch.distributed.checkpoint.metadata", "TensorProperties"),
        ("torch.distributed.checkpoint.metadata", "TensorStorageMetadata"),
        ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"),
    }
)
"""The (module, name) globals a DCP ``.metadata`` pickle may name, besides torch dtypes."""


def dcp_metadata_global_allowed(module: str, name: str) -> bool:
    """Whether a DCP metadata pickle may load the global ``module.name`` (dtypes included)."""
    if (module, name) in DCP_METADATA_GLOBALS:
        return True
    return module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)


def step_without_hooks(optimizer: torch.optim.Optimizer) -> None:
    """Run ``optimizer``'s step function without its step hooks (its own and the global ones)
    and without an LR scheduler's count of steps.

    For making an optimizer's state before a checkpoint is loaded into it: that zero step is
    not training, and whatever counts steps through hooks (DDP's allocator setting, the verify
    and bench recorders, a replica group's gate) must not count it. torch wraps each
    optimizer class's ``step`` once (``Optimizer.profile_hook_step``, marked ``hooked``, made
    with ``functools.wraps``); the wrapped function is its ``__wrapped__``. An LR scheduler
    wraps the instance's ``step``, which calling the class's function passes by too.
    """
    step: Any = type(optimizer).step
    if getattr(step, "hooked", False):
        step = step.__wrapped__
    step(optimizer)
