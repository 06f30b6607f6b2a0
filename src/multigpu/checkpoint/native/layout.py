"""The on-disk layout of a checkpoint, and how to tell a complete one from a broken one.

::

    DIR/step-00000100/
        .metadata           DCP's index of every tensor piece below (rank 0)
        __0_0.distcp, ...   DCP's files: each rank writes the shards it holds of the models and
                            optimizers (their state as the strategy gives it: plain tensors, or
                            FSDP shards), replicated tensors once; keys are parameter names
        state.pt            by rank 0: {"format", "version", "step", "world_size", "objects"}:
                            the small replicated objects (schedulers, loaders, scalers, values)
        rank-00000.pt       one per rank: {"rank", "rng": {...}, "objects": {name: state}}
        manifest.json       format, version, step, epoch, world size, strategy, torch and
                            multigpu versions, creation time, each object's kind and where it is
                            stored, each file's size and SHA-256
        COMMITTED           written last; holds the manifest's SHA-256
    DIR/step-00000100.1/    a further save at the same step count (a loop that saved without
                            counting steps), ordered after step-00000100, before step-00000101
    DIR/.tmp-step-00000100-<nonce>/    a save in progress, renamed to step-... once committed

Format version 1 (before DCP) kept the models and optimizers, whole, in ``state.pt``; such
checkpoints still resume and load.

A checkpoint is *complete* when its ``COMMITTED`` marker exists, the manifest is ours and every
file it lists has the listed size and checksum. Anything else is skipped by resume, with a
warning that says what is wrong.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from multigpu.errors import CheckpointUnreadableError

log = logging.getLogger(__name__)

FORMAT = "multigpu-checkpoint"
FORMAT_VERSION = 2
STATE_FILE = "state.pt"
MANIFEST_FILE = "manifest.json"
METADATA_FILE = ".metadata"
"""DCP's index of every tensor piece, written by rank 0."""
COMMIT_FILE = "COMMITTED"
TMP_PREFIX = ".tmp-"
_STEP_DIR = re.compile(r"^step-(\d{8,})(?:\.([1-9]\d*))?$")
_TMP_DIR = re.compile(r"^\.tmp-step-(\d{8,})(?:\.([1-9]\d*))?-")
_CHUNK = 1 << 20


def step_dir_name(step: int, index: int = 0) -> str:
    """The directory name of the checkpoint of ``step``; ``index``: the how-manieth further save
    at that same step count (0: the first).

    Example:
        >>> step_dir_name(100), step_dir_name(100, 2)
        ('step-00000100', 'step-00000100.2')
    """
    return f"step-{step:08d}" if index == 0 else f"step-{step:08d}.{index}"


def rank_file_name(rank: int) -> str:
    """The file holding ``rank``'s own state (its RNG) inside a checkpoint."""
    return f"rank-{rank:05d}.pt"


def parse_step(name: str) -> int | None:
    """The step of a checkpoint directory name (``step-XXXXXXXX[.K]``), or None when it is not
    one."""
    order = parse_order(name)
    return order[0] if order is not None else None


def parse_order(name: str) -> tuple[int, int] | None:
    """``(step, index)`` of a checkpoint directory name, the order of the saves (None: not one).

    Example:
        >>> parse_order("step-00000100"), parse_order("step-00000100.2"), parse_order("x")
        ((100, 0), (100, 2), None)
    """
    match = _STEP_DIR.match(name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a file's content."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class CheckpointStatus:
    """What ``verify_checkpoint`` found about one checkpoint directory.

    Attributes:
        path: the directory.
        step: the step in its name (None when the name is not ``step-XXXXXXXX[.K]``).
        complete: marker present, manifest ours, every listed file of the listed size and checksum.
        problems: what is wrong, one readable line each (empty when complete).
        manifest: the parsed manifest, when it could be read.
        index: ``K`` of a ``step-XXXXXXXX.K`` name (a further save at that step), else 0.
    """

    path: Path
    step: int | None
    complete: bool
    problems: tuple[str, ...]
    manifest: dict[str, Any] | None
    index: int = 0

    @property
    def order(self) -> tuple[int, int]:
        """``(step, index)``: the order of the saves (a name that is not a step's first)."""
        return (self.step if self.step is not None else -1, self.index)


def verify_checkpoint(path: str | os.PathLike[str], *, checksums: bool = True) -> CheckpointStatus:
    """Check one ``step-XXXXXXXX`` directory against its manifest and commit marker.

    ``checksums``: also compare every file's SHA-256 (reads every byte); sizes are always checked.

    Example:
        >>> verify_checkpoint("/nonexistent/step-00000001").problems
        ('not a directory',)
    """
    directory = Path(path)
    step, index = parse_order(directory.name) or (None, 0)
    if not directory.is_dir():
        return CheckpointStatus(directory, step, False, ("not a directory",), None, index)
    problems: list[str] = []
    manifest = _check_manifest(directory, problems)
    commit = directory / COMMIT_FILE
    if not commit.is_file():
        problems.append(f"no {COMMIT_FILE} marker (the save was interrupted)")
    elif manifest is not None:
        recorded = commit.read_text().strip()
        if recorded and recorded != file_sha256(directory / MANIFEST_FILE):
            problems.append(f"{MANIFEST_FILE} does not match the checksum in {COMMIT_FILE}")
    if manifest is not None:
        _check_files(directory, manifest, problems, checksums)
    return CheckpointStatus(directory, step, not problems, tuple(problems), manifest, index)


def complete_checkpoint(path: str | os.PathLike[str]) -> Path:
    """``path``, a complete checkpoint (else a CheckpointError saying what is wrong with it)."""
    status = verify_checkpoint(path)
    if not status.complete:
        raise CheckpointUnreadableError(
            f"checkpoint {path} is not usable: {'; '.join(status.problems)}"
        )
    return status.path


def read_manifest(path: Path) -> dict[str, Any]:
    """The manifest of a checkpoint directory (an error if it is not one of ours)."""
    problems: list[str] = []
    manifest = _check_manifest(path, problems)
    if manifest is None:
        raise CheckpointUnreadableError(f"cannot read the manifest of {path}: {problems[0]}")
    return manifest


def _check_manifest(directory: Path, problems: list[str]) -> dict[str, Any] | None:
    path = directory / MANIFEST_FILE
    if not path.is_file():
        problems.append(f"{MANIFEST_FILE} missing")
        return None
    try:
        manifest = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        problems.append(f"{MANIFEST_FILE} unreadable ({e})")
        return None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        problems.append(f"{MANIFEST_FILE} is not a {FORMAT} manifest")
        return None
    if int(manifest.get("version", 0)) > FORMAT_VERSION:
        problems.append(
            f"format version {manifest.get('version')} is newer than this multigpu's "
            f"{FORMAT_VERSION}; upgrade multigpu"
        )
    if not isinstance(manifest.get("files"), dict) or STATE_FILE not in manifest["files"]:
        problems.append(f"{MANIFEST_FILE} lists no {STATE_FILE}")
    return manifest


def _check_files(
    directory: Path, manifest: dict[str, Any], problems: list[str], checksums: bool
) -> None:
    files = manifest.get("files")
    if not isinstance(files, dict):
        return
    for name, info in sorted(files.items()):
        path = directory / name
        if not path.is_file():
            problems.append(f"{name}: missing")
            continue
        size = path.stat().st_size
        expected = int(info.get("bytes", -1))
        if size != expected:
            kind = "truncated" if size < expected else "longer than recorded"
            problems.append(f"{name}: {size} bytes, the manifest says {expected} ({kind})")
        elif checksums and file_sha256(path) != info.get("sha256"):
            problems.append(f"{name}: SHA-256 differs from the manifest (corrupt)")


def list_checkpoints(
    directory: str | os.PathLike[str], *, checksums: bool = True
) -> list[CheckpointStatus]:
    """Every ``step-*`` directory under ``directory``, in the order of the saves (by step, then
    ``step-XXXXXXXX.K``'s K; temp dirs ignored)."""
    return [verify_checkpoint(p, checksums=checksums) for _, p in _step_dirs(Path(directory))]


def _step_dirs(root: Path) -> list[tuple[tuple[int, int], Path]]:
    """The ``step-*`` directories under ``root`` with their ``(step, index)``, ascending."""
    if not root.is_dir():
        return []
    return sorted(
        (o, p) for p in root.iterdir() if p.is_dir() and (o := parse_order(p.name)) is not None
    )


def scan(
    directory: str | os.PathLike[str],
) -> tuple[CheckpointStatus | None, list[CheckpointStatus]]:
    """The newest complete checkpoint under ``directory`` (None: none is complete) and the
    ``step-*`` directories newer than it that are not complete (no logging)."""
    skipped: list[CheckpointStatus] = []
    for _, path in reversed(_step_dirs(Path(directory))):
        status = verify_checkpoint(path)
        if status.complete:
            return status, skipped
        skipped.append(status)
    return None, skipped


def unfinished_step(path: Path) -> int | None:
    """The step of a temp dir's save (``.tmp-step-00000100-ab12`` -> 100), or None."""
    order = unfinished_order(path)
    return order[0] if order is not None else None


def unfinished_order(path: Path) -> tuple[int, int] | None:
    """``(step, index)`` of a temp dir's save (``.tmp-step-00000100.2-ab12`` -> (100, 2))."""
    match = _TMP_DIR.match(path.name)
    return (int(match.group(1)), int(match.group(2) or 0)) if match else None


def find_latest(directory: str | os.PathLike[str]) -> CheckpointStatus | None:
    """The newest complete checkpoint under ``directory``, or None.

    Newer directories that are incomplete or corrupt are skipped with a WARNING naming each one
    and what is wrong with it, and the one used instead; so are newer temporary directories
    (``.tmp-step-*``: a save that was interrupted, or one still being written).
    """
    chosen, skipped = scan(directory)
    temp_dirs = sorted(p for p in Path(directory).glob(f"{TMP_PREFIX}step-*") if p.is_dir())
    warn_skipped(
        log,
        chosen,
        skipped,
        temp_dirs,
        "skipping %s: a save of step %s that did not finish (no %s; it is removed by the next "
        "save)",
    )
    return chosen


def warn_skipped(
    logger: logging.Logger,
    chosen: CheckpointStatus | None,
    skipped: Sequence[CheckpointStatus],
    temp_dirs: Sequence[Path],
    said: str,
) -> None:
    """Warn of each checkpoint ``skipped``, each unfinished save of ``temp_dirs`` newer than
    ``chosen`` (``said``: its fate, formatted with its path, step and the marker's name) and, if
    any, that ``chosen`` is used instead."""
    newest = chosen.order if chosen is not None else (-1, 0)
    unfinished = [
        p for p in temp_dirs if (order := unfinished_order(p)) is not None and order > newest
    ]
    for status in skipped:
        logger.warning("skipping checkpoint %s: %s", status.path, "; ".join(status.problems))
    for path in unfinished:
        logger.warning(said, path, unfinished_step(path), COMMIT_FILE)
    if chosen is not None and (skipped or unfinished):
        logger.warning("using the previous complete checkpoint %s", chosen.path)
