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

import logging
from collections.abc import Iterator
from typing import Any

from multigpu.common.log import warn_once
from multigpu.data import DistributedLoader
from multigpu.data.sampler import ShardSampler
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
    """The iteration of one training loader under replica groups (``loader.replica_steps``)."""

    def __init__(
        self,
        loader: DistributedLoader,
        coordinator: Coordinator,
        gate: StepGate,
        state: HealState,
        width: int,
    ) -> None:
        self.loader = loader
        self.coordinator = coordinator
        self.gate = gate
        self.state = state
        self.width = width
        """W: the ranks of a group."""
        self.local_rank = loader.sampler.rank % width
        self.empty_passes = 0
        if getattr(loader.dataloader, "num_workers", 0):
            warn_once(
                log,
                "multigpu: under --replicas a training loader reads its batches in the training "
                "process (num_workers is not used): a group's shares are known only once each "
                "step's quorum is",
            )

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

    def _advance(self) -> None:
        sampler = self.loader.sampler
        cursor = sampler.cursor + sampler.global_batch_size
        if cursor + sampler.global_batch_size > sampler.num_samples:
            sampler._epoch, sampler._cursor = sampler.epoch + 1, 0  # the epoch is done
        else:
            sampler._cursor = cursor

    def _decided(self, committed: bool) -> None:
        if committed:
            self._advance()

    def _shares(self) -> list[list[list[int]]]:
        """This participant's shares of the step: each its micro-batches' sample indices."""
        sampler, c = self.loader.sampler, self.coordinator
        order = sampler._order(sampler.epoch)
        shares = []
        for share in shares_of(c.participant_rank, c.participants, c.settings.groups):
            spans = sampler._spans(share * self.width + self.local_rank, sampler.cursor)
            shares.append([order[a:b].tolist() for a, b, _ in spans[: sampler.accumulation_steps]])
        return shares

    def __iter__(self) -> Iterator[Any]:
        loader, sampler, c = self.loader, self.loader.sampler, self.coordinator
        collate = loader.dataloader.collate_fn
        epoch = sampler.epoch
        if sampler.cursor + sampler.global_batch_size > sampler.num_samples:
            sampler._epoch, sampler._cursor = epoch + 1, 0  # resumed at the end of an epoch
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
            if sampler.epoch != epoch:  # healed into a later epoch: this pass runs that one
                epoch = sampler.epoch
            shares = self._shares()
            for t, micro_batches in enumerate(shares):
                last_share = t == len(shares) - 1
                if t:  # another group's share: its draws, and no scheduler step of the others
                    self.state.restore(schedulers=last_share)
                for i, indices in enumerate(micro_batches):
                    batch = collate([loader.dataset[k] for k in indices])
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
            if sampler.epoch != epoch:
                return
