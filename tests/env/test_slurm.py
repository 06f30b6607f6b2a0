"""SLURM source: srun steps are detected, batch scripts and interactive shells are not."""

from __future__ import annotations

import pytest

from multigpu.env import ClusterEnv, slurm
from multigpu.errors import EnvError
from tests.env import recorded

JOB_PORT = 15000 + (10 * 123456 + 0) % 17000  # documented derivation for job 123456, step 0


@pytest.mark.parametrize(
    ("procid", "local_rank", "node_rank"), [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1)]
)
def test_recorded_srun_step_n4_on_two_nodes(procid: int, local_rank: int, node_rank: int) -> None:
    assert slurm.from_environ(recorded.srun_task(procid)) == ClusterEnv(
        source="slurm",
        rank=procid,
        local_rank=local_rank,
        world_size=4,
        local_world_size=2,
        node_rank=node_rank,
        num_nodes=2,
        master_addr="node01",
        master_port=JOB_PORT,
    )


@pytest.mark.parametrize(
    "environ",
    [
        recorded.SLURM_BATCH_SCRIPT,
        recorded.SALLOC_SHELL,
        recorded.SALLOC_INTERACTIVE_STEP,
        recorded.SRUN_PTY_SHELL,
        # Some Slurm versions export the batch pseudo step's id (0xFFFFFFFB) instead of none.
        {**recorded.srun_task(0), "SLURM_STEP_ID": "4294967291", "SLURM_STEPID": "4294967291"},
        {**recorded.srun_task(0), "SLURM_STEP_ID": "4294967292", "SLURM_STEPID": "4294967292"},
        recorded.NOISE,
    ],
    ids=["batch", "salloc", "salloc-interactive-step", "srun-pty", "batch-id", "extern-id", "none"],
)
def test_not_an_srun_task(environ: dict[str, str]) -> None:
    assert slurm.from_environ(environ) is None


def test_old_stepid_name_alone_is_enough() -> None:
    environ = recorded.srun_task(1)
    del environ["SLURM_STEP_ID"]
    env = slurm.from_environ(environ)
    assert env is not None and env.rank == 1


def test_master_addr_and_port_override_the_derived_ones() -> None:
    environ = recorded.srun_task(2, {"MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "23456"})
    env = slurm.from_environ(environ)
    assert env is not None
    assert (env.master_addr, env.master_port) == ("10.9.9.9", 23456)


def test_derived_port_agrees_across_tasks_and_differs_between_steps() -> None:
    ports = {slurm.from_environ(recorded.srun_task(i)).master_port for i in range(4)}  # type: ignore[union-attr]
    assert ports == {JOB_PORT}
    step1 = recorded.srun_task(0, {"SLURM_STEP_ID": "1", "SLURM_STEPID": "1"})
    assert slurm.from_environ(step1).master_port != JOB_PORT  # type: ignore[union-attr]
    for job_id in (1, 16999, 17000, 999_999, 4_294_967_000):
        environ = recorded.srun_task(0, {"SLURM_JOB_ID": str(job_id), "SLURM_STEP_ID": "7"})
        port = slurm.from_environ(environ).master_port  # type: ignore[union-attr]
        assert 15000 <= port < 32000  # below Linux's ephemeral range


def test_step_values_win_over_preserved_allocation_values() -> None:
    # `srun --preserve-env -n2 -N1` inside the 4-task allocation keeps SLURM_NTASKS=4 etc.
    environ = recorded.srun_task(
        1,
        {
            "SLURM_STEP_NUM_TASKS": "2",
            "SLURM_STEP_NUM_NODES": "1",
            "SLURM_STEP_TASKS_PER_NODE": "2",
            "SLURM_STEP_NODELIST": "node02",
            "SLURM_NODEID": "0",
        },
    )
    env = slurm.from_environ(environ)
    assert env is not None
    assert (env.world_size, env.num_nodes, env.local_world_size) == (2, 1, 2)
    assert env.master_addr == "node02"


def test_uneven_tasks_per_node_picks_this_nodes_entry() -> None:
    # srun -n5 -N3 --distribution=block: 2,2,1 tasks; task 4 is alone on the third node.
    environ = recorded.srun_task(
        0,
        {
            "SLURM_PROCID": "4",
            "SLURM_LOCALID": "0",
            "SLURM_NODEID": "2",
            "SLURM_STEP_NUM_TASKS": "5",
            "SLURM_STEP_NUM_NODES": "3",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2),1",
            "SLURM_STEP_NODELIST": "gpu-[001-003]-ib",
        },
    )
    env = slurm.from_environ(environ)
    assert env is not None
    assert (env.local_world_size, env.node_rank, env.num_nodes) == (1, 2, 3)
    assert env.master_addr == "gpu-001-ib"


def test_job_nodelist_used_when_step_nodelist_missing() -> None:
    environ = recorded.srun_task(0, {"SLURM_JOB_NODELIST": "c[7-8]"})
    del environ["SLURM_STEP_NODELIST"]
    assert slurm.from_environ(environ).master_addr == "c7"  # type: ignore[union-attr]


def test_even_split_when_tasks_per_node_missing() -> None:
    environ = recorded.srun_task(3)
    del environ["SLURM_STEP_TASKS_PER_NODE"], environ["SLURM_TASKS_PER_NODE"]
    assert slurm.from_environ(environ).local_world_size == 2  # type: ignore[union-attr]
    environ["SLURM_STEP_NUM_TASKS"] = environ["SLURM_NTASKS"] = "3"
    environ["SLURM_PROCID"] = "2"
    with pytest.raises(EnvError, match="do not split evenly"):
        slurm.from_environ(environ)


def test_missing_task_variables_are_all_listed() -> None:
    environ = recorded.srun_task(0)
    for name in ("SLURM_PROCID", "SLURM_LOCALID"):
        del environ[name]
    with pytest.raises(EnvError, match="SLURM_PROCID, SLURM_LOCALID not set"):
        slurm.from_environ(environ)


def test_no_nodelist_and_no_master_addr() -> None:
    environ = recorded.srun_task(0)
    for name in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"):
        del environ[name]
    with pytest.raises(EnvError, match="export MASTER_ADDR"):
        slurm.from_environ(environ)
    assert slurm.from_environ({**environ, "MASTER_ADDR": "n1"}).master_addr == "n1"  # type: ignore[union-attr]


def test_no_job_id_and_no_master_port() -> None:
    environ = recorded.srun_task(0)
    del environ["SLURM_JOB_ID"], environ["SLURM_JOBID"]
    with pytest.raises(EnvError, match="export MASTER_PORT"):
        slurm.from_environ(environ)


@pytest.mark.parametrize(
    ("changes", "pattern"),
    [
        ({"SLURM_PROCID": "x"}, r"SLURM_PROCID='x' is not an integer"),
        ({"SLURM_PROCID": "-1"}, r"SLURM_PROCID=-1 is out of range"),
        ({"SLURM_PROCID": "4"}, r"SLURM_PROCID=4 but SLURM_STEP_NUM_TASKS=4; expected a rank"),
        ({"SLURM_LOCALID": "2"}, r"SLURM_LOCALID=2 but SLURM_STEP_TASKS_PER_NODE\[SLURM_NODEID\]"),
        ({"SLURM_NODEID": "2"}, r"SLURM_NODEID=2 but SLURM_STEP_NUM_NODES=2"),
        ({"SLURM_STEP_NUM_TASKS": "0"}, r"SLURM_STEP_NUM_TASKS=0 is out of range"),
        ({"SLURM_STEP_NUM_TASKS": "6"}, r"describes 2 nodes and 4 tasks but SLURM_STEP_NUM_NODES"),
        ({"SLURM_STEP_TASKS_PER_NODE": "2(x3)"}, r"describes 3 nodes"),
        ({"SLURM_STEP_TASKS_PER_NODE": "two"}, r"tasks-per-node list 'two'"),
        ({"SLURM_STEP_NODELIST": "node[01-"}, r"host list 'node\[01-'"),
        ({"SLURM_STEP_ID": "zero"}, r"SLURM_STEP_ID='zero' is not an integer"),
        ({"MASTER_PORT": "99999"}, r"MASTER_PORT=99999 is not a TCP port"),
        ({"SLURM_JOB_ID": "12.5"}, r"SLURM_JOB_ID='12.5' is not an integer"),
    ],
)
def test_bad_values(changes: dict[str, str], pattern: str) -> None:
    with pytest.raises(EnvError, match=pattern) as info:
        slurm.from_environ(recorded.srun_task(3, changes))
    assert "\n" not in str(info.value) and "srun" in str(info.value)
