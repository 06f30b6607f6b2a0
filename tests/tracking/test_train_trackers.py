"""``multigpu train --cpu 2 --log-to ...``: one run per tracker, read back with the trackers'
own libraries, continued by a resumed job at the right step with no step twice.

One module fixture: the digits job for 1 epoch (22 optimizer steps, checkpoints every 10), then
resumed for 2 epochs (from step 20: steps 21 and 22 run again and are not sent again).
"""

from __future__ import annotations

import csv
import importlib.util
from pathlib import Path

import pytest

from tests.launch._util import run_multigpu
from tests.tracking.wandb_records import history

TRACKERS = [n for n in ("tensorboard", "mlflow", "wandb") if importlib.util.find_spec(n)]
STEPS = list(range(1, 45))  # 2 epochs of 1437 samples in batches of 64: 22 steps each


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    tmp = tmp_path_factory.mktemp("track")
    out = tmp / "out"
    said = []
    common = ["--out", str(out), "--checkpoint-every", "10", "--progress", "off"]
    names = ",".join(["csv", *TRACKERS])
    for epochs in ("1", "2"):
        done = run_multigpu(
            ["train", "--cpu", "2", "--epochs", epochs, "--log-to", names, *common],
            tmp,
            timeout=240,
            WANDB_MODE="offline",
            WANDB_SILENT="true",
        )
        assert done.returncode == 0, done.stderr
        said.append(done.stdout)
    return out, said


def test_the_resumed_job_says_it_continues_the_run(resumed):
    _, said = resumed
    assert "(a new run)" in said[0]
    assert "continuing its run; steps up to 22 are there and not sent again" in said[1]


def test_csv_has_each_step_once(resumed):
    out, _ = resumed
    with (out / "metrics.csv").open() as fh:
        rows = [(int(r["step"]), r["key"]) for r in csv.DictReader(fh)]
    assert len(rows) == len(set(rows))
    assert sorted(s for s, k in rows if k == "loss") == STEPS
    assert sorted(s for s, k in rows if k == "test_accuracy") == [22, 44]


@pytest.mark.requires("module:tensorboard")
def test_tensorboard_shows_one_run_with_loss_and_throughput_once_per_step(resumed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = resumed
    assert [p.name for p in out.iterdir() if p.name == "tensorboard"] == ["tensorboard"]
    assert not [p for p in (out / "tensorboard").iterdir() if p.is_dir()]  # no sub-runs
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    for tag in ("loss", "samples_per_s", "step_time_s", "lr"):
        assert [e.step for e in events.Scalars(tag)] == STEPS, tag
    assert [e.step for e in events.Scalars("test_accuracy")] == [22, 44]
    assert events.Scalars("test_accuracy")[-1].value > 0.5


@pytest.mark.requires("module:mlflow")
def test_mlflow_holds_one_run_with_each_step_once(resumed):
    from mlflow import MlflowClient

    from multigpu.tracking.to_mlflow import store_uri

    out, _ = resumed
    client = MlflowClient(tracking_uri=store_uri(out))
    runs = client.search_runs(
        [e.experiment_id for e in client.search_experiments()], max_results=10
    )
    assert len(runs) == 1
    run = runs[0]
    assert [m.step for m in client.get_metric_history(run.info.run_id, "loss")] == STEPS
    assert run.info.status == "FINISHED"
    assert run.data.params["batch_size"] == "64"
    assert run.data.tags["multigpu.world_size"] == "2"


@pytest.mark.requires("module:wandb")
def test_wandb_offline_is_one_run_with_each_step_once(resumed):
    out, _ = resumed
    files = sorted((out / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len({f.name for f in files}) == 1 and len(files) == 2  # one run id, two jobs
    steps = [s for f in files for s, values in history(f) if "loss" in values]
    assert steps == STEPS
