"""``Checkpointer``: atomic, verified checkpoints every N steps, and exact resume at any world size.

Create it with ``ctx.checkpointer(directory, every_steps=..., keep=..., model=..., ...)``. A save
is collective: every rank calls it at the same step (``step()`` does this by itself). The
protocol is in ``multigpu.checkpoint.native.saving``, the layout in
``multigpu.checkpoint.native.layout``.

The directory must be on a file system every rank sees (one machine, or NFS/Lustre/... across
machines): each rank writes its own files there and reads what it needs from there on resume.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any

import torch

from multigpu.checkpoint.native.layout import (
    TMP_PREFIX,
    find_latest,
    parse_order,
    scan,
    step_dir_name,
)
from multigpu.checkpoint.native.lock import DirectoryLock
from multigpu.checkpoint.native.objects import check_trackable, epoch_of, kind_of
from multigpu.checkpoint.native.progress import LastSave, Progress
from multigpu.checkpoint.native.restore import choose_checkpoint, restore_checkpoint
from multigpu.checkpoint.native.saving import PendingSave, SaveJob, decided_by_rank0, save
from multigpu.checkpoint.native.snapshot import StateAdapter
from multigpu.common import worker_exit
from multigpu.errors import CheckpointError, UsageError
from multigpu.runtime import dist

log = logging.getLogger(__name__)

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


def _first_missing(directory: Path) -> Path | None:
    """The outermost of ``directory`` and its parents that does not exist (None: it exists)."""
    missing = None
    for path in (directory, *directory.parents):
        if path.exists():
            return missing
        missing = path
    return missing


def _last_saved_note(ref: weakref.ref[Checkpointer]) -> Callable[[], str | None]:
    """``"last checkpoint: PATH (step N)"`` for the checkpointer ``ref`` names, when it saved or
    resumed one that is on disk (a save interrupted before its rename is not)."""
    directory = ref().directory  # type: ignore[union-attr]

    def note() -> str | None:
        checkpointer = ref()
        last = checkpointer._last if checkpointer is not None else None
        saved = checkpointer is not None and last is not None and checkpointer._here(last.path)
        # The newest complete one on disk: an asynchronous save not yet committed leaves the one
        # before; a save committed but not yet returned (Ctrl-C between its commit marker and
        # the end of save()) is already the newest.
        chosen = scan(directory)[0]
        newest = (
            chosen is None or chosen.step is None or (last is not None and chosen.step <= last.step)
        )
        if saved and last is not None and last.path.is_dir() and newest:
            return f"last checkpoint: {last.path} (step {last.step})"
        if chosen is None:
            return f"no checkpoint in {directory} yet"
        return f"last checkpoint: {chosen.path} (step {chosen.step})"

    return note


class Checkpointer:
    """Saves and restores a training run; see the module doc for the protocol."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rank: int,
        world_size: int,
        adapter: StateAdapter,
        comm_device: torch.device,
        timeout: float,
        every_steps: int | None = None,
        keep: int | None = None,
        async_save: bool = False,
        save_on_sigterm: bool = False,
        describe: Callable[[], Mapping[str, Any]] | None = None,
        lock_timeout: float = 0.0,
        before_save: Callable[[], None] | None = None,
        counts_step: Callable[[], bool] | None = None,
    ) -> None:
        for label, value in (("every_steps", every_steps), ("keep", keep)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise UsageError(
                    f"{label}={value!r} must be a positive integer or None; give e.g. {label}=100"
                )
        if isinstance(lock_timeout, bool) or not (
            isinstance(lock_timeout, int | float) and 0 <= lock_timeout < float("inf")
        ):
            raise UsageError(
                f"lock_timeout={lock_timeout!r} must be a number of seconds >= 0; give e.g. "
                "lock_timeout=600 to wait up to 10 minutes for another run to free the directory"
            )
        self.directory = Path(directory)
        self.rank, self.world_size = rank, world_size
        self.every_steps, self.keep = every_steps, keep
        self.async_save = async_save
        self._adapter = adapter
        self._describe = describe
        self._before_save = before_save  # the Context's hooks: its trackers flush first
        # The Context's hooks: a replica group's share that was not the step's last, or a step
        # the groups did not commit, is not an optimizer step to count.
        self._counts_step = counts_step
        self._comm_device = comm_device
        self._timeout = timeout
        self._shared: dict[str, Any] = {}
        self._per_rank: dict[str, Any] = {}
        self._optional: set[str] = set()  # tracked, but a checkpoint without them still resumes
        self._steps = 0
        # The checkpoint saved last (or resumed from): a save with nothing moved since is not
        # written again, and one at the same step count is named after it (see progress.py).
        self._last: LastSave | None = None
        self._progress = Progress()
        self._said_uncounted = False
        self._pending: PendingSave | None = None
        self._before_pending: LastSave | None = None  # restored when the background save fails
        self._group: Any = None  # the background saves' own gloo group, made at the first one
        self._sigterm = False
        self._previous_handler: Any = None
        self._on_sigterm = False  # a handler of ours is installed
        self._lock_timeout = lock_timeout
        # One run per directory: rank 0 holds it until close() or its death (see lock.py).
        self._lock: DirectoryLock | None = None
        self._created: Path | None = None  # by the lock: removed again if a resume is refused
        # Every rank raises rank 0's refusal (a held directory): the others would otherwise go
        # on to their next collective and fail there, blaming a lost peer.
        decided_by_rank0(self.rank, self._hold)
        if save_on_sigterm:
            self._install_sigterm()
        # Ctrl-C on a `multigpu run` worker names the checkpoint to resume from.
        worker_exit.note_checkpoints(str(self.directory), _last_saved_note(weakref.ref(self)))

    # ---- what is saved --------------------------------------------------------------------------
    def track(self, **objects: Any) -> Checkpointer:
        """Save and restore these objects (models and optimizers sharded as the strategy holds
        them, the rest saved once by rank 0). Returns self."""
        for name, obj in objects.items():
            check_trackable(name, obj, {**self._shared, **self._per_rank})
            self._shared[name] = obj
        self._progress.watch(objects)
        return self

    def track_optional(self, **objects: Any) -> Checkpointer:
        """Save these objects like ``track``'s, but resume a checkpoint that lacks them too
        (leaving them as they are): state multigpu adds of its own, such as a replica group's
        job step, which checkpoints written without it do not hold. Returns self."""
        self.track(**objects)
        self._optional.update(objects)
        return self

    def track_per_rank(self, **objects: Any) -> Checkpointer:
        """Save and restore these objects per rank (each rank's own state, e.g. local sums).

        At another world size rank ``r`` gets saved rank ``r``'s state; ranks beyond the saved
        world size keep their objects as they are (a warning says so).
        """
        for name, obj in objects.items():
            check_trackable(name, obj, {**self._shared, **self._per_rank})
            self._per_rank[name] = obj
        return self

    @property
    def steps(self) -> int:
        """Optimizer steps counted by ``step()`` (restored by ``resume``)."""
        return self._steps

    def latest(self) -> Path | None:
        """The newest complete checkpoint in ``directory``, or None."""
        status = find_latest(self.directory)
        return status.path if status is not None else None

    # ---- saving ---------------------------------------------------------------------------------
    def step(self) -> bool:
        """Count one optimizer step; save when it is due (or on SIGTERM). Returns whether it saved.

        With ``save_on_sigterm`` the ranks agree every step, with one 1-element all-reduce,
        whether any of them got SIGTERM (they may get it at different steps); if so all save
        and the process exits with code 143.
        """
        if self._counts_step is not None and not self._counts_step():
            return False
        self._steps += 1
        if self._on_sigterm:
            stop = dist.all_reduce(float(self._sigterm), op="max", device=self._comm_device)
            if stop:
                path = self.save()
                self.wait()
                log.warning("saved step %d on SIGTERM to %s; exiting", self._steps, path)
                raise SystemExit(SIGTERM_EXIT_CODE)
        if self.every_steps is not None and self._steps % self.every_steps == 0:
            self.save()
            return True
        return False

    def _hold(self) -> None:
        if self.rank == 0 and self._lock is None:
            created = _first_missing(self.directory)
            self._lock = DirectoryLock.acquire(self.directory, wait_s=self._lock_timeout)
            self._created = self._created or created

    def save(self) -> Path:
        """Save the state as it is now (collective: every rank calls it), whether ``step()``
        counted the steps or not. Returns the checkpoint's final path: ``step-XXXXXXXX``, or
        ``step-XXXXXXXX.K`` for the K-th further save at the same step count.

        Not written again when nothing moved since the last save or resume (the step count,
        every tracked loader's place and every tracked optimizer's steps as they were, e.g. a
        ``save()`` right after ``step()`` saved): that checkpoint's path is returned.

        With ``async_save`` it returns once the state is copied to CPU memory; the files are
        written in the background (``wait()`` ends that).
        """
        self.wait()
        self._hold()  # given up by a refused resume
        step, mark = self._steps, self._progress.mark(self._steps, self._shared)
        last = self._last if self._last is not None and self._here(self._last.path) else None
        # Rank 0's view, on every rank: a rank that skipped the save alone would hang the others.
        if decided_by_rank0(self.rank, lambda: last is not None and last.unmoved(mark)):
            assert last is not None
            if self.rank == 0:
                log.info("nothing moved since %s: not saved again", last.path)
            return last.path
        index = last.index + 1 if last is not None and last.step == step else 0
        final = self.directory / step_dir_name(step, index)
        if index == 1 and not self._said_uncounted and self.rank == 0:
            self._said_uncounted = True
            log.warning(
                "saving %s: the state moved on since the save of step %d, but the step count "
                "did not; call ckpt.step() once per optimizer step so that checkpoints are "
                "named by it (resume takes the newest either way)",
                final.name,
                step,
            )
        if self._before_save is not None:
            self._before_save()
        job = SaveJob(
            final=final,
            stale=f"{TMP_PREFIX}step-*",
            step=step,
            epoch=epoch_of(self._shared),
            rank=self.rank,
            world_size=self.world_size,
            objects=self._shared,
            per_rank=self._per_rank,
            adapter=self._adapter,
            strategy=self._describe() if self._describe else {},
            keep=self.keep,
        )
        if self.async_save:
            self._pending = PendingSave(job, self._async_group(), self._timeout)
            self._before_pending = last
        else:
            save(job)
        self._last = LastSave(path=final, step=step, index=index, mark=mark)
        return final

    def _here(self, path: Path) -> bool:
        """Whether ``path`` is a checkpoint of this checkpointer's directory."""
        return path.parent.resolve() == self.directory.resolve()

    def _async_group(self) -> Any:
        if self._group is None and dist.is_initialized():
            # Collective: every rank saves at this step.
            self._group = dist.new_gloo_group(self._timeout)
        return self._group

    def wait(self) -> None:
        """Wait for an asynchronous save; re-raise its error, if any, as a CheckpointError."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        try:
            pending.wait()
        except CheckpointError:
            self._last = self._before_pending  # the last save that is on disk
            raise

    # ---- resuming -------------------------------------------------------------------------------
    def resume(self, path: str | os.PathLike[str] = "auto") -> int | None:
        """Restore everything tracked from a checkpoint; return its step (None: none found).

        ``"auto"``: the newest complete checkpoint in ``directory`` (incomplete or corrupt newer
        ones are skipped with a warning naming them; when none is complete, one warning says what
        was found and that training starts from step 0). Temp dirs of saves that did not finish
        are removed: the directory's lock says their run is gone. A path: that checkpoint, which
        must be complete. Rank 0 chooses, every rank loads the same one. The checkpoint may come
        from another world size and another strategy: models and optimizers are resharded.

        A refused resume (``CheckpointError``: another model, a damaged checkpoint) leaves no
        trace: the directory, when this checkpointer created it, is removed again.
        """
        self.wait()
        self._hold()  # given up by an earlier refused resume
        try:
            # Rank 0 chooses: it holds the directory's lock (see choose_checkpoint).
            choice = decided_by_rank0(self.rank, lambda: choose_checkpoint(self.directory, path))
            if choice is None:
                log.info("no checkpoint in %s: starting from step 0", self.directory)
                return None
            step = restore_checkpoint(
                choice,
                rank=self.rank,
                shared=self._shared,
                per_rank=self._per_rank,
                adapter=self._adapter,
                optional=self._optional,
            )
        except (CheckpointError, UsageError):
            self._undo_directory()
            raise
        self._steps = step
        order = parse_order(Path(choice).name)
        self._last = LastSave(
            path=Path(choice),
            step=step,
            index=order[1] if order is not None and order[0] == step else 0,
            mark=self._progress.mark(step, self._shared),
        )
        return step

    def _undo_directory(self) -> None:
        """Remove the directories this checkpointer created, while nothing is saved in them."""
        if self._created is None or self._last is not None:
            return
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        here = self.directory
        while True:
            try:
                here.rmdir()  # only an empty one: anything else in it is not ours
            except OSError:
                return
            if here == self._created:
                self._created = None
                return
            here = here.parent

    # ---- healing (replica groups) -------------------------------------------------------------
    def heal_state(self) -> dict[str, Any]:
        """What a replica group that heals from this one takes over (not a checkpoint): the
        count, and the state of the tracked objects of kind ``object`` (a loop's own state,
        e.g. a history of epochs; models, optimizers, schedulers, loaders heal on their own)."""
        objects = {**self._shared, **self._per_rank}
        own = {
            k: o for k, o in objects.items() if kind_of(o) == "object" and k not in self._optional
        }
        return {"steps": self._steps, "objects": {k: o.state_dict() for k, o in own.items()}}

    def load_heal_state(self, state: dict[str, Any]) -> None:
        """Take over a live replica group's ``heal_state``; the next save is due by its count."""
        self._steps = int(state["steps"])
        self._last = None  # this group's own directory may hold no save of this step
        objects = {**self._shared, **self._per_rank}
        for name, part in state.get("objects", {}).items():
            if name in objects and name not in self._optional:
                objects[name].load_state_dict(part)

    # ---- lifetime -------------------------------------------------------------------------------
    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            raise UsageError(
                "save_on_sigterm=True needs the checkpointer created on the main thread"
            )

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            self._sigterm = True  # acted on at the next step(), when every rank can agree

        self._previous_handler = signal.signal(signal.SIGTERM, on_sigterm)
        self._on_sigterm = True

    def close(self) -> None:
        """Finish an asynchronous save and restore the SIGTERM handler (idempotent)."""
        if self._on_sigterm:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._previous_handler or signal.SIG_DFL)
            self._on_sigterm = False
        try:
            self.wait()
        finally:
            self._progress.close()
            self._group = None  # its gloo threads end with the process group, not at exit
            if self._lock is not None:
                self._lock.release()
