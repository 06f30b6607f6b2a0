"""A training loader's steps under replica groups: each group's shares of each global batch.

The global batch of step ``s`` (positions ``[s*B, (s+1)*B)`` of the epoch's order, the order
of every world size) is cut into R shares, one per replica group of the job, each cut across the
group's W ranks as ``ShardSampler`` cuts a batch over ``R*W`` ranks (share ``j``, rank ``l``:
virtual rank ``j*W + l``) and into the loader's ``accumulation_steps`` micro-batches. When only
P of the R groups are in a step's quorum, the participant of quorum rank ``r`` runs every share
``j`` with ``j % P == r``, one after the other, as extra micro-batches: the union is still exactly
the global batch, and the gradients, summed over the groups and divided by R
(``Coordinator.finish_step``), are those of an uninterrupted run.

Each share runs as its own group would run it: it begins with the RNG streams of the step's start,
its last micro-batch ends the share (DDP syncs it; ``ctx.step`` or ``optimizer.step()`` asks
``multigpu.replicas.step_gate``, which sets the share's gradients aside until the step's last
share), and before the last share the LR schedulers go back to the step's start, so that a loop
that steps its scheduler on every batch steps it once a step (``multigpu.replicas.heal_state``).

The cursor moves when the step is committed (``Coordinator.on_decided``); a step that failed
(a group died inside it) leaves it where it was, so the same global batch runs again, from the
same snapshot. A step the loop ended without an optimizer step (no decision) moves on, as a plain
loader would. Once the job's end is reached (``JobOver``) the loader yields nothing more, in this
pass or any later one: a loop bounded by its own counter ends where the job did.

Batches are read in this process (``num_workers`` is not used): which shares a group reads is
known only once the step's quorum is, and a DataLoader's workers would have fetched ahead.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from typing import Any

from multigpu.common.log import warn_once
from multigpu.data import DistributedLoader
from multigpu.data.sampler import ShardSampler
from multigpu.data.stream_loader import StreamLoader
from multigpu.errors import ReplicaError
from multigpu.replicas.coordinator import Coordinator, JobOver
from multigpu.replicas.heal_state import HealState
from multigpu.replicas.step_gate import StepGate
from multigpu.runtime.device import move_to_device

log = logging.getLogger(__name__)

EMPTY_PASSES = 1_000_000
"""Passes after the job's end that a loop may ask for (each yields nothing at once) before it is
taken for one that never ends."""


def shares_of(participant_rank: int, participants: int, groups: int) -> list[int]:
    """The shares (0..groups-1) a participant runs, in order.

    Example:
        >>> shares_of(0, 1, 2), shares_of(1, 2, 2), shares_of(0, 2, 3)
        ([0, 1], [1], [0, 2])
    """
    return [j for j in range(groups) if j % participants == participant_rank]


def replica_sampler(sampler: ShardSampler, *, groups: int, group: int) -> ShardSampler:
    """``sampler`` (this rank's, over its group's W ranks) as one over the job's ``groups * W``
    ranks, at the same position: its batches are a share's."""
    wide = ShardSampler(
        sampler.num_samples,
        global_batch_size=sampler.global_batch_size,
        rank=group * sampler.world_size + sampler.rank,
        world_size=groups * sampler.world_size,
        shuffle=sampler.shuffle,
        seed=sampler.seed,
        drop_last=sampler.drop_last,
        accumulation_steps=sampler.accumulation_steps,
        source=sampler.source,
    )
    wide.load_state_dict(sampler.state_dict())
    wide._external_progress = True
    return wide


class ReplicaSteps:
    """The iteration of one training loader under replica groups (``loader.replica_steps``):
    the step loop shared by a map-style loader (``IndexSteps``) and a stream (``StreamSteps``),
    which say where the loader is, what a share's micro-batches hold and how the cursor moves."""

    def __init__(
        self,
        loader: Any,
        coordinator: Coordinator,
        gate: StepGate,
        state: HealState,
        width: int,
        local_rank: int,
    ) -> None:
        self.loader = loader
        self.coordinator = coordinator
        self.gate = gate
        self.state = state
        self.width = width
        """W: the ranks of a group."""
        self.local_rank = local_rank
        self.empty_passes = 0
        if getattr(loader.dataloader, "num_workers", 0):
            warn_once(
                log,
                "multigpu: under --replicas a training loader reads its batches in the training "
                "process (num_workers is not used): a group's shares are known only once each "
                "step's quorum is",
            )

    # What a kind of loader says -------------------------------------------------------------

    def _epoch(self) -> int:
        raise NotImplementedError

    def _epoch_done(self) -> bool:
        """Whether no whole global batch is left in the epoch at the cursor."""
        raise NotImplementedError

    def _next_epoch(self) -> None:
        raise NotImplementedError

    def _advance(self) -> None:
        """The cursor past the step's global batch (into the next epoch at its end)."""
        raise NotImplementedError

    def _micro_batches(self, share: int) -> list[list[Any]]:
        """Share ``share``'s micro-batches on this rank of the group, each a list of samples."""
        raise NotImplementedError

    def _collate(self, samples: list[Any]) -> Any:
        raise NotImplementedError

    # The step loop --------------------------------------------------------------------------

    def _after_the_end(self) -> None:
        """A pass after the job's end yields nothing: a loop that counts its passes ends; one
        that asks again and again (``itertools.cycle(loader)`` bounded by its own counter)
        would spin for ever — ended in one line instead."""
        self.empty_passes += 1
        if self.empty_passes > EMPTY_PASSES:
            raise ReplicaError(
                f"the loop asked for {EMPTY_PASSES:,} more passes of a training loader after the "
                f"job ended at step {self.coordinator.end_step}: it is bounded by a counter of "
                "its own, which a heal put behind; end it when a pass of the loader yields "
                "nothing, or bound it by the loader (loader.epoch) or a Checkpointer (ckpt.steps)"
            )

    def _decided(self, committed: bool) -> None:
        if committed:
            self._advance()

    def __iter__(self) -> Iterator[Any]:
        loader, c = self.loader, self.coordinator
        epoch = self._epoch()
        if self._epoch_done():
            self._next_epoch()  # resumed at the end of an epoch
            return
        again = False
        while True:
            try:
                c.begin_step()  # may heal: the position is the live groups' from here on
            except JobOver:
                self._after_the_end()
                return  # the job ended at this step: nothing more, in this pass or any other
            c.on_decided = self._decided
            self.gate.new_step()
            # The step's start, for each share (its RNG draws) and the last one (schedulers);
            # a step run again after a failure starts from the same snapshot.
            self.state.begin_step(again=again)
            if self._epoch() != epoch:  # healed into a later epoch: this pass runs that one
                epoch = self._epoch()
            shares = [
                self._micro_batches(share)
                for share in shares_of(c.participant_rank, c.participants, c.settings.groups)
            ]
            for t, micro_batches in enumerate(shares):
                last_share = t == len(shares) - 1
                if t:  # another group's share: its draws, and no scheduler step of the others
                    self.state.restore(schedulers=last_share)
                for i, samples in enumerate(micro_batches):
                    batch = self._collate(samples)
                    if loader.device is not None:
                        batch = move_to_device(batch, loader.device)
                    ends_share = i == len(micro_batches) - 1
                    self.gate.new_batch(ends_share=ends_share, ends_step=ends_share and last_share)
                    loader.ends_step = ends_share  # DDP syncs each share; ctx.step asks the gate
                    if loader.on_batch is not None:
                        loader.on_batch(loader)
                    yield batch
            again = c.decided is False
            if c.decided is None:  # the loop did not step: move on as a plain loader does
                self._advance()
            c.on_decided = None
            c.leave_step()
            if self._epoch() != epoch:
                return


class IndexSteps(ReplicaSteps):
    """A map-style loader's steps: its sampler (``replica_sampler``) cuts each share."""

    def __init__(
        self,
        loader: DistributedLoader,
        coordinator: Coordinator,
        gate: StepGate,
        state: HealState,
        width: int,
    ) -> None:
        super().__init__(loader, coordinator, gate, state, width, loader.sampler.rank % width)

    def _epoch(self) -> int:
        return int(self.loader.sampler.epoch)

    def _epoch_done(self) -> bool:
        sampler = self.loader.sampler
        return bool(sampler.cursor + sampler.global_batch_size > sampler.num_samples)

    def _next_epoch(self) -> None:
        sampler = self.loader.sampler
        sampler._epoch, sampler._cursor = sampler.epoch + 1, 0

    def _advance(self) -> None:
        sampler = self.loader.sampler
        sampler._cursor = sampler.cursor + sampler.global_batch_size
        if self._epoch_done():
            self._next_epoch()

    def _micro_batches(self, share: int) -> list[list[Any]]:
        sampler, dataset = self.loader.sampler, self.loader.dataset
        order = sampler._order(sampler.epoch)
        spans = sampler._spans(share * self.width + self.local_rank, sampler.cursor)
        return [
            [dataset[k] for k in order[a:b].tolist()]
            for a, b, _ in spans[: sampler.accumulation_steps]
        ]

    def _collate(self, samples: list[Any]) -> Any:
        return self.loader.dataloader.collate_fn(samples)


class StreamSteps(ReplicaSteps):
    """A stream's steps (``StreamLoader``): every group reads the stream whole, as every rank
    does, and holds the step's global batch, so that a step run again after a failure, or a
    survivor running an absent group's share, takes the same samples. Share ``j`` on rank ``l``
    of the group is the global batch's part of virtual rank ``j*W + l`` of ``R*W``, cut into the
    loader's micro-batches, as ``replica_sampler`` cuts a map-style one. A heal sets the loader's
    epoch and cursor; the stream is then read again from the start of that epoch's order."""

    def __init__(
        self,
        loader: StreamLoader,
        coordinator: Coordinator,
        gate: StepGate,
        state: HealState,
        width: int,
        groups: int,
    ) -> None:
        super().__init__(loader, coordinator, gate, state, width, loader.rank)
        self.part = loader.global_batch_size // (groups * width)
        """Samples of a share on one rank."""
        self._reading: tuple[int, int, Iterator[list[Any]]] | None = None
        """(epoch, its next step, its global batches from there) of the pass being read."""
        self._held: tuple[tuple[int, int], list[Any] | None] | None = None
        """((epoch, cursor), that step's global batch, None when the epoch has no whole one)."""

    def _global_batch(self) -> list[Any] | None:
        loader = self.loader
        at = (loader.epoch, loader.cursor)
        if self._held is not None and self._held[0] == at:
            return self._held[1]
        epoch, step = loader.epoch, loader.cursor // loader.global_batch_size
        if self._reading is None or self._reading[0] != epoch or self._reading[1] > step:
            self._reading = (epoch, step, loader.global_batches(epoch, step))
        _, next_step, batches = self._reading
        batch = next(itertools.islice(batches, step - next_step, None), None)
        self._reading = (epoch, step + 1, batches)
        self._held = (at, batch)
        return batch

    def _epoch(self) -> int:
        return int(self.loader.epoch)

    def _epoch_done(self) -> bool:
        return self._global_batch() is None

    def _next_epoch(self) -> None:
        self.loader._epoch, self.loader._cursor = self.loader.epoch + 1, 0

    def _advance(self) -> None:
        self.loader._cursor += self.loader.global_batch_size
        if self._epoch_done():  # read ahead: a stream says its end only when it is reached
            self._next_epoch()

    def _micro_batches(self, share: int) -> list[list[Any]]:
        batch = self._global_batch()
        assert batch is not None, "a step began where the epoch had no whole global batch"
        lo = (share * self.width + self.local_rank) * self.part
        micro = self.part // self.loader.accumulation_steps
        return [batch[a : a + micro] for a in range(lo, lo + self.part, micro)]

    def _collate(self, samples: list[Any]) -> Any:
        return self.loader._batches.collate(samples)
