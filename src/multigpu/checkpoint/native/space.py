"""Disk space of a save: what it needs, what is free, and one line when the disk is full.

Rank 0 compares a save's estimated size with the free space of the checkpoint directory's file
system before anything is written and refuses early; a disk that fills while writing (other
writers, an estimate too low) is recognised by the ``ENOSPC``/``EDQUOT`` error anywhere in the
exception's chain, and said in the same line.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from multigpu.errors import CheckpointError

SMALL_FILE_BYTES = 64 * 1024
"""Room counted for each small file of a save (rank files, state.pt, manifest, DCP's index)."""

_FULL = {errno.ENOSPC, errno.EDQUOT}


class DiskFullError(CheckpointError):
    """A save found no room on the checkpoint directory's file system (its message says where,
    how much the save needed and how much was free)."""

    said_in_full = True


@dataclass(frozen=True)
class SaveSpace:
    """What rank 0 measured before a save wrote anything (every rank gets the same copy)."""

    directory: Path
    needed: int
    """Estimated bytes of the save (tensors plus ``SMALL_FILE_BYTES`` per small file)."""
    free: int
    """Bytes free to this user on the directory's file system, measured before writing (-1: the
    file system does not say, as some FUSE and object-store mounts)."""

    def fits(self) -> bool:
        return self.free < 0 or self.needed <= self.free

    def full_line(self) -> str:
        """The one line said on every rank when the save does not fit."""
        if self.free < 0:
            amount = (
                f"the save needs about {_size(self.needed)}; the file system does not report "
                "its free space"
            )
        elif self.needed > self.free:
            amount = f"the save needs about {_size(self.needed)}, {_size(self.free)} were free"
        else:  # the disk filled while writing: someone else wrote, or our estimate was low
            amount = (
                f"{_size(self.free)} were free when the save started and it needed more "
                f"(its tensors and small files: about {_size(self.needed)})"
            )
        return (
            f"No space left on device on the file system of {self.directory} (mounted at "
            f"{mount_point(self.directory)}): {amount}; the partial save was removed and the "
            "last complete checkpoint is kept; free space there, keep fewer checkpoints "
            "(keep=...), or use a directory on a larger disk"
        )


def _size(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n} bytes ({n / scale:.1f} {unit})"
    return f"{n} bytes"


def free_bytes(directory: Path) -> int:
    """Bytes an unprivileged writer may still use on ``directory``'s file system (-1: unknown,
    a file system reporting no size at all)."""
    st = os.statvfs(directory)
    if st.f_blocks == 0:  # FUSE and object-store mounts that report nothing: not "full"
        return -1
    return st.f_bavail * st.f_frsize


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding ``path`` (where its device changes)."""
    path = path.resolve()
    device = path.stat().st_dev
    while path.parent != path and path.parent.stat().st_dev == device:
        path = path.parent
    return path


def tensor_bytes(state: Any) -> int:
    """The bytes of every tensor in a nested state (dicts, lists, tuples): a DTensor's global
    size (its shards together), plain tensors as they are."""
    if isinstance(state, torch.Tensor):  # a DTensor's numel() is its global count
        return state.numel() * state.element_size()
    if isinstance(state, Mapping):
        state = list(state.values())
    return sum(tensor_bytes(v) for v in state) if isinstance(state, list | tuple) else 0


def estimate(sharded: Mapping[str, Any], world_size: int) -> int:
    """Bytes of a save: its DCP tensors, and room for each rank's file and rank 0's files."""
    return tensor_bytes(sharded) + SMALL_FILE_BYTES * (world_size + 3)


def ran_out_of_space(error: BaseException) -> bool:
    """Whether ``error`` or anything in its cause/context chain is ENOSPC/EDQUOT (or ours)."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DiskFullError):
            return True
        if isinstance(current, OSError) and current.errno in _FULL:
            return True
        current = current.__cause__ or current.__context__
    return False
