"""Helpers to test distributed code on CPU with real gloo processes."""

from multigpu.testing.distributed import DistributedTestError, free_port, run_distributed

__all__ = ["DistributedTestError", "free_port", "run_distributed"]
