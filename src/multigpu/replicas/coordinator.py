"""One replica group's side of per-step fault tolerance, on torchft's ``Manager``.

Every optimizer step starts with a quorum (``begin_step``): the lighthouse names the groups
that take part. A group that comes back (restarted by its own torchrun agent) is behind: in that
same quorum it heals from a live peer — weights, optimizer state, the loaders' data position and
the step count travel over torchft's process group (``PGTransport``), no checkpoint is read —
and then takes part in the step. The step ends with ``finish_step``: the gradients are summed
over the groups and divided by R (the groups of the job, not the ones present: the survivors
computed the absent groups' shares too, see ``multigpu.replicas.shares``), and the step is
committed only when no group failed inside it; otherwise the same global batch is run again
with the new quorum. What happens is said in one line each (a group left, a group rejoined and
what it healed from, in how long) and counted for the summary at the end.
"""

from __future__ import annotations

import logging
import sys
import time
import warnings
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

import torch

from multigpu.errors import UsageError
from multigpu.replicas.settings import ReplicaSettings

REPLICA_ID = "multigpu_group_{group}"
"""torchft replica ids: the trailing digits are the group index (torchft reads them so too)."""


STARTUP_WAIT_S = 60.0
"""How long the first step waits for every group to join its quorum (bounded by --timeout)."""


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds (an FSDP gradient is a DTensor: its local shard)."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if callable(to_local) else tensor


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
    ) -> None:
        self.settings = settings
        self.rank = rank
        """This process's rank inside its group (torchft's ``group_rank``)."""
        self.world_size = world_size
        self.device = device
        self.timeout_s = timeout_s
        self.manager: Any = None
        self._state_fns: list[tuple[Callable[[], Any], Callable[[Any], None]]] = []
        self.members: tuple[int, ...] = ()
        """The groups of the current quorum, by index."""
        self.participants = 1
        self.participant_rank = 0
        self.in_step = False
        """A step of a training loader has begun (its quorum is formed)."""
        self.micro_index = 0
        """The micro-batch of the running step handed out last (0: its first)."""
        self.ends_step = False
        """The micro-batch handed out last is the running step's last."""
        self.step_waits = False
        """An optimizer's step() came before the running step's last micro-batch."""
        self.serial = 0
        """Counts the steps begun in this process (a step run again is a new one)."""
        self.decided: bool | None = None
        """The running step's outcome: committed (True), retried (False), not yet (None)."""
        self.on_decided: Callable[[bool], None] | None = None
        """Called with the outcome when a step is decided (the loader moves its cursor)."""
        self._healed: tuple[int, int] | None = None
        self.counts = {"steps": 0, "short": 0, "retried": 0, "left": 0, "joined": 0, "healed": 0}

    # ---- lifetime ------------------------------------------------------------------------------
    def add_state(self, save: Callable[[], Any], load: Callable[[Any], None]) -> None:
        """What a healing group receives from a live one (a model's and optimizers' state, a
        loader's position), in the order added: every group adds the same."""
        self._state_fns.append((save, load))

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
        self.manager.register_state_dict_fn("multigpu", self._load, self._save)
        self._pg = pg

    def close(self) -> None:
        """Say the summary (rank 0 of the group) and stop the manager's server."""
        if self.manager is None:
            return
        manager, self.manager = self.manager, None
        self.say(self.summary())
        manager.shutdown(wait=False)

    # ---- heal ------------------------------------------------------------------------------------
    def _save(self) -> dict[str, Any]:
        return {"group": self.settings.group, "parts": [save() for save, _ in self._state_fns]}

    def _load(self, state: dict[str, Any]) -> None:
        for (_, load), part in zip(self._state_fns, state["parts"], strict=True):
            load(part)
        self._healed = (int(state["group"]), int(self.manager.current_step()))

    # ---- one step --------------------------------------------------------------------------------
    def begin_step(self) -> None:
        """The quorum of the next step (healing first when this group is behind)."""
        if self.manager is None:
            raise UsageError(
                "a training loader of a replica group was iterated before ctx.setup(model, "
                "optimizer): the groups agree on each step through the optimizer; call "
                "ctx.setup first"
            )
        started = time.monotonic()
        self._healed = None
        self.manager.start_quorum()
        # The job's very first step waits (a bounded while) for every group: one started a few
        # seconds late would otherwise find the others' quorum formed and heal at once.
        first = not self.members and self.manager.current_step() == 0
        while (
            first
            and self.manager.num_participants() < self.settings.groups
            and time.monotonic() - started < min(self.timeout_s, STARTUP_WAIT_S)
        ):
            time.sleep(0.2)
            self.manager.start_quorum()
        self.participants = max(1, int(self.manager.num_participants()))
        self.participant_rank = int(self.manager.participating_rank() or 0)
        self._note_members(self._pg.members, time.monotonic() - started)
        self.micro_index, self.decided, self.in_step, self.step_waits = 0, None, True, False
        self.serial += 1

    def _note_members(self, members: tuple[int, ...], waited_s: float) -> None:
        before, self.members = self.members, members
        step = self.manager.current_step()
        if self._healed is not None and self._healed[1] == 0:
            self.say(f"starts from replica group {self._healed[0]}'s weights")
        elif self._healed is not None:
            source, step = self._healed
            self.counts["healed"] += 1
            self.say(
                f"healed from replica group {source} at step {step} in {waited_s:.2f} s "
                "(weights, optimizer state, data position; no checkpoint read)"
            )
        if before:
            gone = sorted(set(before) - set(members))
            came = sorted(set(members) - set(before))
            if gone:
                self.counts["left"] += len(gone)
                self.say(
                    f"replica group(s) {_names(gone)} left the quorum at step {step} "
                    f"({len(before)} -> {len(members)} groups; the quorum waited "
                    f"{waited_s:.2f} s); their shares of each global batch run here"
                )
            if came:
                self.counts["joined"] += len(came)
                self.say(f"replica group(s) {_names(came)} rejoined the quorum at step {step}")

    def finish_step(self, parameters: Sequence[torch.Tensor]) -> bool:
        """Sum the gradients over the groups, / R; True when the step is committed everywhere."""
        from torch.distributed import ReduceOp

        grads = [_local(p.grad) for p in parameters if p.grad is not None]
        for dtype in sorted({g.dtype for g in grads}, key=str):
            same = [g for g in grads if g.dtype == dtype]
            flat = torch.cat([g.reshape(-1) for g in same])
            self.manager.allreduce(flat, reduce_op=ReduceOp.SUM).wait()
            flat.div_(self.settings.groups)
            offset = 0
            for g in same:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        committed = bool(self.manager.should_commit())
        self.decided = committed
        if committed:
            self.counts["steps"] += 1
            self.counts["short"] += self.participants < self.settings.groups
        else:
            self.counts["retried"] += 1
            self.say(
                f"step {self.manager.current_step()} failed in a group ({self.manager.errored()}"
                "); not committed: its global batch runs again with the next quorum"
            )
        if self.on_decided is not None:
            self.on_decided(committed)
        return committed

    # ---- telling ---------------------------------------------------------------------------------
    def say(self, message: str) -> None:
        """One whole line on stderr, from the group's rank 0."""
        if self.rank == 0:
            first = message.splitlines()[0] if message else message
            sys.stderr.write(f"multigpu: replica group {self.settings.group}: {first}\n")
            sys.stderr.flush()

    def summary(self) -> str:
        """The end-of-run line: steps, steps run short-handed, failures, heals."""
        c = self.counts
        return (
            f"{c['steps']} steps committed here, {c['short']} run short-handed (fewer than "
            f"{self.settings.groups} groups), {c['retried']} retried after a failure; groups "
            f"left {c['left']} time(s), rejoined {c['joined']}; this group healed {c['healed']}"
        )


def _names(groups: Sequence[int]) -> str:
    return ", ".join(str(g) for g in groups)


def _recording_gloo() -> type:
    from torchft.process_group import ProcessGroupGloo

    class RecordingGloo(ProcessGroupGloo):
        """torchft's reconfigurable gloo group, remembering which groups each quorum holds."""

        members: tuple[int, ...] = ()

        def configure(self, *args: Any, **kwargs: Any) -> None:
            names = ("store_addr", "replica_id", "rank", "world_size", "quorum_id",
                     "group_rank", "group_world_size", "global_ranks")  # fmt: skip
            given = dict(zip(names, args, strict=False)) | kwargs
            width = int(given.get("group_world_size") or 1)
            ranks = given.get("global_ranks") or []
            self.members = tuple(sorted({int(r) // width for r in ranks}))
            super().configure(*args, **kwargs)

    return RecordingGloo


def _RecordingGloo(timeout: timedelta) -> Any:
    return _recording_gloo()(timeout=timeout)
