"""Read an offline W&B run file (``run-<id>.wandb``) with wandb's own record type.

wandb 0.19+ has no Python reader of its run files any more (the Go core writes them); the file
is a 7-byte ``:W&B`` header and LevelDB-log records (32 KiB blocks, each record a 7-byte
header: crc32c, length, type) holding ``wandb_internal_pb2.Record`` protobufs.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: Path) -> list[Any]:
    """Every record of the run file, in order."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file"
    found: list[Any] = []
    pos, pending = 7, b""
    while pos + 7 <= len(data):
        left = BLOCK - pos % BLOCK
        if left < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        length, kind = struct.unpack("<HB", data[pos + 4 : pos + 7])
        chunk = data[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending = chunk if kind in (FULL, FIRST) else pending + chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            found.append(record)
    return found


def history(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The (step, values) rows that ``run.log`` wrote."""
    rows = []
    for record in records(path):
        if record.WhichOneof("record_type") == "history":
            values = {
                item.key or "/".join(item.nested_key): json.loads(item.value_json)
                for item in record.history.item
            }
            rows.append((record.history.step.num, values))
    return rows
