"""Data sharding: a world-size-invariant, resumable sample order and the loaders built on it
(``DistributedLoader`` for map-style datasets, ``StreamLoader`` for streams)."""

from __future__ import annotations

from multigpu.data.loader import DistributedLoader, make_loader
from multigpu.data.record_files import RecordFiles
from multigpu.data.sampler import ShardSampler
from multigpu.data.stream_loader import StreamLoader
from multigpu.data.token_file import (
    IGNORE_INDEX,
    PackedSequences,
    TokenFile,
    build_token_file,
)

__all__ = [
    "IGNORE_INDEX",
    "DistributedLoader",
    "PackedSequences",
    "RecordFiles",
    "ShardSampler",
    "StreamLoader",
    "TokenFile",
    "build_token_file",
    "make_loader",
]
