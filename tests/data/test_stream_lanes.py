"""Shard lanes in one process (explicit rank and world size; multigpu.data.stream_lanes): a stream
with shards gives the same global batches at any world size, number of workers and accumulation;
each rank reads only its lanes' shards; a resume on another world size continues the order and
skips whole shards unread; uneven shards, changed shards and wrong ``lanes`` are said in one
line."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest
from torch.utils.data import IterableDataset

from multigpu.data import make_loader
from multigpu.data.stream_lanes import plan
from multigpu.data.stream_loader import StreamLoader
from multigpu.errors import DataError, UsageError


class Sharded(IterableDataset):  # type: ignore[type-arg]
    """Shards of ids, as a Hugging Face stream over files gives them (``n_shards``, ``shard``);
    every id read is appended to ``reads``."""

    def __init__(self, shards: list[list[int]], reads: list[int] | None = None) -> None:
        self.shards = shards
        self.reads = reads if reads is not None else []

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def shard(self, num_shards: int, index: int) -> Sharded:
        assert num_shards == len(self.shards)
        return Sharded([self.shards[index]], self.reads)

    def __iter__(self) -> Iterator[int]:
        for i in itertools.chain.from_iterable(self.shards):
            self.reads.append(i)
            yield i


def sizes(*counts: int) -> list[list[int]]:
    start = [0, *itertools.accumulate(counts)]
    return [list(range(a, b)) for a, b in itertools.pairwise(start)]


def loader(stream: Any, rank: int, world: int, **kw: Any) -> StreamLoader:
    kw.setdefault("buffer_size", 5)
    made = make_loader(stream, batch_size=8, rank=rank, world_size=world, seed=1, **kw)
    assert isinstance(made, StreamLoader)
    return made


def global_epochs(stream: Any, world: int, epochs: int = 2, **kw: Any) -> list[list[list[int]]]:
    """Each epoch's global batches, gathered from every rank's part of each step."""
    ranks = [loader(stream, r, world, **kw) for r in range(world)]
    out = []
    for _ in range(epochs):
        parts = [[b.tolist() for b in ld] for ld in ranks]
        k = ranks[0].accumulation_steps
        steps = len(parts[0]) // k
        out.append(
            [[i for p in parts for b in p[s * k : (s + 1) * k] for i in b] for s in range(steps)]
        )
    return out


def test_the_same_global_batches_at_any_world_size_workers_and_accumulation() -> None:
    stream = Sharded(sizes(*[20] * 8))
    one = global_epochs(stream, 1)
    assert loader(stream, 0, 1).lanes == 8
    assert len(one[0]) == 20 and sorted(i for b in one[0] for i in b) == list(range(160))
    assert one[0] != one[1]  # another shard order and windows each epoch
    for batch in one[0]:  # one sample from each lane, each lane a shard here
        assert len({i // 20 for i in batch}) == 8
    assert global_epochs(stream, 2) == one
    assert global_epochs(stream, 4) == one
    assert global_epochs(stream, 2, num_workers=2) == one
    assert global_epochs(stream, 2, accumulation_steps=2) == one
    assert global_epochs(stream, 1, shuffle=False, drop_last=True) != one


def test_each_rank_reads_only_its_lanes_shards() -> None:
    reads: list[int] = []
    stream = Sharded(sizes(*[20] * 8), reads)
    ranks = [loader(stream, r, 4) for r in range(4)]
    ranks[0]._counts()
    for ld in ranks[1:]:
        ld._shard_counts = ranks[0]._shard_counts  # counted once here (each rank 1/4 in a job)
    for ld in ranks:
        reads.clear()
        assert len(list(ld)) == 20
        assert sorted(reads) == sorted({i for i in reads}), "a record read twice"
        assert len(reads) == 40  # its 2 shards of 8, 1/4 of the data
        assert len({i // 20 for i in reads}) == 2


def test_three_ranks_share_the_lanes_at_their_boundaries_and_still_agree() -> None:
    stream = Sharded(sizes(*[16] * 4))  # 4 lanes; 3 ranks do not divide them
    make = {"lanes": 4}
    ranks = [
        make_loader(stream, batch_size=12, rank=r, world_size=3, seed=1, **make) for r in range(3)
    ]
    one = make_loader(stream, batch_size=12, rank=0, world_size=1, seed=1, **make)
    whole = [b.tolist() for b in one]
    parts = [[b.tolist() for b in ld] for ld in ranks]
    assert [[i for p in parts for i in p[s]] for s in range(len(whole))] == whole


def test_a_resume_on_another_world_size_continues_and_skips_whole_shards_unread() -> None:
    reads: list[int] = []
    stream = Sharded(sizes(*[20] * 8), reads)  # 4 lanes of 2 shards
    uninterrupted = global_epochs(stream, 1, lanes=4)[0]
    two = [loader(stream, r, 2, lanes=4) for r in range(2)]
    for ld in two:
        for _ in itertools.islice(iter(ld), 12):  # 12 steps of 20 in the epoch
            pass
    state = two[0].state_dict()
    assert state["cursor"] == 12 * 8 and state["lanes"] == 4 and state["shard_counts"] == [20] * 8
    resumed = loader(stream, 0, 1, lanes=4)
    resumed.load_state_dict(state)
    resumed._counts()
    reads.clear()
    rest = [b.tolist() for b in resumed]
    assert rest == uninterrupted[12:]
    # Each lane (2 shards of 20) resumes at its window: sample 12*2 = 24 is in window 4 (of 5
    # samples), which starts at record 20: its first shard is skipped unread.
    second = {run[1][0] for run in resumed._plan(0).lanes}  # type: ignore[union-attr]
    assert len(reads) == 4 * 20 and {i // 20 for i in reads} == second


def test_uneven_shards_are_read_whole_that_epoch_at_every_world_size(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stream = Sharded(sizes(100, 100, 10, 10))
    assert (
        plan([100, 100, 10, 10], lanes=4, global_batch_size=8, seed=1, epoch=0, shuffle=True)
        is None
    )
    one = global_epochs(stream, 1, epochs=1)
    seen = [i for b in one[0] for i in b]
    assert len(seen) == len(set(seen)) == 216  # 27 steps: only drop_last's 4 of 220 left out
    assert global_epochs(stream, 2, epochs=1) == one
    assert "too uneven to cut into 4 lanes" in caplog.text


def test_changed_shards_or_lanes_at_resume_are_said_in_one_line() -> None:
    ld = loader(Sharded(sizes(*[20] * 8)), 0, 1)
    next(iter(ld))
    state = ld.state_dict()
    changed = loader(Sharded(sizes(*[20] * 7, 19)), 0, 1)
    changed.load_state_dict(state)
    with pytest.raises(DataError, match="shard 7 of the stream Sharded holds 19 records, but 20"):
        next(iter(changed))
    with pytest.raises(UsageError, match="lanes: saved 8, now 1"):
        loader(Sharded(sizes(*[20] * 8)), 0, 1, lanes=1).load_state_dict(state)


@pytest.mark.parametrize(
    ("stream", "kw", "said"),
    [
        (Sharded(sizes(10)), {"lanes": 2}, "has no shards to read by"),
        (Sharded(sizes(*[5] * 4)), {"lanes": 5}, "more than the stream's 4 shards"),
        (Sharded(sizes(*[5] * 4)), {"lanes": 2, "drop_last": False}, "drop_last=False"),
    ],
)
def test_lanes_a_stream_cannot_give_are_refused(stream: Any, kw: dict[str, Any], said: str) -> None:
    with pytest.raises(UsageError, match=said):
        loader(stream, 0, 1, **kw)


def test_an_evaluation_loader_keeps_the_last_batch_and_reads_whole() -> None:
    ld = loader(Sharded(sizes(*[5] * 4)), 0, 1, shuffle=False)
    assert ld.lanes == 1 and [i for b in ld for i in b.tolist()] == list(range(20))


def test_replica_groups_run_the_lanes_batches_a_plain_run_deals() -> None:
    """Under --replicas (2 groups of 1 rank) each group reads every lane in its process: share
    j of each step is what rank j of a plain 2-rank run reads from its lanes."""
    from multigpu.replicas.shares import StreamSteps

    stream = Sharded(sizes(*[20] * 8))
    group_loader = loader(stream, 0, 1)
    steps = StreamSteps(group_loader, None, None, None, width=1, groups=2)  # type: ignore[arg-type]
    shares = []
    while group_loader.epoch == 0:
        shares.append([list(m) for j in (0, 1) for m in steps._micro_batches(j)])
        steps._advance()
    dealt = [[b.tolist() for b in loader(stream, r, 2)] for r in range(2)]
    assert shares == [[dealt[0][s], dealt[1][s]] for s in range(20)]


class BadRecord(Sharded):
    """Shard 2's fifth record cannot be read (as a truncated JSON line raises)."""

    def shard(self, num_shards: int, index: int) -> Sharded:
        return BadRecord([self.shards[index]], self.reads) if index == 2 else Sharded(
            [self.shards[index]], self.reads
        )  # fmt: skip

    def __iter__(self) -> Iterator[int]:
        for i in super().__iter__():
            if i == 2 * 20 + 5:
                raise ValueError("JSON parse error: Invalid encoding in string. in row 5")
            yield i


@pytest.mark.parametrize("lanes", [None, 1])
def test_a_bad_record_is_one_line_naming_where_it_is(lanes: int | None) -> None:
    ld = loader(BadRecord(sizes(*[20] * 4)), 0, 1, lanes=lanes, shuffle=False, drop_last=True)
    with pytest.raises(DataError) as caught:
        list(ld)
    where = "shard 2 of 4 of the stream BadRecord" if lanes is None else "the stream BadRecord"
    after = 5 if lanes is None else 45
    assert str(caught.value).startswith(
        f"{where}{' (epoch 0)' if lanes else ''}: reading failed after record {after}: "
        "ValueError: JSON parse error: Invalid encoding in string. in row 5; fix or remove"
    )
