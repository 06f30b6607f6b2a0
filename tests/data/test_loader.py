"""DistributedLoader / make_loader: epochs, resume, devices, workers, errors, 2 real processes."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch.utils.data import Dataset, IterableDataset, TensorDataset

from multigpu.data import DistributedLoader, ShardSampler, StreamLoader, make_loader
from multigpu.errors import UsageError
from multigpu.testing import run_distributed
from tests.data import workers


def indices(n: int = 40) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def flat(batches: list[Any]) -> list[int]:
    return [i for b in batches for i in b[0].tolist()]


class RandomItems(Dataset[torch.Tensor]):
    """Each item is a fresh random number: shows which RNG state produced it."""

    def __len__(self) -> int:
        return 16

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.rand(())


def test_iterating_twice_runs_two_reshuffled_epochs_without_set_epoch() -> None:
    loader = make_loader(indices(), batch_size=8, rank=0, world_size=2, seed=1)
    assert (loader.epoch, len(loader), loader.batch_size, loader.global_batch_size) == (0, 5, 4, 8)
    first, second = flat(list(loader)), flat(list(loader))
    assert loader.epoch == 2
    assert first != second
    order = loader.sampler.global_order(1).view(5, 8)[:, :4].flatten().tolist()
    assert second == order


def test_an_abandoned_pass_goes_on_from_the_cursor() -> None:
    loader = make_loader(indices(), batch_size=8, rank=1, world_size=2, seed=2)
    head = []
    for batch in loader:
        head.append(batch)
        if len(head) == 2:
            break
    assert (loader.epoch, loader.state_dict()["cursor"], len(loader)) == (0, 16, 3)
    rest = list(loader)
    whole = make_loader(indices(), batch_size=8, rank=1, world_size=2, seed=2)
    assert flat(head + rest) == flat(list(whole))
    assert loader.epoch == 1


def test_state_dict_resumes_a_two_rank_run_on_one_rank() -> None:
    ranks = [make_loader(indices(), batch_size=8, rank=r, world_size=2, seed=4) for r in (0, 1)]
    done = []
    for loader in ranks:
        it = iter(loader)
        done += flat([next(it), next(it)])
    state = ranks[0].state_dict()
    single = make_loader(indices(), batch_size=8, rank=0, world_size=1, seed=4)
    single.load_state_dict(state)
    rest = flat(list(single))
    order = single.sampler.global_order(0).tolist()
    assert sorted(done) == sorted(order[:16]) and rest == order[16:40]


def test_batches_are_moved_to_the_device() -> None:
    loader = make_loader(indices(8), batch_size=4, rank=0, world_size=1, device="meta")
    batches = list(loader)
    assert len(batches) == 2 and all(b[0].device.type == "meta" for b in batches)
    plain = make_loader(indices(8), batch_size=4, rank=0, world_size=1)
    assert next(iter(plain))[0].device.type == "cpu"


def test_dataloader_options_pass_through() -> None:
    def collate(items: list[tuple[torch.Tensor]]) -> list[int]:
        return [int(x[0]) for x in items]

    loader = make_loader(
        indices(10), batch_size=4, rank=0, world_size=2, shuffle=False, collate_fn=collate
    )
    assert list(loader) == [[0, 1], [4, 5], [8]]


def test_worker_prefetch_does_not_move_the_cursor() -> None:
    loader = make_loader(
        indices(), batch_size=4, rank=0, world_size=1, num_workers=2, prefetch_factor=4
    )
    it = iter(loader)
    next(it)
    assert loader.state_dict()["cursor"] == 4
    next(it)
    assert loader.state_dict()["cursor"] == 8
    del it


def test_persistent_workers_resume_an_abandoned_pass() -> None:
    loader = make_loader(
        indices(), batch_size=8, rank=0, world_size=2, num_workers=2, persistent_workers=True
    )
    first = flat(list(loader))
    it = iter(loader)
    head = flat([next(it)])
    del it
    rest = flat(list(loader))
    orders = [loader.sampler.global_order(e).view(5, 8)[:, :4].flatten().tolist() for e in (0, 1)]
    assert (first, head + rest, loader.epoch) == (orders[0], orders[1], 2)


def worker_draws(rank: int, seed: int, epochs: int = 2) -> list[list[float]]:
    loader = make_loader(
        RandomItems(), batch_size=8, rank=rank, world_size=2, seed=seed, num_workers=2
    )
    return [[float(x) for b in loader for x in b] for _ in range(epochs)]


def test_worker_randomness_follows_seed_epoch_and_rank() -> None:
    torch.manual_seed(123)  # the parent's RNG must not matter
    a = worker_draws(rank=0, seed=5)
    torch.manual_seed(456)
    assert worker_draws(rank=0, seed=5) == a
    assert a[0] != a[1], "epochs should draw differently"
    assert worker_draws(rank=1, seed=5, epochs=1)[0] != a[0], "ranks should draw differently"


class NoLength(Dataset[int]):
    def __getitem__(self, index: int) -> int:
        return index


class Stream(IterableDataset[int]):
    def __iter__(self) -> Any:
        return iter(range(4))


@pytest.mark.parametrize(
    ("dataset", "kwargs", "match"),
    [
        (NoLength(), {}, r"dataset \(NoLength\) has no __len__"),
        (indices(), {"batch_size": 0}, r"batch_size=0 is too small"),
        (indices(), {"batch_size": 10, "world_size": 3}, r"not divisible by world_size=3"),
        (indices(), {"sampler": [0]}, r"\['sampler'\] were given, but multigpu owns sharding"),
        (indices(), {"batch_sampler": [[0]]}, r"\['batch_sampler'\]"),
        (indices(), {"generator": torch.Generator()}, r"\['generator'\]"),
        (indices(), {"in_order": False}, r"in_order=False was given"),
        (indices(), {"num_wokers": 2}, r"DataLoader rejected the options \['num_wokers'\]"),
        (indices(), {"prefetch_factor": 2}, r"DataLoader rejected the options"),
    ],
)
def test_make_loader_rejects_bad_input(dataset: Any, kwargs: dict[str, Any], match: str) -> None:
    args: dict[str, Any] = {"batch_size": 8, "rank": 0, "world_size": 2}
    args.update(kwargs)
    with pytest.raises(UsageError, match=match):
        make_loader(dataset, **args)


def test_a_stream_goes_to_a_stream_loader_not_to_a_distributed_loader() -> None:
    assert isinstance(make_loader(Stream(), batch_size=2, rank=0, world_size=1), StreamLoader)
    sampler = ShardSampler(4, global_batch_size=2, rank=0, world_size=1)
    with pytest.raises(UsageError, match=r"IterableDataset \(Stream\).*give the stream to make"):
        DistributedLoader(Stream(), sampler)


def test_shuffle_inside_dataloader_kwargs_is_rejected() -> None:
    with pytest.raises(UsageError, match=r"\['shuffle'\]"):
        DistributedLoader(
            indices(), ShardSampler(40, global_batch_size=8, rank=0, world_size=2), shuffle=True
        )


def test_sampler_and_dataset_sizes_must_match() -> None:
    with pytest.raises(UsageError, match="dataset has 40 samples but the sampler was built for 41"):
        DistributedLoader(indices(), ShardSampler(41, global_batch_size=8, rank=0, world_size=2))


@pytest.mark.parametrize("shuffle", [True, False])
def test_two_real_processes_split_each_epoch(shuffle: bool) -> None:
    n, batch = 23, 4
    rank0, rank1 = run_distributed(
        workers.two_epochs, world_size=2, args=(n, batch, shuffle), timeout=120
    )
    reference = ShardSampler(
        n, global_batch_size=batch, rank=0, world_size=1, shuffle=shuffle, seed=7
    )
    for epoch in range(2):
        a = [i for b in rank0[epoch] for i in b]
        b = [i for b in rank1[epoch] for i in b]
        assert not set(a) & set(b)
        expected = reference.global_order(epoch).tolist()[: 20 if shuffle else 23]
        assert sorted(a + b) == sorted(expected)
        assert all(len(x) == 2 for x in rank0[epoch][:5] + rank1[epoch][:5])
    assert (rank0[0] != rank0[1]) == shuffle
