"""One run at a time per checkpoint directory: an ``flock`` that a dead run cannot keep.

Two runs writing one directory collide (one's temporary manifest under the other's feet, a
"resumed from" naming the other's checkpoint). Rank 0 of a run holds an exclusive ``flock`` on
``DIRECTORY/.multigpu.lock`` while its ``Checkpointer`` is open (removed when it closes); the
kernel drops the lock when the process dies, however it dies, so a killed run never blocks the
next (its file stays, unlocked, and is reused). The file holds the holder's pid, host and start
time, read back for the error a second run gets. ``flock`` works across machines on NFSv4 and
Lustre (mounted with ``flock``), where checkpoints of many nodes live.

A process that already holds a directory's lock (a second ``Checkpointer`` on the same
directory in the same run) shares it rather than blocking itself.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

from multigpu.common.lock_probe import LOCK_NAME, locked_message, read_holder
from multigpu.errors import CheckpointLockedError

POLL_S = 0.2
PROBE_GRACE_S = 1.0
"""How long a refusal waits at least: a launcher's probe (``lock_probe.holder_of``) holds a
free lock for an instant, and a run starting then must not take it for another run's."""


@dataclass
class _LockHold:
    fd: int
    users: int = 1


_HELD: dict[Path, _LockHold] = {}  # resolved directory -> this process's lock on it


class DirectoryLock:
    """This process's hold on a checkpoint directory; ``release()`` (idempotent) lets it go."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._released = False

    @classmethod
    def acquire(cls, directory: str | os.PathLike[str], *, wait_s: float = 0.0) -> DirectoryLock:
        """Hold ``directory`` (created if missing) for this process, waiting up to ``wait_s``
        seconds for another run to let it go (else ``CheckpointLockedError``, naming it)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        key = path.resolve()
        if key in _HELD:
            _HELD[key].users += 1
            return cls(key)
        deadline = time.monotonic() + max(wait_s, PROBE_GRACE_S)
        while True:
            fd = os.open(key / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as e:
                busy = e.errno in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN)
                holder = read_holder(fd) if busy and time.monotonic() >= deadline else ""
                os.close(fd)
                if not busy:
                    raise
                if holder:  # read only when giving up: the error names who holds it
                    raise CheckpointLockedError(locked_message(path, holder, wait_s)) from None
                time.sleep(POLL_S)
                continue
            if _still_the_file(fd, key / LOCK_NAME):
                break
            os.close(fd)  # its holder removed it as we locked it: lock the new one
        _write_holder(fd)
        _HELD[key] = _LockHold(fd)
        return cls(key)

    def release(self) -> None:
        """Let the directory go (when this process's last user of it releases)."""
        if self._released:
            return
        self._released = True
        held = _HELD.get(self.directory)
        if held is None:
            return
        held.users -= 1
        if held.users == 0:
            del _HELD[self.directory]
            # Removed while still held, so a waiter that locks the old file sees it is gone
            # (_still_the_file) and tries again: the directory is left as it was found.
            with contextlib.suppress(OSError):
                os.unlink(self.directory / LOCK_NAME)
            os.close(held.fd)  # closing the only descriptor drops the flock


def _still_the_file(fd: int, path: Path) -> bool:
    try:
        return os.fstat(fd).st_ino == os.stat(path).st_ino
    except FileNotFoundError:
        return False


def _write_holder(fd: int) -> None:
    text = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)
