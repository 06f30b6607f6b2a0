"""Checkpoints: atomic writes (more to come: manager, RNG state, portable loading)."""

from multigpu.checkpoint.atomic import atomic_write

__all__ = ["atomic_write"]
