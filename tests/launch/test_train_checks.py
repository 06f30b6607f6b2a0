"""``multigpu train`` refuses a global batch the processes cannot share, before it starts."""

from __future__ import annotations

import pytest

from multigpu.errors import UsageError
from multigpu.examples.digits import build_parser
from multigpu.launch.train import DEFAULT_BATCH_SIZE, check_batch_size


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
