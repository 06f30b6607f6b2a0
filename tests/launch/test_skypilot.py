"""``multigpu sky``: the task YAML read back by SkyPilot's own loader (``sky.Task.from_yaml``, no
cloud), its run section started on two "nodes" here with SkyPilot's variables, and bad input.

SkyPilot pins ``click<8.2`` and W&B needs ``click>=8.2``, so SkyPilot lives in a venv of its own,
``.venv-sky`` (``scripts/sky-venv``, which ``scripts/test`` runs); where the test environment
itself has ``sky``, that one is used.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from multigpu.cli.main import main
from multigpu.testing.distributed import free_port
from tests.launch._util import child_env, run_multigpu

ROOT = Path(__file__).resolve().parents[2]

_LOAD = """
import json, sys
import sky
task = sky.Task.from_yaml(sys.argv[1])
print(json.dumps({
    "name": task.name,
    "num_nodes": task.num_nodes,
    "accelerators": [r.accelerators for r in task.resources],
    "workdir": task.workdir,
    "file_mounts": task.file_mounts,
    "storage_mounts": sorted(task.storage_mounts),
    "setup": task.setup,
    "run": task.run,
}))
"""


@pytest.fixture(scope="module")
def sky_python() -> str:
    """An interpreter that imports SkyPilot (this one, or ``.venv-sky``'s)."""
    if importlib.util.find_spec("sky") is not None:
        return sys.executable
    venv = ROOT / ".venv-sky" / "bin" / "python"
    if venv.is_file():
        return str(venv)
    pytest.skip("needs SkyPilot: run scripts/sky-venv (a .venv-sky beside .venv)")


def load(python: str, path: Path) -> dict:
    """The task as SkyPilot's loader reads it (it validates the YAML against its schema)."""
    done = subprocess.run(
        [python, "-c", _LOAD, str(path)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_task_loads_in_skypilots_loader(tmp_path: Path, sky_python: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = tmp_path / "task.yaml"
    # The order (script, then options), the script's own --nodes after "--".
    argv = ["sky", "train.py", "--lr", "0.1", "--nodes", "2", "--gpus", "A100:8",
            "--out", str(out), "--mount", "/checkpoints=s3://team-bucket/run1",
            "--setup", "pip install rich", "--note", "it's", "--", "--nodes", "9"]  # fmt: skip
    done = run_multigpu(argv, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"wrote {out}; launch it with: sky launch -c CLUSTER")
    task = load(sky_python, out)
    assert task["name"] == "train" and task["num_nodes"] == 2
    assert task["accelerators"] == [{"A100": 8}]
    assert task["workdir"] == "." and task["storage_mounts"] == ["/checkpoints"]
    assert "pip install torch==" in task["setup"] and "pip install rich" in task["setup"]
    assert "pip install multigpu==" in task["setup"]  # the workdir is not a multigpu checkout
    run = task["run"]
    assert 'HEAD_IP=$(echo "$SKYPILOT_NODE_IPS" | head -n1)' in run
    assert (
        'multigpu run --gpus 8 --nnodes "$SKYPILOT_NUM_NODES" --node-rank "$SKYPILOT_NODE_RANK" '
        "--master-addr \"$HEAD_IP\" --master-port 29500 train.py --lr 0.1 --note 'it'\"'\"'s' "
        "--nodes 9"
    ) in run
    assert subprocess.run(["bash", "-n", "-c", run], check=False).returncode == 0
    again = run_multigpu(["sky", "--nodes", "1", "--out", str(out), "train.py"], tmp_path)
    assert again.returncode == 2 and "pass --force" in again.stderr


def test_one_node_and_cpu_nodes(tmp_path: Path, sky_python: str) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = tmp_path / "task.yaml"
    argv = ["sky", "--nodes", "1", "--cpu", "2", "--name", "cpu job", "-o", str(out), "train.py"]
    assert run_multigpu(argv, tmp_path).returncode == 0
    task = load(sky_python, out)
    assert task["name"] == "cpu job" and task["num_nodes"] == 1
    assert task["accelerators"] == [None]
    assert task["run"].splitlines()[-1] == "multigpu run --cpu 2 train.py"  # standalone


def test_the_run_section_trains_two_nodes_as_one_job(tmp_path: Path, sky_python: str) -> None:
    """SkyPilot's run section, started as SkyPilot starts it on each node (bash, in the workdir,
    with its variables), on two "nodes" here: the same losses as one node of 2 processes."""
    work = tmp_path / "work"
    work.mkdir()
    shutil.copy(ROOT / "examples" / "minimal.py", work / "minimal.py")
    out = tmp_path / "task.yaml"
    port = free_port()
    argv = ["sky", "--nodes", "2", "--cpu", "1", "--port", str(port), "--workdir", str(work),
            "-o", str(out), "minimal.py"]  # fmt: skip
    assert run_multigpu(argv, tmp_path).returncode == 0
    run = load(sky_python, out)["run"]
    bin_dir = os.path.dirname(sys.executable)  # this venv's `multigpu`
    nodes = []
    for rank in (0, 1):
        env = child_env(
            {
                "SKYPILOT_NODE_RANK": str(rank),
                "SKYPILOT_NUM_NODES": "2",
                "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1",
                "PATH": bin_dir + os.pathsep + os.environ.get("PATH", ""),
            }
        )
        node = subprocess.Popen(
            ["bash", "-c", run], cwd=work, env=env, text=True, start_new_session=True,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
        nodes.append(node)
    outs = []
    try:
        for node in nodes:
            stdout, stderr = node.communicate(timeout=150)
            assert node.returncode == 0, stderr
            outs.append(stdout)
    finally:
        for node in nodes:
            if node.poll() is None:
                node.kill()
                node.communicate()
    epochs = [ln for ln in outs[0].splitlines() if ln.startswith("epoch")]
    assert len(epochs) == 3 and not [ln for ln in outs[1].splitlines() if ln.startswith("epoch")]
    alone = run_multigpu(["run", "--cpu", "2", "minimal.py"], work)
    assert epochs == [ln for ln in alone.stdout.splitlines() if ln.startswith("epoch")]


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--nodes", "0", "--gpus", "A100:8"], "'0' is not valid; expected a whole number >= 1"),
        (["--nodes", "2", "--gpus", "A100:x"], "--gpus 'A100:x' is not valid"),
        (["--nodes", "2", "--gpus", "A100:0"], "--gpus 'A100:0' is not valid"),
        (["--nodes", "2", "--gpus", "A100:8", "--cpu", "2"], "expected one of them"),
        (["--nodes", "2", "--port", "70000"], "--port 70000 is not valid"),
        (["--nodes", "2", "--mount", "ckpt=s3://b"], "--mount 'ckpt=s3://b' is not valid"),
        (["--nodes", "2", "--workdir", "nowhere"], "is not in --workdir 'nowhere'"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_nothing_written(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    argv: list[str],
    said: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    out = tmp_path / "task.yaml"
    assert main(["sky", *argv, "--out", str(out), "train.py"]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("multigpu: error: "), err
    assert said in err
    assert not out.exists()


def test_a_script_outside_the_workdir_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["sky", "--nodes", "2", str(ROOT / "examples" / "minimal.py")]) == 2
    assert "is outside the workdir" in capsys.readouterr().err


def test_a_multigpu_checkout_as_workdir_installs_itself(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(ROOT)  # SkyPilot copies the checkout: the nodes run this very code
    out = tmp_path / "task.yaml"
    assert main(["sky", "examples/minimal.py", "--nodes", "2", "--out", str(out)]) == 0
    assert "\n  pip install -e .\n" in out.read_text()
