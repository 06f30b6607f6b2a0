"""MPI source: Open MPI, MPICH/Hydra/Intel MPI and MVAPICH variables, no mpi4py."""

from __future__ import annotations

import pytest

from multigpu.env import ClusterEnv, mpi
from multigpu.errors import EnvError
from tests.env import recorded


def one_node(rank: int) -> ClusterEnv:
    return ClusterEnv(
        source="mpi",
        rank=rank,
        local_rank=rank,
        world_size=2,
        local_world_size=2,
        node_rank=0,
        num_nodes=1,
        master_addr="127.0.0.1",
        master_port=29500,
    )


@pytest.mark.parametrize("rank", [0, 1])
def test_recorded_openmpi4_mpirun_np2(rank: int) -> None:
    assert mpi.from_environ(recorded.openmpi_rank(rank)) == one_node(rank)


@pytest.mark.parametrize("rank", [0, 1])
def test_recorded_mpich_mpiexec_n2(rank: int) -> None:
    assert mpi.from_environ(recorded.mpich_rank(rank)) == one_node(rank)


def test_mvapich() -> None:
    environ = {
        "MV2_COMM_WORLD_RANK": "1",
        "MV2_COMM_WORLD_SIZE": "2",
        "MV2_COMM_WORLD_LOCAL_RANK": "1",
        "MV2_COMM_WORLD_LOCAL_SIZE": "2",
    }
    assert mpi.from_environ(environ) == one_node(1)


def test_absent() -> None:
    assert mpi.from_environ(recorded.NOISE) is None
    assert mpi.world_position(recorded.NOISE) is None


def test_master_port_and_addr_honoured() -> None:
    environ = {**recorded.openmpi_rank(1), "MASTER_ADDR": "h0", "MASTER_PORT": "31000"}
    env = mpi.from_environ(environ)
    assert env is not None and (env.master_addr, env.master_port) == ("h0", 31000)


def test_multi_node_needs_master_addr() -> None:
    environ = recorded.openmpi_rank(5, size=8, local_size=4)
    with pytest.raises(EnvError, match=r"spans 2 nodes.*mpirun -x MASTER_ADDR") as info:
        mpi.from_environ(environ)
    assert "\n" not in str(info.value)
    env = mpi.from_environ({**environ, "MASTER_ADDR": "node01"})
    assert env is not None
    # Block mapping: ranks 4..7 on the second node.
    assert (env.rank, env.local_rank, env.node_rank, env.num_nodes) == (5, 1, 1, 2)
    assert env.master_addr == "node01"


def test_uneven_ranks_per_node_rejected() -> None:
    environ = {**recorded.openmpi_rank(2, size=3, local_size=2), "MASTER_ADDR": "h0"}
    with pytest.raises(EnvError, match="OMPI_COMM_WORLD_SIZE=3 is not a multiple of"):
        mpi.from_environ(environ)


def test_missing_local_variables_listed() -> None:
    with pytest.raises(EnvError, match="MPI_LOCALRANKID, MPI_LOCALNRANKS not set"):
        mpi.from_environ({"PMI_RANK": "0", "PMI_SIZE": "2"})


def test_world_position_reads_only_rank_and_size() -> None:
    assert mpi.world_position({"PMI_RANK": "3", "PMI_SIZE": "4"}) == (3, 4)
    with pytest.raises(EnvError, match="PMI_SIZE is not set"):
        mpi.world_position({"PMI_RANK": "3"})


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"OMPI_COMM_WORLD_RANK": "r"}, r"OMPI_COMM_WORLD_RANK='r' is not an integer"),
        ({"OMPI_COMM_WORLD_RANK": "-3"}, r"OMPI_COMM_WORLD_RANK=-3 is out of range"),
        ({"OMPI_COMM_WORLD_RANK": "2"}, r"OMPI_COMM_WORLD_RANK=2 but OMPI_COMM_WORLD_SIZE=2"),
        ({"OMPI_COMM_WORLD_SIZE": "0"}, r"OMPI_COMM_WORLD_SIZE=0 is out of range"),
        (
            {"OMPI_COMM_WORLD_LOCAL_RANK": "2"},
            r"OMPI_COMM_WORLD_LOCAL_RANK=2 but OMPI_COMM_WORLD_LOCAL_SIZE=2",
        ),
        (
            {"OMPI_COMM_WORLD_LOCAL_SIZE": "4"},
            r"OMPI_COMM_WORLD_SIZE=2 is not a multiple of OMPI_COMM_WORLD_LOCAL_SIZE=4",
        ),
        ({"MASTER_PORT": "-1"}, r"MASTER_PORT=-1 is out of range"),
        ({"MASTER_PORT": "70000"}, r"MASTER_PORT=70000 is not a TCP port"),
    ],
)
def test_bad_values(changes: dict[str, str], pattern: str) -> None:
    with pytest.raises(EnvError, match=pattern) as info:
        mpi.from_environ({**recorded.openmpi_rank(1), **changes})
    assert "\n" not in str(info.value) and "expected" in str(info.value)
