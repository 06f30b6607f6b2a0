"""``ShardSampler``: this rank's share of a world-size-invariant, resumable global sample order.

The global order of an epoch is a function of ``(seed, epoch)`` only: a permutation drawn from a
``torch.Generator`` seeded from both (``shuffle=False``: ``0..n-1``). Step ``s`` consumes global
positions ``[s*B, (s+1)*B)`` of that order (``B`` = global batch). The layout inside a step is
rank-major::

    global batch of step s:  | rank 0           | rank 1           | ... | rank W-1 |
    rank r's slice:          | micro 0 | micro 1 | ... | micro k-1 |       (b = B/W, mb = b/k)

Rank ``r`` takes positions ``[s*B + r*b, s*B + (r+1)*b)`` and its micro-step ``m`` the
``m``-th run of ``mb`` of them, so the union over ranks and micro-steps of one step is exactly
that global batch, and ``W`` ranks with ``k`` micro-steps see what ``W*k`` ranks without
accumulation would. The sequence of global batches is the same for every world size.

Last partial step (``n`` not a multiple of ``B``): with ``drop_last`` (the default when
shuffling) it is skipped — each epoch reshuffles, so different samples are dropped. Without it
(the default for ``shuffle=False``, i.e. evaluation) the ``R`` remaining samples are split into
``W`` contiguous parts whose sizes differ by at most one (the first ``R % W`` ranks get one
more); each part is cut into micro-batches of at most ``mb``. A rank whose part is empty yields
no batch for that step. Nothing is ever padded with duplicates; ``rank_num_batches()`` gives
every rank's share.

Progress: ``cursor`` counts the global samples of the epoch already consumed, in whole global
batches. A step counts when this rank hands out its last micro-batch of it; when the rank hands
out its last batch of the epoch, the epoch increments and the cursor resets to 0 (so a
checkpoint saved after the last step of an epoch resumes at the start of the next one).

A dataset may give its own shuffled order (``source=``, what ``make_loader`` passes): when it has
``global_order(seed, epoch)`` (a permutation of ``range(n)``, a function of its arguments only)
that order replaces the ``randperm`` — ``RecordFiles`` uses it to keep each rank's reads within a
few files. When it has ``data_fingerprint()`` (a small list of plain values) the state carries it
under ``"files"``, and ``load_state_dict`` hands a saved one to ``check_data_fingerprint(saved)``
first, which refuses files that changed since the save.
"""

from __future__ import annotations

import logging
import operator
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, fields
from typing import Any

import torch
from torch.utils.data import Sampler

from multigpu.errors import UsageError

log = logging.getLogger(__name__)

_MASK64 = (1 << 64) - 1
STATE_KEYS = ("seed", "epoch", "cursor", "num_samples", "global_batch_size", "shuffle", "drop_last")


def derive_seed(*parts: int) -> int:
    """Mix integers into one 63-bit seed (SplitMix64), so nearby inputs give unrelated seeds."""
    state = 0x9E3779B97F4A7C15
    for part in parts:
        state = (state ^ (int(part) & _MASK64)) & _MASK64
        state = (state + 0x9E3779B97F4A7C15) & _MASK64
        z = state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        state = z ^ (z >> 31)
    return state >> 1  # torch.Generator.manual_seed takes any int64; stay non-negative


def _as_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, bool):
        raise UsageError(f"{name}={value!r} is a bool; expected an integer >= {minimum}")
    try:
        number = operator.index(value)
    except TypeError as e:
        raise UsageError(
            f"{name}={value!r} is a {type(value).__name__}; expected an integer >= {minimum}"
        ) from e
    if number < minimum:
        raise UsageError(f"{name}={number} is too small; expected an integer >= {minimum}")
    return number


def per_rank_batch_size(batch_size: int, world_size: int, accumulation_steps: int) -> int:
    """Return the per-rank micro-batch ``batch_size / (world_size * accumulation_steps)``.

    A global batch that does not divide evenly is a UsageError suggesting multiples.
    """
    parts = world_size * accumulation_steps
    if batch_size % parts:
        below, above = (batch_size // parts) * parts, (batch_size // parts + 1) * parts
        examples = f"{below} or {above}" if below else f"{above}"
        raise UsageError(
            f"batch_size={batch_size} is not divisible by world_size={world_size} × "
            f"accumulation_steps={accumulation_steps}: the per-rank batch would be "
            f"{batch_size / parts:.2f}; use a multiple of {parts}, e.g. {examples}"
        )
    return batch_size // parts


class LaidOut:
    """The public names of a batch layout, set by ``BatchLayout.apply``: a sampler or loader
    that deals global batches as ``ShardSampler`` does."""

    rank: int
    world_size: int
    accumulation_steps: int
    global_batch_size: int
    """Samples per optimizer step over all ranks and micro-steps."""
    batch_size: int
    """Samples per batch on this rank (the per-rank micro-batch)."""
    seed: int
    shuffle: bool
    drop_last: bool


class Position:
    """Where a sampler or loader is in its global order: the epoch and the samples of it already
    consumed (``ShardSampler`` and ``StreamLoader`` alike)."""

    _epoch: int
    _cursor: int

    @property
    def epoch(self) -> int:
        """The epoch the next batch belongs to."""
        return self._epoch

    @property
    def cursor(self) -> int:
        """Global samples of this epoch already consumed (a multiple of the global batch)."""
        return self._cursor

    def set_epoch(self, epoch: int) -> None:
        """Jump to ``epoch``; the cursor resets unless it already is the current epoch.

        Not needed (the epoch advances by itself); kept so ``DistributedSampler`` habits and a
        resumed run calling ``set_epoch(e)`` for the epoch it resumed in do no harm.
        """
        epoch = _as_int("epoch", epoch, 0)
        if epoch != self._epoch:
            self._epoch, self._cursor = epoch, 0


@dataclass(frozen=True)
class BatchLayout:
    """The arguments that lay a global batch out over ranks and micro-steps, checked: what
    ``ShardSampler`` and ``StreamLoader`` (a stream dealt the same way) both take."""

    rank: int
    world_size: int
    accumulation_steps: int
    global_batch_size: int
    batch_size: int
    """Samples per batch on this rank (the per-rank micro-batch)."""
    seed: int
    shuffle: bool
    drop_last: bool

    @classmethod
    def check(
        cls,
        *,
        global_batch_size: int,
        rank: int,
        world_size: int,
        shuffle: bool,
        seed: int,
        drop_last: bool | None,
        accumulation_steps: int,
    ) -> BatchLayout:
        """The layout of these arguments; a UsageError naming the first one that is wrong (a
        rank out of range, a global batch that does not split evenly)."""
        world_size = _as_int("world_size", world_size, 1)
        rank = _as_int("rank", rank, 0)
        if rank >= world_size:
            raise UsageError(
                f"rank={rank} is out of range for world_size={world_size}; "
                f"expected 0 <= rank < {world_size}"
            )
        accumulation_steps = _as_int("accumulation_steps", accumulation_steps, 1)
        global_batch_size = _as_int("batch_size", global_batch_size, 1)
        return cls(
            rank=rank,
            world_size=world_size,
            accumulation_steps=accumulation_steps,
            global_batch_size=global_batch_size,
            batch_size=per_rank_batch_size(global_batch_size, world_size, accumulation_steps),
            seed=_as_int("seed", seed, 0),
            shuffle=bool(shuffle),
            drop_last=bool(shuffle) if drop_last is None else bool(drop_last),
        )

    def apply(self, to: LaidOut) -> None:
        """Set these as attributes of ``to`` (the sampler's and the loader's public names)."""
        for field in fields(self):
            setattr(to, field.name, getattr(self, field.name))


class ShardSampler(Sampler[list[int]], LaidOut, Position):
    """Batch sampler yielding this rank's index list per (micro-)step; see the module docstring.

    Args:
        global_batch_size: samples per optimizer step over all ranks and micro-steps.
        shuffle: reshuffle every epoch (else the order is ``0..n-1``).
        seed: with the epoch, the only input of the global order.
        drop_last: skip the last partial step; ``None`` means ``shuffle``.
        accumulation_steps: micro-steps per optimizer step on each rank.
        source: the dataset, when it gives its own order or fingerprint (see the module doc).

    Example:
        >>> s = ShardSampler(10, global_batch_size=4, rank=1, world_size=2, shuffle=False)
        >>> list(s), s.epoch
        ([[2, 3], [6, 7], [9]], 1)
    """

    def __init__(
        self,
        num_samples: int,
        *,
        global_batch_size: int,
        rank: int,
        world_size: int,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool | None = None,
        accumulation_steps: int = 1,
        source: Any = None,
    ) -> None:
        super().__init__()
        self.source = source
        """The dataset, asked for its ``global_order`` and data fingerprint (module doc)."""
        self.num_samples = _as_int("num_samples", num_samples, 1)
        BatchLayout.check(
            global_batch_size=global_batch_size, rank=rank, world_size=world_size,
            shuffle=shuffle, seed=seed, drop_last=drop_last,
            accumulation_steps=accumulation_steps,
        ).apply(self)  # fmt: skip
        if self.drop_last and self.num_samples < self.global_batch_size:
            raise UsageError(
                f"batch_size={self.global_batch_size} is larger than the dataset "
                f"({self.num_samples} samples) with drop_last=True, so every epoch would be "
                f"empty; use a batch_size <= {self.num_samples} or drop_last=False"
            )
        self._epoch = 0
        self._cursor = 0
        self._order_cache: tuple[int, torch.Tensor] | None = None
        # Set by DistributedLoader: it commits progress per *delivered* batch, because a
        # DataLoader with workers pulls indices ahead of what the training loop has consumed.
        self._external_progress = False

    # ---- order and layout ------------------------------------------------------------------
    def global_order(self, epoch: int) -> torch.Tensor:
        """Return the epoch's global sample order (int64, length ``num_samples``)."""
        return self._order(_as_int("epoch", epoch, 0)).clone()

    def _order(self, epoch: int) -> torch.Tensor:
        if self._order_cache is not None and self._order_cache[0] == epoch:
            return self._order_cache[1]
        own_order = getattr(self.source, "global_order", None)
        if self.shuffle and callable(own_order):
            order = own_order(self.seed, epoch)
            if not (
                isinstance(order, torch.Tensor)
                and order.dtype == torch.int64
                and order.shape == (self.num_samples,)
            ):
                raise UsageError(
                    f"{type(self.source).__name__}.global_order(seed, epoch) gave "
                    f"{getattr(order, 'dtype', type(order).__name__)} "
                    f"{tuple(getattr(order, 'shape', ()))}; expected an int64 tensor of shape "
                    f"({self.num_samples},), a permutation of range(len(dataset))"
                )
        elif self.shuffle:
            generator = torch.Generator().manual_seed(derive_seed(self.seed, epoch))
            order = torch.randperm(self.num_samples, generator=generator)
        else:
            order = torch.arange(self.num_samples)
        self._order_cache = (epoch, order)
        return order

    def _spans(self, rank: int, cursor: int) -> list[tuple[int, int, bool]]:
        """(start, stop, ends_step) global positions of ``rank``'s batches from ``cursor`` on."""
        big, micro = self.global_batch_size, self.batch_size
        per_rank = micro * self.accumulation_steps
        full_steps, rest = divmod(self.num_samples, big)
        spans: list[tuple[int, int, bool]] = []
        for step in range(cursor // big, full_steps):
            base = step * big + rank * per_rank
            for m in range(self.accumulation_steps):
                start = base + m * micro
                spans.append((start, start + micro, m == self.accumulation_steps - 1))
        if rest and not self.drop_last and cursor <= full_steps * big:
            share, extra = divmod(rest, self.world_size)
            start = full_steps * big + rank * share + min(rank, extra)
            stop = start + share + (1 if rank < extra else 0)
            for lo in range(start, stop, micro):
                spans.append((lo, min(lo + micro, stop), lo + micro >= stop))
        return spans

    def _progress_marks(self) -> list[tuple[int, int] | None]:
        """The (epoch, cursor) after each of this rank's remaining batches; None mid-step."""
        epoch, big = self._epoch, self.global_batch_size
        spans = self._spans(self.rank, self._cursor)
        marks: list[tuple[int, int] | None] = []
        for i, (start, _, ends_step) in enumerate(spans):
            if i == len(spans) - 1:
                marks.append((epoch + 1, 0))
            elif ends_step:
                marks.append((epoch, (start // big + 1) * big))
            else:
                marks.append(None)
        return marks

    def _commit(self, after: tuple[int, int] | None) -> None:
        if after is not None:
            self._epoch, self._cursor = after

    def _finish_pass(self, handed_out: int) -> None:
        # A pass with no batch for this rank still ends its epoch (an empty part, or a cursor
        # restored at the epoch's end); otherwise the last batch already moved the epoch on.
        if handed_out == 0:
            self._epoch, self._cursor = self._epoch + 1, 0

    # ---- Sampler protocol --------------------------------------------------------------------
    def __iter__(self) -> Iterator[list[int]]:
        # This rank's batches for the rest of the epoch, computed now: DataLoader workers may
        # pull from them later.
        order = self._order(self._epoch)
        spans = self._spans(self.rank, self._cursor)
        batches = [order[start:stop].tolist() for start, stop, _ in spans]
        if self._external_progress:
            return iter(batches)
        return self._committing(batches, self._progress_marks())

    def _committing(
        self, batches: list[list[int]], marks: list[tuple[int, int] | None]
    ) -> Iterator[list[int]]:
        for indices, after in zip(batches, marks, strict=True):
            self._commit(after)  # before the yield: the batch is handed out now
            yield indices
        self._finish_pass(len(batches))

    def __len__(self) -> int:
        """This rank's number of batches left in this epoch (from the cursor)."""
        return len(self._spans(self.rank, self._cursor))

    def rank_num_batches(self) -> list[int]:
        """Batches every rank yields in the rest of this epoch (ranks may differ by the last).

        Example:
            >>> ShardSampler(5, global_batch_size=4, rank=0, world_size=4, shuffle=False
            ...              ).rank_num_batches()
            [2, 1, 1, 1]
        """
        return [len(self._spans(r, self._cursor)) for r in range(self.world_size)]

    # ---- checkpointing -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Return the portable progress: valid under any world size or accumulation."""
        state: dict[str, Any] = {
            "seed": self.seed,
            "epoch": self._epoch,
            "cursor": self._cursor,
            "num_samples": self.num_samples,
            "global_batch_size": self.global_batch_size,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }
        fingerprint = getattr(self.source, "data_fingerprint", None)
        if callable(fingerprint):
            state["files"] = fingerprint()
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Continue at the global sample where ``state`` stopped, whatever the world size.

        Raises:
            UsageError: ``state`` is not a sampler state, or its dataset size, global batch,
                shuffle or seed differ from this sampler's (each difference is named).

        Example:
            >>> a = ShardSampler(8, global_batch_size=4, rank=0, world_size=2); _ = next(iter(a))
            >>> b = ShardSampler(8, global_batch_size=4, rank=0, world_size=1)
            >>> b.load_state_dict(a.state_dict()); b.cursor
            4
        """
        if not isinstance(state, Mapping):
            raise UsageError(
                f"sampler state is a {type(state).__name__}; expected the dict returned by "
                "state_dict() with keys " + ", ".join(STATE_KEYS)
            )
        missing = [k for k in STATE_KEYS if k not in state]
        if missing:
            raise UsageError(
                f"sampler state lacks {missing} (has {sorted(state)}); expected the dict "
                "returned by ShardSampler.state_dict()"
            )
        check = getattr(self.source, "check_data_fingerprint", None)
        if "files" in state and callable(check):
            check(state["files"])  # before the sizes: it names the file that changed
        ours = self.state_dict()
        differ = [
            f"{key}: saved {state[key]!r}, now {ours[key]!r}"
            for key in ("num_samples", "global_batch_size", "shuffle", "seed")
            if state[key] != ours[key]
        ]
        if differ:
            raise UsageError(
                "cannot resume the data order: " + "; ".join(differ) + "; build the loader "
                "with the saved dataset, batch_size, shuffle and seed (world size may differ)"
            )
        epoch = _as_int("state['epoch']", state["epoch"], 0)
        cursor = _as_int("state['cursor']", state["cursor"], 0)
        if cursor % self.global_batch_size or cursor > self.num_samples:
            raise UsageError(
                f"state['cursor']={cursor} is not a whole number of global batches of "
                f"{self.global_batch_size} within {self.num_samples} samples; "
                "pass a state saved by ShardSampler.state_dict()"
            )
        if bool(state["drop_last"]) != self.drop_last:
            # Only the tail of each epoch changes; the cursor still means the same samples.
            log.warning(
                "resuming with drop_last=%s, saved with drop_last=%s",
                self.drop_last,
                state["drop_last"],
            )
        self._epoch, self._cursor = epoch, cursor
