"""``multigpu train --cpu 2 --log-to tensorboard,csv``: one run, read back with TensorBoard's own
reader, continued by a resumed job at the right step with no step twice.

One module fixture: the digits job for 1 epoch in global batches of 256 (5 optimizer steps, a
checkpoint at step 4), then resumed for 2 epochs (from step 4: step 5 runs again and is not
sent again). MLflow and W&B are read back after a resume in one process (test_single_process.py):
their start-up (MLflow's SQLite schema, W&B's service) would double this fixture's time.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from tests.launch._util import run_multigpu

STEPS = list(range(1, 11))  # 2 epochs of 1437 samples in batches of 256: 5 steps each


@pytest.fixture(scope="module")
def resumed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    pytest.importorskip("tensorboard")
    tmp = tmp_path_factory.mktemp("track")
    out = tmp / "out"
    said = []
    common = ["--out", str(out), "--batch-size", "256", "--checkpoint-every", "4"]
    for epochs in ("1", "2"):
        argv = ["train", "--cpu", "2", "--epochs", epochs, "--progress", "off", *common]
        done = run_multigpu([*argv, "--log-to", "tensorboard,csv"], tmp, timeout=180)
        assert done.returncode == 0, done.stderr
        said.append(done.stdout)
    return out, said


def test_the_resumed_job_says_it_continues_the_run(resumed):
    _, said = resumed
    assert "(a new run)" in said[0]
    assert "continuing its run; steps up to 5 are there and not sent again" in said[1]


def test_csv_has_each_step_once(resumed):
    out, _ = resumed
    with (out / "metrics.csv").open() as fh:
        rows = [(int(r["step"]), r["key"]) for r in csv.DictReader(fh)]
    assert len(rows) == len(set(rows))
    assert sorted(s for s, k in rows if k == "loss") == STEPS
    assert sorted(s for s, k in rows if k == "test_accuracy") == [5, 10]


def test_tensorboard_shows_one_run_with_loss_and_throughput_once_per_step(resumed):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out, _ = resumed
    assert not [p for p in (out / "tensorboard").iterdir() if p.is_dir()]  # no sub-runs
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    for tag in ("loss", "samples_per_s", "step_time_s", "lr"):
        assert [e.step for e in events.Scalars(tag)] == STEPS, tag
    assert [e.step for e in events.Scalars("test_accuracy")] == [5, 10]
    assert events.Scalars("test_accuracy")[-1].value > 0.3
