"""The hook behind ``ctx.log``: rank 0's trackers, one run, no step sent twice.

A ``ctx.log`` call costs no I/O: the adapters keep the values, and the run is flushed (every
tracker written, then the run file) when ``FLUSH_EVERY_S`` has passed since the last flush,
before a checkpoint is saved, and when the Context ends. So the run file only ever names steps
every tracker holds; a killed process loses the steps after its last flush, and a job resuming
from its last checkpoint (saved after a flush) sends them again.

Environment variables read: none (``multigpu.init`` hands over ``log_to``, ``log_dir`` and the
restart count; each tracker module names what its own package reads).
"""

from __future__ import annotations

import logging
import numbers
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from multigpu.checkpoint.native.space import free_bytes, mount_point, ran_out_of_space
from multigpu.common.versions import local_versions
from multigpu.errors import MultiGPUError, UsageError
from multigpu.instruments.hooks import Hook
from multigpu.instruments.tracking.run_file import (
    RUN_FILE,
    Frontier,
    TrackingRecord,
    plain,
    read_run,
    write_run,
)
from multigpu.instruments.tracking.tracker import Opening, Tracker

log = logging.getLogger(__name__)

DEFAULT_LOG_DIR = "runs"
"""The log directory when neither ``log_dir=`` nor ``MULTIGPU_LOG_DIR`` gives one."""

FLUSH_EVERY_S = 10.0
"""The longest a logged value waits in memory (a ``ctx.log`` call flushes once it passed)."""


def make_tracker(name: str, directory: Path) -> Tracker:
    """The adapter of tracker ``name`` (its package is imported when the run opens)."""
    if name == "tensorboard":
        from multigpu.instruments.tracking.to_tensorboard import TensorBoardTracker

        return TensorBoardTracker(directory)
    if name == "csv":
        from multigpu.instruments.tracking.to_csv import CsvTracker

        return CsvTracker(directory)
    if name == "mlflow":
        from multigpu.instruments.tracking.to_mlflow import MlflowTracker

        return MlflowTracker(directory)
    from multigpu.instruments.tracking.to_wandb import WandbTracker

    return WandbTracker(directory)


class Tracking(Hook):
    """Rank 0's trackers of a job, attached to its Context by ``multigpu.init``.

    The run opens at the first ``ctx.log``: a new one, or the run of ``directory``'s run file
    when this job resumes it (its first step is past the run's first, or it is an elastic
    restart: ``restarts`` > 0); a job starting over at the run's first step starts a new run.
    Logged values wait in the adapters until a flush (see the module doc).
    """

    def __init__(
        self,
        names: Sequence[str],
        directory: Path,
        *,
        config: Mapping[str, Any] | None = None,
        restarts: int = 0,
    ) -> None:
        self.names = tuple(names)
        self.directory = directory
        self.config = {str(k): plain(v) for k, v in (config or {}).items()}
        self.restarts = restarts
        self._trackers: list[tuple[Tracker, Frontier]] = []
        self._record: TrackingRecord | None = None
        self._sent = Frontier()
        self._flushed_at = time.monotonic()
        self._closed = False
        self._logged = Frontier()  # what this job logged (a resumed run's earlier steps aside)
        self._said_late = False
        self._broken = False  # a flush failed and raised: nothing more is written

    def on_log(self, ctx: Any, metrics: Mapping[str, Any], step: int) -> float | None:
        values = numbers_of(metrics, step)
        if self._closed:
            raise UsageError(f"ctx.log(step={step}) after the Context was torn down")
        if self._broken:
            return None  # a flush failed (raised): nothing more is sent
        opening = None
        if self._record is None:  # the trackers' start-up (W&B's service, MLflow's store)
            began = time.perf_counter()
            try:
                self._open(ctx, step)
            except Exception as e:
                self._fail("opening the run", e)
            opening = time.perf_counter() - began  # not training: ctx.throughput() skips it
        self._note_late(step, values)
        now = time.time()
        queued = []
        for tracker, frontier in self._trackers:
            fresh = {k: v for k, v in values.items() if not frontier.has(step, k)}
            if fresh:
                tracker.log(fresh, step, now)
            queued.append((tracker, frontier.after(step, values)))
        self._trackers = queued
        self._sent = self._sent.after(step, values)
        if time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
            self._flush()
        return opening

    def _note_late(self, step: int, values: Mapping[str, Any]) -> None:
        """Say once that values logged at a step this job already passed are not sent (the
        trackers keep each step once, in order: W&B refuses a lower step). A resumed job's
        steps that an earlier job sent are skipped without a word, as the docs say."""
        late = [k for k in values if self._logged.has(step, k)]
        self._logged = self._logged.after(step, values)
        if late and not self._said_late:
            self._said_late = True
            log.warning(
                "ctx.log(step=%d) of %s not sent: step %d was logged already, and "
                "each tracker keeps a step's value once and the steps in order; log each value "
                "once, at a step >= the last one (said once)",
                step, ", ".join(late), self._logged.step,
            )  # fmt: skip

    def on_save(self, ctx: Any) -> None:
        if self._record is not None and not self._closed and not self._broken:
            self._flush()  # the checkpoint's steps are in the trackers before it exists

    def _flush(self, *, closing: bool = False) -> list[tuple[str, Exception]]:
        """Write every tracker, then the run file: it names only steps they all hold.

        Closing, a tracker that fails is returned (what, error) and the others are still
        written (the run file then keeps naming the last steps flushed); otherwise its error is
        raised, in one line when it is the file system's (``TrackingError``).
        """
        assert self._record is not None
        failures: list[tuple[str, Exception]] = []
        for tracker, _ in self._trackers:
            try:
                tracker.flush()
            except Exception as e:
                if not closing:
                    self._fail(f"writing to {tracker.name}", e)
                failures.append((tracker.name, e))
        if not failures:
            self._record.note(self._sent)
            try:
                write_run(self.directory, self._record, durable=closing)
            except Exception as e:
                if not closing:
                    self._fail(f"writing {RUN_FILE}", e)
                failures.append((RUN_FILE, e))
        self._flushed_at = time.monotonic()
        return failures

    def _fail(self, what: str, error: Exception) -> NoReturn:
        """Raise ``error`` of a flush (or the run's opening): in one line when the file system
        refused (a full disk: ENOSPC three times chained, 56-72 lines with both ranks'), else
        as it is. The Context's end then writes nothing more (its own try would fail alike)."""
        self._broken = True
        if isinstance(error, MultiGPUError) and error.said_in_full:
            raise error  # a tracker's own line (an MLflow server that does not answer)
        line = disk_failure(self.directory, what, error)
        if line is None:
            raise error
        raise TrackingError(line) from error

    def _open(self, ctx: Any, step: int) -> TrackingRecord:
        previous = read_run(self.directory)
        continuing = previous is not None and (self.restarts > 0 or step > previous.first_step)
        fresh = TrackingRecord(first_step=step)
        record = previous if continuing and previous is not None else fresh
        if continuing:
            record.jobs += 1
        opening = Opening(
            directory=self.directory,
            name=self.directory.absolute().name,
            continuing=continuing,
            first_step=step,
            frontier=record.frontier,
            ids=dict(record.ids),
            config=self.config,
            environment=environment(ctx, self.restarts),
        )
        for name in self.names:
            tracker = make_tracker(name, self.directory)
            own = tracker.open(opening)
            self._trackers.append((tracker, _later(record.frontier, own)))
            record.ids.update(tracker.ids())
        self._record, self._sent = record, record.frontier
        write_run(self.directory, record, durable=True)
        self._flushed_at = time.monotonic()
        said = "continuing its run" if continuing else "a new run"
        if continuing and record.last_step is not None:
            said += f"; steps up to {record.last_step} are there and not sent again"
        places = [w for tracker, _ in self._trackers if (w := tracker.where())]
        said += "".join(f"; {w}" for w in places)
        ctx.print(f"tracking: {', '.join(self.names)} in {self.directory} ({said})")
        return record

    def on_exit(self, ctx: Any, error: BaseException | None) -> None:
        stopped_cleanly = error is None or (isinstance(error, SystemExit) and not error.code)
        failures = self._close(failed=not stopped_cleanly)
        if failures and stopped_cleanly:  # the run's last steps are lost: the job failed
            what, e = failures[0]
            self._fail(f"writing the last steps to {what}", e)
        self._warn(failures)

    def on_teardown(self, ctx: Any) -> None:
        self._warn(self._close(failed=False))  # at exit, maybe: nothing raised from here

    def _warn(self, failures: list[tuple[str, Exception]]) -> None:
        for what, e in failures:
            said = disk_failure(self.directory, f"writing the last steps to {what}", e)
            said = said or f"writing the last steps to {what} failed: {e}"
            log.warning("tracking: %s", said)

    def _close(self, *, failed: bool) -> list[tuple[str, Exception]]:
        """End every tracker's run; the failures (none said after a flush that raised)."""
        if self._closed:
            return []
        self._closed = True
        failures = []
        if self._record is not None and not self._broken:
            failures = self._flush(closing=True)
        for tracker, _ in self._trackers:
            try:  # one tracker failing to close must not keep the others open
                tracker.close(failed or self._broken)
            except Exception as e:
                failures.append((tracker.name, e))
        return [] if self._broken else failures


class TrackingError(MultiGPUError):
    """The trackers' run could not be written (a full disk): the message says where and why,
    in one line, which a worker of ``multigpu run`` does not print as a traceback."""

    said_in_full = True


def disk_failure(directory: Path, what: str, error: BaseException) -> str | None:
    """The one line for ``error`` when the file system of ``directory`` refused a write (a full
    disk, a quota, a read-only or vanished mount); None for anything else.

    Example:
        >>> import errno
        >>> refused = OSError(errno.EROFS, "Read-only file system")
        >>> said = disk_failure(Path("."), "writing to csv", refused)
        >>> said.split(";")[0]
        'writing to csv in . failed: Read-only file system'
    """
    if ran_out_of_space(error) or _said_full(error):
        try:
            free = f"{free_bytes(directory)} bytes free on its file system, mounted at " + str(
                mount_point(directory)
            )
        except OSError:
            free = "its file system does not say how much is free"
        why = f"No space left on device ({free})"
    else:
        found = _os_error(error)
        if found is None:
            return None
        why = found.strerror or str(found)
    return (
        f"{what} in {directory} failed: {why}; the steps logged since the last flush "
        f"are not written ({RUN_FILE} names the last steps every tracker holds); free space "
        "there, or give another log_dir="
    )


def _said_full(error: BaseException) -> bool:
    """SQLite (MLflow's store) says a full disk in words: "database or disk is full"."""
    return any("disk is full" in str(e) for e in _chain(error))


def _chain(error: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    current: BaseException | None = error
    while current is not None and all(current is not e for e in found):
        found.append(current)
        current = current.__cause__ or current.__context__
    return found


def _os_error(error: BaseException) -> OSError | None:
    return next((e for e in _chain(error) if isinstance(e, OSError)), None)


class LogCheck(Hook):
    """``ctx.log``'s check on the ranks that do not write (rank 0 writes: ``Tracking``): a value
    no tracker takes is refused on every rank alike, so that the job ends in one line, not in
    rank 0's error and the other ranks' failed collective (it waited for rank 0)."""

    def on_log(self, ctx: Any, metrics: Mapping[str, Any], step: int) -> float | None:
        numbers_of(metrics, step, read=False)
        return None


def _later(a: Frontier, b: Frontier | None) -> Frontier:
    """The further of two frontiers (a tracker's own store may be ahead of the run file)."""
    if b is None or b.step is None or (a.step is not None and a.step > b.step):
        return a
    if a.step == b.step:
        return Frontier(a.step, a.keys | b.keys)
    return b


def numbers_of(
    metrics: Mapping[str, Any], step: int, *, read: bool = True
) -> dict[str, float | torch.Tensor]:
    """``metrics`` as floats (a CPU tensor read once; a GPU one copied, to be read at the
    flush: ``.item()`` here would wait for the GPU at every step); refuses what a tracker
    cannot plot. ``read=False``: only the refusals (the tensors are returned as given).

    Example:
        >>> numbers_of({"loss": torch.tensor(0.5), "n": 3}, step=1)
        {'loss': 0.5, 'n': 3.0}
    """
    if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
        raise UsageError(f"ctx.log(step={step!r}): expected the step as a whole number >= 0")
    if not isinstance(metrics, Mapping):
        raise UsageError(
            f"ctx.log({type(metrics).__name__}): expected a mapping of names to numbers, "
            "e.g. ctx.log({'loss': loss}, step=step)"
        )
    values: dict[str, float | torch.Tensor] = {}
    for key, value in metrics.items():
        if not isinstance(key, str) or not key:
            raise UsageError(f"ctx.log: metric name {key!r}: expected a non-empty string")
        if isinstance(value, torch.Tensor) and value.numel() == 1 and not read:
            values[key] = value
        elif isinstance(value, torch.Tensor) and value.numel() == 1:
            value = value.detach()
            # A copy: the caller may change its tensor in place before the flush reads it.
            values[key] = float(value.item()) if value.device.type == "cpu" else value.clone()
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            values[key] = float(value)
        else:
            shown = f"a tensor of shape {tuple(value.shape)}" if hasattr(value, "shape") else value
            raise UsageError(f"ctx.log: {key}={shown!r}: expected a number or a one-element tensor")
    return values


def environment(ctx: Any, restarts: int) -> dict[str, Any]:
    """Where the job runs, as the trackers record it beside the hyperparameters."""
    env = ctx.env
    found: dict[str, Any] = {
        "world_size": ctx.world_size,
        "nodes": env.num_nodes,
        "processes_per_node": env.local_world_size,
        "launcher": env.source,
        "strategy": ctx.strategy.name,
        "precision": ctx.precision.name,
        "device": ctx.device.type,
        "backend": ctx.backend or "none",
        "host": socket.gethostname(),
        "restarts": restarts,
    }
    if ctx.device.type == "cuda":
        found["gpu"] = torch.cuda.get_device_name(ctx.device)
    found.update({f"{k}_version": v for k, v in local_versions().items()})
    return found
