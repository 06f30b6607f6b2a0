"""StreamLoader in one process (explicit rank and world size): ShardSampler's layout of a stream
read whole, the same global order at any world size and number of workers, resume across world
sizes, even batches, len, and the refusals; a Hugging Face stream as a plain one."""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import IterableDataset, TensorDataset

from multigpu.data import ShardSampler, make_loader
from multigpu.data.stream_loader import StreamLoader
from multigpu.errors import UsageError
from tests.data import stream_workers


class Numbers(IterableDataset):  # type: ignore[type-arg]
    """0..n-1 in order; counts its passes and the epochs it was told."""

    def __init__(self, n: int, length: bool = False) -> None:
        self.n, self.length, self.epochs = n, length, []  # type: ignore[var-annotated]

    def __iter__(self) -> Iterator[int]:
        return iter(range(self.n))

    def set_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)

    def __len__(self) -> int:
        if not self.length:
            raise TypeError("no length")
        return self.n


def loader(n: int, batch: int, rank: int, world: int, **kw: Any) -> StreamLoader:
    made = make_loader(Numbers(n), batch_size=batch, rank=rank, world_size=world, **kw)
    assert isinstance(made, StreamLoader)
    return made


def global_steps(per_rank: list[list[list[int]]]) -> list[list[int]]:
    steps = max(len(b) for b in per_rank)
    return [[i for b in per_rank if s < len(b) for i in b[s]] for s in range(steps)]


def epoch_of(world: int, workers: int = 0, **kw: Any) -> list[list[int]]:
    ranks = [loader(50, 6, r, world, num_workers=workers, **kw) for r in range(world)]
    return global_steps([[b.tolist() for b in ld] for ld in ranks])


@pytest.mark.parametrize(
    ("n", "batch", "world", "accumulation", "drop_last"),
    [
        c
        for c in itertools.product((5, 13, 24), (4, 8), (1, 2, 4), (1, 2), (True, False))
        if c[1] % (c[2] * c[3]) == 0
    ],
)
def test_a_stream_is_dealt_as_shard_sampler_deals_its_indices(
    n: int, batch: int, world: int, accumulation: int, drop_last: bool
) -> None:
    for rank in range(world):
        try:
            expected = list(
                ShardSampler(
                    n,
                    global_batch_size=batch,
                    rank=rank,
                    world_size=world,
                    shuffle=False,
                    drop_last=drop_last,
                    accumulation_steps=accumulation,
                )
            )
        except UsageError:  # fewer samples than a batch with drop_last: an empty epoch
            expected = []
        ld = loader(
            n,
            batch,
            rank,
            world,
            shuffle=False,
            drop_last=drop_last,
            accumulation_steps=accumulation,
        )
        ends = []
        got = []
        for b in ld:
            got.append(b.tolist())
            ends.append(ld.ends_step)
        assert got == expected
        assert ends == [(i + 1) % accumulation == 0 or i == len(got) - 1 for i in range(len(got))]
        assert ld.epoch == 1 and ld.cursor == 0


def test_the_global_order_is_the_same_at_any_world_size_and_number_of_workers() -> None:
    one = epoch_of(1)
    assert len(one) == 8 and all(len(step) == 6 for step in one)  # 50 = 8·6 + 2 dropped
    assert len({i for step in one for i in step}) == 48  # each sample once
    assert [i for step in one for i in step] != list(range(48))  # shuffled
    for world, workers in ((2, 0), (3, 0), (1, 2), (2, 2)):
        assert epoch_of(world, workers) == one, (world, workers)
    assert epoch_of(2, seed=1) != one  # the seed changes it
    # The shuffle buffer mixes within its reach only: a buffer of 1 keeps the stream's order.
    assert [i for s in epoch_of(2, buffer_size=1) for i in s] == list(range(48))


def test_each_epoch_is_reshuffled_and_the_stream_told_its_epoch() -> None:
    ld = loader(30, 6, 0, 1)
    stream = ld.stream
    first, second = ([b.tolist() for b in ld] for _ in range(2))
    assert first != second and ld.epoch == 2
    assert stream.epochs == [0, 1]


def test_resuming_on_another_world_size_and_workers_continues_at_the_same_sample() -> None:
    whole = [i for step in epoch_of(1) for i in step]
    two = [loader(50, 6, r, 2) for r in range(2)]
    before: list[list[list[int]]] = [[], []]
    for r, ld in enumerate(two):
        for b in ld:
            before[r].append(b.tolist())
            if len(before[r]) == 3:
                break
    state = two[0].state_dict()
    assert state == two[1].state_dict()  # one portable state
    assert (state["epoch"], state["cursor"]) == (0, 18)
    done = [i for step in global_steps(before) for i in step]
    for world, workers in ((1, 0), (3, 2)):
        resumed = [loader(50, 6, r, world, num_workers=workers) for r in range(world)]
        for ld in resumed:
            ld.load_state_dict(state)
        after = global_steps([[b.tolist() for b in ld] for ld in resumed])
        assert done + [i for step in after for i in step] == whole
        assert all(ld.epoch == 1 and ld.cursor == 0 for ld in resumed)


def test_a_step_abandoned_between_its_micro_batches_starts_again() -> None:
    ld = loader(24, 8, 0, 2, shuffle=False, accumulation_steps=2)
    it = iter(ld)
    assert next(it).tolist() == [0, 1] and next(it).tolist() == [2, 3]
    assert ld.cursor == 8 and ld.ends_step
    assert next(it).tolist() == [8, 9] and not ld.ends_step
    it.close()
    assert ld.state_dict()["cursor"] == 8
    assert [b.tolist() for b in ld] == [[8, 9], [10, 11], [16, 17], [18, 19]]


def test_even_batches_give_the_ranks_a_batch_short_an_empty_one() -> None:
    counts = []
    for rank in range(4):
        ld = loader(13, 4, rank, 4, shuffle=False, even_batches=True)
        batches = [b.tolist() for b in ld]
        counts.append(len(batches))
        assert sum(len(b) for b in batches) == (4 if rank == 0 else 3)
        if rank:
            assert batches[-1] == []  # nothing duplicated
    assert counts == [4, 4, 4, 4]


def test_len_where_the_stream_has_one_and_a_clear_type_error_where_not() -> None:
    ld = make_loader(Numbers(13, length=True), batch_size=4, rank=1, world_size=4, shuffle=False)
    assert len(ld) == 3 and len([b for b in ld]) == 3
    ld = loader(13, 4, 1, 4, shuffle=False)
    with pytest.raises(TypeError, match="has no __len__: its batches are known only at its end"):
        len(ld)
    assert len(list(ld)) == 3  # list() asks for a length hint and goes on without one


def test_said_once_on_rank_0_only(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="multigpu.data.stream_loader"):
        for rank in (0, 1, 0):
            loader(10, 4, rank, 2)
    said = [r.getMessage() for r in caplog.records if "read whole" in r.getMessage()]
    assert said in (
        [
            "the stream Numbers is read whole by each of the 2 ranks (it has no shards multigpu "
            "can split); RecordFiles(...) reads only each rank's share of files"
        ],
        [],  # said already by an earlier test of this process (warn_once)
    )


def test_refusals_in_one_line() -> None:
    with pytest.raises(UsageError, match="persistent_workers=True was given for the stream"):
        loader(10, 4, 0, 1, num_workers=1, persistent_workers=True)
    with pytest.raises(UsageError, match=r"\['sampler'\] were given"):
        loader(10, 4, 0, 1, sampler=[0])
    with pytest.raises(UsageError, match="not divisible by world_size=3"):
        loader(10, 4, 0, 3)
    ld = loader(10, 4, 0, 1)
    with pytest.raises(UsageError, match="buffer_size: saved 1000, now 8"):
        loader(10, 4, 0, 1, buffer_size=8).load_state_dict(ld.state_dict())
    sampler_state = ShardSampler(10, global_batch_size=4, rank=0, world_size=1).state_dict()
    with pytest.raises(UsageError, match=r"\(a map-style loader's\) lacks \['buffer_size'\]"):
        ld.load_state_dict(sampler_state)
    with pytest.raises(UsageError, match="IterableDataset"):
        StreamLoader(TensorDataset(torch.arange(3)), batch_size=1, rank=0, world_size=1)


def test_a_plain_iterable_without_len_is_refused_saying_what_would_do() -> None:
    with pytest.raises(UsageError, match="or a stream: a torch.utils.data.IterableDataset"):
        make_loader(iter(range(3)), batch_size=1, rank=0, world_size=1)


# ---- Hugging Face datasets ------------------------------------------------------------------


@pytest.fixture
def shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    pytest.importorskip("datasets")
    for name, value in stream_workers.HF_ENV.items():
        monkeypatch.setenv(name, value)
    return stream_workers.write_shards(tmp_path, 4, 7)


def ids(
    stream: Any, rank: int, world: int, workers: int, epochs: int = 2, **kw: Any
) -> list[list[int]]:
    ld = make_loader(
        stream,
        batch_size=4,
        rank=rank,
        world_size=world,
        num_workers=workers,
        buffer_size=5,
        seed=3,
        **kw,
    )
    return [[i for b in ld for i in b["id"].tolist()] for _ in range(epochs)]


@pytest.mark.parametrize("lanes", [None, 1])
def test_a_hugging_face_stream_gives_the_same_batches_to_any_ranks_and_workers(
    shards: list[str], lanes: int | None
) -> None:
    """By lanes (the default: its 4 shards in 4 lanes, each rank of 2 reading 2 of them) or read
    whole by every worker and rank (lanes=1): the same global batches either way."""
    hf = stream_workers.make_stream("hf", shards)
    one = ids(hf, 0, 1, 0, lanes=lanes)
    assert len(one[0]) == 28 and sorted(one[0]) == list(range(28))  # 28 = 7 · 4: none dropped
    assert one[0] != one[1]
    # Its own worker split would give each of 2 workers 2 of the 4 shards: bypassed.
    assert ids(hf, 0, 1, 2, lanes=lanes) == one
    two = [ids(hf, r, 2, w, lanes=lanes) for r, w in ((0, 0), (1, 2))]
    for epoch in range(2):
        steps = global_steps([[r[epoch][i : i + 2] for i in range(0, 14, 2)] for r in two])
        assert [i for s in steps for i in s] == one[epoch]
    if lanes == 1:
        # Epoch 0: the same order as the plain stream over the same files (HF reorders its
        # shards by itself from epoch 1, told the epoch by set_epoch).
        plain = stream_workers.make_stream("plain", shards)
        assert ids(plain, 0, 1, 0, epochs=1)[0] == one[0]
    else:  # each batch takes one sample from each lane: a shard (7 records) each
        assert all(len({i // 7 for i in one[0][a : a + 4]}) == 4 for a in range(0, 28, 4))


def test_a_hugging_face_stream_shuffled_without_a_seed_or_split_by_node_is_refused(
    shards: list[str],
) -> None:
    hf = stream_workers.make_stream("hf", shards)
    with pytest.raises(UsageError, match="shuffles with a generator made without a seed"):
        make_loader(hf.shuffle(buffer_size=4), batch_size=4, rank=0, world_size=1)
    from datasets.distributed import split_dataset_by_node

    split = split_dataset_by_node(hf, rank=0, world_size=2)
    with pytest.raises(UsageError, match="was split by split_dataset_by_node"):
        make_loader(split, batch_size=4, rank=0, world_size=2)
    seeded = make_loader(hf.shuffle(seed=1, buffer_size=4), batch_size=4, rank=0, world_size=1)
    assert sorted(i for b in seeded for i in b["id"].tolist()) == list(range(28))


def test_a_checkpoint_keeps_it_as_a_loader() -> None:
    from multigpu.checkpoint.native.objects import epoch_of, kind_of

    ld = loader(10, 4, 0, 1)
    list(ld)
    assert kind_of(ld) == "loader" and epoch_of({"data": ld}) == 1


def test_replica_groups_run_the_shares_a_plain_run_of_as_many_ranks_deals() -> None:
    """Under --replicas (2 groups of 1 rank, accumulation 2) a stream's share j of each step
    holds what rank j of a plain 2-rank run gets at that step; run again after a failed step or
    after a heal that moved the position back, the step holds the same samples."""
    from multigpu.replicas.shares import StreamSteps

    def plain(rank: int) -> list[list[int]]:
        ld = loader(40, 8, rank, 2, shuffle=True, seed=3, buffer_size=5, accumulation_steps=2)
        return [b.tolist() for b in ld]

    group_loader = loader(40, 8, 0, 1, shuffle=True, seed=3, buffer_size=5, accumulation_steps=2)
    steps = StreamSteps(group_loader, None, None, None, width=1, groups=2)  # type: ignore[arg-type]
    shares = []
    while group_loader.epoch == 0:
        shares.append([list(m) for j in (0, 1) for m in steps._micro_batches(j)])
        steps._advance()
    dealt = [plain(0), plain(1)]
    assert len(shares) == 5 and group_loader.epoch == 1
    for s, share in enumerate(shares):
        assert share == [*dealt[0][2 * s : 2 * s + 2], *dealt[1][2 * s : 2 * s + 2]]
    group_loader.load_state_dict({**group_loader.state_dict(), "epoch": 0, "cursor": 16})
    again = [list(m) for j in (0, 1) for m in steps._micro_batches(j)]
    assert again == shares[2]
