"""Ray Train source: a TorchTrainer worker's recorded environment, and what is not one."""

from __future__ import annotations

import pytest

from multigpu.env import ClusterEnv, detect, ray
from multigpu.errors import EnvError


def ray_worker(rank: int, **changes: str) -> dict[str, str]:
    """What ray 2.60.0's TorchTrainer gave worker ``rank`` of 2 on one node (use_gpu=False),
    recorded in the training function, less the variables of no concern here."""
    found = {
        "ACCELERATE_TORCH_DEVICE": "cpu",
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "192.0.2.2",
        "MASTER_PORT": "50903",
        "NODE_RANK": "0",
        "OMP_NUM_THREADS": "1",
        "RANK": str(rank),
        "RAY_CLIENT_MODE": "0",
        "RAY_JOB_ID": "01000000",
        "RAY_RAYLET_PID": "1241",
        "WORLD_SIZE": "2",
    }
    found.update(changes)
    return found


@pytest.mark.parametrize("rank", [0, 1])
def test_a_torchtrainer_worker_is_rays(rank: int) -> None:
    assert detect(ray_worker(rank)) == ClusterEnv(
        source="ray",
        rank=rank,
        local_rank=rank,
        world_size=2,
        local_world_size=2,
        node_rank=0,
        num_nodes=1,
        master_addr="192.0.2.2",
        master_port=50903,
    )


def test_workers_spread_unevenly_over_nodes_count_at_least_two_nodes() -> None:
    # 3 workers on node 0, 1 on node 1: Ray says no node count; 4 % 3 != 0 must not be an error.
    env = detect(ray_worker(3, RANK="3", WORLD_SIZE="4", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1",
                            NODE_RANK="1"))  # fmt: skip
    assert (env.source, env.node_rank, env.num_nodes, env.local_world_size) == ("ray", 1, 2, 1)


def test_torchrun_started_inside_a_ray_task_is_torchrun() -> None:
    env = detect(ray_worker(1, TORCHELASTIC_RUN_ID="abc", GROUP_RANK="0"))
    assert env.source == "torchrun"


def test_a_ray_task_without_ray_trains_variables_is_not_a_worker() -> None:
    assert ray.from_environ({"RAY_RAYLET_PID": "7", "RAY_JOB_ID": "01000000"}) is None
    assert detect({"RAY_RAYLET_PID": "7"}).source == "single"


def test_tcp_init_leaves_no_master_variables_and_is_still_read() -> None:
    environ = ray_worker(0)
    del environ["MASTER_ADDR"], environ["MASTER_PORT"]  # TorchConfig(init_method="tcp")
    env = detect(environ)
    assert (env.source, env.master_addr, env.master_port) == ("ray", "127.0.0.1", 29500)


def test_a_missing_or_bad_variable_is_named() -> None:
    environ = ray_worker(1)
    del environ["LOCAL_WORLD_SIZE"]
    with pytest.raises(EnvError, match=r"lacks LOCAL_WORLD_SIZE; expected all of RANK"):
        detect(environ)
    with pytest.raises(EnvError, match=r"WORLD_SIZE='two' is not an integer"):
        detect(ray_worker(1, WORLD_SIZE="two"))
