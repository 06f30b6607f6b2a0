"""Helpers to test distributed code: real gloo processes, and test hosts in namespaces."""

from multigpu.testing.distributed import DistributedTestError, free_port, run_distributed
from multigpu.testing.hosts import hosts_available, virtual_hosts

__all__ = [
    "DistributedTestError",
    "free_port",
    "hosts_available",
    "run_distributed",
    "virtual_hosts",
]
