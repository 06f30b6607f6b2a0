"""Atomic file writes: a file exists under its name only when it is complete."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO


def atomic_write(path: str | os.PathLike[str], write: Callable[[BinaryIO], object]) -> Path:
    """Call ``write(fh)`` on a temporary file beside ``path``, fsync it, rename it over ``path``.

    A crash at any point leaves either the old file or the new one, never half of one; the
    temporary file is removed if ``write`` raises.

    Example:
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     written = atomic_write(Path(tmp) / "x.bin", lambda fh: fh.write(b"data"))
        ...     written.name, written.read_bytes(), sorted(p.name for p in Path(tmp).iterdir())
        ('x.bin', b'data', ['x.bin'])
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    # The rename is durable only once the directory entry is on disk.
    dir_fd = os.open(target.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    return target
