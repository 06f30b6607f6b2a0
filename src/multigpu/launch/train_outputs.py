"""Where ``multigpu train`` writes when it is given no ``--out``: a fresh ``runs/MODEL/N``.

The launcher decides the directory once per launch and hands it to the workers as ``--out``
(and ``--checkpoint-dir DIR/checkpoints``, so checkpoints are on at the job's default interval):
workers restarted by ``--max-restarts`` get the same arguments, so they resume from their own
checkpoints, while the next launch takes the next number and never resumes or overwrites an
earlier, unrelated run. On several nodes each node's launcher would count on its own disk, so
the name comes from what every node is given alike, ``--rdzv-id`` (``runs/MODEL/ID``), or the
user's ``--out``.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import logging
import os
import re
import socket
import time
from collections.abc import Sequence
from pathlib import Path

from multigpu.common.lock_probe import holder_of, read_holder
from multigpu.errors import UsageError
from multigpu.launch.options import parse_nnodes
from multigpu.launch.train import option_value

log = logging.getLogger(__name__)

RUNS_DIR = Path("runs")
"""The parent of the default output directories, relative to the working directory."""

_RDZV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")

OUT_LOCK_NAME = ".multigpu-train.lock"
"""The lock file by which a running ``multigpu train`` holds its ``--out`` directory (not the
checkpoint directory's ``.multigpu.lock``: ``--checkpoint-dir`` may be ``--out`` itself, held by
the job's rank 0 meanwhile)."""

_PROBE_GRACE_S = 1.0
"""How long taking the hold retries: another launch's probe (``check_out_free``) holds a free
lock for an instant."""


def next_run_dir(parent: Path) -> Path:
    """``parent/N`` for the smallest N above every number already there (1 when none).

    Example:
        >>> next_run_dir(Path("/nonexistent/runs/digits"))
        PosixPath('/nonexistent/runs/digits/1')
    """
    taken = [int(p.name) for p in parent.iterdir() if p.name.isdigit()] if parent.is_dir() else []
    return parent / str(max(taken, default=0) + 1)


def default_outputs(
    model: str,
    job_args: Sequence[str],
    *,
    nnodes: str = "1",
    rdzv_id: str | None = None,
    runs: Path = RUNS_DIR,
) -> tuple[list[str], Path | None]:
    """``job_args`` with ``--out`` (and ``--checkpoint-dir``) added when no ``--out`` is given,
    and the directory chosen (None: the user gave ``--out``).

    Raises:
        UsageError: several nodes (``--nnodes`` above 1) with neither ``--out`` nor a
            ``--rdzv-id`` that can name a directory.
    """
    if option_value(job_args, "--out") is not None:
        return list(job_args), None
    if parse_nnodes(nnodes)[1] > 1:
        if rdzv_id is None or not _RDZV_ID.fullmatch(rdzv_id):
            given = f"--rdzv-id {rdzv_id}" if rdzv_id else "no --rdzv-id"
            raise UsageError(
                f"multigpu train --nnodes {nnodes} was given no --out and {given}: every node "
                "must write to the same place; give --out DIR (a directory every node sees) or "
                f"--rdzv-id NAME (letters, digits, . _ -) to write to {runs / model}/NAME"
            )
        directory = runs / model / rdzv_id
    else:
        directory = next_run_dir(runs / model)
    extra = ["--out", str(directory)]
    if option_value(job_args, "--checkpoint-dir") is None:
        extra += ["--checkpoint-dir", str(directory / "checkpoints")]
    return [*job_args, *extra], directory


def claim_run_dir(directory: Path, *, shared: bool) -> None:
    """Create the chosen directory before any worker starts; ``shared`` (several nodes, one
    ``--rdzv-id``): it may exist already (another node, or the same job launched again).

    Raises:
        UsageError: another launch took the same number at the same moment, or the directory
            cannot be created.
    """
    try:
        directory.mkdir(parents=True, exist_ok=shared)
    except FileExistsError:
        raise UsageError(
            f"{directory} was just created by another multigpu train started at the same "
            "moment; run again (it takes the next number) or give --out DIR"
        ) from None
    except OSError as e:
        raise UsageError(
            f"cannot create the output directory {directory} ({e.strerror}); give --out DIR "
            "in a place this user can write"
        ) from e


def announce(job_args: Sequence[str], chosen: Path | None) -> None:
    """One line, before the workers start: where this run writes (said by the launcher of the
    replica groups, not by each group's: ``MULTIGPU_REPLICA_GROUP`` is set in those)."""
    if os.environ.get("MULTIGPU_REPLICA_GROUP"):
        return
    out = option_value(job_args, "--out")
    if chosen is not None:
        log.info("writing to %s/ (model.pt, metrics.json, checkpoints/); --out DIR to choose", out)
    elif out is not None:
        log.info("writing to %s/", out)


def _in_use(out: str, holder: str) -> str:
    return (
        f"--out {out} is in use by another multigpu train ({holder}); its model.pt, "
        "metrics.json and checkpoints would be overwritten: stop that run or wait for it to "
        "end, or give another --out"
    )


def check_out_free(job_args: Sequence[str]) -> None:
    """Refuse, before anything starts, an ``--out`` another live ``multigpu train`` holds.

    Raises:
        UsageError: the directory is held (by ``hold_out``), naming the holder.
    """
    out = option_value(job_args, "--out")
    holder = holder_of(out, OUT_LOCK_NAME) if out is not None else None
    if out is not None and holder:
        raise UsageError(_in_use(out, holder))


def hold_out(job_args: Sequence[str]) -> None:
    """Hold ``--out`` (created if missing) for this launcher's life: a second ``multigpu train``
    on it is refused (``check_out_free``) instead of overwriting the first one's files, with
    or without checkpoints. The kernel drops the hold when the launcher dies, however it dies;
    at a normal exit the lock file is removed too.

    Raises:
        UsageError: another launch took it meanwhile, or the directory cannot be created.
    """
    out = option_value(job_args, "--out")
    if out is None:
        return
    directory = Path(out)
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(
            f"cannot create the output directory {directory} ({e.strerror}); give --out DIR "
            "in a place this user can write"
        ) from e
    path = directory / OUT_LOCK_NAME
    deadline = time.monotonic() + _PROBE_GRACE_S
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except OSError as e:
            holder = read_holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EACCES, errno.EAGAIN):
                return  # a file system without flock: no hold, as before
            if time.monotonic() >= deadline:
                raise UsageError(_in_use(out, holder)) from None
            time.sleep(0.1)
    text = f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}\n"
    os.ftruncate(fd, 0)
    os.pwrite(fd, text.encode(), 0)

    def release() -> None:
        with contextlib.suppress(OSError):  # removed while held: the directory as it was
            os.unlink(path)
        os.close(fd)

    atexit.register(release)
