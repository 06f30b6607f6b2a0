"""``Checkpointer``: atomic, verified checkpoints every N steps, and exact resume at any world size.

Create it with ``ctx.checkpointer(directory, every_steps=..., keep=..., model=..., ...)``. A save
is collective — every rank calls it at the same step (``step()`` does this by itself):

1. rank 0 creates ``directory/.tmp-step-XXXXXXXX-<nonce>/`` and tells the others its name;
2. every rank writes ``rank-XXXXX.pt`` (its RNG states and per-rank objects), fsynced, hashing
   as it writes; rank 0 also writes ``state.pt`` (the replicated objects: model, optimizer, ...);
3. rank 0 collects every file's size and SHA-256, writes ``manifest.json`` and then ``COMMITTED``,
   renames the directory to ``step-XXXXXXXX`` and prunes to the ``keep`` newest.

The directory must be on a file system every rank sees (one machine, or NFS/Lustre/... across
machines): each rank writes its own file there and reads ``state.pt`` from there on resume.

With ``async_save=True`` the state is copied to CPU memory (the only stall), and a background
thread per rank writes it; the threads use no process-group collectives (they would interleave
with training's) but meet through ``.done`` files in the temp directory.

Environment variables read: none.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any

import torch
from torch import nn

from multigpu import dist
from multigpu.checkpoint.layout import (
    FORMAT,
    STATE_FILE,
    find_latest,
    rank_file_name,
    step_dir_name,
)
from multigpu.checkpoint.objects import check_trackable, kind_of, state_of
from multigpu.checkpoint.restore import choose_checkpoint, restore_checkpoint
from multigpu.checkpoint.rng import capture_rng
from multigpu.checkpoint.writer import (
    FileInfo,
    commit,
    manifest_of,
    new_temp_dir,
    prune,
    report_done,
    wait_for_ranks,
    write_torch_file,
)
from multigpu.errors import CheckpointError, UsageError

log = logging.getLogger(__name__)

SIGTERM_EXIT_CODE = 128 + signal.SIGTERM


class Checkpointer:
    """Saves and restores a training run; see the module doc for the protocol.

    Example:
        >>> ckpt = ctx.checkpointer("ckpt", every_steps=100, keep=3,
        ...                         model=model, optimizer=opt, loader=loader)  # doctest: +SKIP
        >>> ckpt.resume()           # newest complete checkpoint, or None  # doctest: +SKIP
        >>> ...; ctx.step(opt); ckpt.step()  # saves every 100 steps        # doctest: +SKIP
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        rank: int,
        world_size: int,
        unwrap: Callable[[nn.Module], nn.Module],
        comm_device: torch.device,
        timeout: float,
        every_steps: int | None = None,
        keep: int | None = None,
        async_save: bool = False,
        save_on_sigterm: bool = False,
    ) -> None:
        for label, value in (("every_steps", every_steps), ("keep", keep)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise UsageError(
                    f"{label}={value!r} must be a positive integer or None; give e.g. {label}=100"
                )
        self.directory = Path(directory)
        self.rank, self.world_size = rank, world_size
        self.every_steps, self.keep = every_steps, keep
        self.async_save = async_save
        self._unwrap = unwrap
        self._comm_device = comm_device
        self._timeout = timeout
        self._shared: dict[str, Any] = {}
        self._per_rank: dict[str, Any] = {}
        self._steps = 0
        self._saved_step: int | None = None
        self._thread: threading.Thread | None = None
        self._thread_error: BaseException | None = None
        self._sigterm = False
        self._previous_handler: Any = None
        self._on_sigterm = False  # a handler of ours is installed
        self._closed = False
        if save_on_sigterm:
            self._install_sigterm()

    # ---- what is saved --------------------------------------------------------------------------
    def track(self, **objects: Any) -> Checkpointer:
        """Save and restore these objects (replicated: saved once, by rank 0). Returns self."""
        for name, obj in objects.items():
            check_trackable(name, obj, {**self._shared, **self._per_rank})
            self._shared[name] = obj
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

    def save(self) -> Path:
        """Save now (collective: every rank calls it). Returns the checkpoint's final path."""
        self.wait()
        step = self._steps
        final = self.directory / step_dir_name(step)
        if self._saved_step == step:
            return final  # this step is already saved (e.g. a SIGTERM right after a due save)
        started = time.perf_counter()
        tmp = self._agree_on_temp_dir(step)
        shared = self._shared_payload(step, clone=self.async_save) if self.rank == 0 else None
        mine = self._rank_payload(clone=self.async_save)
        objects = {
            **{n: kind_of(o) for n, o in self._shared.items()},
            **{n: kind_of(o) for n, o in self._per_rank.items()},
        }
        epoch = self._epoch()
        self._saved_step = step
        if self.async_save:
            self._thread_error = None
            self._thread = threading.Thread(
                target=self._write_async,
                args=(tmp, step, epoch, objects, shared, mine),
                name=f"multigpu-checkpoint-{step}",
                daemon=False,
            )
            self._thread.start()
            log.debug(
                "checkpoint step %d: state copied in %.3f s", step, time.perf_counter() - started
            )
            return final
        error: str | None = None
        info: FileInfo | None = None
        try:
            info = write_torch_file(tmp / rank_file_name(self.rank), mine)
        except Exception as e:  # every rank must reach the gather below
            error = f"{type(e).__name__}: {e}"
        reports = dist.gather_objects_small((rank_file_name(self.rank), info, error))
        outcome: str | None = None
        if self.rank == 0:
            outcome = self._finish(tmp, step, epoch, objects, shared, reports)
        outcome = dist.broadcast(outcome, src=0)
        if outcome is None or not outcome.startswith("ok:"):
            self._saved_step = None
            raise CheckpointError(f"checkpoint of step {step} was not saved: {outcome}")
        if self.rank == 0:
            log.info(
                "saved checkpoint step %d to %s in %.2f s",
                step,
                final,
                time.perf_counter() - started,
            )
        return final

    def _agree_on_temp_dir(self, step: int) -> Path:
        name: str | None = None
        if self.rank == 0:
            try:
                name = str(new_temp_dir(self.directory, step))
            except OSError as e:
                name = f"error: cannot create a checkpoint in {self.directory}: {e}"
        name = dist.broadcast(name, src=0)
        assert name is not None
        if name.startswith("error:"):
            raise CheckpointError(name[len("error: ") :])
        return Path(name)

    def _shared_payload(self, step: int, *, clone: bool) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": 1,
            "step": step,
            "world_size": self.world_size,
            "objects": {n: state_of(o, self._unwrap, clone=clone) for n, o in self._shared.items()},
        }

    def _rank_payload(self, *, clone: bool) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "rng": capture_rng(),
            "objects": {
                n: state_of(o, self._unwrap, clone=clone) for n, o in self._per_rank.items()
            },
        }

    def _epoch(self) -> int | None:
        for obj in self._shared.values():
            if kind_of(obj) == "loader":
                return int(obj.epoch)
        return None

    def _finish(
        self,
        tmp: Path,
        step: int,
        epoch: int | None,
        objects: dict[str, str],
        shared: dict[str, Any] | None,
        reports: list[Any],
    ) -> str:
        """Rank 0: write state.pt, check every rank's report, commit, prune. Returns 'ok:PATH'."""
        failed = [f"rank {i}: {err}" for i, (_, _, err) in enumerate(reports) if err]
        if failed:
            return "; ".join(failed)
        try:
            files = {name: info for name, info, _ in reports}
            files[STATE_FILE] = write_torch_file(tmp / STATE_FILE, shared)
            manifest = manifest_of(
                step=step, epoch=epoch, world_size=self.world_size, objects=objects, files=files
            )
            final = commit(tmp, manifest)
            prune(self.directory, self.keep, final)
        except Exception as e:  # reported to every rank
            return f"{type(e).__name__}: {e}"
        return f"ok:{final}"

    def _write_async(
        self,
        tmp: Path,
        step: int,
        epoch: int | None,
        objects: dict[str, str],
        shared: dict[str, Any] | None,
        mine: dict[str, Any],
    ) -> None:
        started = time.perf_counter()
        name = rank_file_name(self.rank)
        try:
            try:
                info = write_torch_file(tmp / name, mine)
            except Exception as e:
                report_done(tmp, self.rank, name, None, f"{type(e).__name__}: {e}")
                raise
            report_done(tmp, self.rank, name, info, None)
            if self.rank == 0:
                files = wait_for_ranks(tmp, self.world_size, self._timeout)
                files[STATE_FILE] = write_torch_file(tmp / STATE_FILE, shared)
                manifest = manifest_of(
                    step=step, epoch=epoch, world_size=self.world_size, objects=objects, files=files
                )
                final = commit(tmp, manifest)
                prune(self.directory, self.keep, final)
                log.info(
                    "saved checkpoint step %d to %s in %.2f s (in the background)",
                    step,
                    final,
                    time.perf_counter() - started,
                )
        except BaseException as e:  # re-raised by wait()
            self._thread_error = e

    def wait(self) -> None:
        """Wait for an asynchronous save; re-raise its error, if any, as a CheckpointError."""
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        error, self._thread_error = self._thread_error, None
        if error is not None:
            self._saved_step = None
            raise CheckpointError(f"the background checkpoint save failed: {error}") from error

    # ---- resuming -------------------------------------------------------------------------------
    def resume(self, path: str | os.PathLike[str] = "auto") -> int | None:
        """Restore everything tracked from a checkpoint; return its step (None: none found).

        ``"auto"``: the newest complete checkpoint in ``directory`` (incomplete or corrupt newer
        ones are skipped with a warning naming them). A path: that checkpoint, which must be
        complete. Rank 0 chooses, every rank loads the same one.

        Raises:
            CheckpointError: the given checkpoint is incomplete, or a tracked object is missing
                from it or does not fit its saved state.
        """
        self.wait()
        choice: str | None = None
        if self.rank == 0:
            choice = choose_checkpoint(self.directory, path)
        choice = dist.broadcast(choice, src=0)
        if choice is None:
            log.info("no checkpoint in %s: starting from step 0", self.directory)
            return None
        if choice.startswith("error:"):
            raise CheckpointError(choice[len("error: ") :])
        return self._restore(Path(choice))

    def _restore(self, path: Path) -> int:
        step = restore_checkpoint(
            path, rank=self.rank, shared=self._shared, per_rank=self._per_rank, unwrap=self._unwrap
        )
        self._steps = self._saved_step = step
        return step

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
        if self._closed:
            return
        self._closed = True
        if self._on_sigterm:
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, self._previous_handler or signal.SIG_DFL)
            self._on_sigterm = False
        self.wait()
