"""The corpus of ``multigpu train --model lm``: bytes of the Python standard library's own source.

Offline and free: every Python installation carries its standard library's ``.py`` files. The
corpus is their first ``size`` bytes in a fixed walk order (a directory's files by name, then
its sub-directories by name; ``site-packages`` and ``__pycache__`` left out), so it is the same
on every run and every rank of one installation; another Python version gives another corpus
(``Corpus.sha256`` tells them apart). Tokens are bytes: a vocabulary of 256, no tokenizer.

The last ``val_fraction`` of the bytes is the validation split, taken once, whatever the seed.
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from multigpu.errors import UsageError

VOCAB_SIZE = 256
"""Bytes are the tokens."""

SKIPPED_DIRS = frozenset({"site-packages", "dist-packages", "__pycache__"})
"""Directories of the standard library that are not its own source."""


@dataclass(frozen=True, kw_only=True)
class Corpus:
    """A byte corpus split once into train and validation bytes."""

    train: torch.Tensor  # uint8
    val: torch.Tensor  # uint8, the corpus' tail
    files: int  # source files the bytes came from
    sha256: str  # of all the bytes: every rank must read the same corpus


def stdlib_sources(root: str | os.PathLike[str] | None = None) -> list[Path]:
    """Every ``.py`` file under ``root`` (default: this Python's stdlib), in walk order."""
    top = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    found: list[Path] = []
    for directory, subdirs, names in os.walk(top):
        subdirs[:] = sorted(d for d in subdirs if d not in SKIPPED_DIRS)  # walk order, pruned
        found.extend(Path(directory, n) for n in sorted(names) if n.endswith(".py"))
    return found


def load_corpus(
    size: int, *, val_fraction: float = 0.1, root: str | os.PathLike[str] | None = None
) -> Corpus:
    """The first ``size`` bytes of ``stdlib_sources(root)``, split into (train, validation)."""
    if size < 2 or not 0.0 < val_fraction < 1.0:
        raise UsageError(
            f"a corpus of {size} bytes with val_fraction={val_fraction}; expected at least 2 "
            "bytes (--corpus-mb) and a fraction between 0 and 1"
        )
    chunks: list[bytes] = []
    have = files = 0
    for path in stdlib_sources(root):
        if have >= size:
            break
        text = path.read_bytes()[: size - have]
        chunks.append(text)
        have += len(text)
        files += 1
    if have < size:
        raise UsageError(
            f"a corpus of {size} bytes was asked for, but the sources hold {have} bytes; "
            f"expected at most --corpus-mb {math.floor(have / 1e5) / 10} on this Python"
        )
    raw = b"".join(chunks)
    data = torch.frombuffer(bytearray(raw), dtype=torch.uint8)
    cut = size - max(1, round(size * val_fraction))
    return Corpus(
        train=data[:cut], val=data[cut:], files=files, sha256=hashlib.sha256(raw).hexdigest()
    )


def unigram_baseline(train: torch.Tensor, val: torch.Tensor) -> float:
    """Cross-entropy (nats per byte) of predicting each ``val`` byte by ``train``'s byte counts.

    The best a model that ignores context can do: ``-mean(log q[b])`` over the validation bytes
    ``b``, with ``q`` the training frequencies plus one (add-one smoothing: a byte absent from
    training costs ``log(n + 256)`` instead of infinity).

    Example:
        >>> round(unigram_baseline(torch.tensor([0] * 254, dtype=torch.uint8),
        ...                        torch.tensor([0], dtype=torch.uint8)), 6)  # q[0] = 255/510
        0.693147
    """
    counts = torch.bincount(train.long(), minlength=VOCAB_SIZE).double() + 1.0
    log_q = counts.log() - math.log(float(counts.sum()))
    seen = torch.bincount(val.long(), minlength=VOCAB_SIZE).double()
    return float(-(seen * log_q).sum() / seen.sum())


class Windows(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Non-overlapping windows of ``block_size`` bytes: window ``i`` -> (x, y = x shifted by one).

    Map-style with a fixed length, so ``ctx.loader`` deals the same global order of windows
    at every world size. ``indices`` keeps only those windows (e.g. an evaluation subset).

    Example:
        >>> x, y = Windows(torch.arange(10, dtype=torch.uint8), 4)[1]
        >>> x.tolist(), y.tolist()
        ([4, 5, 6, 7], [5, 6, 7, 8])
    """

    def __init__(
        self, data: torch.Tensor, block_size: int, indices: list[int] | None = None
    ) -> None:
        if block_size < 1 or len(data) < block_size + 1:
            raise ValueError(
                f"{len(data)} bytes cannot make a window of {block_size} (+1) bytes; expected "
                "a smaller block size or more data"
            )
        self.data = data
        self.block_size = block_size
        count = (len(data) - 1) // block_size
        self.indices = list(range(count)) if indices is None else list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.indices[i] * self.block_size
        chunk = self.data[start : start + self.block_size + 1].long()
        return chunk[:-1], chunk[1:]


def evenly_spaced(data: torch.Tensor, block_size: int, count: int, multiple_of: int) -> Windows:
    """``count`` windows spread evenly over ``data`` (all of them if fewer), rounded down to a
    multiple of ``multiple_of``: then every rank evaluates the same number of batches, which
    sharded models need (each forward all-gathers the parameters, a collective).
    """
    every = Windows(data, block_size)
    total = len(every)
    take = min(count, total)
    take -= take % multiple_of
    if take < 1:
        raise ValueError(
            f"{total} validation windows cannot give every one of {multiple_of} ranks one; "
            "expected a larger corpus or a smaller block size"
        )
    return Windows(data, block_size, [i * total // take for i in range(take)])
