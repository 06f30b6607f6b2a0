"""Writing one checkpoint directory: files with their checksums, manifest, marker, rename, prune.

No collectives here: the synchronous and the asynchronous save (coordinated through ``.done``
files) share these steps.

Durability: each file is fsynced as it is closed; the temp directory is fsynced before the
rename and the parent after it, so after a crash the ``step-*`` name exists only for a
directory whose every byte is on disk.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, BinaryIO

import torch

from multigpu.checkpoint.native.layout import (
    COMMIT_FILE,
    MANIFEST_FILE,
    TMP_PREFIX,
    file_sha256,
    list_checkpoints,
)
from multigpu.checkpoint.native.space import DiskFullError
from multigpu.common.atomic_file import atomic_write
from multigpu.errors import CheckpointError

log = logging.getLogger(__name__)

FileInfo = dict[str, Any]  # {"bytes": int, "sha256": str}


def fsync_dir(path: Path) -> None:
    """Make a directory's entries (new, renamed files) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


LIVE_TEMP_DIRS: set[Path] = set()
"""Temp dirs this process is writing now (a background save): never stale, whatever matches."""


def new_temp_dir(final: Path, stale: str) -> Path:
    """Create ``.tmp-<final name>-<nonce>/`` beside ``final``, removing stale temp dirs first.

    ``stale`` is the glob (inside ``final``'s parent) of temp dirs that only a crashed save can
    have left: one save runs at a time per checkpoint directory (one run per directory: its lock).
    """
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    remove_stale(root, stale)
    tmp = root / f"{TMP_PREFIX}{final.name}-{secrets.token_hex(4)}"
    tmp.mkdir()
    LIVE_TEMP_DIRS.add(tmp)
    return tmp


def remove_stale(root: Path, stale: str) -> list[Path]:
    """Remove the temp dirs matching ``stale`` in ``root`` that no save of this process is
    writing (a dead run's: they can never be completed). Returns what was removed."""
    removed = []
    for old in sorted(root.glob(stale)):
        if old.is_dir() and old not in LIVE_TEMP_DIRS:
            shutil.rmtree(old, ignore_errors=True)
            removed.append(old)
    return removed


def remove_temp_dir(tmp: Path) -> None:
    """Remove a save's temp dir (a failed save: its space back), or forget it (committed)."""
    LIVE_TEMP_DIRS.discard(tmp)
    shutil.rmtree(tmp, ignore_errors=True)


def hash_file(path: Path) -> FileInfo:
    """The size and SHA-256 of a file, read back."""
    return {"bytes": path.stat().st_size, "sha256": file_sha256(path)}


def write_torch_file(path: Path, payload: Any) -> FileInfo:
    """``torch.save(payload)`` to ``path``, fsynced; return its size and SHA-256."""
    return _write(path, lambda fh: torch.save(payload, fh))


def write_small(path: Path, text: str) -> FileInfo:
    """Write a small text file, fsynced; return its size and SHA-256."""
    return _write(path, lambda fh: fh.write(text.encode()))


class _HashingFile:
    """Counts and hashes what goes through it: a file just written need not be read back."""

    def __init__(self, fh: BinaryIO) -> None:
        self.fh, self.digest, self.size = fh, hashlib.sha256(), 0

    def write(self, data: bytes | bytearray | memoryview) -> int:
        self.digest.update(data)
        self.size += memoryview(data).nbytes
        return self.fh.write(data)

    def flush(self) -> None:
        self.fh.flush()


def _write(path: Path, fill: Callable[[Any], Any]) -> FileInfo:
    with path.open("wb") as fh:
        hashing = _HashingFile(fh)
        fill(hashing)
        fh.flush()
        os.fsync(fh.fileno())
    return {"bytes": hashing.size, "sha256": hashing.digest.hexdigest()}


def commit(tmp: Path, manifest: Mapping[str, Any], final: Path) -> None:
    """Write the manifest and the marker into ``tmp``, then rename it to ``final``.

    A complete checkpoint already at ``final`` is replaced (moved aside first, removed after the
    rename), so the name never points at a partial directory.
    """
    info = write_small(tmp / MANIFEST_FILE, json.dumps(manifest, indent=2) + "\n")
    write_small(tmp / COMMIT_FILE, info["sha256"] + "\n")
    fsync_dir(tmp)
    old = None
    if final.exists():
        old = tmp.parent / f"{TMP_PREFIX}old-{final.name}-{secrets.token_hex(4)}"
        os.replace(final, old)
    os.replace(tmp, final)
    LIVE_TEMP_DIRS.discard(tmp)
    fsync_dir(tmp.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def prune(root: Path, keep: int | None, protect: Path) -> None:
    """Keep the ``keep`` newest complete checkpoints; remove older ones and older broken ones.

    Incomplete checkpoints newer than the newest complete one are left for a person to look at.
    ``protect`` (the one just written) is never removed.
    """
    if keep is None:
        return
    statuses = list_checkpoints(root, checksums=False)  # sizes + marker: cheap
    complete = [s for s in statuses if s.complete]
    keep_paths = {s.path for s in complete[-keep:]} | {protect}
    newest = complete[-1].order if complete else None
    removed = []
    for status in statuses:
        older = newest is not None and status.step is not None and status.order < newest
        if status.path in keep_paths or not (status.complete or older):
            continue
        shutil.rmtree(status.path, ignore_errors=True)
        removed.append(status.path)
    if removed:
        log.info("pruned %s", ", ".join(p.name for p in removed))


def done_file(tmp: Path, rank: int) -> Path:
    """Where rank ``rank``'s thread says its file is written (asynchronous saves)."""
    return tmp / f"rank-{rank:05d}.done"


def wait_for_ranks(tmp: Path, ranks: Iterable[int], timeout: float) -> dict[str, FileInfo]:
    """Wait until each of ``ranks`` has written its ``.done`` file; return the files they
    report (``{file name: size and SHA-256}``: their rank files and DCP files).

    Every rank is waited for, also after one reported a failure, so that when this returns or
    raises none of them is still writing into ``tmp``. A full disk is raised before other
    failures.
    """
    deadline = time.monotonic() + timeout
    files: dict[str, FileInfo] = {}
    errors: list[tuple[int, dict[str, Any]]] = []
    pending = set(ranks)
    delay = 0.001
    while pending:
        for rank in sorted(pending):
            path = done_file(tmp, rank)
            if path.is_file():
                report = json.loads(path.read_text())
                if "error" in report:
                    errors.append((rank, report))
                else:
                    files.update(report["files"])
                pending.discard(rank)
        if pending:
            if time.monotonic() > deadline:
                raise CheckpointError(
                    f"ranks {sorted(pending)} did not write their part of {tmp.name} within "
                    f"{timeout:.0f} s; is {tmp.parent} on a file system every rank shares?"
                )
            time.sleep(delay)
            delay = min(delay * 2, 0.05)
    if errors:
        rank, report = min(errors, key=lambda e: (not e[1].get("disk_full"), e[0]))
        if report.get("disk_full"):
            raise DiskFullError(report["error"])
        raise CheckpointError(f"rank {rank} failed to write its part: {report['error']}")
    for path in tmp.glob("rank-*.done"):
        path.unlink(missing_ok=True)
    return files


def report_done(tmp: Path, rank: int, report: Mapping[str, Any]) -> None:
    """Write rank ``rank``'s ``.done`` file, ``{"files": {name: FileInfo}}`` or ``{"error": line,
    "disk_full": bool}`` (atomically: written under a temp name, renamed)."""
    atomic_write(done_file(tmp, rank), lambda fh: fh.write(json.dumps(report).encode()))
