"""``multigpu train`` without ``--out``: a fresh ``runs/MODEL/N`` the launcher chooses, with the
model, metrics, ``loss.png`` and checkpoints, named at the start and at the end; and the digits
job under ``--strategy pipeline``. One real run (2 gloo processes) shared by its assertions
(the parts without processes: ``tests/launch/test_train_outputs.py``)."""

from __future__ import annotations

import json

import pytest
import torch

from multigpu.cli.main import main
from multigpu.examples.digits import DigitsCNN
from tests.launch._util import run_multigpu

PNG = b"\x89PNG\r\n\x1a\n"


# ---- one real run -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory: pytest.TempPathFactory):
    cwd = tmp_path_factory.mktemp("cwd")
    argv = ["train", "--cpu", "2", "--epochs", "2", "--strategy", "pipeline", "--progress", "lines"]
    done = run_multigpu(argv, cwd, timeout=180)
    assert done.returncode == 0, done.stderr
    return cwd, done


def test_a_run_without_out_writes_a_fresh_numbered_directory(pipeline_run):
    cwd, done = pipeline_run
    out = cwd / "runs" / "digits" / "1"
    assert sorted(p.relative_to(cwd).as_posix() for p in (cwd / "runs").glob("*/*")) == [
        "runs/digits/1"
    ]
    assert done.stderr.splitlines()[0] == (
        "multigpu: writing to runs/digits/1/ (model.pt, metrics.json, checkpoints/); --out DIR "
        "to choose"
    )  # the first line, before the workers start
    DigitsCNN().load_state_dict(torch.load(out / "model.pt", weights_only=True))  # whole, plain
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model_path"] == "runs/digits/1/model.pt"
    names = {p.name for p in out.iterdir()}
    assert {"model.pt", "metrics.json", "checkpoints"} <= names <= {*names, "loss.png"}
    # once an epoch: 1437 samples / 64 = 22 steps
    steps = sorted(p.name for p in (out / "checkpoints").iterdir())
    assert steps == ["step-00000022", "step-00000044"]


def test_the_run_ends_naming_what_it_wrote_and_the_newest_checkpoint(pipeline_run):
    cwd, done = pipeline_run
    lines = done.stdout.splitlines()
    png = ", loss.png" if (cwd / "runs/digits/1/loss.png").exists() else ""
    assert lines[-3].startswith("test accuracy ")
    assert lines[-2] == f"wrote runs/digits/1/: model.pt, metrics.json{png}"
    assert lines[-1] == (
        "checkpoints in runs/digits/1/checkpoints/: step-00000022, step-00000044 "
        "(multigpu ckpt inspect runs/digits/1/checkpoints/step-00000044)"
    )


@pytest.mark.requires("module:matplotlib")
def test_the_loss_curve_is_beside_the_metrics(pipeline_run):
    cwd, _ = pipeline_run
    assert (cwd / "runs/digits/1/loss.png").read_bytes().startswith(PNG)


def test_digits_trains_as_a_pipeline_of_two_stages(
    pipeline_run, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    cwd, _ = pipeline_run
    metrics = json.loads((cwd / "runs/digits/1/metrics.json").read_text())
    assert metrics["strategy"] == "pipeline" and metrics["world_size"] == 2
    losses = [r["loss"] for r in metrics["history"]]
    assert losses[1] < 0.5 * losses[0] and metrics["test_accuracy"] >= 0.75, metrics["history"]
    monkeypatch.chdir(cwd)  # the command the end line offers works as printed
    assert main(["ckpt", "inspect", "runs/digits/1/checkpoints/step-00000044"]) == 0
    shown = capsys.readouterr().out
    assert "conv1.weight" in shown and "fc2.bias" in shown  # both stages' parameters, one model
