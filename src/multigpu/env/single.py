"""The fallback source: one process, started by plain ``python`` (or anything we do not know).

``MASTER_ADDR`` / ``MASTER_PORT`` are still honoured, so a one-process job that creates a process
group anyway (tests, a store shared with a helper) binds where the user asked.

Environment variables read: ``MASTER_ADDR``, ``MASTER_PORT``.
"""

from __future__ import annotations

from collections.abc import Mapping

from multigpu.env._common import DEFAULT_PORT, LOCALHOST, master_port, value
from multigpu.env.types import ClusterEnv

FIX = "unset MASTER_PORT or give it a port number in 1..65535"


def from_environ(environ: Mapping[str, str]) -> ClusterEnv:
    """Rank 0 of 1 on node 0 of 1; never None (this source is always present).

    Raises:
        EnvError: ``MASTER_PORT`` is set but not a TCP port.

    Example:
        >>> env = from_environ({})
        >>> env.world_size, env.master_addr, env.master_port
        (1, '127.0.0.1', 29500)
    """
    return ClusterEnv(
        source="single",
        rank=0,
        local_rank=0,
        world_size=1,
        local_world_size=1,
        node_rank=0,
        num_nodes=1,
        master_addr=value(environ, "MASTER_ADDR") or LOCALHOST,
        master_port=master_port(environ, DEFAULT_PORT, fix=FIX),
    )
