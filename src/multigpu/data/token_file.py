"""Token files: your text tokenized once into a memory-mapped array, trained on as packed sequences.

``build_token_file(paths)`` reads text, JSON-lines or parquet files (``multigpu.common.
text_sources`` says which and in what order), tokenizes each document — into bytes by default
(a vocabulary of 256), or with a Hugging Face tokenizer named by a local directory or a name in
the local cache, which also ends each document with its EOS token — and writes, into a cache
directory keyed by the sources' (paths, sizes, modification times), the tokenizer and the text
field:

- ``tokens.bin``: every document's tokens, one after the other (uint8, uint16 or uint32);
- ``starts.bin``: where each document starts in it (int64);
- ``meta.json``: dtype, counts, vocabulary size, the tokens' sha256, the sources.

It is written to a temporary directory and renamed when complete, so a reader sees a whole token
file or none; a second build of the same sources finds it and reads nothing.

``PackedSequences(token_file, seq_len)`` is a map-style dataset over it: sequence ``i`` is tokens
``[i*seq_len, (i+1)*seq_len]`` as ``(x, y)`` with ``y`` = ``x`` shifted by one, and every target
that is the first token of a document set to ``IGNORE_INDEX`` (-100): no position is trained to
predict the next document from the previous one. Train with the token-weighted loss::

    loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum")
    ctx.backward(loss, num_items=(y != IGNORE_INDEX).sum())

Map-style, so ``ctx.loader`` gives it the same global batches at any world size and resumes it
exactly on any world size. Attention is not masked at the boundaries (a later document of a
sequence sees the earlier one, as in GPT-2's packing); only the loss is.

Environment variables read: ``MULTIGPU_CACHE_DIR``, ``XDG_CACHE_HOME`` (the default cache:
``multigpu.common.variables.cache_dir() / "tokens"``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

from multigpu.common import variables
from multigpu.common.text_sources import list_sources, source_format
from multigpu.errors import DataError, UsageError

IGNORE_INDEX = -100
"""The target of a position the loss leaves out (``F.cross_entropy``'s default ``ignore_index``)."""

FORMAT_VERSION = 1
"""Part of the cache key: a new layout never reads an old file."""

_BATCH = 256  # documents tokenized per call of a Hugging Face tokenizer
_CHUNK = 1 << 24  # bytes of a text file copied at a time (as bytes, a document may be any size)


class ByteTokenizer:
    """UTF-8 bytes as tokens: a vocabulary of 256, no end-of-document token."""

    vocab_size = 256
    eos_id: int | None = None
    key = "bytes"

    def encode(self, texts: list[bytes]) -> list[np.ndarray]:
        return [np.frombuffer(t, dtype=np.uint8) for t in texts]


class HFTokenizer:
    """A Hugging Face tokenizer (``AutoTokenizer``), from a local directory or a cached name;
    each document ends with its EOS token when it has one."""

    def __init__(self, name: str) -> None:
        try:
            from transformers import AutoTokenizer
        except ImportError as e:
            raise UsageError(
                f"--tokenizer {name} needs transformers, which is not installed; pip install "
                "'multigpu[hf]' or leave --tokenizer out (bytes)"
            ) from e
        local = Path(name).is_dir()
        try:
            self.tok = AutoTokenizer.from_pretrained(name, local_files_only=local)
        except (OSError, ValueError) as e:
            raise UsageError(
                f"--tokenizer {name}: no Hugging Face tokenizer could be loaded from it "
                f"({str(e).splitlines()[0]}); expected a directory save_pretrained wrote, or "
                "a tokenizer name in the local cache"
            ) from e
        self.vocab_size = len(self.tok)
        self.eos_id = self.tok.eos_token_id
        stamp = name
        if local:  # the directory's files: a changed tokenizer is another key
            stamp += "".join(
                f"|{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}"
                for p in sorted(Path(name).iterdir())
                if p.is_file()
            )
        self.key = f"hf:{type(self.tok).__name__}:{self.vocab_size}:{stamp}"

    def encode(self, texts: list[bytes]) -> list[np.ndarray]:
        strings = [t.decode("utf-8", errors="replace") for t in texts]
        ids = self.tok(strings, add_special_tokens=False, verbose=False)["input_ids"]
        eos = [] if self.eos_id is None else [self.eos_id]
        return [np.asarray(i + eos, dtype=np.int64) for i in ids]


def load_tokenizer(name: str | None) -> ByteTokenizer | HFTokenizer:
    """Bytes for None, else the Hugging Face tokenizer ``name`` (a directory or cached name)."""
    return ByteTokenizer() if not name else HFTokenizer(name)


def _documents(path: Path, text_field: str) -> Iterator[bytes]:
    """The documents of one source file, as UTF-8 bytes."""
    kind = source_format(path)
    if kind == "text":
        yield path.read_bytes()
    elif kind == "jsonl":
        with path.open("rb") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    record = json.loads(line)
                except ValueError as e:
                    raise DataError(
                        f"--data {path}: line {number} is not JSON ({e}); expected one JSON "
                        "object per line"
                    ) from e
                text = record.get(text_field) if isinstance(record, dict) else None
                if not isinstance(text, str):
                    raise DataError(
                        f"--data {path}: line {number} has no string field {text_field!r}; "
                        'expected objects such as {"' + text_field + '": "..."} (name '
                        "another field with --text-field)"
                    )
                yield text.encode("utf-8")
    else:
        yield from _parquet_documents(path, text_field)


def _parquet_documents(path: Path, text_field: str) -> Iterator[bytes]:
    try:
        import pyarrow.parquet as pq
    except ImportError as e:
        raise UsageError(
            f"--data {path}: reading parquet needs pyarrow; pip install pyarrow"
        ) from e
    parquet = pq.ParquetFile(path)
    if text_field not in parquet.schema_arrow.names:
        raise DataError(
            f"--data {path}: no column {text_field!r} (it has {parquet.schema_arrow.names}); "
            "name the text column with --text-field"
        )
    for batch in parquet.iter_batches(columns=[text_field]):
        for text in batch.column(0).to_pylist():
            if text is not None:
                yield text.encode("utf-8")


def _copy_bytes(path: Path, out: Any, digest: Any, starts: list[int], at: int) -> int:
    """A text file as one document of bytes, copied in chunks (a file larger than memory too);
    returns its length."""
    copied = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            if not copied:
                starts.append(at)
            out.write(chunk)
            digest.update(chunk)
            copied += len(chunk)
    return copied


def _dtype(vocab_size: int) -> np.dtype[Any]:
    if vocab_size <= 2**8:
        return np.dtype(np.uint8)
    return np.dtype(np.uint16) if vocab_size <= 2**16 else np.dtype(np.uint32)


def _key(files: list[Path], tokenizer_key: str, text_field: str) -> str:
    stats = [(str(f.resolve()), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    blob = json.dumps([FORMAT_VERSION, stats, tokenizer_key, text_field])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def build_token_file(
    paths: Sequence[str | os.PathLike[str]],
    *,
    tokenizer: str | None = None,
    text_field: str = "text",
    cache_dir: str | os.PathLike[str] | None = None,
) -> Path:
    """Tokenize the documents of ``paths`` once; return the token file's directory.

    Args:
        paths: files, directories or globs of ``.txt`` (a document per file), ``.jsonl`` (a
            document per line) or ``.parquet`` (a document per row) files.
        tokenizer: None for bytes (vocabulary 256), or a Hugging Face tokenizer's directory or
            cached name (its EOS token ends each document).
        text_field: the JSON field or parquet column holding each document.
        cache_dir: where token files go (default ``~/.cache/multigpu/tokens``, see the module).

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a.jsonl").write_text('{"text": "hi"}\\n{"text": "yo!"}\\n')
        >>> TokenFile(build_token_file([d], cache_dir=d / "cache")).documents
        2
    """
    files = list_sources(paths)
    tok = load_tokenizer(tokenizer)
    root = Path(cache_dir) if cache_dir is not None else variables.cache_dir() / "tokens"
    final = root / _key(files, tok.key, text_field)
    if (final / "meta.json").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    dtype = _dtype(tok.vocab_size)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}-"))
    try:
        digest = hashlib.sha256()
        starts: list[int] = []
        count = 0
        with (tmp / "tokens.bin").open("wb") as out:

            def flush(texts: list[bytes]) -> None:
                nonlocal count
                for ids in tok.encode(texts):
                    if len(ids) == 0:
                        continue  # an empty document: nothing to train on, no boundary
                    starts.append(count)
                    chunk = np.asarray(ids).astype(dtype, copy=False).tobytes()
                    out.write(chunk)
                    digest.update(chunk)
                    count += len(ids)

            pending: list[bytes] = []
            for f in files:
                if isinstance(tok, ByteTokenizer) and source_format(f) == "text":
                    flush(pending)  # in order: what came before this file
                    pending = []
                    count += _copy_bytes(f, out, digest, starts, count)  # memory stays flat
                    continue
                for doc in _documents(f, text_field):
                    pending.append(doc)
                    if len(pending) >= _BATCH:
                        flush(pending)
                        pending = []
            flush(pending)
            out.flush()
            os.fsync(out.fileno())
        np.asarray(starts, dtype=np.int64).tofile(tmp / "starts.bin")
        meta = {
            "version": FORMAT_VERSION,
            "dtype": dtype.name,
            "tokens": count,
            "documents": len(starts),
            "vocab_size": tok.vocab_size,
            "eos_id": tok.eos_id,
            "tokenizer": tokenizer or "bytes",
            "text_field": text_field,
            "sha256": digest.hexdigest(),
            "sources": [str(f) for f in files],
        }
        (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
        try:
            os.rename(tmp, final)  # whole or absent
        except OSError:
            if not (final / "meta.json").is_file():  # not another process' identical build
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


class TokenFile:
    """A token file ``build_token_file`` wrote, memory-mapped (nothing is read until used)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        try:
            self.meta: dict[str, Any] = json.loads((self.path / "meta.json").read_text())
        except (OSError, ValueError) as e:
            raise UsageError(
                f"{self.path} is not a token file ({e}); expected a directory "
                "build_token_file wrote"
            ) from e
        n = int(self.meta["tokens"])
        self.tokens: np.ndarray = (
            np.memmap(self.path / "tokens.bin", dtype=self.meta["dtype"], mode="r", shape=(n,))
            if n
            else np.zeros(0, dtype=self.meta["dtype"])
        )
        self.starts: np.ndarray = np.fromfile(self.path / "starts.bin", dtype=np.int64)

    def __len__(self) -> int:
        return len(self.tokens)

    def __reduce__(self) -> tuple[type[TokenFile], tuple[Path]]:
        # Pickled (loader workers that spawn) as its path: a memmap would pickle its contents.
        return (TokenFile, (self.path,))

    @property
    def documents(self) -> int:
        return len(self.starts)

    @property
    def vocab_size(self) -> int:
        return int(self.meta["vocab_size"])

    @property
    def sha256(self) -> str:
        return str(self.meta["sha256"])


class PackedSequences(Dataset[tuple[torch.Tensor, torch.Tensor]]):
    """Fixed-length sequences packed from the documents of ``tokens[start:stop]``.

    Item ``i`` is ``(x, y)``, int64 of ``seq_len`` each: ``x`` the tokens from ``start + i *
    seq_len``, ``y`` the tokens one later, with ``IGNORE_INDEX`` where ``y`` starts a document.
    ``indices`` keeps only those sequences (an evaluation subset).

    Example:
        >>> import tempfile; d = Path(tempfile.mkdtemp())
        >>> _ = (d / "a.txt").write_text("abc"); _ = (d / "b.txt").write_text("de")
        >>> x, y = PackedSequences(TokenFile(build_token_file([d], cache_dir=d / "c")), 4)[0]
        >>> bytes(x.tolist()), y.tolist()
        (b'abcd', [98, 99, -100, 101])
    """

    def __init__(
        self,
        tokens: TokenFile,
        seq_len: int,
        *,
        start: int = 0,
        stop: int | None = None,
        indices: Sequence[int] | None = None,
    ) -> None:
        stop = len(tokens) if stop is None else stop
        if seq_len < 1 or stop - start < seq_len + 1:
            raise ValueError(
                f"{stop - start} tokens cannot make a sequence of {seq_len} (+1) tokens; "
                "expected a shorter sequence length or more data"
            )
        self.file, self.seq_len, self.start = tokens, seq_len, start
        count = (stop - start - 1) // seq_len
        self.indices = list(range(count)) if indices is None else list(indices)

    def __len__(self) -> int:
        return len(self.indices)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        begin = self.start + self.indices[i] * self.seq_len
        end = begin + self.seq_len + 1
        chunk = torch.from_numpy(self.file.tokens[begin:end].astype(np.int64))
        y = chunk[1:].clone()
        starts = self.file.starts
        first, last = np.searchsorted(starts, [begin + 1, end])  # documents starting in y
        y[torch.from_numpy(starts[first:last] - (begin + 1))] = IGNORE_INDEX
        return chunk[:-1], y
