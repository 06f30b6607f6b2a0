"""SLURM: ``srun multigpu run`` per node (recorded srun variables), and ``multigpu slurm``."""

from __future__ import annotations

import random
import subprocess
from pathlib import Path

import pytest

from multigpu.errors import UsageError
from multigpu.launch.options import LaunchOptions
from multigpu.launch.slurm import slurm_topology, with_slurm_topology
from tests.launch._util import popen_multigpu, run_multigpu

ROOT = Path(__file__).resolve().parents[2]


def srun_task(node: int, nodes: int, job: int, nodelist: str) -> dict[str, str]:
    """The variables srun gives task ``node`` of a step with one task per node (as recorded
    from a real ``srun --nodes=N --ntasks-per-node=1`` step)."""
    return {
        "SLURM_JOB_ID": str(job),
        "SLURM_JOBID": str(job),
        "SLURM_STEP_ID": "0",
        "SLURM_STEPID": "0",
        "SLURM_PROCID": str(node),
        "SLURM_LOCALID": "0",
        "SLURM_NODEID": str(node),
        "SLURM_STEP_NUM_TASKS": str(nodes),
        "SLURM_NTASKS": str(nodes),
        "SLURM_STEP_NUM_NODES": str(nodes),
        "SLURM_NNODES": str(nodes),
        "SLURM_STEP_TASKS_PER_NODE": f"1(x{nodes})",
        "SLURM_TASKS_PER_NODE": f"1(x{nodes})",
        "SLURM_STEP_NODELIST": nodelist,
        "SLURM_JOB_NODELIST": nodelist,
    }


def test_each_node_gets_nnodes_its_rank_and_the_first_host() -> None:
    topology = slurm_topology(srun_task(2, 4, 1234, "node[01-03,07]"))
    assert topology == {
        "nnodes": "4",
        "node_rank": 2,
        "master_addr": "node01",
        "master_port": 15000 + 12340 % 17000,
    }
    assert slurm_topology(srun_task(0, 1, 5, "node01")) is None  # one node: nothing to add
    given = LaunchOptions(script="t.py", torchrun={"rdzv_endpoint": "h:1"})
    assert with_slurm_topology(given, srun_task(1, 2, 5, "a,b")) is given  # the user's wins


def test_several_tasks_per_node_is_refused() -> None:
    env = srun_task(0, 2, 9, "a,b") | {"SLURM_STEP_TASKS_PER_NODE": "2(x2)",
                                        "SLURM_STEP_NUM_TASKS": "4"}  # fmt: skip
    with pytest.raises(UsageError, match="srun --ntasks-per-node=1"):
        slurm_topology(env)


def test_two_srun_tasks_on_this_machine_train_as_two_nodes(tmp_path: Path) -> None:
    """Two launchers with the srun variables of nodes 0 and 1 (both here: 'localhost')."""
    job = random.randrange(1000, 1700)  # the port is 15000 + 10 * job: avoid collisions
    runs = []
    for node in (0, 1):
        cwd = tmp_path / f"node{node}"
        cwd.mkdir()
        env = srun_task(node, 2, job, "localhost,localhost")
        runs.append(
            popen_multigpu(["run", "--cpu", "1", str(ROOT / "examples/minimal.py")], cwd, **env)
        )
    outs = []
    for proc in runs:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in runs:
                p.kill()
            raise
        assert proc.returncode == 0, err
        outs.append(out)
    epochs = [ln for ln in outs[0].splitlines() if ln.startswith("epoch")]
    assert len(epochs) == 3 and not [ln for ln in outs[1].splitlines() if ln.startswith("epoch")]
    alone = run_multigpu(["run", "--cpu", "2", str(ROOT / "examples/minimal.py")], tmp_path)
    assert epochs == [ln for ln in alone.stdout.splitlines() if ln.startswith("epoch")]


def test_multigpu_slurm_writes_an_sbatch_script(tmp_path: Path) -> None:
    out = tmp_path / "job.sbatch"
    done = run_multigpu(
        [
            "slurm",
            "--nodes",
            "2",
            "--gpus-per-node",
            "4",
            "-o",
            str(out),
            "train.py",
            "--lr",
            "0.1",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    assert "#SBATCH --nodes=2" in text and "#SBATCH --gpus-per-node=4" in text
    assert "srun --ntasks-per-node=1 multigpu run --gpus 4 train.py --lr 0.1" in text
    assert subprocess.run(["bash", "-n", str(out)], check=False).returncode == 0
    again = run_multigpu(["slurm", "--nodes", "2", "-o", str(out), "train.py"], tmp_path)
    assert again.returncode == 2 and "pass --force" in again.stderr


@pytest.mark.parametrize(
    "argv",
    [["slurm", "--nodes", "0", "t.py"], ["slurm", "t.py"],
     ["slurm", "--nodes", "2", "--gpus-per-node", "2", "--cpu", "2", "t.py"]],
)  # fmt: skip
def test_bad_slurm_options_are_one_line_exit_2(tmp_path: Path, argv: list[str]) -> None:
    done = run_multigpu(argv, tmp_path)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("multigpu: error: "), done.stderr
    assert list(tmp_path.iterdir()) == []
