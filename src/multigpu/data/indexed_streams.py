"""Streaming datasets that split themselves by rank — litdata's and MosaicML Streaming's
``StreamingDataset`` — read as the map-style datasets they also are.

Iterated, each of them yields only the calling rank's part (it looks the rank up in
``torch.distributed`` or the environment). Read "whole" on every rank, as a ``StreamLoader`` reads
a stream, each rank would get another stream, and the ranks would train on different global
batches with nothing said. Both also give random access (``__len__``, and ``__getitem__`` reading
the chunk that holds a sample), so ``make_loader`` deals them by index through ``IndexedView``:
the same global batches at any world size and any number of loader workers, a cursor that
resumes on any world size, replica heal. Each rank reads only the chunks that hold its samples
(a remote dataset's chunks come to its local cache as they are needed).

Their ``len()`` is the rank's part too, so the view counts the whole dataset: litdata's from its
``region_of_interest`` (each chunk's range of samples), MosaicML's from ``num_samples``.
Recognised by class (a ``StreamingDataset`` defined in the ``litdata`` or ``streaming`` package,
or a subclass), so neither package is imported here. litdata's is tested here; MosaicML's
package cannot be installed beside ``transformers`` 5 (it pins ``transformers<5``) and is not.
"""

from __future__ import annotations

from typing import Any

from torch.utils.data import Dataset

PACKAGES = ("litdata", "streaming")


def splits_itself(dataset: Any) -> bool:
    """Whether ``dataset`` is a litdata or MosaicML ``StreamingDataset`` (or a subclass).

    Example:
        >>> splits_itself(range(3))
        False
    """
    return any(
        cls.__name__ == "StreamingDataset" and cls.__module__.split(".")[0] in PACKAGES
        for cls in type(dataset).__mro__
    )


def whole_length(dataset: Any) -> int:
    """The samples of the whole dataset, not of the calling rank's part.

    Example:
        >>> whole_length([1, 2, 3])
        3
    """
    chunks = getattr(dataset, "region_of_interest", None)  # litdata: (start, end) per chunk
    if chunks is not None:
        return sum(end - start for start, end in chunks)
    samples = getattr(dataset, "num_samples", None)  # MosaicML Streaming
    if isinstance(samples, int) and not isinstance(samples, bool):
        return samples
    return len(dataset)


class IndexedView(Dataset[Any]):
    """A self-splitting streaming dataset seen through its ``__len__`` and ``__getitem__`` only
    (a ``torch.utils.data.Dataset``, not an ``IterableDataset``, so a DataLoader takes a sampler
    for it).

    Example:
        >>> view = IndexedView([10, 11, 12])
        >>> len(view), view[1]
        (3, 11)
    """

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return whole_length(self.dataset)

    def __getitem__(self, index: int) -> Any:
        return self.dataset[index]

    def __repr__(self) -> str:
        return f"IndexedView({type(self.dataset).__name__})"
