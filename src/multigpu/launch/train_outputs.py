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

import logging
import os
import re
from collections.abc import Sequence
from pathlib import Path

from multigpu.errors import UsageError
from multigpu.launch.options import parse_nnodes
from multigpu.launch.train import option_value

log = logging.getLogger(__name__)

RUNS_DIR = Path("runs")
"""The parent of the default output directories, relative to the working directory."""

_RDZV_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


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
