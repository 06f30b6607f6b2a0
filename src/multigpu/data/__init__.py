"""Data sharding: a world-size-invariant, resumable sample order and the loader built on it."""

from __future__ import annotations

from multigpu.data.loader import DistributedLoader, make_loader
from multigpu.data.record_files import RecordFiles
from multigpu.data.sampler import ShardSampler
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
    "TokenFile",
    "build_token_file",
    "make_loader",
]
