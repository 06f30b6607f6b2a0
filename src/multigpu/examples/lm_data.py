"""The corpus of ``multigpu train --model lm``: bytes of the Python standard library's own source.

Offline and free: every Python installation carries its standard library's ``.py`` files. The
corpus is their first ``size`` bytes in a fixed walk order (a directory's files by name, then
its sub-directories by name; ``site-packages`` and ``__pycache__`` left out), so it is the same
on every run and every rank of one installation; another Python version gives another corpus
(``Corpus.sha256`` tells them apart). Tokens are bytes: a vocabulary of 256, no tokenizer.

The last ``val_fraction`` of the bytes is the validation split, taken once, whatever the seed.

With ``--data PATHS`` the job trains on your own files instead: tokenized once into a token file
(``multigpu.data.build_token_file``) and packed into sequences whose document-starting targets
are masked (``multigpu.data.PackedSequences``); ``from_token_file`` makes the same train and
validation splits of it (its last ``val_fraction`` of tokens).
"""

from __future__ import annotations

import hashlib
import math
import os
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from multigpu.data import PackedSequences, TokenFile
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
    return unigram_cross_entropy(
        torch.bincount(train.long(), minlength=VOCAB_SIZE),
        torch.bincount(val.long(), minlength=VOCAB_SIZE),
    )


def unigram_cross_entropy(train_counts: torch.Tensor, val_counts: torch.Tensor) -> float:
    """``unigram_baseline`` from each token's count in the training and validation tokens."""
    counts = train_counts.double() + 1.0
    log_q = counts.log() - math.log(float(counts.sum()))
    seen = val_counts.double()
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


def val_cut(tokens: int, val_fraction: float = 0.1) -> int:
    """Where the validation tail of ``tokens`` tokens starts (as ``load_corpus`` cuts bytes)."""
    return tokens - max(1, round(tokens * val_fraction))


def split_counts(tokens: int, block_size: int) -> tuple[int, int]:
    """Training and validation sequences of ``block_size`` in a token file of ``tokens``."""
    cut = val_cut(tokens)
    return max(0, (cut - 1) // block_size), max(0, (tokens - cut - 1) // block_size)


@dataclass(frozen=True, kw_only=True)
class LMData:
    """What the job trains and evaluates on: the standard library's bytes, or ``--data``."""

    train: Dataset[tuple[torch.Tensor, torch.Tensor]]
    val: Dataset[tuple[torch.Tensor, torch.Tensor]]
    baseline: float  # unigram cross-entropy of the validation tokens (nats per token)
    vocab_size: int
    masked: bool  # targets hold IGNORE_INDEX (document starts): train on the token-weighted loss
    unit: str  # "bytes" or "tokens"
    described: str  # what the tokens came from, for the header
    record: dict[str, Any] = field(default_factory=dict)  # metrics.json's "corpus"


def from_corpus(corpus: Corpus, block_size: int, eval_windows: int, world_size: int) -> LMData:
    """The standard-library corpus as the job trains on it."""
    return LMData(
        train=Windows(corpus.train, block_size),
        val=evenly_spaced(corpus.val, block_size, eval_windows, world_size),
        baseline=unigram_baseline(corpus.train, corpus.val),
        vocab_size=VOCAB_SIZE,
        masked=False,
        unit="bytes",
        described=f"{len(corpus.train)} train + {len(corpus.val)} validation bytes of "
        f"{corpus.files} standard-library files",
        record={
            "train_bytes": len(corpus.train),
            "val_bytes": len(corpus.val),
            "files": corpus.files,
            "sha256": corpus.sha256,
        },
    )


def _counts(tokens: np.ndarray, vocab: int, chunk: int = 1 << 24) -> torch.Tensor:
    """How often each token occurs, counted a chunk at a time (bincount copies to int64)."""
    counts = np.zeros(vocab, dtype=np.int64)
    for at in range(0, len(tokens), chunk):
        counts += np.bincount(tokens[at : at + chunk], minlength=vocab)[:vocab]
    return torch.from_numpy(counts)


def from_token_file(
    tokens: TokenFile, block_size: int, eval_windows: int, world_size: int
) -> LMData:
    """A token file as the job trains on it: packed sequences of its first 90 % of tokens, and
    ``eval_windows`` evenly spaced sequences of the rest (a multiple of ``world_size``)."""
    n, vocab = len(tokens), tokens.vocab_size
    cut = val_cut(n)
    val_all = PackedSequences(tokens, block_size, start=cut)
    take = min(eval_windows, len(val_all))
    take -= take % world_size
    total = len(val_all)
    meta = tokens.meta
    return LMData(
        train=PackedSequences(tokens, block_size, stop=cut),
        val=PackedSequences(
            tokens, block_size, start=cut, indices=[i * total // take for i in range(take)]
        ),
        baseline=unigram_cross_entropy(
            _counts(tokens.tokens[:cut], vocab), _counts(tokens.tokens[cut:], vocab)
        ),
        vocab_size=vocab,
        masked=True,
        unit="tokens",
        described=f"{cut} train + {n - cut} validation tokens of {tokens.documents} documents "
        f"in {len(meta['sources'])} file(s), tokenizer {meta['tokenizer']}",
        record={
            "train_tokens": cut,
            "val_tokens": n - cut,
            "documents": tokens.documents,
            "files": len(meta["sources"]),
            "tokenizer": meta["tokenizer"],
            "vocab_size": vocab,
            "sha256": tokens.sha256,
            "token_file": str(tokens.path),
        },
    )
