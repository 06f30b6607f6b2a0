"""Canary of ``multigpu.torch_compat.dataloader``: the module global behind
``get_worker_info()``. It fails when a torch release moves or renames it."""

from __future__ import annotations

from collections.abc import Iterator

from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from multigpu import torch_compat


class SeesWorker(IterableDataset):  # type: ignore[type-arg]
    """Yields, per item, whether the stream saw a worker's info (at __iter__ and each next)."""

    def __iter__(self) -> Iterator[tuple[bool, bool]]:
        at_start = get_worker_info() is not None
        for _ in range(3):
            yield at_start, get_worker_info() is not None


class Reads(IterableDataset):  # type: ignore[type-arg]
    """In a worker: what ``SeesWorker`` saw through ``read_outside_worker``, and whether the
    worker still sees its own info between items."""

    def __iter__(self) -> Iterator[tuple[bool, bool, bool]]:
        for seen in torch_compat.read_outside_worker(SeesWorker()):
            yield (*seen, get_worker_info() is not None)


def test_a_stream_read_outside_the_worker_sees_no_worker_info_and_the_worker_still_does() -> None:
    direct = list(DataLoader(SeesWorker(), batch_size=None, num_workers=1))
    assert all(a and b for a, b in direct)  # torch's worker info is there to hide
    hidden = list(DataLoader(Reads(), batch_size=None, num_workers=1))
    assert len(hidden) == 3
    assert all(not a and not b and worker for a, b, worker in hidden)
