"""``multigpu train`` without ``--out`` chooses a fresh ``runs/MODEL/N`` (the same on every node
of a job), creates nothing when refused or dry-run, and names what it wrote; ``loss.png``; the
digits pipeline refused where it cannot be built. No process starts (``test_outputs.py`` has
the real run)."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from multigpu.cli.main import main
from multigpu.errors import UsageError
from multigpu.examples.outputs import plot_loss, written_lines
from multigpu.launch.train_outputs import claim_run_dir, default_outputs, next_run_dir

PNG = b"\x89PNG\r\n\x1a\n"


def test_each_launch_takes_the_next_number_and_keeps_the_users_out(tmp_path: Path):
    runs = tmp_path / "runs"
    args, chosen = default_outputs("digits", ["--epochs", "1"], runs=runs)
    assert chosen == runs / "digits" / "1"
    checkpoints = ["--checkpoint-dir", f"{chosen}/checkpoints"]
    assert args == ["--epochs", "1", "--out", str(chosen), *checkpoints]
    claim_run_dir(chosen, shared=False)
    (runs / "digits" / "7").mkdir()
    (runs / "digits" / "notes").mkdir()  # not a number: not counted
    assert next_run_dir(runs / "digits") == runs / "digits" / "8"  # never an earlier run's
    with pytest.raises(UsageError, match="just created by another multigpu train"):
        claim_run_dir(chosen, shared=False)  # two launches that chose the same number
    given = ["--out", "mine", "--checkpoint-every", "5"]
    assert default_outputs("lm", given, runs=runs) == (given, None)
    kept = default_outputs("lm", ["--checkpoint-dir", "ck"], runs=runs)[0]
    assert kept == ["--checkpoint-dir", "ck", "--out", str(runs / "lm" / "1")]


def test_several_nodes_agree_on_the_rendezvous_id_or_are_told_to_give_out(tmp_path: Path):
    runs = tmp_path / "runs"
    args, chosen = default_outputs("lm", [], nnodes="2", rdzv_id="job42", runs=runs)
    assert chosen == runs / "lm" / "job42" and args[:2] == ["--out", str(chosen)]
    claim_run_dir(chosen, shared=True)
    claim_run_dir(chosen, shared=True)  # the other node, or a restart of the same job
    for rdzv_id in (None, "../up"):
        with pytest.raises(UsageError, match=r"^multigpu train --nnodes 1:2 was given no --out"):
            default_outputs("lm", [], nnodes="1:2", rdzv_id=rdzv_id, runs=runs)


def test_dry_run_shows_the_chosen_directory_and_creates_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(tmp_path)
    argv = ["train", "--model", "lm", "--cpu", "2", "--max-restarts", "1", "--dry-run"]
    assert main([*argv, "--steps", "5"]) == 0
    plan = dict(ln.split(":", 1) for ln in capsys.readouterr().out.splitlines() if ":" in ln)
    # torchrun restarts the workers with these arguments: the same directory, its checkpoints
    assert "--max-restarts=1" in shlex.split(plan["torchrun"])
    assert shlex.split(plan["torchrun"])[-7:] == [
        "multigpu.examples.lm", "--steps", "5", "--out", "runs/lm/1",
        "--checkpoint-dir", "runs/lm/1/checkpoints",
    ]  # fmt: skip
    assert list(tmp_path.iterdir()) == []


def test_the_end_lines_name_each_file_and_say_when_nothing_was_kept(tmp_path: Path):
    files = [tmp_path / "a" / "model.pt", tmp_path / "a" / "metrics.json", tmp_path / "m.pt"]
    assert written_lines(files, tmp_path / "none") == [
        f"wrote {tmp_path}/a/: model.pt, metrics.json",
        f"wrote {tmp_path}/: m.pt",
    ]
    assert written_lines([], None) == [
        "wrote nothing: give --out DIR to keep the model, metrics and checkpoints"
    ]


@pytest.mark.requires("module:matplotlib")
def test_the_loss_plot_is_a_png_written_atomically(tmp_path: Path):
    path = tmp_path / "loss.png"
    got = plot_loss(
        path, [1, 2, 3], {"a": [3.0, 2.0, None], "b": [1.0, 1.0, 1.0]},
        xlabel="step", ylabel="loss", title="t",
    )  # fmt: skip
    assert got == path and path.read_bytes().startswith(PNG)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loss.png"]  # no temporary file left


def test_digits_pipeline_is_refused_before_any_worker_where_it_cannot_be_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    monkeypatch.chdir(tmp_path)
    for argv, expected in (
        (["--cpu", "8", "--batch-size", "64"], "on 8 process(es): the digits CNN has 4 layers"),
        (["--cpu", "2", "--precision", "bf16-mixed"], "and --precision bf16-mixed was given"),
        (["--cpu", "2", "--compression", "fp16"], "which --strategy pipeline does not have"),
    ):
        assert main(["train", "--strategy", "pipeline", *argv]) == 2
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and expected in err[0], err
    assert list(tmp_path.iterdir()) == []
