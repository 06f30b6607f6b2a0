"""``DistributedLoader`` and ``make_loader``: a DataLoader over this rank's ``ShardSampler`` shard.

Iteration rule: ``iter(loader)`` always starts where the sampler's cursor is, and handing out the
last batch of an epoch moves to the next epoch — so ``for batch in loader`` twice runs two
differently shuffled epochs with no ``set_epoch``. A pass abandoned mid-epoch (``break``, an
exception) leaves the cursor after the last *whole step* handed out: the next ``iter()`` goes on
from there (a step abandoned between its micro-batches is started again from its first).

Progress is counted per batch *delivered to the loop*, not per batch the DataLoader fetched:
with ``num_workers > 0`` the DataLoader pulls indices ahead, so ``state_dict()`` taken while
holding a batch is exactly "everything up to and including this step".

Even batches (``even_batches=True``, which ``ctx.loader`` sets under FSDP, whose forward is a
collective): when the last step of a pass gives some ranks a batch fewer (evaluation keeps every
sample once, so its split can be uneven), those ranks get an *empty* batch instead — the same
structure with 0 rows — so every rank runs the same number of forwards and none waits forever.
Nothing is duplicated: metrics count no sample from it (``Mean`` with ``weight=len(batch)``,
``Accuracy``, ``Sum`` see 0 elements); a loss with ``reduction="mean"`` over it is NaN, so sum
losses or weight them by the batch length.

Randomness in workers: before each pass the DataLoader's ``generator`` is seeded from
``(seed, epoch, rank)``; torch draws the workers' base seed from it and seeds worker ``i`` (torch,
``random`` and NumPy) from ``base + i``, so augmentations are reproducible per
(seed, epoch, rank, worker id). With ``persistent_workers=True`` workers are seeded once, at the
first pass, and their streams continue across epochs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch.utils.data import DataLoader, IterableDataset

from multigpu.data.indexed_streams import IndexedView, splits_itself
from multigpu.data.sampler import ShardSampler, derive_seed
from multigpu.data.stream_loader import StreamLoader, is_stream
from multigpu.errors import UsageError
from multigpu.runtime.device import map_tensors, move_to_device

log = logging.getLogger(__name__)

# DataLoader options multigpu decides itself: passing them would silently undo the sharding.
OWNED_OPTIONS = ("sampler", "batch_sampler", "batch_size", "shuffle", "drop_last", "generator")


def _check_options(dataloader_kwargs: Mapping[str, Any]) -> None:
    owned = [k for k in OWNED_OPTIONS if k in dataloader_kwargs]
    if owned:
        raise UsageError(
            f"DataLoader option(s) {owned} were given, but multigpu owns sharding, batching and "
            "ordering; pass the GLOBAL batch_size, shuffle, drop_last and seed to "
            "make_loader()/ctx.loader() and leave out " + ", ".join(owned)
        )
    if dataloader_kwargs.get("in_order") is False:
        # Out-of-order delivery would make "batches handed out" differ from "steps consumed".
        raise UsageError(
            "in_order=False was given, but the resumable cursor needs batches in sampler order; "
            "leave in_order out (the default True)"
        )


def dataset_length(dataset: Any) -> int:
    """Return ``len(dataset)`` of a map-style dataset (UsageError for any other)."""
    kind = type(dataset).__name__
    if isinstance(dataset, IterableDataset):
        raise UsageError(
            f"dataset is an IterableDataset ({kind}); DistributedLoader shards map-style "
            "datasets by index; give the stream to make_loader()/ctx.loader(), which read it "
            "with a StreamLoader"
        )
    try:
        return len(dataset)
    except TypeError as e:
        raise UsageError(
            f"dataset ({kind}) has no __len__; expected a map-style dataset with __len__ and "
            "__getitem__, or a stream: a torch.utils.data.IterableDataset whose __iter__ reads "
            "it (each rank reads it whole)"
        ) from e


def _plain_cpu_batch(batch: Any) -> bool:
    """True for a list or tuple of plain tensors all on the CPU (``move_to_device`` keeps it)."""
    kind = type(batch)
    if kind is not list and kind is not tuple:
        return False
    for item in batch:  # noqa: SIM110 (all() over a generator costs more, at every step)
        if type(item) is not torch.Tensor or not item.is_cpu:
            return False
    return True


class DistributedLoader:
    """Iterate this rank's shard of ``dataset`` through a ``torch.utils.data.DataLoader``.

    Args:
        sampler: this rank's ``ShardSampler``; the loader owns its progress from now on.
        device: when set, every batch is moved there (``non_blocking`` when ``pin_memory``).
        even_batches: give ranks that run out a batch early an empty batch instead (FSDP); a
            function is asked at each pass (``ctx.loader``'s: whether the strategy's forward
            is a collective, known once ``ctx.setup`` chose it).
        **dataloader_kwargs: passed to ``DataLoader`` (``num_workers``, ``collate_fn``,
            ``pin_memory``, ``persistent_workers``, ``prefetch_factor``, ``worker_init_fn``...).

    Example:
        >>> ds = torch.utils.data.TensorDataset(torch.arange(8))
        >>> loader = DistributedLoader(ds, ShardSampler(8, global_batch_size=4, rank=0,
        ...                                             world_size=2, shuffle=False))
        >>> [b[0].tolist() for b in loader], loader.epoch
        ([[0, 1], [4, 5]], 1)
    """

    def __init__(
        self,
        dataset: Any,
        sampler: ShardSampler,
        *,
        device: torch.device | str | None = None,
        even_batches: bool | Callable[[], bool] = False,
        **dataloader_kwargs: Any,
    ) -> None:
        _check_options(dataloader_kwargs)
        size = dataset_length(dataset)
        if size != sampler.num_samples:
            raise UsageError(
                f"dataset has {size} samples but the sampler was built for "
                f"{sampler.num_samples}; build ShardSampler with num_samples=len(dataset)"
            )
        self.dataset = dataset
        self.sampler = sampler
        self._even_batches = even_batches
        self.device = torch.device(device) if device is not None else None
        self._non_blocking = bool(dataloader_kwargs.get("pin_memory", False))
        self._generator = torch.Generator()
        try:
            self.dataloader: DataLoader[Any] = DataLoader(
                dataset, batch_sampler=sampler, generator=self._generator, **dataloader_kwargs
            )
        except (TypeError, ValueError) as e:
            raise UsageError(
                f"DataLoader rejected the options {sorted(dataloader_kwargs)}: {e}; "
                "fix or remove them (see torch.utils.data.DataLoader)"
            ) from e
        sampler._external_progress = True
        self.ends_step = True
        """True when the batch handed out last is the last micro-batch of its optimizer step."""
        self.on_batch: Callable[[DistributedLoader], None] | None = None
        """Called with the loader as each batch is handed out (Context: the active loader)."""
        self.tokens_per_sample: int | None = None
        """Tokens in one sample (``ctx.loader(tokens_per_sample=)``), for ``ctx.throughput()``."""
        self.replica_steps: Iterable[Any] | None = None
        """Under replica groups (``multigpu run --replicas``): the iteration of this group's
        shares of each global batch (``multigpu.replicas.shares``), used instead of the above."""

    @property
    def even_batches(self) -> bool:
        """Ranks with a batch fewer get an empty one (see the module doc)."""
        even = self._even_batches
        return bool(even() if callable(even) else even)

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self.sampler.epoch

    @property
    def batch_size(self) -> int:
        """Samples per batch on this rank (the per-rank micro-batch)."""
        return self.sampler.batch_size

    @property
    def accumulation_steps(self) -> int:
        """Micro-batches per optimizer step on each rank."""
        return self.sampler.accumulation_steps

    @property
    def global_batch_size(self) -> int:
        """Samples per optimizer step over all ranks and micro-steps."""
        return self.sampler.global_batch_size

    def set_epoch(self, epoch: int) -> None:
        """Jump to ``epoch`` (not needed: epochs advance by themselves); see ``ShardSampler``."""
        self.sampler.set_epoch(epoch)

    def __len__(self) -> int:
        """This rank's number of batches left in the current epoch."""
        if self.even_batches:
            return max(self.sampler.rank_num_batches())
        return len(self.sampler)

    def __iter__(self) -> Iterator[Any]:
        """Run the rest of the current epoch on this rank, then move to the next epoch."""
        if self.replica_steps is not None:
            yield from self.replica_steps
            return
        sampler, device, non_blocking = self.sampler, self.device, self._non_blocking
        marks = sampler._progress_marks()  # same state the DataLoader's iter(sampler) reads
        self._generator.manual_seed(derive_seed(sampler.seed, sampler.epoch, sampler.rank))
        on_cpu = device is not None and device.type == "cpu"
        handed_out = 0
        every = max(sampler.rank_num_batches()) if self.even_batches else 0
        batch: Any = None
        for batch, mark in zip(self.dataloader, marks, strict=True):
            # A batch already on the CPU (the default collate's list of CPU tensors) needs no
            # walk through move_to_device: checking costs a fraction of it, at every step.
            if device is not None and not (on_cpu and _plain_cpu_batch(batch)):
                batch = move_to_device(batch, device, non_blocking=non_blocking)
            sampler._commit(mark)  # counted as it is handed out, see module doc
            self.ends_step = mark is not None
            handed_out += 1
            if self.on_batch is not None:
                self.on_batch(self)
            yield batch
        for _ in range(every - handed_out):  # ranks a batch short: the same number of forwards
            yield self._empty_batch(batch)
        sampler._finish_pass(handed_out)

    def _empty_batch(self, like: Any) -> Any:
        """A batch of 0 rows shaped like ``like`` (or like the dataset's first sample)."""
        if like is None:
            like = self.dataloader.collate_fn([self.dataset[0]])
        empty = map_tensors(like, lambda t: t[:0])
        return move_to_device(empty, self.device) if self.device is not None else empty

    def state_dict(self) -> dict[str, Any]:
        """The sampler's portable progress (see ``ShardSampler.state_dict``)."""
        return self.sampler.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the saved global sample, under any world size; call between passes."""
        self.sampler.load_state_dict(state)


def make_loader(
    dataset: Any,
    *,
    batch_size: int,
    rank: int,
    world_size: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool | None = None,
    accumulation_steps: int = 1,
    device: torch.device | str | None = None,
    even_batches: bool | Callable[[], bool] = False,
    **dataloader_kwargs: Any,
) -> DistributedLoader | StreamLoader:
    """Build the loader of this rank; ``batch_size`` is the GLOBAL batch per optimizer step.

    Each rank's batches hold ``batch_size / (world_size * accumulation_steps)`` samples; the
    sequence of global batches depends on ``(seed, epoch)`` only (see ``multigpu.data.sampler``).
    ``drop_last=None`` means ``shuffle``: training drops the last partial step, evaluation keeps
    every sample exactly once (ranks may then get uneven or no last batches).

    A stream (torch's or Hugging Face's ``IterableDataset``) gets a ``StreamLoader`` instead:
    every rank keeps its part of the same global batches, reading the stream whole, or only its
    lanes of a stream with shards (``buffer_size``: its shuffle buffer; ``lanes``: see
    ``multigpu.data.stream_loader`` and ``multigpu.data.stream_lanes``). A litdata or MosaicML
    ``StreamingDataset``, which splits itself by rank when iterated, is dealt by index as a
    map-style dataset (``multigpu.data.indexed_streams``).

    Raises:
        UsageError: a dataset without ``__len__``, a ``batch_size`` that does not split evenly,
            or a DataLoader option that would undo the sharding (or that DataLoader rejects).
    """
    if splits_itself(dataset):  # litdata / MosaicML: iterated, each rank would get its own part
        dataset = IndexedView(dataset)
    if is_stream(dataset):
        return StreamLoader(
            dataset,
            batch_size=batch_size,
            rank=rank,
            world_size=world_size,
            shuffle=shuffle,
            seed=seed,
            drop_last=drop_last,
            accumulation_steps=accumulation_steps,
            device=device,
            even_batches=even_batches,
            **dataloader_kwargs,
        )
    _check_options(dataloader_kwargs)
    sampler = ShardSampler(
        dataset_length(dataset),
        global_batch_size=batch_size,
        rank=rank,
        world_size=world_size,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        accumulation_steps=accumulation_steps,
        source=dataset,  # its own order and data fingerprint, if it has them (RecordFiles)
    )
    log.debug(
        "rank %s/%s: global batch %s, per-rank batch %s, %s batches this epoch",
        rank,
        world_size,
        sampler.global_batch_size,
        sampler.batch_size,
        len(sampler),
    )
    return DistributedLoader(
        dataset, sampler, device=device, even_batches=even_batches, **dataloader_kwargs
    )
