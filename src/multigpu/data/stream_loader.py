"""``StreamLoader``: a stream that can only be read in order, dealt as ``ShardSampler`` deals.

For a ``torch.utils.data.IterableDataset`` or a Hugging Face ``datasets.IterableDataset``
(``load_dataset(..., streaming=True)``), which ``ctx.loader`` / ``make_loader`` hand here. Such a
stream has no index: splitting a generator by rank would change the global order with the world
size. So **every rank reads the stream whole** (said once, in one line, by rank 0 when the loader
is made) and keeps its own part of each global batch. A stream with shards (``n_shards`` and
``shard()``: a Hugging Face stream over several files) is read by lanes instead for a training
loader (``drop_last``), each rank reading only its lanes' shards
(``multigpu.data.stream_lanes``); this module doc describes the whole reading, which such a
stream falls back to for an epoch whose shards are too uneven, and with ``lanes=1``.

Global order of an epoch: the stream's order (a stream with ``set_epoch``, as HF's, is told the
epoch first) passed through a shuffle buffer of ``buffer_size`` samples drawn from a
``random.Random`` seeded by ``derive_seed(seed, epoch)`` (``shuffle=False``: the stream's order).
It depends on ``(seed, epoch)`` and the stream only, so it is the same on every rank and in every
DataLoader worker. Global step ``s`` takes positions ``[s*B, (s+1)*B)`` of that order and rank
``r`` keeps ``[s*B + r*b, s*B + (r+1)*b)`` cut into its micro-batches, as in
``multigpu.data.sampler``; the other samples are passed over without being collated.

End of an epoch: the stream ends. The last partial global batch is dropped with ``drop_last``
(the default when shuffling); else its ``R`` samples are dealt as ``ShardSampler`` deals a
remainder (contiguous parts whose sizes differ by at most one). Under FSDP (``even_batches``)
the ranks a batch short get an empty batch, as ``DistributedLoader`` gives.

Workers (``num_workers=N``): each worker reads the stream whole too and produces only this
rank's batches ``i`` (counted from the start of the pass) with ``i % N`` equal to its id, collated
there by ``collate_fn``; the DataLoader takes one batch from each worker in turn, so the batches
arrive in order and equal those of ``num_workers=0``. ``get_worker_info()`` is None while the
stream advances (``multigpu.torch_compat.read_outside_worker``): a stream that would split
itself among workers (HF's does) is read whole. Workers start again each pass
(``persistent_workers=True`` is refused: a pass's epoch and start reach the workers as they
start). Workers' RNGs are seeded as ``DistributedLoader`` seeds them.

Progress and resume: ``state_dict()`` is ``(seed, epoch, cursor, global batch, buffer size,
shuffle, drop_last)`` where ``cursor`` counts the samples of the epoch consumed in whole global
steps, as handed out to the loop; it does not depend on the world size or the workers. A resumed
pass reads the stream from its start and passes over the first ``cursor`` samples (a generator
cannot seek). The last batch of the epoch moves the epoch on (the next step's batch is read
before a step's last batch is handed out, to know it is the last).

Under replica groups (``multigpu run --replicas``) a training loader's steps are
``multigpu.replicas.shares.StreamSteps`` (``replica_steps``): every group reads the stream whole
in its training process and holds each step's global batch, of which it runs its shares.
"""

from __future__ import annotations

import itertools
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset, default_collate, get_worker_info

from multigpu.common.log import warn_once
from multigpu.data import hf_stream, stream_lanes, webdataset_stream
from multigpu.data.sampler import BatchLayout, LaidOut, Position, _as_int, derive_seed
from multigpu.data.stream_errors import named
from multigpu.errors import DataError, UsageError
from multigpu.runtime.device import map_tensors, move_to_device
from multigpu.torch_compat.dataloader import read_outside_worker

log = logging.getLogger(__name__)

DEFAULT_BUFFER_SIZE = 1000
STATE_KEYS = (
    "seed",
    "epoch",
    "cursor",
    "global_batch_size",
    "buffer_size",
    "shuffle",
    "drop_last",
)
# DataLoader options the StreamLoader decides itself.
OWNED_OPTIONS = ("sampler", "batch_sampler", "batch_size", "shuffle", "drop_last", "generator")


def is_stream(dataset: Any) -> bool:
    """Whether ``dataset`` can only be read in order (torch's or HF's ``IterableDataset``)."""
    return isinstance(dataset, IterableDataset) or hf_stream.is_hf_stream(dataset)


def _check_options(stream: Any, options: Mapping[str, Any]) -> None:
    owned = [k for k in OWNED_OPTIONS if k in options]
    if owned:
        raise UsageError(
            f"DataLoader option(s) {owned} were given, but multigpu owns the batching and the "
            "order of a stream; pass the GLOBAL batch_size, shuffle, drop_last, seed and "
            "buffer_size to make_loader()/ctx.loader() and leave out " + ", ".join(owned)
        )
    if options.get("in_order") is False:
        raise UsageError(
            "in_order=False was given, but a stream's workers take turns by batch; leave "
            "in_order out (the default True)"
        )
    if options.get("persistent_workers"):
        raise UsageError(
            f"persistent_workers=True was given for the stream {hf_stream.describe(stream)}, "
            "whose workers read it from its start at each pass (the epoch and where to start "
            "reach them as they start); leave persistent_workers out"
        )
    webdataset_stream.check(stream)
    if hf_stream.is_hf_stream(stream) and hf_stream.split_by_node(stream):
        raise UsageError(
            "the Hugging Face stream was split by split_dataset_by_node, so each rank would read "
            "another stream; give ctx.loader the whole stream (it deals each rank its part of "
            "the same global batches)"
        )
    if hf_stream.is_hf_stream(stream) and hf_stream.unseeded_shuffle(stream):
        raise UsageError(
            "the Hugging Face stream shuffles with a generator made without a seed, so each "
            "rank would read it in another order; give its shuffle a seed "
            "(stream.shuffle(seed=0, ...)) or leave its shuffle out and let ctx.loader shuffle "
            "it (shuffle=True, buffer_size=...)"
        )


@dataclass(frozen=True)
class _Pass:
    """What one pass over the stream needs (set in the main process before workers start)."""

    epoch: int
    cursor: int
    template: bool
    """Whether the pass's end also carries an empty batch shaped like a sample (FSDP)."""


@dataclass(frozen=True)
class _End:
    """The pass's last record: every rank's batch count in it, and an empty batch (or None)."""

    rank_batches: tuple[int, ...]
    empty: Any


def _as_is(record: Any) -> Any:
    return record


def _shuffled(items: Iterator[Any], size: int, rng: random.Random) -> Iterator[Any]:
    """``items`` through a shuffle buffer of ``size``: each new item takes the place of a random
    one, which comes out; the rest come out shuffled when ``items`` ends."""
    buffer: list[Any] = []
    for item in items:
        if len(buffer) < size:
            buffer.append(item)
            continue
        j = rng.randrange(size)
        out, buffer[j] = buffer[j], item
        yield out
    rng.shuffle(buffer)
    yield from buffer


class _RankBatches(IterableDataset[Any]):
    """This rank's batches of one pass, as ``(mark, batch)`` records then one ``_End``."""

    def __init__(self, loader: StreamLoader, collate: Callable[[list[Any]], Any]) -> None:
        self.stream = loader.stream
        self.collate = collate
        self.rank, self.world_size = loader.rank, loader.world_size
        self.global_batch_size, self.micro = loader.global_batch_size, loader.batch_size
        self.accumulation_steps = loader.accumulation_steps
        self.shuffle, self.seed, self.buffer_size = loader.shuffle, loader.seed, loader.buffer_size
        self.drop_last = loader.drop_last
        self.pass_ = _Pass(0, 0, False)

    def order(self, epoch: int) -> Iterator[Any]:
        """The stream's samples in the epoch's global order."""
        set_epoch = getattr(self.stream, "set_epoch", None)
        if callable(set_epoch):
            set_epoch(epoch)
        where = f"the stream {hf_stream.describe(self.stream)} (epoch {epoch})"
        items = named(read_outside_worker(self.stream), where)
        if not self.shuffle:
            return iter(items)
        rng = random.Random(derive_seed(self.seed, epoch))
        return _shuffled(iter(items), self.buffer_size, rng)

    def _spans(self, p: _Pass) -> Iterator[tuple[list[Any], int | None] | _End]:
        """This rank's micro-batches' samples with the cursor after their step (None mid-step),
        then the pass's ``_End``; the first item read is kept for the empty batch."""
        big, micro, k = self.global_batch_size, self.micro, self.accumulation_steps
        rank, world = self.rank, self.world_size
        per_rank = micro * k
        step: list[Any] = []
        first: list[Any] = []
        position = -1
        for position, item in enumerate(self.order(p.epoch)):
            if not first:
                first.append(item)
            if position < p.cursor:
                continue
            step.append(item)
            if len(step) == big:
                base = rank * per_rank
                for m in range(k):
                    lo = base + m * micro
                    yield step[lo : lo + micro], (position + 1 if m == k - 1 else None)
                step = []
        full = max(0, (position + 1 - p.cursor) // big)
        rest = len(step) if not self.drop_last else 0
        share, extra = divmod(rest, world)
        counts = []
        for q in range(world):
            part = share + (1 if q < extra else 0)
            counts.append(full * k + -(-part // micro))
        if rest:
            start = rank * share + min(rank, extra)
            stop = start + share + (1 if rank < extra else 0)
            for lo in range(start, stop, micro):
                hi = min(lo + micro, stop)
                yield step[lo:hi], (position + 1 if hi >= stop else None)
        empty = None
        if p.template and first:
            empty = map_tensors(self.collate(first), lambda t: t[:0])
        yield _End(tuple(counts), empty)

    def __iter__(self) -> Iterator[Any]:
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            hf_stream.prepare_worker(self.stream)
        p = self.pass_
        held: tuple[list[Any], int | None] | None = None
        index = 0  # this rank's batches so far in the pass; batch i is worker i % workers's
        end: _End | None = None
        for span in self._spans(p):
            if isinstance(span, _End):
                end = span
                break
            if held is not None:  # not the pass's last batch: a mid-epoch mark
                samples, after = held
                if index % workers == worker:
                    yield (p.epoch, after), self.collate(samples)
                index += 1
            held = span
        if held is not None:  # the pass's last batch moves the epoch on
            if index % workers == worker:
                yield (p.epoch + 1, 0), self.collate(held[0])
            index += 1
        if index % workers == worker:  # the next worker in turn ends the pass
            yield end


class StreamLoader(LaidOut, Position):
    """Iterate this rank's part of each global batch of a stream; see the module doc.

    The interface is ``DistributedLoader``'s (``epoch``, ``batch_size``, ``global_batch_size``,
    ``accumulation_steps``, ``ends_step``, ``on_batch``, ``tokens_per_sample``, ``set_epoch``,
    ``state_dict``/``load_state_dict``, ``even_batches``, ``device``).

    Args:
        stream: a ``torch.utils.data.IterableDataset`` or a Hugging Face
            ``datasets.IterableDataset``; it is iterated once per pass, by each rank and worker.
        batch_size: the GLOBAL batch per optimizer step.
        buffer_size: samples in the shuffle buffer (memory: that many samples per process and
            worker); a larger buffer mixes farther. Read by lanes, the window each lane is
            shuffled in.
        lanes: for a stream with shards (``n_shards`` and ``shard()``, as a Hugging Face
            stream over several files): the lanes its shards are read in, so that each rank
            reads only its share (``multigpu.data.stream_lanes``); None: as many as shards, at
            most the global batch and 64, for a training loader (``drop_last``), else 1; 1: read
            whole by every rank. The global order depends on it, not on the world size.
        collate_fn: makes a batch of a list of samples (torch's ``default_collate`` if None).
        **dataloader_kwargs: passed to ``DataLoader`` (``num_workers``, ``pin_memory``,
            ``prefetch_factor``, ``worker_init_fn``, ``timeout``...).

    Example:
        >>> class Numbers(IterableDataset):
        ...     def __iter__(self):
        ...         return iter(range(10))
        >>> loader = StreamLoader(Numbers(), batch_size=4, rank=1, world_size=2, shuffle=False)
        >>> [b.tolist() for b in loader], loader.epoch
        ([[2, 3], [6, 7], [9]], 1)
    """

    def __init__(
        self,
        stream: Any,
        *,
        batch_size: int,
        rank: int,
        world_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool | None = None,
        accumulation_steps: int = 1,
        buffer_size: int = DEFAULT_BUFFER_SIZE,
        lanes: int | None = None,
        device: torch.device | str | None = None,
        even_batches: bool | Callable[[], bool] = False,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        **dataloader_kwargs: Any,
    ) -> None:
        if not is_stream(stream):
            raise UsageError(
                f"StreamLoader was given a {type(stream).__name__}; expected a torch "
                "IterableDataset or a Hugging Face datasets.IterableDataset (a map-style "
                "dataset goes to DistributedLoader: ctx.loader chooses)"
            )
        _check_options(stream, dataloader_kwargs)
        self.stream = stream
        BatchLayout.check(
            global_batch_size=batch_size, rank=rank, world_size=world_size, shuffle=shuffle,
            seed=seed, drop_last=drop_last, accumulation_steps=accumulation_steps,
        ).apply(self)  # fmt: skip
        self.buffer_size = _as_int("buffer_size", buffer_size, 1)
        self._n_shards = stream_lanes.shard_count(stream)
        self.lanes = self._check_lanes(lanes)
        """Lanes the stream's shards are read in (1: read whole by every rank)."""
        self._shard_counts: list[int] | None = None
        self._saved_counts: list[int] | None = None
        self._seeds_checked = False
        self.num_samples: int | None = None
        """Unknown for a stream (``DistributedLoader``'s sampler knows its dataset's)."""
        self._epoch = 0
        self._cursor = 0
        self._even_batches = even_batches
        self.device = torch.device(device) if device is not None else None
        self._non_blocking = bool(dataloader_kwargs.get("pin_memory", False))
        self._generator = torch.Generator()
        self._batches = _RankBatches(self, collate_fn or default_collate)
        self._lane_chunks = stream_lanes.LaneChunks(
            stream, self._n_shards, seed=self.seed, shuffle=self.shuffle, window=self.buffer_size
        )
        try:
            self.dataloader: DataLoader[Any] = DataLoader(
                self._batches,
                batch_size=None,
                collate_fn=_as_is,
                generator=self._generator,
                **dataloader_kwargs,
            )
            self._lane_loader: DataLoader[Any] = DataLoader(
                self._lane_chunks,
                batch_size=None,
                collate_fn=_as_is,
                generator=self._generator,
                **dataloader_kwargs,
            )
        except (TypeError, ValueError) as e:
            raise UsageError(
                f"DataLoader rejected the options {sorted(dataloader_kwargs)}: {e}; "
                "fix or remove them (see torch.utils.data.DataLoader)"
            ) from e
        self.ends_step = True
        """True when the batch handed out last is the last micro-batch of its optimizer step."""
        self.on_batch: Callable[[StreamLoader], None] | None = None
        """Called with the loader as each batch is handed out (Context: the active loader)."""
        self.tokens_per_sample: int | None = None
        """Tokens in one sample (``ctx.loader(tokens_per_sample=)``), for ``ctx.throughput()``."""
        self.replica_steps: Iterable[Any] | None = None
        """Under replica groups: this group's shares of each global batch, used instead."""
        if self.world_size > 1 and self.rank == 0 and _first_process():
            self._say_how_it_is_read()

    def _check_lanes(self, lanes: int | None) -> int:
        name = hf_stream.describe(self.stream)
        if lanes is None:
            return stream_lanes.default_lanes(self._n_shards, self.global_batch_size) if (
                self.drop_last
            ) else 1  # fmt: skip
        lanes = _as_int("lanes", lanes, 1)
        if lanes == 1:
            return 1
        if not self._n_shards:
            raise UsageError(
                f"lanes={lanes} was given, but the stream {name} has no shards to read by "
                "(n_shards >= 2 and shard(num_shards=, index=)); leave lanes out"
            )
        if lanes > min(self._n_shards, self.global_batch_size):
            raise UsageError(
                f"lanes={lanes} is more than the stream's {self._n_shards} shards or the global "
                f"batch_size={self.global_batch_size}; use at most "
                f"{min(self._n_shards, self.global_batch_size)}"
            )
        if not self.drop_last:
            raise UsageError(
                f"lanes={lanes} with drop_last=False: lanes give whole global batches only; "
                "use drop_last=True, or lanes=1 to keep the last partial batch"
            )
        return lanes

    def _say_how_it_is_read(self) -> None:
        name, world, lanes = hf_stream.describe(self.stream), self.world_size, self.lanes
        if lanes == 1:
            why = "its shards are not read by lanes (lanes=1)" if self._n_shards else (
                "it has no shards multigpu can split"
            )  # fmt: skip
            warn_once(
                log,
                "the stream %s is read whole by each of the %s ranks (%s); RecordFiles(...) "
                "reads only each rank's share of files",
                name, world, why,
            )  # fmt: skip
        elif lanes % world:
            warn_once(
                log,
                "the stream %s is read by shard in %s lanes, which %s ranks do not divide: two "
                "ranks read each lane at the boundary of their parts (lanes=%s reads 1/%s each)",
                name, lanes, world, max(world, lanes // world * world), world,
            )  # fmt: skip
        else:
            log.debug("stream %s: %s shards in %s lanes", name, self._n_shards, lanes)

    @property
    def even_batches(self) -> bool:
        """Ranks with a batch fewer get an empty one (see ``DistributedLoader``)."""
        even = self._even_batches
        return bool(even() if callable(even) else even)

    def __len__(self) -> int:
        """This rank's batches left in the epoch, where the stream has a ``__len__``.

        Raises:
            TypeError: the stream has no length (a generator's is known only at its end).
        """
        try:
            size = len(self.stream)
        except TypeError as e:
            raise TypeError(
                f"len() of a loader over the stream {hf_stream.describe(self.stream)}, which "
                "has no __len__: its batches are known only at its end; iterate it (for batch "
                "in loader) and count, or give the stream a __len__"
            ) from e
        counts = self._rank_batches(max(0, size - self._cursor))
        return max(counts) if self.even_batches else counts[self.rank]

    def _rank_batches(self, left: int) -> list[int]:
        """Every rank's batches over ``left`` more samples of the epoch."""
        big, micro, k = self.global_batch_size, self.batch_size, self.accumulation_steps
        full, rest = divmod(left, big)
        rest = 0 if self.drop_last else rest
        share, extra = divmod(rest, self.world_size)
        parts = (share + (1 if q < extra else 0) for q in range(self.world_size))
        return [full * k + -(-part // micro) for part in parts]

    def _counts(self) -> list[int]:
        """Each shard's records, counted once by the ranks together (a collective)."""
        if self._shard_counts is None:
            self._shard_counts = stream_lanes.count_shards(self.stream, self._n_shards)
            self._check_counts()
        return self._shard_counts

    def _check_counts(self) -> None:
        saved, now = self._saved_counts, self._shard_counts
        if saved is None or now is None or saved == now:
            return
        name = hf_stream.describe(self.stream)
        if len(saved) != len(now):
            raise DataError(
                f"the stream {name} has {len(now)} shards, but the checkpoint's position was "
                f"saved over {len(saved)}; resume over the same files, or start anew"
            )
        shard = next(i for i, (a, b) in enumerate(zip(saved, now, strict=True)) if a != b)
        raise DataError(
            f"shard {shard} of the stream {name} holds {now[shard]} records, but "
            f"{saved[shard]} when the checkpoint's position was saved: the data changed; "
            "resume over the same files, or start anew"
        )

    def _plan(self, epoch: int) -> stream_lanes.LanePlan | None:
        """The epoch's lane plan, or None when it is read whole."""
        if self.lanes == 1:
            return None
        found = stream_lanes.plan(
            self._counts(), lanes=self.lanes, global_batch_size=self.global_batch_size,
            seed=self.seed, epoch=epoch, shuffle=self.shuffle,
        )  # fmt: skip
        if found is None and self.rank == 0 and _first_process():
            warn_once(
                log,
                "the stream %s is read whole by each rank in epoch %s: its %s shards "
                "(%s to %s records) are too uneven to cut into %s lanes",
                hf_stream.describe(self.stream), epoch, self._n_shards,
                min(self._counts()), max(self._counts()), self.lanes,
            )  # fmt: skip
        return found

    def global_batches(self, epoch: int, start_step: int) -> Iterator[list[Any]]:
        """The whole global batches of ``epoch`` from step ``start_step`` on, each a list of its
        samples in position order, read in this process (replica groups read a stream so)."""
        big = self.global_batch_size
        p = self._plan(epoch)
        if p is None:
            items = itertools.islice(self._batches.order(epoch), start_step * big, None)
            while len(batch := list(itertools.islice(items, big))) == big:
                yield batch
            return
        chunks = stream_lanes.LaneChunks(
            self.stream, self._n_shards, seed=self.seed, shuffle=self.shuffle,
            window=self.buffer_size,
        )  # fmt: skip
        chunks.pass_ = stream_lanes.LanePass(p, epoch, start_step, 0, big)
        for run in chunks:
            for pairs in run:
                yield [sample for _, sample in sorted(pairs, key=lambda pair: pair[0])]

    def _lanes_pass(self, p: stream_lanes.LanePlan) -> Iterator[Any]:
        """The rest of the epoch by lanes: each step's samples gathered from the workers' lanes
        (one list from each worker in turn), in position order, cut into micro-batches."""
        epoch, big, micro = self._epoch, self.global_batch_size, self.batch_size
        start = self._cursor // big
        if start >= p.steps:  # resumed at the epoch's end
            self._epoch, self._cursor = epoch + 1, 0
            return
        lo = self.rank * (big // self.world_size)
        self._lane_chunks.pass_ = stream_lanes.LanePass(p, epoch, start, lo, lo + micro * (
            self.accumulation_steps
        ))  # fmt: skip
        self._generator.manual_seed(derive_seed(self.seed, epoch, self.rank))
        device = self.device if self.device is not None and self.device.type != "cpu" else None
        workers = max(1, int(getattr(self._lane_loader, "num_workers", 0)))
        collate = self._batches.collate
        chunks = iter(self._lane_loader)
        held: list[list[Any]] = []
        for step in range(start, p.steps):
            if not held:  # the next run of steps: one chunk from each worker in turn
                runs = [next(chunks) for _ in range(workers)]
                held = [[pair for run in runs for pair in run[i]] for i in range(len(runs[0]))]
            pairs = held.pop(0)
            samples = [pair[1] for pair in sorted(pairs, key=lambda pair: int(pair[0]))]
            for m in range(self.accumulation_steps):
                batch = collate(samples[m * micro : (m + 1) * micro])
                if device is not None:
                    batch = move_to_device(batch, device, non_blocking=self._non_blocking)
                self.ends_step = m == self.accumulation_steps - 1
                if self.ends_step:
                    at = (epoch, (step + 1) * big)
                    self._epoch, self._cursor = (epoch + 1, 0) if step + 1 == p.steps else at
                if self.on_batch is not None:
                    self.on_batch(self)
                yield batch

    def __iter__(self) -> Iterator[Any]:
        """Run the rest of the current epoch on this rank, then move to the next epoch."""
        if self.replica_steps is not None:
            yield from self.replica_steps
            return
        p = self._plan(self._epoch)
        if p is not None:
            yield from self._lanes_pass(p)
            return
        if not self._seeds_checked:  # every rank passes here at its first pass: a collective
            webdataset_stream.check_seeds_agree(self.stream)
            self._seeds_checked = True
        epoch, even = self._epoch, self.even_batches
        self._batches.pass_ = _Pass(epoch, self._cursor, even)
        self._generator.manual_seed(derive_seed(self.seed, epoch, self.rank))
        device = self.device if self.device is not None and self.device.type != "cpu" else None
        handed_out = 0
        end: _End | None = None
        for record in self.dataloader:
            if isinstance(record, _End):
                end = record
                continue
            mark, batch = record  # pin_memory makes the pair a list
            if device is not None:
                batch = move_to_device(batch, device, non_blocking=self._non_blocking)
            if mark[1] is not None:  # a step's last micro-batch (or the epoch's last batch)
                self._epoch, self._cursor = int(mark[0]), int(mark[1])
            self.ends_step = mark[1] is not None
            handed_out += 1
            if self.on_batch is not None:
                self.on_batch(self)
            yield batch
        if even and end is not None and end.empty is not None:
            empty = end.empty if self.device is None else move_to_device(end.empty, self.device)
            for _ in range(max(end.rank_batches) - handed_out):
                yield empty
        if self._epoch == epoch:  # no batch for this rank, or a stream shorter than the cursor
            self._epoch, self._cursor = epoch + 1, 0

    def state_dict(self) -> dict[str, Any]:
        """The portable progress: valid under any world size, accumulation and workers."""
        return {
            "seed": self.seed,
            "epoch": self._epoch,
            "cursor": self._cursor,
            "global_batch_size": self.global_batch_size,
            "buffer_size": self.buffer_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
            "lanes": self.lanes,
            "shard_counts": self._shard_counts,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the global sample where ``state`` stopped, whatever the world size.

        Raises:
            UsageError: ``state`` is not a stream loader's state, or its global batch, shuffle,
                seed or buffer size differ from this loader's (each difference is named).
        """
        if not isinstance(state, Mapping):
            raise UsageError(
                f"stream loader state is a {type(state).__name__}; expected the dict returned "
                "by StreamLoader.state_dict() with keys " + ", ".join(STATE_KEYS)
            )
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            made_by = " (a map-style loader's)" if "num_samples" in state else ""
            raise UsageError(
                f"stream loader state{made_by} lacks {missing} (has {sorted(state)}); expected "
                "the dict returned by StreamLoader.state_dict() (a loader over the same stream)"
            )
        ours = self.state_dict()
        keys: Sequence[str] = ("global_batch_size", "shuffle", "seed")
        if self.shuffle:
            keys = (*keys, "buffer_size")
        if "lanes" in state:  # saved since streams are read by lanes
            keys = (*keys, "lanes")
        differ = [
            f"{key}: saved {state[key]!r}, now {ours[key]!r}"
            for key in keys
            if state[key] != ours[key]
        ]
        if differ:
            raise UsageError(
                "cannot resume the stream's order: " + "; ".join(differ) + "; build the loader "
                "with the saved batch_size, shuffle, seed, buffer_size and lanes (world size "
                "and num_workers may differ)"
            )
        epoch = _as_int("state['epoch']", state["epoch"], 0)
        cursor = _as_int("state['cursor']", state["cursor"], 0)
        if cursor % self.global_batch_size:
            raise UsageError(
                f"state['cursor']={cursor} is not a whole number of global batches of "
                f"{self.global_batch_size}; pass a state saved by StreamLoader.state_dict()"
            )
        if bool(state["drop_last"]) != self.drop_last:
            log.warning(
                "resuming with drop_last=%s, saved with drop_last=%s",
                self.drop_last,
                state["drop_last"],
            )
        counts = state.get("shard_counts")
        self._saved_counts = [int(c) for c in counts] if counts is not None else None
        self._check_counts()
        self._epoch, self._cursor = epoch, cursor


def _first_process() -> bool:
    """Whether this is the job's first process (data rank 0 of a tensor-parallel group is not
    always it)."""
    dist = torch.distributed
    return not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0
