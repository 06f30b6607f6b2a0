"""Claim GPUs for one job with per-GPU ``flock`` locks, so two jobs never pick the same GPU.

Protocol: take ``<lock_dir>/select.lock`` (exclusive, waits at most ``SELECT_TIMEOUT_S``), try
``gpu-<uuid>.lock`` of every candidate with ``LOCK_EX | LOCK_NB`` (a taken one belongs to another
live job: excluded), select, keep the chosen locks open, release the rest and the global lock.
``flock`` locks belong to the open file and vanish when the process dies, however it dies, so a
crashed job never leaves a GPU locked and there are no stale files to clean. The lock files are
opened close-on-exec: the workers do not inherit them; the launcher holds them for the run.
Locks are per machine (``/tmp`` is local); they coordinate multigpu jobs, not other programs
(those show up as busy through utilisation and memory instead).

Environment variables read (from the mapping passed in): ``MULTIGPU_LOCK_DIR`` (default
``/tmp/multigpu-locks``), and those ``list_gpus`` reads.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from multigpu.errors import LaunchError, UsageError
from multigpu.gpus.select import select_gpus
from multigpu.gpus.types import GPUInfo, GPURequest

logger = logging.getLogger(__name__)

DEFAULT_LOCK_DIR = "/tmp/multigpu-locks"
SELECT_TIMEOUT_S = 30.0


class GPUClaim:
    """GPUs chosen and locked for one job; a context manager that releases them on exit."""

    def __init__(self, gpus: Sequence[GPUInfo], fds: Sequence[int] = ()) -> None:
        self.gpus: list[GPUInfo] = list(gpus)
        """The GPUs claimed, in the order the workers will number them."""
        self._fds = list(fds)

    @property
    def cuda_visible_devices(self) -> str:
        """The value of ``CUDA_VISIBLE_DEVICES`` for the workers (comma-joined ``visible_id``)."""
        return ",".join(g.visible_id for g in self.gpus)

    @property
    def held(self) -> bool:
        """True until ``release`` is called."""
        return bool(self._fds)

    def release(self) -> None:
        """Unlock the GPUs (idempotent); process exit does the same."""
        fds, self._fds = self._fds, []
        for fd in fds:
            os.close(fd)  # closing the last descriptor drops the flock

    def __enter__(self) -> GPUClaim:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"GPUClaim(gpus={[g.index for g in self.gpus]}, held={self.held})"


def _prepare_dir(path: Path) -> None:
    try:
        if not path.is_dir():
            path.mkdir(parents=True, exist_ok=True)
            # Shared by every user of the machine, like /tmp: world-writable and sticky.
            os.chmod(path, 0o1777)
    except OSError as e:
        raise LaunchError(
            f"GPU lock directory {path} cannot be created ({e.strerror}); expected a writable "
            "directory; set MULTIGPU_LOCK_DIR to one"
        ) from e


def _open(path: Path) -> int:
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except PermissionError:
        # Another user's lock file: flock needs only a readable descriptor.
        return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    with contextlib.suppress(OSError):
        os.fchmod(fd, 0o666)  # so other users can open it too (umask strips it otherwise)
    return fd


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # EWOULDBLOCK: another process holds it
        return False
    return True


def _note_owner(fd: int) -> None:
    # For humans and error messages only; the lock itself is the flock, not this text.
    with contextlib.suppress(OSError):
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)


def _owner(path: Path) -> str:
    try:
        return path.read_text().strip() or "?"
    except OSError:
        return "?"


def gpu_lock_path(lock_dir: Path, gpu: GPUInfo) -> Path:
    """``<lock_dir>/gpu-<uuid>.lock`` (characters unsafe in a file name replaced by ``_``)."""
    return lock_dir / f"gpu-{re.sub(r'[^A-Za-z0-9._-]', '_', gpu.uuid)}.lock"


def _global_lock(path: Path, timeout: float) -> int:
    fd = _open(path)
    deadline = time.monotonic() + timeout
    while not _try_lock(fd):
        if time.monotonic() > deadline:
            os.close(fd)
            raise LaunchError(
                f"{path} stayed locked for {timeout:.0f} s (held by pid {_owner(path)}); "
                "expected another multigpu launcher to finish choosing GPUs in a moment; "
                "check that process, or set MULTIGPU_LOCK_DIR to another directory"
            )
        time.sleep(0.02)
    _note_owner(fd)
    return fd


def claim_gpus(
    request: GPURequest,
    environ: Mapping[str, str] | None = None,
    *,
    lock_dir: str | os.PathLike[str] | None = None,
    gpus: Sequence[GPUInfo] | None = None,
) -> GPUClaim:
    """Choose GPUs for ``request`` that no other multigpu job holds, and lock them.

    ``gpus`` defaults to ``list_gpus(environ)`` (tests pass fake ones); ``select_gpus`` chooses
    with its default busy thresholds. Hold the claim (``with``) for as long as the job runs.

    Raises:
        UsageError: too few GPUs that are free of other jobs' locks (see ``select_gpus``).
        LaunchError: the lock directory is unusable, or the global lock stays taken.
    """
    env = os.environ if environ is None else environ
    if gpus is None:
        from multigpu.gpus.facts import list_gpus

        gpus = list_gpus(env)
    directory = Path(lock_dir or env.get("MULTIGPU_LOCK_DIR") or DEFAULT_LOCK_DIR)
    _prepare_dir(directory)
    select_fd = _global_lock(directory / "select.lock", SELECT_TIMEOUT_S)
    probed: dict[str, int] = {}
    kept: list[int] = []
    try:
        owners: list[str] = []
        for gpu in gpus:
            path = gpu_lock_path(directory, gpu)
            fd = _open(path)
            if _try_lock(fd):
                probed[gpu.uuid] = fd
            else:
                os.close(fd)
                owners.append(f"GPU {gpu.index} is locked by pid {_owner(path)} ({path})")
        locked = [g.uuid for g in gpus if g.uuid not in probed]
        try:
            chosen = select_gpus(gpus, request, exclude=locked)
        except UsageError as refused:
            # One line: the owners join the refusal only where the locks are part of it.
            if owners and "locked" in str(refused):
                raise UsageError(f"{refused} ({'; '.join(owners)})") from None
            raise
        for owner in owners:  # said once the choice stands, so a refusal stays one line
            logger.info("%s", owner)
        for gpu in chosen:
            fd = probed.pop(gpu.uuid)
            _note_owner(fd)
            kept.append(fd)
    except BaseException:
        for fd in kept:
            os.close(fd)
        raise
    finally:
        for fd in probed.values():
            os.close(fd)
        os.close(select_fd)
    logger.debug("claimed GPUs %s under %s", [g.index for g in chosen], directory)
    return GPUClaim(chosen, kept)
