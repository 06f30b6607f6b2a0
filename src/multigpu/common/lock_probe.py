"""Whether another live run holds a checkpoint directory, asked without taking it.

``multigpu.checkpoint.native.lock`` holds a directory for a run (an ``flock`` on
``DIRECTORY/.multigpu.lock``). The launcher asks here before any worker starts, so that a second
run on a held directory is refused in one line at once, not after its workers started and loaded
their data; it cannot import the checkpoint package (torch), so the file's name, the holder's
record and the refusal's words live here, standard library only.
"""

from __future__ import annotations

import errno
import fcntl
import os
from pathlib import Path

LOCK_NAME = ".multigpu.lock"
"""The lock file in a checkpoint directory."""


def read_holder(fd: int) -> str:
    """The holder's record in the open lock file ``fd`` (``pid P on HOST since HH:MM:SS``)."""
    try:
        text = os.pread(fd, 200, 0).decode(errors="replace").strip()
    except OSError:
        text = ""
    return text or "another process (it has not written its name yet)"


def holder_of(directory: str | os.PathLike[str], name: str = LOCK_NAME) -> str | None:
    """Who holds ``directory`` now (``read_holder``'s words), or None when no live run does;
    ``name``: the lock file's (``multigpu train``'s hold on its ``--out`` has its own).

    Creates and writes nothing: a missing directory or lock file is free. The probe takes the
    lock for an instant when it is free (flock has no "test"), which a run starting at that very
    moment would see as taken; it tries again for a second before it refuses (``lock.py``).
    """
    try:
        fd = os.open(Path(directory) / name, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
            return read_holder(fd)
        return None
    finally:
        os.close(fd)  # drops the probe's own shared lock, if it got one
    return None


LIBRARY_FIX = (
    "give another directory, or wait for it with ctx.checkpointer(..., lock_timeout=SECONDS)"
)


def locked_message(
    path: str | os.PathLike[str], holder: str, wait_s: float = 0.0, *, fix: str = LIBRARY_FIX
) -> str:
    """The refusal of a run on a directory ``holder`` holds (after waiting ``wait_s``); ``fix``:
    the other ways out, in the words of the caller's interface."""
    waited = f" after waiting {wait_s:g} s" if wait_s > 0 else ""
    return (
        f"checkpoint directory {path} is in use by another run ({holder}){waited}; "
        f"stop that run or wait for it to end, or {fix}"
    )
