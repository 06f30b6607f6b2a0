"""Checkpoints: our own format, the formats of others, and one door to all of them.

``native/`` is multigpu's format (atomic, verified, resharded on load; the ``Checkpointer``);
``formats/`` holds every format behind one protocol (ours, plain DCP, hub safetensors, torch
files); ``dispatch`` says which format a path is, for ``ctx.load``, ``load_weights``, ``ckpt
inspect`` and ``ckpt convert``; ``portable`` (``load_weights``), ``convert`` and ``hub_export``
(``ckpt convert``) read through it.

The names below are imported on first use (PEP 562), as ``multigpu``'s are: the modules that
save and load import ``torch.distributed.checkpoint`` (and through it DTensor, FSDP and torch's
elastic agent, about 1 s of CPU), which a process that only reads the layout (``ckpt
inspect``'s light paths, the Context of a run that never checkpoints) does not need.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# ruff: noqa: F401
if TYPE_CHECKING:
    from multigpu.checkpoint.native.layout import (
        CheckpointStatus,
        find_latest,
        list_checkpoints,
        verify_checkpoint,
    )
    from multigpu.checkpoint.native.manager import Checkpointer
    from multigpu.checkpoint.native.space import DiskFullError
    from multigpu.checkpoint.portable import LoadReport, load_weights
    from multigpu.common.atomic_file import atomic_write

_EXPORTS = {
    "multigpu.common.atomic_file": "atomic_write",
    "multigpu.checkpoint.native.layout": (
        "CheckpointStatus find_latest list_checkpoints verify_checkpoint"
    ),
    "multigpu.checkpoint.native.manager": "Checkpointer",
    "multigpu.checkpoint.portable": "LoadReport load_weights",
    "multigpu.checkpoint.native.space": "DiskFullError",
}
"""The module that defines each public name."""
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names.split()}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module 'multigpu.checkpoint' has no attribute {name!r}")
    value = getattr(importlib.import_module(where), name)
    globals()[name] = value  # the next access is a plain lookup
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_WHERE))
