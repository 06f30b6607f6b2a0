"""Checkpoints: atomic writes, the checkpoint manager, its on-disk layout and verification."""

from multigpu.atomic_file import atomic_write
from multigpu.checkpoint.layout import (
    CheckpointStatus,
    find_latest,
    list_checkpoints,
    verify_checkpoint,
)
from multigpu.checkpoint.manager import Checkpointer
from multigpu.checkpoint.portable import LoadReport, load_weights
from multigpu.checkpoint.space import DiskFullError

__all__ = [
    "CheckpointStatus",
    "Checkpointer",
    "DiskFullError",
    "LoadReport",
    "atomic_write",
    "find_latest",
    "list_checkpoints",
    "load_weights",
    "verify_checkpoint",
]
