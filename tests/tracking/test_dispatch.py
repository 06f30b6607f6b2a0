"""``ctx.log`` and its trackers in one process: the run file, resuming, refusals (fast)."""

from __future__ import annotations

import csv
import importlib.util
import json
import shutil
from pathlib import Path

import pytest
import torch

import multigpu
from multigpu.common import variables
from multigpu.common.tracker_names import parse_trackers
from multigpu.errors import UsageError
from multigpu.instruments.tracking import Tracking, dispatch


def _job(directory: Path, steps: range, **init: object) -> None:
    with multigpu.init(environ={}, log_to="csv", log_dir=directory, **init) as ctx:  # type: ignore[arg-type]
        for step in steps:
            ctx.log({"loss": torch.tensor(1.0 / step), "n": step}, step=step)
        ctx.log({"acc": 0.5}, step=steps[-1])  # a second call at the same step


def _rows(directory: Path) -> list[tuple[int, str]]:
    with (directory / "metrics.csv").open() as fh:
        return [(int(r["step"]), r["key"]) for r in csv.DictReader(fh)]


def test_a_resumed_job_continues_the_run_without_sending_a_step_twice(tmp_path: Path):
    _job(tmp_path, range(1, 6), config={"lr": 0.1})
    _job(tmp_path, range(3, 9))  # resumed at step 2: steps 3..5 are already there
    rows = _rows(tmp_path)
    assert len(rows) == len(set(rows))
    assert sorted({s for s, k in rows if k == "loss"}) == list(range(1, 9))
    assert {s for s, k in rows if k == "acc"} == {5, 8}
    record = json.loads((tmp_path / "tracking.json").read_text())
    assert record["jobs"] == 2 and record["first_step"] == 1 and record["last_step"] == 8
    assert sorted(record["keys_at_last"]) == ["acc", "loss", "n"]
    params = json.loads((tmp_path / "params.json").read_text())
    assert params["environment"]["world_size"] == 1 and "torch_version" in params["environment"]


def test_log_writes_nothing_until_a_flush_and_a_killed_job_sends_the_unflushed_steps_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    running, killed = tmp_path / "running", tmp_path / "killed"
    with multigpu.init(environ={}, log_to="csv", log_dir=running) as ctx:
        for step in range(1, 4):
            ctx.log({"loss": 1.0 / step}, step=step)
        assert _rows(running) == []  # kept in memory: a step costs no I/O
        assert json.loads((running / "tracking.json").read_text())["last_step"] is None
        ctx.save(tmp_path / "ckpt", {"step": 3})  # a checkpoint flushes the trackers first
        assert _rows(running) == [(1, "loss"), (2, "loss"), (3, "loss")]
        for step in range(4, 6):
            ctx.log({"loss": 1.0 / step}, step=step)
        # What a process killed here leaves: everything up to the checkpoint, nothing after.
        shutil.copytree(running, killed)
        monkeypatch.setattr(dispatch, "FLUSH_EVERY_S", 0.0)
        ctx.log({"loss": 1.0 / 6}, step=6)  # the interval passed: this call flushes
        assert [s for s, _ in _rows(running)] == [1, 2, 3, 4, 5, 6]
    assert json.loads((killed / "tracking.json").read_text())["last_step"] == 3
    _job(killed, range(4, 8))  # resumed from the checkpoint of step 3
    rows = _rows(killed)
    assert sorted(s for s, k in rows if k == "loss") == list(range(1, 8))  # each step once


def test_a_job_starting_over_in_the_directory_starts_a_new_run(tmp_path: Path):
    _job(tmp_path, range(1, 6))
    _job(tmp_path, range(1, 3))
    assert sorted({s for s, k in _rows(tmp_path) if k == "loss"}) == [1, 2]
    assert json.loads((tmp_path / "tracking.json").read_text())["jobs"] == 1


def test_an_elastic_restart_from_the_first_step_continues_the_run(tmp_path: Path):
    _job(tmp_path, range(1, 6))
    with multigpu.init(environ={}) as ctx:
        hook = Tracking(["csv"], tmp_path, restarts=1)
        for step in range(1, 8):
            hook.on_log(ctx, {"loss": 1.0 / step}, step)
        hook.on_teardown(ctx)
    rows = _rows(tmp_path)
    assert sorted(s for s, k in rows if k == "loss") == list(range(1, 8))


def test_a_torn_last_row_is_dropped_and_sent_again(tmp_path: Path):
    _job(tmp_path, range(1, 4))
    with (tmp_path / "metrics.csv").open("a") as fh:
        fh.write("4,loss,0.2")  # killed mid-write: no newline, not in the run file
    _job(tmp_path, range(4, 6))
    rows = _rows(tmp_path)
    assert sorted(s for s, k in rows if k == "loss") == [1, 2, 3, 4, 5]


def test_without_trackers_log_does_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    with multigpu.init(environ={}) as ctx:
        ctx.log({"loss": 1.0}, step=1)
    assert list(tmp_path.iterdir()) == []


def test_the_environment_variables_choose_the_trackers_and_the_directory(tmp_path: Path):
    env = {"MULTIGPU_LOG_TO": "csv", "MULTIGPU_LOG_DIR": str(tmp_path / "d")}
    with multigpu.init(environ=env) as ctx:
        ctx.log({"loss": 1.0}, step=1)
    assert _rows(tmp_path / "d") == [(1, "loss")]


@pytest.mark.parametrize(
    ("metrics", "step", "says"),
    [
        ({"loss": "low"}, 1, "expected a number or a one-element tensor"),
        ({"loss": torch.ones(2)}, 1, "a tensor of shape (2,)"),
        ({"": 1.0}, 1, "non-empty string"),
        ({"loss": 1.0}, -1, "whole number >= 0"),
        ([1.0], 1, "expected a mapping"),
    ],
)
def test_bad_values_are_refused_in_one_line(tmp_path: Path, metrics, step, says):
    with (
        multigpu.init(environ={}, log_to="csv", log_dir=tmp_path) as ctx,
        pytest.raises(UsageError, match=r"ctx\.log") as e,
    ):
        ctx.log(metrics, step=step)
    assert says in str(e.value) and "\n" not in str(e.value)


def test_unknown_tracker_names_get_a_did_you_mean():
    with pytest.raises(UsageError, match=r"did you mean mlflow\?"):
        multigpu.init(environ={}, log_to="mlfow")
    with pytest.raises(UsageError, match=r"MULTIGPU_LOG_TO='wandbb' .*did you mean wandb\?"):
        variables.check_environment({"MULTIGPU_LOG_TO": "wandbb"})
    assert parse_trackers(["CSV", "csv", " none "], "log_to=") == ("csv",)


def test_a_missing_package_names_the_extra(monkeypatch: pytest.MonkeyPatch):
    found = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "mlflow" else found(name)
    )
    with pytest.raises(UsageError, match=r"pip install 'multigpu\[track\]'"):
        multigpu.init(environ={}, log_to="csv,mlflow")


def test_config_and_directory_are_checked_before_anything_starts(tmp_path: Path):
    with pytest.raises(UsageError, match="config="):
        multigpu.init(environ={}, log_to="csv", config={1: "x"})  # type: ignore[dict-item]
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(UsageError, match="log directory"):
        multigpu.init(environ={}, log_to="csv", log_dir=blocker / "sub")


@pytest.mark.requires("module:tensorboard")
def test_tensorboard_run_reads_back_once_per_step_after_a_resume(tmp_path: Path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for steps in (range(1, 6), range(4, 9)):
        with multigpu.init(environ={}, log_to="tensorboard", log_dir=tmp_path) as ctx:
            for step in steps:
                ctx.log({"loss": 1.0 / step}, step=step)
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("loss")] == list(range(1, 9))


def test_a_value_logged_at_a_step_already_passed_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    with multigpu.init(environ={}, log_to="csv", log_dir=tmp_path) as ctx:
        ctx.log({"loss": 1.0}, step=5)
        ctx.log({"loss": 2.0}, step=3)  # lower: not sent
        ctx.log({"loss": 3.0}, step=5)  # the same key at the same step: not sent
        ctx.log({"acc": 0.5}, step=5)  # another key at the step: sent
    said = [r.getMessage() for r in caplog.records if "not sent" in r.getMessage()]
    assert said == [
        "ctx.log(step=3) of loss not sent: step 5 was logged already, and each tracker keeps "
        "a step's value once and the steps in order; log each value once, at a step >= the "
        "last one (said once)"
    ]
    assert _rows(tmp_path) == [(5, "loss"), (5, "acc")]


def test_a_resumed_job_skips_the_steps_its_run_has_without_a_word(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    _job(tmp_path, range(1, 6))
    _job(tmp_path, range(3, 8))  # resumed at step 3: steps 3-5 are in the run
    assert not [r for r in caplog.records if "not sent" in r.getMessage()]


def test_the_ranks_that_do_not_write_refuse_a_bad_value_too(tmp_path: Path):
    # Rank 1 of two: no trackers, but the same refusal as rank 0's, so that both end alike.
    from multigpu.common.variables import Settings
    from multigpu.env.types import ClusterEnv
    from multigpu.instruments.tracking import LogCheck
    from multigpu.session.initialize import choose_tracking

    env = ClusterEnv(
        source="torchrun", rank=1, local_rank=1, world_size=2, local_world_size=2, node_rank=0,
        num_nodes=1, master_addr="127.0.0.1", master_port=29500,
    )  # fmt: skip
    check = choose_tracking("csv", tmp_path / "logs", None, Settings.read({}), env)
    assert isinstance(check, LogCheck) and not (tmp_path / "logs").exists()
    check.on_log(None, {"loss": torch.tensor(0.5)}, step=1)
    with pytest.raises(UsageError, match=r"ctx\.log: loss='high': expected a number"):
        check.on_log(None, {"loss": "high"}, step=1)


def test_a_run_file_that_is_not_one_is_refused_as_it_is(tmp_path: Path):
    (tmp_path / "tracking.json").write_text("{not json")
    with (
        multigpu.init(environ={}, log_to="csv", log_dir=tmp_path) as ctx,
        pytest.raises(UsageError, match="is not a multigpu tracking run file") as e,
    ):
        ctx.log({"loss": 1.0}, step=1)
    assert e.value.__cause__ is not e.value  # raised as it is, not from itself


def test_a_refused_write_is_one_line_and_nothing_more_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    # The file system refuses the run file (a directory in its place: EISDIR at the rename).
    monkeypatch.setattr(dispatch, "FLUSH_EVERY_S", 0.0)  # every ctx.log flushes
    with (
        pytest.raises(dispatch.TrackingError) as e,
        multigpu.init(environ={}, log_to="csv", log_dir=tmp_path) as ctx,
    ):
        ctx.log({"loss": 1.0}, step=1)
        (tmp_path / "tracking.json").unlink()
        (tmp_path / "tracking.json").mkdir()
        ctx.log({"loss": 2.0}, step=2)
    said = str(e.value)
    assert said.startswith(f"writing tracking.json in {tmp_path} failed: Is a directory; ")
    assert "\n" not in said and dispatch.TrackingError.said_in_full
    assert _rows(tmp_path) == [(1, "loss"), (2, "loss")]  # the rows went; the run file did not
