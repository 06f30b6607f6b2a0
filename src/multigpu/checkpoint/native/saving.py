"""One checkpoint save, on every rank at once: temp dir, shards, rank files, manifest, commit.

1. rank 0 creates ``.tmp-<name>-<nonce>/`` beside the final path and tells the others its name;
2. the models and optimizers go through DCP (every rank writes its shards; collective);
3. every rank writes ``rank-XXXXX.pt`` (RNGs, per-rank objects) and hashes the files it wrote;
4. rank 0 writes ``state.pt`` (small replicated objects), the manifest with every file's size
   and SHA-256, then ``COMMITTED``, renames the directory to its final name and prunes.

Asynchronous saves copy the state to CPU memory first (DCP's staging: the only stall) and do
steps 2–4 in the background: DCP's ``async_save`` writes the shards over a gloo group of its own,
then a thread per rank writes its rank file and reports through a ``.done`` file (no
collectives: they would interleave with the training's), and rank 0's thread commits.

A failed save leaves nothing: rank 0 removes the temp dir once no rank writes into it any more
(DCP raises its failure on every rank only after every rank's writes ended; the rank files are
reported by a gather, or by ``.done`` files that rank 0 waits for, failed or not). A full disk
is said in one line, the same on every rank (``multigpu.checkpoint.native.space``).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TypeVar

from multigpu.checkpoint.native.layout import (
    FORMAT,
    FORMAT_VERSION,
    MANIFEST_FILE,
    STATE_FILE,
    TMP_PREFIX,
    rank_file_name,
)
from multigpu.checkpoint.native.objects import epoch_of, kind_of, state_of
from multigpu.checkpoint.native.rng import capture_rng
from multigpu.checkpoint.native.sharded import (
    one_line_failures,
    save_sharded,
    save_sharded_async,
    written_by,
)
from multigpu.checkpoint.native.snapshot import SHARDED_KINDS, StateSource, sharded_state
from multigpu.checkpoint.native.space import (
    DiskFullError,
    SaveSpace,
    estimate,
    free_bytes,
    ran_out_of_space,
)
from multigpu.checkpoint.native.writer import (
    FileInfo,
    commit,
    hash_file,
    new_temp_dir,
    prune,
    remove_temp_dir,
    report_done,
    wait_for_ranks,
    write_torch_file,
)
from multigpu.common.versions import local_versions
from multigpu.errors import CheckpointError, UsageError
from multigpu.runtime import dist

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass(kw_only=True)
class SaveJob:
    """What one save writes, and where."""

    final: Path
    """The checkpoint's path once committed."""
    stale: str
    """Glob (in ``final.parent``) of temp dirs a crashed save left, removed first."""
    step: int
    epoch: int | None
    rank: int
    world_size: int
    objects: Mapping[str, Any]
    """Replicated objects: models and optimizers go to DCP, the rest to ``state.pt``."""
    per_rank: Mapping[str, Any] = field(default_factory=dict)
    """Objects whose state differs per rank (``rank-XXXXX.pt``)."""
    rng: bool = True
    """Save every rank's RNG states (``rank-XXXXX.pt``)."""
    adapter: StateSource
    strategy: Mapping[str, Any] = field(default_factory=dict)
    """The strategy's description, for the manifest."""
    keep: int | None = None
    """How many complete checkpoints rank 0 keeps in ``final.parent`` after the rename (None:
    all; see ``writer.prune``)."""


def save(job: SaveJob) -> Path:
    """Save ``job`` now (collective: every rank calls it). Returns the final path.

    A failed save (``DiskFullError`` when the disk is full) leaves nothing: its temp dir is
    removed, earlier checkpoints are kept.
    """
    started = time.perf_counter()
    sharded, info = sharded_state(job.objects, job.adapter)
    tmp, space = _agree_on_temp_dir(job, sharded)
    try:
        if sharded:
            save_sharded(sharded, tmp)
    except Exception as e:  # DCP raises on every rank alike, once every rank stopped writing
        if job.rank == 0:
            remove_temp_dir(tmp)
        raise _failure(f"checkpoint of step {job.step} was not saved", e, space) from e
    error: tuple[str, bool] | None = None
    files: dict[str, FileInfo] = {}
    try:
        files = _write_own_files(job, tmp, _rank_payload(job, clone=False))
    except Exception as e:  # every rank must reach the gather below
        error = (_said(e, space), ran_out_of_space(e))
    reports = dist.gather_objects_small((files, error))
    # Every rank has stopped writing (the gather above): rank 0 commits, or says why not.
    decided_by_rank0(job.rank, lambda: _finish(job, tmp, info, reports, space))
    if job.rank == 0:
        log.info("saved checkpoint %s in %.2f s", job.final, time.perf_counter() - started)
    return job.final


def save_state(
    final: Path,
    state: Mapping[str, Any],
    *,
    rank: int,
    world_size: int,
    adapter: StateSource,
    strategy: Mapping[str, Any],
    before: Callable[[], None],
) -> Path:
    """``ctx.save``: ``state`` as the checkpoint directory ``final`` (collective). An existing
    ``final`` is replaced only when it is a multigpu checkpoint; ``before()`` runs on every
    rank once that is agreed, before anything is written. No RNG state is saved."""

    def check() -> None:
        if final.exists() and not (final / MANIFEST_FILE).is_file():
            raise UsageError(
                f"ctx.save: {final} exists and is not a multigpu checkpoint; expected a new "
                "path (or an earlier checkpoint to replace): choose another path"
            )

    decided_by_rank0(rank, check)
    before()
    step = state.get("step")
    job = SaveJob(
        final=final,
        stale=f"{TMP_PREFIX}{final.name}-*",
        step=step if isinstance(step, int) and not isinstance(step, bool) else 0,
        epoch=epoch_of(state),
        rank=rank,
        world_size=world_size,
        objects=state,
        rng=False,
        adapter=adapter,
        strategy=strategy,
    )
    return save(job)


class PendingSave:
    """An asynchronous save under way; ``wait()`` ends it (its error re-raised)."""

    def __init__(self, job: SaveJob, group: Any, timeout: float) -> None:
        """``timeout``: seconds rank 0's background thread waits for the other ranks' parts."""
        self.job, self.timeout = job, timeout
        self.error: BaseException | None = None
        sharded, info = sharded_state(job.objects, job.adapter)
        tmp, space = _agree_on_temp_dir(job, sharded)
        # Copies now, while the state is what the step made: training goes on meanwhile.
        written: Future[Any] | None = save_sharded_async(sharded, tmp, group) if sharded else None
        shared = _shared_payload(job, clone=True) if job.rank == 0 else None
        mine = _rank_payload(job, clone=True)
        self._thread = threading.Thread(
            target=self._finish_in_background,
            args=(tmp, space, info, written, shared, mine),
            name=f"multigpu-checkpoint-{job.step}",
            daemon=False,
        )
        self._thread.start()

    def _finish_in_background(
        self,
        tmp: Path,
        space: SaveSpace,
        info: dict[str, dict[str, Any]],
        written: Future[Any] | None,
        shared: dict[str, Any] | None,
        mine: dict[str, Any],
    ) -> None:
        job = self.job
        started = time.perf_counter()
        try:
            try:
                if written is not None:
                    with one_line_failures():
                        written.result()
            except Exception as e:  # on every rank alike, once every rank stopped writing
                if job.rank == 0:
                    remove_temp_dir(tmp)
                raise _failure("", e, space) from e
            files, own = self._write_own_part(tmp, space, mine)
            if job.rank != 0:
                if own is not None:
                    raise own
                return
            try:
                # Every rank is waited for, failed or not: then none writes into tmp any more.
                reported = wait_for_ranks(tmp, range(1, job.world_size), self.timeout)
                if own is not None:
                    raise own
                files.update(reported)
                files[STATE_FILE] = write_torch_file(tmp / STATE_FILE, shared)
                _commit(job, tmp, info, files)
            except Exception as e:
                remove_temp_dir(tmp)
                raise _failure("", e, space) from e
            log.info(
                "saved checkpoint %s in %.2f s (in the background)",
                job.final,
                time.perf_counter() - started,
            )
        except BaseException as e:  # re-raised by wait()
            self.error = e

    def _write_own_part(
        self, tmp: Path, space: SaveSpace, mine: dict[str, Any]
    ) -> tuple[dict[str, FileInfo], Exception | None]:
        """This rank's files, reported to rank 0 (by the other ranks); the error, if any."""
        job = self.job
        try:
            files = _write_own_files(job, tmp, mine)
        except Exception as e:
            # Its space back, for the report below.
            (tmp / rank_file_name(job.rank)).unlink(missing_ok=True)
            if job.rank != 0:
                report = {"error": _said(e, space), "disk_full": ran_out_of_space(e)}
                report_done(tmp, job.rank, report)
            return {}, e
        if job.rank != 0:
            report_done(tmp, job.rank, {"files": files})
        return files, None

    def wait(self) -> None:
        """Wait for the save to end; re-raise its error as a CheckpointError."""
        self._thread.join()
        if self.error is not None:
            kind = DiskFullError if ran_out_of_space(self.error) else CheckpointError
            raise kind(
                f"the background save of step {self.job.step} failed: {self.error}"
            ) from self.error


def decided_by_rank0(rank: int, decide: Callable[[], T]) -> T:
    """What ``decide()`` returns on rank 0, on every rank; the CheckpointError or UsageError it
    raises is raised on every rank (rather than on rank 0 alone, the others waiting for it)."""
    said: tuple[bool, Any] = (True, None)
    if rank == 0:
        try:
            said = (True, decide())
        except (CheckpointError, UsageError) as e:
            said = (False, e)
    ok, value = dist.broadcast(said, src=0)
    if not ok:
        raise value
    return value


def _agree_on_temp_dir(job: SaveJob, sharded: Mapping[str, Any]) -> tuple[Path, SaveSpace]:
    """Rank 0 makes the temp dir and checks the save fits; every rank gets both (or the error)."""

    def make() -> tuple[Path, SaveSpace]:
        root = job.final.parent
        try:
            tmp = new_temp_dir(job.final, job.stale)  # stale ones removed first: their space
            space = SaveSpace(root, estimate(sharded, job.world_size), free_bytes(root))
            if not space.fits():
                remove_temp_dir(tmp)
                raise DiskFullError(
                    f"checkpoint of step {job.step} was not saved: {space.full_line()}"
                )
        except OSError as e:
            raise CheckpointError(f"cannot create a checkpoint in {root}: {e}") from e
        return tmp, space

    return decided_by_rank0(job.rank, make)


def _said(error: BaseException, space: SaveSpace) -> str:
    """One line for a failure: the disk-full line (the same on every rank), or the error."""
    if ran_out_of_space(error):
        return space.full_line()
    return str(error) if isinstance(error, CheckpointError) else f"{type(error).__name__}: {error}"


def _failure(prefix: str, error: BaseException, space: SaveSpace) -> CheckpointError:
    kind = DiskFullError if ran_out_of_space(error) else CheckpointError
    said = _said(error, space)
    return kind(f"{prefix}: {said}" if prefix else said)


def _shared_payload(job: SaveJob, *, clone: bool) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "step": job.step,
        "world_size": job.world_size,
        "objects": {
            n: state_of(o, clone=clone)
            for n, o in job.objects.items()
            if kind_of(o) not in SHARDED_KINDS
        },
    }


def _rank_payload(job: SaveJob, *, clone: bool) -> dict[str, Any] | None:
    if not job.rng and not job.per_rank:
        return None
    return {
        "rank": job.rank,
        "rng": capture_rng() if job.rng else None,
        "objects": {n: state_of(o, clone=clone) for n, o in job.per_rank.items()},
    }


def _write_own_files(
    job: SaveJob, tmp: Path, payload: dict[str, Any] | None
) -> dict[str, FileInfo]:
    """This rank's rank file (if any) and the hashes of the DCP files it wrote."""
    files = {p.name: hash_file(p) for p in written_by(tmp, job.rank)}
    if payload is not None:
        files[rank_file_name(job.rank)] = write_torch_file(tmp / rank_file_name(job.rank), payload)
    return files


def _finish(
    job: SaveJob,
    tmp: Path,
    info: dict[str, dict[str, Any]],
    reports: list[Any],
    space: SaveSpace,
) -> None:
    """Rank 0, once every rank stopped writing: check every rank's report, write state.pt,
    commit; or raise why not (a full disk first), the failed save's temp dir removed."""
    failed = [(i, err) for i, (_, err) in enumerate(reports) if err]
    try:
        if any(full for _, (_, full) in failed):
            raise DiskFullError(space.full_line())  # what every rank that met it said
        if failed:
            raise CheckpointError("; ".join(f"rank {i}: {said}" for i, (said, _) in failed))
        files = {k: v for part, _ in reports for k, v in part.items()}
        files[STATE_FILE] = write_torch_file(tmp / STATE_FILE, _shared_payload(job, clone=False))
        _commit(job, tmp, info, files)
    except Exception as e:
        raise _failure(f"checkpoint of step {job.step} was not saved", e, space) from e
    finally:
        remove_temp_dir(tmp)  # committed: renamed already, only forgotten


def _commit(
    job: SaveJob, tmp: Path, info: dict[str, dict[str, Any]], files: dict[str, FileInfo]
) -> None:
    versions = local_versions()
    manifest = {  # described in multigpu.checkpoint.native.layout
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "step": job.step,
        "epoch": job.epoch,
        "world_size": job.world_size,
        "torch_version": versions["torch"],
        "multigpu_version": versions["multigpu"],
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "strategy": dict(job.strategy),
        "objects": {
            **{n: {"kind": kind_of(o), "storage": "state"} for n, o in job.objects.items()},
            **info,
            **{n: {"kind": kind_of(o), "storage": "rank"} for n, o in job.per_rank.items()},
        },
        "files": dict(sorted(files.items())),
    }
    commit(tmp, manifest, job.final)
    prune(job.final.parent, job.keep, job.final)
