"""A DataLoader worker's identity, hidden while a stream is read whole (``multigpu.torch_compat``).

- **The worker's info** (``torch.utils.data._utils.worker._worker_info``, the module global that
  ``torch.utils.data.get_worker_info()`` returns): a stream that splits itself among a
  DataLoader's workers when it sees one (Hugging Face ``datasets.IterableDataset`` does, by
  shard; torch's documentation shows the same for plain ``IterableDataset``s) would give each
  worker a different part. multigpu's stream loader reads the stream whole in every worker and
  keeps that worker's batches, so ``read_outside_worker`` sets it to None while the stream
  advances (and back between items: the rest of the worker still sees its info).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

T = TypeVar("T")


def read_outside_worker(iterable: Iterable[T]) -> Iterator[T]:
    """Iterate ``iterable`` as the main process would: ``get_worker_info()`` is None inside its
    ``__iter__`` and each ``__next__``, even in a DataLoader worker.

    Example:
        >>> list(read_outside_worker(range(3)))
        [0, 1, 2]
    """
    from torch.utils.data._utils import worker as torch_worker

    info = torch_worker._worker_info
    if info is None:  # the main process: nothing to hide
        yield from iterable
        return
    torch_worker._worker_info = None
    try:
        iterator = iter(iterable)
    finally:
        torch_worker._worker_info = info
    while True:
        torch_worker._worker_info = None
        try:
            item = next(iterator)
        except StopIteration:
            return
        finally:
            torch_worker._worker_info = info
        yield item
