"""Shard lanes: a stream with shards read so that each rank reads only its share, in a global
order that depends on neither the world size nor the loader's workers.

A stream has shards when it says how many (``n_shards``) and gives each one as a stream of its
own (``shard(num_shards=n, index=i)``): a Hugging Face ``datasets.IterableDataset`` over several
files (one shard per file) does, and so can any ``IterableDataset`` written that way.

Counts: planning an epoch needs each shard's record count. They are counted once per loader,
cooperatively: in a distributed run rank ``r`` of ``W`` reads the shards ``s`` with ``s % W == r``
and the ranks exchange their counts (``all_gather_object``), so each rank reads about 1/W of the
data once for it. Every rank must therefore start the loader's first pass (as every rank iterates
its training loader).

Plan of an epoch (``plan``): the shards, in an order drawn from ``(seed, epoch)`` (with
``shuffle=False`` their own order), are cut into ``L`` lanes: runs of consecutive shards with about
the same number of records. The ``B`` positions of a global batch are cut into ``L`` blocks (block
``l``: positions ``[l*B//L, (l+1)*B//L)``, ``b_l`` of them), and step ``s`` puts lane ``l``'s
samples ``[s*b_l, (s+1)*b_l)`` in block ``l``. An epoch has as many steps as its shortest lane
allows (``min(len_l // b_l)``); the lanes' extra records are left out of that epoch, a different
part each epoch as the shard order changes. Within a lane the samples are shuffled in windows of
``window`` (the loader's ``buffer_size``): window ``w`` is ordered by a ``random.Random`` seeded by
``derive_seed(seed, epoch, lane, w)``, so a resumed lane starts at its window without replaying
the ones before.

Reading: rank ``r`` of ``N`` keeps positions ``[r*B/N, (r+1)*B/N)`` of each batch. When ``N``
divides ``L`` those are the blocks of ``L/N`` whole lanes, which only that rank reads; otherwise a
lane at the boundary of two ranks' positions is read by both (each keeps its positions). A resumed
lane skips whole shards by their counts, without reading them, and reads its current shard from
the start up to its window (a stream cannot seek).

An epoch whose plan would leave out more than a plain ``drop_last`` would (``B - 1`` records) plus
2 % of the epoch — shards too uneven to balance into ``L`` lanes — is not read by lanes: ``plan``
returns None and the epoch is read whole, as a stream without shards is. That choice depends on
the counts, ``B``, ``L``, the seed and the epoch only, so it is the same at every world size.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import IterableDataset, get_worker_info

from multigpu.data import hf_stream
from multigpu.data.sampler import derive_seed
from multigpu.data.stream_errors import named
from multigpu.torch_compat.dataloader import read_outside_worker

STEPS_PER_CHUNK = 8
"""Steps a worker hands over at once: fewer, larger messages from the workers."""
MAX_LANES = 64
"""At most this many lanes by default: each is a shard being read at once, on some rank."""
LEFT_OUT = 0.02
"""An epoch leaving out more than this share of its records (beyond ``B - 1``) is read whole."""


def shard_count(stream: Any) -> int:
    """The shards ``stream`` gives one by one (``n_shards`` and ``shard()``), or 0.

    Example:
        >>> shard_count(range(3))
        0
    """
    n = getattr(stream, "n_shards", None)
    splits = callable(getattr(stream, "shard", None))
    if isinstance(n, bool) or not isinstance(n, int) or not splits:
        return 0
    return n if n >= 2 else 0


def default_lanes(n_shards: int, global_batch_size: int) -> int:
    """The lanes of a stream with ``n_shards`` shards (1: read whole).

    Example:
        >>> default_lanes(8, 32), default_lanes(100, 32), default_lanes(0, 32)
        (8, 32, 1)
    """
    return max(1, min(n_shards, global_batch_size, MAX_LANES))


def _part(stream: Any, n_shards: int, index: int, epoch: int) -> Iterator[Any]:
    part = stream.shard(num_shards=n_shards, index=index)
    set_epoch = getattr(part, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
    where = f"shard {index} of {n_shards} of the stream {hf_stream.describe(stream)}"
    return named(read_outside_worker(part), where)


def count_shards(stream: Any, n_shards: int) -> list[int]:
    """Each shard's record count, counted cooperatively by the ranks (see the module doc)."""
    dist = torch.distributed
    together = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    rank, world = (dist.get_rank(), dist.get_world_size()) if together else (0, 1)
    mine = {s: sum(1 for _ in _part(stream, n_shards, s, 0)) for s in range(rank, n_shards, world)}
    if not together:
        return [mine[s] for s in range(n_shards)]
    everyone: list[dict[int, int] | None] = [None] * world
    dist.all_gather_object(everyone, mine)
    counts: dict[int, int] = {}
    for part in everyone:
        counts.update(part or {})
    return [counts[s] for s in range(n_shards)]


@dataclass(frozen=True)
class LanePlan:
    """One epoch's lanes: each a run of ``(shard, records)``, the block each fills in a batch
    (``(start, size)``), and the epoch's steps and left-out records."""

    lanes: tuple[tuple[tuple[int, int], ...], ...]
    blocks: tuple[tuple[int, int], ...]
    steps: int
    left_out: int

    def lanes_of(self, lo: int, hi: int) -> list[int]:
        """The lanes whose blocks meet positions ``[lo, hi)`` of a batch."""
        return [lane for lane, (a, n) in enumerate(self.blocks) if a < hi and lo < a + n]


def plan(
    counts: Sequence[int],
    *,
    lanes: int,
    global_batch_size: int,
    seed: int,
    epoch: int,
    shuffle: bool,
) -> LanePlan | None:
    """The epoch's plan (see the module doc), or None when it would leave out too much.

    Example:
        >>> p = plan([10, 10, 10, 10], lanes=2, global_batch_size=4, seed=0, epoch=0, shuffle=False)
        >>> p.lanes, p.blocks, p.steps, p.left_out
        ((((0, 10), (1, 10)), ((2, 10), (3, 10))), ((0, 2), (2, 2)), 10, 0)
    """
    order = list(range(len(counts)))
    if shuffle:
        random.Random(derive_seed(seed, epoch, len(counts))).shuffle(order)
    total = sum(counts)
    runs: list[list[tuple[int, int]]] = []
    done = 0
    for i, shard in enumerate(order):
        # a new lane where this shard starts closer to the lane's ideal start than it ends
        target = len(runs) * total / lanes
        shards_left, lanes_left = len(order) - i, lanes - len(runs)
        if lanes_left and (
            not runs or shards_left == lanes_left or done + counts[shard] / 2 >= target
        ):
            runs.append([])
        runs[-1].append((shard, counts[shard]))
        done += counts[shard]
    big = global_batch_size
    starts = [lane * big // lanes for lane in range(lanes + 1)]
    blocks = tuple((a, b - a) for a, b in itertools.pairwise(starts))
    steps = min(sum(c for _, c in run) // size for run, (_, size) in zip(runs, blocks, strict=True))
    left_out = total - steps * big
    if steps == 0 or left_out > big - 1 + LEFT_OUT * total:
        return None
    return LanePlan(tuple(tuple(run) for run in runs), blocks, steps, left_out)


def lane_samples(
    stream: Any,
    n_shards: int,
    lane: Sequence[tuple[int, int]],
    *,
    key: tuple[int, int, int],
    window: int,
    shuffle: bool,
    start: int,
    stop: int,
) -> Iterator[Any]:
    """Lane samples ``[start, stop)`` in the lane's order; ``key`` is ``(seed, epoch, lane)``."""
    if start >= stop:
        return
    first = start // window if shuffle else start
    skip = first * window if shuffle else start
    records = _records(stream, n_shards, lane, skip=skip, epoch=key[1])
    if not shuffle:
        yield from itertools.islice(records, stop - start)
        return
    w = first
    while w * window < stop:
        chunk = list(itertools.islice(records, window))
        if not chunk:
            return
        random.Random(derive_seed(*key, w)).shuffle(chunk)
        lo = max(start - w * window, 0)
        hi = min(stop - w * window, len(chunk))
        yield from chunk[lo:hi]
        w += 1


def _records(
    stream: Any, n_shards: int, lane: Sequence[tuple[int, int]], *, skip: int, epoch: int
) -> Iterator[Any]:
    """The lane's records in shard order from record ``skip`` on (whole shards skipped unread)."""
    for shard, count in lane:
        if skip >= count:
            skip -= count
            continue
        items = _part(stream, n_shards, shard, epoch)
        if skip:
            items = itertools.islice(items, skip, None)
            skip = 0
        yield from items


@dataclass(frozen=True)
class LanePass:
    """What one pass by lanes needs (set in the main process before workers start)."""

    plan: LanePlan
    epoch: int
    start_step: int
    lo: int
    hi: int
    """The batch positions ``[lo, hi)`` wanted (this rank's, or all for a whole batch)."""


class LaneChunks(IterableDataset[Any]):
    """The wanted positions of the lanes this worker reads, as ``(position, sample)`` pairs, per
    step, ``STEPS_PER_CHUNK`` steps at a time: worker ``w`` of ``n`` reads the pass's lanes
    ``[w::n]``, and every worker yields one chunk of each run of steps (its lists maybe empty),
    so a DataLoader's turns give each run's chunks in a row."""

    def __init__(
        self, stream: Any, n_shards: int, *, seed: int, shuffle: bool, window: int
    ) -> None:
        self.stream, self.n_shards = stream, n_shards
        self.seed, self.shuffle, self.window = seed, shuffle, window
        self.pass_: LanePass | None = None

    def __iter__(self) -> Iterator[list[list[tuple[int, Any]]]]:
        p = self.pass_
        assert p is not None, "LaneChunks iterated before a pass was set"
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            hf_stream.prepare_worker(self.stream)
        mine = p.plan.lanes_of(p.lo, p.hi)[worker::workers]
        readers = []
        for lane in mine:
            a, n = p.plan.blocks[lane]
            lo, hi = max(a, p.lo), min(a + n, p.hi)  # the wanted part of the lane's block
            samples = lane_samples(
                self.stream, self.n_shards, p.plan.lanes[lane],
                key=(self.seed, p.epoch, lane), window=self.window, shuffle=self.shuffle,
                start=p.start_step * n, stop=p.plan.steps * n,
            )  # fmt: skip
            readers.append((a, n, lo, hi, samples))
        run: list[list[tuple[int, Any]]] = []
        for step in range(p.start_step, p.plan.steps):
            pairs: list[tuple[int, Any]] = []
            for a, n, lo, hi, samples in readers:
                block = list(itertools.islice(samples, n))
                pairs += [(a + i, block[i]) for i in range(lo - a, hi - a)]
            run.append(pairs)
            if len(run) == STEPS_PER_CHUNK or step + 1 == p.plan.steps:
                yield run
                run = []
