"""detect(): priority torchrun > SLURM > MPI > single, and launchers nested in each other."""

from __future__ import annotations

import os
from types import MappingProxyType

import pytest

from multigpu.env import ClusterEnv, detect
from multigpu.errors import EnvError
from tests.env import recorded

MANUAL = {"MASTER_ADDR": "node01", "MASTER_PORT": "29400"}


def test_nothing_means_single() -> None:
    assert detect(recorded.NOISE).source == "single"


@pytest.mark.parametrize(
    "environ",
    [
        recorded.SLURM_BATCH_SCRIPT,
        recorded.SALLOC_SHELL,
        recorded.SALLOC_INTERACTIVE_STEP,
        recorded.SRUN_PTY_SHELL,
    ],
    ids=["batch", "salloc", "salloc-interactive-step", "srun-pty"],
)
def test_slurm_shells_are_single_processes(environ: dict[str, str]) -> None:
    env = detect(environ)
    assert (env.source, env.world_size, env.rank) == ("single", 1, 0)


def test_each_source_alone() -> None:
    assert detect(recorded.torchrun_standalone(1)).source == "torchrun"
    assert detect(recorded.srun_task(2)).source == "slurm"
    assert detect(recorded.openmpi_rank(1)).source == "mpi"
    assert detect(recorded.mpich_rank(0)).source == "mpi"


@pytest.mark.parametrize(("node", "local"), [(0, 0), (1, 3)])
def test_srun_torchrun_torchrun_wins_silently(node: int, local: int) -> None:
    env = detect(recorded.srun_torchrun_worker(node, local))
    assert (env.source, env.rank, env.world_size) == ("torchrun", node * 4 + local, 8)
    assert (env.local_rank, env.local_world_size, env.node_rank) == (local, 4, node)


def test_torchrun_wins_over_everything_even_broken_outer_variables() -> None:
    environ = {
        **recorded.openmpi_rank(1, size=8, local_size=4),  # multi-node MPI, no MASTER_ADDR
        **recorded.srun_task(3, {"SLURM_PROCID": "bogus"}),
        **recorded.torchrun_standalone(0),
    }
    assert detect(environ).source == "torchrun"


def test_mpi_with_agreeing_slurm_step_is_slurm() -> None:
    # srun --mpi=pmi2: PMI_RANK/PMI_SIZE agree with the step; no MPI_LOCALRANKID needed.
    env = detect(recorded.srun_pmi2_task(3))
    assert (env.source, env.rank, env.world_size, env.master_addr) == ("slurm", 3, 4, "node01")


@pytest.mark.parametrize(("rank", "local"), [(2, 0), (3, 1)])
def test_openmpi_inside_sbatch_mpi_wins_over_daemon_step(rank: int, local: int) -> None:
    env = detect(recorded.openmpi_in_sbatch(rank))
    assert env == ClusterEnv(
        source="mpi",
        rank=rank,
        local_rank=local,
        world_size=4,
        local_world_size=2,
        node_rank=1,
        num_nodes=2,
        master_addr="node01",
        master_port=29500,
    )


def test_mpirun_in_batch_script_on_first_node_is_mpi() -> None:
    environ = {**recorded.SLURM_BATCH_SCRIPT, **recorded.openmpi_rank(0, size=4, local_size=2)}
    env = detect({**environ, "MASTER_ADDR": "node01"})
    assert (env.source, env.rank, env.node_rank) == ("mpi", 0, 0)


def test_job_script_exports_next_to_srun_are_accepted_when_they_agree() -> None:
    # sbatch: export MASTER_ADDR=... MASTER_PORT=... WORLD_SIZE=$SLURM_NTASKS; srun python x.py
    env = detect(recorded.srun_task(3, {**MANUAL, "WORLD_SIZE": "4"}))
    assert (env.source, env.rank, env.world_size) == ("slurm", 3, 4)
    assert (env.master_addr, env.master_port) == ("node01", 29400)


@pytest.mark.parametrize(
    ("exports", "pattern"),
    [
        ({"WORLD_SIZE": "2"}, r"WORLD_SIZE=2 but slurm started this process with world_size=4"),
        ({"RANK": "0"}, r"RANK=0 but slurm started this process with rank=3"),
        ({"WORLD_SIZE": "4", "LOCAL_RANK": "0"}, r"LOCAL_RANK=0 but .* local_rank=1"),
        ({"WORLD_SIZE": "four"}, r"WORLD_SIZE='four' is not an integer"),
    ],
)
def test_contradicting_exports_inside_srun_step(exports: dict[str, str], pattern: str) -> None:
    with pytest.raises(EnvError, match=pattern) as info:
        detect(recorded.srun_task(3, {**MANUAL, **exports}))
    assert "\n" not in str(info.value) and "unset it" in str(info.value)


def test_contradicting_exports_inside_mpirun() -> None:
    with pytest.raises(EnvError, match=r"WORLD_SIZE=8 but mpi started this process"):
        detect({**recorded.openmpi_rank(1), "WORLD_SIZE": "8"})


def test_launcher_inside_single_task_step_is_trusted() -> None:
    # `srun -n1 pytest` running multigpu.testing.run_distributed: complete env://, no agent.
    environ = recorded.srun_task(
        0,
        {
            "SLURM_STEP_NUM_TASKS": "1",
            "SLURM_NTASKS": "1",
            "SLURM_STEP_NUM_NODES": "1",
            "SLURM_NNODES": "1",
            "SLURM_STEP_TASKS_PER_NODE": "1",
            "SLURM_STEP_NODELIST": "n1",
        },
    )
    assert detect(environ).source == "slurm"
    workers = {
        **environ,
        **MANUAL,
        "RANK": "1",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "LOCAL_WORLD_SIZE": "2",
    }
    env = detect(workers)
    assert (env.source, env.rank, env.world_size) == ("torchrun", 1, 2)


@pytest.mark.parametrize(
    ("rank", "world_size"),
    [("1", "2"), ("0", "4"), ("3", "6")],
    ids=["fewer-than-tasks", "same-size-wrong-rank", "not-a-multiple"],
)
def test_complete_env_vars_contradicting_multi_task_step(rank: str, world_size: str) -> None:
    environ = recorded.srun_task(3, {**MANUAL, "RANK": rank, "WORLD_SIZE": world_size})
    with pytest.raises(EnvError, match="without torchrun's agent") as info:
        detect(environ)
    assert f"WORLD_SIZE={world_size}" in str(info.value) and "rank 3 of 4" in str(info.value)


def test_complete_env_vars_matching_step_are_used() -> None:
    env = detect(recorded.srun_task(3, {**MANUAL, "RANK": "3", "WORLD_SIZE": "4"}))
    assert (env.source, env.rank) == ("torchrun", 3)


def test_incomplete_torchrun_without_scheduler_is_an_error() -> None:
    with pytest.raises(EnvError, match="torchrun-style environment is incomplete"):
        detect({"WORLD_SIZE": "2"})


def test_pure_function_of_a_read_only_mapping() -> None:
    environ = recorded.srun_task(1)
    frozen = MappingProxyType(dict(environ))
    assert detect(frozen) == detect(environ)
    assert dict(frozen) == environ


_PREFIXES = ("SLURM_", "OMPI_", "PMI_", "MV2_", "MPI_LOCAL", "TORCHELASTIC_", "GROUP_")
_NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def test_none_reads_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith(_PREFIXES) or key in _NAMES:
            monkeypatch.delenv(key)
    assert detect().source == "single"
    for key, val in recorded.torchrun_standalone(1).items():
        monkeypatch.setenv(key, val)
    env = detect()
    assert (env.source, env.rank, env.master_port) == ("torchrun", 1, 37645)
