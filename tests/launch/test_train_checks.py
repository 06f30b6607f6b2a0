"""``multigpu train`` refuses a global batch the processes cannot share, before it starts."""

from __future__ import annotations

import pytest

from multigpu.errors import UsageError
from multigpu.examples.digits import build_parser
from multigpu.launch.train import (
    DEFAULT_BATCH_SIZE,
    check_batch_size,
    check_checkpoint_options,
)
from tests.launch._util import run_multigpu


def test_launcher_default_matches_the_job():
    assert build_parser().get_default("batch_size") == DEFAULT_BATCH_SIZE


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
