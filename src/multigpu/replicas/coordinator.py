"""One replica group's side of per-step fault tolerance, on torchft's ``Manager``.

Every optimizer step starts with a quorum (``begin_step``): the lighthouse names the groups
that take part. A group that comes back (restarted by its own torchrun agent) is behind: in that
same quorum it heals from a live peer — everything of ``multigpu.replicas.heal_state`` travels
over torchft's process group (``PGTransport``), no checkpoint is read — and then takes part in
the step. The step ends with ``finish_step``: the gradients are summed over the groups and
divided by R (the groups of the job, not the ones present: the survivors computed the absent
groups' shares too, see ``multigpu.replicas.shares``), and the step is committed only when no
group failed inside it; otherwise the same global batch is run again with the new quorum.

What holds the groups to one result, beyond the step itself:

- **The job's end.** The first group whose loop ends cleanly writes the step in the job's record
  (``multigpu.common.replica_record``); a group whose loop counter a restart reset learns it at
  its next step and its loaders yield nothing more, so ``for epoch in range(E)`` ends there too;
  a group that comes back after the end exits at once, saying so.
- **Alignment.** A group whose process began at the job's start (or at its own checkpoint) runs
  the script's loop where the script expects it: it is *aligned*. One that healed into a later
  step has a loop counter behind the job's; it ends right only by an aligned group's end. Such a
  group never runs a step without an aligned group in its quorum: when the aligned ones are away
  but alive (an aligned group's loop ended and it is still writing its outputs), it waits for
  them (up to ``--timeout``); when none is left and the end is unknown, the run ends in one line
  (``ReplicaError``) before it could train past the end.
- **One result.** After every change of quorum and every ``check_every`` steps the groups
  compare a checksum of their parameters; a difference ends the run in one line naming the
  groups and the step.
- **One writer.** ``ctx.is_main`` is true on rank 0 of one group of the job: group 0 (through
  its restarts) while it is in the quorum, else the lowest group of the quorum — unless group 0
  ended the job (then it wrote).
- **The lighthouse.** A quorum that fails because the lighthouse no longer answers ends the run
  in one line naming it, within ``--timeout``, instead of restarts that cannot reach it either.

What happens is said in one line each (a group left, a group rejoined and what it healed from,
in how long) and counted in the job's record, whose summary the launcher prints at the end.
"""

from __future__ import annotations

import contextlib
import logging
import re
import socket
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from multigpu.common.replica_record import JobRecord
from multigpu.errors import ReplicaError, UsageError
from multigpu.replicas.settings import ReplicaSettings
from multigpu.runtime import dist

REPLICA_ID = "multigpu_group_{group}"
"""torchft replica ids: the trailing digits are the group index (torchft reads them so too)."""

WRITER = 0
"""The group whose rank 0 is ``ctx.is_main`` while it takes part (see ``Coordinator.writes``)."""

STARTUP_WAIT_S = 60.0
"""How long a life's first step waits for every group to join its quorum (bounded by --timeout)."""

_MASK = (1 << 62) - 1
_INT_VIEW = {8: torch.int64, 4: torch.int32, 2: torch.int16, 1: torch.int8}


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (an FSDP gradient is a DTensor: its local shard)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


def checksum(tensors: Sequence[torch.Tensor]) -> int:
    """An exact checksum of ``tensors``' bits (this rank's shards), in order: equal tensors give
    equal sums on every rank, and a change of one bit changes it."""
    total = 0
    for index, tensor in enumerate(tensors):
        local = local_tensor(tensor).detach().contiguous().reshape(-1)
        if local.is_floating_point() or local.is_complex():
            local = local.view(_INT_VIEW[local.element_size()])
        bits = int(local.sum(dtype=torch.int64)) if local.numel() else 0
        total = (total * 1_000_003 + bits + index) & _MASK
    return total


def _reachable(address: str, timeout_s: float = 2.0) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
            return True
    except (OSError, ValueError):
        return False


class JobOver(Exception):  # a signal, not an error: the loaders stop quietly
    """The job's end is reached: the training loaders yield nothing more."""


class Coordinator:
    """The quorum, the heal and the commit of each step of this group (one per worker)."""

    def __init__(
        self,
        settings: ReplicaSettings,
        *,
        rank: int,
        world_size: int,
        device: torch.device,
        timeout_s: float,
        record: JobRecord,
    ) -> None:
        self.settings = settings
        self.rank = rank
        """This process's rank inside its group (torchft's ``group_rank``)."""
        self.world_size = world_size
        self.device = device
        self.timeout_s = timeout_s
        self.record = record
        self.manager: Any = None
        self._save: Callable[[], Any] = dict
        self._load: Callable[[Any, int], list[str]] = lambda state, source: []
        self.members: tuple[int, ...] = ()
        """The groups of the current quorum, by index."""
        self.participants = 1
        self.participant_rank = 0
        self.in_step = False
        """A step of a training loader has begun (its quorum is formed)."""
        self.serial = 0
        """Counts the steps begun in this process (a step run again is a new one)."""
        self.decided: bool | None = None
        """The running step's outcome: committed (True), retried (False), not yet (None)."""
        self.on_decided: Callable[[bool], None] | None = None
        """Called with the outcome when a step is decided (the loader moves its cursor)."""
        self.over = False
        """The job's end is reached (its step, announced by a group whose loop ended)."""
        self.end_step: int | None = None
        """The step the job ended at, once known."""
        self.ended_by: int | None = None
        """The group whose loop ended first (the job's end), once known."""
        self.aligned = True
        """This life's loop began where the script put it (the job's start, or its own
        checkpoint), not where a heal put it."""
        self.origin = 0
        """The job step this life's loop began at (its checkpoint's, else 0)."""
        self.resumed_checkpoint = False
        """This life's script read a checkpoint (a Checkpointer's resume)."""
        self.healed_once = False
        """This life took a live group's state (its loop state is the job's)."""
        self.record_lost = False
        """The job's record stopped answering (its line said so): nothing more is written."""
        self.life = 0
        """This life's number among its group's (the record's ``life/G``)."""
        self._aligned_members = 1
        """How many groups of the current quorum are aligned (from the last agreement)."""
        self._healed: tuple[int, int, list[str]] | None = None
        self._checked_quorum: Any = None
        self._pending_step: dict[str, int] | None = None
        self._first_quorum = True
        self.counts = {"steps": 0, "short": 0, "retried": 0, "left": 0, "joined": 0, "healed": 0}

    # ---- lifetime ------------------------------------------------------------------------------
    def check_job_state(self) -> None:
        """At a life's start: a job that failed ends this life with its line; one that ended
        makes it exit at once (a restarted group has nothing left to train)."""
        failed, end = self._record_facts()
        if failed is not None:
            raise ReplicaError(failed)
        if end is not None:
            step, by = end
            self.say(
                f"the job already ended at step {step} (replica group {by} finished it) while "
                "this group was away: nothing left to train here; exiting"
            )
            raise SystemExit(0)
        if self.rank == 0:
            self.life = self.record.start_life(self.settings.group)

    def _record_facts(self) -> tuple[str | None, tuple[int, int] | None]:
        """The job's failure line and end, as rank 0 of this group reads them (every rank of a
        group decides alike)."""
        facts: tuple[str | None, tuple[int, int] | None, str | None] = (None, None, None)
        if self.rank == 0:
            try:
                self.record.seen(self.settings.group)
                facts = (self.record.failed(), self.record.end(), None)
            except Exception as e:  # the record's node is gone
                facts = (None, None, f"{type(e).__name__}: {e}")
                self.record_lost = True
        if self.world_size > 1:
            facts = dist.broadcast(facts)
        failed, end, broken = facts
        if broken is not None:
            raise ReplicaError(
                f"the job's record at {self.settings.store} does not answer ({broken}): the "
                "node hosting the lighthouse is gone? the replica groups cannot go on without "
                "it: restart the job (each group resumes from its checkpoints)"
            )
        return failed, end

    def set_state(self, save: Callable[[], Any], load: Callable[[Any, int], list[str]]) -> None:
        """What a healing group receives from a live one (``save``) and how it takes it in
        (``load(state, source_group)``, returning the names of what it healed)."""
        self._save, self._load = save, load

    def start(self, make_store: Callable[[str], tuple[str, int]]) -> None:
        """Make torchft's manager (once). ``make_store(host)`` gives ``(host, port)`` of a store
        this group's ranks share (rank 0 hosts it): the other groups' ranks meet there."""
        if self.manager is not None:
            return
        try:
            from torchft.checkpointing.pg_transport import PGTransport
            from torchft.manager import Manager
        except ImportError as e:
            raise UsageError(
                "replica groups (multigpu run --replicas) need torchft, which is not installed "
                f"({e}); install it with: pip install 'multigpu[ft]'"
            ) from e
        from multigpu.torch_compat import manager_server_bound_to

        # torchft logs each failure with a traceback (and a flight-recorder note per quorum):
        # the one line of `say` tells the same.
        logging.getLogger("torchft").setLevel(logging.CRITICAL)
        warnings.filterwarnings("ignore", module=r"torchft\.")  # torch deprecations in torchft
        heartbeat = self.settings.heartbeat_s
        # A step's cross-group collectives fail within a few heartbeats of a group's death;
        # the quorum itself may wait for a slow group's first step (imports, a heal): longer.
        step_timeout = timedelta(seconds=max(5.0, 5 * heartbeat))
        pg = _RecordingGloo(timeout=step_timeout)
        transport = PGTransport(pg, timeout=timedelta(seconds=self.timeout_s), device=self.device)
        store_host, store_port = make_store(self.settings.host)
        try:
            with manager_server_bound_to(self.settings.host):
                self.manager = Manager(
                    pg=pg,
                    load_state_dict=None,
                    state_dict=None,
                    min_replica_size=1,
                    use_async_quorum=False,  # heal before the step, then take part in it
                    timeout=step_timeout,
                    quorum_timeout=timedelta(seconds=self.timeout_s),
                    connect_timeout=timedelta(seconds=self.timeout_s),
                    rank=self.rank,
                    world_size=self.world_size,
                    store_addr=store_host,
                    store_port=store_port,
                    lighthouse_addr=f"http://{self.settings.lighthouse}",
                    replica_id=REPLICA_ID.format(group=self.settings.group),
                    hostname=self.settings.host,
                    checkpoint_transport=transport,
                    init_sync=True,  # every group starts from group 0's weights
                )
        except Exception as e:
            self._lighthouse_gone(e)
            raise
        self.manager.register_state_dict_fn("multigpu", self._load_healed, self._save_for_peer)
        self._pg = pg
        if self._pending_step is not None:
            self.job_step_loaded(self._pending_step)

    def close(self, *, clean: bool) -> None:
        """End this life: a clean end of the loop is the job's end (the first announced); the
        counts go to the job's record; the manager's server stops."""
        if self.manager is None:
            return
        manager, self.manager = self.manager, None
        if self.record_lost:
            manager.shutdown(wait=False)
            return
        try:
            if clean and not self.over and self.rank == 0:
                self.record.announce_end(int(manager.current_step()), self.settings.group)
            if self.rank == 0:
                self.record.set_life(self.settings.group, self.life, "gone")
        except Exception as e:  # the record's node is gone: nothing left to tell it
            self.say(f"could not write the job's record at {self.settings.store} ({e})")
        manager.shutdown(wait=False)

    # ---- the job step in checkpoints -------------------------------------------------------------
    def job_step(self) -> dict[str, int]:
        """What a Checkpointer saves of the job (``JobStep``): the committed steps."""
        if self.manager is None:
            return {"step": 0, "batches_committed": 0}
        return {k: int(v) for k, v in self.manager.state_dict().items()}

    def job_step_loaded(self, state: dict[str, int]) -> None:
        """A Checkpointer resumed this life at ``state``'s step (the life is aligned there)."""
        self.resumed_checkpoint = True
        if self.manager is None:
            self._pending_step = dict(state)
            return
        self._pending_step = None
        self.manager.load_state_dict(
            {"step": int(state["step"]), "batches_committed": int(state["batches_committed"])}
        )
        self.origin = int(state["step"])

    # ---- heal ------------------------------------------------------------------------------------
    def _save_for_peer(self) -> dict[str, Any]:
        return {"group": self.settings.group, "state": self._save()}

    def _load_healed(self, state: dict[str, Any]) -> None:
        source = int(state["group"])
        names = self._load(state["state"], source)
        step = int(self.manager.current_step())
        self._healed = (source, step, names)
        self.healed_once = True
        if step > self.origin and self.aligned:
            self.aligned = False
            if self.rank == 0:
                self.record.set_life(self.settings.group, self.life, "healed")

    # ---- one step --------------------------------------------------------------------------------
    def begin_step(self) -> None:
        """The quorum of the next step (healing first when this group is behind).

        Raises:
            JobOver: the job's end is reached; the training loaders yield nothing more.
            ReplicaError: the run cannot go on exactly (said in its one line).
        """
        if self.manager is None:
            raise UsageError(
                "a training loader of a replica group was iterated before ctx.setup(model, "
                "optimizer): the groups agree on each step through the optimizer; call "
                "ctx.setup first"
            )
        if self.over:
            raise JobOver
        self._check_record()
        started = time.monotonic()
        self._healed = None
        self._quorum()
        # A life's first step waits (a bounded while) for every group that can still come:
        # one started a few seconds late would otherwise find the others' quorum formed and
        # heal at once; one whose launcher ended will not come.
        while self._first_quorum:
            to_come, waited_out = self._groups_to_come(started)
            if self.manager.num_participants() >= to_come or waited_out:
                break
            time.sleep(0.2)
            self._quorum()
        self._first_quorum = False
        self.participants = max(1, int(self.manager.num_participants()))
        self.participant_rank = int(self.manager.participating_rank() or 0)
        self._check_record()  # a group that left may have ended the job: not a step beyond it
        self._note_members(self._pg.members, time.monotonic() - started)
        self._agree()
        if not self.aligned and not self._aligned_members:
            self._wait_for_an_aligned_group()
        self.decided, self.in_step = None, True
        self.serial += 1

    def _wait_for_an_aligned_group(self) -> None:
        """No group of the quorum knows where the job ends: wait for an aligned one that is
        away but alive, until the job's end is announced or ``--timeout``; none: end the run."""
        started = time.monotonic()
        said = False
        while True:
            self._check_record()
            step = int(self.manager.current_step())
            away: list[int] = []
            if self.rank == 0:
                away = [
                    g
                    for g in range(self.settings.groups)
                    if g not in self.members
                    and (self.record.life(g) or (0, ""))[1] == "aligned"
                    and not self.record.exited(g)
                ]
            waited = time.monotonic() - started
            if self.world_size > 1:
                away, waited = dist.broadcast((away, waited))
            if not away:
                self._fail(
                    f"at step {step} every replica group left ({_names(self.members)}) restarted "
                    "after the job's start and healed into it: none knows where a loop that "
                    "counts its own epochs or steps (for epoch in range(E)) ends, so the run "
                    "stops before it could train past the end; restart the job (each group "
                    "resumes from its checkpoints)"
                )
            if waited > self.timeout_s:
                self._fail(
                    f"at step {step} replica group(s) {_names(away)}, the only one(s) that know "
                    f"where the job ends, stayed away {waited:.0f} s (--timeout "
                    f"{self.timeout_s:.0f} s) without ending it: the run stops before the groups "
                    "left could train past the end"
                )
            if not said:
                said = True
                self.say(
                    f"waits at step {step} for replica group(s) {_names(away)}: this group "
                    "healed into the job, and only a group that ran from its start knows where "
                    "the loop ends"
                )
            time.sleep(max(0.5, self.settings.heartbeat_s))
            self._quorum()
            self.participants = max(1, int(self.manager.num_participants()))
            self.participant_rank = int(self.manager.participating_rank() or 0)
            self._check_record()
            self._note_members(self._pg.members, time.monotonic() - started)
            self._agree()
            if self._aligned_members:
                return

    def _groups_to_come(self, started: float) -> tuple[int, bool]:
        """The groups of the job whose launcher has not ended, and whether the first step
        waited long enough for them — as rank 0 sees it (every rank of the group waits alike:
        each quorum is asked for by all of them)."""
        count, waited_out = self.settings.groups, False
        if self.rank == 0:
            with contextlib.suppress(Exception):  # the record gone: said at the next check
                count -= sum(self.record.exited(g) for g in range(self.settings.groups))
            waited_out = time.monotonic() - started >= min(self.timeout_s, STARTUP_WAIT_S)
        if self.world_size > 1:
            count, waited_out = dist.broadcast((count, waited_out))
        return max(1, count), waited_out

    def _quorum(self) -> None:
        try:
            self.manager.start_quorum()
        except Exception as e:
            self._lighthouse_gone(e)
            raise

    def _lighthouse_gone(self, error: BaseException) -> None:
        """A quorum failed: when the lighthouse does not answer, end the run in one line."""
        where = self.settings.lighthouse
        if _reachable(where):
            return
        step = int(self.manager.current_step()) if self.manager is not None else 0
        line = (
            f"the lighthouse at {where} stopped answering at step {step} "
            f"({type(error).__name__}); its node is gone or unreachable, and the replica groups "
            "cannot agree on a step without it: restart the job (each group resumes from its "
            "checkpoints)"
        )
        self._fail(line, record=False)

    def _check_record(self) -> None:
        """End this group's steps where the job failed (its line) or ended (``JobOver``)."""
        failed, end = self._record_facts()
        if failed is not None:
            raise ReplicaError(failed)
        if end is not None:
            step, by = end
            if not self.serial and not self.healed_once:  # this life took no part in the job
                self.say(
                    f"the job already ended at step {step} (replica group {by} finished it) "
                    "while this group was away: nothing left to train here; exiting"
                )
                raise SystemExit(0)
            self.over, self.end_step, self.ended_by = True, step, by
            self.in_step = False
            if by != self.settings.group:
                self.say(
                    f"the job ended at step {step}: replica group {by} finished its loop "
                    "there; this group's loaders stop there too"
                )
            raise JobOver

    def _note_members(self, members: tuple[int, ...], waited_s: float) -> None:
        before, self.members = self.members, members
        step = self.manager.current_step()
        if self._healed is not None and self._healed[1] == 0:
            self.say(f"starts from replica group {self._healed[0]}'s weights")
        elif self._healed is not None:
            source, step, names = self._healed
            self._count(healed=1)
            read = (
                "; the checkpoint this life resumed is replaced"
                if self.resumed_checkpoint
                else "; no checkpoint read"
            )
            self.say(
                f"healed from replica group {source} at step {step} in {waited_s:.2f} s "
                f"({', '.join(names)}{read})"
            )
        if before:
            gone = sorted(set(before) - set(members))
            came = sorted(set(members) - set(before))
            if gone:
                self._count(left=len(gone))
                self.say(
                    f"replica group(s) {_names(gone)} left the quorum at step {step} "
                    f"({len(before)} -> {len(members)} groups; the quorum waited "
                    f"{waited_s:.2f} s); their shares of each global batch run here"
                )
            if came:
                self._count(joined=len(came))
                self.say(f"replica group(s) {_names(came)} rejoined the quorum at step {step}")

    def _agree(self) -> None:
        """After a change of quorum, and every ``check_every`` steps: the groups compare their
        parameters' checksums and whether any of them is aligned (see the module doc)."""
        quorum = self._pg.quorum_id
        step = int(self.manager.current_step())
        if quorum == self._checked_quorum and step % self.settings.check_every:
            return
        self._checked_quorum = quorum
        groups = self.settings.groups
        facts = torch.zeros(2 * groups, dtype=torch.int64)
        facts[self.settings.group] = checksum(self._parameters()) or 1
        facts[groups + self.settings.group] = int(self.aligned)
        self.manager.allreduce(facts, reduce_op=_sum()).wait()
        if self.manager.errored() is not None:
            return  # the step fails anyway and runs again with the next quorum
        sums = [int(x) for x in facts[:groups]]
        present = [g for g in range(groups) if sums[g]]
        differ = len({sums[g] for g in present}) > 1
        aligned = sum(int(x) for x in facts[groups:])
        if self.world_size > 1:  # every rank of the group decides alike (each holds a shard)
            verdict = torch.tensor([int(differ), aligned], dtype=torch.int64)
            verdict = dist.all_reduce(verdict, op="max", device=self.device)
            differ, aligned = bool(verdict[0]), int(verdict[1])
        self._aligned_members = aligned
        if differ:
            by_sum: dict[int, list[int]] = {}
            for g in present:
                by_sum.setdefault(sums[g], []).append(g)
            parts = " against ".join(f"group(s) {_names(gs)}" for gs in by_sum.values())
            self._fail(
                f"the replica groups' parameters differ at step {step} ({parts}): they no "
                "longer train one model; the run stops here (a bug to report, with the "
                "script: nothing in multigpu should let them drift)"
            )

    def _parameters(self) -> list[torch.Tensor]:
        return list(self._parameters_fn()) if hasattr(self, "_parameters_fn") else []

    def watch_parameters(self, parameters: Callable[[], Sequence[torch.Tensor]]) -> None:
        """What ``_agree`` checksums: the models' parameters given to ``ctx.setup``."""
        self._parameters_fn = parameters

    def _fail(self, line: str, *, record: bool = True) -> None:
        """End the run with ``line`` (every group, and every group that comes back)."""
        if record and self.rank == 0:
            # The record gone (its node died): the line still ends this group.
            with contextlib.suppress(Exception):
                line = self.record.announce_failure(line)
        raise ReplicaError(line)

    def finish_step(self, parameters: Sequence[torch.Tensor]) -> bool:
        """Sum the gradients over the groups, / R; True when the step is committed everywhere."""
        grads = [local_tensor(p.grad) for p in parameters if p.grad is not None]
        for dtype in sorted({g.dtype for g in grads}, key=str):
            same = [g for g in grads if g.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in same])
            self.manager.allreduce(flat, reduce_op=_sum()).wait()
            flat.div_(self.settings.groups)
            offset = 0
            for g in same:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        committed = bool(self.manager.should_commit())
        self.decided = committed
        if committed:
            self._count(steps=1, short=int(self.participants < self.settings.groups))
        else:
            self._count(retried=1)
            self.say(
                f"step {self.manager.current_step()} failed in a group "
                f"({_short(self.manager.errored())}); not committed: its global batch runs "
                "again with the next quorum"
            )
        if self.on_decided is not None:
            self.on_decided(committed)
        return committed

    def leave_step(self) -> None:
        """The loop left the step (its batches are handed out and it was decided, or not)."""
        self.in_step = False

    def _count(self, **counts: int) -> None:
        """Count events of this life, here and (rank 0) in the job's record at once: a life
        killed keeps what it did there."""
        for name, value in counts.items():
            self.counts[name] += value
        if self.rank == 0:
            with contextlib.suppress(Exception):  # the record's node gone: said at the next step
                self.record.add_counts(self.settings.group, counts)

    # ---- telling ---------------------------------------------------------------------------------
    @property
    def writes(self) -> bool:
        """This group writes the user's outputs (its rank 0 is ``ctx.is_main``): group 0 while
        it is in the quorum (and before any), else the lowest group of the quorum — unless
        group 0 ended the job, which it did after writing them."""
        members, group = self.members, self.settings.group
        if not members or WRITER in members:
            return group == WRITER
        return self.ended_by != WRITER and group == min(members)

    def say(self, message: str) -> None:
        """One whole line on stderr, from the group's rank 0."""
        if self.rank == 0:
            first = message.splitlines()[0] if message else message
            sys.stderr.write(f"multigpu: replica group {self.settings.group}: {first}\n")
            sys.stderr.flush()


def _sum() -> Any:
    from torch.distributed import ReduceOp

    return ReduceOp.SUM


def _short(error: Any) -> str:
    """An error's first line, without gloo's source location (``[.../pair.cc:537] ``).

    Example:
        >>> _short("[/x/gloo/pair.cc:537] Read error [127.0.0.1]:52422: Connection reset by peer.")
        'Read error [127.0.0.1]:52422: Connection reset by peer.'
    """
    first = (str(error).splitlines() or [""])[0]
    return re.sub(r"^\[[^\]]*\.(?:cc|cpp|h|hpp):\d+\]\s*", "", first)[:200]


def _names(groups: Sequence[int]) -> str:
    return ", ".join(str(g) for g in groups)


def _recording_gloo() -> type:
    from torchft.process_group import ProcessGroupGloo

    class RecordingGloo(ProcessGroupGloo):
        """torchft's reconfigurable gloo group, remembering which groups each quorum holds."""

        members: tuple[int, ...] = ()
        quorum_id: Any = None

        def configure(self, *args: Any, **kwargs: Any) -> None:
            names = ("store_addr", "replica_id", "rank", "world_size", "quorum_id",
                     "group_rank", "group_world_size", "global_ranks")  # fmt: skip
            given = dict(zip(names, args, strict=False)) | kwargs
            width = int(given.get("group_world_size") or 1)
            ranks = given.get("global_ranks") or []
            self.members = tuple(sorted({int(r) // width for r in ranks}))
            self.quorum_id = given.get("quorum_id")
            super().configure(*args, **kwargs)

    return RecordingGloo


def _RecordingGloo(timeout: timedelta) -> Any:
    return _recording_gloo()(timeout=timeout)
