"""``multigpu run`` under an engine's variables: torchrun's ``PET_*`` (Kubeflow) and SkyPilot's."""

from __future__ import annotations

from pathlib import Path

import pytest

from multigpu.errors import UsageError
from multigpu.launch.engine_topology import pet_options, skypilot_options, with_engine_topology
from multigpu.launch.options import LaunchOptions
from tests.launch._util import run_multigpu

ROOT = Path(__file__).resolve().parents[2]
MINIMAL = str(ROOT / "examples" / "minimal.py")

# What Kubeflow Trainer's torch runtime sets in the pod of node 1 of a 2-node TrainJob named
# "job" (pkg/runtime/framework/plugins/torch/torch.go, v2.3.0).
TRAINJOB_NODE1 = {
    "PET_NNODES": "2",
    "PET_NPROC_PER_NODE": "1",
    "PET_NODE_RANK": "1",
    "PET_MASTER_ADDR": "job-node-0-0.job",
    "PET_MASTER_PORT": "29500",
}


def _torchrun_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if line.startswith("torchrun:"))


def test_pet_variables_plan_node_1_of_2_at_the_given_master(tmp_path: Path) -> None:
    done = run_multigpu(["run", "--dry-run", "--cpu", "1", MINIMAL], tmp_path, **TRAINJOB_NODE1)
    assert done.returncode == 0, done.stderr
    line = _torchrun_line(done.stdout)
    assert "--nnodes=2" in line and "--node-rank=1" in line, line
    assert "--master-addr=job-node-0-0.job" in line and "--master-port=29500" in line, line
    assert "--standalone" not in line and "--local-addr=127.0.0.1" not in line, line
    said = [ln for ln in done.stderr.splitlines() if "from the environment" in ln]
    assert said == [
        "multigpu: node 1 of 2 from the environment (PET_NNODES=2, PET_NODE_RANK=1, "
        "PET_MASTER_ADDR=job-node-0-0.job, PET_MASTER_PORT=29500), rendezvous at "
        "job-node-0-0.job:29500; options typed win"
    ], done.stderr


def test_typed_options_win_over_the_variables() -> None:
    typed = LaunchOptions(script="t.py", cpu=1, torchrun={"node_rank": 0, "master_port": 29600})
    got = with_engine_topology(typed, TRAINJOB_NODE1)
    assert dict(got.options.torchrun) == {
        "node_rank": 0,
        "master_port": 29600,
        "nnodes": "2",
        "master_addr": "job-node-0-0.job",
    }
    assert got.used == ("PET_NNODES", "PET_MASTER_ADDR")  # said: only what was used


def test_one_node_asked_under_a_multi_node_job_is_refused_in_one_line(tmp_path: Path) -> None:
    done = run_multigpu(
        ["run", "--dry-run", "--cpu", "1", "--nnodes", "1", MINIMAL], tmp_path, **TRAINJOB_NODE1
    )
    assert done.returncode == 2
    errors = [ln for ln in done.stderr.splitlines() if ln.startswith("multigpu: error:")]
    assert len(errors) == 1, done.stderr
    assert "PET_NNODES=2" in errors[0] and "--nnodes 1" in errors[0], errors[0]
    assert "torchrun:" not in done.stdout


def test_elastic_pytorchjob_variables_give_a_c10d_rendezvous() -> None:
    env = {  # the Training Operator's elastic PyTorchJob (pkg/controller.v1/pytorch/elastic.go)
        "PET_RDZV_ENDPOINT": "job-worker-0:23456",
        "PET_RDZV_BACKEND": "c10d",
        "PET_NNODES": "1:2",
        "PET_MAX_RESTARTS": "3",
        "PET_NPROC_PER_NODE": "2",
    }
    got = with_engine_topology(LaunchOptions(script="t.py"), env)
    assert dict(got.options.torchrun) == {
        "rdzv_endpoint": "job-worker-0:23456",
        "rdzv_backend": "c10d",
        "nnodes": "1:2",
        "max_restarts": 3,
        "nproc_per_node": "2",
    }
    assert got.line.startswith("a node of 1:2 from the environment ("), got.line
    assert "c10d rendezvous at job-worker-0:23456" in got.line
    # --cpu N is multigpu's spelling of the processes per node: the variable does not override it
    cpu = with_engine_topology(LaunchOptions(script="t.py", cpu=1), env)
    assert "nproc_per_node" not in cpu.options.torchrun


def test_skypilot_variables_give_the_static_rendezvous_at_node_0() -> None:
    env = {
        "SKYPILOT_NUM_NODES": "2",
        "SKYPILOT_NODE_RANK": "1",
        "SKYPILOT_NODE_IPS": "10.1.0.4\n10.1.0.5\n",
    }
    got = with_engine_topology(LaunchOptions(script="t.py", cpu=1), env)
    assert dict(got.options.torchrun) == {
        "nnodes": "2",
        "node_rank": 1,
        "master_addr": "10.1.0.4",
        "master_port": 29500,
    }
    assert got.line.startswith("node 1 of 2 from the environment (SKYPILOT_NUM_NODES=2"), got.line
    assert skypilot_options({**env, "SKYPILOT_NUM_NODES": "1"}) is None  # one node: nothing to say
    with pytest.raises(UsageError, match="SKYPILOT_NODE_IPS"):
        skypilot_options({**env, "SKYPILOT_NODE_IPS": "10.1.0.4"})
    # Typed topology: SkyPilot's variables are not used (the run line of `multigpu sky` types
    # them) ...
    typed = LaunchOptions(script="t.py", torchrun={"rdzv_endpoint": "h:1", "nnodes": "2"})
    assert with_engine_topology(typed, env).used == ()
    # ... but one node typed inside a task of two is still refused.
    with pytest.raises(UsageError, match=r"SKYPILOT_NUM_NODES=2.*--nnodes 1"):
        with_engine_topology(LaunchOptions(script="t.py", torchrun={"nnodes": "1"}), env)


def test_bad_pet_value_is_one_usage_error_naming_the_variable() -> None:
    with pytest.raises(UsageError, match=r"PET_NODE_RANK='x'.*--node-rank"):
        pet_options({"PET_NODE_RANK": "x"})
    assert pet_options({"PET_STANDALONE": "0"}) == {}  # the flag off, as torchrun reads it


def test_no_variables_change_nothing() -> None:
    options = LaunchOptions(script="t.py", cpu=2)
    got = with_engine_topology(options, {"HOME": "/root", "MASTER_PORT": "1234"})
    assert got.options == options and got.line == "" and got.used == ()


def test_one_node_job_keeps_the_store_on_loopback() -> None:
    one = {**TRAINJOB_NODE1, "PET_NNODES": "1", "PET_NODE_RANK": "0"}
    got = with_engine_topology(LaunchOptions(script="t.py", cpu=1), one)
    # No rendezvous at the pod's address: the plan's --standalone (a loopback store).
    assert got.options.torchrun == {} and got.options.max_nodes == 1
    plain = with_engine_topology(LaunchOptions(script="t.py"), one)  # no --cpu: its count is read
    assert dict(plain.options.torchrun) == {"nproc_per_node": "1"}
    assert plain.line == "from the environment: PET_NPROC_PER_NODE=1; options typed win"


def test_verify_and_bench_runs_stay_on_this_machine_inside_a_pod(tmp_path: Path) -> None:
    # `multigpu verify` / `bench` compare process counts on one machine: their `multigpu run`
    # children must not join the pod's multi-node job through the inherited PET_* variables.
    from multigpu.diagnostics.bench import scaling
    from multigpu.diagnostics.verify import child_env

    pod = {**TRAINJOB_NODE1, "SKYPILOT_NUM_NODES": "2", "HOME": "/root"}
    verify_env = child_env(pod, tmp_path, 5, device="cpu", deterministic=False)
    bench_env = scaling.child_env(pod, tmp_path, 5, threads=1)
    for env in (verify_env, bench_env):
        assert env["HOME"] == "/root"
        assert not [k for k in env if k.startswith(("PET_", "SKYPILOT_"))], env


def test_replica_groups_under_a_multi_node_job_are_refused() -> None:
    from multigpu.launch.replica_groups import check_one_node_per_group

    with pytest.raises(UsageError, match=r"--replicas under PET_NNODES=2 .*env -u PET_NNODES"):
        check_one_node_per_group({}, TRAINJOB_NODE1)
    check_one_node_per_group({}, {"PET_NNODES": "1"})  # one node: the groups stay here
    check_one_node_per_group({}, None)
