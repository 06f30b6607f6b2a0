"""ClusterEnv: where this process sits in the job, as read from the environment."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Source = Literal["torchrun", "ray", "slurm", "mpi", "single"]


@dataclass(frozen=True, kw_only=True)
class ClusterEnv:
    """The position of this process in a distributed job. Immutable; made by ``detect``."""

    source: Source
    """Who launched us: ``torchrun`` (also ``multigpu run``), ``ray`` (a Ray Train worker, whose
    process group Ray made), ``slurm``, ``mpi`` or ``single``."""
    rank: int
    """Global rank, 0 .. world_size - 1."""
    local_rank: int
    """Rank within this node, 0 .. local_world_size - 1."""
    world_size: int
    """Number of processes in the job."""
    local_world_size: int
    """Number of processes on this node."""
    node_rank: int
    """Index of this node, 0 .. num_nodes - 1."""
    num_nodes: int
    """Number of nodes in the job."""
    master_addr: str
    """Address of the rendezvous store (rank 0's host)."""
    master_port: int
    """Port of the rendezvous store."""
    restart_count: int = 0
    """How many times the elastic agent restarted the workers (``TORCHELASTIC_RESTART_COUNT``)."""
    agent_store: bool = False
    """torchrun's agent hosts the process group's store (``TORCHELASTIC_USE_AGENT_STORE``)."""

    @property
    def is_distributed(self) -> bool:
        """True when more than one process takes part."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """True on global rank 0."""
        return self.rank == 0
