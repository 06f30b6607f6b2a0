"""What the built-in jobs' command lines share: their parser, positive numbers, writable outputs,
and how a job ends.

A job (``multigpu.examples.digits``, ``multigpu.examples.lm``) parses its options, trains, and
ends with exit code 0, or 2 and one line on a usage error — said once, by rank 0, since every
rank refuses the same input. No torch here: ``multigpu train`` parses a job's arguments with the
job's own parser (``digits_parser``, ``lm_parser``) before it starts any worker.

Environment variables read: ``RANK`` (only rank 0 prints a usage error).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from multigpu.errors import UsageError


def directory_problem(path: Path) -> str | None:
    """Why ``path`` cannot be, or be created as, a directory this process writes in; None if it
    can. Nothing is left behind: the nearest existing directory is tried with a temporary file.

    Example:
        >>> directory_problem(Path("/etc/hostname"))
        '/etc/hostname is a file, not a directory'
    """
    existing = path
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    try:  # a real write: permissions, read-only mounts, root squash, /proc and /sys
        fd, name = tempfile.mkstemp(dir=existing, prefix=".multigpu-write-check-")
    except OSError as e:
        return f"{existing} is not writable ({e.strerror})"
    os.close(fd)
    os.unlink(name)
    return None


def check_outputs(args: argparse.Namespace, *, writes_outputs: bool = True) -> None:
    """Refuse, before training, a ``--out`` / ``--checkpoint-dir`` / ``--save`` it cannot write.

    Every rank writes its part of a checkpoint, so the checkpoint directory is checked
    everywhere; ``metrics.json`` and the model only rank 0 writes: ``writes_outputs=False``
    (another rank, a node that may not host rank 0) leaves ``--out`` and ``--save`` to it.

    Raises:
        UsageError: a path that is a file where a directory is wanted (or the reverse), or under
            a directory this process cannot write in.

    Example:
        >>> check_outputs(argparse.Namespace(out=None, checkpoint_dir=None))
    """
    out = getattr(args, "out", None)
    checkpoint_dir = getattr(args, "checkpoint_dir", None)
    save = getattr(args, "save", None)
    wanted = [("--out", out, "metrics.json and model.pt")] if writes_outputs else []
    if checkpoint_dir:
        wanted.append(("--checkpoint-dir", checkpoint_dir, "the checkpoints"))
    elif out and getattr(args, "checkpoint_every", None):
        wanted.append(("--out", str(Path(out) / "checkpoints"), "the checkpoints"))
    for option, given, what in wanted:
        problem = directory_problem(Path(given).absolute()) if given else None
        if problem:
            raise UsageError(
                f"{option} {given}: {problem}; expected a directory (or a path where one can be "
                f"created) that this user can write, for {what}; give another {option}"
            )
    if save and writes_outputs:
        target = Path(save).absolute()
        problem = f"{save} is a directory" if target.is_dir() else directory_problem(target.parent)
        if problem:
            raise UsageError(
                f"--save {save}: {problem}; expected the path of a file in a directory this "
                "user can write; give another --save"
            )


def run_job(
    parser: argparse.ArgumentParser,
    train: Callable[[argparse.Namespace], Any],
    argv: list[str] | None,
) -> int:
    """Parse ``argv`` with ``parser`` and ``train``: 0, or 2 with one line on a usage error."""
    try:
        args = parser.parse_args(argv)
        check_outputs(args, writes_outputs=os.environ.get("RANK", "0") == "0")
        train(args)
    except UsageError as e:
        if os.environ.get("RANK", "0") == "0":  # the same message on every rank: say it once
            print(f"multigpu train: error: {e}", file=sys.stderr, flush=True)
        return 2
    return 0
