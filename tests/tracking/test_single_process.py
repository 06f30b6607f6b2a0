"""MLflow and W&B runs of one process (world size 1), read back with their own libraries: one run,
each step once after a resume. (The multi-process job is test_train_trackers.py, with
TensorBoard and CSV: these two trackers' start-up is too slow to repeat there.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.launch._util import child_env
from tests.tracking.two_jobs import two_jobs
from tests.tracking.wandb_records import history

STEPS = list(range(1, 10))


def _last_step(directory: Path) -> int:
    return json.loads((directory / "tracking.json").read_text())["last_step"]


@pytest.mark.requires("module:mlflow")
def test_mlflow_holds_one_run_with_each_step_once_after_a_resume(tmp_path: Path):
    from mlflow import MlflowClient

    from multigpu.instruments.tracking.to_mlflow import store_uri

    two_jobs("mlflow", tmp_path)
    assert _last_step(tmp_path) == 9
    client = MlflowClient(tracking_uri=store_uri(tmp_path))
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], max_results=10
    )
    assert len(runs) == 1
    run = runs[0]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == STEPS
    assert [m.step for m in client.get_metric_history(run.info.run_id, "accuracy")] == [6, 9]
    assert run.info.status == "FINISHED"
    assert run.data.params["batch_size"] == "64"
    assert run.data.tags["multigpu.world_size"] == "1"


@pytest.mark.requires("module:wandb")
def test_wandb_offline_is_one_run_with_each_step_once_after_a_resume(tmp_path: Path):
    script = Path(__file__).with_name("two_jobs.py")
    env = child_env({"WANDB_MODE": "offline", "WANDB_SILENT": "true", "MULTIGPU_DEVICE": "cpu"})
    done = subprocess.run(
        [sys.executable, str(script), "wandb", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "continuing its run; steps up to 6 are there" in done.stdout
    assert _last_step(tmp_path) == 9
    files = sorted((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len({f.name for f in files}) == 1 and len(files) == 2  # one run id, two jobs
    rows = [(s, values) for f in files for s, values in history(f)]
    assert [s for s, values in rows if "loss" in values] == STEPS
    assert [s for s, values in rows if "accuracy" in values] == [6, 9]
