"""Data sharding: a world-size-invariant, resumable sample order and the loader built on it."""

from __future__ import annotations

from multigpu.data.loader import DistributedLoader, make_loader
from multigpu.data.sampler import ShardSampler

__all__ = ["DistributedLoader", "ShardSampler", "make_loader"]
