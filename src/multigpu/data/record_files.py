"""``RecordFiles``: sharded record files as a map-style dataset that each rank reads its share of.

Each file is a shard of records: JSON lines (a dict per line), text lines (a ``str`` per line),
parquet rows (a dict per row; needs ``pyarrow``, the ``parquet`` extra) or WebDataset tar samples
(the members sharing a key, as ``{"__key__": key, ext: bytes, ...}``). An index of where each
record lies (its byte offset and length; for parquet its row group and row) turns the files into
a map-style dataset, so ``ctx.loader`` shards it exactly as any other: the same global batches at
any world size and any ``num_workers``, a cursor that resumes on another world size, replica heal.

Reading: ``dataset[i]`` reads that record only (``os.pread`` of its bytes), through file handles
opened per process (a DataLoader worker opens its own). ``bytes_read`` counts the bytes this
process read from the files, the index's included.

The index is built at the first ``len()`` (``ctx.loader`` asks for it): in a distributed run
(``torch.distributed`` initialized) rank ``r`` of ``W`` indexes the files ``s`` with
``s % W == r`` and the ranks exchange their indexes (``all_gather_object``), so each rank reads
about 1/W of the bytes once. Every rank must therefore reach the first ``len()`` (as every rank
reaches ``ctx.loader``). Alone, the process indexes every file. With ``index_dir``, each file's
index is kept there (keyed by path, size and modification time; written whole or not at all),
and a later run reads none of the files' bytes to build it.

Bad records are found while indexing (each record is parsed once there): ``on_bad="raise"`` ends
the run in one line naming the file and the line; ``on_bad="skip"`` leaves them out of the
dataset — they have no index, so the order and the batches are the same at every world size —
and rank 0 says their count once. Blank lines of a JSON-lines file are not records.

Order (``shuffle=True``): ``global_order(seed, epoch)``: the files in an order drawn from
``(seed, epoch)``, then the records of each ``window`` consecutive files (in that order) shuffled
together; so at any moment each rank reads from about ``window`` files. Parquet is decoded a row
group at a time: there the units drawn and windowed are row groups (the window's kept decoded),
and every rank that needs a row of a row group decodes it — parquet gives no 1/N share of bytes.
``shuffle=False``: the natural order (file by file, record by record).

Resume safety: ``data_fingerprint()`` (each file's name, size, record count and the CRC-32 of its
bytes, found while indexing) is saved with the loader's state; a resume over files that changed,
disappeared or appeared is refused in one line naming the file.
"""

from __future__ import annotations

import glob
import hashlib
import io
import json
import logging
import os
import tarfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy
import torch
from torch.utils.data import Dataset

from multigpu.data.sampler import derive_seed
from multigpu.errors import DataError, UsageError

log = logging.getLogger(__name__)

FORMATS = ("jsonl", "text", "parquet", "tar")
SUFFIXES = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".txt": "text"}
SUFFIXES.update({".parquet": "parquet", ".tar": "tar"})
_CHUNK = 1 << 22  # bytes per read while indexing


def _utf8(data: bytes) -> str:
    return data.decode("utf-8")


def _tar_sample(data: bytes) -> dict[str, Any]:
    """A WebDataset sample from its members' bytes: ``{"__key__": key, ext: bytes, ...}``."""
    sample: dict[str, Any] = {}
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
            for member in archive:
                if not member.isfile():
                    continue
                folder, name = os.path.split(member.name)
                key, _, ext = name.partition(".")
                sample["__key__"] = os.path.join(folder, key)
                body = archive.extractfile(member)
                sample[ext] = body.read() if body is not None else b""
    except tarfile.TarError as e:
        raise ValueError(f"bad tar: {e}") from e
    return sample


_BAD_FIX = (
    "; fix or remove the record, or pass on_bad='skip' to leave bad records out (they are counted)"
)
_CACHE_VERSION = 1

_PARSERS: dict[str, Callable[[bytes], Any]] = {
    "jsonl": json.loads,
    "text": _utf8,
    "tar": _tar_sample,
}


class _Counting(io.RawIOBase):
    """A file read through: counts and CRCs the bytes read (a tar's headers while indexing)."""

    def __init__(self, raw: Any) -> None:
        self.raw, self.count, self.crc = raw, 0, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int = -1) -> bytes:
        data: bytes = self.raw.read(size)
        self.count += len(data)
        self.crc = zlib.crc32(data, self.crc)
        return data

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self.raw.seek(offset, whence))

    def tell(self) -> int:
        return int(self.raw.tell())


@dataclass
class _Shard:
    """One file's index."""

    path: str
    name: str
    size: int
    spans: torch.Tensor
    """(records, 2) int64: byte offset and length (parquet: row group and row)."""
    crc: int
    bad: int
    first_bad: str | None


def _expand(paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]]) -> list[str]:
    given = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    if not given:
        raise UsageError("RecordFiles got no paths; expected files, directories or globs")
    found: list[str] = []
    for item in given:
        item = os.fspath(item)
        if os.path.isdir(item):
            found += sorted(
                os.path.join(root, f)
                for root, _, files in os.walk(item)
                for f in files
                if os.path.splitext(f)[1] in SUFFIXES
            )
        elif os.path.isfile(item):
            found.append(item)
        else:
            matches = sorted(m for m in glob.glob(item, recursive=True) if os.path.isfile(m))
            if not matches:
                raise UsageError(
                    f"RecordFiles path {item!r} is no file, directory or matching glob; expected "
                    "existing files (.jsonl, .txt, .parquet, .tar), directories of them or a glob"
                )
            found += matches
    unique = sorted(dict.fromkeys(os.path.abspath(p) for p in found))
    if not unique:
        raise UsageError(
            f"RecordFiles found no .jsonl, .json, .ndjson, .txt, .parquet or .tar file in {given}; "
            "name the files or a directory that holds them"
        )
    return unique


def _format_of(paths: list[str], format: str | None) -> str:
    if format is not None:
        if format not in FORMATS:
            raise UsageError(f"format={format!r}; expected one of {', '.join(FORMATS)}")
        return format
    kinds = {SUFFIXES.get(os.path.splitext(p)[1]) for p in paths}
    if len(kinds) != 1 or None in kinds:
        raise UsageError(
            f"RecordFiles cannot tell the format of {[os.path.basename(p) for p in paths[:4]]} "
            f"from their suffixes; pass format= one of {', '.join(FORMATS)}"
        )
    return str(kinds.pop())


class RecordFiles(Dataset[Any]):
    """Records of sharded files, each read by the rank whose batch holds it; see the module doc.

    Args:
        paths: files, directories (searched for .jsonl/.json/.ndjson/.txt/.parquet/.tar) or globs;
            sorted by path, each file a shard.
        format: ``"jsonl"``, ``"text"``, ``"parquet"`` or ``"tar"``; ``None`` reads it from the
            suffixes.
        transform: applied to each record as it is read (e.g. tokenizing).
        on_bad: ``"raise"`` (a bad record ends the run in one line) or ``"skip"`` (bad records
            are left out of the dataset and counted).
        window: files whose records are shuffled together (the read locality of each rank).
        index_dir: a directory to keep each file's index in (keyed by its path, size and
            modification time), so that the next run (a resume) reads no byte to build it.

    Example:
        >>> import json, tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / "a.jsonl").write_text("".join(json.dumps({"id": i}) + "\\n" for i in range(3)))
        >>> ds = RecordFiles(d)
        >>> len(ds), ds[2]
        (3, {'id': 2})
    """

    def __init__(
        self,
        paths: str | os.PathLike[str] | Sequence[str | os.PathLike[str]],
        *,
        format: str | None = None,
        transform: Callable[[Any], Any] | None = None,
        on_bad: str = "raise",
        window: int = 4,
        index_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.paths = _expand(paths)
        self.format = _format_of(self.paths, format)
        if on_bad not in ("raise", "skip"):
            raise UsageError(f"on_bad={on_bad!r}; expected 'raise' or 'skip'")
        if isinstance(window, bool) or not isinstance(window, int) or window < 1:
            raise UsageError(f"window={window!r}; expected an integer >= 1 (files per shuffle)")
        if self.format == "parquet":
            try:
                import pyarrow.parquet  # noqa: F401
            except ImportError as e:
                raise UsageError(
                    "RecordFiles(format='parquet') needs pyarrow; pip install 'multigpu[parquet]'"
                ) from e
        self.transform = transform
        self.on_bad = on_bad
        self.window = window
        self.index_dir = os.fspath(index_dir) if index_dir is not None else None
        root = os.path.commonpath([os.path.dirname(p) for p in self.paths])
        self.names = [os.path.relpath(p, root) for p in self.paths]
        self.bytes_read = 0
        """Bytes this process read from the files (index and records)."""
        self.bad_records = 0
        """Records left out as bad (``on_bad="skip"``), over all files."""
        self._shards: list[_Shard] | None = None
        self._starts: list[int] = []
        self._starts_tensor = torch.zeros(1, dtype=torch.int64)
        self._spans = torch.empty(0, 2, dtype=torch.int64)
        self._pid = -1
        self._handles: dict[int, Any] = {}
        self._row_groups: OrderedDict[tuple[int, int], list[Any]] = OrderedDict()

    # ---- index -------------------------------------------------------------------------------
    def _index(self) -> list[_Shard]:
        if self._shards is None:
            self._build_index()
        assert self._shards is not None
        return self._shards

    def _build_index(self) -> None:
        import torch.distributed as dist

        distributed = dist.is_available() and dist.is_initialized()
        rank, world = (dist.get_rank(), dist.get_world_size()) if distributed else (0, 1)
        mine: dict[int, _Shard | str] = {}
        for s in range(rank, len(self.paths), world):
            try:
                mine[s] = self._index_file(s)
            except DataError as e:  # sent to every rank: none waits alone in the exchange
                mine[s] = str(e)
        every: dict[int, _Shard | str] = {}
        if world > 1:
            parts: list[Any] = [None] * world
            dist.all_gather_object(parts, mine)
            for part in parts:
                every.update(part)
        else:
            every = mine
        errors = [every[s] for s in sorted(every) if isinstance(every[s], str)]
        if errors:
            raise DataError(str(errors[0]))
        shards = [every[s] for s in range(len(self.paths))]
        self._shards = [s for s in shards if isinstance(s, _Shard)]
        counts = [len(s.spans) for s in self._shards]
        self._starts = [0]
        for c in counts:
            self._starts.append(self._starts[-1] + c)
        # One table of every record's span (the shards' views into it): a batch is located
        # with a few tensor operations, not a Python lookup per record.
        self._spans = torch.cat([s.spans for s in self._shards])
        self._starts_tensor = torch.tensor(self._starts, dtype=torch.int64)
        for s, shard in enumerate(self._shards):
            shard.spans = self._spans[self._starts[s] : self._starts[s + 1]]
        self.bad_records = sum(s.bad for s in self._shards)
        if self._starts[-1] == 0:
            raise DataError(
                f"RecordFiles found no record in {len(self.paths)} file(s) "
                f"({', '.join(self.names[:3])}...); expected {self.format} records"
            )
        if self.bad_records and rank == 0:
            first = next(s.first_bad for s in self._shards if s.first_bad)
            log.warning(
                "multigpu: %s bad record(s) left out of the data (on_bad='skip'), the first: %s",
                self.bad_records,
                first,
            )

    def _bad(self, shard: _Shard, where: str, what: str) -> None:
        line = f"data file {shard.path}, {where}: {what}"
        if self.on_bad == "raise":
            raise DataError(line + _BAD_FIX)
        shard.bad += 1
        if shard.first_bad is None:
            shard.first_bad = line

    def _index_file(self, s: int) -> _Shard:
        path = self.paths[s]
        try:
            stat = os.stat(path)
        except OSError as e:
            raise DataError(
                f"data file {path} cannot be read ({e}); expected a readable file"
            ) from e
        cached = self._cached(path, stat)
        if cached is not None:
            return cached
        empty = torch.empty(0, 2, dtype=torch.int64)
        shard = _Shard(path, self.names[s], stat.st_size, empty, 0, 0, None)
        if self.format == "parquet":
            self._index_parquet(shard)
        elif self.format == "tar":
            self._index_tar(shard)
        else:
            self._index_lines(shard)
        self._cache(shard, stat)
        return shard

    def _cache_path(self, path: str, stat: os.stat_result) -> str | None:
        if self.index_dir is None:
            return None
        key = f"{_CACHE_VERSION}|{self.format}|{path}|{stat.st_size}|{stat.st_mtime_ns}"
        digest = hashlib.sha256(key.encode()).hexdigest()[:32]
        return os.path.join(self.index_dir, f"{os.path.basename(path)}.{digest}.index")

    def _cached(self, path: str, stat: os.stat_result) -> _Shard | None:
        """The file's index from ``index_dir``, when one was written for this path, size and
        modification time (a bad record it left out still raises under ``on_bad="raise"``)."""
        where = self._cache_path(path, stat)
        if where is None or not os.path.exists(where):
            return None
        try:
            saved = torch.load(where, weights_only=True)
            shard = _Shard(
                path,
                self.names[self.paths.index(path)],
                stat.st_size,
                saved["spans"],
                int(saved["crc"]),
                int(saved["bad"]),
                saved["first_bad"],
            )
        except Exception as e:  # an unreadable cache entry is rebuilt, never trusted
            log.warning(
                "multigpu: index cache %s unreadable (%s); indexing %s again", where, e, path
            )
            return None
        if shard.bad and self.on_bad == "raise":
            raise DataError(str(shard.first_bad) + _BAD_FIX)
        return shard

    def _cache(self, shard: _Shard, stat: os.stat_result) -> None:
        where = self._cache_path(shard.path, stat)
        if where is None:
            return
        state = {
            "spans": shard.spans,
            "crc": shard.crc,
            "bad": shard.bad,
            "first_bad": shard.first_bad,
        }
        try:
            os.makedirs(os.path.dirname(where), exist_ok=True)
            temporary = f"{where}.{os.getpid()}.tmp"
            torch.save(state, temporary)
            os.replace(temporary, where)  # whole or not at all: a reader never sees half
        except OSError as e:
            log.warning(
                "multigpu: index cache %s not written (%s); the next run indexes again", where, e
            )

    def _index_tar(self, shard: _Shard) -> None:
        """WebDataset layout: consecutive members whose names share the part before the first
        dot of the file name (the key) are one record; its span covers their headers and data."""
        spans: list[tuple[int, int]] = []
        key, start, end, ended = None, 0, 0, 0
        with open(shard.path, "rb", buffering=0) as raw:  # counted: what the OS gave
            counted = _Counting(raw)
            try:
                with tarfile.open(fileobj=counted, mode="r:") as archive:
                    for member in archive:
                        if not member.isfile():
                            continue
                        folder, name = os.path.split(member.name)
                        this = os.path.join(folder, name.split(".", 1)[0])
                        if this != key:
                            if key is not None:
                                spans.append((start, end - start))
                            key, start = this, member.offset
                        blocks = -(-member.size // tarfile.BLOCKSIZE)  # data padded to blocks
                        end = member.offset_data + blocks * tarfile.BLOCKSIZE
                    ended = archive.offset  # where its end-of-archive blocks should start
            except tarfile.TarError as e:
                self._bad(shard, f"sample {len(spans) + 1} (byte {end})", f"bad tar ({e})")
                key = None  # the rest of the file cannot be read: one bad record, counted
        if key is not None:
            spans.append((start, end - start))
        # tarfile stops at a cut-off header without a word: a whole archive ends in two zero
        # blocks, so one without them lost its end, and its last sample may lack members.
        if spans and shard.size - ended < 2 * tarfile.BLOCKSIZE:
            spans.pop()
            self._bad(
                shard,
                f"sample {len(spans) + 1} (byte {start})",
                f"truncated: the file ends at byte {shard.size} without the end of the archive",
            )
        self.bytes_read += counted.count
        shard.crc = counted.crc
        if spans:
            shard.spans = torch.tensor(spans, dtype=torch.int64)

    def _index_lines(self, shard: _Shard) -> None:
        spans: list[tuple[int, int]] = []
        crc, offset, number, rest = 0, 0, 0, b""
        with open(shard.path, "rb", buffering=0) as f:
            while True:
                chunk = f.read(_CHUNK)
                self.bytes_read += len(chunk)
                crc = zlib.crc32(chunk, crc)
                if not chunk:
                    break
                lines = (rest + chunk).split(b"\n")
                rest = lines.pop()
                for line in lines:
                    number += 1
                    if self._check(shard, line, number, complete=True):
                        spans.append((offset, len(line)))
                    offset += len(line) + 1
        if rest:
            number += 1
            if self._check(shard, rest, number, complete=False):
                spans.append((offset, len(rest)))
        shard.crc = crc
        if spans:
            shard.spans = torch.tensor(spans, dtype=torch.int64)

    def _check(self, shard: _Shard, line: bytes, number: int, *, complete: bool) -> bool:
        """Whether ``line`` is a record (bad ones raise or are counted)."""
        end = "" if complete else " (the last line, without its newline: truncated?)"
        if self.format == "text":
            try:
                line.decode("utf-8")
            except UnicodeDecodeError as e:
                self._bad(shard, f"line {number}{end}", f"not UTF-8 text ({e.reason})")
                return False
            return True
        if not line.strip():
            return False
        try:
            value = json.loads(line)
        except ValueError as e:
            self._bad(shard, f"line {number}{end}", f"invalid JSON ({e})")
            return False
        if not isinstance(value, dict):
            self._bad(shard, f"line {number}", f"a JSON {type(value).__name__}, expected an object")
            return False
        return True

    def _index_parquet(self, shard: _Shard) -> None:
        import pyarrow.parquet as pq

        try:
            meta = pq.ParquetFile(shard.path).metadata
        except Exception as e:  # pyarrow raises its own ArrowInvalid/OSError kinds
            raise DataError(
                f"data file {shard.path} is not a readable parquet file ({e}); expected parquet"
            ) from e
        footer = min(shard.size, 8 + meta.serialized_size)
        self.bytes_read += footer
        spans = [
            (g, row)
            for g in range(meta.num_row_groups)
            for row in range(meta.row_group(g).num_rows)
        ]
        shard.crc = zlib.crc32(str(meta.to_dict()).encode())
        if spans:
            shard.spans = torch.tensor(spans, dtype=torch.int64)

    # ---- map-style dataset ----------------------------------------------------------------------
    def __len__(self) -> int:
        self._index()
        return self._starts[-1]

    def _handle(self, s: int) -> Any:
        handle = self._handles.get(s)
        if handle is None:
            path = self._index()[s].path
            try:
                if self.format == "parquet":
                    import pyarrow.parquet as pq

                    handle = pq.ParquetFile(path)
                else:
                    handle = os.open(path, os.O_RDONLY)
            except (OSError, ValueError) as e:
                raise DataError(
                    f"data file {path} cannot be opened ({e}); it was there when indexed: "
                    "keep the files in place while the run reads them"
                ) from e
            self._handles[s] = handle
        return handle

    def _read_row(self, s: int, a: int, b: int) -> Any:
        """Row ``b`` of row group ``a`` of parquet shard ``s``."""
        handle = self._handle(s)
        key = (s, a)
        rows = self._row_groups.get(key)
        if rows is None:
            group = handle.read_row_group(a)
            meta = handle.metadata.row_group(a)
            self.bytes_read += sum(
                meta.column(c).total_compressed_size for c in range(meta.num_columns)
            )
            rows = group.to_pylist()
            self._row_groups[key] = rows
            if len(self._row_groups) > self.window + 1:  # the window's, and the next
                self._row_groups.popitem(last=False)
        else:
            self._row_groups.move_to_end(key)
        return rows[b]

    def __getitem__(self, i: int) -> Any:
        return self.__getitems__([i])[0]

    def __getitems__(self, indices: list[int]) -> list[Any]:
        """A batch's records (DataLoader asks for them together)."""
        self._index()
        if self._pid != os.getpid():  # a forked worker: its own handles, not the parent's
            self._pid, self._handles, self._row_groups = os.getpid(), {}, OrderedDict()
        n = self._starts[-1]
        # NumPy views of the tables: a few operations per batch at ~1 µs each (torch's ~10).
        starts, table = self._starts_tensor.numpy(), self._spans.numpy()
        at = numpy.asarray(indices, dtype=numpy.int64).reshape(-1)
        if len(at) and (at.min() < -n or at.max() >= n):
            bad = next(int(i) for i in at if not -n <= i < n)
            raise IndexError(f"record {bad} is out of range for {n} records")
        at = at % n
        shard = numpy.searchsorted(starts, at, side="right") - 1
        spans = table[at]
        where = zip(
            shard.tolist(),
            (at - starts[shard]).tolist(),
            spans[:, 0].tolist(),
            spans[:, 1].tolist(),
            strict=True,
        )
        if self.format == "parquet":
            records = [self._read_row(s, a, b) for s, _, a, b in where]
        else:
            records = self._read_lines(where)
        if self.transform is not None:
            return [self.transform(r) for r in records]
        return records

    def _read_lines(self, where: Iterable[tuple[int, int, int, int]]) -> list[Any]:
        """The records at ``(shard, record, offset, length)``: one ``pread`` each."""
        handles, pread, records, total = self._handles, os.pread, [], 0
        parse: Callable[[bytes], Any] = _PARSERS[self.format]
        for s, k, a, b in where:
            fd = handles.get(s)
            if fd is None:
                fd = self._handle(s)
            data = pread(fd, b, a)
            total += b
            try:
                if len(data) != b:
                    raise ValueError(f"{len(data)} of its {b} bytes are there")
                records.append(parse(data))
            except ValueError as e:
                raise DataError(
                    f"data file {self._index()[s].path}, record {k + 1} (byte {a}) changed "
                    f"since it was indexed ({e}); keep the files unchanged while the run reads them"
                ) from e
        self.bytes_read += total
        return records

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_handles"], state["_row_groups"], state["_pid"] = {}, OrderedDict(), -1
        return state

    # ---- order and fingerprint ------------------------------------------------------------------
    def _units(self) -> list[int]:
        """The starts (and the end) of the runs of records read together: the files, or for
        parquet the row groups (a row group is decoded whole)."""
        self._index()
        if self.format != "parquet":
            return self._starts
        groups = self._spans[:, 0]
        change = torch.ones(len(groups), dtype=torch.bool)
        change[1:] = groups[1:] != groups[:-1]
        change[torch.tensor(self._starts[:-1], dtype=torch.int64)] = True  # each file's start
        return [*torch.nonzero(change).flatten().tolist(), self._starts[-1]]

    def global_order(self, seed: int, epoch: int) -> torch.Tensor:
        """The epoch's order: files (parquet: row groups) drawn by ``(seed, epoch)``, records
        shuffled within each ``window`` of them."""
        units = self._units()
        generator = torch.Generator().manual_seed(derive_seed(seed, epoch, len(units) - 1))
        drawn = torch.randperm(len(units) - 1, generator=generator).tolist()
        parts = []
        for w in range(0, len(drawn), self.window):
            rows = torch.cat(
                [torch.arange(units[u], units[u + 1]) for u in drawn[w : w + self.window]]
            )
            parts.append(rows[torch.randperm(len(rows), generator=generator)])
        return torch.cat(parts)

    def data_fingerprint(self) -> list[list[Any]]:
        """Each file's ``[name, size, records, crc32]`` (saved with the loader's state)."""
        return [[s.name, s.size, len(s.spans), s.crc] for s in self._index()]

    def check_data_fingerprint(self, saved: Any) -> None:
        """Refuse, in one line naming the file, files that differ from a saved fingerprint."""
        if not isinstance(saved, list) or not all(
            isinstance(x, (list, tuple)) and len(x) == 4 for x in saved
        ):
            raise UsageError(
                f"the loader state's 'files' is a {type(saved).__name__} in another form; "
                "expected the list RecordFiles.data_fingerprint() returns"
            )
        now = {row[0]: row for row in self.data_fingerprint()}
        then = {row[0]: list(row) for row in saved}
        how = "; resume over the files the checkpoint was saved with, or start a new run"
        for name, row in then.items():
            if name not in now:
                raise DataError(f"data file {name} of the checkpoint is missing now" + how)
            if list(now[name]) != row:
                _, size, records, crc = row
                _, size2, records2, crc2 = now[name]
                raise DataError(
                    f"data file {name} changed since the checkpoint was saved ({size} bytes, "
                    f"{records} records, crc32 {crc:08x} then; {size2} bytes, {records2} "
                    f"records, crc32 {crc2:08x} now)" + how
                )
        for name in now:
            if name not in then:
                raise DataError(f"data file {name} is new since the checkpoint was saved" + how)
