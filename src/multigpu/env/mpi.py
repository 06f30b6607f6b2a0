"""The MPI source: processes started by ``mpirun`` / ``mpiexec``, read from variables only.

No mpi4py: every common MPI launcher already writes the rank, the size and the node-local rank
and size into each process's environment before it starts:

==================  ===========================  ==========================  =====================
launcher            rank / size                  local rank                  local size
==================  ===========================  ==========================  =====================
Open MPI            OMPI_COMM_WORLD_RANK/_SIZE   OMPI_COMM_WORLD_LOCAL_RANK  ..._LOCAL_SIZE
MPICH, Intel MPI    PMI_RANK / PMI_SIZE          MPI_LOCALRANKID             MPI_LOCALNRANKS
MVAPICH             MV2_COMM_WORLD_RANK/_SIZE    MV2_COMM_WORLD_LOCAL_RANK   ..._LOCAL_SIZE
==================  ===========================  ==========================  =====================

MPI says nothing about node indices, so ``node_rank = rank // local_size`` assumes the default
*block* mapping (``--map-by slot``/``core`` in Open MPI, ``-ppn`` in Hydra): ranks fill a node
before the next, the same number on each. Round-robin mappings (``--map-by node``) break that;
launch with torchrun there, or pass the node facts through torchrun's variables.

Nobody tells MPI processes a rendezvous address either: ``MASTER_ADDR`` must be exported to
every rank (``mpirun -x MASTER_ADDR=...`` for Open MPI, ``-genv MASTER_ADDR ...`` for Hydra)
unless the whole job is on one node, where 127.0.0.1 is right. The port is ``MASTER_PORT`` or
29500.

Environment variables read: those of the table, ``MASTER_ADDR``, ``MASTER_PORT``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from multigpu.env._common import DEFAULT_PORT, LOCALHOST, build, first, master_port, to_int, value
from multigpu.env.types import ClusterEnv
from multigpu.errors import EnvError

FIX = (
    "start one process per rank with mpirun/mpiexec and export MASTER_ADDR (and MASTER_PORT) to "
    "all of them, or launch with `multigpu run` / `torchrun` instead"
)


@dataclass(frozen=True, kw_only=True)
class Flavour:
    """The variable names one MPI implementation's launcher sets (``name`` is for messages)."""

    name: str
    rank: str
    size: str
    local_rank: str
    local_size: str


FLAVOURS = (
    Flavour(
        name="Open MPI",
        rank="OMPI_COMM_WORLD_RANK",
        size="OMPI_COMM_WORLD_SIZE",
        local_rank="OMPI_COMM_WORLD_LOCAL_RANK",
        local_size="OMPI_COMM_WORLD_LOCAL_SIZE",
    ),
    Flavour(
        name="MPICH/Intel MPI (Hydra)",
        rank="PMI_RANK",
        size="PMI_SIZE",
        local_rank="MPI_LOCALRANKID",
        local_size="MPI_LOCALNRANKS",
    ),
    Flavour(
        name="MVAPICH",
        rank="MV2_COMM_WORLD_RANK",
        size="MV2_COMM_WORLD_SIZE",
        local_rank="MV2_COMM_WORLD_LOCAL_RANK",
        local_size="MV2_COMM_WORLD_LOCAL_SIZE",
    ),
)
"""Checked in this order; the first whose rank or size variable is set is the one used."""


def flavour(environ: Mapping[str, str]) -> Flavour | None:
    """The MPI launcher that started this process, or None.

    Example:
        >>> flavour({"PMI_RANK": "0", "PMI_SIZE": "2"}).name
        'MPICH/Intel MPI (Hydra)'
    """
    return next((f for f in FLAVOURS if first(environ, f.rank, f.size) is not None), None)


def world_position(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """``(rank, world_size)`` as the MPI launcher gives them, or None without one.

    Reads only the two variables a direct ``srun --mpi=pmi2`` launch also sets, so that a SLURM
    step can be compared with it without requiring the rest.

    Example:
        >>> world_position({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
        (1, 2)
    """
    found = flavour(environ)
    if found is None:
        return None
    return _need(environ, found, found.rank, 0), _need(environ, found, found.size, 1)


def from_environ(environ: Mapping[str, str]) -> ClusterEnv | None:
    """Read an MPI rank's position; None when no MPI launcher started this process.

    Raises:
        EnvError: a variable of the detected launcher is missing or bad, the ranks do not
            split evenly over nodes, or a multi-node job has no ``MASTER_ADDR``.

    Example:
        >>> env = from_environ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2",
        ...     "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"})
        >>> env.rank, env.master_addr, env.master_port
        (1, '127.0.0.1', 29500)
    """
    found = flavour(environ)
    if found is None:
        return None
    names = (found.rank, found.size, found.local_rank, found.local_size)
    missing = [n for n in names if value(environ, n) is None]
    if missing:
        raise EnvError(
            f"{found.name} launcher detected but {', '.join(missing)} not set; expected all of "
            f"{', '.join(names)}; {FIX}"
        )
    rank, world_size = world_position(environ) or (0, 1)
    local_rank = _need(environ, found, found.local_rank, 0)
    local_size = _need(environ, found, found.local_size, 1)
    if world_size % local_size:
        raise EnvError(
            f"{found.size}={world_size} is not a multiple of {found.local_size}={local_size}; "
            f"expected the same number of ranks on every node (node indices are derived from "
            f"it); {FIX}"
        )
    addr = value(environ, "MASTER_ADDR") or (LOCALHOST if local_size == world_size else None)
    if addr is None:
        raise EnvError(
            f"{found.name} job spans {world_size // local_size} nodes ({found.size}="
            f"{world_size}, {found.local_size}={local_size}) but MASTER_ADDR is not set; "
            f"expected the host of rank 0 in MASTER_ADDR on every rank; export it, e.g. "
            f"`mpirun -x MASTER_ADDR=$(hostname) ...` (Open MPI) or "
            f"`mpiexec -genv MASTER_ADDR $(hostname) ...` (Hydra)"
        )
    fields = {
        "rank": (found.rank, rank),
        "world_size": (found.size, world_size),
        "local_rank": (found.local_rank, local_rank),
        "local_world_size": (found.local_size, local_size),
        # Block mapping assumed: see the module docstring.
        "node_rank": (f"{found.rank} // {found.local_size}", rank // local_size),
        "num_nodes": (f"{found.size} // {found.local_size}", world_size // local_size),
    }
    port = master_port(environ, DEFAULT_PORT, fix=FIX)
    return build("mpi", fields, master_addr=addr, master_port=port, fix=FIX)


def _need(environ: Mapping[str, str], found: Flavour, name: str, minimum: int) -> int:
    text = value(environ, name)
    if text is None:
        raise EnvError(
            f"{found.name} launcher detected but {name} is not set; expected {found.rank} and "
            f"{found.size} together; {FIX}"
        )
    return to_int(name, text, minimum=minimum, fix=FIX)
