"""The command line in-process: --dry-run plans, help texts, ``multigpu gpus``. Nothing starts."""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path

import pytest

from multigpu.cli.main import main
from multigpu.common.host import usable_cores

SCRIPT = str(Path(__file__).resolve().parent / "scripts" / "allreduce.py")


def plan_lines(capsys: pytest.CaptureFixture[str], *argv: str) -> dict[str, str]:
    assert main(list(argv)) == 0
    out = capsys.readouterr().out
    return {line.split(":", 1)[0]: line.split(":", 1)[1].strip() for line in out.splitlines()}


def test_dry_run_prints_the_plan(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lines = plan_lines(capsys, "run", "--cpu", "2", "--dry-run", SCRIPT, str(tmp_path), "--x")
    assert lines["devices"] == "cpu"
    assert lines["processes"].startswith("2 per node")
    assert shlex.split(lines["torchrun"]) == [
        "torchrun", "--nproc-per-node=2", "--local-addr=127.0.0.1", "--standalone", SCRIPT,
        str(tmp_path), "--x",
    ]  # fmt: skip
    env = dict(item.split("=", 1) for item in shlex.split(lines["env"]))
    assert env["MULTIGPU_DEVICE"] == "cpu" and env["CUDA_VISIBLE_DEVICES"] == ""
    if "OMP_NUM_THREADS" not in os.environ:
        assert env["OMP_NUM_THREADS"] == str(max(1, usable_cores() // 2))
    assert list(tmp_path.iterdir()) == []  # nothing ran


@pytest.mark.requires("no-gpus")
def test_default_on_cpu_machine_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    lines = plan_lines(capsys, "run", "--dry-run", SCRIPT)
    assert lines["processes"].startswith("1 per node")
    assert "no GPU found" in lines["note"] and "--cpu N" in lines["note"]
    assert len(lines["note"]) <= 100 and "--help" in lines["note"]  # one short line


def test_train_dry_run_forwards_training_options(capsys: pytest.CaptureFixture[str]) -> None:
    lines = plan_lines(
        capsys, "train", "--epochs", "1", "--cpu", "2", "--max-restarts", "1", "--dry-run",
        "--out", "o",
    )  # fmt: skip
    assert shlex.split(lines["torchrun"]) == [
        "torchrun", "--nproc-per-node=2", "--max-restarts=1", "--module", "--local-addr=127.0.0.1",
        "--standalone",
        "multigpu.examples.digits", "--epochs", "1", "--out", "o",
    ]  # fmt: skip


def test_help_texts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--help"]) == 0
    run_help = capsys.readouterr().out
    for option in ("--nproc-per-node", "--rdzv-endpoint", "--max-restarts", "--gpus", "--cpu"):
        assert option in run_help
    assert "ONE" in run_help and "0.55x" in run_help  # the CPU default and why
    assert main(["train", "--help"]) == 0
    train_help = capsys.readouterr().out
    assert "--cpu" in train_help and "--max-restarts" in train_help  # launch options
    assert "--epochs" in train_help and "--strategy" in train_help  # the job's options


def test_gpus_lists_none_here(capsys: pytest.CaptureFixture[str]) -> None:
    from multigpu.gpus import list_gpus

    if list_gpus():
        pytest.skip("this machine has GPUs")
    assert main(["gpus"]) == 0
    assert (
        capsys.readouterr().out.strip() == "no GPU found; CPU processes are available with --cpu N"
    )
    assert main(["gpus", "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out) == [] and "--cpu N" in captured.err


def test_run_takes_torchruns_options_shortened_as_torchrun_does(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # torchrun's parser allows prefixes; `multigpu run` keeps torchrun's options as they are
    # (a regression once the shared parser class took whole names only).
    lines = plan_lines(capsys, "run", "--nproc-per", "1", "--dry-run", SCRIPT)
    assert lines["processes"].startswith("1 per node")
