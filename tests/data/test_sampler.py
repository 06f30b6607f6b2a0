"""ShardSampler: disjoint shards, world-size invariance, layout, cursor, resume, bad inputs."""

from __future__ import annotations

import itertools
import re

import pytest
import torch

from multigpu.data import ShardSampler
from multigpu.errors import UsageError


def samplers(n: int, batch: int, world: int, **kwargs: object) -> list[ShardSampler]:
    return [
        ShardSampler(n, global_batch_size=batch, rank=r, world_size=world, **kwargs)  # type: ignore[arg-type]
        for r in range(world)
    ]


def one_epoch(n: int, batch: int, world: int, **kwargs: object) -> list[list[list[int]]]:
    """Per rank, the list of batches of epoch 0."""
    return [list(s) for s in samplers(n, batch, world, **kwargs)]


def by_step(per_rank: list[list[list[int]]]) -> list[list[int]]:
    """Concatenate, for each step, the ranks' batches in rank order (k=1)."""
    steps = max(len(b) for b in per_rank)
    return [[i for b in per_rank if s < len(b) for i in b[s]] for s in range(steps)]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("n", [24, 29])
@pytest.mark.parametrize("shuffle", [True, False])
@pytest.mark.parametrize("drop_last", [True, False])
def test_ranks_are_disjoint_and_cover_the_epoch(
    world: int, n: int, shuffle: bool, drop_last: bool
) -> None:
    batch = 12
    per_rank = one_epoch(n, batch, world, shuffle=shuffle, drop_last=drop_last, seed=3)
    seen = [i for batches in per_rank for b in batches for i in b]
    assert len(seen) == len(set(seen)), "a sample was given twice"
    order = samplers(n, batch, 1, shuffle=shuffle, seed=3)[0].global_order(0).tolist()
    expected = order[: (n // batch) * batch] if drop_last else order
    assert sorted(seen) == sorted(expected)
    assert all(len(b) > 0 for batches in per_rank for b in batches)


@pytest.mark.parametrize("world", [2, 3, 4])
@pytest.mark.parametrize("drop_last", [True, False])
def test_global_batches_do_not_depend_on_world_size(world: int, drop_last: bool) -> None:
    n, batch = 50, 12
    single = one_epoch(n, batch, 1, drop_last=drop_last, seed=11)[0]
    assert by_step(one_epoch(n, batch, world, drop_last=drop_last, seed=11)) == single
    assert len(single) == (4 if drop_last else 5)


def test_order_depends_on_seed_and_epoch_only() -> None:
    a = ShardSampler(100, global_batch_size=4, rank=0, world_size=1, seed=5)
    b = ShardSampler(100, global_batch_size=4, rank=3, world_size=4, seed=5)
    assert torch.equal(a.global_order(2), b.global_order(2))
    assert not torch.equal(a.global_order(0), a.global_order(1))
    c = ShardSampler(100, global_batch_size=4, rank=0, world_size=1, seed=6)
    assert not torch.equal(a.global_order(0), c.global_order(0))
    assert sorted(a.global_order(0).tolist()) == list(range(100))


def test_epoch_advances_by_itself_and_reshuffles() -> None:
    s = ShardSampler(40, global_batch_size=8, rank=1, world_size=2)
    first, second = list(s), list(s)
    assert s.epoch == 2
    assert first != second
    assert [i for b in first for i in b] == s.global_order(0).view(5, 8)[:, 4:].flatten().tolist()


def test_unshuffled_gives_every_sample_once_with_uneven_last_batches() -> None:
    per_rank = one_epoch(10, 8, 4, shuffle=False)
    assert per_rank == [[[0, 1], [8]], [[2, 3], [9]], [[4, 5]], [[6, 7]]]
    s = samplers(10, 8, 4, shuffle=False)[2]
    assert s.rank_num_batches() == [2, 2, 1, 1]
    # Parts differ by at most one; with W=3 and 7 left over: 3, 2, 2.
    per_rank = one_epoch(7, 9, 3, shuffle=False)
    assert [sum(len(b) for b in batches) for batches in per_rank] == [3, 2, 2]
    assert [i for batches in per_rank for b in batches for i in b] == list(range(7))


def test_shuffle_false_keeps_the_tail_and_shuffle_true_drops_it_by_default() -> None:
    assert (
        ShardSampler(10, global_batch_size=4, rank=0, world_size=1, shuffle=False).drop_last
        is False
    )
    train = ShardSampler(10, global_batch_size=4, rank=0, world_size=1)
    assert train.drop_last is True and len(train) == 2


def test_accumulation_layout_is_rank_major() -> None:
    n, batch = 32, 8
    accum = one_epoch(n, batch, 2, accumulation_steps=2, seed=1)
    order = samplers(n, batch, 1, seed=1)[0].global_order(0).tolist()
    for r, s, m in itertools.product(range(2), range(4), range(2)):
        start = s * 8 + r * 4 + m * 2
        assert accum[r][s * 2 + m] == order[start : start + 2]
    # 2 ranks × 2 micro-steps see what 4 ranks without accumulation see.
    four = one_epoch(n, batch, 4, seed=1)
    assert [accum[v // 2][s * 2 + v % 2] for s in range(4) for v in range(4)] == [
        four[v][s] for s in range(4) for v in range(4)
    ]


def test_accumulation_tail_is_cut_into_micro_batches() -> None:
    per_rank = one_epoch(13, 8, 2, shuffle=False, accumulation_steps=2)
    # 5 left over: rank 0 gets 8..10 as [8, 9] + [10], rank 1 gets 11..12 as one micro-batch.
    assert per_rank[0] == [[0, 1], [2, 3], [8, 9], [10]]
    assert per_rank[1] == [[4, 5], [6, 7], [11, 12]]


def test_cursor_counts_a_step_when_its_last_micro_batch_is_handed_out() -> None:
    s = ShardSampler(24, global_batch_size=8, rank=0, world_size=2, accumulation_steps=2)
    states = []
    for _ in s:
        states.append((s.epoch, s.cursor))
    assert states == [(0, 0), (0, 8), (0, 8), (0, 16), (0, 16), (1, 0)]


def test_len_is_what_is_left_of_the_epoch() -> None:
    s = ShardSampler(20, global_batch_size=4, rank=0, world_size=2)
    it = iter(s)
    assert len(s) == 5
    next(it)
    assert len(s) == 4
    assert len(list(it)) == 4 and len(s) == 5 and s.epoch == 1


def test_set_epoch_keeps_the_cursor_of_the_current_epoch() -> None:
    s = ShardSampler(20, global_batch_size=4, rank=0, world_size=1)
    next(iter(s))
    s.set_epoch(0)
    assert s.cursor == 4
    s.set_epoch(3)
    assert (s.epoch, s.cursor) == (3, 0)


def consume(sampler: ShardSampler, steps: int) -> list[int]:
    it = iter(sampler)
    return [i for _ in range(steps * sampler.accumulation_steps) for i in next(it)]


@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 3), (3, 2)])
@pytest.mark.parametrize("drop_last", [True, False])
def test_resume_under_another_world_size_continues_at_the_same_sample(
    before: int, after: int, drop_last: bool
) -> None:
    n, batch = 40, 6
    old = samplers(n, batch, before, seed=9, drop_last=drop_last)
    done = [i for s in old for i in consume(s, 3)]
    state = old[0].state_dict()
    assert state == {
        "seed": 9,
        "epoch": 0,
        "cursor": 18,
        "num_samples": n,
        "global_batch_size": batch,
        "shuffle": True,
        "drop_last": drop_last,
    }
    new = samplers(n, batch, after, seed=9, drop_last=drop_last, accumulation_steps=1)
    for s in new:
        s.load_state_dict(state)
    rest = [i for s in new for b in s for i in b]
    order = new[0].global_order(0).tolist()
    assert sorted(done) == sorted(order[:18])
    assert sorted(done + rest) == sorted(order[: 36 if drop_last else 40])
    assert all(s.epoch == 1 for s in new)


def test_state_saved_after_the_last_step_starts_the_next_epoch() -> None:
    s = ShardSampler(12, global_batch_size=4, rank=0, world_size=2)
    list(s)
    t = ShardSampler(12, global_batch_size=4, rank=1, world_size=2)
    t.load_state_dict(s.state_dict())
    assert (t.epoch, t.cursor, len(t)) == (1, 0, 3)


def test_load_state_dict_names_what_differs() -> None:
    state = ShardSampler(12, global_batch_size=4, rank=0, world_size=1).state_dict()
    other = ShardSampler(13, global_batch_size=6, rank=0, world_size=2, seed=1)
    with pytest.raises(UsageError, match="num_samples: saved 12, now 13.*global_batch_size.*seed"):
        other.load_state_dict(state)
    with pytest.raises(UsageError, match=r"lacks \['cursor'\]"):
        other.load_state_dict({k: v for k, v in state.items() if k != "cursor"})
    same = ShardSampler(12, global_batch_size=4, rank=0, world_size=1)
    with pytest.raises(UsageError, match="cursor.*whole number"):
        same.load_state_dict({**state, "cursor": 5})
    with pytest.raises(UsageError, match="shuffle: saved True, now False"):
        ShardSampler(12, global_batch_size=4, rank=0, world_size=1, shuffle=False).load_state_dict(
            state
        )


def test_batch_not_divisible_says_how_to_fix_it() -> None:
    message = (
        "batch_size=10 is not divisible by world_size=3 × accumulation_steps=1: the per-rank "
        "batch would be 3.33; use a multiple of 3, e.g. 9 or 12"
    )
    with pytest.raises(UsageError, match=re.escape(message)):
        ShardSampler(100, global_batch_size=10, rank=0, world_size=3)
    with pytest.raises(UsageError, match=r"would be 0\.50; use a multiple of 4, e.g. 4$"):
        ShardSampler(100, global_batch_size=2, rank=0, world_size=2, accumulation_steps=2)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"global_batch_size": 0}, r"batch_size=0 is too small"),
        ({"global_batch_size": -4}, r"batch_size=-4 is too small"),
        ({"global_batch_size": 4.0}, r"batch_size=4.0 is a float"),
        ({"rank": 2}, r"rank=2 is out of range for world_size=2"),
        ({"rank": -1}, r"rank=-1 is too small"),
        ({"world_size": 0}, r"world_size=0 is too small"),
        ({"accumulation_steps": 0}, r"accumulation_steps=0 is too small"),
        ({"seed": True}, r"seed=True is a bool"),
        ({"num_samples": 0}, r"num_samples=0 is too small"),
        ({"num_samples": 3}, r"larger than the dataset \(3 samples\) with drop_last=True"),
    ],
)
def test_bad_inputs_raise_usage_errors(kwargs: dict[str, object], match: str) -> None:
    args: dict[str, object] = {
        "num_samples": 20,
        "global_batch_size": 4,
        "rank": 0,
        "world_size": 2,
    }
    args.update(kwargs)
    with pytest.raises(UsageError, match=match):
        ShardSampler(**args)  # type: ignore[arg-type]
