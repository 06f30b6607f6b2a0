"""``multigpu train`` picks its job by ``--model`` and refuses, before it starts, a global batch
the processes cannot share."""

from __future__ import annotations

import importlib
import shlex

import pytest

from multigpu.errors import UsageError
from multigpu.examples import lm_options
from multigpu.examples.digits import build_parser
from multigpu.launch.cli import main
from multigpu.launch.train import (
    DEFAULT_BATCH_SIZE,
    DEFAULT_BATCH_SIZES,
    MODEL_SUMMARIES,
    TRAIN_MODULE,
    TRAIN_MODULES,
    check_batch_size,
    check_checkpoint_options,
    choose_model,
    training_help,
)
from tests.launch._util import run_multigpu


def test_launcher_default_matches_the_job():
    assert build_parser().get_default("batch_size") == DEFAULT_BATCH_SIZE


def test_launcher_knows_each_jobs_module_and_default_batch_size():
    assert TRAIN_MODULE == TRAIN_MODULES["digits"] == "multigpu.examples.digits"
    parsers = {"digits": build_parser, "lm": lm_options.build_parser}
    assert set(TRAIN_MODULES) == set(DEFAULT_BATCH_SIZES) == set(MODEL_SUMMARIES) == set(parsers)
    for model, module in TRAIN_MODULES.items():
        assert callable(importlib.import_module(module).main), module  # python -m runs it
        assert parsers[model]().get_default("batch_size") == DEFAULT_BATCH_SIZES[model], model


def test_model_option_chooses_the_job_and_is_not_passed_on():
    assert choose_model(["--epochs", "2"]) == ("digits", ["--epochs", "2"])
    assert choose_model(["--model", "lm", "--steps", "5"]) == ("lm", ["--steps", "5"])
    assert choose_model(["--model=digits", "--model=lm"]) == ("lm", [])  # the last one wins
    with pytest.raises(UsageError, match=r"--model gpt is not a built-in job; expected .*, lm"):
        choose_model(["--model", "gpt"])
    with pytest.raises(UsageError, match="--model without a name is not a built-in job"):
        choose_model(["--steps", "5", "--model"])


def test_dry_run_launches_the_chosen_module(capsys: pytest.CaptureFixture[str]):
    assert main(["train", "--model", "lm", "--cpu", "2", "--dry-run", "--steps", "5"]) == 0
    plan = dict(ln.split(":", 1) for ln in capsys.readouterr().out.splitlines() if ":" in ln)
    assert shlex.split(plan["torchrun"])[-3:] == ["multigpu.examples.lm", "--steps", "5"]


def test_batch_size_is_checked_against_the_chosen_jobs_default(capsys: pytest.CaptureFixture[str]):
    check_batch_size([], 64)  # digits: 64 per step
    with pytest.raises(UsageError, match="--batch-size 32 .* 64 processes"):
        check_batch_size([], 64, "lm")
    assert main(["train", "--model", "lm", "--cpu", "3", "--dry-run"]) == 2
    assert "--batch-size 32 is not divisible by the 3 processes" in capsys.readouterr().err


def test_help_lists_the_models_and_the_chosen_jobs_options():
    text = training_help("lm")
    assert "--model {digits,lm}" in text and "the options of --model lm" in text
    assert "--n-layer" in text and "--epochs" not in text


@pytest.mark.parametrize(
    ("args", "processes"),
    [(["--batch-size", "64"], 2), (["--batch-size=63"], 3), ([], 4), (["--batch-size", "x"], 3)],
)
def test_divisible_or_left_to_the_job_parser(args, processes):
    check_batch_size(args, processes)


def test_not_divisible_names_the_numbers_and_the_fix():
    with pytest.raises(UsageError, match=r"--batch-size 63 .* 2 processes .* e\.g\. 62 or 64"):
        check_batch_size(["--epochs", "1", "--batch-size", "63"], 2)
    with pytest.raises(UsageError, match="--batch-size 64 .* 3 processes"):
        check_batch_size([], 3)


def test_checkpoint_options_are_checked_before_anything_starts(tmp_path):
    check_checkpoint_options(["--out", str(tmp_path), "--checkpoint-every", "5"])
    check_checkpoint_options(["--resume", "never"])  # no checkpointing: nothing to refuse
    with pytest.raises(UsageError, match="--checkpoint-every was given without a place"):
        check_checkpoint_options(["--checkpoint-every", "5"])
    with pytest.raises(UsageError, match="--resume x needs checkpointing"):
        check_checkpoint_options(["--resume", "x"])
    with pytest.raises(UsageError, match="no such checkpoint directory"):
        check_checkpoint_options(["--out", str(tmp_path), "--checkpoint-every=2", "--resume=/no"])
    (tmp_path / "checkpoints" / "step-00000004").mkdir(parents=True)
    with pytest.raises(UsageError, match="already holds step-00000004"):
        check_checkpoint_options(
            ["--out", str(tmp_path), "--checkpoint-every", "2", "--resume", "never"]
        )


def test_bad_checkpoint_options_exit_2_with_one_line_and_write_nothing(tmp_path):
    done = run_multigpu(["train", "--checkpoint-every", "5", "--epochs", "1"], tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith("multigpu: error: --checkpoint-every")
    assert list(tmp_path.iterdir()) == []


def test_fsdp_with_ddp_compression_is_refused_before_any_worker_starts(
    tmp_path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    code = main(
        ["train", "--cpu", "2", "--strategy", "fsdp", "--compression", "bf16", "--out", str(out)]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert "--compression bf16 compresses DDP's gradient all-reduce" in err[0]
    assert "--strategy fsdp does not have" in err[0]
    assert not out.exists()  # nothing written, nothing started
