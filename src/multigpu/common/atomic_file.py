"""Atomic file writes: a file exists under its name only when it is complete.

Below every other module (it imports none of ours): checkpoints, the built-in jobs' outputs, the
probes' records and the launcher's ``--cpu auto`` cache all write through it.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(
    path: str | os.PathLike[str], write: Callable[[BinaryIO], object], *, durable: bool = True
) -> Path:
    """Call ``write(fh)`` on a temporary file beside ``path``, fsync it, rename it over ``path``.

    A crash at any point leaves either the old file or the new one, never half of one; the
    temporary file is removed if ``write`` raises. ``durable=False`` skips the two fsyncs
    (~10 ms): the rename still survives the process being killed, not a power loss (for a small
    file rewritten at every training step, such as the trackers' run file).
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        # mkstemp creates 0600; the file gets the mode open() would give it (0666 less the
        # umask), as torch.save and a shell redirect do, so others can read it where they may.
        os.fchmod(fd, 0o666 & ~current_umask())
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            if durable:
                os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    if not durable:
        return target
    # The rename is durable only once the directory entry is on disk.
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target


def current_umask() -> int:
    """This process's umask, read without changing it where Linux says it (``/proc``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    # Elsewhere the only way is to set it and put it back (not atomic across threads).
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
