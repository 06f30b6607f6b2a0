"""torchrun / env:// source: recorded torchrun environments and every bad combination."""

from __future__ import annotations

import pytest

from multigpu.env import ClusterEnv, torchrun
from multigpu.errors import EnvError
from tests.env import recorded

BASE = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.1.2.3", "MASTER_PORT": "29500"}


@pytest.mark.parametrize("rank", [0, 1])
def test_recorded_standalone_torchrun(rank: int) -> None:
    assert torchrun.from_environ(recorded.torchrun_standalone(rank)) == ClusterEnv(
        source="torchrun",
        rank=rank,
        local_rank=rank,
        world_size=2,
        local_world_size=2,
        node_rank=0,
        num_nodes=1,
        master_addr="localhost",
        master_port=37645,
        restart_count=0,
        agent_store=True,  # recorded from torch's agent, which shares its store
    )


def test_recorded_multinode_torchrun_after_restarts() -> None:
    env = torchrun.from_environ(recorded.torchrun_multinode(node=1, local=3, restarts=2))
    assert env == ClusterEnv(
        source="torchrun",
        rank=7,
        local_rank=3,
        world_size=8,
        local_world_size=4,
        node_rank=1,
        num_nodes=2,
        master_addr="h0.cluster",
        master_port=44321,
        restart_count=2,
    )
    assert env.is_distributed and not env.is_main


@pytest.mark.parametrize("environ", [{}, {"LOCAL_RANK": "0"}, {"MASTER_ADDR": "h", "RANK": " "}])
def test_absent_without_rank_world_size_or_run_id(environ: dict[str, str]) -> None:
    assert torchrun.from_environ(environ) is None


def test_hand_rolled_launcher_without_local_variables_means_one_node() -> None:
    env = torchrun.from_environ(BASE)
    assert env is not None
    assert (env.local_rank, env.local_world_size, env.node_rank, env.num_nodes) == (1, 2, 0, 1)


def test_nodes_derived_from_local_world_size_without_group_variables() -> None:
    environ = {**BASE, "RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    env = torchrun.from_environ(environ)
    assert env is not None
    assert (env.node_rank, env.num_nodes) == (1, 2)


def test_group_world_size_allows_uneven_nodes() -> None:
    # 2 processes on node 0, 1 on node 1: WORLD_SIZE=3 is not a multiple of 2.
    environ = {
        **BASE,
        "RANK": "2",
        "WORLD_SIZE": "3",
        "LOCAL_RANK": "0",
        "LOCAL_WORLD_SIZE": "1",
        "GROUP_RANK": "1",
        "GROUP_WORLD_SIZE": "2",
    }
    env = torchrun.from_environ(environ)
    assert env is not None
    assert (env.node_rank, env.num_nodes, env.local_world_size) == (1, 2, 1)
    uneven = {**environ, "LOCAL_WORLD_SIZE": "2", "LOCAL_RANK": "0", "RANK": "0"}
    del uneven["GROUP_WORLD_SIZE"]
    with pytest.raises(EnvError, match=r"WORLD_SIZE=3 is not a multiple of LOCAL_WORLD_SIZE=2"):
        torchrun.from_environ(uneven)


def test_missing_required_variables_are_all_listed() -> None:
    with pytest.raises(EnvError) as info:
        torchrun.from_environ({"RANK": "0"})
    message = str(info.value)
    assert "WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set" in message
    assert "RANK=0" in message and "\n" not in message


def test_run_id_alone_is_present_but_incomplete() -> None:
    with pytest.raises(EnvError, match="RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT not set"):
        torchrun.from_environ({"TORCHELASTIC_RUN_ID": "abc"})


def test_blank_master_addr_counts_as_missing() -> None:
    with pytest.raises(EnvError, match="MASTER_ADDR not set"):
        torchrun.from_environ({**BASE, "MASTER_ADDR": "  "})


@pytest.mark.parametrize(
    ("given", "absent"),
    [("LOCAL_RANK", "LOCAL_WORLD_SIZE"), ("LOCAL_WORLD_SIZE", "LOCAL_RANK")],
)
def test_one_local_variable_without_the_other(given: str, absent: str) -> None:
    with pytest.raises(EnvError, match=f"{given} is set but {absent} is not"):
        torchrun.from_environ({**BASE, given: "1"})


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"RANK": "one"}, r"RANK='one' is not an integer"),
        ({"RANK": "1.0"}, r"RANK='1.0' is not an integer"),
        ({"RANK": "-1"}, r"RANK=-1 is out of range"),
        ({"WORLD_SIZE": "0"}, r"WORLD_SIZE=0 is out of range; expected a number >= 1"),
        ({"MASTER_PORT": "0"}, r"MASTER_PORT=0 is not a TCP port"),
        ({"MASTER_PORT": "65536"}, r"MASTER_PORT=65536 is not a TCP port; expected 1..65535"),
        ({"MASTER_PORT": "http"}, r"MASTER_PORT='http' is not an integer"),
        ({"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "0"}, r"LOCAL_WORLD_SIZE=0 is out of range"),
        ({"TORCHELASTIC_RESTART_COUNT": "-2"}, r"TORCHELASTIC_RESTART_COUNT=-2 is out of range"),
        ({"GROUP_RANK": "x"}, r"GROUP_RANK='x' is not an integer"),
        ({"RANK": "2"}, r"RANK=2 but WORLD_SIZE=2; expected a rank in 0\.\.1"),
        (
            {"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"},
            r"LOCAL_RANK=2 but LOCAL_WORLD_SIZE=2; expected a rank in 0\.\.1",
        ),
        (
            {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "4"},
            r"LOCAL_WORLD_SIZE=4 exceeds WORLD_SIZE=2",
        ),
        (
            {"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1"},
            r"GROUP_RANK=1 but WORLD_SIZE // LOCAL_WORLD_SIZE=1; expected a node index in 0\.\.0",
        ),
        (
            {
                "LOCAL_RANK": "1",
                "LOCAL_WORLD_SIZE": "2",
                "GROUP_WORLD_SIZE": "3",
                "GROUP_RANK": "0",
            },
            r"GROUP_WORLD_SIZE=3 exceeds WORLD_SIZE=2",
        ),
    ],
)
def test_bad_values_raise_one_line_env_errors(changes: dict[str, str], pattern: str) -> None:
    with pytest.raises(EnvError, match=pattern) as info:
        torchrun.from_environ({**BASE, **changes})
    message = str(info.value)
    assert "\n" not in message
    assert "expected" in message and "torchrun" in message  # what, expected, how to fix


def test_bad_integer_error_is_chained() -> None:
    with pytest.raises(EnvError) as info:
        torchrun.from_environ({**BASE, "WORLD_SIZE": "two"})
    assert isinstance(info.value.__cause__, ValueError)
