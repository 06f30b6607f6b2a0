"""A stream's bad record, named: where in the stream reading failed, in one line.

A stream's own error (a Hugging Face JSON stream's ``ArrowInvalid: JSON parse error: ... in row
20``) says what is wrong but not where: not which shard, not which epoch. ``named`` wraps the
reading of a stream or a shard so that a ``ValueError``, ``KeyError`` or ``TypeError`` raised by
it (what a malformed, truncated or mis-typed record raises) becomes a ``DataError`` naming the
stream, the shard and the record count read before it; other errors (a lost connection, a full
disk) pass as they are. A generator that raised cannot go on, so a stream's bad records cannot be
skipped: ``RecordFiles(..., on_bad="skip")`` reads JSON-lines, text and parquet files skipping and
counting them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from multigpu.errors import DataError

BAD_RECORD = (ValueError, KeyError, TypeError)


def named(items: Iterable[Any], where: str) -> Iterator[Any]:
    """``items``, with a bad record's error said as a ``DataError`` naming ``where``.

    Example:
        >>> def broken():
        ...     yield 1
        ...     raise ValueError("JSON parse error in row 1")
        >>> try:
        ...     list(named(broken(), "shard 3 of S"))
        ... except DataError as e:
        ...     print(str(e).split(";")[0])
        shard 3 of S: reading failed after record 1: ValueError: JSON parse error in row 1
    """
    read = 0
    try:
        for item in items:
            yield item
            read += 1
    except DataError:
        raise
    except BAD_RECORD as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        raise DataError(
            f"{where}: reading failed after record {read}: {type(e).__name__}: {first}; fix or "
            "remove that record (RecordFiles(..., on_bad='skip') reads JSON-lines, text and "
            "parquet files skipping bad records)"
        ) from e
